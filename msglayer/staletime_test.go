package msglayer

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/xmx-stack/xmx/xdp"
)

// The tests of this file hold the timers to times that are current: a
// frame's timeout counts from when it left, a peer's silence from the
// wait under way, and the frames waiting in the ring go before the
// timers that their acks would spare.

// newManNetCfg is newManNet with configurations of a's and b's own
// (GiveUp 5 s unless given), a connected to b.
func newManNetCfg(t *testing.T, ca, cb Config) *manNet {
	n := &manNet{t: t, clock: &ManualClock{}, giveUp: 5 * time.Second}
	n.clock.Advance(time.Millisecond)
	ma, mb := xdp.NewPair(xdp.MemConfig{})
	n.la, n.lb = &capLink{Link: ma}, &capLink{Link: mb}
	t.Cleanup(func() { n.la.Link.Close(); n.lb.Link.Close() })
	n.a, n.b = n.openCfg(n.la, 1, 0xa, ca), n.openCfg(n.lb, 2, 0xb, cb)
	ra, _ := n.a.IConnect(n.b.Addr(), 0xb, 0, nil)
	n.lockstep()
	mustComplete(t, n.a, ra, Success, "connect")
	return n
}

// ackLaterSetup sends 8 messages from a through a window of 4, lets b
// take the 4 in flight and answer with one message carrying their ack,
// and hands that to a leaving the ack for later; then 3 ms pass, as
// when the background goroutine settles acks after lingerAPI.
func ackLaterSetup(t *testing.T) (n *manNet, sends []Request) {
	n = newManNetCfg(t, Config{Window: 4}, Config{AckEvery: 64, AckDelay: time.Second})
	a, b := n.a, n.b
	for i := range 8 {
		r, err := a.Isend(b.Addr(), uint64(i), [][]byte{make([]byte, 100)}, nil)
		if err != nil {
			t.Fatal(err)
		}
		sends = append(sends, r)
	}
	n.timers(a) // stamps the 4 in flight
	for _, f := range n.la.take() {
		n.deliver(b, f)
	}
	if _, err := b.Isend(a.Addr(), 99, [][]byte{make([]byte, 10)}, nil); err != nil {
		t.Fatal(err)
	}
	fb := n.lb.take()
	n.clock.Advance(100 * time.Microsecond)
	for _, f := range fb {
		n.deliverFrame(a, f, false) // the acks left for later
	}
	n.clock.Advance(3 * time.Millisecond)
	return n, sends
}

// TestSettledSendsTimedFromNow checks that the messages an ack settled
// late lets into the window are timed from when they leave: they were
// stamped with the ack's arrival, milliseconds before, and timed out at
// once (a retransmission and a cut of the congestion window each time).
func TestSettledSendsTimedFromNow(t *testing.T) {
	n, _ := ackLaterSetup(t)
	a := n.a
	before := a.Counters()
	g := a.eng
	g.mu.Lock() // what prepareSleep does
	g.settleAcks()
	g.runTimers(g.readClock())
	g.flushAndUnlock()
	if after := a.Counters(); after.Retransmits != before.Retransmits || after.CwndCuts != before.CwndCuts {
		t.Errorf("the sends a late ack let go timed out at once: retransmissions %d -> %d, cuts %d -> %d",
			before.Retransmits, after.Retransmits, before.CwndCuts, after.CwndCuts)
	}
}

// TestTestSendsWhatItSettled checks that a Test whose look at the acks
// lets messages into the window sends them, rather than leaving them
// queued for the next driver round.
func TestTestSendsWhatItSettled(t *testing.T) {
	n, sends := ackLaterSetup(t)
	a := n.a
	n.la.take()
	if _, _, err := a.Test(sends[0]); err != nil {
		t.Fatal(err)
	}
	if out := len(n.la.take()); out != 4 {
		t.Errorf("Test settled the ack of 4 sends and sent %d of the 4 queued, want 4", out)
	}
	before := a.Counters().Retransmits
	n.timers(a)
	if after := a.Counters().Retransmits; after != before {
		t.Errorf("the sends Test let go were retransmitted at once (%d)", after-before)
	}
}

