package main

import (
	"context"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/xmx-stack/xmx/msglayer"
	"github.com/xmx-stack/xmx/xdp"
)

// The pingpong and stream tools talk to an xmx server (the same command
// without a peer). Messages carry their kind in the top byte of the match
// info; the low bits carry a sequence number.
const (
	kindHello     = 1 // client → server: payload mode, max size, window
	kindHelloAck  = 2
	kindPing      = 3 // echoed as kindPong with the same length
	kindPong      = 4
	kindStream    = 5 // counted, not answered
	kindStreamEnd = 6 // payload: messages and bytes sent; answered with kindStreamAck
	kindStreamAck = 7 // payload: messages and bytes received
	kindBye       = 8
	kindShift     = 56
)

func match(kind, seq uint64) uint64 { return kind<<kindShift | seq&(1<<kindShift-1) }

// endpointFlags are the flags every messaging command shares.
type endpointFlags struct {
	iface  string
	link   string
	ep     uint
	key    uint
	busy   bool
	spin   spinFlag
	peerEP uint
	// peerEPSet: -peer-ep was given (it then must agree with PEER).
	peerEPSet bool
	peerKey   uint
	timeout   time.Duration
	hostname  string
	// umemBytes, when set by a command, sizes the UMEM buffer area the
	// endpoint lends (msglayer.Config.UMEMBufferBytes); umemGather says how
	// its data leaves.
	umemBytes  int
	umemGather xdp.GatherMode
}

func (f *endpointFlags) register(fs *flag.FlagSet, defaultEP uint) {
	fs.StringVar(&f.iface, "i", "", "network interface (default: the only non-loopback interface that is up)")
	fs.StringVar(&f.link, "link", "auto", "link kind: auto (AF_XDP, else AF_PACKET), afxdp or afpacket")
	fs.UintVar(&f.ep, "e", defaultEP, "local endpoint id (0-255)")
	fs.UintVar(&f.key, "key", 0x786d78, "endpoint key peers must present")
	fs.BoolVar(&f.busy, "busy", false, "busy-poll (lowest latency, one CPU busy) instead of sleeping in the kernel")
	f.spin = spinFlag{auto: true}
	fs.Var(&f.spin, "spin", "without -busy: how long to poll before sleeping in the kernel: auto (adapts, up to 50us), or a duration (0: sleep at once)")
	fs.UintVar(&f.peerEP, "peer-ep", 0, "peer endpoint id when PEER names a host")
	fs.UintVar(&f.peerKey, "peer-key", 0x786d78, "key to present to the peer")
	fs.DurationVar(&f.timeout, "timeout", 5*time.Second, "how long to wait for the peer to answer")
	fs.StringVar(&f.hostname, "hostname", "", "host name this endpoint answers to (default: $XMX_HOSTNAME, else the system host name)")
}

// spinFlag is -spin: auto, or how long to poll before sleeping.
type spinFlag struct {
	auto bool
	d    time.Duration
}

func (s *spinFlag) String() string {
	if s.auto {
		return "auto"
	}
	return s.d.String()
}

func (s *spinFlag) Set(v string) error {
	if v == "auto" {
		*s = spinFlag{auto: true}
		return nil
	}
	d, err := time.ParseDuration(v)
	if err != nil || d < 0 || d > time.Second {
		return errors.New("want auto or a duration of 0..1s")
	}
	*s = spinFlag{d: d}
	return nil
}

// config is the flag as msglayer.Config.SpinBeforeSleep.
func (s *spinFlag) config() time.Duration {
	switch {
	case s.auto:
		return 0
	case s.d == 0:
		return msglayer.NoSpin
	}
	return s.d
}

// mode describes blocking mode with this poll, for reports.
func (s *spinFlag) mode() string {
	switch {
	case s.auto:
		return "blocking, adaptive poll"
	case s.d == 0:
		return "blocking"
	}
	return fmt.Sprintf("blocking after %v of polling", s.d)
}

