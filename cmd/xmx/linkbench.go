package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"strings"
	"sync"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/xmx-stack/xmx/internal/asavielink"
	"github.com/xmx-stack/xmx/internal/linkbench"
	"github.com/xmx-stack/xmx/internal/netlab"
	"github.com/xmx-stack/xmx/xdp"
)

// A benchSystem is one way of moving frames that linkbench measures.
type benchSystem struct {
	name string
	ref  string // the system it is compared with ("" for a reference)
	open func(ifname string) (xdp.Link, error)
}

var benchSystems = []benchSystem{
	{"afxdp-spin", "asavie-spin", func(ifn string) (xdp.Link, error) {
		return xdp.OpenAFXDP(xdp.AFXDPConfig{Interface: ifn, Spin: true, RxLevel: xdp.QuietRxLevel})
	}},
	{"asavie-spin", "", func(ifn string) (xdp.Link, error) { return asavielink.Open(ifn, true) }},
	{"afxdp-poll", "asavie-poll", func(ifn string) (xdp.Link, error) {
		return xdp.OpenAFXDP(xdp.AFXDPConfig{Interface: ifn, RxLevel: xdp.QuietRxLevel})
	}},
	{"asavie-poll", "", func(ifn string) (xdp.Link, error) { return asavielink.Open(ifn, false) }},
	{"afpacket-poll", "asavie-poll", func(ifn string) (xdp.Link, error) {
		return xdp.OpenAFPacket(xdp.AFPacketConfig{Interface: ifn})
	}},
	{"afpacket-spin", "asavie-spin", func(ifn string) (xdp.Link, error) {
		return xdp.OpenAFPacket(xdp.AFPacketConfig{Interface: ifn, Spin: true})
	}},
}

// benchRow is what linkbench reports for one system.
type benchRow struct {
	System      string  `json:"system"`
	Mode        string  `json:"mode"`
	RTTP50us    float64 `json:"rtt_p50_us"`
	RTTP99us    float64 `json:"rtt_p99_us"`
	RoundTrips  int     `json:"round_trips"`
	Lost        int     `json:"lost"`
	FramesPerS  float64 `json:"frames_per_s"`
	StreamSent  uint64  `json:"stream_sent"`
	StreamRecvd uint64  `json:"stream_received"`
	Ref         string  `json:"ref,omitempty"`
	RTTRatio    float64 `json:"rtt_p50_ratio,omitempty"`    // RTTP50 / ref's
	RateRatio   float64 `json:"frame_rate_ratio,omitempty"` // FramesPerS / ref's

	rtts  []time.Duration
	rates []float64
}

// maxLinkRounds bounds -rounds (and maxRunTime -stream-time), so that a
// run ends in a bounded time: every round opens each system's links and
// streams for -stream-time.
const maxLinkRounds = 1000