// TestGiveUpCountsFromTheWait checks that after a give-up and a
// reconnect, a peer's silence during a new wait counts from that wait's
// start: a wait's start left from before the give-up made a rendezvous
// whose record was lost fail Unreachable at the first timeout, about 5
// ms in, with GiveUp 1 s.
func TestGiveUpCountsFromTheWait(t *testing.T) {
	for _, giveUpFirst := range []bool{false, true} {
		name := "control"
		if giveUpFirst {
			name = "after a give-up"
		}
		t.Run(name, func(t *testing.T) {
			n := newManNet(t, time.Second)
			a, b := n.a, n.b
			ra, _ := a.IConnect(b.Addr(), 0xb, 0, nil)
			n.lockstep()
			mustComplete(t, a, ra, Success, "connect")
			if giveUpFirst {
				s, _ := a.Isend(b.Addr(), 1, [][]byte{make([]byte, 40000)}, nil)
				n.lockstep()
				for range 200 { // b is silent
					n.la.take()
					n.lb.take()
					n.clock.Advance(10 * time.Millisecond)
					n.timers(a)
				}
				mustComplete(t, a, s, Unreachable, "send to the silent peer")
				n.la.take()
				n.lb.take()
				ra, _ = a.IConnect(b.Addr(), 0xb, 0, nil)
				n.lockstep()
				mustComplete(t, a, ra, Success, "reconnect")
			}
			n.clock.Advance(1500 * time.Millisecond) // idle, longer than GiveUp
			n.timers(a)
			n.timers(b)
			n.lockstep()
			s, _ := a.Isend(b.Addr(), 7, [][]byte{make([]byte, 40000)}, nil)
			n.timers(a)
			n.la.take() // the rendezvous record is lost,
			for range 10 {
				n.clock.Advance(2 * time.Millisecond)
				n.timers(a)
				n.la.take() // and its retransmissions, for 20 ms
				if st, ok, _ := a.Test(s); ok {
					t.Fatalf("the send completed %v after 20 ms of loss (GiveUp 1 s)", st.Code)
				}
			}
		})
	}
}

// TestTimersAfterWaitingFrames checks that a driver about to sleep
// handles the frames waiting in the ring before it runs the timers: an
// ack waiting there while nobody drove for longer than the timeout (the
// background goroutine's lingerAPI) used to have its frame retransmitted
// first.
func TestTimersAfterWaitingFrames(t *testing.T) {
	fp := newFuzzPair(t, 0, false, false)
	a, b := fp.a, fp.b
	g := a.eng
	if _, err := a.Isend(b.addr, 1, [][]byte{make([]byte, 8)}, nil); err != nil {
		t.Fatal(err)
	}
	fp.drive(g)     // stamps it
	fp.drive(b.eng) // b acks at once: the ack waits in a's ring
	g.mu.Lock()
	rto := a.peers[b.addr].rto
	g.mu.Unlock()
	fp.clock.Advance(time.Duration(rto) + time.Microsecond)
	before := a.Counters().Retransmits
	for !g.drive.tryTake() {
	}
	d, from := g.prepareSleep(250 * time.Millisecond)
	g.driveOnce(d, from)
	g.drive.release()
	if got := a.Counters().Retransmits - before; got != 0 {
		t.Errorf("%d retransmissions of a frame whose ack waited in the ring", got)
	}
}

// TestInitialRTOAtMostMaxRTO checks that MaxRTO bounds the first timeout
// too: with InitialRTO 1 s and MaxRTO 250 ms, a lost frame was first
// resent after 1 s.
func TestInitialRTOAtMostMaxRTO(t *testing.T) {
	n := newManNetCfg(t, Config{InitialRTO: time.Second, MaxRTO: 250 * time.Millisecond}, Config{})
	a, b := n.a, n.b
	if _, err := a.Isend(b.Addr(), 1, [][]byte{make([]byte, 10)}, nil); err != nil {
		t.Fatal(err)
	}
	n.timers(a)
	n.la.take() // lost
	for waited := 50 * time.Millisecond; waited <= time.Second; waited += 50 * time.Millisecond {
		n.clock.Advance(50 * time.Millisecond)
		n.timers(a)
		if a.Counters().Retransmits > 0 {
			if waited > 300*time.Millisecond {
				t.Errorf("first retransmission after %v, MaxRTO 250 ms", waited)
			}
			return
		}
	}
	t.Error("no retransmission within 1 s")
}