func (f *endpointFlags) validate() error {
	if f.ep > 255 {
		return fmt.Errorf("%w: -e %d: endpoint ids are 0-255", errUsage, f.ep)
	}
	if f.peerEP > 255 {
		return fmt.Errorf("%w: -peer-ep %d: endpoint ids are 0-255", errUsage, f.peerEP)
	}
	if f.key > 1<<32-1 || f.peerKey > 1<<32-1 {
		return fmt.Errorf("%w: -key and -peer-key are 32-bit", errUsage)
	}
	switch f.link {
	case "auto", "afxdp", "afpacket":
	default:
		return fmt.Errorf("%w: -link %q: want auto, afxdp or afpacket", errUsage, f.link)
	}
	// At least a millisecond: the answer watch ticks at a quarter of it.
	if err := checkRunTime("-timeout", f.timeout, time.Millisecond); err != nil {
		return err
	}
	return nil
}

// parse parses a messaging command's flags and checks the shared ones and
// that at most one PEER is given.
func (f *endpointFlags) parse(fs *flag.FlagSet, args []string) error {
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	fs.Visit(func(fl *flag.Flag) { f.peerEPSet = f.peerEPSet || fl.Name == "peer-ep" })
	if err := f.validate(); err != nil {
		return err
	}
	if fs.NArg() > 1 {
		return fmt.Errorf("%w: one PEER at most, got %q", errUsage, fs.Args())
	}
	return f.checkPeer(fs.Arg(0))
}

