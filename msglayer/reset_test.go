package msglayer

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/xmx-stack/xmx/xdp"
)

// connectedPair opens endpoints a (id 1) and b (id 2) on two links of one
// in-memory segment and connects them both ways.
func connectedPair(t *testing.T, ca, cb Config) (a, b *Endpoint, la, lb *xdp.MemLink) {
	t.Helper()
	hub := xdp.NewHub(xdp.MemConfig{})
	la, lb = hub.Attach(), hub.Attach()
	t.Cleanup(func() { la.Close(); lb.Close() })
	ca.Link, cb.Link = la, lb
	ca.EndpointID, cb.EndpointID = 1, 2
	ca.Key, cb.Key = 0xa, 0xb
	var err error
	if a, err = Open(ca); err != nil {
		t.Fatal(err)
	}
	if b, err = Open(cb); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close(); b.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := a.Connect(ctx, b.Addr(), 0xb); err != nil {
		t.Fatal(err)
	}
	if err := b.Connect(ctx, a.Addr(), 0xa); err != nil {
		t.Fatal(err)
	}
	return a, b, la, lb
}

// forgeFrom builds a frame of type typ from a to b with sequence number
// seq and type header th (no payload), as a would send it.
func forgeFrom(a, b *Endpoint, typ frameType, seq uint32, th []byte) []byte {
	f := make([]byte, hdrLen+typeHdrLen[typ])
	h := header{typ: typ, dstEP: b.id, srcEP: a.id, dstSession: b.session, srcSession: a.session, seq: seq}
	copy(putHeader(f, &b.eng.mac, &a.eng.mac, a.eng.ethType, &h), th)
	return f
}

// TestHeldFrameDroppedLeavesNoCopy: a frame held out of order that is then
// dropped (no room for another rendezvous record) leaves its slot. A copy
// left there used to be taken, a window later, for the frame whose sequence
// number maps to the same slot: the record was queued twice and that frame
// was lost as a "duplicate".
func TestHeldFrameDroppedLeavesNoCopy(t *testing.T) {
	const w = 8
	a, b, la, _ := connectedPair(t, Config{}, Config{Window: w})
	la.Partition(true) // only the frames forged below reach b from a
	g := b.eng
	g.mu.Lock()
	defer g.mu.Unlock()
	p := b.peers[a.Addr()]
	e0, unexp0 := p.expected, b.stats.Unexpected
	rb := make([]byte, rndvHdrLen)
	(&rndvHdr{match: 77, msgLen: 1 << 20, rndvID: 1234}).put(rb)

	b.unexpRndv = b.cfg.MaxUnexpectedRndv // no room: a record is dropped
	g.dispatch(forgeFrom(a, b, tRndv, e0+1, rb), 1)
	g.dispatch(forgeFrom(a, b, tNop, e0, nil), 1)
	if p.expected != e0+1 || p.oooCount != 0 {
		t.Fatalf("after the held record was dropped: expected +%d, %d held; want +1, 0", p.expected-e0, p.oooCount)
	}
	b.unexpRndv = 0
	g.dispatch(forgeFrom(a, b, tRndv, e0+1, rb), 1) // its retransmission, in order
	for s := e0 + 2; s != e0+2+w; s++ {
		g.dispatch(forgeFrom(a, b, tNop, s, nil), 1)
	}
	if p.expected != e0+2+w || b.stats.Unexpected-unexp0 != 1 || b.stats.Duplicates != 0 {
		t.Fatalf("expected +%d (want +%d), %d records queued (want 1), %d duplicates (want 0)",
			p.expected-e0, 2+w, b.stats.Unexpected-unexp0, b.stats.Duplicates)
	}
}

