package main

// xmx manyclients: the many-clients experiment (the seed paper's Fig. 9:
// many clients writing 64 KiB messages to one server). One process serves
// (-role server): it keeps a bounded number of receives posted and
// re-posts each as it completes, so that when clients outrun it messages
// wait as unexpected: an eager message's data is held up to msglayer's
// bound and refused beyond it (the sender converts it to rendezvous); a
// rendezvous message (64 KiB ones by default: above the 32 KiB threshold)
// leaves only its record, and the server pulls the data once a receive
// matches. Other processes (-role clients)
// each open K endpoints on one interface and keep a small window of sends
// in flight from every endpoint for a fixed time, from one goroutine
// waiting on a completion group that spans the endpoints. Both print one JSON
// report on stdout; scripts/manyclients runs the sweep and combines them.

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"os/signal"
	"reflect"
	"runtime/metrics"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/xmx-stack/xmx/msglayer"
	"github.com/xmx-stack/xmx/xdp"
)

// Data frames of a rendezvous pull carry the peer MTU minus the 24-byte
// common header and the 8-byte pull-reply header; eager fragments the MTU
// minus the common header and the 16-byte eager header (msglayer/wire.go).
// They size the retransmission estimate of the clients' report.
const (
	mcPullOverhead  = 24 + 8
	mcEagerOverhead = 24 + 16
	// mcSeriesBin is the width of the server's goodput time series.
	mcSeriesBin = 100 * time.Millisecond
	// mcLatBuckets is the resolution of the latency histogram: buckets
	// per octave of microseconds (about 2.2 % wide).
	mcLatBuckets = 32
	// msglayer's defaults for the bounds left at 0 (Config.setDefaults).
	mcDefaultUnexpected = 8 << 20
	mcDefaultRndv       = 32 << 10
	// mcMaxRecvBytes bounds the server's receive buffers, -recvs times
	// -max-size.
	mcMaxRecvBytes = 1 << 30
)

// mcMatch is the match info of the clients' messages: the sending
// endpoint in bits 32..39, a sequence number below.
func mcMatch(ep uint8, seq uint64) uint64 { return uint64(ep)<<32 | seq&(1<<32-1) }

// mcConfig is the parsed command line.
type mcConfig struct {
	ef       endpointFlags
	role     string
	clients  int
	peer     string
	duration time.Duration
	size     int
	window   int
	recvs    int
	recvSize int
	maxMsgs  int
	startAt  time.Time // zero: start at once
	drain    time.Duration
	rndv     int  // clients' RendezvousThreshold (0: msglayer's default)
	umem     bool // clients send from buffers lent from the UMEM
	// perClient gives each client endpoint a send buffer of its own
	// rather than one for the process.
	perClient bool
	// goPerClient drives each client endpoint from a goroutine of its
	// own rather than all of the process's from one.
	goPerClient bool
	unexp       int // server's UnexpectedBytes (0: msglayer's default)
	sample      time.Duration
	// Protocol knobs for investigation (0: msglayer's defaults).
	minRTO     time.Duration
	pullBlocks int
	recvBudget int
	cpuProfile string // file the run's CPU profile goes to ("": none)
}

func runManyClients(args []string) error {
	c, err := parseManyClients(args, os.Stderr)
	if err != nil {
		return err
	}
	stop, err := startCPUProfile(c.cpuProfile)
	if err != nil {
		return err
	}
	if c.role == "server" {
		err = mcServe(c)
	} else {
		err = mcClients(c)
	}
	return errors.Join(err, stop())
}

