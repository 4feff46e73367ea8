package msglayer_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/xmx-stack/xmx/msglayer"
	"github.com/xmx-stack/xmx/xdp"
)

// TestResolve resolves host names on a three-host segment, as Open-MX's
// host query did.
func TestResolve(t *testing.T) {
	hub := xdp.NewHub(xdp.MemConfig{})
	var eps []*msglayer.Endpoint
	for i, name := range []string{"alpha", "beta", "gamma"} {
		l := hub.Attach()
		t.Cleanup(func() { l.Close() })
		eps = append(eps, openEP(t, msglayer.Config{Link: l, EndpointID: uint8(i), Hostname: name}))
	}
	ctx := ctxFor(t, 10*time.Second)
	a, err := eps[0].Resolve(ctx, "gamma", 2)
	if err != nil {
		t.Fatal(err)
	}
	if a != eps[2].Addr() {
		t.Fatalf("resolve gamma = %v, want %v", a, eps[2].Addr())
	}
	if a, err := eps[1].Resolve(ctx, "beta", 7); err != nil || a.MAC != eps[1].Addr().MAC || a.EP != 7 {
		t.Fatalf("resolve own name = %v, %v", a, err)
	}
	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	if _, err := eps[0].Resolve(short, "nobody", 0); !errors.Is(err, msglayer.ErrTimeout) {
		t.Fatalf("resolve of an unknown host = %v, want ErrTimeout", err)
	}
	if _, err := eps[0].Resolve(ctx, "", 0); err == nil {
		t.Fatal("resolve of an empty name succeeded")
	}
}

// TestCloseCompletesPending checks that Close completes every pending
// request with Closed: a receive, a synchronous send, and a connect to a
// silent peer. (The semantic suite's CancelForget cancels such a connect,
// over every link.)
func TestCloseCompletesPending(t *testing.T) {
	w := memWorld(t, xdp.MemConfig{})
	a, b := w.pair(t, msglayer.Config{}, msglayer.Config{})
	ctx := ctxFor(t, 10*time.Second)
	ghost := msglayer.Addr{MAC: [6]byte{2, 0, 0, 0, 0, 0x99}, EP: 1}
	// Pending: a receive, a synchronous send, a connect.
	rr, _ := a.Irecv(5, ^uint64(0), nil, nil)
	ss, _ := a.Issend(b.Addr(), 6, [][]byte{make([]byte, 10)}, nil)
	cr, _ := a.IConnect(ghost, 1, 0, nil)
	done := make(chan error, 3)
	for _, h := range []msglayer.Request{rr, ss, cr} {
		go func() {
			_, err := a.Wait(ctx, h)
			done <- err
		}()
	}
	time.Sleep(50 * time.Millisecond)
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		if err := <-done; !errors.Is(err, msglayer.ErrClosed) {
			t.Fatalf("pending request after Close: %v, want ErrClosed", err)
		}
	}
	if _, err := a.Isend(b.Addr(), 0, nil, nil); !errors.Is(err, msglayer.ErrClosed) {
		t.Fatalf("Isend after Close = %v", err)
	}
}

// TestGroupConnects: connects posted into a completion group complete
// there, with their match info and context, whatever their end: to a
// remote endpoint, to one of the same process, refused for a wrong key,
// cancelled; the endpoint's own queue sees none of them.
func TestGroupConnects(t *testing.T) {
	w := memWorld(t, xdp.MemConfig{})
	a, b := w.pair(t, msglayer.Config{}, msglayer.Config{})
	c := w.open(t, 0, msglayer.Config{EndpointID: 7, Key: 7}) // a's same-process peer
	ctx := ctxFor(t, 10*time.Second)
	grp := a.NewGroup()
	ghost := msglayer.Addr{MAC: [6]byte{2, 0, 0, 0, 0, 0x99}, EP: 1}
	want := map[string]msglayer.Code{"remote": msglayer.Success, "local": msglayer.Success, "bad key": msglayer.BadKey, "cancelled": msglayer.Cancelled}
	for i, tc := range []struct {
		name string
		to   msglayer.Addr
		key  uint32
	}{{"remote", b.Addr(), 0xb}, {"local", c.Addr(), 7}, {"bad key", b.Addr(), 99}, {"cancelled", ghost, 1}} {
		r, err := grp.IConnect(tc.to, tc.key, uint64(100+i), tc.name)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if tc.name == "cancelled" {
			if ok, err := a.Cancel(r); !ok || err != nil {
				t.Fatalf("cancel of a pending connect in a group = %v, %v", ok, err)
			}
		}
	}
	for range len(want) { // not range want: the loop deletes from it
		st, _ := grp.Wait(ctx)
		name, _ := st.Context.(string)
		code, ok := want[name]
		if !ok || st.Code != code || st.Match < 100 || st.Match > 103 {
			t.Fatalf("group completion %+v: want one of the connects, with its code", st)
		}
		delete(want, name)
	}
	if len(want) != 0 {
		t.Fatalf("connects that did not complete in the group: %v", want)
	}
	if _, ok := a.TestAny(0, 0); ok {
		t.Error("a connect posted into a group reached the endpoint's queue")
	}
	for _, to := range []*msglayer.Endpoint{b, c} {
		s, err := a.Isend(to.Addr(), 1, [][]byte{[]byte("hi")}, nil)
		if err != nil {
			t.Fatalf("send after the group's connect to %v: %v", to.Addr(), err)
		}
		if _, err := a.Wait(ctx, s); err != nil {
			t.Fatalf("send after the group's connect to %v: %v", to.Addr(), err)
		}
	}
}

