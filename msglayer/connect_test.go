package msglayer

import (
	"context"
	"errors"
	"math"
	"testing"
	"time"

	"github.com/xmx-stack/xmx/xdp"
)

// TestReconnectAfterManyIDs: connect ids came from the endpoint's one
// counter (e.newID), which every rendezvous send, pull and registration
// also moves on. Once 2^31 ids went by since the peer took our last
// connect, a new connect looked older than it and was answered Aborted,
// every time, for the next 2^31 ids. Connects have a counter of their own.
func TestReconnectAfterManyIDs(t *testing.T) {
	a, b, _, _ := connectedPair(t, Config{}, Config{})
	if err := sendAndWait(t, a, b, 1, 2*time.Second); err != nil {
		t.Fatal(err)
	}
	// What 2^31 rendezvous sends/pulls of a (to anyone) do to the counter.
	a.eng.mu.Lock()
	a.nextID += 1 << 31
	a.eng.mu.Unlock()
	// The connection breaks on b's side (b gave up, or disconnected).
	b.Disconnect(a.Addr())
	for i := range 5 {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err := a.Connect(ctx, b.Addr(), 0xb)
		cancel()
		t.Logf("reconnect %d: %v", i, err)
		if i == 4 && errors.Is(err, ErrAborted) {
			t.Errorf("a cannot reconnect: every connect is answered Aborted")
		}
	}
}