// startCPUProfile starts a CPU profile of the process into the file at
// path (none if path is empty) and returns what stops it and closes the
// file.
func startCPUProfile(path string) (stop func() error, err error) {
	if path == "" {
		return func() error { return nil }, nil
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("-cpuprofile: %w", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("-cpuprofile %s: %w", path, err)
	}
	return func() error {
		pprof.StopCPUProfile()
		if err := f.Close(); err != nil {
			return fmt.Errorf("-cpuprofile %s: %w", path, err)
		}
		return nil
	}, nil
}

// parseManyClients reads and validates the command line (usage and parse
// errors go to out); errors name the flag and wrap errUsage.
func parseManyClients(args []string, out io.Writer) (*mcConfig, error) {
	fs := flag.NewFlagSet("manyclients", flag.ContinueOnError)
	fs.SetOutput(out)
	c := &mcConfig{}
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), `usage: xmx manyclients -role server [flags]
       xmx manyclients -role clients -n K -peer PEER [flags]

The many-clients experiment (the seed paper's Fig. 9): N clients write
messages (64 KiB by default) to one server as fast as a small window of
sends per client allows.

The server keeps -recvs receives of -max-size bytes posted (one completion
group, each re-posted as it completes), counts bytes and messages per
source, samples the endpoint's counters every -sample, and on SIGINT,
SIGTERM or after -duration prints one JSON object: goodput, per-source
counts, the endpoint's Counters, the link's Stats and its peak memory.

The clients open -n endpoints in this process (ids -e .. -e+n-1, one
shared link), connect each to PEER (a host name such as h1, or
MAC[:endpoint]), wait until -start-at if given, keep -window sends of
-size bytes in flight from each endpoint for -duration, wait up to -drain
for the last ones (one goroutine waits on one completion group spanning
the endpoints; -goroutine-per-client gives each its own), and print one JSON object: messages, bytes, completion
times (Isend to completion, µs), the sum of the endpoints' Counters and an
estimate of the data they sent more than once.

`)
		fs.PrintDefaults()
	}
	c.ef.register(fs, 0)
	fs.Lookup("e").Usage = "local endpoint id (0-255); clients: the first of -n consecutive ids (default 1 for clients)"
	fs.StringVar(&c.role, "role", "", "server or clients (required)")
	fs.IntVar(&c.clients, "n", 1, "clients: endpoints to open in this process (1..255)")
	fs.StringVar(&c.peer, "peer", "", "clients: the server, a host name (h1) or MAC[:endpoint] (required for clients)")
	fs.DurationVar(&c.duration, "duration", 0, "clients: how long to send (default 3s); server: longest it runs (default 10m)")
	size := fs.String("size", "64k", "clients: message size (e.g. 64k)")
	fs.IntVar(&c.window, "window", 2, "clients: sends in flight per endpoint (1..256)")
	fs.IntVar(&c.recvs, "recvs", 64, "server: receives kept posted (1..4096, and at most 1 GiB of buffers with -max-size)")
	maxSize := fs.String("max-size", "64k", "server: size of each receive buffer; longer messages are truncated")
	fs.IntVar(&c.maxMsgs, "max-msgs", 10_000_000, "bound on messages (per client endpoint; at the server in total)")
	startAt := fs.String("start-at", "", "clients: Unix time (seconds, fractions allowed) to start sending at, to start several processes together")
	fs.DurationVar(&c.drain, "drain", 10*time.Second, "clients: how long to wait for sends in flight after -duration")
	rndv := fs.String("rndv-threshold", "0", "clients: msglayer RendezvousThreshold (0: its default, 32k; messages above go by rendezvous; set it to -size to send eagerly)")
	unexp := fs.String("unexpected-bytes", "0", "server: msglayer UnexpectedBytes, the bound on unexpected eager data (0: its default, 8M)")
	fs.DurationVar(&c.sample, "sample", 10*time.Millisecond, "server: period of the counter samples (peak unexpected bytes)")
	fs.DurationVar(&c.minRTO, "min-rto", 0, "msglayer MinRTO, the floor of the retransmission and pull re-request timeouts (0: its default, 2ms)")
	fs.BoolVar(&c.umem, "umem", false, "clients: send from buffers lent from the UMEM, one per endpoint")
	fs.BoolVar(&c.perClient, "buffer-per-client", false, "clients: each endpoint sends from a buffer of its own (default: the process's endpoints share one, as clients on hosts of their own each have theirs in cache)")
	fs.BoolVar(&c.goPerClient, "goroutine-per-client", false, "clients: drive each endpoint from a goroutine of its own, waiting on a group of its own (default: one goroutine waits on one group spanning the process's endpoints, as a client host would have one process)")
	umemGather := fs.String("umem-gather", "auto", umemGatherHelp)
	fs.IntVar(&c.recvBudget, "recv-budget", 0, "msglayer RecvBudget, the frames in flight from all peers together shared among them as receive windows (0: its default, three quarters of the link's receive frames; -1: no window)")
	fs.StringVar(&c.cpuProfile, "cpuprofile", "", "write a CPU profile of the run to this file (for go tool pprof)")
	fs.IntVar(&c.pullBlocks, "pull-blocks", 0, "server: msglayer PullBlocks, pull blocks of 32 frames in flight per message (0: its default, 16)")
	if err := parseFlags(fs, args); err != nil {
		return nil, err
	}
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: "+format, append([]any{errUsage}, a...)...)
	}
	if fs.NArg() > 0 {
		return nil, bad("unexpected arguments %q (the server is given with -peer)", fs.Args())
	}
	if err := c.ef.validate(); err != nil {
		return nil, err
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	c.ef.peerEPSet = set["peer-ep"]
	if err := c.ef.checkPeer(c.peer); err != nil {
		return nil, err
	}
	var err error
	parse := func(name, v string, min, max int) int {
		if err != nil {
			return 0
		}
		n, e := parseSize(v)
		if e == nil && (n < min || n > max) {
			e = fmt.Errorf("%d: want %d..%d", n, min, max)
		}
		if e != nil {
			err = bad("-%s %s: %v", name, v, e)
		}
		return n
	}
	c.size = parse("size", *size, 0, 16<<20)
	c.recvSize = parse("max-size", *maxSize, 0, 16<<20)
	c.rndv = parse("rndv-threshold", *rndv, 0, 16<<20)
	c.unexp = parse("unexpected-bytes", *unexp, 0, 1<<30)
	if err != nil {
		return nil, err
	}
	switch c.role {
	case "server":
		if c.duration == 0 {
			c.duration = 10 * time.Minute
		}
		if c.recvs < 1 || c.recvs > 4096 {
			return nil, bad("-recvs %d: want 1..4096", c.recvs)
		}
		// The receive buffers are made at once, all of them.
		if c.recvs*c.recvSize > mcMaxRecvBytes {
			return nil, bad("-recvs %d -max-size %s: %d receive buffers of %d bytes: more than 1 GiB", c.recvs, *maxSize, c.recvs, c.recvSize)
		}
		if err := checkRunTime("-sample", c.sample, 0); err != nil {
			return nil, err
		}
		for _, f := range []string{"n", "peer", "size", "window", "start-at", "drain", "rndv-threshold", "umem", "umem-gather", "buffer-per-client", "goroutine-per-client"} {
			if set[f] {
				return nil, bad("-%s is a clients flag (this is -role server)", f)
			}
		}
	case "clients":
		if !set["e"] {
			c.ef.ep = 1
		}
		if c.duration == 0 {
			c.duration = 3 * time.Second
		}
		if c.clients < 1 || c.clients > 255 {
			return nil, bad("-n %d: want 1..255 endpoints", c.clients)
		}
		if int(c.ef.ep)+c.clients-1 > 255 {
			return nil, bad("-e %d -n %d: endpoint ids would run past 255", c.ef.ep, c.clients)
		}
		if c.peer == "" {
			return nil, bad("-peer: the clients need the server (a host name such as h1, or MAC[:endpoint])")
		}
		if c.window < 1 || c.window > 256 {
			return nil, bad("-window %d: want 1..256", c.window)
		}
		if err := checkRunTime("-drain", c.drain, 0); err != nil {
			return nil, err
		}
		if c.ef.umemGather, err = umemGatherFlag(fs, c.umem, *umemGather); err != nil {
			return nil, err
		}
		if c.umem && c.size < 1 {
			// A lent buffer has at least a byte: refused here rather than
			// once every endpoint is open and connected.
			return nil, bad("-umem -size %d: a buffer lent from the UMEM has at least 1 byte", c.size)
		}
		if c.umem {
			// One buffer area per link, shared by the process's endpoints;
			// each buffer takes whole UMEM frames.
			c.ef.umemBytes = c.clients * ((c.size + xdp.DefaultFrameSize - 1) / xdp.DefaultFrameSize * xdp.DefaultFrameSize)
			if c.ef.umemBytes > 1<<30 {
				return nil, bad("-umem: -n %d buffers of -size %d: more than 1 GiB", c.clients, c.size)
			}
		}
		if *startAt != "" {
			s, e := strconv.ParseFloat(*startAt, 64)
			// Up to year 2200 or so (NaN fails every comparison).
			if e != nil || !(s > 0 && s < 7e9) {
				return nil, bad("-start-at %q: want Unix seconds such as $(date +%%s.%%N)", *startAt)
			}
			c.startAt = time.Unix(0, int64(s*1e9))
			if time.Until(c.startAt) > 10*time.Minute {
				return nil, bad("-start-at %s: more than 10 minutes ahead", *startAt)
			}
		}
		for _, f := range []string{"recvs", "max-size", "unexpected-bytes", "sample", "pull-blocks"} {
			if set[f] {
				return nil, bad("-%s is a server flag (this is -role clients)", f)
			}
		}
	case "":
		return nil, bad("-role: required, server or clients")
	default:
		return nil, bad("-role %q: want server or clients", c.role)
	}
	if err := checkRunTime("-duration", c.duration, 0); err != nil {
		return nil, err
	}
	if c.minRTO < 0 || c.minRTO > time.Second {
		return nil, bad("-min-rto %v: want 0..1s", c.minRTO)
	}
	if c.pullBlocks < 0 || c.pullBlocks > 64 {
		return nil, bad("-pull-blocks %d: want 0..64", c.pullBlocks)
	}
	if c.recvBudget < -1 {
		return nil, bad("-recv-budget %d: want a count of frames, 0 (the default) or -1 (no window)", c.recvBudget)
	}
	if c.maxMsgs < 1 {
		return nil, bad("-max-msgs %d: must be positive", c.maxMsgs)
	}
	return c, nil
}

