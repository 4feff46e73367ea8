package msglayer_test

import (
	"context"
	"net"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/xmx-stack/xmx/msglayer"
	"github.com/xmx-stack/xmx/xdp"
)

// leanRing is one direction of a leanLink pair: a single-producer,
// single-consumer ring of frames. The sender owns head, the receiver tail.
type leanRing struct {
	head   atomic.Uint32
	_      [60]byte
	tail   atomic.Uint32
	_      [60]byte
	frames [256][2048]byte
	lens   [256]int
}

// leanLink is a link with no cost of its own beyond a cache line moving
// between CPUs: it measures the engine's own cost per message (the
// kernel's part of a real link left out). It implements Link, FrameBuilder
// and FrameVisitor, as the AF_XDP link does.
type leanLink struct {
	mac      net.HardwareAddr
	tx, rx   *leanRing
	sendMu   sync.Mutex // serialises senders (the engine's driver and its API calls)
	recvMu   sync.Mutex
	woken    atomic.Bool
	closed   atomic.Bool
	txFrames atomic.Uint64
	side     int  // its trace log (xdp.Trace): a pair's links are 0 and 1
	kick     bool // make a system call for each frame, as a real link's sendto
}

// TraceSide tells the engine which trace log its points go to.
func (l *leanLink) TraceSide() int { return l.side }

func newLeanPair() (a, b *leanLink) {
	r1, r2 := new(leanRing), new(leanRing)
	a = &leanLink{mac: net.HardwareAddr{2, 0, 0, 0, 0, 1}, tx: r1, rx: r2}
	b = &leanLink{mac: net.HardwareAddr{2, 0, 0, 0, 0, 2}, tx: r2, rx: r1, side: 1}
	return a, b
}

// newKickingPair is newLeanPair whose links make a system call for each
// frame they send, before the frame is visible, as a real link's sendto
// is: the code that runs after it pays what the call leaves cold
// (BenchmarkEngineCost), and its time is the floor's as well.
func newKickingPair() (a, b *leanLink) {
	a, b = newLeanPair()
	a.kick, b.kick = true, true
	return a, b
}

// leanPairs are the lean benchmarks' two kinds of link pair.
var leanPairs = []struct {
	name string
	pair func() (a, b *leanLink)
}{{"warm", newLeanPair}, {"syscall", newKickingPair}}

func (l *leanLink) Send(frames [][]byte) (int, error) {
	l.sendMu.Lock()
	defer l.sendMu.Unlock()
	for i, f := range frames {
		if !l.push(func(buf []byte) int { return copy(buf, f) }) {
			return i, nil
		}
	}
	return len(frames), nil
}

// push waits for room (bounded) and writes one frame.
func (l *leanLink) push(build func([]byte) int) bool {
	r := l.tx
	h := r.head.Load()
	for spins := 0; h-r.tail.Load() >= uint32(len(r.frames)); spins++ {
		if l.closed.Load() || spins > 1e6 {
			return false
		}
		runtime.Gosched()
	}
	i := h % uint32(len(r.frames))
	r.lens[i] = build(r.frames[i][:])
	xdp.Trace(l.side, xdp.TraceKick)
	if l.kick {
		os.Getppid()
	}
	r.head.Store(h + 1)
	l.txFrames.Add(1)
	return true
}

func (l *leanLink) SendBuilt(n int, b xdp.Builder) (int, error) {
	xdp.Trace(l.side, xdp.TraceLinkSend)
	l.sendMu.Lock()
	defer l.sendMu.Unlock()
	for i := 0; i < n; i++ {
		if !l.push(func(buf []byte) int { return b.Build(i, buf) }) {
			return i, nil
		}
	}
	return n, nil
}

func (l *leanLink) Recv(bufs [][]byte, sizes []int, timeout time.Duration) (int, error) {
	k := 0
	n, err := l.recv(len(bufs), timeout, func(f []byte) { sizes[k] = copy(bufs[k], f); k++ })
	return n, err
}

func (l *leanLink) RecvVisit(max int, timeout time.Duration, v xdp.Visitor) (int, error) {
	return l.recv(max, timeout, v.Visit)
}

