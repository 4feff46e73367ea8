package msglayer

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/xmx-stack/xmx/xdp"
)

// forgeEager builds an eager fragment from a to b.
func forgeEager(a, b *Endpoint, seq uint32, match uint64, msgLen, off uint32, payload []byte) []byte {
	f := make([]byte, max(hdrLen+eagerHdrLen+len(payload), xdp.MinFrameLen))
	h := header{typ: tEager, dstEP: b.id, srcEP: a.id, dstSession: b.session, srcSession: a.session, seq: seq, payloadLen: len(payload)}
	th := putHeader(f, &b.eng.mac, &a.eng.mac, a.eng.ethType, &h)
	(&eagerHdr{match: match, msgLen: msgLen, offset: off}).put(th)
	copy(th[eagerHdrLen:], payload)
	return f
}

// TestStaleEagerAfterDroppedRndv: an eager message refused at the
// unexpected bound comes again as a rendezvous record, which is dropped
// for want of room for records. A late copy of the eager frame must still
// be refused: accepted, it took the record's sequence number, the
// sender's converted message never completed its receive, and the
// record, resent, was a duplicate.
func TestStaleEagerAfterDroppedRndv(t *testing.T) {
	a, b, la, _ := connectedPair(t, Config{}, Config{UnexpectedBytes: 1000, MaxUnexpectedRndv: 1})
	la.Partition(true) // only the forged frames reach b from a
	g := b.eng
	g.mu.Lock()
	p := b.peers[a.Addr()]
	s := p.expected
	frag0 := forgeEager(a, b, s, 5, 2000, 0, bytes.Repeat([]byte{'x'}, 1000))
	g.dispatch(frag0, 1) // 2000 bytes > the bound: refused
	if !p.refused || p.expected != s {
		g.mu.Unlock()
		t.Fatalf("eager message not refused: refused %v, expected +%d", p.refused, p.expected-s)
	}
	rb := make([]byte, rndvHdrLen)
	(&rndvHdr{match: 5, msgLen: 2000, rndvID: 99}).put(rb)
	b.unexpRndv = b.cfg.MaxUnexpectedRndv        // no room for a record
	g.dispatch(forgeFrom(a, b, tRndv, s, rb), 1) // the rendezvous version: dropped
	b.unexpRndv = 0
	g.mu.Unlock()

	r, err := b.Irecv(5, ^uint64(0), [][]byte{make([]byte, 2000)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	g.mu.Lock()
	g.dispatch(frag0, 1)                           // a late copy of the eager frame
	g.dispatch(forgeFrom(a, b, tNop, s+1, nil), 1) // the converted message's tail
	g.dispatch(forgeFrom(a, b, tRndv, s, rb), 1)   // the record, resent
	started := len(b.pulls)
	g.mu.Unlock()
	if started != 1 {
		t.Errorf("the resent record started %d pulls, want 1", started)
	}
	b.Cancel(r)
}

// TestDisconnectInHandler: an unexpected-message handler disconnects the
// sender of a message that had arrived out of order and waited in a slot.
// The disconnect used to free that frame's buffer while the handler read
// it, the next frame built reused it, and the slot count went below zero.
func TestDisconnectInHandler(t *testing.T) {
	var b *Endpoint
	var other Addr
	want := bytes.Repeat([]byte("payload!"), 100)
	var seen []byte
	handler := func(m UnexpectedMessage) HandlerAction {
		if m.Match == 66 {
			b.Disconnect(m.Source)
			// A frame built meanwhile must not take the buffer of Data.
			if _, err := b.Isend(other, 1, [][]byte{bytes.Repeat([]byte{'Z'}, 800)}, nil); err != nil {
				panic(err)
			}
			seen = append([]byte(nil), m.Data...)
		}
		return Continue
	}
	a, bb, la, _ := connectedPair(t, Config{}, Config{UnexpectedHandler: handler})
	b = bb
	lc := la.Hub().Attach()
	t.Cleanup(func() { lc.Close() })
	c := openT(t, Config{Link: lc, EndpointID: 3, Key: 0xc})
	other = c.Addr()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := b.Connect(ctx, other, 0xc); err != nil {
		t.Fatal(err)
	}
	la.Partition(true)
	g := b.eng
	g.mu.Lock()
	p := b.peers[a.Addr()]
	s := p.expected
	// As the driver does inside RecvVisit: frames queued meanwhile are
	// flushed after the batch.
	g.visiting, g.dispatching = true, true
	g.dispatch(forgeEager(a, b, s+1, 66, uint32(len(want)), 0, want), 1) // held out of order
	g.dispatch(forgeFrom(a, b, tNop, s, nil), 1)                         // fills the hole: the held frame goes to the handler
	g.visiting, g.dispatching = false, false
	ooo, queued := p.oooCount, b.match.probe(66, ^uint64(0)) != nil
	g.flushAndUnlock()
	if !bytes.Equal(seen, want) {
		t.Errorf("the handler's Data changed under it: %.32q", seen)
	}
	if ooo != 0 || queued {
		t.Errorf("after the disconnect: %d frames held (want 0), message queued %v (want dropped with the exchange)", ooo, queued)
	}
}

// TestHandlerOncePerMessage: an eager message refused at the unexpected
// bound, whose sender converts it, and a rendezvous record dropped at the
// record bound and resent, each reach the handler once.
func TestHandlerOncePerMessage(t *testing.T) {
	calls := map[uint64]int{}
	handler := func(m UnexpectedMessage) HandlerAction { calls[m.Match]++; return Continue }
	a, b, la, _ := connectedPair(t, Config{}, Config{UnexpectedBytes: 1000, MaxUnexpectedRndv: 1, UnexpectedHandler: handler})
	la.Partition(true)
	g := b.eng
	g.mu.Lock()
	defer g.mu.Unlock()
	p := b.peers[a.Addr()]
	s := p.expected
	g.dispatch(forgeEager(a, b, s, 5, 1200, 0, bytes.Repeat([]byte{'x'}, 1200)), 1) // refused
	rb := make([]byte, rndvHdrLen)
	(&rndvHdr{match: 5, msgLen: 1200, rndvID: 98}).put(rb)
	g.dispatch(forgeFrom(a, b, tRndv, s, rb), 1) // its rendezvous version: queued
	(&rndvHdr{match: 6, msgLen: 1 << 20, rndvID: 99}).put(rb)
	for range 3 { // no room for a second record: dropped, resent
		g.dispatch(forgeFrom(a, b, tRndv, s+1, rb), 1)
	}
	if calls[5] != 1 || calls[6] != 0 {
		t.Errorf("handler calls: %d for the converted message (want 1), %d for the record with no room (want 0 until there is room)", calls[5], calls[6])
	}
	if p.expected != s+1 {
		t.Errorf("expected +%d, want +1", p.expected-s)
	}
}

// TestSenderGoneMidMessage: the first fragment of an eager message
// reaches b and matches a receive; the sender restarts before the rest
// comes. b waits on a for nothing else, and its receive used to wait for
// ever: the timers now watch a peer whose message is incomplete, and the
// keepalive finds it gone.
func TestSenderGoneMidMessage(t *testing.T) {
	a, b, la, _ := connectedPair(t, Config{}, Config{GiveUp: 300 * time.Millisecond, KeepaliveInterval: 50 * time.Millisecond})
	r, err := b.Irecv(5, ^uint64(0), [][]byte{make([]byte, 3000)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	g := b.eng
	g.mu.Lock()
	p := b.peers[a.Addr()]
	g.dispatch(forgeEager(a, b, p.expected, 5, 3000, 0, make([]byte, 1000)), g.readClock())
	active := p.in.active
	g.flushAndUnlock()
	if !active {
		t.Fatal("the first fragment did not start a message")
	}
	a.Close()
	openT(t, Config{Link: la, EndpointID: a.id, Key: a.cfg.Key})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	st, err := b.Wait(ctx, r)
	if st.Code == Success {
		t.Fatalf("the receive of a message whose sender restarted: %v (%v)", st.Code, err)
	}
	t.Logf("receive: %v", st.Code)
}