// TestBadFrames sends malformed frames at an endpoint: they are counted
// and dropped, and the endpoint keeps working.
func TestBadFrames(t *testing.T) {
	hub := xdp.NewHub(xdp.MemConfig{})
	la, lb, raw := hub.Attach(), hub.Attach(), hub.Attach()
	t.Cleanup(func() { la.Close(); lb.Close(); raw.Close() })
	a := openEP(t, msglayer.Config{Link: la, EndpointID: 1, Key: 1})
	b := openEP(t, msglayer.Config{Link: lb, EndpointID: 2, Key: 2})
	ctx := ctxFor(t, 10*time.Second)
	if err := a.Connect(ctx, b.Addr(), 2); err != nil {
		t.Fatal(err)
	}
	frame := func(body ...byte) []byte {
		f := make([]byte, 14, 64)
		dst := b.Addr().MAC
		copy(f, dst[:])
		copy(f[6:], raw.HardwareAddr())
		f[12], f[13] = 0x88, 0xb5
		f = append(f, body...)
		for len(f) < 60 {
			f = append(f, 0)
		}
		return f
	}
	bad := [][]byte{
		frame(),              // all zero: bad version
		frame(9, 1, 2, 1),    // unknown version
		frame(1, 0xee, 2, 1), // unknown type
		frame(1, 1, 2, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff), // impossible length
		frame(1, 1, 77, 1),                        // no such endpoint
		frame(1, 1, 2, 1, 1, 2, 3, 4, 5, 6, 7, 8), // eager frame of an unknown session
	}
	before := b.Counters()
	if _, err := raw.Send(bad); err != nil {
		t.Fatal(err)
	}
	// The endpoint still works.
	buf := make([]byte, 100)
	r, _ := b.Irecv(0, 0, [][]byte{buf}, nil)
	s, _ := a.Isend(b.Addr(), 1, [][]byte{message(1, 100)}, nil)
	if _, err := b.Wait(ctx, r); err != nil {
		t.Fatal(err)
	}
	a.Wait(ctx, s)
	if !bytes.Equal(buf, message(1, 100)) {
		t.Fatal("payload corrupted after bad frames")
	}
	after := b.Counters()
	if got := (after.BadFrames + after.StaleFrames) - (before.BadFrames + before.StaleFrames); got < uint64(len(bad)) {
		t.Fatalf("%d bad frames counted, want %d", got, len(bad))
	}
}

// TestArgErrors checks that invalid arguments name themselves.
func TestArgErrors(t *testing.T) {
	w := memWorld(t, xdp.MemConfig{})
	a, b := w.pair(t, msglayer.Config{}, msglayer.Config{})
	if _, err := a.Isend(b.Addr(), 0, make([][]byte, 257), nil); !errors.Is(err, msglayer.ErrTooManySegs) {
		t.Fatalf("257 segments: %v", err)
	}
	var ae *msglayer.ArgError
	if _, err := a.Irecv(3, 1, nil, nil); !errors.As(err, &ae) || !errors.Is(err, msglayer.ErrBadMatchMask) {
		t.Fatalf("bad mask: %v", err)
	}
	for _, w := range []int{1, 3, 100, 1 << 16} {
		if _, err := msglayer.Open(msglayer.Config{Window: w}); !errors.As(err, &ae) || ae.Arg != "Window" {
			t.Fatalf("Open with Window %d: %v, want an error naming Window", w, err)
		}
	}
	if _, err := msglayer.Open(msglayer.Config{Interface: "", Link: nil}); err == nil {
		t.Fatal("Open without interface or link succeeded")
	}
	if _, err := msglayer.ParseAddr("02:78:6d:00:00:01:300"); err == nil {
		t.Fatal("ParseAddr accepted endpoint 300")
	}
	if ad, err := msglayer.ParseAddr("02:78:6d:00:00:01:3"); err != nil || ad.EP != 3 || ad.String() != "02:78:6d:00:00:01:3" {
		t.Fatalf("ParseAddr = %v, %v", ad, err)
	}
}

// TestCancelWakesSleepingWait: a blocking-mode Wait asleep in the kernel
// returns promptly when its context is cancelled.
func TestCancelWakesSleepingWait(t *testing.T) {
	w := memWorld(t, xdp.MemConfig{})
	a, _ := w.pair(t, msglayer.Config{}, msglayer.Config{})
	r, _ := a.Irecv(1, ^uint64(0), nil, nil)
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		_, err := a.Wait(ctx, r)
		errc <- err
	}()
	time.Sleep(200 * time.Millisecond)
	start := time.Now()
	cancel()
	select {
	case err := <-errc:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("Wait = %v, want context.Canceled", err)
		}
		if el := time.Since(start); el > 100*time.Millisecond {
			t.Fatalf("cancel noticed after %v", el)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Wait still asleep 5 s after cancel")
	}
}

// dropLink drops the first transmission of the frames drop chooses.
type dropLink struct {
	xdp.Link
	mu      sync.Mutex
	drop    func(f []byte) (key uint32, ok bool)
	dropped map[uint32]bool
}

func (l *dropLink) Send(frames [][]byte) (int, error) {
	l.mu.Lock()
	kept := frames[:0:0]
	for _, f := range frames {
		if k, ok := l.drop(f); ok && !l.dropped[k] {
			l.dropped[k] = true
			continue
		}
		kept = append(kept, f)
	}
	l.mu.Unlock()
	if _, err := l.Link.Send(kept); err != nil {
		return 0, err
	}
	return len(frames), nil
}

