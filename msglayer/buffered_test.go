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

// TestGroupWaitsForLateCompletion: a send of a group whose pull replies
// are still to be sent when its endpoint closes completes once they are
// out; a Wait on the group meanwhile waits for that completion rather
// than report ErrClosed with a request of the group still to come.
func TestGroupWaitsForLateCompletion(t *testing.T) {
	a, b, _, _ := connectedPair(t, Config{}, Config{})
	grp := b.NewGroup()
	h, err := grp.Isend(a.Addr(), 5, [][]byte{make([]byte, 1<<20)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	g := b.eng
	g.mu.Lock()
	h.r.txRefs++ // a pull reply waits to be built from the send's data
	g.mu.Unlock()
	b.Close()
	type result struct {
		st  Status
		err error
	}
	got := make(chan result, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		st, err := grp.Wait(ctx)
		got <- result{st, err}
	}()
	select {
	case r := <-got:
		t.Fatalf("Group.Wait returned %v, %v before the send's completion", r.st.Code, r.err)
	case <-time.After(50 * time.Millisecond):
	}
	g.mu.Lock()
	g.unpin(h.r) // the reply is out
	g.mu.Unlock()
	select {
	case r := <-got:
		if r.st.Code != Closed {
			t.Errorf("Group.Wait: %v, %v; want the send, closed", r.st.Code, r.err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Group.Wait did not return the send's late completion")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := grp.Wait(ctx); !errors.Is(err, ErrClosed) {
		t.Errorf("Group.Wait with nothing left: %v, want ErrClosed", err)
	}
}

// TestGroupForgottenLate: a forgotten send of a group that completes after
// its endpoint closed is the last the group waited for: a Wait on it
// returns ErrClosed then (it used to wait for a wake that never came).
func TestGroupForgottenLate(t *testing.T) {
	a, b, _, _ := connectedPair(t, Config{}, Config{})
	grp := b.NewGroup()
	h, err := grp.Isend(a.Addr(), 5, [][]byte{make([]byte, 1<<20)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	g := b.eng
	g.mu.Lock()
	h.r.txRefs++
	g.mu.Unlock()
	r := h.r
	if err := b.Forget(h); err != nil {
		t.Fatal(err)
	}
	b.Close()
	got := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		_, err := grp.Wait(ctx)
		got <- err
	}()
	time.Sleep(50 * time.Millisecond)
	g.mu.Lock()
	g.unpin(r)
	g.mu.Unlock()
	if err := <-got; !errors.Is(err, ErrClosed) {
		t.Fatalf("Group.Wait: %v, want ErrClosed", err)
	}
}

// TestGroupTwoWaitersLate: two Waits on a group, one late completion:
// one takes it, the other returns ErrClosed (it used to wait on, its wake
// taken by the first).
func TestGroupTwoWaitersLate(t *testing.T) {
	a, b, _, _ := connectedPair(t, Config{}, Config{})
	grp := b.NewGroup()
	h, err := grp.Isend(a.Addr(), 5, [][]byte{make([]byte, 1<<20)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	g := b.eng
	g.mu.Lock()
	h.r.txRefs++
	g.mu.Unlock()
	got := make(chan error, 2)
	for range 2 {
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			defer cancel()
			_, err := grp.Wait(ctx)
			got <- err
		}()
	}
	time.Sleep(50 * time.Millisecond)
	b.Close()
	time.Sleep(50 * time.Millisecond)
	g.mu.Lock()
	g.unpin(h.r)
	g.mu.Unlock()
	var errs []error
	for range 2 {
		errs = append(errs, <-got)
	}
	closed := 0
	for _, err := range errs {
		if errors.Is(err, ErrClosed) {
			closed++
		}
	}
	if closed != 2 { // the send's status is Closed too
		t.Fatalf("the two Group.Waits: %v; want the send's completion (closed) and ErrClosed", errs)
	}
}