// mcOpen opens endpoint id with the flags' link settings and the given
// protocol bounds. The caller checked the interface (checkInterface).
func (c *mcConfig) mcOpen(id uint8) (*msglayer.Endpoint, error) {
	e, err := msglayer.Open(c.endpointConfig(id))
	if err != nil {
		return nil, err
	}
	if id == uint8(c.ef.ep) {
		c.ef.sayLink(e) // once, for the first endpoint
	}
	return e, nil
}

// endpointConfig is endpoint id's msglayer configuration: the endpoint
// flags' (endpointFlags.config), with the experiment's protocol bounds.
func (c *mcConfig) endpointConfig(id uint8) msglayer.Config {
	cfg := c.ef.config(id)
	cfg.RendezvousThreshold = c.rndv
	cfg.UnexpectedBytes = c.unexp
	cfg.MinRTO = c.minRTO
	cfg.PullBlocks = c.pullBlocks
	cfg.RecvBudget = c.recvBudget
	return cfg
}

// mcLink describes the link in a report.
type mcLink struct {
	Kind      string `json:"kind"`
	Mode      string `json:"mode"`
	Interface string `json:"interface"`
	MTU       int    `json:"mtu"`
}

func mcLinkOf(e *msglayer.Endpoint) mcLink {
	info, _ := e.LinkInfo()
	return mcLink{Kind: info.Kind, Mode: info.Mode, Interface: info.Interface, MTU: e.LinkMTU()}
}

