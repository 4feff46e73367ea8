package msglayer_test

import (
	"bytes"
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/xmx-stack/xmx/msglayer"
	"github.com/xmx-stack/xmx/xdp"
)

// The tests of this file hold the same-process path to what the network
// path does, where the two used to differ: the sender's XferLen, the
// unexpected-message handler's Data, the codes of sends to an endpoint
// that closed, and the counters.

// threeEPs opens a and b on the two links of an in-memory world, and c
// on a's link (a's same-process peer), with a connected to both; b and c
// have the handler h. It returns the world too, for more endpoints.
func threeEPs(t *testing.T, cfg msglayer.Config, h func(msglayer.UnexpectedMessage) msglayer.HandlerAction) (a, b, c *msglayer.Endpoint, w world) {
	t.Helper()
	w = memWorld(t, xdp.MemConfig{})
	on := func(host int, id uint8, h func(msglayer.UnexpectedMessage) msglayer.HandlerAction) *msglayer.Endpoint {
		c := cfg
		c.EndpointID, c.Key, c.UnexpectedHandler = id, uint32(id), h
		return w.open(t, host, c)
	}
	a, b, c = on(0, 1, nil), on(1, 2, h), on(0, 3, h)
	ctx := ctxFor(t, 10*time.Second)
	for _, p := range []*msglayer.Endpoint{b, c} {
		if err := a.Connect(ctx, p.Addr(), uint32(p.Addr().EP)); err != nil {
			t.Fatal(err)
		}
	}
	return a, b, c, w
}

// TestSendXferLen checks the sender's XferLen as Status documents it: a
// send that completes after its receive matched reports what was
// delivered, one that completes before (eager) its whole length, on
// both paths.
func TestSendXferLen(t *testing.T) {
	a, b, c, _ := threeEPs(t, msglayer.Config{}, nil)
	ctx := ctxFor(t, 10*time.Second)
	for _, tc := range []struct {
		dst      *msglayer.Endpoint
		n, xfer  int
		sync     bool
		pathName string
	}{
		{b, 1000, 1000, false, "network eager"},
		{b, 100000, 100, false, "network rendezvous"},
		{b, 1000, 100, true, "network issend"},
		{c, 1000, 100, false, "same-process, receive posted"},
		{c, 1000, 100, true, "same-process issend"},
	} {
		r, _ := tc.dst.Irecv(0, 0, [][]byte{make([]byte, 100)}, nil)
		send := a.Isend
		if tc.sync {
			send = a.Issend
		}
		s, err := send(tc.dst.Addr(), 9, [][]byte{make([]byte, tc.n)}, nil)
		if err != nil {
			t.Fatal(err)
		}
		rst, _ := tc.dst.Wait(ctx, r)
		sst, err := a.Wait(ctx, s)
		if err != nil || rst.Code != msglayer.Truncated || rst.XferLen != 100 {
			t.Fatalf("%s: receive %+v, send error %v", tc.pathName, rst, err)
		}
		if sst.XferLen != tc.xfer || sst.MsgLen != tc.n {
			t.Errorf("%s: send MsgLen %d XferLen %d, want %d and %d", tc.pathName, sst.MsgLen, sst.XferLen, tc.n, tc.xfer)
		}
	}
}

// TestHandlerSeesSamePaths checks that the unexpected-message handler
// gets the same Data, and the sender the same XferLen, whether the
// message came over the network or from an endpoint of the process.
func TestHandlerSeesSamePaths(t *testing.T) {
	var got []string
	h := func(m msglayer.UnexpectedMessage) msglayer.HandlerAction {
		if m.Data == nil {
			got = append(got, "<nil>")
		} else {
			got = append(got, string(m.Data))
		}
		return msglayer.Finished
	}
	a, b, c, _ := threeEPs(t, msglayer.Config{}, h)
	ctx := ctxFor(t, 10*time.Second)
	for _, dst := range []*msglayer.Endpoint{b, c} {
		// The handler runs on b's driver, or in a's Isend for c: one at
		// a time here, as each send is waited for.
		for _, sync := range []bool{false, true} {
			send := a.Isend
			if sync {
				send = a.Issend
			}
			s, err := send(dst.Addr(), 1, [][]byte{[]byte("hel"), nil, []byte("lo")}, nil)
			if err != nil {
				t.Fatal(err)
			}
			want := 5 // eager: taken whole
			if sync {
				want = 0 // rendezvous: its data never left
			}
			st, err := a.Wait(ctx, s)
			if err != nil || st.XferLen != want {
				t.Errorf("send to %v (issend %v) taken by the handler: %+v, %v", dst.Addr(), sync, st, err)
			}
		}
	}
	want := []string{"hello", "<nil>", "hello", "<nil>"}
	if len(got) != len(want) {
		t.Fatalf("handler saw %q, want %q", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("handler saw %q, want %q (network eager, network issend, same-process eager, same-process issend)", got, want)
			break
		}
	}
}