func runLinkBench(args []string) error {
	fs := flag.NewFlagSet("linkbench", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), `usage: xmx linkbench [flags]

Brings up a two-host veth lab, measures each link kind in turn (rounds are
interleaved so that all systems see the same machine), prints one line per
system and tears the lab down. asavie-* rows are the reference floor: the
asavie/xdp socket behind xmx's steering program.

Figures: 64-byte round trip p50/p99 (µs) and one-direction frame rate of
full-size frames (frames/s) received.

`)
		fs.PrintDefaults()
	}
	rounds := fs.Int("rounds", 3, "interleaved rounds per system")
	n := fs.Int("n", 20000, "measured round trips per round")
	warmup := fs.Int("warmup", 1000, "unmeasured round trips per round")
	size := fs.Int("size", 64, "ping-pong frame size in bytes (Ethernet header included)")
	streamSize := fs.Int("stream-size", 1514, "stream frame size in bytes (Ethernet header included)")
	streamTime := fs.Duration("stream-time", time.Second, "stream duration per round")
	streamMax := fs.Int("stream-frames", 2000000, "most frames per stream round")
	systems := fs.String("systems", "all", "comma-separated systems to measure (all: "+systemNames()+")")
	mtu := fs.Int("mtu", 1500, "lab MTU")
	asJSON := fs.Bool("json", false, "print JSON instead of a table")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("%w: unexpected argument %q", errUsage, fs.Arg(0))
	}
	for _, c := range []struct {
		name string
		v    int
	}{{"-rounds", *rounds}, {"-n", *n}, {"-stream-frames", *streamMax}} {
		if c.v <= 0 {
			return fmt.Errorf("%w: %s %d: must be positive", errUsage, c.name, c.v)
		}
	}
	// The bounds of xmx pingpong: the round trips of every round are kept
	// (8 bytes each) until the report.
	if *n > maxIters || *warmup < 0 || *warmup > maxIters {
		return fmt.Errorf("%w: -n %d -warmup %d: want 1 <= n <= %d and 0 <= warmup <= %d", errUsage, *n, *warmup, maxIters, maxIters)
	}
	if *rounds > maxLinkRounds || *rounds*(*n) > maxIters {
		return fmt.Errorf("%w: -rounds %d -n %d: want at most %d rounds and %d round trips in all (rounds × n)", errUsage, *rounds, *n, maxLinkRounds, maxIters)
	}
	if *mtu < 68 || *mtu > 65535 {
		return fmt.Errorf("%w: -mtu %d: want 68..65535 (veth's range)", errUsage, *mtu)
	}
	if err := checkRunTime("-stream-time", *streamTime, 0); err != nil {
		return err
	}
	chosen, err := pickSystems(*systems)
	if err != nil {
		return err
	}
	if *size < xdp.MinFrameLen || *size > *mtu+xdp.EthHeaderLen {
		return fmt.Errorf("%w: -size %d: must be in [%d, %d]", errUsage, *size, xdp.MinFrameLen, *mtu+xdp.EthHeaderLen)
	}
	if *streamSize < xdp.MinFrameLen || *streamSize > *mtu+xdp.EthHeaderLen {
		return fmt.Errorf("%w: -stream-size %d: must be in [%d, %d]", errUsage, *streamSize, xdp.MinFrameLen, *mtu+xdp.EthHeaderLen)
	}
	if err := requireRoot("linkbench"); err != nil {
		return err
	}

	lab, err := netlab.Up(netlab.Options{Hosts: 2, MTU: *mtu})
	if err != nil {
		return err
	}
	// Tear the lab down on Ctrl-C too. The signals stay caught until the
	// teardown at the end is done: a Ctrl-C during it waits for it
	// (down runs once) rather than kill the process with half a lab up.
	down := sync.OnceFunc(func() { lab.Down() })
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	finished := make(chan struct{})
	go func() {
		select {
		case <-sig:
			down()
			os.Exit(130)
		case <-finished:
		}
	}()
	defer func() {
		down()
		signal.Stop(sig)
		close(finished)
	}()

	h1, h2 := lab.Hosts[0], lab.Hosts[1]
	rows := make([]*benchRow, len(chosen))
	for i, s := range chosen {
		rows[i] = &benchRow{System: s.name, Ref: s.ref}
	}
	progress := io.Discard // progress lines only on a terminal, not in logs
	if isTerminal(os.Stderr) {
		progress = os.Stderr
	}
	for r := 0; r < *rounds; r++ {
		for i, s := range chosen {
			fmt.Fprintf(progress, "\rround %d/%d: %-14s", r+1, *rounds, s.name)
			a, b, err := openPair(s, h1, h2)
			if err != nil {
				fmt.Fprintln(progress)
				return fmt.Errorf("%s: %w", s.name, err)
			}
			rows[i].Mode = a.Info().Mode
			pp, err := linkbench.PingPong(a, b, *size, *warmup, *n)
			var st linkbench.StreamResult
			if err == nil {
				st, err = linkbench.Stream(a, b, *streamSize, *streamTime, *streamMax)
			}
			a.Close()
			b.Close()
			if err != nil {
				fmt.Fprintln(progress)
				return fmt.Errorf("%s: %w", s.name, err)
			}
			rows[i].rtts = append(rows[i].rtts, pp.RTTs...)
			rows[i].Lost += pp.Lost
			rows[i].rates = append(rows[i].rates, st.FramesPerSec())
			rows[i].StreamSent += st.Sent
			rows[i].StreamRecvd += st.Received
		}
	}
	fmt.Fprintf(progress, "\r%40s\r", "")
	byName := map[string]*benchRow{}
	for _, row := range rows {
		row.RoundTrips = len(row.rtts)
		row.RTTP50us = us(linkbench.Percentile(row.rtts, 50))
		row.RTTP99us = us(linkbench.Percentile(row.rtts, 99))
		slices.Sort(row.rates)
		row.FramesPerS = row.rates[len(row.rates)/2]
		byName[row.System] = row
	}
	for _, row := range rows {
		if ref := byName[row.Ref]; ref != nil && ref.RTTP50us > 0 && ref.FramesPerS > 0 {
			row.RTTRatio = row.RTTP50us / ref.RTTP50us
			row.RateRatio = row.FramesPerS / ref.FramesPerS
		} else {
			row.Ref = ""
		}
	}
	if *asJSON {
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(rows)
	}
	fmt.Printf("link benchmark: veth lab, MTU %d, %d interleaved rounds; %d-byte round trips (%d per round), %d-byte frames streamed %v per round\n",
		*mtu, *rounds, *size, *n, *streamSize, *streamTime)
	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "system\tmode\tRTT p50 µs\tRTT p99 µs\tlost\tframes/s\tstream loss\tvs\tRTT ratio\trate ratio\t")
	for _, row := range rows {
		ratios := "\t-\t-\t-\t"
		if row.Ref != "" {
			ratios = fmt.Sprintf("\t%s\t%.2f×\t%.2f×\t", row.Ref, row.RTTRatio, row.RateRatio)
		}
		loss := 0.0
		if row.StreamSent > 0 {
			loss = 100 * float64(row.StreamSent-min(row.StreamSent, row.StreamRecvd)) / float64(row.StreamSent)
		}
		fmt.Fprintf(tw, "%s\t%s\t%.1f\t%.1f\t%d\t%.0f\t%.2f%%%s\n",
			row.System, row.Mode, row.RTTP50us, row.RTTP99us, row.Lost, row.FramesPerS, loss, ratios)
	}
	return tw.Flush()
}

// openPair opens the system's link on both hosts.
func openPair(s benchSystem, h1, h2 *netlab.Host) (a, b xdp.Link, err error) {
	if err := h1.Do(func() (err error) { a, err = s.open(h1.Interface); return }); err != nil {
		return nil, nil, err
	}
	if err := h2.Do(func() (err error) { b, err = s.open(h2.Interface); return }); err != nil {
		a.Close()
		return nil, nil, err
	}
	return a, b, nil
}

func pickSystems(list string) ([]benchSystem, error) {
	if list == "all" {
		return benchSystems, nil
	}
	var out []benchSystem
	for _, name := range strings.Split(list, ",") {
		i := slices.IndexFunc(benchSystems, func(s benchSystem) bool { return s.name == strings.TrimSpace(name) })
		if i < 0 {
			return nil, fmt.Errorf("%w: -systems: unknown system %q (known: %s)", errUsage, name, systemNames())
		}
		out = append(out, benchSystems[i])
	}
	return out, nil
}

func systemNames() string {
	names := make([]string, len(benchSystems))
	for i, s := range benchSystems {
		names[i] = s.name
	}
	return strings.Join(names, ",")
}

func us(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }
