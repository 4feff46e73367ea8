package msglayer

import (
	"context"
	"testing"
	"time"
)

// TestIbufferedWhileRepliesPinned checks that Ibuffered keeps a large
// send's buffer taken while pull replies to be built from it wait to be
// sent, even once the receiver's notify has come: a late pull request
// and the notify in one batch of frames used to let Ibuffered say true
// while the flush still had replies to build from the buffer.
func TestIbufferedWhileRepliesPinned(t *testing.T) {
	a, b, la, _ := connectedPair(t, Config{}, Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	data := make([]byte, 1<<20)
	h, err := b.Isend(a.Addr(), 5, [][]byte{data}, nil)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(20 * time.Millisecond) // the record is at a, unexpected
	la.Partition(true)                // a hears nothing more

	g := b.eng
	g.mu.Lock()
	p := b.peers[a.Addr()]
	r := h.r
	fb := uint32(p.pullPayload())
	// A pull request of a's (a late one, say), then its notify, handled
	// in one batch: the replies wait in the transmit queue, built from
	// the send's buffer at the flush.
	prq := make([]byte, hdrLen+pullReqHdrLen)
	hh := header{typ: tPullReq, dstEP: b.id, srcEP: a.id, dstSession: p.localID, srcSession: p.remoteID}
	(&pullReqHdr{rndvID: r.rndvID, pullID: 99, offset: 0, length: fb * 32, mask: ^uint32(0), frameBytes: fb}).put(
		putHeader(prq, &g.mac, &a.eng.mac, g.ethType, &hh))
	g.dispatch(prq, g.readClock())
	nf := make([]byte, hdrLen+notifyHdrLen)
	hn := header{typ: tNotify, dstEP: b.id, srcEP: a.id, dstSession: p.localID, srcSession: p.remoteID, seq: p.expected, ack: p.nextSeq}
	(&notifyHdr{rndvID: r.rndvID, xferLen: uint32(len(data)), code: Success}).put(putHeader(nf, &g.mac, &a.eng.mac, g.ethType, &hn))
	g.dispatch(nf, g.readClock())
	pinned := r.txRefs
	g.mu.Unlock() // no flush yet

	if pinned == 0 {
		t.Fatal("no pull reply waits to be built from the send: the test sets up nothing")
	}
	if ok, err := b.Ibuffered(h); ok || err != nil {
		t.Errorf("Ibuffered with %d pull replies still to be built from the buffer: %v, %v; want false", pinned, ok, err)
	}
	if st, err := b.Wait(ctx, h); err != nil || st.XferLen != len(data) {
		t.Errorf("the send: %+v, %v", st, err)
	}
}