// mcSource is what the server got from one client endpoint.
type mcSource struct {
	Source   string `json:"source"`
	Messages uint64 `json:"messages"`
	Bytes    uint64 `json:"bytes"`
}

// mcServerReport is the server's JSON report.
type mcServerReport struct {
	Role     string `json:"role"`
	Endpoint string `json:"endpoint"`
	Link     mcLink `json:"link"`
	Recvs    int    `json:"recvs_posted"`
	RecvSize int    `json:"recv_size"`
	// UnexpBound is the endpoint's bound on unexpected eager data.
	UnexpBound int    `json:"unexpected_bound"`
	Messages   uint64 `json:"messages"`
	Bytes      uint64 `json:"bytes"` // payload delivered into receive buffers
	Truncated  uint64 `json:"truncated"`
	Failed     uint64 `json:"failed"` // receives that completed with another error
	// Elapsed is the life of the measurement (receives posted to report);
	// Active the time from the first to the last message delivered, over
	// which GoodputMBps (10^6 bytes/s) is computed.
	ElapsedS    float64    `json:"elapsed_s"`
	ActiveS     float64    `json:"active_s"`
	GoodputMBps float64    `json:"goodput_mbps"`
	Sources     int        `json:"sources"`
	PerSource   []mcSource `json:"per_source"`
	// Jain's fairness index of the per-source bytes (1: all equal).
	Fairness float64 `json:"fairness"`
	// Payload bytes delivered per mcSeriesBin from the first message.
	SeriesBinS  float64  `json:"series_bin_s"`
	SeriesBytes []uint64 `json:"series_bytes"`
	UnexpMaxNow int      `json:"unexpected_bytes_max"` // peak of Counters.UnexpectedBytesNow over the samples
	Samples     int      `json:"samples"`
	// HeapSeriesKiB is the Go heap live after collection, peak of each
	// second from the start.
	HeapSeriesKiB []uint64 `json:"heap_series_kib"`
	Counters      msglayer.Counters
	LinkStats     xdp.Stats
	Proc          mcProc `json:"proc"`
	Stopped       string `json:"stopped"` // why the server stopped
}

// mcServe runs the server until a signal, -duration or -max-msgs.
func mcServe(c *mcConfig) error {
	if err := requireRoot("this command"); err != nil {
		return err
	}
	if err := c.ef.checkInterface(); err != nil {
		return err
	}
	e, err := c.mcOpen(uint8(c.ef.ep))
	if err != nil {
		return err
	}
	defer e.Close()
	// A context without a deadline, cancelled by a signal or by a timer:
	// msglayer looks at the cancellation of a context with a deadline only
	// now and then (every 64 waits of up to 100 ms), at that of one
	// without every 10 ms.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	errDuration := errors.New("duration")
	timer := time.AfterFunc(c.duration, func() { cancel(errDuration) })
	defer timer.Stop()
	fmt.Fprintf(os.Stderr, "xmx manyclients server: endpoint %v on %s, %d receives of %d bytes posted (SIGTERM or %v ends)\n",
		e.Addr(), mcLinkOf(e).Interface, c.recvs, c.recvSize, c.duration)

	grp := e.NewGroup()
	bufs := make([][]byte, c.recvs)
	for i := range bufs {
		bufs[i] = make([]byte, c.recvSize)
		if _, err := grp.Irecv(0, 0, [][]byte{bufs[i]}, i); err != nil {
			return err
		}
	}
	var smp mcSampler
	sampled := make(chan struct{})
	go func() { smp.run(ctx, e, c.sample); close(sampled) }()

	rep := mcServerReport{Role: "server", Endpoint: e.Addr().String(), Link: mcLinkOf(e),
		Recvs: c.recvs, RecvSize: c.recvSize, UnexpBound: cmp.Or(c.unexp, mcDefaultUnexpected), SeriesBinS: mcSeriesBin.Seconds()}
	per := map[msglayer.Addr]*mcSource{}
	start := time.Now()
	var first, last time.Time
	rep.Stopped = "max-msgs"
	for rep.Messages < uint64(c.maxMsgs) {
		// A completion is taken even after the end (Wait returns what
		// completed before it looks at the context).
		st, err := grp.Wait(ctx)
		i, ok := st.Context.(int)
		if !ok {
			if ctx.Err() == nil {
				return fmt.Errorf("waiting for receives: %w", err)
			}
			rep.Stopped = "signal"
			if errors.Is(context.Cause(ctx), errDuration) {
				rep.Stopped = "duration"
			}
			break
		}
		switch {
		case err == nil, st.Code == msglayer.Truncated:
			now := time.Now()
			if first.IsZero() {
				first = now
			}
			last = now
			if st.Code == msglayer.Truncated {
				rep.Truncated++
			}
			s := per[st.Source]
			if s == nil {
				s = &mcSource{Source: st.Source.String()}
				per[st.Source] = s
			}
			s.Messages++
			s.Bytes += uint64(st.XferLen)
			rep.Messages++
			rep.Bytes += uint64(st.XferLen)
			bin := int(now.Sub(first) / mcSeriesBin)
			if bin < int(maxRunTime/mcSeriesBin) {
				for len(rep.SeriesBytes) <= bin {
					rep.SeriesBytes = append(rep.SeriesBytes, 0)
				}
				rep.SeriesBytes[bin] += uint64(st.XferLen)
			}
		default:
			rep.Failed++
			fmt.Fprintf(os.Stderr, "xmx manyclients server: receive from %v: %v\n", st.Source, err)
		}
		if _, err := grp.Irecv(0, 0, [][]byte{bufs[i]}, i); err != nil {
			return err
		}
	}
	cancel(nil)
	<-sampled
	rep.ElapsedS = time.Since(start).Seconds()
	if !first.IsZero() {
		rep.ActiveS = last.Sub(first).Seconds()
	}
	if rep.ActiveS > 0 {
		rep.GoodputMBps = float64(rep.Bytes) / rep.ActiveS / 1e6
	}
	for _, s := range per {
		rep.PerSource = append(rep.PerSource, *s)
	}
	slices.SortFunc(rep.PerSource, func(a, b mcSource) int { return strings.Compare(a.Source, b.Source) })
	rep.Sources = len(rep.PerSource)
	rep.Fairness = mcJain(rep.PerSource)
	rep.Counters = e.Counters()
	rep.UnexpMaxNow = max(smp.unexpMax, rep.Counters.UnexpectedBytesNow)
	rep.Samples = smp.n
	rep.LinkStats = e.LinkStats()
	rep.Proc = mcProcNow()
	rep.Proc.GoHeapMaxKiB = smp.heapMax / 1024
	rep.HeapSeriesKiB = smp.heapSeries
	return mcPrint(rep)
}

// mcSampler samples an endpoint's counters and the Go heap periodically.
type mcSampler struct {
	n          int
	unexpMax   int
	heapMax    uint64
	heapSeries []uint64 // KiB, the peak of each second
}

func (s *mcSampler) run(ctx context.Context, e *msglayer.Endpoint, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	// The heap live after the last collection: what the program holds,
	// without the garbage a collection cycle lets accumulate.
	heap := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	start := time.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		s.unexpMax = max(s.unexpMax, e.Counters().UnexpectedBytesNow)
		if metrics.Read(heap); heap[0].Value.Kind() == metrics.KindUint64 {
			v := heap[0].Value.Uint64()
			s.heapMax = max(s.heapMax, v)
			if sec := int(time.Since(start) / time.Second); sec < int(maxRunTime/time.Second) {
				for len(s.heapSeries) <= sec {
					s.heapSeries = append(s.heapSeries, 0)
				}
				s.heapSeries[sec] = max(s.heapSeries[sec], v/1024)
			}
		}
		s.n++
	}
}

// mcJain is Jain's fairness index of the per-source bytes.
func mcJain(src []mcSource) float64 {
	var sum, sq float64
	for _, s := range src {
		b := float64(s.Bytes)
		sum += b
		sq += b * b
	}
	if sq == 0 {
		return 0
	}
	return sum * sum / (float64(len(src)) * sq)
}

// mcProc is the process's use of the machine.
type mcProc struct {
	MaxRSSKiB    int64   `json:"max_rss_kib"`               // getrusage ru_maxrss
	VmHWMKiB     int64   `json:"vm_hwm_kib"`                // /proc/self/status VmHWM
	CPUs         float64 `json:"cpu_s"`                     // user + system CPU time
	SysCPUs      float64 `json:"sys_cpu_s"`                 // of CPUs, the system (kernel) time
	VolCtxSw     int64   `json:"voluntary_ctx_switches"`    // ru_nvcsw: the process blocked (slept)
	InvolCtxSw   int64   `json:"involuntary_ctx_switches"`  // ru_nivcsw: the process was preempted
	GoHeapMaxKiB uint64  `json:"go_heap_max_kib,omitempty"` // server: peak of the sampled live Go heap
}

// mcProcNow reads the process's peak resident set, CPU time and context
// switches.
func mcProcNow() mcProc {
	var p mcProc
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) == nil {
		p.MaxRSSKiB = ru.Maxrss
		p.CPUs = time.Duration(syscall.TimevalToNsec(ru.Utime) + syscall.TimevalToNsec(ru.Stime)).Seconds()
		p.SysCPUs = time.Duration(syscall.TimevalToNsec(ru.Stime)).Seconds()
		p.VolCtxSw, p.InvolCtxSw = ru.Nvcsw, ru.Nivcsw
	}
	if f, err := os.Open("/proc/self/status"); err == nil {
		defer f.Close()
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if v, ok := strings.CutPrefix(sc.Text(), "VmHWM:"); ok {
				p.VmHWMKiB, _ = strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			}
		}
	}
	return p
}

func mcPrint(v any) error {
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// mcClientsReport is the clients' JSON report.
type mcClientsReport struct {
	Role      string `json:"role"`
	Endpoints int    `json:"endpoints"`
	FirstEP   int    `json:"first_ep"`
	Peer      string `json:"peer"`
	Link      mcLink `json:"link"`
	PeerMTU   int    `json:"peer_mtu"`
	Size      int    `json:"size"`
	Window    int    `json:"window"`
	Rndv      bool   `json:"rendezvous"`     // the messages go by rendezvous (size above the threshold)
	UMEM      bool   `json:"umem,omitempty"` // sent from buffers lent from the UMEM (-umem)
	// SharedBuffer: the endpoints sent from one buffer (not -umem, not
	// -buffer-per-client).
	SharedBuffer bool `json:"shared_buffer"`
	// Drivers is how many goroutines sent and waited: 1, or one per
	// endpoint with -goroutine-per-client.
	Drivers   int     `json:"drivers"`
	DurationS float64 `json:"duration_s"`
	// StartLateS is how late the sending started after -start-at (connects
	// took longer), 0 without -start-at.
	StartLateS float64 `json:"start_late_s"`
	SendingS   float64 `json:"sending_s"` // first Isend to the last completion
	Messages   uint64  `json:"messages"`  // sends completed successfully
	Bytes      uint64  `json:"bytes"`
	Failed     uint64  `json:"failed"`     // sends completed with an error
	Unfinished uint64  `json:"unfinished"` // sends still in flight after -drain
	// Stuck lists (up to 16) endpoints with unfinished sends: their
	// sequence numbers, ages and the endpoint's counters.
	Stuck  []mcStuck `json:"stuck,omitempty"`
	Errors []string  `json:"errors,omitempty"`
	// Completion time of each send, Isend to completion, in µs.
	P50us  float64 `json:"p50_us"`
	P99us  float64 `json:"p99_us"`
	MeanUs float64 `json:"mean_us"`
	MaxUs  float64 `json:"max_us"`
	// LatHist is the same as a histogram of [bucket, count] pairs, bucket
	// b > 0 holding [2^((b-1)/LatPerOctave), 2^(b/LatPerOctave)) µs and
	// bucket 0 below 1 µs, so that reports of several processes merge.
	LatPerOctave int               `json:"lat_buckets_per_octave"`
	LatHist      [][2]uint64       `json:"lat_hist"`
	MinPerEP     uint64            `json:"min_messages_per_endpoint"`
	MaxPerEP     uint64            `json:"max_messages_per_endpoint"`
	Counters     msglayer.Counters // summed over the endpoints
	LinkStats    xdp.Stats         // the one link the endpoints share
	// The data sent more than once, estimated: PullResent is the pull
	// replies beyond what the messages pulled needed (frames of blocks the
	// server re-requested); RetransBytes is PullResent times the pull
	// payload plus, for eager messages, Counters.Retransmits times the eager
	// payload (an upper bound: it counts every reliable frame resent as a
	// full data frame; rendezvous records and notifies carry no data and
	// are left out when the messages go by rendezvous).
	PullPayload  int    `json:"pull_payload"`
	FramesPerMsg int    `json:"pull_frames_per_msg"`
	PullResent   uint64 `json:"pull_resent_frames"`
	RetransBytes uint64 `json:"retrans_bytes_est"`
	Proc         mcProc `json:"proc"`
}

// mcStuck is a client endpoint whose sends did not complete.
type mcStuck struct {
	EP       uint8             `json:"ep"`
	Seqs     []uint64          `json:"seqs"`   // sequence numbers (match info bits 0..31)
	AgesS    []float64         `json:"ages_s"` // since their Isend
	Counters msglayer.Counters `json:"counters"`
}

// mcClient is one client endpoint's outcome.
type mcClient struct {
	ep                      uint8
	lat                     []time.Duration
	bytes                   uint64
	failed, unfinished      uint64
	stuck                   *mcStuck
	err                     error
	firstSend, lastComplete time.Time
}

// mcClients runs -n client endpoints and reports.
func mcClients(c *mcConfig) error {
	if err := requireRoot("this command"); err != nil {
		return err
	}
	if err := c.ef.checkInterface(); err != nil {
		return err // the command line's, not an endpoint's
	}
	eps := make([]*msglayer.Endpoint, 0, c.clients)
	defer func() {
		for _, e := range eps {
			e.Close()
		}
	}()
	for i := range c.clients {
		e, err := c.mcOpen(uint8(int(c.ef.ep) + i))
		if err != nil {
			return fmt.Errorf("endpoint %d: %w", int(c.ef.ep)+i, err)
		}
		eps = append(eps, e)
	}
	// Resolve the server once, then connect every endpoint to it.
	server, err := c.ef.connect(eps[0], c.peer)
	if err != nil {
		return err
	}
	for _, e := range eps[1:] {
		cctx, cancel := context.WithTimeout(context.Background(), c.ef.timeout)
		err := e.Connect(cctx, server, uint32(c.ef.peerKey))
		cancel()
		if err != nil {
			return fmt.Errorf("endpoint %v: %w", e.Addr(), err)
		}
	}
	rep := mcClientsReport{Role: "clients", Endpoints: c.clients, FirstEP: int(c.ef.ep), Peer: server.String(),
		Link: mcLinkOf(eps[0]), PeerMTU: eps[0].PeerMTU(server), Size: c.size, Window: c.window,
		DurationS: c.duration.Seconds(), LatPerOctave: mcLatBuckets}
	rep.Rndv = c.size > cmp.Or(c.rndv, mcDefaultRndv)
	rep.UMEM = c.umem
	// The endpoints only read what they send: by default they share one
	// buffer, as clients on hosts of their own would each have theirs in
	// cache. 128 clients' buffers on this machine's two vCPUs would
	// otherwise measure the lab's caches, not the server.
	var shared []byte
	if !c.umem && !c.perClient {
		shared = mcPattern(make([]byte, c.size))
		rep.SharedBuffer = true
	}
	if !c.startAt.IsZero() {
		if wait := time.Until(c.startAt); wait > 0 {
			time.Sleep(min(wait, maxRunTime))
		} else {
			rep.StartLateS = -wait.Seconds()
			fmt.Fprintf(os.Stderr, "xmx manyclients: connecting took until %.3f s after -start-at\n", rep.StartLateS)
		}
	}
	senders := make([]*mcSender, len(eps))
	for i, e := range eps {
		s, err := c.newSender(e, server, shared)
		if err != nil {
			return fmt.Errorf("endpoint %v: %w", e.Addr(), err)
		}
		defer s.close()
		senders[i] = s
	}
	deadline := time.Now().Add(c.duration)
	if c.goPerClient {
		var wg sync.WaitGroup
		for _, s := range senders {
			s.grp = s.e.NewGroup()
			wg.Go(func() { c.mcDrive([]*mcSender{s}, s.grp, deadline) })
		}
		wg.Wait()
		rep.Drivers = len(senders)
	} else {
		grp := eps[0].NewGroup()
		for _, s := range senders {
			if s.grp, err = grp.On(s.e); err != nil {
				return err
			}
		}
		c.mcDrive(senders, grp, deadline)
		rep.Drivers = 1
	}
	res := make([]mcClient, len(senders))
	for i, s := range senders {
		res[i] = s.out
	}
	c.mcSummarize(&rep, res, eps)
	return mcPrint(rep)
}

// mcSender is one client endpoint's sends: c.window slots, each holding
// one message in flight. Owned by the goroutine that drives it.
type mcSender struct {
	e        *msglayer.Endpoint
	grp      *msglayer.Group // the view of its driver's group it posts on
	server   msglayer.Addr
	segs     [][]byte // never written: every send in flight may share it
	lent     *msglayer.Buffer
	slots    []mcSlot
	free     []*mcSlot
	sent     int
	inFlight int
	out      mcClient
}

// mcSlot is a window slot of a sender, the context of its send in flight.
type mcSlot struct {
	s      *mcSender
	seq    uint64
	sentAt time.Time
	busy   bool
}

// newSender prepares the sends of endpoint e to server, from shared when
// given, else from a buffer of its own (lent from the UMEM with -umem).
func (c *mcConfig) newSender(e *msglayer.Endpoint, server msglayer.Addr, shared []byte) (*mcSender, error) {
	s := &mcSender{e: e, server: server, out: mcClient{ep: e.Addr().EP}, slots: make([]mcSlot, c.window)}
	buf := shared
	if buf == nil && c.umem {
		lent, err := e.AllocBuffer(c.size)
		if err != nil {
			return nil, fmt.Errorf("-umem: %w", err)
		}
		s.lent = lent
		buf = mcPattern(lent.Bytes())
	} else if buf == nil {
		buf = mcPattern(make([]byte, c.size))
	}
	s.segs = [][]byte{buf}
	for i := range s.slots {
		s.slots[i].s = s
		s.free = append(s.free, &s.slots[i])
	}
	return s, nil
}

func (s *mcSender) close() {
	if s.lent != nil {
		s.lent.Free()
	}
}

// fill sends into every free slot, up to c.maxMsgs in all, and returns how
// many it sent. A failed Isend ends the sender's sending.
func (s *mcSender) fill(c *mcConfig) int {
	n := 0
	for len(s.free) > 0 && s.sent < c.maxMsgs && s.out.err == nil {
		slot := s.free[len(s.free)-1]
		slot.sentAt = time.Now()
		if _, err := s.grp.Isend(s.server, mcMatch(s.out.ep, uint64(s.sent)), s.segs, slot); err != nil {
			s.out.err = err
			break
		}
		s.free = s.free[:len(s.free)-1]
		slot.seq, slot.busy = uint64(s.sent), true
		s.sent++
		s.inFlight++
		n++
	}
	return n
}

// done accounts for the completion of slot's send.
func (slot *mcSlot) done(st msglayer.Status, err error) {
	s := slot.s
	s.inFlight--
	slot.busy = false
	s.free = append(s.free, slot)
	now := time.Now()
	s.out.lastComplete = now
	if err != nil {
		s.out.failed++
		s.out.err = cmp.Or(s.out.err, err)
		return
	}
	s.out.lat = append(s.out.lat, now.Sub(slot.sentAt))
	s.out.bytes += uint64(st.XferLen)
}

// mcDrive keeps c.window sends in flight from each sender until the
// deadline (or c.maxMsgs each), taking their completions from grp (which
// spans them), then waits up to c.drain for the rest.
func (c *mcConfig) mcDrive(senders []*mcSender, grp *msglayer.Group, deadline time.Time) {
	inFlight := 0
	for _, s := range senders {
		s.out.firstSend = time.Now()
		inFlight += s.fill(c)
	}
	// wait takes one completion and returns its sender; nil when none
	// came before ctx ended (or Wait itself failed: every sender keeps the
	// error).
	wait := func(ctx context.Context) *mcSender {
		st, err := grp.Wait(ctx)
		slot, ok := st.Context.(*mcSlot)
		if !ok {
			if ctx.Err() == nil {
				for _, s := range senders {
					s.out.err = cmp.Or(s.out.err, err)
				}
			}
			return nil
		}
		slot.done(st, err)
		inFlight--
		return slot.s
	}
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	for inFlight > 0 && time.Now().Before(deadline) {
		s := wait(ctx)
		if s == nil {
			break
		}
		if time.Now().Before(deadline) {
			inFlight += s.fill(c)
		}
	}
	dctx, dcancel := context.WithTimeout(context.Background(), c.drain)
	defer dcancel()
	for inFlight > 0 && wait(dctx) != nil {
	}
	for _, s := range senders {
		s.out.unfinished = uint64(s.inFlight)
		if s.inFlight == 0 {
			continue
		}
		s.out.stuck = &mcStuck{EP: s.out.ep, Counters: s.e.Counters()}
		for _, slot := range s.slots {
			if slot.busy {
				s.out.stuck.Seqs = append(s.out.stuck.Seqs, slot.seq)
				s.out.stuck.AgesS = append(s.out.stuck.AgesS, time.Since(slot.sentAt).Seconds())
			}
		}
	}
}

// mcPattern fills buf with the bytes the clients send and returns it.
func mcPattern(buf []byte) []byte {
	for i := range buf {
		buf[i] = byte(i)
	}
	return buf
}

// mcSummarize fills the report from the endpoints' outcomes.
func (c *mcConfig) mcSummarize(rep *mcClientsReport, res []mcClient, eps []*msglayer.Endpoint) {
	var lat []time.Duration
	var first, last time.Time
	rep.MinPerEP = math.MaxUint64
	for _, r := range res {
		lat = append(lat, r.lat...)
		n := uint64(len(r.lat))
		rep.Messages += n
		rep.MinPerEP, rep.MaxPerEP = min(rep.MinPerEP, n), max(rep.MaxPerEP, n)
		rep.Bytes += r.bytes
		rep.Failed += r.failed
		rep.Unfinished += r.unfinished
		if r.stuck != nil && len(rep.Stuck) < 16 {
			rep.Stuck = append(rep.Stuck, *r.stuck)
		}
		if r.err != nil {
			rep.Errors = append(rep.Errors, fmt.Sprintf("endpoint %d: %v", r.ep, r.err))
		}
		if first.IsZero() || r.firstSend.Before(first) {
			first = r.firstSend
		}
		if r.lastComplete.After(last) {
			last = r.lastComplete
		}
	}
	if last.After(first) {
		rep.SendingS = last.Sub(first).Seconds()
	}
	if len(lat) > 0 {
		slices.Sort(lat)
		var sum time.Duration
		for _, d := range lat {
			sum += d
		}
		us := func(d time.Duration) float64 { return float64(d) / 1e3 }
		rep.P50us = us(rank(lat, 50))
		rep.P99us = us(rank(lat, 99))
		rep.MaxUs = us(lat[len(lat)-1])
		rep.MeanUs = us(sum / time.Duration(len(lat)))
		rep.LatHist = mcHistogram(lat)
	}
	for _, e := range eps {
		mcAddCounters(&rep.Counters, e.Counters())
	}
	rep.LinkStats = eps[0].LinkStats()

	mtu := rep.PeerMTU
	if mtu == 0 {
		mtu = rep.Link.MTU
	}
	rep.PullPayload = mtu - mcPullOverhead
	if rep.PullPayload > 0 {
		rep.FramesPerMsg = (c.size + rep.PullPayload - 1) / rep.PullPayload
	}
	pulled := rep.Counters.EagerConverted // eager sends the server refused
	if rep.Rndv {
		pulled = rep.Messages
	}
	if need := pulled * uint64(rep.FramesPerMsg); rep.Counters.PullReplies > need {
		rep.PullResent = rep.Counters.PullReplies - need
	}
	rep.RetransBytes = rep.PullResent * uint64(rep.PullPayload)
	if !rep.Rndv {
		rep.RetransBytes += rep.Counters.Retransmits * uint64(mtu-mcEagerOverhead)
	}
	rep.Proc = mcProcNow()
}

// mcHistogram counts sorted durations in log buckets (mcLatBuckets per
// octave of microseconds).
func mcHistogram(sorted []time.Duration) [][2]uint64 {
	var h [][2]uint64
	for _, d := range sorted {
		b := uint64(0)
		if us := float64(d) / 1e3; us >= 1 {
			b = uint64(math.Log2(us)*mcLatBuckets) + 1
		}
		if n := len(h); n > 0 && h[n-1][0] == b {
			h[n-1][1]++
		} else {
			h = append(h, [2]uint64{b, 1})
		}
	}
	return h
}

// mcAddCounters adds c to sum field by field (UnexpectedBytesNow too).
func mcAddCounters(sum *msglayer.Counters, c msglayer.Counters) {
	s, v := reflect.ValueOf(sum).Elem(), reflect.ValueOf(c)
	for i := range s.NumField() {
		switch f := s.Field(i); f.Kind() {
		case reflect.Uint64:
			f.SetUint(f.Uint() + v.Field(i).Uint())
		case reflect.Int:
			f.SetInt(f.Int() + v.Field(i).Int())
		}
	}
}