// checkPeer refuses, before anything is opened, a PEER that is no
// address, and -peer-ep beside a MAC address (which names its endpoint
// as MAC:EP).
func (f *endpointFlags) checkPeer(peer string) error {
	if strings.Count(peer, ":") < 5 {
		return nil // a host name, or no peer
	}
	a, err := msglayer.ParseAddr(peer)
	if err != nil {
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	if f.peerEPSet && (strings.Count(peer, ":") == 5 || uint(a.EP) != f.peerEP) {
		return fmt.Errorf("%w: -peer-ep %d with PEER %s: -peer-ep goes with a host name; a MAC names its endpoint as MAC:EP", errUsage, f.peerEP, peer)
	}
	return nil
}

// defaultInterface picks the only non-loopback interface that is up.
func defaultInterface() (string, error) {
	ifs, err := net.Interfaces()
	if err != nil {
		return "", err
	}
	var up []string
	for _, ifi := range ifs {
		if ifi.Flags&net.FlagUp != 0 && ifi.Flags&net.FlagLoopback == 0 {
			up = append(up, ifi.Name)
		}
	}
	if len(up) == 0 {
		return "", fmt.Errorf("%w: no -i given and no interface but loopback is up: name one with -i", errUsage)
	}
	if len(up) > 1 {
		return "", fmt.Errorf("%w: no -i given and %d interfaces are up (%s): name one with -i", errUsage, len(up), strings.Join(up, ", "))
	}
	return up[0], nil
}

// config is the msglayer configuration of endpoint id that the flags
// describe: every endpoint flag goes through here, so that none is parsed
// and then dropped (Interface is empty when -i was not given).
func (f *endpointFlags) config(id uint8) msglayer.Config {
	return msglayer.Config{
		Interface:       f.iface,
		LinkKind:        f.link,
		EndpointID:      id,
		Key:             uint32(f.key),
		BusyPoll:        f.busy,
		SpinBeforeSleep: f.spin.config(),
		Hostname:        f.hostname,
		UMEMBufferBytes: f.umemBytes,
		UMEMGather:      f.umemGather,
	}
}

// checkInterface settles -i (the only interface up when not given) and
// checks that the interface exists and is up, before an endpoint is
// opened on it; it also wants root.
func (f *endpointFlags) checkInterface() error {
	if err := requireRoot("this command"); err != nil {
		return err
	}
	if f.iface == "" {
		var err error
		if f.iface, err = defaultInterface(); err != nil {
			return err
		}
	}
	ifi, err := net.InterfaceByName(f.iface)
	if err != nil {
		return fmt.Errorf("%w: -i %s: no such interface (see ip link)", errUsage, f.iface)
	}
	if ifi.Flags&net.FlagUp == 0 {
		return fmt.Errorf("-i %s: the interface is down (ip link set %s up)", f.iface, f.iface)
	}
	return nil
}

// open opens the endpoint the flags describe.
func (f *endpointFlags) open() (*msglayer.Endpoint, error) {
	if err := f.checkInterface(); err != nil {
		return nil, err
	}
	e, err := msglayer.Open(f.config(uint8(f.ep)))
	if err != nil {
		return nil, err
	}
	f.sayLink(e)
	return e, nil
}

// sayLink says which link -link auto chose when it is not AF_XDP, and why.
func (f *endpointFlags) sayLink(e *msglayer.Endpoint) {
	if info, why := e.LinkInfo(); f.link == "auto" && info.Kind != "afxdp" {
		fmt.Fprintf(os.Stderr, "xmx: using %s on %s: %s\n", info.Kind, f.iface, why)
	}
}

// resolvePeer turns PEER (a MAC address with an optional :endpoint, or a
// host name) into an address and connects to it.
func (f *endpointFlags) connect(e *msglayer.Endpoint, peer string) (msglayer.Addr, error) {
	ctx, cancel := context.WithTimeout(context.Background(), f.timeout)
	defer cancel()
	var a msglayer.Addr
	if strings.Count(peer, ":") >= 5 {
		var err error
		if a, err = msglayer.ParseAddr(peer); err != nil {
			return a, fmt.Errorf("%w: %v", errUsage, err)
		}
	} else {
		var err error
		if a, err = e.Resolve(ctx, peer, uint8(f.peerEP)); err != nil {
			return a, fmt.Errorf("peer %q: no xmx host of that name answered on %s (is its server running? in a lab, run it with scripts/lab exec so that it knows its name): %w", peer, f.iface, err)
		}
	}
	if err := e.Connect(ctx, a, uint32(f.peerKey)); err != nil {
		if errors.Is(err, context.DeadlineExceeded) {
			return a, fmt.Errorf("peer %v: no answer to the connect within %v (-timeout): is the address right, and an xmx server running there?", a, f.timeout)
		}
		return a, fmt.Errorf("peer %v: %w", a, err)
	}
	return a, nil
}

// serve runs the server side of pingpong and stream until interrupted (or
// once one client said bye, with once). It takes messages of up to
// maxSize bytes and keeps at most maxRecvBytes of receives posted.
func serve(e *msglayer.Endpoint, maxSize, maxRecvBytes int, once bool, log io.Writer) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	info, _ := e.LinkInfo()
	fmt.Fprintf(log, "xmx server: endpoint %v on %s (%s %s), waiting for clients (Ctrl-C ends)\n", e.Addr(), info.Interface, info.Kind, info.Mode)

	type stream struct{ msgs, bytes uint64 }
	streams := map[msglayer.Addr]*stream{}
	pool := &recvPool{e: e, grp: e.NewGroup(), size: 64 << 10, maxSize: maxSize, budget: maxRecvBytes}
	if err := pool.grow(4, pool.size); err != nil {
		return err
	}
	// The answers are sent through the group too, and the loop does not
	// wait for them: a client that died, or is slow to pull a large pong,
	// holds up no other client. A pong's receive is posted again once the
	// pong, sent from its buffer, is done.
	send := func(to msglayer.Addr, m uint64, data []byte, what string, slot *recvSlot) error {
		var ss *serverSend
		if slot != nil {
			ss = &slot.answer // no allocation per pong
			*ss = serverSend{what: what, to: to, slot: slot}
		} else {
			ss = &serverSend{what: what, to: to}
		}
		s, err := pool.grp.Isend(to, m, [][]byte{data}, ss)
		if err != nil {
			fmt.Fprintf(log, "xmx server: %s to %v: %v\n", what, to, err)
		} else if done, _ := e.Ibuffered(s); done {
			// Copied out (small messages at once): let it go, and take
			// the next message without waiting for the ack it brings.
			e.Forget(s)
		} else if slot != nil {
			return nil // posted again when the send is done
		}
		if slot != nil && !slot.retired {
			return pool.post(slot)
		}
		return nil
	}
	for {
		st, err := pool.grp.Wait(ctx)
		if errors.Is(err, context.Canceled) {
			return nil
		}
		if ss, ok := st.Context.(*serverSend); ok {
			if err != nil {
				fmt.Fprintf(log, "xmx server: %s to %v: %v\n", ss.what, ss.to, err)
			}
			if ss.slot != nil && !ss.slot.retired {
				if err := pool.post(ss.slot); err != nil {
					return err
				}
			}
			continue
		}
		slot, isRecv := st.Context.(*recvSlot)
		if isRecv && st.Code == msglayer.Cancelled {
			continue // a receive grow took back
		}
		if err != nil && st.Code != msglayer.Truncated {
			if !isRecv {
				return err
			}
			fmt.Fprintf(log, "xmx server: %v\n", err)
		}
		if !isRecv {
			continue
		}
		kind, data := st.Match>>kindShift, slot.buf[:st.XferLen]
		switch kind {
		case kindHello:
			want, window := 64<<10, 1
			if len(data) >= 8 {
				want = int(binary.BigEndian.Uint32(data[0:]))
				window = int(binary.BigEndian.Uint32(data[4:]))
			}
			ack, refused, err := pool.admit(want, window)
			if err != nil {
				return err
			}
			if refused != "" {
				fmt.Fprintf(log, "xmx server: %v %s: refused\n", st.Source, refused)
			} else {
				streams[st.Source] = &stream{}
			}
			if err := send(st.Source, match(kindHelloAck, 0), ack, "hello answer", nil); err != nil {
				return err
			}
		case kindPing:
			// The pong is sent from the ping's buffer.
			if err := send(st.Source, match(kindPong, st.Match), data, "pong", slot); err != nil {
				return err
			}
			continue
		case kindStream:
			if s := streams[st.Source]; s != nil {
				s.msgs++
				s.bytes += uint64(st.XferLen) // what arrived
			}
		case kindStreamEnd:
			s := streams[st.Source]
			if s == nil {
				s = &stream{}
			}
			reply := make([]byte, 16) // until the answer is sent
			binary.BigEndian.PutUint64(reply[0:], s.msgs)
			binary.BigEndian.PutUint64(reply[8:], s.bytes)
			*s = stream{}
			if err := send(st.Source, match(kindStreamAck, 0), reply, "stream end answer", nil); err != nil {
				return err
			}
		case kindBye:
			delete(streams, st.Source)
			fmt.Fprintf(log, "xmx server: %v done\n", st.Source)
			if once {
				return nil
			}
		}
		if !slot.retired {
			if err := pool.post(slot); err != nil {
				return err
			}
		}
	}
}

