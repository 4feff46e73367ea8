package msglayer

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"testing"
	"time"
)

// TestImpossibleNotify: a notify that says the receiver took more than
// the send had, or that ends the send with a code there is none of, is
// counted as a bad frame and fails the send (Aborted, nothing taken);
// the send no longer completes with what the frame claimed.
func TestImpossibleNotify(t *testing.T) {
	for _, c := range []struct {
		name  string
		spoil func(th []byte) // the notify's type header
	}{
		{"length", func(th []byte) { binary.BigEndian.PutUint32(th[4:], 1<<30) }},
		{"code", func(th []byte) { th[8] = 200 }},
	} {
		t.Run(c.name, func(t *testing.T) {
			n := newManNet(t, time.Hour)
			a, b := n.a, n.b
			ra, _ := a.IConnect(b.Addr(), 0xb, 0, nil)
			rb, _ := b.IConnect(a.Addr(), 0xa, 0, nil)
			n.lockstep()
			mustComplete(t, a, ra, Success, "a's connect")
			mustComplete(t, b, rb, Success, "b's connect")
			spoiled := 0
			n.trace = func(to *Endpoint, f []byte) {
				var h header
				if to == a && h.decode(f) == nil && h.typ == tNotify {
					c.spoil(f[hdrLen:])
					spoiled++
				}
			}
			r, _ := b.Irecv(7, ^uint64(0), [][]byte{make([]byte, 40000)}, nil)
			s, err := a.Isend(b.Addr(), 7, [][]byte{make([]byte, 40000)}, nil)
			if err != nil {
				t.Fatal(err)
			}
			before := a.Counters().BadFrames
			n.settle(5, time.Millisecond)
			mustComplete(t, b, r, Success, "the receive")
			if spoiled == 0 {
				t.Fatal("no notify went to a")
			}
			st, ok, _ := a.Test(s)
			if !ok || st.Code != Aborted || st.XferLen != 0 {
				t.Fatalf("the send: done %v, %v, %d bytes taken; want Aborted, 0", ok, st.Code, st.XferLen)
			}
			if got := a.Counters().BadFrames - before; got != uint64(spoiled) {
				t.Fatalf("%d bad frames counted, want %d", got, spoiled)
			}
		})
	}
}

// TestPullFromClosedEndpoint: a receive pulling a rendezvous from an
// endpoint that closed meanwhile fails with BadEndpoint as soon as its
// pull request reaches the sender's engine, which has no endpoint of that
// id any more; it waited for the give-up before (an hour here).
func TestPullFromClosedEndpoint(t *testing.T) {
	n := newManNet(t, time.Hour)
	a, b := n.a, n.b
	other := n.open(n.la, 3, 0xc) // keeps a's engine running after a closes
	ra, _ := a.IConnect(b.Addr(), 0xb, 0, nil)
	n.lockstep()
	mustComplete(t, a, ra, Success, "a's connect")
	r, _ := b.Irecv(5, ^uint64(0), [][]byte{make([]byte, 1<<20)}, nil)
	if _, err := a.Isend(b.Addr(), 5, [][]byte{make([]byte, 1<<20)}, nil); err != nil {
		t.Fatal(err)
	}
	for _, f := range n.la.take() { // the rendezvous record: b matches it and pulls
		n.deliver(b, f)
	}
	pulls := n.lb.take()
	if len(pulls) == 0 {
		t.Fatal("b sent no pull request")
	}
	a.Close()
	n.la.take() // whatever a's Close sent
	for _, f := range pulls {
		n.deliver(other, f) // a's engine: no endpoint 1 now
	}
	n.lockstep()
	if st, ok, _ := b.Test(r); !ok || st.Code != BadEndpoint {
		t.Fatalf("the receive: done %v, %v; want BadEndpoint", ok, st.Code)
	}
}