// TestRepeatedDisconnectKeepsID: each Disconnect of a record moved its
// id's generation on, also when the record was not connected and its id
// had gone out in no frame. 2^31 such calls (a loop of minutes) put the
// generation half the space past the one the peer knew, and the peer
// then dropped every connect of ours as coming from an older id. Only
// the first Disconnect, which leaves a connection, moves the id now.
func TestRepeatedDisconnectKeepsID(t *testing.T) {
	a, b, _, _ := connectedPair(t, Config{}, Config{})
	gen := func() uint32 {
		b.eng.mu.Lock()
		defer b.eng.mu.Unlock()
		return b.peers[a.Addr()].localGen
	}
	gen0 := gen()
	for range 1 << 14 {
		b.Disconnect(a.Addr())
	}
	if gen1 := gen(); gen1-gen0 != 1 {
		t.Errorf("%d Disconnects moved the generation by %d, want 1", 1<<14, gen1-gen0)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	if err := b.Connect(ctx, a.Addr(), 0xa); err != nil {
		t.Fatal(err)
	}
	if err := sendAndWait(t, b, a, 1, 2*time.Second); err != nil {
		t.Fatalf("b to a after b reconnected: %v", err)
	}
	if err := sendAndWait(t, a, b, 2, 2*time.Second); err != nil {
		t.Fatalf("a to b after b reconnected: %v", err)
	}
}

// TestDisconnectAbortsPendingConnect: a Disconnect of a peer a connect
// to it is still under way for (its frames lost) completes that connect
// with Aborted. The reset's new id sent it again instead, and it
// connected the peer once frames went through, with no new Connect. A
// connect to another peer, pending as well, is left to run.
func TestDisconnectAbortsPendingConnect(t *testing.T) {
	hub := xdp.NewHub(xdp.MemConfig{})
	la, lb, lc := hub.Attach(), hub.Attach(), hub.Attach()
	t.Cleanup(func() { la.Close(); lb.Close(); lc.Close() })
	a := openT(t, Config{Link: la, EndpointID: 1, Key: 0xa})
	b := openT(t, Config{Link: lb, EndpointID: 2, Key: 0xb})
	c := openT(t, Config{Link: lc, EndpointID: 3, Key: 0xc})
	la.Partition(true)
	iconnect := func(to *Endpoint, key uint32) Request {
		r, err := a.IConnect(to.Addr(), key, 0, nil)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	rb, rc := iconnect(b, 0xb), iconnect(c, 0xc)
	a.Disconnect(b.Addr())
	la.Partition(false)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	st, err := a.Wait(ctx, rb)
	if st.Code != Aborted || !errors.Is(err, ErrAborted) {
		t.Errorf("connect pending at Disconnect: %v (%v), want Aborted", st.Code, err)
	}
	if st, err := a.Wait(ctx, rc); err != nil {
		t.Errorf("connect to another peer, pending at the Disconnect: %v (%v), want success", st.Code, err)
	}
	a.eng.mu.Lock()
	connected := a.peers[b.Addr()] != nil && a.peers[b.Addr()].connected
	a.eng.mu.Unlock()
	if connected {
		t.Error("a is connected to b after the Disconnect, with no Connect since")
	}
	if err := a.Connect(ctx, b.Addr(), 0xb); err != nil {
		t.Fatalf("Connect after the Disconnect: %v", err)
	}
	if err := sendAndWait(t, a, b, 1, 2*time.Second); err != nil {
		t.Fatal(err)
	}
}

// TestLockstepConnects: two endpoints each connected to an id the
// other has left (reached here through two old connect copies delivered
// after both sides reset) call Connect at the same moment, again and
// again. Each took the other's connect from a newer id and re-paired
// with a new id of its own; the replies named the ids just left and were
// dropped; the copies sent again from the new ids carried the connect ids
// already taken and were answered Aborted, for ever. A newer id of the
// same self now pairs without a new id of ours, and a new id of ours
// sends its pending connects as new ones.
func TestLockstepConnects(t *testing.T) {
	n := newManNet(t, time.Hour)
	a, b := n.a, n.b
	ra, _ := a.IConnect(b.Addr(), 0xb, 0, nil)
	rb, _ := b.IConnect(a.Addr(), 0xa, 0, nil)
	n.lockstep()
	for _, x := range []struct {
		e *Endpoint
		r Request
	}{{a, ra}, {b, rb}} {
		if st, ok, _ := x.e.Test(x.r); !ok || st.Code != Success {
			t.Fatalf("first connect: %v %v", ok, st.Code)
		}
	}
	// Both connect again; the copies are slow (held). Both sides then
	// forget the other (Disconnect; the disconnect frames are lost), and
	// the held copies from the old ids arrive.
	a.IConnect(b.Addr(), 0xb, 0, nil)
	b.IConnect(a.Addr(), 0xa, 0, nil)
	oldA, oldB := n.la.take(), n.lb.take()
	a.Disconnect(b.Addr())
	b.Disconnect(a.Addr())
	newA, newB := n.la.take(), n.lb.take() // [disconnect, connect from the new id]
	for _, f := range oldA {
		n.deliver(b, f)
	}
	for _, f := range oldB {
		n.deliver(a, f)
	}
	n.la.take()
	n.lb.take() // replies to connect ids no longer pending: ignored anyway
	la, lr, lc := n.ids(a, b)
	bl, br, bc := n.ids(b, a)
	t.Logf("after old copies: a gen %d paired with b gen %d (%v); b gen %d paired with a gen %d (%v)", la, lr, lc, bl, br, bc)
	for _, f := range newA[1:] {
		n.deliver(b, f)
	}
	for _, f := range newB[1:] {
		n.deliver(a, f)
	}
	n.lockstep()
	// The applications keep calling Connect, both at once.
	for round := range 8 {
		ra, _ := a.IConnect(b.Addr(), 0xb, 0, nil)
		rb, _ := b.IConnect(a.Addr(), 0xa, 0, nil)
		var sa, sb Status
		var oka, okb bool
		for range 20 {
			n.lockstep()
			if !oka {
				sa, oka, _ = a.Test(ra)
			}
			if !okb {
				sb, okb, _ = b.Test(rb)
			}
			if oka && okb {
				break
			}
			n.clock.Advance(50 * time.Millisecond)
			n.timers(a)
			n.timers(b)
		}
		la, lr, lc := n.ids(a, b)
		bl, br, bc := n.ids(b, a)
		t.Logf("round %d: a's connect %v, b's %v; a gen %d paired with b gen %d (%v), b gen %d paired with a gen %d (%v)",
			round, sa.Code, sb.Code, la, lr, lc, bl, br, bc)
		if sa.Code == Success && sb.Code == Success {
			for i, d := range [][2]*Endpoint{{a, b}, {b, a}} {
				r, _ := d[1].Irecv(uint64(9+i), ^uint64(0), [][]byte{make([]byte, 10)}, nil)
				s, _ := d[0].Isend(d[1].Addr(), uint64(9+i), [][]byte{[]byte("0123456789")}, nil)
				n.settle(10, time.Millisecond)
				st, ok1, _ := d[0].Test(s)
				rt, ok2, _ := d[1].Test(r)
				t.Logf("message %d: send %v %v, receive %v %v", i, ok1, st.Code, ok2, rt.Code)
				if !ok2 || rt.Code != Success {
					t.Errorf("message not delivered")
				}
			}
			return
		}
	}
	t.Error("8 rounds of simultaneous connects: none succeeded")
}

// TestSymmetricReconnects: the same on the in-memory hub with a
// 20 ms one-way delay, in real time: two applications that each retry
// Connect as soon as it fails stayed in step, and never connected.
func TestSymmetricReconnects(t *testing.T) {
	a, b, la, _ := connectedPair(t, Config{}, Config{})
	if err := sendAndWait(t, a, b, 1, 2*time.Second); err != nil {
		t.Fatal(err)
	}
	la.Hub().SetConfig(xdp.MemConfig{Delay: 20 * time.Millisecond})
	// Both connect again and, with the connects on the wire, forget the
	// other (an application's "reconnect": Disconnect, then Connect).
	a.IConnect(b.Addr(), 0xb, 0, nil)
	b.IConnect(a.Addr(), 0xa, 0, nil)
	a.Disconnect(b.Addr())
	b.Disconnect(a.Addr())
	type res struct {
		tries int
		ok    bool
	}
	loop := func(e, o *Endpoint, key uint32, out chan<- res) {
		deadline := time.Now().Add(3 * time.Second)
		n := 0
		for time.Now().Before(deadline) {
			n++
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			err := e.Connect(ctx, o.Addr(), key)
			cancel()
			if err == nil {
				out <- res{n, true}
				return
			}
		}
		out <- res{n, false}
	}
	ca, cb := make(chan res, 1), make(chan res, 1)
	go loop(a, b, 0xb, ca)
	go loop(b, a, 0xa, cb)
	ra, rb := <-ca, <-cb
	t.Logf("a: %d connects, connected %v; b: %d connects, connected %v", ra.tries, ra.ok, rb.tries, rb.ok)
	if !ra.ok || !rb.ok {
		t.Errorf("3 s of retried connects did not connect")
	}
}

// TestOldSelfCopiesFlipFlop: every late copy of a dead self's connect
// took a away from the live new self (pair forgot the old self's last
// connect on the change of self, so a copy already taken counted as new
// again). The self left is remembered with its last connect; and since a
// asks the self it knows whether it lives before it leaves it, no copy
// takes a away from the new self.
func TestOldSelfCopiesFlipFlop(t *testing.T) {
	n := newManNet(t, time.Hour)
	a := n.a
	ra, _ := a.IConnect(n.b.Addr(), 0xb, 0, nil)
	n.lockstep()
	a.Forget(ra)
	b := n.b
	b.IConnect(a.Addr(), 0xa, 0, nil) // copies of one connect, held in the network
	c1 := n.lb.take()
	n.clock.Advance(50 * time.Millisecond)
	n.timers(b)
	c2 := n.lb.take()
	b2 := n.restart(b)
	tears := 0
	for i, copy := range [][]byte{c1[0], c2[0]} {
		r, _ := b2.IConnect(a.Addr(), 0xa, 0, nil)
		n.settle(5, 50*time.Millisecond)
		if st, ok, _ := b2.Test(r); !ok || st.Code != Success {
			t.Fatalf("b2's connect %d: %v %v", i, ok, st.Code)
		}
		rr, _ := b2.Irecv(uint64(50+i), ^uint64(0), [][]byte{make([]byte, 40000)}, nil)
		_ = rr
		s, _ := a.Isend(b2.Addr(), uint64(50+i), [][]byte{make([]byte, 40000)}, nil) // rendezvous, pulled by b2
		n.deliver(a, copy)                                                           // the old self's late copy
		n.lockstep()
		st, ok, _ := a.Test(s)
		if ok && st.Code == BadSession {
			tears++
		}
		t.Logf("old self's copy %d: a's send to the new self: done %v, %v", i, ok, st.Code)
	}
	if tears > 0 {
		t.Errorf("%d of 2 late copies of the old self's one connect tore down the live connection", tears)
	}
}

// TestRestartTakenAfterChallenge: a is connected to b when b restarts
// and connects again. a asks the old self whether it lives (a keepalive
// to the pair it knows); the new self, which holds b's address now,
// nacks it, and a takes the held connect at once: no connect retry is
// needed, a's send to the old self fails BadSession, and messages flow
// with the new self.
func TestRestartTakenAfterChallenge(t *testing.T) {
	n := newManNet(t, time.Hour)
	ra, _ := n.a.IConnect(n.b.Addr(), 0xb, 0, nil)
	n.lockstep()
	mustComplete(t, n.a, ra, Success, "first connect")
	a := n.a
	// A rendezvous the old self never takes.
	s, err := a.Isend(n.b.Addr(), 5, [][]byte{make([]byte, 40000)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	n.lockstep()
	b2 := n.restart(n.b)
	rb, _ := b2.IConnect(a.Addr(), 0xa, 0, nil)
	n.lockstep() // no clock step: no connect is sent again
	mustComplete(t, b2, rb, Success, "the new self's connect")
	mustComplete(t, a, s, BadSession, "a's send to the old self")
	if c := a.Counters().Challenges; c != 1 {
		t.Errorf("a sent %d challenges, want 1", c)
	}
	_, remote, conn := n.ids(a, b2)
	if bl, _, _ := n.ids(b2, a); !conn || remote != bl {
		t.Errorf("a paired %v with generation %d of b's id, b2 is at %d", conn, remote, bl)
	}
	n.exchange(a, b2, 10)
	n.exchange(b2, a, 11)
}

// TestLateReplyOfOldSelf: a's connect reached b, whose reply is delayed;
// b restarts, and its new self connects to a. The old self's reply, which
// names a's id (a had no connection to change it), then arrives: a once
// took it for another self's and started over, failing its send to the
// live new self. It now asks the new self, which answers, and keeps the
// connection; its own connect, sent again, is answered by the new self.
func TestLateReplyOfOldSelf(t *testing.T) {
	n := newManNet(t, time.Hour)
	a := n.a
	ra, _ := a.IConnect(n.b.Addr(), 0xb, 0, nil)
	for _, f := range n.la.take() {
		n.deliver(n.b, f)
	}
	late := n.lb.take() // the old self's reply
	if len(late) != 1 {
		t.Fatalf("b answered with %d frames, want 1", len(late))
	}
	b2 := n.restart(n.b)
	rb, _ := b2.IConnect(a.Addr(), 0xa, 0, nil)
	n.lockstep()
	mustComplete(t, b2, rb, Success, "the new self's connect")
	s, err := a.Isend(b2.Addr(), 5, [][]byte{make([]byte, 40000)}, nil) // b2 takes it later
	if err != nil {
		t.Fatal(err)
	}
	n.lockstep()
	n.deliver(a, late[0])
	n.lockstep()
	if st, ok, _ := a.Test(s); ok {
		t.Fatalf("a's send to the new self ended %v at the old self's late reply", st.Code)
	}
	if c := a.Counters().Challenges; c != 1 {
		t.Errorf("a sent %d challenges, want 1", c)
	}
	n.settle(3, 50*time.Millisecond) // a's connect goes again
	mustComplete(t, a, ra, Success, "a's connect")
	r, _ := b2.Irecv(5, ^uint64(0), [][]byte{make([]byte, 40000)}, nil)
	n.settle(5, time.Millisecond)
	mustComplete(t, a, s, Success, "a's send")
	mustComplete(t, b2, r, Success, "b2's receive")
}

// TestPullGivesUpOnTime: a pull whose data stops coming gives up GiveUp
// after its last progress, not at its next probe, which the backoff put
// later (GiveUp below MaxRTO), nor at its first probe, which a round
// trip longer than GiveUp puts later: found late, the give-up tore down
// the exchange the peer had begun again meanwhile (the exploration's seed
// giveup/3451). A GiveUp that means never does not overflow.
func TestPullGivesUpOnTime(t *testing.T) {
	const giveUp = 100 * time.Millisecond
	t.Run("backoff", func(t *testing.T) {
		n := newManNet(t, giveUp)
		if d, code := pullGiveUp(t, n, 100, nil); code != Unreachable || d > giveUp+10*time.Millisecond {
			t.Errorf("the pull ended %v %v after its last data, want Unreachable after GiveUp %v", code, d, giveUp)
		}
	})
	t.Run("slow-peer", func(t *testing.T) {
		n := newManNet(t, giveUp)
		// One round trip of 80 ms: b's timeout (240 ms) is now longer
		// than GiveUp, and so is its pull's first probe.
		slow := func() {
			s, _ := n.b.Isend(n.a.Addr(), 9, [][]byte{make([]byte, 8)}, nil)
			n.b.Forget(s)
			n.timers(n.b) // stamps the frame sent
			for _, f := range n.lb.take() {
				n.deliver(n.a, f)
			}
			n.clock.Advance(80 * time.Millisecond)
			n.timers(n.a) // the delayed ack
			for _, f := range n.la.take() {
				n.deliver(n.b, f)
			}
		}
		if d, code := pullGiveUp(t, n, 100, slow); code != Unreachable || d > giveUp+10*time.Millisecond {
			t.Errorf("the pull ended %v %v after its last data, want Unreachable after GiveUp %v", code, d, giveUp)
		}
	})
	t.Run("never", func(t *testing.T) {
		n := newManNet(t, time.Duration(math.MaxInt64))
		if d, code := pullGiveUp(t, n, 60, nil); code != 0 {
			t.Errorf("with GiveUp %v the pull ended %v after %v", time.Duration(math.MaxInt64), code, d)
		}
	})
}

// TestConnectNeverGivesUp: with GiveUp "never" (math.MaxInt64), a connect
// to a peer not up yet keeps trying. Its deadline, the clock plus GiveUp,
// used to overflow, and the first retry timed it out.
func TestConnectNeverGivesUp(t *testing.T) {
	n := newManNet(t, time.Duration(math.MaxInt64))
	r, err := n.a.IConnect(n.b.Addr(), 0xb, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	for range 20 {
		n.la.take() // the peer is not up yet: lost
		n.clock.Advance(60 * time.Millisecond)
		n.timers(n.a)
		if st, ok, _ := n.a.Test(r); ok {
			t.Fatalf("a connect with GiveUp %v completed %v", time.Duration(math.MaxInt64), st.Code)
		}
	}
	n.lockstep() // the peer answers the next try
	mustComplete(t, n.a, r, Success, "the connect, once the peer answers")
}

// pullGiveUp connects n's endpoints, runs prep (if not nil), has b pull a 40000-byte rendezvous
// from a whose data never arrives (every other frame does), and steps the
// clock 5 ms at a time, at most steps times, until b's receive ends. It
// returns how long after the pull began that was, and the receive's code
// (0 if it never ended).
func pullGiveUp(t *testing.T, n *manNet, steps int, prep func()) (time.Duration, Code) {
	t.Helper()
	a, b := n.a, n.b
	rc, _ := a.IConnect(b.Addr(), 0xb, 0, nil)
	n.lockstep()
	mustComplete(t, a, rc, Success, "connect")
	if prep != nil {
		prep()
	}
	r, _ := b.Irecv(1, ^uint64(0), [][]byte{make([]byte, 40000)}, nil)
	if _, err := a.Isend(b.Addr(), 1, [][]byte{make([]byte, 40000)}, nil); err != nil {
		t.Fatal(err)
	}
	start := n.clock.Now()
	for step := 0; ; step++ {
		// Every frame moves but the pull's data.
		for range 10 {
			fa, fb := n.la.take(), n.lb.take()
			for _, f := range fa {
				if h, err := decodeHeader(f); err == nil && h.typ != tPullReply {
					n.deliver(b, f)
				}
			}
			for _, f := range fb {
				n.deliver(a, f)
			}
		}
		if st, ok, _ := b.Test(r); ok {
			return time.Duration(n.clock.Now() - start), st.Code
		}
		if step == steps {
			return time.Duration(n.clock.Now() - start), 0
		}
		n.clock.Advance(5 * time.Millisecond)
		n.timers(a)
		n.timers(b)
	}
}

// TestHeldConnectKeptThroughStaleCopy: a holds the connect of b's new
// self (b2) while it asks b1, the self it is connected to, whether it
// lives; a late connect of an older self (b0) then arrives. It must not
// take the place of b2's connect: b2's nack makes a take b2's connect at
// once, with no connect retry.
func TestHeldConnectKeptThroughStaleCopy(t *testing.T) {
	n := newManNet(t, time.Hour)
	a := n.a
	n.b.IConnect(a.Addr(), 0xa, 0, nil)
	stale := n.lb.take() // b0's connect, late
	b1 := n.restart(n.b)
	r1, _ := b1.IConnect(a.Addr(), 0xa, 0, nil)
	n.lockstep()
	mustComplete(t, b1, r1, Success, "b1's connect")
	b2 := n.restart(b1)
	r2, _ := b2.IConnect(a.Addr(), 0xa, 0, nil)
	for _, f := range n.lb.take() {
		n.deliver(a, f) // b2's connect: held, b1 asked
	}
	n.deliver(a, stale[0])
	n.lockstep() // no clock step: no connect is sent again
	mustComplete(t, b2, r2, Success, "b2's connect")
	n.exchange(a, b2, 7)
}

// TestHeldConnectKeptThroughReplyChallenge: a, connected to b1, and b's
// new self b2 connect to each other at once. a holds b2's connect and
// asks b1; b2 takes a's connect, and its reply reaches a before its nack
// of the question. The reply (from another self than b1) asks again: it
// must not drop the held connect, which b2's nack then makes a take.
func TestHeldConnectKeptThroughReplyChallenge(t *testing.T) {
	n := newManNet(t, time.Hour)
	a := n.a
	r0, _ := a.IConnect(n.b.Addr(), 0xb, 0, nil)
	n.lockstep()
	mustComplete(t, a, r0, Success, "first connect")
	b2 := n.restart(n.b)
	ra, _ := a.IConnect(b2.Addr(), 0xb, 0, nil)
	rb, _ := b2.IConnect(a.Addr(), 0xa, 0, nil)
	aConnect, bConnect := n.la.take(), n.lb.take()
	for _, f := range bConnect {
		n.deliver(a, f) // held; a asks b1 (a keepalive)
	}
	question := n.la.take()
	for _, f := range aConnect {
		n.deliver(b2, f) // taken: b2 replies
	}
	reply := n.lb.take()
	for _, f := range question {
		n.deliver(b2, f) // b2 nacks it
	}
	nack := n.lb.take()
	for _, f := range append(reply, nack...) {
		n.deliver(a, f)
	}
	n.lockstep() // no clock step: no connect is sent again
	mustComplete(t, b2, rb, Success, "b2's connect")
	mustComplete(t, a, ra, Success, "a's connect")
	n.exchange(a, b2, 7)
	n.exchange(b2, a, 8)
}