// TestCloseWaitsForAPIDriver: the Close of a given link's last endpoint
// returns only once an API call still driving the engine (a Wait the
// Close woke, between its look at closed and its receive) has let go, so
// that an Open next on the link gets every frame: a connect to the new
// endpoint used to be taken by the old engine's driver and answered
// BadEndpoint.
func TestCloseWaitsForAPIDriver(t *testing.T) {
	hub := xdp.NewHub(xdp.MemConfig{})
	la, lb := hub.Attach(), hub.Attach()
	defer la.Close()
	defer lb.Close()
	var armed atomic.Bool
	atRecv, release := make(chan struct{}), make(chan struct{})
	testHookSleep = func(bg bool) { // set before, cleared after, the engines run
		if !bg && armed.CompareAndSwap(true, false) {
			close(atRecv)
			<-release
		}
	}
	defer func() { testHookSleep = nil }()
	cfg := Config{Link: la, EndpointID: 1, Key: 1}
	old, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	r, err := old.Irecv(0, 0, [][]byte{make([]byte, 8)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	armed.Store(true)
	go old.Wait(context.Background(), r)
	<-atRecv // the Wait drives old's link, about to receive
	closed := make(chan error, 1)
	go func() { closed <- old.Close() }()
	select {
	case err := <-closed:
		close(release)
		t.Fatalf("Close returned (%v) while an API call still drove the engine", err)
	case <-time.After(100 * time.Millisecond):
	}
	close(release)
	select {
	case <-closed:
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not return once the API driver let go")
	}
	e, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	f := make([]byte, 128)
	src, dst := [6]byte(lb.HardwareAddr()), e.eng.mac
	h := header{typ: tConnect, dstEP: 1, srcEP: 2, srcSession: 77}
	putConnect(putHeader(f, &dst, &src, e.eng.ethType, &h), 1, 99, 1500)
	if _, err := lb.Send([][]byte{padded(f, tConnect, 0)}); err != nil {
		t.Fatal(err)
	}
	bufs, sizes := [][]byte{make([]byte, 2048)}, []int{0}
	if n, err := lb.Recv(bufs, sizes, 2*time.Second); n != 1 || err != nil {
		t.Fatalf("no answer to a connect to the new endpoint: %d, %v", n, err)
	}
	rf := bufs[0][:sizes[0]]
	rh, err := decodeHeader(rf)
	if err != nil || rh.typ != tConnectReply {
		t.Fatalf("answer: %v, type %v", err, rh.typ)
	}
	th, _ := typeHdr(rf, &rh)
	if _, code, _ := getConnReply(th); code != Success {
		t.Errorf("a connect to the endpoint opened after the Close answered %v", code)
	}
}

// TestGiveUpOnTime: a silent peer is given up GiveUp after it went
// silent, not at the next retransmission or keepalive after that (the
// retries back off: 5, 15, 35, 75, 155 ms; keepalives come every 250 ms),
// whatever we wait on: a frame in flight, a rendezvous's notify, the rest
// of an eager message.
func TestGiveUpOnTime(t *testing.T) {
	const giveUp = 100 * time.Millisecond
	whenDone := func(t *testing.T, n *manNet, e *Endpoint, r Request) {
		t.Helper()
		start := n.clock.Now()
		for n.clock.Now()-start < int64(2*time.Second) {
			n.la.take() // everything is lost
			n.lb.take()
			n.clock.Advance(time.Millisecond)
			n.timers(n.a)
			n.timers(n.b)
			if st, ok, _ := e.Test(r); ok {
				if d := time.Duration(n.clock.Now() - start); st.Code != Unreachable || d > giveUp+10*time.Millisecond {
					// (a wait's start is noted at the peer's first timer
					// pass in it: a few ms late at most here)
					t.Errorf("completed %v after %v; want Unreachable after GiveUp %v", st.Code, d, giveUp)
				}
				return
			}
		}
		t.Fatal("not given up within 2 s")
	}
	cfg := Config{GiveUp: giveUp}
	t.Run("frame in flight", func(t *testing.T) {
		n := newManNetCfg(t, cfg, cfg)
		s, _ := n.a.Isend(n.b.Addr(), 1, [][]byte{make([]byte, 100)}, nil)
		n.timers(n.a)
		whenDone(t, n, n.a, s)
	})
	t.Run("awaiting notify", func(t *testing.T) {
		n := newManNetCfg(t, cfg, cfg)
		s, _ := n.a.Isend(n.b.Addr(), 1, [][]byte{make([]byte, 40000)}, nil)
		n.timers(n.a)
		n.lockstep() // the record arrives; no receive is posted
		n.clock.Advance(2 * time.Millisecond)
		n.timers(n.b) // b's delayed ack of the record
		n.lockstep()
		n.a.eng.mu.Lock()
		p := n.a.peers[n.b.Addr()]
		inFlight, rndvs := p.inFlight(), p.rndvs
		n.a.eng.mu.Unlock()
		if inFlight != 0 || rndvs != 1 {
			t.Fatalf("record not acked: %d in flight, %d rendezvous", inFlight, rndvs)
		}
		whenDone(t, n, n.a, s)
	})
	t.Run("eager message half received", func(t *testing.T) {
		n := newManNetCfg(t, cfg, cfg)
		r, _ := n.b.Irecv(1, ^uint64(0), [][]byte{make([]byte, 20000)}, nil)
		n.a.Isend(n.b.Addr(), 1, [][]byte{make([]byte, 20000)}, nil)
		n.deliver(n.b, n.la.take()[0]) // the first fragment only
		whenDone(t, n, n.b, r)
	})
}

// TestReceiverClosedMidPull: a receiver closes while it pulls a large
// message, its engine staying up for another endpoint. The sender, whose
// record was acked, sends it only keepalives while it waits for the
// notify: the engine nacks the first (no such endpoint), and the send
// fails BadEndpoint at once rather than after GiveUp (or never, with
// GiveUp "never").
func TestReceiverClosedMidPull(t *testing.T) {
	n := newManNet(t, time.Hour)
	a, b := n.a, n.b
	n.open(n.lb, 3, 0xc) // keeps b's engine running after b closes
	ra, _ := a.IConnect(b.Addr(), 0xb, 0, nil)
	n.lockstep()
	mustComplete(t, a, ra, Success, "connect")
	b.Irecv(5, ^uint64(0), [][]byte{make([]byte, 1<<20)}, nil)
	s, err := a.Isend(b.Addr(), 5, [][]byte{make([]byte, 1<<20)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	isPullReply := func(f []byte) bool {
		var h header
		return h.decode(f) == nil && h.typ == tPullReply
	}
	// The record arrives and is acked; every pull reply is lost.
	for range 5 {
		for range 100 {
			fa, fb := n.la.take(), n.lb.take()
			if len(fa)+len(fb) == 0 {
				break
			}
			for _, f := range fa {
				if !isPullReply(f) {
					n.deliver(b, f)
				}
			}
			for _, f := range fb {
				n.deliver(a, f)
			}
		}
		n.clock.Advance(time.Millisecond)
		n.timers(a)
		n.timers(b)
	}
	b.Close()
	n.lb.take()
	for range 8 { // 2 s: a few keepalive intervals
		n.clock.Advance(250 * time.Millisecond)
		n.timers(a)
		for _, f := range n.la.take() {
			n.deliver(b, f) // b's engine: no endpoint 2 now
		}
		for _, f := range n.lb.take() {
			n.deliver(a, f)
		}
	}
	if st, ok, _ := a.Test(s); !ok || st.Code != BadEndpoint {
		t.Fatalf("send to a receiver that closed mid-pull: done %v, %v after 2 s; want BadEndpoint", ok, st.Code)
	}
}

// TestConnectRequestPrivate: the request of a blocking Connect, completed
// by whoever drives the link, stays out of the done queue, where a TestAny
// (or WaitAny, or Peek) of another goroutine looking for anything would
// take it from the Connect waiting for it.
func TestConnectRequestPrivate(t *testing.T) {
	n := newManNet(t, time.Second)
	a, b := n.a, n.b
	r, err := a.iconnect(b.Addr(), 0xb, 0, nil, true, nil) // as Connect does
	if err != nil {
		t.Fatal(err)
	}
	n.lockstep() // completed by the driver, nobody waiting
	if st, ok := a.TestAny(0, 0); ok {
		t.Fatalf("TestAny(0, 0) took the blocking connect's completion: %+v", st)
	}
	if _, ok := a.IPeek(); ok {
		t.Fatal("IPeek shows the blocking connect's completion")
	}
	mustComplete(t, a, r, Success, "the connect, to its own Wait")
}
