package msglayer

import (
	"bytes"
	"testing"
)

// Frames no sender sends, with the right addresses, sessions and
// sequence numbers (a fuzzPair's), handed to the receiving engine as its
// link would: each is counted, and the message under way is unharmed.

// forgedFrame builds a frame of type t from from to to with the pair's
// ids, sequence number seq, type header th and payload.
func forgedFrame(fp *fuzzPair, to, from *Endpoint, t frameType, seq uint32, th, payload []byte) []byte {
	dstID, _ := fp.ids(to)
	srcID, _ := fp.ids(from)
	h := header{typ: t, dstEP: to.id, srcEP: from.id, dstSession: dstID, srcSession: srcID, seq: seq, payloadLen: len(payload)}
	f := make([]byte, max(hdrLen+len(th)+len(payload), 60))
	putHeader(f, &to.eng.mac, &from.eng.mac, to.eng.ethType, &h)
	copy(f[hdrLen:], th)
	copy(f[hdrLen+len(th):], payload)
	return f
}

func forgedEager(fp *fuzzPair, to, from *Endpoint, seq uint32, match uint64, msgLen, off uint32, payload []byte) []byte {
	th := make([]byte, eagerHdrLen)
	(&eagerHdr{match: match, msgLen: msgLen, offset: off}).put(th)
	return forgedFrame(fp, to, from, tEager, seq, th, payload)
}

// handOver hands f to to's engine and returns to's counters after it.
func handOver(to *Endpoint, f []byte) Counters {
	g := to.eng
	g.mu.Lock()
	g.dispatch(exact(f), g.clock.Now())
	g.settleAcks()
	st := to.stats
	g.flushAndUnlock()
	return st
}

// expectedSeq returns to's next expected sequence number from from.
func expectedSeq(to, from *Endpoint) uint32 {
	g := to.eng
	g.mu.Lock()
	defer g.mu.Unlock()
	return to.peers[from.addr].expected
}

// TestForgedFragmentsCounted: an eager fragment that does not continue the
// message being reassembled is counted bad (it was dropped uncounted), and
// the message completes intact once its true fragment comes.
func TestForgedFragmentsCounted(t *testing.T) {
	for _, noPredict := range []bool{false, true} {
		fp := newFuzzPair(t, 0, false, noPredict)
		a, b := fp.a, fp.b
		buf := bytes.Repeat([]byte{0xee}, 300)
		rr, err := b.Irecv(0x77, ^uint64(0), [][]byte{buf}, nil)
		if err != nil {
			t.Fatal(err)
		}
		seq := expectedSeq(b, a)
		handOver(b, forgedEager(fp, b, a, seq, 0x77, 200, 0, bytes.Repeat([]byte{0x11}, 100)))
		seq++
		for _, c := range []struct {
			why         string
			match       uint64
			msgLen, off uint32
			n           int
		}{
			{"another length", 0x77, 250, 100, 100},
			{"another match", 0x99, 200, 100, 100},
			{"bytes already received", 0x77, 200, 50, 50},
			{"bytes past them", 0x77, 200, 150, 50},
		} {
			before := countersOf(b)
			after := handOver(b, forgedEager(fp, b, a, seq, c.match, c.msgLen, c.off, bytes.Repeat([]byte{0x22}, c.n)))
			seq++
			if after.BadFrames != before.BadFrames+1 {
				t.Errorf("noPredict %v: a fragment of %s: %d bad frames counted, want 1", noPredict, c.why, after.BadFrames-before.BadFrames)
			}
		}
		handOver(b, forgedEager(fp, b, a, seq, 0x77, 200, 100, bytes.Repeat([]byte{0x44}, 100)))
		st, done, err := b.Test(rr)
		want := append(append(bytes.Repeat([]byte{0x11}, 100), bytes.Repeat([]byte{0x44}, 100)...), bytes.Repeat([]byte{0xee}, 100)...)
		if err != nil || !done || st.Code != Success || st.XferLen != 200 || !bytes.Equal(buf, want) {
			t.Fatalf("noPredict %v: the message after the forged fragments: done %v, %+v, %v; buffer % x", noPredict, done, st, err, buf)
		}
	}
}

// TestForgedNotifyCounted: a notify for a rendezvous never offered is
// counted bad (it was dropped uncounted).
func TestForgedNotifyCounted(t *testing.T) {
	fp := newFuzzPair(t, 0, false, false)
	a, b := fp.a, fp.b
	th := make([]byte, notifyHdrLen)
	(&notifyHdr{rndvID: 0xdeadbeef, xferLen: 10, code: Success}).put(th)
	before := countersOf(b)
	after := handOver(b, forgedFrame(fp, b, a, tNotify, expectedSeq(b, a), th, nil))
	if after.BadFrames != before.BadFrames+1 {
		t.Errorf("a notify for no rendezvous: %d bad frames counted, want 1", after.BadFrames-before.BadFrames)
	}
}

