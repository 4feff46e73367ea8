package msglayer_test

import (
	"bytes"
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/xmx-stack/xmx/msglayer"
	"github.com/xmx-stack/xmx/xdp"
)

// TestRecvWindow: six senders each send a burst of 40 one-frame messages
// to one receiver whose link holds 96 frames, in flight included: the
// link's delay keeps every frame in its queue for 30 ms, so that the
// bursts overlap however slowly the senders go (-race). The senders'
// timeouts are far longer than the round trip: no frame is resent. The receiver says a
// window of 48/6 = 8 frames to each (its budget set to 48), the senders
// keep to it, and the link drops nothing; without the window the bursts
// (240 frames) overrun the link and it drops. Every message arrives
// intact either way.
func TestRecvWindow(t *testing.T) {
	for _, tc := range []struct {
		name   string
		budget int
	}{{"window", 48}, {"none", -1}} {
		t.Run(tc.name, func(t *testing.T) {
			drops, held, said := recvWindowBurst(t, tc.budget)
			t.Logf("receiver link drops %d, sends held by the window %d, windows said %v", drops, held, said)
			if tc.budget < 0 {
				if drops == 0 {
					t.Errorf("no frame dropped without a window: the test no longer overruns the link")
				}
				return
			}
			if drops != 0 {
				t.Errorf("the receiver's link dropped %d frames", drops)
			}
			if held == 0 {
				t.Errorf("no send waited for the receive window")
			}
			for i, w := range said {
				if w != 8 {
					t.Errorf("sender %d: receive window %d, want 8", i, w)
				}
			}
		})
	}
}

// recvWindowBurst runs TestRecvWindow's exchange with the receiver's
// RecvBudget budget and returns the frames its link dropped during the
// bursts, the senders' WindowHeld and the windows they had from it before.
func recvWindowBurst(t *testing.T, budget int) (drops, held uint64, said []int) {
	const senders, msgs, size = 6, 40, 1000
	hub := xdp.NewHub(xdp.MemConfig{QueueLen: 96, Delay: 30 * time.Millisecond})
	rl := hub.Attach()
	t.Cleanup(func() { rl.Close() })
	rx := openEP(t, msglayer.Config{Link: rl, EndpointID: 1, Key: 1, RecvBudget: budget})
	ctx := ctxFor(t, 30*time.Second)
	tx := make([]*msglayer.Endpoint, senders)
	for i := range tx {
		l := hub.Attach()
		t.Cleanup(func() { l.Close() })
		tx[i] = openEP(t, msglayer.Config{Link: l, EndpointID: 2, Key: 2,
			InitialRTO: time.Second, MinRTO: 500 * time.Millisecond})
		if err := tx[i].Connect(ctx, rx.Addr(), 1); err != nil {
			t.Fatal(err)
		}
	}
	// Two rounds of one message from each: the second's acks say the
	// window for all six.
	for round := range 2 {
		burstAll(t, ctx, tx, rx, 1, size, uint64(round)<<32)
	}
	for _, e := range tx {
		said = append(said, e.Peers()[0].RecvWin)
	}
	before := rl.Stats().QueueDrops
	burstAll(t, ctx, tx, rx, msgs, size, 2<<32)
	for _, e := range tx {
		held += e.Counters().WindowHeld
	}
	return rl.Stats().QueueDrops - before, held, said
}

// burstAll has every sender send n messages of size bytes at once
// (match base + sender<<16 + i), receives them all at rx, checks each
// payload, and waits for the sends.
func burstAll(t *testing.T, ctx context.Context, tx []*msglayer.Endpoint, rx *msglayer.Endpoint, n, size int, base uint64) {
	t.Helper()
	payload := func(s, i int) []byte {
		return bytes.Repeat([]byte(fmt.Sprintf("%d/%d.", s, i)), size)[:size]
	}
	var sends [][]msglayer.Request
	for s, e := range tx {
		var rs []msglayer.Request
		for i := range n {
			r, err := e.Isend(rx.Addr(), base+uint64(s)<<16+uint64(i), [][]byte{payload(s, i)}, nil)
			if err != nil {
				t.Fatal(err)
			}
			rs = append(rs, r)
		}
		sends = append(sends, rs)
	}
	buf := make([]byte, size)
	for s := range tx {
		for i := range n {
			r, err := rx.Irecv(base+uint64(s)<<16+uint64(i), ^uint64(0), [][]byte{buf}, nil)
			if err != nil {
				t.Fatal(err)
			}
			st, err := rx.Wait(ctx, r)
			if err != nil {
				t.Fatalf("receive %d from sender %d: %v", i, s, err)
			}
			if st.XferLen != size || !bytes.Equal(buf, payload(s, i)) {
				t.Fatalf("message %d from sender %d: %d bytes, not what was sent", i, s, st.XferLen)
			}
		}
	}
	for s, rs := range sends {
		for i, r := range rs {
			if _, err := tx[s].Wait(ctx, r); err != nil {
				t.Fatalf("send %d of sender %d: %v", i, s, err)
			}
		}
	}
}

// TestRecvWindowShrinkSaid: six senders connect to a receiver with a
// budget of 48 frames, one after the other, and send nothing. Each
// connect reply says the share at the time (48, 24, 16, 12, 9, 8): the
// first to connect were said large windows. As the share halves, the
// receiver tells them at once in an explicit ack, so that each ends up
// with a window at most twice the last share (16), the first one's
// included, which no other frame from the receiver could have told.
func TestRecvWindowShrinkSaid(t *testing.T) {
	const senders = 6
	ctx := ctxFor(t, 30*time.Second)
	hub := xdp.NewHub(xdp.MemConfig{})
	rl := hub.Attach()
	t.Cleanup(func() { rl.Close() })
	rx := openEP(t, msglayer.Config{Link: rl, EndpointID: 1, Key: 1, RecvBudget: 48})
	// The connects must come within the span over which a sender counts
	// (100 ms): a slow run (-race on a loaded machine) tries again with
	// new senders, once the first ones have stopped counting.
	var tx []*msglayer.Endpoint
	for attempt := 1; ; attempt++ {
		tx = tx[:0]
		start := time.Now()
		for i := range senders {
			l := hub.Attach()
			t.Cleanup(func() { l.Close() })
			e := openEP(t, msglayer.Config{Link: l, EndpointID: uint8(2 + i), Key: 2})
			if err := e.Connect(ctx, rx.Addr(), 1); err != nil {
				t.Fatal(err)
			}
			tx = append(tx, e)
		}
		if time.Since(start) < 60*time.Millisecond {
			break
		}
		if attempt == 5 {
			t.Fatalf("6 connects took %v, 5 times: too slow to count as one crowd", time.Since(start))
		}
		time.Sleep(200 * time.Millisecond)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		var wins []int
		ok := true
		for _, e := range tx {
			w := e.Peers()[0].RecvWin
			wins = append(wins, w)
			ok = ok && w > 0 && w <= 16
		}
		if ok {
			t.Logf("windows the senders have: %v", wins)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("windows the senders have: %v; want each in 1..16", wins)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