// serverSend is the context of a send of the server's: what it answers,
// to whom, and the receive whose buffer it is sent from (a pong's), to be
// posted again once it is done.
type serverSend struct {
	what string
	to   msglayer.Addr
	slot *recvSlot
}

// sessionReceives is how many receives the server posts for a session
// of window messages in flight (the window, up to 256, and 4 spare), and
// sessionRecvBytes the bytes of their buffers with messages of up to
// size bytes. Client and server both reckon with them.
func sessionReceives(window int) int { return min(max(window, 0), 256) + 4 }

func sessionRecvBytes(size, window int) int { return sessionReceives(window) * max(size, 64) }

// recvPool is the server's receives: any-source receives on grp, all with
// buffers of one size, the largest a session asked for so far. Their
// buffers total at most budget bytes (besides the ones being taken back
// or retired while they complete).
type recvPool struct {
	e       *msglayer.Endpoint
	grp     *msglayer.Group
	size    int // the buffer size of every receive posted
	maxSize int // the largest message size a session may ask for (-max-size)
	budget  int // the most bytes of receive buffers posted (-max-recv-bytes)
	slots   []*recvSlot
}

// A recvSlot is one receive of the pool, the context of its completions.
type recvSlot struct {
	buf     []byte
	req     msglayer.Request
	retired bool       // taken out of the pool: not posted again
	answer  serverSend // the context of the pong sent from buf
}

// post posts slot's receive, with a buffer of the pool's size.
func (p *recvPool) post(slot *recvSlot) error {
	if len(slot.buf) < p.size {
		slot.buf = make([]byte, p.size)
	}
	r, err := p.grp.Irecv(0, 0, [][]byte{slot.buf}, slot)
	slot.req = r
	return err
}