// TestConvertedSendCompletesOnlyWhenAcked is the many-clients hang: an
// eager send the receiver refused is converted to a rendezvous and pulled,
// and the notify arrives while one of its frames (lost) is still unacked.
// The send must not be recycled while a window slot still names it: the
// next send, reusing it, would then never complete.
func TestConvertedSendCompletesOnlyWhenAcked(t *testing.T) {
	hub := xdp.NewHub(xdp.MemConfig{})
	la, lb := hub.Attach(), hub.Attach()
	t.Cleanup(func() { la.Close(); lb.Close() })
	const size = 16 << 10
	dl := &dropLink{Link: la, dropped: map[uint32]bool{}, drop: func(f []byte) (uint32, bool) {
		// The last fragment of message 1.
		seq, match, off, n, msgLen, ok := msglayer.EagerFrame(f)
		return seq, ok && match == 1 && off > 0 && off+n == msgLen
	}}
	slow := 200 * time.Millisecond // the lost frame is retransmitted late
	a := openEP(t, msglayer.Config{Link: dl, EndpointID: 1, Key: 1, BusyPoll: true, RendezvousThreshold: 64 << 10,
		InitialRTO: slow, MinRTO: slow})
	b := openEP(t, msglayer.Config{Link: lb, EndpointID: 2, Key: 2, BusyPoll: true, UnexpectedBytes: size + size/2})
	ctx := ctxFor(t, 10*time.Second)
	if err := a.Connect(ctx, b.Addr(), 2); err != nil {
		t.Fatal(err)
	}
	if err := b.Connect(ctx, a.Addr(), 1); err != nil {
		t.Fatal(err)
	}
	send := func(i, n int) msglayer.Request {
		t.Helper()
		r, err := a.Isend(b.Addr(), uint64(i), [][]byte{message(i, n)}, nil)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	// Message 0 fills the receiver's unexpected memory; message 1 is refused.
	if _, err := a.Wait(ctx, send(0, size)); err != nil {
		t.Fatal(err)
	}
	r1 := send(1, size)
	for a.Counters().EagerConverted == 0 {
		if ctx.Err() != nil {
			t.Fatalf("message 1 was never converted\nsender %+v\nreceiver %+v", a.Counters(), b.Counters())
		}
		a.TestAny(0, 0)
		b.Iprobe(0, 0)
	}
	for i := 0; i < 2; i++ {
		buf := make([]byte, size)
		r, _ := b.Irecv(uint64(i), ^uint64(0), [][]byte{buf}, nil)
		if _, err := b.Wait(ctx, r); err != nil {
			t.Fatalf("receive %d: %v", i, err)
		}
		checkMessage(t, buf, i, size)
	}
	if _, err := a.Wait(ctx, r1); err != nil {
		t.Fatalf("converted send: %v", err)
	}
	// The next sends reuse message 1's request.
	for i := 2; i < 6; i++ {
		r := send(i, 100)
		buf := make([]byte, 100)
		rr, _ := b.Irecv(uint64(i), ^uint64(0), [][]byte{buf}, nil)
		if _, err := b.Wait(ctx, rr); err != nil {
			t.Fatalf("receive %d: %v", i, err)
		}
		if _, err := a.Wait(ctx, r); err != nil {
			t.Fatalf("send %d after a converted send: %v\n%s", i, err, a.DebugPeer(b.Addr()))
		}
	}
}

// TestMemoryPerPeer checks that an engine's memory follows the frames in
// flight, not its peers times their windows: clients that each sent many
// window's worth of frames hold almost nothing once acked (beyond the
// engine's bounded list of free frame buffers).
func TestMemoryPerPeer(t *testing.T) {
	hub := xdp.NewHub(xdp.MemConfig{})
	ls := hub.Attach()
	t.Cleanup(func() { ls.Close() })
	srv := openEP(t, msglayer.Config{Link: ls, EndpointID: 0, Key: 1})
	const clients, msgs, size = 64, 600, 1000 // 600 frames: the 256-frame window wraps twice
	ctx := ctxFor(t, 60*time.Second)
	var before, after runtime.MemStats
	var eps []*msglayer.Endpoint
	lc := hub.Attach() // the clients share one engine, as in one process
	t.Cleanup(func() { lc.Close() })
	for i := 0; i < clients; i++ {
		e := openEP(t, msglayer.Config{Link: lc, EndpointID: uint8(1 + i), Key: 1})
		if err := e.Connect(ctx, srv.Addr(), 1); err != nil {
			t.Fatal(err)
		}
		eps = append(eps, e)
	}
	runtime.GC()
	runtime.ReadMemStats(&before)
	buf := make([]byte, size)
	for _, e := range eps {
		var last msglayer.Request
		for j := 0; j < msgs; j++ {
			r, err := srv.Irecv(0, 0, [][]byte{buf}, nil)
			if err != nil {
				t.Fatal(err)
			}
			s, err := e.Isend(srv.Addr(), 1, [][]byte{message(j, size)}, nil)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := srv.Wait(ctx, r); err != nil {
				t.Fatal(err)
			}
			if j < msgs-1 {
				e.Forget(s)
			} else {
				last = s
			}
		}
		if _, err := e.Wait(ctx, last); err != nil {
			t.Fatal(err)
		}
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	growth := int64(after.HeapAlloc) - int64(before.HeapAlloc)
	per := growth / clients
	t.Logf("heap grew %d KiB for %d peers that each sent %d frames: %d KiB per peer", growth>>10, clients, msgs, per>>10)
	// Each client costs a peer record on both sides (about 35 KiB each:
	// window and out-of-order slots); the two engines' free lists are
	// bounded (maxFreeFrames). Holding every slot's frame buffer would
	// cost 2 x 256 x 1514 bytes more per client.
	if per > 200<<10 {
		t.Errorf("%d KiB of heap per client after its frames were acked; want < 200 KiB (frame buffers must go back to the engine)", per>>10)
	}
}

// TestContextIDs checks MX context ids: a receive must name its context,
// messages of one context never match receives of another, order holds
// within each, and a probe that wildcards the context finds the oldest.
func TestContextIDs(t *testing.T) {
	w := memWorld(t, xdp.MemConfig{})
	cfg := msglayer.Config{ContextIDBits: 4, ContextIDShift: 60}
	a, b := w.pair(t, cfg, cfg)
	ctx := ctxFor(t, 10*time.Second)
	const ctxA, ctxB = uint64(1) << 60, uint64(2) << 60
	if _, err := b.Irecv(0, 0xff, nil, nil); !errors.Is(err, msglayer.ErrBadMatchMask) {
		t.Fatalf("a receive wildcarding the context bits = %v, want ErrBadMatchMask", err)
	}
	if _, err := msglayer.Open(msglayer.Config{Link: xdp.NewHub(xdp.MemConfig{}).Attach(), ContextIDBits: 9}); err == nil {
		t.Fatal("9 context id bits accepted")
	}
	send := func(m uint64, n int) {
		s, err := a.Isend(b.Addr(), m, [][]byte{message(int(m&0xff), n)}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := a.Wait(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	// Unexpected: two in context B, then one in context A.
	send(ctxB|1, 100)
	big, err := a.Isend(b.Addr(), ctxB|2, [][]byte{message(2, 50000)}, nil) // rendezvous: completes once pulled
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, ok := b.Iprobe(ctxB|2, ^uint64(0)); ok {
			break
		}
		if ctx.Err() != nil {
			t.Fatal("the rendezvous record never arrived")
		}
		time.Sleep(time.Millisecond)
	}
	send(ctxA|3, 100)
	if st, ok := b.Iprobe(0, 0); !ok || st.Match != ctxB|1 {
		t.Fatalf("wildcard probe = %#x, %v; want the oldest, %#x", st.Match, ok, ctxB|1)
	}
	if st, ok := b.Iprobe(ctxA, 0xf<<60); !ok || st.Match != ctxA|3 {
		t.Fatalf("probe of context A = %#x, %v", st.Match, ok)
	}
	// A receive of context A takes A's message although B's are older.
	recv := func(info, mask uint64, n int) msglayer.Status {
		buf := make([]byte, n)
		r, err := b.Irecv(info, mask, [][]byte{buf}, nil)
		if err != nil {
			t.Fatal(err)
		}
		st, err := b.Wait(ctx, r)
		if err != nil {
			t.Fatal(err)
		}
		checkMessage(t, buf[:st.XferLen], int(st.Match&0xff), st.MsgLen)
		return st
	}
	if st := recv(ctxA, 0xf<<60, 100); st.Match != ctxA|3 {
		t.Fatalf("context A receive got %#x", st.Match)
	}
	if st := recv(ctxB, 0xf<<60, 50000); st.Match != ctxB|1 || st.MsgLen != 100 {
		t.Fatalf("context B receive got %#x (%d bytes), want the oldest of B", st.Match, st.MsgLen)
	}
	if st := recv(ctxB, 0xf<<60, 50000); st.Match != ctxB|2 || st.MsgLen != 50000 {
		t.Fatalf("context B receive got %#x (%d bytes)", st.Match, st.MsgLen)
	}
	if _, err := a.Wait(ctx, big); err != nil {
		t.Fatal(err)
	}
	// Posted first: an arriving message only looks at its context's receives.
	bufB := make([]byte, 10)
	rb, _ := b.Irecv(ctxB, 0xf<<60, [][]byte{bufB}, nil)
	send(ctxA|4, 10)
	if _, ok, _ := b.Test(rb); ok {
		t.Fatal("a message of context A completed a receive of context B")
	}
	if st := recv(ctxA, 0xf<<60, 10); st.Match != ctxA|4 {
		t.Fatalf("got %#x", st.Match)
	}
	send(ctxB|5, 10)
	if st, err := b.Wait(ctx, rb); err != nil || st.Match != ctxB|5 {
		t.Fatalf("context B receive = %#x, %v", st.Match, err)
	}
}

// TestPeersAndAddrText checks Endpoint.Peers and the text form of Addr.
func TestPeersAndAddrText(t *testing.T) {
	w := memWorld(t, xdp.MemConfig{})
	a, b := w.pair(t, msglayer.Config{}, msglayer.Config{})
	ctx := ctxFor(t, 10*time.Second)
	s, _ := a.Isend(b.Addr(), 1, [][]byte{make([]byte, 100)}, nil)
	r, _ := b.Irecv(1, ^uint64(0), [][]byte{make([]byte, 100)}, nil)
	if _, err := b.Wait(ctx, r); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Wait(ctx, s); err != nil {
		t.Fatal(err)
	}
	ps := a.Peers()
	if len(ps) != 1 || ps[0].Addr != b.Addr() || !ps[0].Connected || ps[0].Dead || ps[0].MTU != 1500 ||
		ps[0].Window != 256 || ps[0].InFlight != 0 || ps[0].RTO <= 0 {
		t.Fatalf("Peers() = %+v", ps)
	}
	txt, err := b.Addr().MarshalText()
	if err != nil {
		t.Fatal(err)
	}
	var back msglayer.Addr
	if err := back.UnmarshalText(txt); err != nil || back != b.Addr() || string(txt) != b.Addr().String() {
		t.Fatalf("Addr text %q → %v, %v", txt, back, err)
	}
	if err := back.UnmarshalText([]byte("nonsense")); err == nil {
		t.Fatal("UnmarshalText accepted nonsense")
	}
}

// TestSpinBeforeSleep checks blocking mode with a poll before sleeping:
// messages flow, a wait still sleeps (and is cancelled) past the spin, and
// a bad duration names itself.
func TestSpinBeforeSleep(t *testing.T) {
	w := memWorld(t, xdp.MemConfig{})
	cfg := msglayer.Config{SpinBeforeSleep: 50 * time.Microsecond}
	a, b := w.pair(t, cfg, cfg)
	ctx := ctxFor(t, 10*time.Second)
	buf := make([]byte, 64)
	for i := 0; i < 200; i++ {
		r, _ := b.Irecv(0, 0, [][]byte{buf}, nil)
		s, err := a.Isend(b.Addr(), uint64(i), [][]byte{message(i, 64)}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if st, err := b.Wait(ctx, r); err != nil || st.Match != uint64(i) {
			t.Fatalf("message %d: %v, %v", i, st.Match, err)
		}
		if _, err := a.Wait(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	r, _ := b.Irecv(0, 0, [][]byte{buf}, nil)
	short, cancel := context.WithTimeout(ctx, 30*time.Millisecond)
	defer cancel()
	if _, err := b.Wait(short, r); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("wait for nothing = %v, want the deadline", err)
	}
	var ae *msglayer.ArgError
	if _, err := msglayer.Open(msglayer.Config{Link: xdp.NewHub(xdp.MemConfig{}).Attach(), SpinBeforeSleep: -2}); !errors.As(err, &ae) || ae.Arg != "SpinBeforeSleep" {
		t.Fatalf("SpinBeforeSleep -2ns: %v", err)
	}
}

// TestSpinYields checks that a driver polling before it sleeps gives up
// its CPU every few polls once it has polled for a while (the process it
// waits for may be queued on that CPU), and that a busy-polling one never
// does.
func TestSpinYields(t *testing.T) {
	w := memWorld(t, xdp.MemConfig{})
	a, b := w.pair(t, msglayer.Config{SpinBeforeSleep: time.Second}, msglayer.Config{BusyPoll: true})
	var ya, yb atomic.Int64
	// The polls' clock moves a microsecond per reading: a polls until
	// the message comes, past the time it starts yielding.
	var now atomic.Int64
	a.SetSpinClock(func() int64 { return now.Add(int64(time.Microsecond)) })
	a.SetYield(func() { ya.Add(1) })
	b.SetYield(func() { yb.Add(1) })
	ctx := ctxFor(t, 10*time.Second)
	bufA, bufB := make([]byte, 64), make([]byte, 64)
	// Message 0 comes at once, the others 5 ms late. A late message is
	// one a polls for, unless a loaded machine kept a from its wait until
	// the message came: up to five of them, until a yields.
	for i := 0; i < 6 && ya.Load() == 0; i++ {
		late := 5 * time.Millisecond
		if i == 0 {
			late = 0
		}
		ra, _ := a.Irecv(0, 0, [][]byte{bufA}, nil)
		rb, _ := b.Irecv(0, 0, [][]byte{bufB}, nil)
		go func() {
			time.Sleep(late)
			if _, err := b.Isend(a.Addr(), uint64(i), [][]byte{message(i, 64)}, nil); err != nil {
				t.Error(err)
			}
			if _, err := a.Isend(b.Addr(), uint64(i), [][]byte{message(i, 64)}, nil); err != nil {
				t.Error(err)
			}
		}()
		if st, err := a.Wait(ctx, ra); err != nil || st.Match != uint64(i) {
			t.Fatalf("message %d at a: %v, %v", i, st.Match, err)
		}
		if st, err := b.Wait(ctx, rb); err != nil || st.Match != uint64(i) {
			t.Fatalf("message %d at b: %v, %v", i, st.Match, err)
		}
	}
	if ya.Load() == 0 {
		t.Error("a polled for 5 ms before each of five messages came and never yielded")
	}
	if n := yb.Load(); n != 0 {
		t.Errorf("b, busy-polling, yielded %d times", n)
	}
}

// TestSleepingDriverReschedules checks that a driver sleeping in the
// kernel turn after turn passes through Go's scheduler after a
// millisecond or more of sleeps, and not more often, while the process
// has fewer engines than Ps; and never with as many engines as Ps. Each
// run: 200 quick messages and 3 that come 3 ms late, each waited for
// asleep.
func TestSleepingDriverReschedules(t *testing.T) {
	w := memWorld(t, xdp.MemConfig{})
	a, b := w.pair(t, msglayer.Config{SpinBeforeSleep: msglayer.NoSpin}, msglayer.Config{})
	var n atomic.Int64
	a.SetResched(func() { n.Add(1) })
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(0))
	ctx := ctxFor(t, 10*time.Second)
	buf := make([]byte, 8)
	// The first late gap may begin within reschedEvery of a pass made
	// during the quick messages, and then has none of its own; each later
	// gap begins more than 3 ms after the pass of the gap before.
	const quick, late = 200, 4
	run := func() (int64, time.Duration) {
		n.Store(0)
		start := time.Now()
		for i := range quick + late {
			r, err := a.Irecv(0, 0, [][]byte{buf}, nil)
			if err != nil {
				t.Fatal(err)
			}
			go func() {
				if i >= quick {
					time.Sleep(3 * time.Millisecond)
				}
				if s, err := b.Isend(a.Addr(), uint64(i), [][]byte{message(i, 8)}, nil); err != nil {
					t.Error(err)
				} else {
					b.Forget(s)
				}
			}()
			if st, err := a.Wait(ctx, r); err != nil || st.Match != uint64(i) {
				t.Fatalf("message %d: %v, %v", i, st.Match, err)
			}
		}
		return n.Load(), time.Since(start)
	}

	runtime.GOMAXPROCS(msglayer.LiveEngines() + 1)
	got, elapsed := run()
	if got < late-1 {
		t.Errorf("a slept through %d gaps of 3 ms and passed through the scheduler %d times", late, got)
	}
	if most := int64(elapsed/time.Millisecond) + 2; got > most {
		t.Errorf("%d passes through the scheduler in %v: more than one a millisecond", got, elapsed)
	}

	runtime.GOMAXPROCS(msglayer.LiveEngines())
	if got, _ := run(); got != 0 {
		t.Errorf("with as many engines as Ps, a passed through the scheduler %d times", got)
	}
}

// TestNextSpin checks the adaptive poll's steps: it doubles from
// MinAutoSpin up to MaxAutoSpin while sleeps end within AutoSpinWindow of
// the last activity, and halves, to nothing below MinAutoSpin, after
// longer ones.
func TestNextSpin(t *testing.T) {
	short, long := msglayer.AutoSpinWindow, msglayer.AutoSpinWindow+1
	spin := time.Duration(0)
	var grew, shrank []time.Duration
	for range 5 {
		spin = msglayer.NextSpin(spin, short)
		grew = append(grew, spin)
	}
	for range 4 {
		spin = msglayer.NextSpin(spin, long)
		shrank = append(shrank, spin)
	}
	us := time.Microsecond
	if want := []time.Duration{10 * us, 20 * us, 40 * us, 50 * us, 50 * us}; !slices.Equal(grew, want) {
		t.Errorf("after short sleeps: %v, want %v", grew, want)
	}
	if want := []time.Duration{25 * us, 12500 * time.Nanosecond, 0, 0}; !slices.Equal(shrank, want) {
		t.Errorf("after long sleeps: %v, want %v", shrank, want)
	}
	if msglayer.MinAutoSpin != 10*us || msglayer.MaxAutoSpin != 50*us {
		t.Errorf("bounds %v..%v changed: update the steps above", msglayer.MinAutoSpin, msglayer.MaxAutoSpin)
	}
}

// TestAutoSpin checks the default blocking mode: a sleep that frames end
// at once makes the engine poll before sleeping, and one they end only
// after a long idle time makes it poll less; NoSpin never polls. The
// polls' clock is the test's: it stands still but when the test moves it,
// so a load on the machine cannot change what the engine sees.
func TestAutoSpin(t *testing.T) {
	w := memWorld(t, xdp.MemConfig{})
	a, b := w.pair(t, msglayer.Config{}, msglayer.Config{SpinBeforeSleep: msglayer.NoSpin})
	var now atomic.Int64
	a.SetSpinClock(now.Load)
	// a's first sleep lasts no time on that clock: it polls from then on,
	// and, with the clock still, each poll lasts until the answer.
	pingPong(t, a, b, 8, 50, nil)
	grown := a.SpinNow()
	if grown < msglayer.MinAutoSpin || b.SpinNow() != 0 {
		t.Fatalf("after a ping-pong: polls %v (adaptive) and %v (NoSpin); want at least %v and none", grown, b.SpinNow(), msglayer.MinAutoSpin)
	}
	ctx := ctxFor(t, 10*time.Second)
	buf := make([]byte, 64)
	// A few tries: the engine's background goroutine, rather than the
	// Wait, may now and then hold the link when the message comes.
	for try := 0; try < 5 && a.SpinNow() >= grown; try++ {
		r, err := a.Irecv(0, 0, [][]byte{buf}, nil)
		if err != nil {
			t.Fatal(err)
		}
		go func() {
			// Once a polls (its clock still), 20 ms pass on that clock:
			// the poll ends and a sleeps; frames wake it only after that
			// idle time.
			time.Sleep(5 * time.Millisecond)
			now.Add(int64(20 * time.Millisecond))
			time.Sleep(20 * time.Millisecond)
			s, err := b.Isend(a.Addr(), 1, [][]byte{message(1, 64)}, nil)
			if err == nil {
				b.Forget(s)
			}
		}()
		if _, err := a.Wait(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	if got := a.SpinNow(); got >= grown {
		t.Errorf("after waits of 20 ms idle: polls %v, want less than %v", got, grown)
	}
}

// TestWaitAnyNoLostWakeup: a completion that lands between WaitAny's look
// at the done queue and its wait must end the wait. It used to be counted
// in the completions WaitAny had seen and signal nobody; with the
// dispatcher pattern (one goroutine in WaitAny, another posting receives
// that complete at once) both goroutines then waited for each other
// (BenchmarkNotify/dispatcher-goroutine hung).
func TestWaitAnyNoLostWakeup(t *testing.T) {
	w := memWorld(t, xdp.MemConfig{})
	tx, rx := w.pair(t, msglayer.Config{}, msglayer.Config{})
	ctx := ctxFor(t, 10*time.Second)
	s, _ := tx.Isend(rx.Addr(), 5, [][]byte{make([]byte, 8)}, nil)
	if _, err := tx.Wait(ctx, s); err != nil { // arrived: queued as unexpected
		t.Fatal(err)
	}
	buf := [][]byte{make([]byte, 8)}
	msglayer.SetWaitAnyHook(func() {
		msglayer.SetWaitAnyHook(nil)
		rx.Irecv(5, ^uint64(0), buf, nil) // completes at once, from another goroutine
	})
	defer msglayer.SetWaitAnyHook(nil)
	done := make(chan error, 1)
	go func() {
		_, err := rx.WaitAny(context.Background(), 0, 0)
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-ctx.Done():
		t.Fatal("WaitAny missed a completion that came right after it looked")
	}
}

// TestWaitAnyDispatcher runs the dispatcher pattern at length: one
// goroutine in WaitAny, another posting receives that complete at once.
func TestWaitAnyDispatcher(t *testing.T) {
	w := memWorld(t, xdp.MemConfig{QueueLen: 1 << 16})
	tx, rx := w.pair(t, msglayer.Config{}, msglayer.Config{UnexpectedBytes: 1 << 30})
	// Bounds the sends of the set-up, which take 10–30 s under -race on
	// a 2-CPU machine (more when it is busy); a lost wake-up is caught
	// per wait below.
	ctx := ctxFor(t, 5*time.Minute)
	const n, depth = 200000, 32
	msg := [][]byte{make([]byte, 8)}
	grp := tx.NewGroup()
	for i := 0; i < n+depth; i++ {
		if _, err := grp.Isend(rx.Addr(), 0, msg, nil); err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; i < n+depth; i++ {
		if _, err := grp.Wait(ctx); err != nil {
			t.Fatal(err)
		}
	}
	buf := [][]byte{make([]byte, 8)}
	for i := 0; i < depth; i++ {
		rx.Irecv(0, 0, buf, nil)
	}
	ch := make(chan error, depth)
	go func() {
		for i := 0; i < n; i++ {
			// No deadline: a context that can end takes another path
			// through the wait.
			_, err := rx.WaitAny(context.Background(), 0, 0)
			ch <- err
			if err != nil {
				return
			}
		}
	}()
	// A lost wake-up stops the exchange: each WaitAny gets its own
	// bound, not the whole run (under -race on a busy 2-CPU machine,
	// 200000 of them take 30 s or more).
	stuck := time.NewTimer(stuckAfter)
	defer stuck.Stop()
	for i := 0; i < n; i++ {
		stuck.Reset(stuckAfter)
		select {
		case err := <-ch:
			if err != nil {
				t.Fatalf("WaitAny %d of %d: %v", i, n, err)
			}
		case <-stuck.C:
			t.Fatalf("WaitAny %d of %d did not return in %v: a lost wake-up leaves both goroutines waiting", i, n, stuckAfter)
		}
		rx.Irecv(0, 0, buf, nil)
	}
}

// stuckAfter is how long one wait of TestWaitAnyDispatcher may take
// before it counts as lost.
const stuckAfter = 10 * time.Second

// TestProbeWhileAnotherDrives: a Probe must learn of an unexpected arrival
// while another goroutine holds the link (waiting on a receive that never
// completes), not only when that goroutine lets go.
func TestProbeWhileAnotherDrives(t *testing.T) {
	w := memWorld(t, xdp.MemConfig{})
	a, b := w.pair(t, msglayer.Config{}, msglayer.Config{})
	ctx := ctxFor(t, 10*time.Second)
	// Another goroutine drives b, waiting for a message that never comes.
	never, _ := b.Irecv(99, ^uint64(0), nil, nil)
	waitCtx, stopWait := context.WithCancel(ctx)
	defer stopWait()
	go b.Wait(waitCtx, never)
	time.Sleep(20 * time.Millisecond) // let it take the link
	probed := make(chan error, 1)
	go func() {
		st, err := b.Probe(ctx, 7, ^uint64(0))
		if err == nil && st.Match != 7 {
			err = fmt.Errorf("probed match %d", st.Match)
		}
		probed <- err
	}()
	time.Sleep(20 * time.Millisecond)
	s, err := a.Isend(b.Addr(), 7, [][]byte{make([]byte, 10)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Forget(s)
	select {
	case err := <-probed:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("Probe did not see the message while another goroutine drove the link")
	}
}

// TestCloseSendsOwedAcks: an endpoint that took a message and closes
// before its delayed ack was due acks it on Close, so the sender's send
// completes instead of retransmitting into a closed endpoint until it
// gives up (a client saying goodbye to a server that exits on it).
func TestCloseSendsOwedAcks(t *testing.T) {
	w := memWorld(t, xdp.MemConfig{})
	a, b := w.pair(t, msglayer.Config{}, msglayer.Config{AckDelay: time.Hour, AckEvery: 64})
	ctx := ctxFor(t, 10*time.Second)
	r, _ := b.Irecv(0, 0, nil, nil)
	s, err := a.Isend(b.Addr(), 1, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Wait(ctx, r); err != nil {
		t.Fatal(err)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if st, err := a.Wait(ctx, s); err != nil {
		t.Fatalf("send to an endpoint that took it and closed: %+v, %v", st, err)
	}
	if got := b.Counters().AcksOut; got == 0 {
		t.Fatal("Close sent no ack")
	}
}

// TestDelayedAckAfterWait: a receiver whose Wait a message completed, and
// which sends no answer to carry the ack, still acks it after AckDelay:
// from its next Wait, or, if it makes none, from its background
// goroutine. The sender's timeouts are far longer than the test, so its
// send completes by that ack alone, never by a retransmission.
func TestDelayedAckAfterWait(t *testing.T) {
	for _, busy := range []bool{true, false} {
		for _, again := range []bool{true, false} {
			t.Run(fmt.Sprintf("busy=%v,waits-again=%v", busy, again), func(t *testing.T) {
				w := memWorld(t, xdp.MemConfig{})
				slow := time.Minute
				a, b := w.pair(t, msglayer.Config{BusyPoll: busy, InitialRTO: slow, MinRTO: slow},
					msglayer.Config{BusyPoll: busy, AckDelay: time.Millisecond, AckEvery: 64})
				ctx := ctxFor(t, 10*time.Second)
				never, _ := b.Irecv(99, ^uint64(0), nil, nil) // a message that never comes
				defer b.Cancel(never)
				for i := range 10 {
					// b waits before the message leaves, so that its
					// arrival is what completes the Wait.
					r, _ := b.Irecv(uint64(i), ^uint64(0), nil, nil)
					got := make(chan error, 1)
					go func() { _, err := b.Wait(ctx, r); got <- err }()
					time.Sleep(time.Millisecond)
					s, err := a.Isend(b.Addr(), uint64(i), nil, nil)
					if err != nil {
						t.Fatal(err)
					}
					if err := <-got; err != nil {
						t.Fatal(err)
					}
					wctx, stop := context.WithCancel(ctx)
					if again {
						go b.Wait(wctx, never) // b drives on
					}
					st, err := a.Wait(ctx, s)
					stop()
					if err != nil {
						t.Fatalf("send %d: %+v, %v", i, st, err)
					}
				}
				if c := a.Counters(); c.Retransmits != 0 {
					t.Errorf("sender retransmitted %d frames: the acks came late", c.Retransmits)
				}
				if got := b.Counters().AcksOut; got < 10 {
					t.Errorf("receiver sent %d explicit acks, want one per message (10)", got)
				}
			})
		}
	}
}

// recordsWaiting opens a server on host 0 whose delayed acks wait ackDelay,
// and n clients on host 1 whose retransmission timeouts are rto, and has
// each client send a rendezvous message of size bytes (match info its
// index) to the server, which posts no receive.
func recordsWaiting(t *testing.T, ctx context.Context, w world, ackDelay, rto time.Duration, n, size int) (srv *msglayer.Endpoint, cls []*msglayer.Endpoint, sends []msglayer.Request) {
	t.Helper()
	srv = w.open(t, 0, msglayer.Config{EndpointID: 1, Key: 0xa, AckDelay: ackDelay})
	cls = make([]*msglayer.Endpoint, n)
	sends = make([]msglayer.Request, n)
	for i := range cls {
		cls[i] = w.open(t, 1, msglayer.Config{EndpointID: uint8(2 + i), Key: 0xb, InitialRTO: rto, MinRTO: rto})
		if err := cls[i].Connect(ctx, srv.Addr(), 0xa); err != nil {
			t.Fatal(err)
		}
	}
	for i, c := range cls {
		var err error
		if sends[i], err = c.Isend(srv.Addr(), uint64(i), [][]byte{message(i, size)}, nil); err != nil {
			t.Fatal(err)
		}
	}
	return srv, cls, sends
}

// recvWaiting receives client i's message of recordsWaiting at srv and
// checks it byte for byte.
func recvWaiting(t *testing.T, ctx context.Context, srv *msglayer.Endpoint, i, size int) {
	t.Helper()
	buf := make([]byte, size)
	r, err := srv.Irecv(uint64(i), ^uint64(0), [][]byte{buf}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := srv.Wait(ctx, r); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(buf, message(i, size)) {
		t.Fatalf("message from client %d corrupted", i)
	}
}

// TestAckBundles: a server that cannot take the rendezvous records of
// several endpoints of one client host yet (no receive posted) acks them
// lazily and in one frame, and every message still arrives intact.
func TestAckBundles(t *testing.T) {
	w := memWorld(t, xdp.MemConfig{})
	// The server's acks wait 100 ms, long enough for all three records
	// to arrive however slow the machine; the clients' timeouts are
	// longer still, so that no record is sent twice.
	const clients, size = 3, 64 << 10
	ctx := ctxFor(t, 10*time.Second)
	srv, cls, sends := recordsWaiting(t, ctx, w, 100*time.Millisecond, time.Second, clients, size)
	// Wait until the server sent the acks.
	deadline := time.Now().Add(2 * time.Second)
	for srv.Counters().AcksOut < clients && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	c := srv.Counters()
	if c.AcksOut != clients || c.AcksBundled != clients-1 {
		t.Fatalf("server acked %d records, %d of them bundled; want %d, %d", c.AcksOut, c.AcksBundled, clients, clients-1)
	}
	for i := range cls {
		recvWaiting(t, ctx, srv, i, size)
	}
	var acksIn, retrans uint64
	for i, cl := range cls {
		if _, err := cl.Wait(ctx, sends[i]); err != nil {
			t.Fatal(err)
		}
		cc := cl.Counters()
		acksIn += cc.AcksIn
		retrans += cc.Retransmits
	}
	if acksIn < clients || retrans != 0 {
		t.Fatalf("clients got %d acks and retransmitted %d frames; want %d or more, 0", acksIn, retrans, clients)
	}
}

// TestAcksRideWithPullRequests: the acks a server owes the endpoints of a
// client host whose records wait (no receive posted for them) ride in the
// pull request it sends to another endpoint of that host, and reach them
// long before the server would have sent them on their own.
func TestAcksRideWithPullRequests(t *testing.T) {
	w := memWorld(t, xdp.MemConfig{})
	// Alone, the server's acks would wait 30 s; the clients' timeouts
	// are longer still.
	const clients, size = 3, 64 << 10
	ctx := ctxFor(t, 20*time.Second)
	srv, cls, sends := recordsWaiting(t, ctx, w, 30*time.Second, time.Minute, clients, size)
	waitUntil := func(what string, ok func() bool) {
		t.Helper()
		for deadline := time.Now().Add(5 * time.Second); !ok(); time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s", what)
			}
		}
	}
	waitUntil("the records", func() bool { return srv.Counters().Unexpected == clients })
	if c := srv.Counters(); c.AcksOut != 0 {
		t.Fatalf("server sent %d acks before pulling, want 0 (they wait 30 s)", c.AcksOut)
	}
	recvWaiting(t, ctx, srv, 0, size) // the pull from client 0 carries the others' acks
	if c := srv.Counters(); c.AcksBundled != clients-1 {
		t.Fatalf("server: %d acks rode with other frames, want %d", c.AcksBundled, clients-1)
	}
	for i := 1; i < clients; i++ {
		waitUntil(fmt.Sprintf("client %d's ack", i), func() bool { return cls[i].Counters().AcksIn > 0 })
	}
	for i := 1; i < clients; i++ {
		recvWaiting(t, ctx, srv, i, size)
	}
	for i, cl := range cls {
		if _, err := cl.Wait(ctx, sends[i]); err != nil {
			t.Fatal(err)
		}
		if n := cl.Counters().Retransmits; n != 0 {
			t.Errorf("client %d retransmitted %d frames", i, n)
		}
	}
}

// TestIbufferedAndIPeek: an eager send's buffers may be reused as soon as
// it is framed, before the peer acknowledges it; a rendezvous send's only
// once the peer has pulled them. IPeek shows the oldest completed request
// without collecting it.
func TestIbufferedAndIPeek(t *testing.T) {
	la, lb := xdp.NewPair(xdp.MemConfig{})
	t.Cleanup(func() { la.Close(); lb.Close() })
	a := openEP(t, msglayer.Config{Link: la, EndpointID: 1})
	b := openEP(t, msglayer.Config{Link: lb, EndpointID: 2})
	ctx := ctxFor(t, 10*time.Second)
	if err := a.Connect(ctx, b.Addr(), 0); err != nil {
		t.Fatal(err)
	}
	if _, ok := b.IPeek(); ok {
		t.Fatal("IPeek found a completed request before any")
	}
	la.Partition(true) // nothing of a's reaches b: no ack, no pull
	small, large := message(1, 100), message(2, 64<<10)
	se, _ := a.Isend(b.Addr(), 1, [][]byte{small}, nil)
	sr, _ := a.Isend(b.Addr(), 2, [][]byte{large}, nil)
	if ok, err := a.Ibuffered(se); !ok || err != nil {
		t.Errorf("eager send: Ibuffered %v, %v; want true before its ack", ok, err)
	}
	if _, done, _ := a.Test(se); done {
		t.Error("eager send completed through a cut link")
	}
	if ok, err := a.Ibuffered(sr); ok || err != nil {
		t.Errorf("rendezvous send: Ibuffered %v, %v; want false before the pull", ok, err)
	}
	la.Partition(false)
	got := make([]byte, 100)
	r, _ := b.Irecv(1, ^uint64(0), [][]byte{got}, nil)
	for {
		if p, ok := b.IPeek(); ok {
			if p != r {
				t.Fatalf("IPeek returned %v, want the receive %v", p, r)
			}
			break
		}
		if ctx.Err() != nil {
			t.Fatal("the receive never completed")
		}
		time.Sleep(time.Millisecond)
	}
	if _, ok := b.IPeek(); !ok {
		t.Fatal("IPeek collected the request")
	}
	if st, err := b.Wait(ctx, r); err != nil || st.XferLen != 100 || !bytes.Equal(got, small) {
		t.Fatalf("the receive IPeek showed: %+v, %v", st, err)
	}
	if _, ok := b.IPeek(); ok {
		t.Fatal("IPeek found the collected request")
	}
	big := make([]byte, 64<<10)
	r2, _ := b.Irecv(2, ^uint64(0), [][]byte{big}, nil)
	for _, s := range []msglayer.Request{se, sr} {
		if _, err := a.Wait(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := b.Wait(ctx, r2); err != nil || !bytes.Equal(big, large) {
		t.Fatalf("the rendezvous: %v", err)
	}
}