// TestHandlerSeesSamePathsAboveThreshold: a message in one frame's reach
// but above the sender's rendezvous threshold goes by rendezvous, and the
// handler sees no data, over the network and in the process alike (the
// same-process path used to show it the data, then tell the sender
// nothing was delivered).
func TestHandlerSeesSamePathsAboveThreshold(t *testing.T) {
	var got []bool
	h := func(m msglayer.UnexpectedMessage) msglayer.HandlerAction {
		got = append(got, m.Data != nil)
		return msglayer.Finished
	}
	a, b, c, _ := threeEPs(t, msglayer.Config{RendezvousThreshold: 1024}, h)
	ctx := ctxFor(t, 10*time.Second)
	for _, dst := range []*msglayer.Endpoint{b, c} {
		s, err := a.Isend(dst.Addr(), 1, [][]byte{make([]byte, 1200)}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := a.Wait(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	if len(got) != 2 || got[0] || got[1] {
		t.Errorf("the handler saw data (network, same process): %v; want none for a rendezvous", got)
	}
}

// TestHandlerGatheredDataQueues checks that a small multi-segment
// same-process message the handler lets queue arrives whole.
func TestHandlerGatheredDataQueues(t *testing.T) {
	seen := 0
	h := func(m msglayer.UnexpectedMessage) msglayer.HandlerAction {
		if string(m.Data) == "hello" {
			seen++
		}
		return msglayer.Continue
	}
	a, _, c, _ := threeEPs(t, msglayer.Config{}, h)
	ctx := ctxFor(t, 10*time.Second)
	s, _ := a.Isend(c.Addr(), 1, [][]byte{[]byte("hel"), []byte("lo")}, nil)
	if _, err := a.Wait(ctx, s); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 8)
	r, _ := c.Irecv(1, ^uint64(0), [][]byte{buf}, nil)
	st, err := c.Wait(ctx, r)
	if err != nil || st.XferLen != 5 || string(buf[:5]) != "hello" || seen != 1 {
		t.Fatalf("got %q, %+v, %v; handler saw the data %d times", buf[:st.XferLen], st, err, seen)
	}
}

// TestMatchPairRefused checks that the waits on (info, mask) refuse a
// pair that nothing fits, as Irecv does, instead of waiting for ever;
// the looks report nothing.
func TestMatchPairRefused(t *testing.T) {
	w := memWorld(t, xdp.MemConfig{})
	a, b := w.pair(t, msglayer.Config{}, msglayer.Config{})
	ctx := ctxFor(t, 10*time.Second)
	s, _ := a.Isend(b.Addr(), 0x11, [][]byte{make([]byte, 8)}, nil)
	if _, err := b.Probe(ctx, 0x11, ^uint64(0)); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Wait(ctx, s); err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := b.Probe(short, 0x11, 0x0f); !errors.Is(err, msglayer.ErrBadMatchMask) {
		t.Errorf("Probe(0x11, 0x0f): %v, want ErrBadMatchMask", err)
	}
	if _, err := a.WaitAny(short, 0x11, 0x0f); !errors.Is(err, msglayer.ErrBadMatchMask) {
		t.Errorf("WaitAny(0x11, 0x0f): %v, want ErrBadMatchMask", err)
	}
	var ae *msglayer.ArgError
	if _, err := a.WaitAny(short, 0x11, 0x0f); !errors.As(err, &ae) {
		t.Errorf("WaitAny(0x11, 0x0f): %v does not name the argument", err)
	}
	if _, ok := b.Iprobe(0x11, 0x0f); ok {
		t.Error("Iprobe(0x11, 0x0f) found a message")
	}
	if _, ok := a.TestAny(0x11, 0x0f); ok {
		t.Error("TestAny(0x11, 0x0f) found a request")
	}
}

// TestSendToClosedEndpoint checks that a send whose receiver closed
// completes BadEndpoint, at once, over the network (the receiver's
// engine, still up, nacks the keepalives of a send waiting on it) and in
// the same process alike, and not Closed, which would say the sender
// closed.
func TestSendToClosedEndpoint(t *testing.T) {
	cfg := msglayer.Config{GiveUp: 300 * time.Millisecond, KeepaliveInterval: 30 * time.Millisecond}
	a, b, c, w := threeEPs(t, cfg, nil)
	// Another endpoint keeps b's engine (and link) open.
	keep := cfg
	keep.EndpointID, keep.Key = 4, 4
	w.open(t, 1, keep)
	ctx := ctxFor(t, 10*time.Second)
	pending := map[string]msglayer.Request{}
	for name, dst := range map[string]*msglayer.Endpoint{"network": b, "same-process": c} {
		s, err := a.Issend(dst.Addr(), 1, [][]byte{make([]byte, 8)}, nil)
		if err != nil {
			t.Fatal(err)
		}
		pending[name] = s
	}
	time.Sleep(20 * time.Millisecond)
	b.Close()
	c.Close()
	for name, dst := range map[string]*msglayer.Endpoint{"network": b, "same-process": c} {
		start := time.Now()
		st, _ := a.Wait(ctx, pending[name])
		if st.Code != msglayer.BadEndpoint {
			t.Errorf("%s issend pending when its receiver closed: %v, want BadEndpoint", name, st.Code)
		}
		if el := time.Since(start); el >= cfg.GiveUp {
			t.Errorf("%s issend pending when its receiver closed took %v, the give-up's time", name, el)
		}
		s, err := a.Isend(dst.Addr(), 2, [][]byte{make([]byte, 8)}, nil)
		if err != nil {
			continue // the peer was forgotten at the give-up: refused at once
		}
		if st, _ := a.Wait(ctx, s); st.Code != msglayer.BadEndpoint {
			t.Errorf("%s isend after its receiver closed: %v, want BadEndpoint", name, st.Code)
		}
	}
}

// TestGroupWaitAfterClose checks that a group's Wait returns ErrClosed
// once its endpoints are closed and its completions taken, both for a
// goroutine already waiting and for a later call, while another endpoint
// keeps the engine alive.
func TestGroupWaitAfterClose(t *testing.T) {
	w := memWorld(t, xdp.MemConfig{})
	a, b := w.pair(t, msglayer.Config{}, msglayer.Config{})
	c := w.open(t, 0, msglayer.Config{EndpointID: 3, Key: 3})
	w.open(t, 0, msglayer.Config{EndpointID: 5, Key: 5}) // keeps the engine
	ctx := ctxFor(t, 10*time.Second)
	g := a.NewGroup()
	gc, err := g.On(c)
	if err != nil {
		t.Fatal(err)
	}
	r, _ := g.Irecv(1, ^uint64(0), [][]byte{make([]byte, 8)}, "posted")
	_ = r
	waited := make(chan error, 1)
	go func() {
		// The receive completes Closed at a's Close; the second Wait
		// waits on: c is still open.
		if st, err := g.Wait(ctx); st.Context != "posted" || !errors.Is(err, msglayer.ErrClosed) {
			waited <- errors.Join(errors.New("first wait"), err)
			return
		}
		_, err := gc.Wait(ctx)
		waited <- err
	}()
	time.Sleep(20 * time.Millisecond)
	a.Close()
	time.Sleep(20 * time.Millisecond)
	select {
	case err := <-waited:
		t.Fatalf("the group's wait ended with one of its endpoints open: %v", err)
	default:
	}
	c.Close()
	select {
	case err := <-waited:
		if !errors.Is(err, msglayer.ErrClosed) {
			t.Fatalf("waiting group, its endpoints closed: %v, want ErrClosed", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the group's wait did not end at the close of its endpoints")
	}
	if _, err := g.Wait(ctx); !errors.Is(err, msglayer.ErrClosed) {
		t.Fatalf("group wait after close: %v, want ErrClosed", err)
	}
	_ = b
}

// TestCompletedCountsUserRequests checks that Counters.Completed counts
// the user's requests only, not the notify a rendezvous receive sends.
func TestCompletedCountsUserRequests(t *testing.T) {
	a, b, c, _ := threeEPs(t, msglayer.Config{}, nil)
	ctx := ctxFor(t, 10*time.Second)
	for _, dst := range []*msglayer.Endpoint{b, c} {
		before := dst.Counters().Completed
		for _, n := range []int{100, 100000} {
			s, _ := a.Isend(dst.Addr(), 1, [][]byte{make([]byte, n)}, nil)
			r, _ := dst.Irecv(1, ^uint64(0), [][]byte{make([]byte, n)}, nil)
			if _, err := dst.Wait(ctx, r); err != nil {
				t.Fatal(err)
			}
			if _, err := a.Wait(ctx, s); err != nil {
				t.Fatal(err)
			}
		}
		// The notify's ack arrives after the send completes.
		time.Sleep(50 * time.Millisecond)
		if got := dst.Counters().Completed - before; got != 2 {
			t.Errorf("receiver %v: Completed +%d for two receives", dst.Addr(), got)
		}
	}
}

// TestLocalHandlerOneAtATime checks that the unexpected-message handler
// runs one call at a time when same-process senders send at once, each on
// a goroutine of its own, to an endpoint whose handler takes a while; and
// that each sender's messages keep their order.
func TestLocalHandlerOneAtATime(t *testing.T) {
	w := memWorld(t, xdp.MemConfig{})
	var in, most atomic.Int32
	var mu sync.Mutex
	last := map[msglayer.Addr]uint64{}
	var disorder []string
	h := func(m msglayer.UnexpectedMessage) msglayer.HandlerAction {
		n := in.Add(1)
		for o := most.Load(); n > o && !most.CompareAndSwap(o, n); o = most.Load() {
		}
		time.Sleep(5 * time.Millisecond)
		mu.Lock()
		if prev, ok := last[m.Source]; ok && m.Match != prev+1 {
			disorder = append(disorder, m.Source.String())
		}
		last[m.Source] = m.Match
		mu.Unlock()
		in.Add(-1)
		return msglayer.Finished
	}
	c := w.open(t, 0, msglayer.Config{EndpointID: 3, Key: 3, UnexpectedHandler: h})
	ctx := ctxFor(t, 20*time.Second)
	var wg sync.WaitGroup
	for i := range 4 {
		e := w.open(t, 0, msglayer.Config{EndpointID: uint8(10 + i), Key: 1})
		if err := e.Connect(ctx, c.Addr(), 3); err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			var reqs []msglayer.Request
			for m := range uint64(10) {
				s, err := e.Isend(c.Addr(), m, [][]byte{[]byte("x")}, nil)
				if err != nil {
					t.Error(err)
					return
				}
				reqs = append(reqs, s)
			}
			for _, s := range reqs {
				if st, err := e.Wait(ctx, s); err != nil || st.XferLen != 1 {
					t.Errorf("send from %v: %+v, %v", e.Addr(), st, err)
				}
			}
		}()
	}
	wg.Wait()
	if most.Load() != 1 {
		t.Errorf("the handler ran %d calls at once", most.Load())
	}
	if len(disorder) > 0 {
		t.Errorf("messages out of order from %v", disorder)
	}
}

// TestLocalQueuedAtClose checks that same-process messages waiting for
// the driver complete when their sender closes (Closed) or their
// receiver does (Unreachable).
func TestLocalQueuedAtClose(t *testing.T) {
	entered, release := make(chan struct{}), make(chan struct{})
	h := func(m msglayer.UnexpectedMessage) msglayer.HandlerAction {
		if m.Match == 1 {
			close(entered)
			<-release // holds the driver: the messages behind wait
		}
		return msglayer.Continue
	}
	c, a, b, ctx := handlerTrio(t, h)
	first, _ := a.Isend(c.Addr(), 1, [][]byte{[]byte("x")}, nil)
	firstDone := make(chan msglayer.Status, 1)
	go func() { st, _ := a.Wait(ctx, first); firstDone <- st }() // drives
	<-entered
	fromB, _ := b.Isend(c.Addr(), 2, [][]byte{[]byte("y")}, nil)
	fromA, _ := a.Isend(c.Addr(), 3, [][]byte{[]byte("z")}, nil)
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if st, _ := b.Wait(ctx, fromB); st.Code != msglayer.Closed {
		t.Errorf("queued send of an endpoint that closed: %v, want Closed", st.Code)
	}
	c.Close()
	close(release)
	if st, _ := a.Wait(ctx, fromA); st.Code != msglayer.BadEndpoint {
		t.Errorf("queued send to an endpoint that closed: %v, want BadEndpoint", st.Code)
	}
	if st := <-firstDone; st.Code != msglayer.BadEndpoint {
		t.Errorf("send whose receiver closed while its handler ran: %v, want BadEndpoint", st.Code)
	}
}

// TestLocalOrderWhileHandlerRuns: messages X->Y, m2 queued behind a
// message to a handler endpoint; while the driver runs that handler, X
// sends m3, which must not pass m2 (found by a review: it did).
func TestLocalOrderWhileHandlerRuns(t *testing.T) {
	w := memWorld(t, xdp.MemConfig{})
	entered0, release0 := make(chan struct{}), make(chan struct{})
	var x, y *msglayer.Endpoint
	sent3 := make(chan msglayer.Request, 1)
	h := func(m msglayer.UnexpectedMessage) msglayer.HandlerAction {
		switch m.Match {
		case 0:
			close(entered0)
			<-release0
		case 1:
			s, err := x.Isend(y.Addr(), 3, [][]byte{[]byte("m3")}, nil)
			if err != nil {
				t.Error(err)
			}
			sent3 <- s
		}
		return msglayer.Finished
	}
	c := w.open(t, 0, msglayer.Config{EndpointID: 3, Key: 3, UnexpectedHandler: h})
	a := w.open(t, 0, msglayer.Config{EndpointID: 4, Key: 4})
	x = w.open(t, 0, msglayer.Config{EndpointID: 5, Key: 5})
	y = w.open(t, 0, msglayer.Config{EndpointID: 6, Key: 6})
	ctx := ctxFor(t, 10*time.Second)
	if err := a.Connect(ctx, c.Addr(), 3); err != nil {
		t.Fatal(err)
	}
	if err := x.Connect(ctx, y.Addr(), 6); err != nil {
		t.Fatal(err)
	}
	s0, _ := a.Isend(c.Addr(), 0, [][]byte{[]byte("m0")}, nil)
	go a.Wait(ctx, s0) // drives
	<-entered0
	s1, _ := a.Isend(c.Addr(), 1, [][]byte{[]byte("m1")}, nil)
	s2, _ := x.Isend(y.Addr(), 2, [][]byte{[]byte("m2")}, nil) // queued: localIn not empty
	close(release0)
	if _, err := a.Wait(ctx, s1); err != nil {
		t.Fatal(err)
	}
	if _, err := x.Wait(ctx, s2); err != nil {
		t.Fatal(err)
	}
	if _, err := x.Wait(ctx, <-sent3); err != nil {
		t.Fatal(err)
	}
	var got []uint64
	for range 2 {
		r, _ := y.Irecv(0, 0, [][]byte{make([]byte, 8)}, nil)
		st, err := y.Wait(ctx, r)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, st.Match)
	}
	if got[0] != 2 {
		t.Fatalf("X->Y matched in order %v, want [2 3]", got)
	}
}

// TestLocalOrderRecvPostedDuringHandler: A->C, C with a handler; while
// C's handler runs on m1, C posts a receive and A sends m2: m1, sent
// first, must take the receive, as over the network.
func TestLocalOrderRecvPostedDuringHandler(t *testing.T) {
	w := memWorld(t, xdp.MemConfig{})
	entered, release := make(chan struct{}), make(chan struct{})
	h := func(m msglayer.UnexpectedMessage) msglayer.HandlerAction {
		if m.Match == 1 {
			close(entered)
			<-release
		}
		return msglayer.Continue
	}
	c := w.open(t, 0, msglayer.Config{EndpointID: 3, Key: 3, UnexpectedHandler: h})
	a := w.open(t, 0, msglayer.Config{EndpointID: 4, Key: 4})
	ctx := ctxFor(t, 10*time.Second)
	if err := a.Connect(ctx, c.Addr(), 3); err != nil {
		t.Fatal(err)
	}
	s1, _ := a.Isend(c.Addr(), 1, [][]byte{[]byte("m1")}, nil)
	go a.Wait(ctx, s1)
	<-entered
	r, _ := c.Irecv(0, 0, [][]byte{make([]byte, 8)}, nil)
	s2, _ := a.Isend(c.Addr(), 2, [][]byte{[]byte("m2")}, nil)
	close(release)
	st, err := c.Wait(ctx, r)
	if err != nil {
		t.Fatal(err)
	}
	a.Wait(ctx, s2)
	if st.Match != 1 {
		t.Fatalf("first receive got match %d, want 1 (m1 was sent first)", st.Match)
	}
}

// TestLocalQueuedAtDisconnect: A->C waits for the driver; A disconnects
// C: the send completes Aborted at once, as over the network, and C
// never sees the message.
func TestLocalQueuedAtDisconnect(t *testing.T) {
	entered, release := make(chan struct{}), make(chan struct{})
	var seen []uint64
	h := func(m msglayer.UnexpectedMessage) msglayer.HandlerAction {
		seen = append(seen, m.Match)
		if m.Match == 0 {
			close(entered)
			<-release
		}
		return msglayer.Continue
	}
	c, a, b, ctx := handlerTrio(t, h)
	s0, _ := b.Isend(c.Addr(), 0, [][]byte{[]byte("m0")}, nil)
	go b.Wait(ctx, s0)
	<-entered
	s1, _ := a.Isend(c.Addr(), 1, [][]byte{[]byte("m1")}, nil)
	a.Disconnect(c.Addr())
	st, ok, _ := a.Test(s1)
	t.Logf("right after Disconnect: done %v %v", ok, st.Code)
	close(release)
	if !ok {
		st, _ = a.Wait(ctx, s1)
	}
	time.Sleep(20 * time.Millisecond)
	_, inQ := c.Iprobe(1, ^uint64(0))
	t.Logf("send completed %v; handler saw %v; m1 in C's unexpected queue: %v", st.Code, seen, inQ)
	if !ok || st.Code != msglayer.Aborted || inQ {
		t.Fatalf("queued send survived Disconnect")
	}
}

// TestLocalCloseWhileHandedOver: A's message waits in the same round of
// the driver as one whose handler runs; A's Close completes it at once.
func TestLocalCloseWhileHandedOver(t *testing.T) {
	entered0, release0 := make(chan struct{}), make(chan struct{})
	entered1, release1 := make(chan struct{}), make(chan struct{})
	h := func(m msglayer.UnexpectedMessage) msglayer.HandlerAction {
		switch m.Match {
		case 0:
			close(entered0)
			<-release0
		case 1:
			close(entered1)
			<-release1
		}
		return msglayer.Continue
	}
	c, a, b, ctx := handlerTrio(t, h)
	s0, _ := b.Isend(c.Addr(), 0, [][]byte{[]byte("m0")}, nil)
	go b.Wait(ctx, s0)
	<-entered0
	b.Isend(c.Addr(), 1, [][]byte{[]byte("m1")}, nil)
	g := a.NewGroup()
	s2, _ := g.Isend(c.Addr(), 2, [][]byte{[]byte("m2")}, "m2")
	_ = s2
	close(release0)
	<-entered1 // the batch [m1, m2] is being run
	a.Close()
	st, ok := g.Test()
	t.Logf("after a.Close: group Test %v %+v", ok, st)
	_, err := g.Wait(ctx)
	t.Logf("group Wait after a.Close: %v", err)
	close(release1)
	time.Sleep(20 * time.Millisecond)
	st2, ok2 := g.Test()
	t.Logf("after the handler returned: group Test %v %+v", ok2, st2)
	if !ok {
		t.Fatal("Close returned with a send pending")
	}
}

// TestGroupWaitersAllWokenAtClose: two goroutines wait on one group
// while a third drives the link for another endpoint; the group's only
// endpoint closes: both waits end.
func TestGroupWaitersAllWokenAtClose(t *testing.T) {
	w := memWorld(t, xdp.MemConfig{})
	a := w.open(t, 0, msglayer.Config{EndpointID: 3, Key: 3})
	k := w.open(t, 0, msglayer.Config{EndpointID: 5, Key: 5}) // keeps the engine
	ctx := ctxFor(t, 10*time.Second)
	r, _ := k.Irecv(7, ^uint64(0), [][]byte{make([]byte, 8)}, nil)
	go k.Wait(ctx, r) // holds the drive token until ctx ends
	time.Sleep(20 * time.Millisecond)
	g := a.NewGroup()
	done := make(chan error, 2)
	for range 2 {
		go func() { _, err := g.Wait(ctx); done <- err }()
	}
	time.Sleep(20 * time.Millisecond)
	a.Close()
	for i := range 2 {
		select {
		case err := <-done:
			t.Logf("waiter ended: %v", err)
		case <-time.After(2 * time.Second):
			t.Fatalf("group waiter %d still waiting 2 s after its only endpoint closed", i+1)
		}
	}
}

// TestLocalHandlerDataIsOwn: a Disconnect while the handler runs
// completes the send at once and the sender reuses its buffer; the
// handler, still running, must not see it change (found by a review: its
// Data was the sender's buffer).
func TestLocalHandlerDataIsOwn(t *testing.T) {
	entered, release := make(chan struct{}), make(chan struct{})
	got := make(chan []byte, 1)
	h := func(m msglayer.UnexpectedMessage) msglayer.HandlerAction {
		if m.Match == 1 {
			close(entered)
			<-release
			got <- append([]byte(nil), m.Data...)
		}
		return msglayer.Finished
	}
	c, a, b, ctx := handlerTrio(t, h)
	// b's message first, so that a's waits in localIn and goes through the driver.
	r, _ := b.Irecv(99, ^uint64(0), [][]byte{make([]byte, 1)}, nil)
	go b.Wait(ctx, r) // keeps driving
	buf := []byte("original")
	s, _ := a.Isend(c.Addr(), 1, [][]byte{buf}, nil)
	<-entered
	a.Disconnect(c.Addr())
	st, err := a.Wait(ctx, s)
	t.Logf("send completed while its handler runs: %v %v", st.Code, err)
	copy(buf, "CLOBBER!") // the send is complete: the buffer is ours again
	close(release)
	d := <-got
	if !bytes.Equal(d, []byte("original")) {
		t.Fatalf("handler's Data changed under it after the send completed: %q", d)
	}
	b.Cancel(r)
}

// handlerTrio opens, on one in-memory link, c (endpoint 3, with handler
// h) and a and b (endpoints 4 and 5), both connected to c.
func handlerTrio(t *testing.T, h func(msglayer.UnexpectedMessage) msglayer.HandlerAction) (c, a, b *msglayer.Endpoint, ctx context.Context) {
	t.Helper()
	w := memWorld(t, xdp.MemConfig{})
	c = w.open(t, 0, msglayer.Config{EndpointID: 3, Key: 3, UnexpectedHandler: h})
	a = w.open(t, 0, msglayer.Config{EndpointID: 4, Key: 4})
	b = w.open(t, 0, msglayer.Config{EndpointID: 5, Key: 5})
	ctx = ctxFor(t, 10*time.Second)
	for _, e := range []*msglayer.Endpoint{a, b} {
		if err := e.Connect(ctx, c.Addr(), 3); err != nil {
			t.Fatal(err)
		}
	}
	return c, a, b, ctx
}

// TestHandlerEmptyDataSamePaths: an empty eager message shows the handler
// empty, non-nil Data (nil says "not sent eagerly in one frame") on both
// paths, whatever the engine sent before: the same-process path showed nil
// until a message of at least a byte had made its buffer.
func TestHandlerEmptyDataSamePaths(t *testing.T) {
	w := memWorld(t, xdp.MemConfig{})
	nilData := make(chan bool, 8)
	h := func(m msglayer.UnexpectedMessage) msglayer.HandlerAction {
		nilData <- m.Data == nil
		return msglayer.Finished
	}
	a, b := w.pair(t, msglayer.Config{}, msglayer.Config{UnexpectedHandler: h})
	c := w.open(t, 0, msglayer.Config{EndpointID: 3, Key: 3, UnexpectedHandler: h})
	ctx := ctxFor(t, 10*time.Second)
	if err := a.Connect(ctx, c.Addr(), 3); err != nil {
		t.Fatal(err)
	}
	send := func(dst *msglayer.Endpoint, n int) bool {
		s, err := a.Isend(dst.Addr(), 1, [][]byte{make([]byte, n)}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := a.Wait(ctx, s); err != nil {
			t.Fatal(err)
		}
		return <-nilData
	}
	net0, local0 := send(b, 0), send(c, 0)
	send(c, 10)
	local0After := send(c, 0)
	if net0 || local0 || local0After {
		t.Errorf("empty eager message, Data == nil: network %v, same process %v, same process after a 10-byte one %v; want false",
			net0, local0, local0After)
	}
}

// TestConnectMatchInfo: an IConnect's completion carries the match info it
// was given (MX's mx_iconnect match_info), so WaitAny for messages of
// another match info leaves it, and one for its own finds it.
func TestConnectMatchInfo(t *testing.T) {
	w := memWorld(t, xdp.MemConfig{})
	a := w.open(t, 0, msglayer.Config{EndpointID: 1, Key: 1})
	b := w.open(t, 1, msglayer.Config{EndpointID: 2, Key: 2})
	ctx := ctxFor(t, 10*time.Second)
	r, err := a.IConnect(b.Addr(), 2, 0xc0, "connect")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Wait(ctx, r); err != nil { // completes it; a new one for WaitAny
		t.Fatal(err)
	}
	if _, err := a.IConnect(b.Addr(), 2, 0xc0, "again"); err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if st, err := a.WaitAny(short, 0, ^uint64(0)); err == nil {
		t.Errorf("WaitAny for match 0 took %+v", st)
	}
	st, err := a.WaitAny(ctx, 0xc0, ^uint64(0))
	if err != nil || st.Match != 0xc0 || st.Context != "again" || st.Source != b.Addr() {
		t.Fatalf("WaitAny for the connect's match = %+v, %v", st, err)
	}
}

// TestCloseTellsPeers: an endpoint that closes, the last of its engine,
// tells its peers: a send waiting on it for a notify fails BadEndpoint
// at once instead of at its give-up, when nobody would be left to answer
// its keepalives.
func TestCloseTellsPeers(t *testing.T) {
	w := memWorld(t, xdp.MemConfig{})
	a, b := w.pair(t, msglayer.Config{}, msglayer.Config{}) // GiveUp 5 s
	ctx := ctxFor(t, 10*time.Second)
	s, err := a.Issend(b.Addr(), 1, [][]byte{make([]byte, 8)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(20 * time.Millisecond) // the record arrives: no receive for it
	b.Close()
	start := time.Now()
	st, _ := a.Wait(ctx, s)
	if el := time.Since(start); st.Code != msglayer.BadEndpoint || el > time.Second {
		t.Errorf("issend to an endpoint that closed: %v after %v; want BadEndpoint at once", st.Code, el)
	}
}

// TestUnexpectedCountersSamePaths checks that the counters of unexpected
// messages say the same on both paths (found by an audit): a message the
// handler finishes is Unexpected (only queued ones were), and a
// same-process eager message refused by the unexpected-memory bound is
// counted as refused and converted, as over the network (it was sent as a
// record silently).
func TestUnexpectedCountersSamePaths(t *testing.T) {
	ctx := ctxFor(t, 10*time.Second)
	finish := func(msglayer.UnexpectedMessage) msglayer.HandlerAction { return msglayer.Finished }
	a, b, c, _ := threeEPs(t, msglayer.Config{}, finish)
	for _, dst := range []*msglayer.Endpoint{b, c} {
		for i, n := range []int{0, 100, 5000, 100000} { // tiny to rendezvous
			s, err := a.Isend(dst.Addr(), uint64(i), [][]byte{message(i, n)}, nil)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := a.Wait(ctx, s); err != nil {
				t.Fatalf("send %d of %d bytes to %v: %v", i, n, dst.Addr(), err)
			}
		}
		if got := dst.Counters().Unexpected; got != 4 {
			t.Errorf("%v: Unexpected %d after 4 messages its handler finished, want 4", dst.Addr(), got)
		}
	}

	a, b, c, _ = threeEPs(t, msglayer.Config{UnexpectedBytes: 1}, nil)
	const n = 3
	for _, dst := range []*msglayer.Endpoint{b, c} {
		var sends []msglayer.Request
		for i := range n {
			s, err := a.Isend(dst.Addr(), uint64(i), [][]byte{message(i, 100)}, nil)
			if err != nil {
				t.Fatal(err)
			}
			sends = append(sends, s)
		}
		// Over the network the refusals come back before the sends
		// complete; wait for them before the receives are posted.
		deadline := time.Now().Add(5 * time.Second)
		for dst.Counters().EagerRefused < n && time.Now().Before(deadline) {
			dst.Iprobe(0, 0) // drives the link
			time.Sleep(time.Millisecond)
		}
		for i := range n {
			buf := make([]byte, 100)
			r, _ := dst.Irecv(uint64(i), ^uint64(0), [][]byte{buf}, nil)
			if st, err := dst.Wait(ctx, r); err != nil || st.XferLen != 100 {
				t.Fatalf("%v: receive %d: %+v, %v", dst.Addr(), i, st, err)
			}
			checkMessage(t, buf, i, 100)
		}
		for _, s := range sends {
			if _, err := a.Wait(ctx, s); err != nil {
				t.Fatal(err)
			}
		}
		if c := dst.Counters(); c.EagerRefused != n || c.UnexpectedBytesNow != 0 {
			t.Errorf("%v: EagerRefused %d and UnexpectedBytesNow %d after %d messages over a 1-byte bound, want %d and 0", dst.Addr(), c.EagerRefused, c.UnexpectedBytesNow, n, n)
		}
	}
	if got := a.Counters().EagerConverted; got != 2*n {
		t.Errorf("sender: EagerConverted %d, want %d (%d to each path)", got, 2*n, n)
	}
}