func (l *leanLink) recv(max int, timeout time.Duration, visit func([]byte)) (int, error) {
	l.recvMu.Lock()
	defer l.recvMu.Unlock()
	r := l.rx
	var deadline time.Time
	for {
		if l.closed.Load() {
			return 0, net.ErrClosed
		}
		t, h := r.tail.Load(), r.head.Load()
		if h != t {
			xdp.Trace(l.side, xdp.TraceRxSeen)
			n := 0
			for ; t != h && n < max; t, n = t+1, n+1 {
				i := t % uint32(len(r.frames))
				visit(r.frames[i][:r.lens[i]])
			}
			r.tail.Store(t)
			return n, nil
		}
		if timeout == 0 || l.woken.Swap(false) {
			return 0, nil
		}
		if deadline.IsZero() {
			deadline = time.Now().Add(timeout)
		} else if time.Now().After(deadline) {
			return 0, nil
		}
		time.Sleep(20 * time.Microsecond)
	}
}

func (l *leanLink) Wake()                          { l.woken.Store(true) }
func (l *leanLink) HardwareAddr() net.HardwareAddr { return l.mac }
func (l *leanLink) MTU() int                       { return 1500 }
func (l *leanLink) Info() xdp.Info                 { return xdp.Info{Kind: "mem", Mode: "lean", Queue: -1} }
func (l *leanLink) Stats() xdp.Stats               { return xdp.Stats{TxFrames: l.txFrames.Load()} }
func (l *leanLink) Close() error                   { l.closed.Store(true); return nil }

// leanWorld opens its two endpoints on a fresh lean link pair.
func leanWorld() world { return leanWorldOn(newLeanPair()) }

// leanWorldOn opens its two endpoints on a and b.
func leanWorldOn(a, b *leanLink) world {
	links := [2]*leanLink{a, b}
	return world{name: "lean", open: func(t testing.TB, host int, cfg msglayer.Config) *msglayer.Endpoint {
		cfg.Link = links[host]
		return openEP(t, cfg)
	}}
}

// leanFloor is the ping-pong half round trip of the lean links alone.
func leanFloor(b *testing.B, la, lb *leanLink, n int) []time.Duration {
	done := make(chan struct{})
	go func() {
		defer close(done)
		bufs, sizes := [][]byte{make([]byte, 2048)}, []int{0}
		for {
			k, _ := lb.Recv(bufs, sizes, 0)
			if k == 0 {
				continue
			}
			if sizes[0] == 14 { // the end
				return
			}
			lb.Send([][]byte{bufs[0][:sizes[0]]})
		}
	}()
	out := make([]byte, 64)
	in, sizes := [][]byte{make([]byte, 2048)}, []int{0}
	rtts := make([]time.Duration, 0, n)
	for i := 0; i < n; i++ {
		start := time.Now()
		la.Send([][]byte{out})
		for {
			if k, _ := la.Recv(in, sizes, 0); k > 0 {
				break
			}
		}
		rtts = append(rtts, time.Since(start))
	}
	la.Send([][]byte{out[:14]})
	<-done
	return rtts
}

// BenchmarkPingPongLean measures the engine's own cost per message: 8-byte
// ping-pong in busy-poll mode over a pair of links that cost nothing but a
// cache line moving between CPUs, next to those links' own ping-pong. The
// syscall variant's links make a system call for each frame they send,
// before it is visible (newKickingPair), as a real link does: msglayer's
// overhead there includes what the call leaves cold, without a real
// link's noise.
func BenchmarkPingPongLean(b *testing.B) {
	for _, v := range leanPairs {
		var floor time.Duration
		b.Run(v.name+"/link-floor", func(b *testing.B) {
			la, lb := v.pair()
			leanFloor(b, la, lb, 1000)
			b.ResetTimer()
			rtts := leanFloor(b, la, lb, b.N)
			b.StopTimer()
			floor = reportRTT(b, rtts, 0)
		})
		b.Run(v.name+"/msglayer", func(b *testing.B) {
			a, c := leanWorldOn(v.pair()).pair(b, msglayer.Config{BusyPoll: true}, msglayer.Config{BusyPoll: true})
			p50 := reportRTT(b, measurePingPong(b, a, c), floor)
			b.ReportMetric(float64(p50-floor)/2e3, "overhead-µs")
		})
	}
}