// admit answers a hello asking for messages of up to want bytes, window
// of them in flight: it grows the pool for the session and returns the
// hello ack's payload, -max-size (8 bytes); or it refuses the session,
// growing nothing, and says why. A size above -max-size is refused with
// the same answer (the client compares); a session whose receives would
// pass the budget with a 16-byte answer, -max-size and the budget.
func (p *recvPool) admit(want, window int) (ack []byte, refused string, err error) {
	ack = binary.BigEndian.AppendUint64(nil, uint64(p.maxSize))
	if want > p.maxSize {
		return ack, fmt.Sprintf("asks for %d-byte messages, above -max-size %d", want, p.maxSize), nil
	}
	if need := sessionRecvBytes(want, window); need > p.budget {
		ack = binary.BigEndian.AppendUint64(ack, uint64(p.budget))
		return ack, fmt.Sprintf("asks for %d-byte messages with a window of %d: %d bytes of receives, above -max-recv-bytes %d", want, window, need, p.budget), nil
	}
	return ack, "", p.grow(sessionReceives(window), want)
}

// grow makes sure n receives of at least want bytes are posted (want at
// most a fifth of the budget, as admit sees to). Fewer are posted when n
// receives of the pool's size would pass the budget (a session's window
// meeting an earlier session's larger size): the pool is trimmed to the
// budget, and a session's messages beyond it wait as unexpected ones
// until a receive is free.
func (p *recvPool) grow(n, want int) error {
	size := max(p.size, want, 64)
	n = min(max(n, len(p.slots)), p.budget/size)
	// Receives past n are taken back first, so that their buffers are
	// not made anew; one that already matched completes and is not posted
	// again.
	for _, slot := range p.slots[min(n, len(p.slots)):] {
		slot.retired = true
		p.e.Cancel(slot.req)
	}
	p.slots = p.slots[:min(n, len(p.slots))]
	if size > p.size {
		p.size = size
		// Receives posted with smaller buffers are taken back and posted
		// again; the one that just completed is reposted by the loop.
		for _, slot := range p.slots {
			if ok, _ := p.e.Cancel(slot.req); ok {
				if err := p.post(slot); err != nil {
					return err
				}
			}
		}
	}
	for len(p.slots) < n {
		slot := &recvSlot{}
		p.slots = append(p.slots, slot)
		if err := p.post(slot); err != nil {
			return err
		}
	}
	return nil
}

// sendWait sends and waits for the send to complete.
func sendWait(ctx context.Context, e *msglayer.Endpoint, to msglayer.Addr, m uint64, data []byte) error {
	r, err := e.Isend(to, m, [][]byte{data}, nil)
	if err != nil {
		return err
	}
	_, err = e.Wait(ctx, r)
	return err
}

// hello announces a session to the server and waits for its answer, at
// most timeout. The answer gives the server's -max-size (servers before
// it sent none): a size above it is refused here, before it is sent. A
// 16-byte answer refuses the session: its receives would pass the
// server's -max-recv-bytes, the second 8 bytes.
func hello(e *msglayer.Endpoint, to msglayer.Addr, size, window int, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	b := make([]byte, 8)
	binary.BigEndian.PutUint32(b[0:], uint32(size))
	binary.BigEndian.PutUint32(b[4:], uint32(window))
	ack := make([]byte, 16)
	r, err := e.Irecv(match(kindHelloAck, 0), ^uint64(0), [][]byte{ack}, nil)
	if err != nil {
		return err
	}
	if err := sendWait(ctx, e, to, match(kindHello, 0), b); err != nil {
		e.Cancel(r)
		return fmt.Errorf("hello to %v: %w", to, err)
	}
	st, err := e.Wait(ctx, r)
	if errors.Is(err, context.DeadlineExceeded) {
		e.Cancel(r)
		return fmt.Errorf("%v took the connect but did not answer hello within %v (-timeout): is it an xmx pingpong or stream server?", to, timeout)
	}
	if err != nil {
		return fmt.Errorf("waiting for %v to answer hello: %w", to, err)
	}
	if st.XferLen >= 8 {
		if most := binary.BigEndian.Uint64(ack); uint64(size) > most {
			return fmt.Errorf("%w: %d-byte messages: the server at %v takes at most %d (its -max-size): restart it with -max-size %d or more", errServerLimit, size, to, most, size)
		}
	}
	if st.XferLen == 16 {
		// A refusal: the session's receives pass the server's bound.
		lower := "smaller sizes"
		if window > 1 {
			lower = "a smaller -window or smaller sizes"
		}
		need := sessionRecvBytes(size, window)
		if need <= maxMsgSize { // -max-recv-bytes goes no further
			lower += fmt.Sprintf(", or restart it with -max-recv-bytes %d or more", need)
		}
		return fmt.Errorf("%w: %d-byte messages with a window of %d: the server at %v keeps at most %d bytes of receives posted (its -max-recv-bytes), and %d receives of %d bytes need %d: use %s",
			errServerLimit, size, window, to, binary.BigEndian.Uint64(ack[8:]), sessionReceives(window), max(size, 64), need, lower)
	}
	return nil
}