// TestBundleCountedOnce: a frame carrying the acks of several endpoints
// counts in once, for the endpoint it was sent to: the endpoints of an
// engine together count the frames their link received. Each entry
// counted the whole frame again before.
func TestBundleCountedOnce(t *testing.T) {
	n := newManNet(t, time.Hour)
	a, b := n.a, n.b
	a3 := n.open(n.la, 3, 0xc) // b owes acks to both endpoints of a's host
	for _, from := range []*Endpoint{a, a3} {
		r, _ := from.IConnect(b.Addr(), 0xb, 0, nil)
		n.lockstep()
		mustComplete(t, from, r, Success, "connect")
	}
	framesToA, bytesToA, bundles := uint64(0), uint64(0), 0
	n.trace = func(to *Endpoint, f []byte) {
		var h header
		if to.eng == a.eng && h.decode(f) == nil {
			framesToA++
			bytesToA += uint64(len(f))
			if h.typ == tAcks {
				bundles++
			}
		}
	}
	before := [2]Counters{a.Counters(), a3.Counters()}
	for i := range 8 {
		a.Isend(b.Addr(), uint64(i), [][]byte{make([]byte, 100)}, nil)
		a3.Isend(b.Addr(), uint64(i), [][]byte{make([]byte, 100)}, nil)
	}
	n.settle(5, time.Millisecond)
	if bundles == 0 {
		t.Fatal("b's engine sent no ack bundle: the test sees nothing")
	}
	after := [2]Counters{a.Counters(), a3.Counters()}
	frames := after[0].FramesIn - before[0].FramesIn + after[1].FramesIn - before[1].FramesIn
	bytes := after[0].BytesIn - before[0].BytesIn + after[1].BytesIn - before[1].BytesIn
	if frames != framesToA || bytes != bytesToA {
		t.Fatalf("a's endpoints counted %d frames in (%d bytes); %d reached their engine (%d bytes), %d of them bundles",
			frames, bytes, framesToA, bytesToA, bundles)
	}
}

// TestCongestionWindow: a timeout shrinks the peer's congestion window
// to minCwnd and resends the frames in flight from the oldest, as acks
// come back (a recovery), each once; slow start grows the window again;
// no more frames than it allows go out.
func TestCongestionWindow(t *testing.T) {
	n, p := connectedManNet(t)
	a, b := n.a, n.b
	full := uint32(len(p.win))
	if p.cwnd != full {
		t.Fatalf("a new peer's cwnd is %d, want the window, %d", p.cwnd, full)
	}
	for i := range 64 {
		a.Isend(b.Addr(), uint64(i), [][]byte{make([]byte, 1000)}, nil)
	}
	if sent := len(n.la.take()); sent != 64 { // all lost
		t.Fatalf("%d frames went out, want 64", sent)
	}
	n.timers(a) // stamps them sent now
	n.clock.Advance(50 * time.Millisecond)
	n.timers(a)
	n.timers(a) // the recovery waits for acks: nothing more goes
	if p.cwnd != minCwnd || p.ssthresh != 32 || a.Counters().CwndCuts != 1 {
		t.Fatalf("after a timeout: cwnd %d, ssthresh %d, %d cuts; want %d, 32 (half the frames in flight), 1", p.cwnd, p.ssthresh, a.Counters().CwndCuts, minCwnd)
	}
	if resent := n.la.lastOut(); len(resent) != minCwnd {
		t.Fatalf("the timeout resent %d frames, want %d (cwnd)", len(resent), minCwnd)
	}
	n.settle(30, time.Millisecond) // the retransmissions arrive, and their acks
	if p.inFlight() != 0 || p.recovering {
		t.Fatalf("%d frames still in flight (recovering %v)", p.inFlight(), p.recovering)
	}
	if c := a.Counters(); c.Retransmits != 64 || c.CwndCuts != 1 {
		t.Fatalf("the recovery made %d retransmissions and %d cuts; want each lost frame resent once (64) and 1", c.Retransmits, c.CwndCuts)
	}
	// 30 acks of slow start take it from 2 to ssthresh (32); of the 34
	// after them, 32 grow it by one.
	if p.cwnd != 33 {
		t.Fatalf("after 64 frames acked, cwnd %d; want 33", p.cwnd)
	}
	// A small window holds the rest back until acks come.
	a.eng.mu.Lock()
	p.cwnd, p.cwndAcked = 4, 0
	a.eng.mu.Unlock()
	for i := range 10 {
		a.Isend(b.Addr(), uint64(100+i), [][]byte{make([]byte, 1000)}, nil)
	}
	if sent := len(n.la.lastOut()); sent != 4 {
		t.Fatalf("%d frames went out with a cwnd of 4", sent)
	}
	n.settle(10, time.Millisecond)
	if p.inFlight() != 0 || p.cwnd <= 4 {
		t.Fatalf("after the acks: %d in flight, cwnd %d; want 0 and more than 4", p.inFlight(), p.cwnd)
	}
}

