package msglayer_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/xmx-stack/xmx/internal/netlab"
	"github.com/xmx-stack/xmx/msglayer"
	"github.com/xmx-stack/xmx/xdp"
)

// A world is two hosts on one segment on which the semantic suite opens
// endpoints: in memory (with fault knobs) or in a veth lab over AF_XDP.
type world struct {
	name string
	// open opens an endpoint on host 0 or 1 and closes it at cleanup.
	open func(t testing.TB, host int, cfg msglayer.Config) *msglayer.Endpoint
	// cut silences host (it stops hearing and being heard), for peer death.
	cut func(t testing.TB, host int)
	// big is the largest message the order test sends.
	big int
	// oneLink: both hosts' endpoints are on one link, in one engine
	// (every message takes the same-process path); cut is nil then.
	oneLink bool
}

func memWorld(t testing.TB, mc xdp.MemConfig) world {
	return memWorldOf(t, mc, func(l *xdp.MemLink) xdp.Link { return l })
}

// memWorldOf is memWorld with the endpoints opened on wrap(link).
func memWorldOf(t testing.TB, mc xdp.MemConfig, wrap func(*xdp.MemLink) xdp.Link) world {
	hub := xdp.NewHub(mc)
	links := []*xdp.MemLink{hub.Attach(), hub.Attach()}
	t.Cleanup(func() {
		for _, l := range links {
			l.Close()
		}
	})
	given := []xdp.Link{wrap(links[0]), wrap(links[1])}
	return world{
		name: "mem " + links[0].Info().Mode,
		open: func(t testing.TB, host int, cfg msglayer.Config) *msglayer.Endpoint {
			cfg.Link = given[host]
			return openEP(t, cfg)
		},
		cut: func(t testing.TB, host int) { links[host].Partition(true) },
		big: 16 << 20,
	}
}

func labWorld(t *testing.T, kind string) world {
	lab := netlab.New(t, netlab.Options{Hosts: 2})
	return world{
		name: kind + " lab " + lab.Name,
		open: func(t testing.TB, host int, cfg msglayer.Config) *msglayer.Endpoint {
			cfg.Interface = lab.Hosts[host].Interface
			cfg.LinkKind = kind
			var e *msglayer.Endpoint
			err := lab.Hosts[host].Do(func() (err error) {
				e, err = msglayer.Open(cfg)
				return err
			})
			if err != nil {
				skipNoMultiBuffer(t, err)
				t.Fatalf("open endpoint on %s: %v", lab.Hosts[host].Name, err)
			}
			t.Cleanup(func() { e.Close() })
			return e
		},
		cut: func(t testing.TB, host int) {
			h := lab.Hosts[host]
			if out, err := h.Command("ip", "link", "set", "dev", h.Interface, "down").CombinedOutput(); err != nil {
				t.Fatalf("cut %s: %v: %s", h.Name, err, out)
			}
		},
		big: 16 << 20,
	}
}