// answerWatch ends a measurement whose peer stopped answering: a receive
// names no peer, so its wait would last for ever. It cancels the context
// when msglayer gives up on the peer or the peer forgot our session (a
// restarted server refuses our frames), or when for timeout no answer came
// and nothing was heard from the peer (it may have died with nothing of
// ours in flight; a slow answer, a large message, is heard meanwhile:
// pull requests, data, acks). The measuring loop calls tick at each
// answer: an atomic add, no syscall.
type answerWatch struct {
	n    atomic.Uint64
	held atomic.Bool // the measurement expects no answer now (hold)
	stop context.CancelFunc
}

func watchAnswers(e *msglayer.Endpoint, peer msglayer.Addr, timeout time.Duration) (context.Context, *answerWatch) {
	ctx, cancel := context.WithCancelCause(context.Background())
	w := &answerWatch{stop: func() { cancel(nil) }}
	go func() {
		every := min(timeout/4, 250*time.Millisecond)
		t := time.NewTicker(every)
		defer t.Stop()
		last, since := w.n.Load(), time.Now()
		for {
			select {
			case <-ctx.Done():
				return
			case now := <-t.C:
				if n := w.n.Load(); n != last || w.held.Load() {
					last, since = n, now
				}
				known := false
				for _, p := range e.Peers() {
					known = known || p.Addr == peer
					switch {
					case p.Addr != peer:
					case p.Dead:
						cancel(fmt.Errorf("peer %v stopped answering: %w", peer, msglayer.ErrUnreachable))
						return
					case !p.Connected:
						// Its refusal reset us (a ping's send fails at once,
						// but the loop waits for the pong).
						cancel(fmt.Errorf("peer %v ended our session (its server restarted, or refused or forgot us): %w", peer, msglayer.ErrBadSession))
						return
					case now.Sub(since) >= timeout && p.LastHeard >= timeout:
						cancel(fmt.Errorf("no answer from %v, and nothing heard from it, for %v (-timeout; has its server stopped?): %w", peer, timeout, msglayer.ErrUnreachable))
						return
					}
				}
				// A peer record given up (evicted, or dropped after its
				// death) says nothing more: the answers' silence decides.
				if !known && now.Sub(since) >= timeout {
					cancel(fmt.Errorf("no answer from %v for %v (-timeout), and it is no longer a peer of this endpoint: %w", peer, timeout, msglayer.ErrUnreachable))
					return
				}
			}
		}
	}()
	return ctx, w
}

// tick counts an answer, and ends a hold.
func (w *answerWatch) tick() {
	w.n.Add(1)
	w.held.Store(false)
}

// hold stops counting silence until the next tick: the measurement
// prepares (its buffers, say) and expects no answer meanwhile.
func (w *answerWatch) hold() { w.held.Store(true) }

// why returns the reason the watch ended ctx, or err.
func why(ctx context.Context, err error) error {
	if c := context.Cause(ctx); c != nil && !errors.Is(c, context.Canceled) {
		return c
	}
	return err
}

func bye(e *msglayer.Endpoint, to msglayer.Addr) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	sendWait(ctx, e, to, match(kindBye, 0), nil)
}

// maxSizes bounds the sizes of a list or sweep: each size is a
// measurement of its own.
const maxSizes = 1000