// TestOutOfOrderBound: frames that arrive ahead of a gap are held up to
// OutOfOrderBytes; past it they are dropped and counted, their sender
// resends them, and every message still arrives whole, in order.
func TestOutOfOrderBound(t *testing.T) {
	n, _ := connectedManNet(t)
	a, b := n.a, n.b
	b.eng.mu.Lock()
	b.cfg.OutOfOrderBytes = 3 * b.eng.maxFrame()
	b.eng.mu.Unlock()
	const msgs = 10
	recvs, bufs := make([]Request, msgs), make([][]byte, msgs)
	for i := range msgs {
		bufs[i] = make([]byte, 100)
		recvs[i], _ = b.Irecv(uint64(i), ^uint64(0), [][]byte{bufs[i]}, nil)
		a.Isend(b.Addr(), uint64(i), [][]byte{bytes.Repeat([]byte{byte(i + 1)}, 100)}, nil)
	}
	frames := n.la.take()
	if len(frames) != msgs {
		t.Fatalf("%d frames went out, want %d", len(frames), msgs)
	}
	for _, f := range frames[1:] { // the first is lost
		n.deliver(b, f)
	}
	c := b.Counters()
	b.eng.mu.Lock()
	held := b.oooHeld
	b.eng.mu.Unlock()
	if c.OutOfOrder != 3 || c.OutOfOrderDropped != msgs-1-3 || held != 3 {
		t.Fatalf("held %d frames out of order (counted %d), dropped %d; want 3, 3, %d", held, c.OutOfOrder, c.OutOfOrderDropped, msgs-1-3)
	}
	n.settle(40, time.Millisecond) // the timeout's recovery resends them
	for i, r := range recvs {
		mustComplete(t, b, r, Success, fmt.Sprintf("receive %d", i))
		if !bytes.Equal(bufs[i], bytes.Repeat([]byte{byte(i + 1)}, 100)) {
			t.Fatalf("message %d arrived as % x", i, bufs[i][:8])
		}
	}
	b.eng.mu.Lock()
	held = b.oooHeld
	b.eng.mu.Unlock()
	if held != 0 {
		t.Fatalf("%d frames still held out of order", held)
	}
}

// TestEarlyTimeout: frames that were only slow (queued longer than the
// timeout) are not all resent: the acks of the originals overtake the
// recovery, which ends, and the window goes back to half the flight.
func TestEarlyTimeout(t *testing.T) {
	n, p := connectedManNet(t)
	a, b := n.a, n.b
	for i := range 64 {
		a.Isend(b.Addr(), uint64(i), [][]byte{make([]byte, 1000)}, nil)
	}
	slow := n.la.take() // delayed, not lost
	n.timers(a)
	n.clock.Advance(50 * time.Millisecond)
	n.timers(a)
	if !p.recovering || len(n.la.lastOut()) != minCwnd {
		t.Fatalf("after the timeout: recovering %v, %d frames resent; want true, %d", p.recovering, len(n.la.lastOut()), minCwnd)
	}
	for _, f := range slow {
		n.deliver(b, f)
	}
	n.settle(30, time.Millisecond)
	c := a.Counters()
	if p.inFlight() != 0 || p.recovering || c.Retransmits != minCwnd {
		t.Fatalf("%d frames in flight, recovering %v, %d retransmissions; want 0, false, %d", p.inFlight(), p.recovering, c.Retransmits, minCwnd)
	}
	if p.cwnd < 32 {
		t.Fatalf("cwnd %d after an early timeout; want at least half the flight, 32", p.cwnd)
	}
	if d := b.Counters().Duplicates; d != minCwnd {
		t.Fatalf("b got %d duplicates, want %d", d, minCwnd)
	}
}

