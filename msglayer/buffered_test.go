package msglayer

import (
	"context"
	"errors"
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

// lateGroupSend opens a connected pair and sends a large message from b
// through a new group, with a pull reply held as waiting to be built from
// the send's data (txRefs): closed now, the send completes only once the
// test unpins it, as after a flush under way.
func lateGroupSend(t *testing.T) (b *Endpoint, grp *Group, r *request) {
	a, b, _, _ := connectedPair(t, Config{}, Config{})
	grp = b.NewGroup()
	h, err := grp.Isend(a.Addr(), 5, [][]byte{make([]byte, 1<<20)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	b.eng.mu.Lock()
	h.r.txRefs++
	b.eng.mu.Unlock()
	return b, grp, h.r
}

// unpinLate lets r's held pull reply go (lateGroupSend).
func unpinLate(b *Endpoint, r *request) {
	b.eng.mu.Lock()
	b.eng.unpin(r)
	b.eng.mu.Unlock()
}

// groupResult is what a Group.Wait returned.
type groupResult struct {
	st  Status
	err error
}

// theSend reports whether the Wait returned lateGroupSend's send, closed.
func (r groupResult) theSend() bool { return r.st.Code == Closed && r.st.Match == 5 }

// over reports whether the Wait returned ErrClosed: the group is over.
func (r groupResult) over() bool { return r.st == (Status{}) && errors.Is(r.err, ErrClosed) }

// groupWait runs grp.Wait with a timeout in a goroutine of its own; the
// channel gets its result.
func groupWait(grp *Group, timeout time.Duration) <-chan groupResult {
	got := make(chan groupResult, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		st, err := grp.Wait(ctx)
		got <- groupResult{st, err}
	}()
	return got
}

// TestGroupWaitsForLateCompletion: a send of a group whose pull replies
// are still to be sent when its endpoint closes completes once they are
// out; a Wait on the group meanwhile waits for that completion rather
// than report ErrClosed with a request of the group still to come.
func TestGroupWaitsForLateCompletion(t *testing.T) {
	b, grp, r := lateGroupSend(t)
	b.Close()
	got := groupWait(grp, 10*time.Second)
	select {
	case res := <-got:
		t.Fatalf("Group.Wait returned %+v before the send's completion", res)
	case <-time.After(50 * time.Millisecond):
	}
	unpinLate(b, r) // the reply is out
	select {
	case res := <-got:
		if !res.theSend() {
			t.Errorf("Group.Wait: %+v; want the send's status, closed", res)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Group.Wait did not return the send's late completion")
	}
	if res := <-groupWait(grp, 5*time.Second); !res.over() {
		t.Errorf("Group.Wait with nothing left: %+v, want ErrClosed", res)
	}
}

// TestGroupForgottenLate: a forgotten send of a group that completes after
// its endpoint closed is the last the group waited for: a Wait on it
// returns ErrClosed then (it used to wait for a wake that never came).
func TestGroupForgottenLate(t *testing.T) {
	b, grp, r := lateGroupSend(t)
	if err := b.Forget(Request{r, r.gen}); err != nil {
		t.Fatal(err)
	}
	b.Close()
	got := groupWait(grp, 3*time.Second)
	time.Sleep(50 * time.Millisecond)
	unpinLate(b, r)
	if res := <-got; !res.over() {
		t.Fatalf("Group.Wait: %+v, want ErrClosed", res)
	}
}

// TestGroupTwoWaitersLate: two Waits on a group, one late completion:
// one takes it, the other returns ErrClosed (it used to wait on, its wake
// taken by the first).
func TestGroupTwoWaitersLate(t *testing.T) {
	b, grp, r := lateGroupSend(t)
	got := []<-chan groupResult{groupWait(grp, 3*time.Second), groupWait(grp, 3*time.Second)}
	time.Sleep(50 * time.Millisecond)
	b.Close()
	time.Sleep(50 * time.Millisecond)
	unpinLate(b, r)
	var res []groupResult
	sends, over := 0, 0
	for _, c := range got {
		r := <-c
		res = append(res, r)
		if r.theSend() {
			sends++
		} else if r.over() {
			over++
		}
	}
	if sends != 1 || over != 1 {
		t.Fatalf("the two Group.Waits: %+v; want the send's completion (closed) and ErrClosed", res)
	}
}