// TestResetForgottenSends: a peer reset completes each pending send once,
// also a forgotten one that holds window slots and waits in the send queue
// (completing it recycles it), and a forgotten rendezvous send; the sends
// queued behind them complete too.
func TestResetForgottenSends(t *testing.T) {
	a, b, _, lb := connectedPair(t, Config{Window: 2}, Config{})
	lb.Partition(true) // no acks: sends stay pending
	// Two frames in the window, the rest queued.
	big, err := a.Isend(b.Addr(), 1, [][]byte{make([]byte, 5*1400)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	rndv, err := a.Isend(b.Addr(), 2, [][]byte{make([]byte, 100<<10)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	small, err := a.Isend(b.Addr(), 3, [][]byte{make([]byte, 10)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	a.Forget(big)
	a.Forget(rndv)
	g := a.eng
	g.mu.Lock()
	p := a.peers[b.Addr()]
	if p.sendHead == nil {
		g.mu.Unlock()
		t.Fatal("nothing waits for the window: the test needs a queued send")
	}
	free := len(a.free)
	p.reset(Unreachable)
	recycled := map[*request]int{}
	for _, r := range a.free[free:] {
		recycled[r]++
	}
	bigR, rndvR := big.r, rndv.r
	g.mu.Unlock()
	if len(recycled) != 2 || recycled[bigR] != 1 || recycled[rndvR] != 1 {
		t.Errorf("recycled %d requests (%v); want the two forgotten sends once each", len(a.free)-free, recycled)
	}
	if p.sendHead != nil || p.rndvs != 0 || len(a.rndvs) != 0 {
		t.Errorf("after the reset: send queue empty %v, %d rendezvous with the peer, %d offered; want true, 0, 0",
			p.sendHead == nil, p.rndvs, len(a.rndvs))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if st, _ := a.Wait(ctx, small); st.Code != Unreachable {
		t.Errorf("send queued behind: %v, want %v", st.Code, Unreachable)
	}
}

// exchange sends n messages each way between a and b, matched by info
// base+i, and checks that every one arrives whole and in order.
func exchange(t *testing.T, ctx context.Context, a, b *Endpoint, base uint64, n int) {
	t.Helper()
	for _, d := range [][2]*Endpoint{{a, b}, {b, a}} {
		from, to := d[0], d[1]
		var sends, recvs []Request
		bufs := make([][]byte, n)
		for i := range n {
			bufs[i] = make([]byte, 10)
			r, err := to.Irecv(base+uint64(i), ^uint64(0), [][]byte{bufs[i]}, nil)
			if err != nil {
				t.Fatal(err)
			}
			recvs = append(recvs, r)
		}
		for i := range n {
			msg := []byte{byte(base), byte(i), 1, 2, 3, 4, 5, 6, 7, 8}
			s, err := from.Isend(to.Addr(), base+uint64(i), [][]byte{msg}, nil)
			if err != nil {
				t.Fatal(err)
			}
			sends = append(sends, s)
		}
		for i, r := range recvs {
			st, err := to.Wait(ctx, r)
			if err != nil || st.XferLen != 10 || bufs[i][0] != byte(base) || bufs[i][1] != byte(i) {
				t.Fatalf("message %d from %v: %v, %v, % x", base+uint64(i), from.Addr(), st.Code, err, bufs[i])
			}
		}
		for i, s := range sends {
			if _, err := from.Wait(ctx, s); err != nil {
				t.Fatalf("send %d to %v: %v", base+uint64(i), to.Addr(), err)
			}
		}
	}
}

// TestReconnectAfterForgetting: when one side forgets the exchange with a
// peer that did not (it gave up on it, or disconnected and the peer never
// heard), a new connect makes both agree again: messages sent after it
// arrive, none is acknowledged unseen.
func TestReconnectAfterForgetting(t *testing.T) {
	for _, how := range []string{"gave up", "disconnected unheard"} {
		t.Run(how, func(t *testing.T) {
			fast := Config{GiveUp: 300 * time.Millisecond, InitialRTO: 20 * time.Millisecond, MinRTO: 20 * time.Millisecond}
			a, b, la, lb := connectedPair(t, fast, Config{})
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			exchange(t, ctx, a, b, 10, 3)
			la.Partition(true)
			lb.Partition(true)
			switch how {
			case "gave up":
				s, err := a.Isend(b.Addr(), 99, [][]byte{make([]byte, 10)}, nil)
				if err != nil {
					t.Fatal(err)
				}
				if st, _ := a.Wait(ctx, s); st.Code != Unreachable {
					t.Fatalf("send across the cut: %v, want %v", st.Code, Unreachable)
				}
			case "disconnected unheard":
				a.Disconnect(b.Addr())
			}
			la.Partition(false)
			lb.Partition(false)
			if err := a.Connect(ctx, b.Addr(), 0xb); err != nil {
				t.Fatal(err)
			}
			exchange(t, ctx, a, b, 20, 5)
		})
	}
}

// TestHandleMisuse: a handle that is spent (ErrStaleRequest), or another
// endpoint's (ErrForeignRequest), is refused at once by Test, Wait, Cancel
// and Forget; a Get is not cancelled under way, and completes with its
// data.
func TestHandleMisuse(t *testing.T) {
	a, b, _, _ := connectedPair(t, Config{}, Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	rb, err := b.Irecv(1, ^uint64(0), [][]byte{make([]byte, 10)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := a.Test(rb); err != ErrForeignRequest {
		t.Errorf("Test of another endpoint's receive: %v, want %v", err, ErrForeignRequest)
	}
	if _, err := a.Cancel(rb); err != ErrForeignRequest {
		t.Errorf("Cancel of another endpoint's receive: %v, want %v", err, ErrForeignRequest)
	}
	if err := a.Forget(rb); err != ErrForeignRequest {
		t.Errorf("Forget of another endpoint's receive: %v, want %v", err, ErrForeignRequest)
	}
	if _, err := a.Wait(ctx, rb); err != ErrForeignRequest {
		t.Errorf("Wait on another endpoint's receive: %v, want %v", err, ErrForeignRequest)
	}
	s, err := a.Isend(b.Addr(), 1, [][]byte{make([]byte, 10)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Wait(ctx, rb); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Wait(ctx, s); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if _, err := a.Wait(ctx, s); err != ErrStaleRequest {
		t.Errorf("second Wait: %v, want %v", err, ErrStaleRequest)
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("second Wait took %v", d)
	}

	src := make([]byte, 200000)
	for i := range src {
		src[i] = byte(i)
	}
	reg, err := b.Register(src)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Connect(ctx, a.Addr(), 0xa); err != nil {
		t.Fatal(err)
	}
	dst := make([]byte, len(src))
	get, err := a.IGet(b.Addr(), reg.Mem, 0, [][]byte{dst}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := a.Cancel(get); ok || err != nil {
		t.Errorf("Cancel of a Get under way: %v, %v; want false, nil", ok, err)
	}
	if _, err := a.Wait(ctx, get); err != nil || !bytes.Equal(dst, src) {
		t.Errorf("Get after a refused Cancel: %v, data intact %v", err, bytes.Equal(dst, src))
	}
}

// TestCloseFailsLocalRendezvous: closing an endpoint completes its
// rendezvous send to another endpoint of the same process that waits,
// unmatched, in that endpoint's unexpected queue.
func TestCloseFailsLocalRendezvous(t *testing.T) {
	la, _ := xdp.NewPair(xdp.MemConfig{})
	a, err := Open(Config{Link: la, EndpointID: 1, Key: 7})
	if err != nil {
		t.Fatal(err)
	}
	b, err := Open(Config{Link: la, EndpointID: 2, Key: 7})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := a.Connect(ctx, b.Addr(), 7); err != nil {
		t.Fatal(err)
	}
	s, err := a.Isend(b.Addr(), 1, [][]byte{make([]byte, 100000)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	a.Close()
	if st, _ := a.Wait(ctx, s); st.Code != Closed {
		t.Errorf("the send after Close: %v, want %v", st.Code, Closed)
	}
	if _, ok := b.Iprobe(1, ^uint64(0)); ok {
		t.Error("its record still waits at the receiver")
	}
}

// TestShortPullReply: a pull reply shorter than the frame it stands for
// (no sender sends one; a forged or damaged frame) is counted and dropped,
// and the frame stays wanted: the pull does not end short of its data.
func TestShortPullReply(t *testing.T) {
	a, b, la, _ := connectedPair(t, Config{}, Config{})
	la.Partition(true) // a's pull requests go nowhere: the replies are forged
	buf := make([]byte, 64<<10)
	r, err := a.Irecv(1, ^uint64(0), [][]byte{buf}, nil)
	if err != nil {
		t.Fatal(err)
	}
	g := a.eng
	g.mu.Lock()
	defer g.mu.Unlock()
	a.match.removeRecv(r.r)
	a.matchedRndv(r.r, a.peers[b.Addr()], 1, uint32(len(buf)), 77, 1)
	var pl *pull
	for _, x := range a.pulls {
		pl = x
	}
	if pl == nil {
		t.Fatal("no pull started")
	}
	reply := func(n int) []byte {
		f := make([]byte, hdrLen+pullReplyHdrLen+n)
		h := header{typ: tPullReply, dstEP: a.id, srcEP: b.id, dstSession: a.session, srcSession: b.session, payloadLen: n}
		(&pullReplyHdr{pullID: pl.id}).put(putHeader(f, &a.eng.mac, &b.eng.mac, b.eng.ethType, &h))
		return f
	}
	bad := a.stats.BadFrames
	g.dispatch(reply(int(pl.frameBytes)-1), 1)
	if pl.got != 0 || a.stats.BadFrames != bad+1 {
		t.Fatalf("short reply: %d bytes taken, %d bad frames counted; want 0, 1", pl.got, a.stats.BadFrames-bad)
	}
	g.dispatch(reply(int(pl.frameBytes)), 1)
	if pl.got != pl.frameBytes {
		t.Fatalf("whole reply: %d bytes taken, want %d", pl.got, pl.frameBytes)
	}
}
