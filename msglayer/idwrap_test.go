package msglayer

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"
)

// TestWrapRndvIDCollision: rendezvous ids come from the endpoint's 32-bit
// counter (newID), shared with pulls and registrations. Once it has gone
// round (2^32 ids later) to the id of a rendezvous still waiting for its
// receiver, the new send must take the next free id, not the live one.
// The test moves the counter to just before the live id, as 2^32-1 ids
// allocated meanwhile would.
func TestWrapRndvIDCollision(t *testing.T) {
	a, b, _, _ := connectedPair(t, Config{}, Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	const n = 64 << 10 // above the rendezvous threshold
	m1 := bytes.Repeat([]byte{1}, n)
	m2 := bytes.Repeat([]byte{2}, n)
	s1, err := a.Isend(b.Addr(), 1, [][]byte{m1}, nil)
	if err != nil {
		t.Fatal(err)
	}
	// b has no receive posted: s1 waits in a.rndvs for as long as b takes.
	a.eng.mu.Lock()
	id1 := s1.r.rndvID
	a.nextID = id1 - 1 // the counter came round
	a.eng.mu.Unlock()
	s2, err := a.Isend(b.Addr(), 2, [][]byte{m2}, nil)
	if err != nil {
		t.Fatal(err)
	}
	a.eng.mu.Lock()
	id2, live := s2.r.rndvID, len(a.rndvs)
	a.eng.mu.Unlock()
	t.Logf("rndv ids: %#x and %#x; a.rndvs holds %d entries for 2 live sends", id1, id2, live)

	buf1 := make([]byte, n)
	r1, err := b.Irecv(1, ^uint64(0), [][]byte{buf1}, nil)
	if err != nil {
		t.Fatal(err)
	}
	st, err := b.Wait(ctx, r1)
	if err != nil {
		t.Fatalf("receive of message 1: %v", err)
	}
	if !bytes.Equal(buf1, m1) {
		t.Errorf("receive of message 1 (status %v, XferLen %d) holds message 2's bytes: %v", st.Code, st.XferLen, bytes.Equal(buf1, m2))
	}
	buf2 := make([]byte, n)
	r2, err := b.Irecv(2, ^uint64(0), [][]byte{buf2}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if st, err := b.Wait(ctx, r2); err != nil || !bytes.Equal(buf2, m2) {
		t.Errorf("receive of message 2: %v %v (data right: %v)", st.Code, err, bytes.Equal(buf2, m2))
	}
	wctx, wcancel := context.WithTimeout(ctx, time.Second)
	defer wcancel()
	if _, err := a.Wait(wctx, s1); err != nil {
		t.Errorf("send 1: %v", err)
	}
}

// TestWrapRequestGen: a request's 32-bit generation moves on by one at
// each use of the (recycled) request. After 2^32 uses a spent handle
// names the request again, and acts on whatever operation holds it then.
// The hook sets the generation to what 2^32-2 more uses would leave.
// TestWrapPullIDCollision: a pull id the counter comes round to while a
// pull still holds it goes to the next free one.
func TestWrapPullIDCollision(t *testing.T) {
	a, b, la, _ := connectedPair(t, Config{}, Config{GiveUp: time.Second})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	const n = 64 << 10
	m1 := bytes.Repeat([]byte{1}, n)
	m2 := bytes.Repeat([]byte{2}, n)
	for i, m := range [][]byte{m1, m2} {
		if _, err := a.Isend(b.Addr(), uint64(i+1), [][]byte{m}, nil); err != nil {
			t.Fatal(err)
		}
	}
	for { // both records unexpected at b
		_, ok1 := b.Iprobe(1, ^uint64(0))
		_, ok2 := b.Iprobe(2, ^uint64(0))
		if ok1 && ok2 {
			break
		}
		if ctx.Err() != nil {
			t.Fatal("records did not arrive")
		}
		time.Sleep(time.Millisecond)
	}
	la.Partition(true) // the pulls' requests go unanswered for now
	buf1, buf2 := make([]byte, n), make([]byte, n)
	r1, _ := b.Irecv(1, ^uint64(0), [][]byte{buf1}, nil)
	b.eng.mu.Lock()
	id1 := r1.r.pull.id
	b.nextID = id1 - 1 // the counter came round
	b.eng.mu.Unlock()
	r2, _ := b.Irecv(2, ^uint64(0), [][]byte{buf2}, nil)
	b.eng.mu.Lock()
	t.Logf("pull ids %#x and %#x; b.pulls holds %d entries for 2 pulls", id1, r2.r.pull.id, len(b.pulls))
	b.eng.mu.Unlock()
	la.Partition(false)
	st2, err2 := b.Wait(ctx, r2)
	if err2 != nil || !bytes.Equal(buf2, m2) {
		t.Errorf("receive 2: %v %v; its data is message 2's: %v (bytes of message 1 in it: %d)",
			st2.Code, err2, bytes.Equal(buf2, m2), bytes.Count(buf2, []byte{1}))
	}
	st1, err1 := b.Wait(ctx, r1)
	if err1 != nil || !bytes.Equal(buf1, m1) {
		t.Errorf("receive 1: %v %v; its data is message 1's: %v (b gave up on a %d times)", st1.Code, err1, bytes.Equal(buf1, m1), b.Counters().PeersDead)
	}
}

// TestSpentHandleStaysSpent: a handle kept after it was spent stays
// spent however often its request is reused. The test moves the
// request's generation on as 2^32 - 1 reuses would (with a 32-bit
// generation, the next use then had the spent handle's number), and
// checks that the spent handle can neither see nor cancel that use.
func TestSpentHandleStaysSpent(t *testing.T) {
	a, b, _, _ := connectedPair(t, Config{}, Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	old, err := b.Irecv(1, ^uint64(0), [][]byte{make([]byte, 8)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Cancel(old); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Wait(ctx, old); !errors.Is(err, ErrCancelled) {
		t.Fatalf("Wait of the cancelled receive: %v, want %v", err, ErrCancelled)
	}
	b.eng.mu.Lock()
	old.r.gen = old.gen + 1<<32 // 2^32 - 1 reuses after the one that spent it
	old.r.liveGen.Store(old.r.gen)
	b.eng.mu.Unlock()

	buf := make([]byte, 8)
	cur, err := b.Irecv(2, ^uint64(0), [][]byte{buf}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if cur.r != old.r {
		t.Fatal("the free list did not give back the spent request")
	}
	if _, _, err := b.Test(old); !errors.Is(err, ErrStaleRequest) {
		t.Errorf("Test of the spent handle: %v, want %v", err, ErrStaleRequest)
	}
	if ok, err := b.Cancel(old); ok || !errors.Is(err, ErrStaleRequest) {
		t.Errorf("Cancel of the spent handle: %v %v, want false %v", ok, err, ErrStaleRequest)
	}
	if err := b.Forget(old); !errors.Is(err, ErrStaleRequest) {
		t.Errorf("Forget of the spent handle: %v, want %v", err, ErrStaleRequest)
	}
	s, err := a.Isend(b.Addr(), 2, [][]byte{[]byte("current")}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if st, err := b.Wait(ctx, cur); err != nil || st.Code != Success || string(buf[:st.XferLen]) != "current" {
		t.Fatalf("the request's current use: %v %v %q", st.Code, err, buf)
	}
	if _, err := a.Wait(ctx, s); err != nil {
		t.Fatal(err)
	}
}