// connectedManNet is a manNet whose a connected to b, and a's record of b.
func connectedManNet(t *testing.T) (*manNet, *peer) {
	n := newManNet(t, time.Hour)
	r, _ := n.a.IConnect(n.b.Addr(), 0xb, 0, nil)
	n.lockstep()
	mustComplete(t, n.a, r, Success, "connect")
	return n, n.a.peers[n.b.Addr()]
}

// TestRTOAfterStall: 64 frames in flight per round trip, each acked frame
// an RTT sample. A stall that delays a whole round trip's frames (20 ms
// against 1 ms) must keep the timeout up for the round trips after it, as
// one sample per round trip would: at per-frame gains the estimate forgot
// it within the next round trip's 64 samples, and the next stall fired
// the timeout spuriously.
func TestRTOAfterStall(t *testing.T) {
	_, p := connectedManNet(t)
	const flight = 64
	round := func(rtt time.Duration) {
		for range flight {
			p.rttSample(int64(rtt), flight)
		}
	}
	for range 50 {
		round(time.Millisecond)
	}
	if rto := time.Duration(p.rto); rto > 3*time.Millisecond {
		t.Fatalf("timeout %v after steady 1 ms round trips", rto)
	}
	round(20 * time.Millisecond)
	stalled := time.Duration(p.rto)
	round(time.Millisecond)
	after := time.Duration(p.rto)
	t.Logf("timeout %v after the stall, %v a round trip later", stalled, after)
	if after < 10*time.Millisecond {
		t.Errorf("timeout %v a round trip after a 20 ms stall: forgotten", after)
	}
	for range 30 {
		round(time.Millisecond)
	}
	if rto := time.Duration(p.rto); rto > 3*time.Millisecond {
		t.Errorf("timeout %v 30 round trips after the stall: not forgotten", rto)
	}
}

// TestOversizeHeldFrameCounted: a reliable frame longer than the link
// carries (forged: no link delivers one), arriving ahead of a gap, is
// counted and dropped, not held cut short and then taken, once the gap
// filled, as its sequence number without a message.
func TestOversizeHeldFrameCounted(t *testing.T) {
	n, _ := connectedManNet(t)
	a, b := n.a, n.b
	r0, _ := b.Irecv(0, ^uint64(0), [][]byte{make([]byte, 4000)}, nil)
	r1, _ := b.Irecv(1, ^uint64(0), [][]byte{make([]byte, 4000)}, nil)
	a.Isend(b.Addr(), 0, [][]byte{make([]byte, 10)}, nil)
	a.Isend(b.Addr(), 1, [][]byte{make([]byte, 10)}, nil)
	fs := n.la.take()
	big := make([]byte, b.eng.maxFrame()+200)
	copy(big, fs[1])
	pl := len(big) - hdrLen - eagerHdrLen
	setPayloadLen(big, pl)
	eh := eagerHdr{match: 1, msgLen: uint32(pl)}
	eh.put(big[hdrLen:])
	before := b.Counters().BadFrames
	n.deliver(b, big)   // seq 1, ahead of the gap
	n.deliver(b, fs[0]) // seq 0
	if got := b.Counters().BadFrames - before; got != 1 {
		t.Errorf("BadFrames grew by %d for the oversize frame, want 1", got)
	}
	for range 20 { // the real frame 1 comes again, after its timeout
		n.clock.Advance(5 * time.Millisecond)
		n.timers(a)
		n.lockstep()
	}
	for i, r := range []Request{r0, r1} {
		if st, ok, _ := b.Test(r); !ok || st.Code != Success || st.MsgLen != 10 {
			t.Errorf("receive %d: done %v, %v; want the 10-byte message", i, ok, st)
		}
	}
}
