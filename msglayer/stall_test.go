package msglayer_test

import (
	"errors"
	"testing"
	"time"

	"github.com/xmx-stack/xmx/msglayer"
	"github.com/xmx-stack/xmx/xdp"
)

// TestStalledTransmit: a link whose transmit stops for a while (the
// kernel stops taking frames: sends wait, then fail with ErrTxStalled)
// loses nothing: the frames not sent are like lost ones, and once the
// link sends again every message of every class arrives intact, in order.
// A transmit that never comes back makes the sends complete unreachable
// within about GiveUp, and Close ends an endpoint stuck on it.
func TestStalledTransmit(t *testing.T) {
	la, lb := xdp.NewPair(xdp.MemConfig{SendWait: 20 * time.Millisecond})
	t.Cleanup(func() { la.Close(); lb.Close() })
	cfg := msglayer.Config{GiveUp: time.Second, KeepaliveInterval: 50 * time.Millisecond}
	ca, cb := cfg, cfg
	ca.Link, ca.EndpointID = la, 1
	cb.Link, cb.EndpointID = lb, 2
	a, b := openEP(t, ca), openEP(t, cb)
	ctx := ctxFor(t, 20*time.Second)
	if err := a.Connect(ctx, b.Addr(), 0); err != nil {
		t.Fatal(err)
	}

	// Tiny, small, medium and large messages, sent while a's transmit
	// is stalled for several SendWaits. The receives match anything, so
	// that each takes the message sent in its place.
	sizes := []int{0, 8, 1000, 20 << 10, 256 << 10}
	bufs := make([][]byte, len(sizes))
	var recvs, sends []msglayer.Request
	for i := range sizes {
		bufs[i] = make([]byte, 256<<10)
		r, err := b.Irecv(0, 0, [][]byte{bufs[i]}, nil)
		if err != nil {
			t.Fatal(err)
		}
		recvs = append(recvs, r)
	}
	la.StallTx(true)
	for i, n := range sizes {
		s, err := a.Isend(b.Addr(), uint64(i), [][]byte{message(i, n)}, nil)
		if err != nil {
			t.Fatal(err)
		}
		sends = append(sends, s)
	}
	time.Sleep(150 * time.Millisecond)
	if _, done, _ := a.Test(sends[0]); done {
		t.Fatal("a send completed while the link sent nothing")
	}
	la.StallTx(false)
	for i, r := range recvs {
		st, err := b.Wait(ctx, r)
		if err != nil || st.Match != uint64(i) || st.XferLen != sizes[i] {
			t.Fatalf("receive %d after the stall: %+v, %v; want message %d (%d bytes)", i, st, err, i, sizes[i])
		}
		checkMessage(t, bufs[i][:sizes[i]], i, sizes[i])
	}
	for i, s := range sends {
		if _, err := a.Wait(ctx, s); err != nil {
			t.Fatalf("send %d after the stall: %v", i, err)
		}
	}
	if s := la.Stats(); s.TxErrors == 0 {
		t.Error("the link counted no stalled send")
	}

	// A transmit that does not come back: the peer is unreachable.
	la.StallTx(true)
	start := time.Now()
	s, err := a.Isend(b.Addr(), 9, [][]byte{message(9, 100)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if st, err := a.Wait(ctx, s); !errors.Is(err, msglayer.ErrUnreachable) {
		t.Fatalf("a send over a link that sends nothing: %+v, %v; want ErrUnreachable", st, err)
	}
	if el := time.Since(start); el > 5*time.Second {
		t.Errorf("unreachable after %v, with GiveUp 1s", el)
	}
	// Close ends a pending request, with the transmit still stalled.
	r, _ := a.Irecv(10, ^uint64(0), [][]byte{make([]byte, 8)}, nil)
	closed := make(chan error, 1)
	go func() { closed <- a.Close() }()
	select {
	case <-closed:
	case <-time.After(5 * time.Second):
		t.Fatal("Close of an endpoint whose link's transmit is stalled did not return")
	}
	if st, err := a.Wait(ctx, r); !errors.Is(err, msglayer.ErrClosed) {
		t.Errorf("a receive pending at Close: %+v, %v; want ErrClosed", st, err)
	}
}