// parseSizes reads a size list ("0,8,1k,64k") or a sweep (start, end,
// multiplier), of at most maxSizes sizes.
func parseSizes(list string, start, end int, mult float64) ([]int, error) {
	if list != "" {
		parts := strings.Split(list, ",")
		if len(parts) > maxSizes {
			return nil, fmt.Errorf("%w: -sizes: %d sizes, want at most %d", errUsage, len(parts), maxSizes)
		}
		var out []int
		for _, s := range parts {
			n, err := parseSize(strings.TrimSpace(s))
			if err != nil {
				return nil, fmt.Errorf("%w: -sizes: %v", errUsage, err)
			}
			out = append(out, n)
		}
		return out, nil
	}
	if start < 0 || end < start || end > maxMsgSize {
		return nil, fmt.Errorf("%w: -start %d -end %d: want 0 <= start <= end <= %d", errUsage, start, end, maxMsgSize)
	}
	if !(mult > 1) || math.IsInf(mult, 0) { // NaN too
		return nil, fmt.Errorf("%w: -mult %g: must be a finite number above 1", errUsage, mult)
	}
	var out []int
	for s := start; s <= end; {
		if len(out) == maxSizes {
			return nil, fmt.Errorf("%w: -start %d -end %d -mult %g: more than %d sizes: raise -mult or narrow -start..-end", errUsage, start, end, mult, maxSizes)
		}
		out = append(out, s)
		next := s + 1
		if f := float64(s) * mult; f > float64(next) {
			next = int(min(f, float64(end)+1)) // end+1 <= maxMsgSize+1: no overflow
		}
		s = next
	}
	return out, nil
}

// maxMsgSize is the largest message size the tools take (the protocol's
// message lengths are 32-bit).
const maxMsgSize = 1<<32 - 1

// The server's -max-recv-bytes: by default, a window of 16 (the stream
// client's) of -max-size's default, 16 MiB, fits.
const (
	defaultMaxRecvBytes = 512 << 20
	minMaxRecvBytes     = 1 << 20
	maxRecvBytesHelp    = "server: most bytes of receive buffers it keeps posted (`size` in bytes; k, M, G suffixes): a client's window + 4 receives of its largest size must fit"
)

// checkServerLimits checks the server's -max-recv-bytes, and that a
// session asking for -max-size messages, one at a time, fits in it: a
// -max-size no session could have is a mistake in the command line, not
// a refusal to find in every client's hello.
func checkServerLimits(maxSize, maxRecvBytes int) error {
	if maxRecvBytes < minMaxRecvBytes {
		return fmt.Errorf("%w: -max-recv-bytes %d: want at least %d", errUsage, maxRecvBytes, minMaxRecvBytes)
	}
	if need := sessionRecvBytes(maxSize, 1); need > maxRecvBytes {
		return fmt.Errorf("%w: -max-size %d -max-recv-bytes %d: a session of -max-size messages needs %d bytes of receives (%d of them): raise -max-recv-bytes or lower -max-size",
			errUsage, maxSize, maxRecvBytes, need, sessionReceives(1))
	}
	return nil
}

// parseSize reads "4096", "4k", "1M" (powers of 1024).
func parseSize(arg string) (int, error) {
	mult, s := 1, arg
	switch {
	case strings.HasSuffix(s, "k"), strings.HasSuffix(s, "K"):
		mult, s = 1<<10, s[:len(s)-1]
	case strings.HasSuffix(s, "m"), strings.HasSuffix(s, "M"):
		mult, s = 1<<20, s[:len(s)-1]
	case strings.HasSuffix(s, "g"), strings.HasSuffix(s, "G"):
		mult, s = 1<<30, s[:len(s)-1]
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 || n > maxMsgSize/mult {
		return 0, fmt.Errorf("size %q: want a byte count up to 4G-1 such as 64, 4k, 1M or 1G", arg)
	}
	return n * mult, nil
}

// sizeFlag is a flag holding a byte count in parseSize's syntax (64, 4k,
// 1M).
type sizeFlag struct{ n int }

func (f *sizeFlag) String() string {
	if f == nil {
		return ""
	}
	return strconv.Itoa(f.n)
}

func (f *sizeFlag) Set(s string) error {
	n, err := parseSize(s)
	if err != nil {
		return err
	}
	f.n = n
	return nil
}