func countersOf(e *Endpoint) Counters {
	g := e.eng
	g.mu.Lock()
	defer g.mu.Unlock()
	return e.stats
}

// TestForgedMoveOnAbandons: a message under way that its sender leaves
// for another kind of frame (no sender does: its fragments follow one
// another) can never complete. Its receive completes Aborted at once
// instead of waiting for the peer's next eager message, and the next
// message is taken the fast way again.
func TestForgedMoveOnAbandons(t *testing.T) {
	for _, next := range []frameType{tNop, tRndv, tNotify} {
		fp := newFuzzPair(t, 0, false, false)
		a, b := fp.a, fp.b
		buf := make([]byte, 300)
		rr, err := b.Irecv(0x77, ^uint64(0), [][]byte{buf}, nil)
		if err != nil {
			t.Fatal(err)
		}
		seq := expectedSeq(b, a)
		handOver(b, forgedEager(fp, b, a, seq, 0x77, 200, 0, bytes.Repeat([]byte{0x11}, 100)))
		var th []byte
		switch next {
		case tRndv:
			th = make([]byte, rndvHdrLen)
			(&rndvHdr{match: 0x55, msgLen: 5000, rndvID: 9}).put(th)
		case tNotify:
			th = make([]byte, notifyHdrLen)
			(&notifyHdr{rndvID: 0xdeadbeef, code: Success}).put(th)
		}
		handOver(b, forgedFrame(fp, b, a, next, seq+1, th, nil))
		st, done, err := b.Test(rr)
		if err != nil || !done || st.Code != Aborted {
			t.Errorf("%v after a message's first fragment: its receive done %v, %+v, %v; want Aborted", next, done, st, err)
		}
		r2, err := b.Irecv(0x78, ^uint64(0), [][]byte{make([]byte, 8)}, nil)
		if err != nil {
			t.Fatal(err)
		}
		before := countersOf(b)
		after := handOver(b, forgedEager(fp, b, a, seq+2, 0x78, 8, 0, make([]byte, 8)))
		if st, done, _ := b.Test(r2); !done || st.Code != Success {
			t.Errorf("%v: the next message: done %v, %+v", next, done, st)
		}
		if after.Predicted != before.Predicted+1 {
			t.Errorf("%v: the next message was not predicted (the abandoned one still held the peer)", next)
		}
	}
}

// TestForgedRefusedSeqEnds: once the frame at a refused eager message's
// sequence number is taken, whatever it is, the refusal ends: a refusal
// left standing kept the peer off the fast path, and would refuse an
// eager message at that sequence number 2^32 frames later.
func TestForgedRefusedSeqEnds(t *testing.T) {
	fp := newFuzzPair(t, 0, false, false)
	a, b := fp.a, fp.b
	g := b.eng
	g.mu.Lock()
	p := b.peers[a.addr]
	seq := p.expected
	p.refused, p.refusedSeq = true, seq
	g.mu.Unlock()
	handOver(b, forgedFrame(fp, b, a, tNop, seq, nil, nil))
	g.mu.Lock()
	refused := p.refused
	g.mu.Unlock()
	if refused {
		t.Errorf("a no-op at the refused sequence number %d left the refusal standing", seq)
	}
}

// TestForgedRegionNackSparesRendezvous: a bad-region nack names a Get's
// pull (only a Get pulls from a region). One naming the id of a pull from
// a rendezvous send is counted, and the pull goes on (before, it ended
// with BadRegion).
func TestForgedRegionNackSparesRendezvous(t *testing.T) {
	fp := newFuzzPair(t, 0, false, false)
	a, b := fp.a, fp.b
	rr, err := b.Irecv(0x31, ^uint64(0), [][]byte{make([]byte, 100000)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	th := make([]byte, rndvHdrLen)
	(&rndvHdr{match: 0x31, msgLen: 100000, rndvID: 7}).put(th)
	handOver(b, forgedFrame(fp, b, a, tRndv, expectedSeq(b, a), th, nil))
	g := b.eng
	g.mu.Lock()
	var id uint32
	n := 0
	for k := range b.pulls {
		id, n = k, n+1
	}
	g.mu.Unlock()
	if n != 1 {
		t.Fatalf("%d pulls after a matched rendezvous record, want 1", n)
	}
	nk := make([]byte, nackHdrLen)
	_, srcID := fp.ids(b)
	putNack(nk, id, nackBadRegion, srcID)
	before := countersOf(b)
	after := handOver(b, forgedFrame(fp, b, a, tNack, 0, nk, nil))
	if after.BadFrames != before.BadFrames+1 {
		t.Errorf("a bad-region nack for a rendezvous pull: %d bad frames counted, want 1", after.BadFrames-before.BadFrames)
	}
	if st, done, _ := b.Test(rr); done {
		t.Errorf("a bad-region nack ended a rendezvous pull: %+v", st)
	}
}