func openEP(t testing.TB, cfg msglayer.Config) *msglayer.Endpoint {
	t.Helper()
	e, err := msglayer.Open(cfg)
	if err != nil {
		t.Fatalf("open endpoint: %v", err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

func ctxFor(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// pair opens endpoint 1 on host 0 and endpoint 2 on host 1 and connects
// each to the other.
func (w world) pair(t testing.TB, ca, cb msglayer.Config) (a, b *msglayer.Endpoint) {
	t.Helper()
	ca.EndpointID, cb.EndpointID = 1, 2
	ca.Key, cb.Key = 0xa, 0xb
	a = w.open(t, 0, ca)
	b = w.open(t, 1, cb)
	ctx := ctxFor(t, 10*time.Second)
	if err := a.Connect(ctx, b.Addr(), 0xb); err != nil {
		t.Fatal(err)
	}
	if err := b.Connect(ctx, a.Addr(), 0xa); err != nil {
		t.Fatal(err)
	}
	return a, b
}

// message returns n bytes that encode (seq, n) and a checksum, so a
// receiver can tell which message it got and that it is intact.
func message(seq, n int) []byte {
	b := make([]byte, n)
	x := uint32(seq*2654435761 + n)
	for i := range b {
		x ^= x << 13
		x ^= x >> 17
		x ^= x << 5
		b[i] = byte(x)
	}
	if n >= 16 {
		binary.BigEndian.PutUint32(b[0:], uint32(seq))
		binary.BigEndian.PutUint32(b[4:], uint32(n))
		binary.BigEndian.PutUint32(b[8:], crc32.ChecksumIEEE(b[12:]))
	}
	return b
}

// transfer sends data from one endpoint to the other under match m into
// buf, and waits for both ends.
func transfer(t testing.TB, ctx context.Context, from, to *msglayer.Endpoint, m uint64, data, buf []byte) {
	t.Helper()
	r, err := to.Irecv(m, ^uint64(0), [][]byte{buf}, nil)
	if err != nil {
		t.Fatal(err)
	}
	s, err := from.Isend(to.Addr(), m, [][]byte{data}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := to.Wait(ctx, r); err != nil {
		t.Fatalf("receive of message %d (%d bytes) %v→%v: %v", m, len(data), from.Addr(), to.Addr(), err)
	}
	if _, err := from.Wait(ctx, s); err != nil {
		t.Fatalf("send of message %d (%d bytes) %v→%v: %v", m, len(data), from.Addr(), to.Addr(), err)
	}
}

func checkMessage(t testing.TB, got []byte, seq, n int) {
	t.Helper()
	if want := message(seq, n); !bytes.Equal(got, want) {
		i := 0
		for i < len(got) && i < len(want) && got[i] == want[i] {
			i++
		}
		t.Fatalf("message %d (%d bytes): payload differs at byte %d (got %d bytes)", seq, n, i, len(got))
	}
}

func runSemantic(t *testing.T, w world) {
	t.Run("MatchingWithMasks", func(t *testing.T) { testMatching(t, w) })
	t.Run("OrderAllClasses", func(t *testing.T) { testOrder(t, w) })
	t.Run("Truncation", func(t *testing.T) { testTruncation(t, w) })
	t.Run("Issend", func(t *testing.T) { testIssend(t, w) })
	t.Run("Probe", func(t *testing.T) { testProbe(t, w) })
	t.Run("CancelForget", func(t *testing.T) { testCancelForget(t, w) })
	t.Run("UnexpectedHandler", func(t *testing.T) { testHandler(t, w) })
	t.Run("UnexpectedBound", func(t *testing.T) { testUnexpectedBound(t, w) })
	t.Run("ConvertedStream", func(t *testing.T) { testConvertedStream(t, w) })
	t.Run("ConcurrentWaits", func(t *testing.T) { testConcurrentWaits(t, w) })
	t.Run("GroupAcrossEndpoints", func(t *testing.T) { testGroupAcrossEndpoints(t, w) })
	t.Run("WrongKey", func(t *testing.T) { testWrongKey(t, w) })
	t.Run("PeerRestart", func(t *testing.T) { testPeerRestart(t, w) })
	t.Run("SelfAndSameNIC", func(t *testing.T) { testSelf(t, w) })
	t.Run("PeerDeath", func(t *testing.T) { testPeerDeath(t, w) })
}

func TestSemanticMemIdeal(t *testing.T) { runSemantic(t, memWorld(t, xdp.MemConfig{})) }

func TestSemanticMemFaults(t *testing.T) {
	runSemantic(t, memWorld(t, xdp.MemConfig{Loss: 0.05, Reorder: 0.05, Duplicate: 0.01, Seed: 3}))
}

// TestSemanticMemSeqWrap runs the suite with sequence numbers that wrap
// past 2^32 within each session's first 200 frames, over the faulty
// in-memory link: windows, acks, frames held out of order and
// retransmissions all straddle the wrap.
func TestSemanticMemSeqWrap(t *testing.T) {
	const base = 1<<32 - 200
	t.Cleanup(msglayer.SetSeqBase(base))
	w := memWorld(t, xdp.MemConfig{Loss: 0.05, Reorder: 0.05, Duplicate: 0.01, Seed: 7})
	t.Run("Wraps", func(t *testing.T) {
		a, b := w.pair(t, msglayer.Config{}, msglayer.Config{})
		ctx := ctxFor(t, 30*time.Second)
		buf := make([]byte, 4096)
		for i := range 200 { // 300 frames each way
			n := []int{0, 8, 1000, 4096}[i%4]
			transfer(t, ctx, a, b, uint64(i), message(i, n), buf[:n])
			checkMessage(t, buf[:n], i, n)
			transfer(t, ctx, b, a, uint64(i), message(i, n), buf[:n])
			checkMessage(t, buf[:n], i, n)
		}
		for _, e := range [][2]*msglayer.Endpoint{{a, b}, {b, a}} {
			next, acked, expected := e[0].DebugSeqs(e[1].Addr())
			if next-base < 300 || expected-base < 300 || acked != next {
				t.Errorf("%v→%v: next %d acked %d expected %d: the sequence numbers did not wrap (from %d)", e[0].Addr(), e[1].Addr(), next, acked, expected, base)
			}
		}
	})
	runSemantic(t, w)
}

// TestSeqWrapDuplicates: over a link that delivers every frame twice,
// the copy of the last frame before the wrap arrives when the receiver
// expects the first one after it. It must count as a duplicate (and be
// acked again), not as a frame beyond the window, which a sequence test
// without modular arithmetic makes it.
func TestSeqWrapDuplicates(t *testing.T) {
	const base = 1<<32 - 50
	t.Cleanup(msglayer.SetSeqBase(base))
	w := memWorld(t, xdp.MemConfig{Duplicate: 1})
	a, b := w.pair(t, msglayer.Config{}, msglayer.Config{})
	ctx := ctxFor(t, 30*time.Second)
	buf := make([]byte, 8)
	for i := range 100 {
		transfer(t, ctx, a, b, uint64(i), message(i, 8), buf)
		checkMessage(t, buf, i, 8)
		transfer(t, ctx, b, a, uint64(i), message(i, 8), buf)
		checkMessage(t, buf, i, 8)
	}
	for _, e := range [][2]*msglayer.Endpoint{{a, b}, {b, a}} {
		if next, _, expected := e[0].DebugSeqs(e[1].Addr()); next-base < 100 || expected-base < 100 {
			t.Errorf("%v→%v: next %d expected %d: the sequence numbers did not wrap (from %d)", e[0].Addr(), e[1].Addr(), next, expected, base)
		}
		c := e[0].Counters()
		if c.Duplicates == 0 || c.BeyondWindow != 0 {
			t.Errorf("%v: %d duplicates, %d beyond the window; want some and none", e[0].Addr(), c.Duplicates, c.BeyondWindow)
		}
	}
}

// TestSemanticMemTails runs the suite over in-memory links that send the
// way AF_PACKET does: pull replies' data goes to the link as a tail read
// from the sender's memory (xdp.TailSender), not copied into the frame.
func TestSemanticMemTails(t *testing.T) {
	var links []*tailLink
	runSemantic(t, memWorldOf(t, xdp.MemConfig{Loss: 0.05, Reorder: 0.05, Duplicate: 0.01, Seed: 5}, func(l *xdp.MemLink) xdp.Link {
		tl := &tailLink{m: l}
		links = append(links, tl)
		return tl
	}))
	var tailed uint64
	for _, l := range links {
		tailed += l.tailed.Load()
	}
	if tailed == 0 {
		t.Error("no frame was sent with a tail")
	}
	t.Logf("%d frames sent with a tail", tailed)
}

// tailLink is an in-memory link that shows msglayer the interfaces of an
// AF_PACKET link (no BufferLink, no IdleProber) and counts the frames
// sent with a tail.
type tailLink struct {
	m      *xdp.MemLink
	tailed atomic.Uint64
	ctr    tailCounter // of the SendTails call under way (msglayer's flusher)
}

func (l *tailLink) Send(f [][]byte) (int, error) { return l.m.Send(f) }
func (l *tailLink) Recv(b [][]byte, s []int, d time.Duration) (int, error) {
	return l.m.Recv(b, s, d)
}
func (l *tailLink) HardwareAddr() net.HardwareAddr { return l.m.HardwareAddr() }
func (l *tailLink) MTU() int                       { return l.m.MTU() }
func (l *tailLink) Info() xdp.Info                 { return l.m.Info() }
func (l *tailLink) Stats() xdp.Stats               { return l.m.Stats() }
func (l *tailLink) Close() error                   { return l.m.Close() }
func (l *tailLink) Wake()                          { l.m.Wake() }
func (l *tailLink) RecvVisit(n int, d time.Duration, v xdp.Visitor) (int, error) {
	return l.m.RecvVisit(n, d, v)
}
func (l *tailLink) SendBuilt(n int, b xdp.Builder) (int, error) { return l.m.SendBuilt(n, b) }
func (l *tailLink) SendTails(n int, t xdp.Tailer) (int, error) {
	l.ctr = tailCounter{t, &l.tailed}
	return l.m.SendTails(n, &l.ctr)
}

// tailCounter counts the frames given a tail.
type tailCounter struct {
	xdp.Tailer
	n *atomic.Uint64
}

func (c *tailCounter) Tail(i int, head []byte) (int, []byte) {
	h, tail := c.Tailer.Tail(i, head)
	if len(tail) > 0 {
		c.n.Add(1)
	}
	return h, tail
}

// TestSemanticSameProcess runs the suite with both hosts' endpoints on
// one link, in one engine: every message takes the same-process path,
// which must behave as the network does (but for peer death: no cut).
func TestSemanticSameProcess(t *testing.T) {
	w := memWorld(t, xdp.MemConfig{})
	open := w.open
	w.name = "same process"
	w.open = func(t testing.TB, _ int, cfg msglayer.Config) *msglayer.Endpoint { return open(t, 0, cfg) }
	w.cut, w.oneLink = nil, true
	runSemantic(t, w)
}

func TestSemanticAFXDP(t *testing.T) { runSemantic(t, labWorld(t, "afxdp")) }

func TestSemanticAFPacket(t *testing.T) { runSemantic(t, labWorld(t, "afpacket")) }

func testMatching(t *testing.T, w world) {
	a, b := w.pair(t, msglayer.Config{}, msglayer.Config{})
	ctx := ctxFor(t, 20*time.Second)
	if _, err := b.Irecv(1, 0, nil, nil); !errors.Is(err, msglayer.ErrBadMatchMask) {
		t.Fatalf("Irecv(info 1, mask 0) = %v, want ErrBadMatchMask", err)
	}
	bufs := make([][]byte, 3)
	recvs := make([]msglayer.Request, 3)
	posts := []struct{ info, mask uint64 }{{0x100, 0xf00}, {0x005, 0x00f}, {0, 0}}
	for i, p := range posts {
		bufs[i] = make([]byte, 64)
		var err error
		if recvs[i], err = b.Irecv(p.info, p.mask, [][]byte{bufs[i]}, i); err != nil {
			t.Fatal(err)
		}
	}
	// Each message goes to the oldest receive it fits.
	sends := []struct {
		match uint64
		want  int
	}{{0x205, 1}, {0x1ff, 0}, {0x999, 2}}
	for i, s := range sends {
		if _, err := a.Isend(b.Addr(), s.match, [][]byte{message(i, 40)}, nil); err != nil {
			t.Fatal(err)
		}
	}
	for i, s := range sends {
		st, err := b.Wait(ctx, recvs[s.want])
		if err != nil {
			t.Fatal(err)
		}
		if st.Match != s.match || st.Context != s.want || st.Source != a.Addr() || st.XferLen != 40 {
			t.Errorf("message %#x: status %+v, want receive %d", s.match, st, s.want)
		}
		checkMessage(t, bufs[s.want][:40], i, 40)
	}
}

// orderSizes covers every message class: tiny, small, medium (eager
// fragments), at the rendezvous threshold, large.
var orderSizes = []int{0, 1, 16, 32, 100, 1400, 1460, 1461, 3000, 9000, 32 << 10, 32<<10 + 1, 100 << 10, 1 << 20}

func testOrder(t *testing.T, w world) {
	a, b := w.pair(t, msglayer.Config{}, msglayer.Config{})
	ctx := ctxFor(t, 120*time.Second)
	sizes := append([]int{}, orderSizes...)
	sizes = append(sizes, orderSizes...)
	sizes = append(sizes, w.big)
	// Half the receives are posted before the messages arrive, half after
	// (unexpected), all with a wildcard mask: order alone decides.
	half := len(sizes) / 2
	recvBufs := make([][]byte, len(sizes))
	recvs := make([]msglayer.Request, len(sizes))
	post := func(i int) {
		recvBufs[i] = make([]byte, sizes[i])
		var err error
		if recvs[i], err = b.Irecv(0, 0, [][]byte{recvBufs[i]}, nil); err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; i < half; i++ {
		post(i)
	}
	sends := make([]msglayer.Request, len(sizes))
	for i, n := range sizes {
		var err error
		msg := message(i, n)
		// Split some messages over several segments.
		segs := [][]byte{msg}
		if n > 10 && i%2 == 0 {
			segs = [][]byte{msg[:n/3], msg[n/3 : n/2], msg[n/2:]}
		}
		if sends[i], err = a.Isend(b.Addr(), uint64(i), segs, nil); err != nil {
			t.Fatal(err)
		}
	}
	for i := half; i < len(sizes); i++ {
		post(i)
	}
	for i := range sizes {
		st, err := b.Wait(ctx, recvs[i])
		if err != nil {
			t.Fatalf("receive %d (%d bytes): %v", i, sizes[i], err)
		}
		if st.Match != uint64(i) || st.XferLen != sizes[i] || st.MsgLen != sizes[i] {
			t.Fatalf("receive %d: got message %d (%d of %d bytes), want message %d of %d bytes: out of order",
				i, st.Match, st.XferLen, st.MsgLen, i, sizes[i])
		}
		checkMessage(t, recvBufs[i], i, sizes[i])
	}
	for i := range sends {
		if st, err := a.Wait(ctx, sends[i]); err != nil || st.XferLen != sizes[i] {
			t.Fatalf("send %d: %+v, %v", i, st, err)
		}
	}
	t.Logf("%s: sender %+v", w.name, a.Counters())
	t.Logf("%s: receiver %+v", w.name, b.Counters())
}

func testTruncation(t *testing.T, w world) {
	a, b := w.pair(t, msglayer.Config{}, msglayer.Config{})
	ctx := ctxFor(t, 20*time.Second)
	for i, n := range []int{1000, 5000, 100000} {
		buf := make([]byte, 100)
		r, _ := b.Irecv(0, 0, [][]byte{buf}, nil)
		s, err := a.Isend(b.Addr(), 9, [][]byte{message(i, n)}, nil)
		if err != nil {
			t.Fatal(err)
		}
		st, err := b.Wait(ctx, r)
		if !errors.Is(err, msglayer.ErrTruncated) || st.Code != msglayer.Truncated || st.XferLen != 100 || st.MsgLen != n {
			t.Fatalf("%d-byte message into 100 bytes: %+v, %v", n, st, err)
		}
		if !bytes.Equal(buf, message(i, n)[:100]) {
			t.Fatalf("%d-byte message: truncated data differs", n)
		}
		if _, err := a.Wait(ctx, s); err != nil {
			t.Fatalf("send of a truncated message: %v", err)
		}
	}
}

func testIssend(t *testing.T, w world) {
	a, b := w.pair(t, msglayer.Config{}, msglayer.Config{})
	ctx := ctxFor(t, 20*time.Second)
	for _, n := range []int{0, 8, 100000} {
		s, err := a.Issend(b.Addr(), 5, [][]byte{message(1, n)}, nil)
		if err != nil {
			t.Fatal(err)
		}
		// Without a receive the synchronous send cannot complete.
		short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
		_, err = a.Wait(short, s)
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("issend of %d bytes completed before a receive was posted: %v", n, err)
		}
		buf := make([]byte, n)
		r, _ := b.Irecv(5, ^uint64(0), [][]byte{buf}, nil)
		if _, err := b.Wait(ctx, r); err != nil {
			t.Fatal(err)
		}
		if st, err := a.Wait(ctx, s); err != nil || st.XferLen != n {
			t.Fatalf("issend: %+v, %v", st, err)
		}
		checkMessage(t, buf, 1, n)
	}
}

func testProbe(t *testing.T, w world) {
	a, b := w.pair(t, msglayer.Config{}, msglayer.Config{})
	ctx := ctxFor(t, 20*time.Second)
	if _, ok := b.Iprobe(0, 0); ok {
		t.Fatal("Iprobe found a message on an idle endpoint")
	}
	for i, n := range []int{10, 3000, 200000} {
		if _, err := a.Isend(b.Addr(), 0x77, [][]byte{message(i, n)}, nil); err != nil {
			t.Fatal(err)
		}
		st, err := b.Probe(ctx, 0x70, 0xf0)
		if err != nil || st.Match != 0x77 || st.MsgLen != n || st.Source != a.Addr() {
			t.Fatalf("probe: %+v, %v", st, err)
		}
		if st, ok := b.Iprobe(0x60, 0xf0); ok {
			t.Fatalf("Iprobe(0x60, 0xf0) found %+v; only 0x77 arrived", st)
		}
		if c := b.Counters(); n > 32<<10 && (c.UnexpectedBytesNow > 1024 || c.Pulls != 0) {
			// A large unexpected message costs its record only: its data
			// stays at the sender until a receive matches.
			t.Fatalf("a %d-byte unexpected message holds %d bytes and started %d pulls before its receive", n, c.UnexpectedBytesNow, c.Pulls)
		}
		buf := make([]byte, n)
		r, _ := b.Irecv(0x77, ^uint64(0), [][]byte{buf}, nil)
		if _, err := b.Wait(ctx, r); err != nil {
			t.Fatal(err)
		}
		checkMessage(t, buf, i, n)
		if _, ok := b.Iprobe(0x70, 0xf0); ok {
			t.Fatal("Iprobe found a message already received")
		}
	}
}

func testCancelForget(t *testing.T, w world) {
	a, b := w.pair(t, msglayer.Config{}, msglayer.Config{})
	ctx := ctxFor(t, 20*time.Second)
	r, _ := b.Irecv(1, ^uint64(0), nil, "ctx")
	if ok, err := b.Cancel(r); !ok || err != nil {
		t.Fatalf("cancel of a posted receive = %v, %v", ok, err)
	}
	st, err := b.Wait(ctx, r)
	if !errors.Is(err, msglayer.ErrCancelled) || st.Context != "ctx" {
		t.Fatalf("cancelled receive: %+v, %v", st, err)
	}
	if _, _, err := b.Test(r); !errors.Is(err, msglayer.ErrStaleRequest) {
		t.Fatalf("Test of a spent handle = %v, want ErrStaleRequest", err)
	}
	s, _ := a.Isend(b.Addr(), 2, [][]byte{message(0, 100)}, nil)
	if _, err := a.Cancel(s); !errors.Is(err, msglayer.ErrNotCancelled) {
		t.Fatalf("cancel of a send = %v, want ErrNotCancelled", err)
	}
	// Forget: the send still happens, its completion is never reported.
	if err := a.Forget(s); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 100)
	r2, _ := b.Irecv(2, ^uint64(0), [][]byte{buf}, nil)
	if _, err := b.Wait(ctx, r2); err != nil {
		t.Fatal(err)
	}
	checkMessage(t, buf, 0, 100)
	if _, ok := a.TestAny(0, 0); ok {
		t.Fatal("a forgotten send was reported")
	}
	// A matched receive cannot be cancelled.
	r3, _ := b.Irecv(3, ^uint64(0), [][]byte{make([]byte, 10)}, nil)
	s3, _ := a.Isend(b.Addr(), 3, [][]byte{message(3, 10)}, nil)
	if _, err := b.Wait(ctx, r3); err != nil {
		t.Fatal(err)
	}
	a.Wait(ctx, s3)
	if _, err := b.Cancel(r3); !errors.Is(err, msglayer.ErrStaleRequest) {
		t.Fatalf("cancel of a completed receive = %v", err)
	}
	// A pending connect (to a NIC nobody has) can be cancelled, and
	// completes Cancelled with its match info and context.
	ghost := msglayer.Addr{MAC: [6]byte{2, 0, 0, 0, 0, 0x99}, EP: 1}
	c, err := a.IConnect(ghost, 1, 0xc0, "connect")
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := a.Cancel(c); !ok || err != nil {
		t.Fatalf("cancel of a pending connect = %v, %v", ok, err)
	}
	if st, err := a.Wait(ctx, c); !errors.Is(err, msglayer.ErrCancelled) || st.Context != "connect" || st.Match != 0xc0 {
		t.Fatalf("cancelled connect: %+v, %v", st, err)
	}
}

func testHandler(t *testing.T, w world) {
	var calls atomic.Int32
	var sawData atomic.Bool
	cb := msglayer.Config{UnexpectedHandler: func(m msglayer.UnexpectedMessage) msglayer.HandlerAction {
		calls.Add(1)
		if m.Match == 0xdead {
			if m.Length <= 100 && bytes.Equal(m.Data, message(0, m.Length)) {
				sawData.Store(true)
			}
			return msglayer.Finished
		}
		return msglayer.Continue
	}}
	a, b := w.pair(t, msglayer.Config{}, cb)
	ctx := ctxFor(t, 20*time.Second)
	s1, _ := a.Isend(b.Addr(), 0xdead, [][]byte{message(0, 50)}, nil)
	s2, _ := a.Isend(b.Addr(), 0xdead, [][]byte{message(0, 300000)}, nil)
	s3, _ := a.Isend(b.Addr(), 0xbeef, [][]byte{message(1, 50)}, nil)
	for _, s := range []msglayer.Request{s1, s2, s3} {
		if _, err := a.Wait(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	buf := make([]byte, 50)
	r, _ := b.Irecv(0xbeef, ^uint64(0), [][]byte{buf}, nil)
	if _, err := b.Wait(ctx, r); err != nil {
		t.Fatal(err)
	}
	checkMessage(t, buf, 1, 50)
	if _, ok := b.Iprobe(0xdead, ^uint64(0)); ok {
		t.Fatal("a message the handler consumed was queued")
	}
	if calls.Load() != 3 || !sawData.Load() {
		t.Fatalf("handler called %d times (want 3), saw the small message's data: %v", calls.Load(), sawData.Load())
	}
}

func testUnexpectedBound(t *testing.T, w world) {
	const bound, records = 64 << 10, 16
	a, b := w.pair(t, msglayer.Config{}, msglayer.Config{UnexpectedBytes: bound, MaxUnexpectedRndv: records})
	held := func() {
		t.Helper()
		if c := b.Counters(); c.UnexpectedBytesNow > bound || c.UnexpectedRndvNow > records {
			t.Fatalf("held %d unexpected bytes and %d records; bounds %d and %d", c.UnexpectedBytesNow, c.UnexpectedRndvNow, bound, records)
		}
	}
	ctx := ctxFor(t, 30*time.Second)
	const n, size = 100, 8 << 10
	sends := make([]msglayer.Request, n)
	for i := range sends {
		var err error
		if sends[i], err = a.Isend(b.Addr(), uint64(i), [][]byte{message(i, size)}, nil); err != nil {
			t.Fatal(err)
		}
	}
	// Let the flood arrive; the receiver's memory must stay bounded.
	deadline := time.Now().Add(500 * time.Millisecond)
	for time.Now().Before(deadline) {
		held()
		b.Iprobe(^uint64(0), ^uint64(0)) // drives progress in busy mode
		time.Sleep(5 * time.Millisecond)
	}
	for i := 0; i < n; i++ {
		buf := make([]byte, size)
		r, _ := b.Irecv(0, 0, [][]byte{buf}, nil)
		st, err := b.Wait(ctx, r)
		if err != nil {
			t.Fatalf("receive %d: %v\nsender %+v\nreceiver %+v\nsender→receiver %s\nreceiver→sender %s", i, err, a.Counters(), b.Counters(), a.DebugPeer(b.Addr()), b.DebugPeer(a.Addr()))
		}
		if st.Match != uint64(i) {
			t.Fatalf("message %d arrived as number %d", st.Match, i)
		}
		checkMessage(t, buf, i, size)
		held()
	}
	for _, s := range sends {
		if _, err := a.Wait(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	ca, cb := a.Counters(), b.Counters()
	// (Whether records were deferred depends on how many arrived before
	// the receives: the tests of rndvbound_test.go see to it.)
	if cb.EagerRefused == 0 || ca.EagerConverted == 0 {
		t.Errorf("flood of %d KiB into a %d KiB bound: refused %d, converted %d; want both > 0",
			n*size>>10, bound>>10, cb.EagerRefused, ca.EagerConverted)
	}
	t.Logf("refused %d eager messages, sender converted %d to rendezvous, records deferred %d times", cb.EagerRefused, ca.EagerConverted, cb.RndvDeferred)
}

// testConvertedStream streams eager messages into a receiver that posts
// its receives late and has room for few of them, with a window of sends
// in flight whose requests are recycled as they complete: every refused
// message must be converted to a rendezvous, delivered intact and in
// order, and every send must complete.
func testConvertedStream(t *testing.T, w world) {
	const bound, size, n, window = 48 << 10, 40 << 10, 120, 6
	a, b := w.pair(t, msglayer.Config{RendezvousThreshold: 64 << 10}, msglayer.Config{UnexpectedBytes: bound})
	ctx := ctxFor(t, 60*time.Second)
	recvDone := make(chan error, 1)
	go func() {
		buf := make([]byte, size)
		for i := 0; i < n; i++ {
			if i%8 == 0 {
				time.Sleep(3 * time.Millisecond) // let the flood pile up
			}
			r, err := b.Irecv(0, 0, [][]byte{buf}, nil)
			if err != nil {
				recvDone <- err
				return
			}
			st, err := b.Wait(ctx, r)
			if err != nil {
				recvDone <- fmt.Errorf("receive %d: %w", i, err)
				return
			}
			if st.Match != uint64(i) || !bytes.Equal(buf, message(i, size)) {
				recvDone <- fmt.Errorf("receive %d: got message %d, intact %v", i, st.Match, bytes.Equal(buf, message(int(st.Match), size)))
				return
			}
		}
		recvDone <- nil
	}()
	var inflight []msglayer.Request
	for i := 0; i < n; i++ {
		if len(inflight) == window {
			if _, err := a.Wait(ctx, inflight[0]); err != nil {
				t.Fatalf("send %d: %v\nsender %+v\nreceiver %+v\n%s", i-window, err, a.Counters(), b.Counters(), a.DebugPeer(b.Addr()))
			}
			inflight = inflight[1:]
		}
		r, err := a.Isend(b.Addr(), uint64(i), [][]byte{message(i, size)}, nil)
		if err != nil {
			t.Fatal(err)
		}
		inflight = append(inflight, r)
	}
	for j, r := range inflight {
		if _, err := a.Wait(ctx, r); err != nil {
			t.Fatalf("send %d: %v\nsender %+v\nreceiver %+v\n%s", n-len(inflight)+j, err, a.Counters(), b.Counters(), a.DebugPeer(b.Addr()))
		}
	}
	if err := <-recvDone; err != nil {
		t.Fatal(err)
	}
	ca, cb := a.Counters(), b.Counters()
	t.Logf("refused %d eager messages, sender converted %d", cb.EagerRefused, ca.EagerConverted)
	if ca.EagerConverted == 0 {
		t.Errorf("no eager send was converted (refused %d): the test did not exercise conversion", cb.EagerRefused)
	}
}

// testGroupAcrossEndpoints has two endpoints on each host, each sending
// to its counterpart, and one goroutine per host taking every completion
// of both of its endpoints from one group (Group.On). Closing one
// receiving endpoint completes its last receive into the group.
func testGroupAcrossEndpoints(t *testing.T, w world) {
	ctx := ctxFor(t, 60*time.Second)
	var tx, rx [2]*msglayer.Endpoint
	for i := range 2 {
		tx[i] = w.open(t, 0, msglayer.Config{EndpointID: uint8(3 + i), Key: 0xa})
		rx[i] = w.open(t, 1, msglayer.Config{EndpointID: uint8(5 + i), Key: 0xb})
	}
	for i := range 2 {
		if err := tx[i].Connect(ctx, rx[i].Addr(), 0xb); err != nil {
			t.Fatal(err)
		}
	}
	sizes := []int{0, 8, 2000, 40000, 300000}
	const per = 20
	type posted struct{ ep, i int }
	rgrp, sgrp := [2]*msglayer.Group{rx[0].NewGroup()}, [2]*msglayer.Group{tx[0].NewGroup()}
	for i := 1; i < 2; i++ {
		var err error
		if rgrp[i], err = rgrp[0].On(rx[i]); err != nil {
			t.Fatal(err)
		}
		if sgrp[i], err = sgrp[0].On(tx[i]); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := rgrp[0].On(tx[0]); !w.oneLink && !errors.Is(err, msglayer.ErrOtherLink) {
		t.Fatalf("On(an endpoint of the other host) = %v, want ErrOtherLink", err)
	}
	bufs := [2][per][]byte{}
	for ep := range 2 {
		for i := range per {
			bufs[ep][i] = make([]byte, sizes[i%len(sizes)])
			if _, err := rgrp[ep].Irecv(uint64(i), ^uint64(0), [][]byte{bufs[ep][i]}, posted{ep, i}); err != nil {
				t.Fatal(err)
			}
		}
	}
	// One more receive on rx[1] that no message matches: Close completes it.
	if _, err := rgrp[1].Irecv(1<<40, ^uint64(0), nil, posted{1, per}); err != nil {
		t.Fatal(err)
	}
	for i := range per {
		for ep := range 2 {
			m := message(ep*per+i, sizes[i%len(sizes)])
			if _, err := sgrp[ep].Isend(rx[ep].Addr(), uint64(i), [][]byte{m}, posted{ep, i}); err != nil {
				t.Fatal(err)
			}
		}
	}
	// Each group is waited on by one goroutine; every completion of both
	// endpoints comes out of it, once.
	take := func(grp *msglayer.Group, n int, check func(posted, msglayer.Status) error) error {
		var seen [2][per + 1]bool
		for range n {
			st, err := grp.Wait(ctx)
			p, ok := st.Context.(posted)
			if !ok {
				return fmt.Errorf("wait: %v (context %v)", err, st.Context)
			}
			if seen[p.ep][p.i] {
				return fmt.Errorf("endpoint %d request %d completed twice", p.ep, p.i)
			}
			seen[p.ep][p.i] = true
			if err := check(p, st); err != nil {
				return err
			}
		}
		return nil
	}
	sent := make(chan error, 1)
	go func() {
		sent <- take(sgrp[0], 2*per, func(p posted, st msglayer.Status) error {
			if st.Code != msglayer.Success || st.Source != rx[p.ep].Addr() {
				return fmt.Errorf("send %d of endpoint %d: %v to %v", p.i, p.ep, st.Err(), st.Source)
			}
			return nil
		})
	}()
	if err := take(rgrp[1], 2*per, func(p posted, st msglayer.Status) error {
		if st.Code != msglayer.Success || st.Source != tx[p.ep].Addr() {
			return fmt.Errorf("receive %d of endpoint %d: %v from %v", p.i, p.ep, st.Err(), st.Source)
		}
		if !bytes.Equal(bufs[p.ep][p.i], message(p.ep*per+p.i, sizes[p.i%len(sizes)])) {
			return fmt.Errorf("endpoint %d message %d corrupted", p.ep, p.i)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := <-sent; err != nil {
		t.Fatal(err)
	}
	if st, ok := rgrp[0].Test(); ok {
		t.Fatalf("group has a completion left: %+v", st)
	}
	rx[1].Close()
	st, err := rgrp[0].Wait(ctx)
	if p, _ := st.Context.(posted); p != (posted{1, per}) || !errors.Is(err, msglayer.ErrClosed) {
		t.Fatalf("after Close of endpoint 1: context %v, %v; want its last receive, closed", st.Context, err)
	}
}

func testConcurrentWaits(t *testing.T, w world) {
	a, b := w.pair(t, msglayer.Config{}, msglayer.Config{})
	ctx := ctxFor(t, 60*time.Second)
	const groups, per = 4, 50
	sizes := []int{8, 2000, 40000}
	var wg sync.WaitGroup
	errs := make(chan error, groups+2)
	// One goroutine per completion group.
	for g := 0; g < groups; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			grp := b.NewGroup()
			bufs := make([][]byte, per)
			for i := range bufs {
				bufs[i] = make([]byte, sizes[i%len(sizes)])
				if _, err := grp.Irecv(uint64(g)<<32|uint64(i), ^uint64(0), [][]byte{bufs[i]}, i); err != nil {
					errs <- err
					return
				}
			}
			for k := 0; k < per; k++ {
				st, err := grp.Wait(ctx)
				if err != nil {
					errs <- fmt.Errorf("group %d: %w", g, err)
					return
				}
				i := st.Context.(int)
				if st.Match != uint64(g)<<32|uint64(i) {
					errs <- fmt.Errorf("group %d got match %#x", g, st.Match)
					return
				}
				if !bytes.Equal(bufs[i], message(g*per+i, sizes[i%len(sizes)])) {
					errs <- fmt.Errorf("group %d message %d corrupted", g, i)
					return
				}
			}
		}()
	}
	// WaitAny on its own match range, and a goroutine waiting on each
	// request in turn.
	wg.Add(2)
	go func() {
		defer wg.Done()
		for i := 0; i < per; i++ {
			if _, err := b.Irecv(uint64(groups)<<32|uint64(i), ^uint64(0), [][]byte{make([]byte, 64)}, nil); err != nil {
				errs <- err
				return
			}
		}
		for i := 0; i < per; i++ {
			st, err := b.WaitAny(ctx, uint64(groups)<<32, 0xffffffff<<32)
			if err != nil || st.Match>>32 != groups {
				errs <- fmt.Errorf("wait any: %+v, %v", st, err)
				return
			}
		}
	}()
	go func() {
		defer wg.Done()
		for i := 0; i < per; i++ {
			r, err := b.Irecv(uint64(groups+1)<<32|uint64(i), ^uint64(0), [][]byte{make([]byte, 64)}, nil)
			if err != nil {
				errs <- err
				return
			}
			if _, err := b.Wait(ctx, r); err != nil {
				errs <- fmt.Errorf("wait one: %w", err)
				return
			}
		}
	}()
	// Senders: the groups' messages, then the others.
	for g := 0; g < groups; g++ {
		for i := 0; i < per; i++ {
			s, err := a.Isend(b.Addr(), uint64(g)<<32|uint64(i), [][]byte{message(g*per+i, sizes[i%len(sizes)])}, nil)
			if err != nil {
				t.Fatal(err)
			}
			a.Forget(s)
		}
	}
	for g := groups; g < groups+2; g++ {
		for i := 0; i < per; i++ {
			s, _ := a.Isend(b.Addr(), uint64(g)<<32|uint64(i), [][]byte{message(i, 64)}, nil)
			a.Forget(s)
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

func testWrongKey(t *testing.T, w world) {
	a := w.open(t, 0, msglayer.Config{EndpointID: 1, Key: 1})
	b := w.open(t, 1, msglayer.Config{EndpointID: 2, Key: 2})
	ctx := ctxFor(t, 10*time.Second)
	if err := a.Connect(ctx, b.Addr(), 3); !errors.Is(err, msglayer.ErrBadKey) {
		t.Fatalf("connect with a wrong key = %v, want ErrBadKey", err)
	}
	missing := b.Addr()
	missing.EP = 9
	if err := a.Connect(ctx, missing, 2); !errors.Is(err, msglayer.ErrBadEndpoint) {
		t.Fatalf("connect to a missing endpoint = %v, want ErrBadEndpoint", err)
	}
	if _, err := a.Isend(b.Addr(), 0, nil, nil); !errors.Is(err, msglayer.ErrNotConnected) {
		t.Fatalf("send without connect = %v, want ErrNotConnected", err)
	}
}

func testPeerRestart(t *testing.T, w world) {
	a, b := w.pair(t, msglayer.Config{}, msglayer.Config{})
	ctx := ctxFor(t, 30*time.Second)
	exchange := func(a, b *msglayer.Endpoint, seq int) {
		t.Helper()
		buf := make([]byte, 3000)
		r, _ := b.Irecv(uint64(seq), ^uint64(0), [][]byte{buf}, nil)
		s, err := a.Isend(b.Addr(), uint64(seq), [][]byte{message(seq, 3000)}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := b.Wait(ctx, r); err != nil {
			t.Fatal(err)
		}
		if _, err := a.Wait(ctx, s); err != nil {
			t.Fatal(err)
		}
		checkMessage(t, buf, seq, 3000)
	}
	for i := 0; i < 5; i++ {
		exchange(a, b, i)
		exchange(b, a, i)
	}
	// b restarts: a new endpoint with the same id and a new session. Its
	// connect tells a, which resets its sequence state for b.
	b.Close()
	b2 := w.open(t, 1, msglayer.Config{EndpointID: 2, Key: 0xb})
	if err := b2.Connect(ctx, a.Addr(), 0xa); err != nil {
		t.Fatal(err)
	}
	for i := 10; i < 15; i++ {
		exchange(b2, a, i)
		exchange(a, b2, i)
	}
}

func testSelf(t *testing.T, w world) {
	a := w.open(t, 0, msglayer.Config{EndpointID: 1, Key: 1})
	c := w.open(t, 0, msglayer.Config{EndpointID: 3, Key: 3})
	ctx := ctxFor(t, 10*time.Second)
	if err := a.Connect(ctx, a.Addr(), 1); err != nil {
		t.Fatal(err)
	}
	if err := a.Connect(ctx, c.Addr(), 3); err != nil {
		t.Fatal(err)
	}
	before := a.LinkStats().TxFrames
	for i, n := range []int{0, 100, 5000, 100000} {
		for _, dst := range []*msglayer.Endpoint{a, c} {
			buf := make([]byte, n)
			// Half posted before, half after the send.
			var r msglayer.Request
			if i%2 == 0 {
				r, _ = dst.Irecv(uint64(n), ^uint64(0), [][]byte{buf}, nil)
			}
			s, err := a.Isend(dst.Addr(), uint64(n), [][]byte{message(i, n)}, nil)
			if err != nil {
				t.Fatal(err)
			}
			if i%2 == 1 {
				r, _ = dst.Irecv(uint64(n), ^uint64(0), [][]byte{buf}, nil)
			}
			st, err := dst.Wait(ctx, r)
			if err != nil || st.Source != a.Addr() {
				t.Fatalf("same-process message of %d bytes: %+v, %v", n, st, err)
			}
			if _, err := a.Wait(ctx, s); err != nil {
				t.Fatal(err)
			}
			checkMessage(t, buf, i, n)
		}
	}
	if after := a.LinkStats().TxFrames; after != before {
		t.Errorf("same-process messages sent %d frames on the link", after-before)
	}
}

func testPeerDeath(t *testing.T, w world) {
	if w.oneLink {
		t.Skip("endpoints of one process: none can be cut off")
	}
	cfg := msglayer.Config{GiveUp: 500 * time.Millisecond, KeepaliveInterval: 50 * time.Millisecond}
	a, b := w.pair(t, cfg, cfg)
	ctx := ctxFor(t, 20*time.Second)
	// An eager send in flight, a synchronous send waiting for a receive,
	// a large send waiting to be pulled.
	s1, _ := a.Isend(b.Addr(), 1, [][]byte{message(1, 100)}, nil)
	s2, _ := a.Issend(b.Addr(), 2, [][]byte{message(2, 100)}, nil)
	s3, _ := a.Isend(b.Addr(), 3, [][]byte{message(3, 1<<20)}, nil)
	if _, err := a.Wait(ctx, s1); err != nil {
		t.Fatal(err)
	}
	// And the other way, a large message whose data stays at the peer
	// that dies: its record arrives first.
	b.Isend(a.Addr(), 5, [][]byte{message(5, 1<<20)}, nil)
	if _, err := a.Probe(ctx, 5, ^uint64(0)); err != nil {
		t.Fatal(err)
	}
	w.cut(t, 1)
	start := time.Now()
	// The receive matches the record at once, long before the peer can
	// be found dead, which drops the record: a receive posted after that
	// would wait for another message (a receive names no peer). The send
	// comes after it: over a link without carrier, its flush may wait for
	// the transmit up to the link's SendWait.
	r5, _ := a.Irecv(5, ^uint64(0), [][]byte{make([]byte, 1<<20)}, nil)
	s4, _ := a.Isend(b.Addr(), 4, [][]byte{message(4, 100)}, nil)
	for i, s := range []msglayer.Request{s2, s3, s4, r5} {
		st, err := a.Wait(ctx, s)
		if !errors.Is(err, msglayer.ErrUnreachable) {
			t.Fatalf("request %d of 4 with a dead peer, after %v: %+v, %v; want ErrUnreachable", i+1, time.Since(start), st, err)
		}
	}
	if el := time.Since(start); el > 5*time.Second {
		t.Fatalf("dead peer detected after %v", el)
	}
	t.Logf("dead peer reported after %v", time.Since(start).Round(time.Millisecond))
	_ = b
}

// skipNoMultiBuffer skips a test whose AF_XDP link at a jumbo MTU the
// kernel refused (multi-buffer AF_XDP needs Linux 6.6): a limit of the
// machine, not a failure.
func skipNoMultiBuffer(t testing.TB, err error) {
	t.Helper()
	if errors.Is(err, xdp.ErrMultiBufferUnsupported) {
		t.Skipf("%v", err)
	}
}