// BenchmarkEngineCost measures the engine's CPU cost per 8-byte message
// with no second CPU involved: one goroutine sends from a, receives at b,
// answers and receives the answer at a, over lean links (busy-poll).
//
// The idle variant gives each engine 32 more endpoints, each connected to
// one on the other engine and silent: what a client process of the
// many-clients experiment looks like. Their cost per message should be
// nil.
//
// The syscall variant makes a system call before each round trip of
// every other block of 1000, as a real exchange does (each end's send is
// one), and times the round trips alone, next to the blocks without it
// (×warm). Where the
// kernel's entry and exit leave the CPU's predictors and caches cold (on
// a PVM guest one getppid takes a microsecond, and an interface call
// after it about 5 ns more than before it), the code after the call runs
// slower: a cost every hop over a real link pays, which grows with the
// code on the path, not with the time it takes warm.
func BenchmarkEngineCost(b *testing.B) {
	b.Run("idle=0", func(b *testing.B) { engineCost(b, 0, false) })
	b.Run("idle=32", func(b *testing.B) { engineCost(b, 32, false) })
	b.Run("idle=0/syscall", func(b *testing.B) { engineCost(b, 0, true) })
}

func engineCost(b *testing.B, idle int, syscall bool) {
	w := leanWorld()
	a, c := w.pair(b, msglayer.Config{BusyPoll: true}, msglayer.Config{BusyPoll: true})
	ctx := context.Background()
	for i := range idle {
		x := w.open(b, 0, msglayer.Config{BusyPoll: true, EndpointID: uint8(10 + i), Key: 1})
		y := w.open(b, 1, msglayer.Config{BusyPoll: true, EndpointID: uint8(10 + i), Key: 2})
		if err := x.Connect(ctx, y.Addr(), 2); err != nil {
			b.Fatal(err)
		}
		if err := y.Connect(ctx, x.Addr(), 1); err != nil {
			b.Fatal(err)
		}
	}
	out, in, echo := [][]byte{make([]byte, 8)}, [][]byte{make([]byte, 8)}, [][]byte{make([]byte, 8)}
	round := func() {
		rc, err := c.Irecv(0, 0, echo, nil)
		if err != nil {
			b.Fatal(err)
		}
		ra, _ := a.Irecv(2, ^uint64(0), in, nil)
		s, _ := a.Isend(c.Addr(), 0, out, nil)
		if _, err := c.Wait(ctx, rc); err != nil {
			b.Fatal(err)
		}
		s2, _ := c.Isend(a.Addr(), 2, echo, nil)
		if _, err := a.Wait(ctx, ra); err != nil {
			b.Fatal(err)
		}
		a.Forget(s)
		c.Forget(s2)
	}
	for range 1000 {
		round()
	}
	b.ReportAllocs()
	if syscall {
		var warm, cold time.Duration
		var nWarm, nCold int
		b.ResetTimer()
		// In alternating blocks: the state a system call leaves takes
		// more than a round trip to recover from.
		block := min(b.N, 1000)
		for i := range 2 * b.N {
			after := i/block%2 == 1
			if after {
				os.Getppid() // a system call, whose time is left out
			}
			t := time.Now()
			round()
			if d := time.Since(t); after {
				cold, nCold = cold+d, nCold+1
			} else {
				warm, nWarm = warm+d, nWarm+1
			}
		}
		b.StopTimer()
		coldRound := float64(cold.Nanoseconds()) / float64(nCold)
		b.ReportMetric(coldRound/2, "ns/msg")
		b.ReportMetric(coldRound/(float64(warm.Nanoseconds())/float64(nWarm)), "×warm")
		return
	}
	b.ResetTimer()
	for range b.N {
		round()
	}
	b.StopTimer()
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(2*b.N), "ns/msg")
}
