package msglayer

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/xmx-stack/xmx/xdp"
)

// TestWaitAnyOwnWakeups: two goroutines in WaitAny for different match
// infos while a third drives the link: a completion for one wakes it,
// whatever the other does. (They shared one wake-up, which the other
// could take and keep.)
func TestWaitAnyOwnWakeups(t *testing.T) {
	a, b, _, _ := connectedPair(t, Config{}, Config{})
	long, cancelLong := context.WithCancel(context.Background())
	defer cancelLong()
	never, err := b.Irecv(999, ^uint64(0), [][]byte{make([]byte, 8)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	go b.Wait(long, never) // the driver
	time.Sleep(20 * time.Millisecond)
	for i := range 20 {
		other, cancelOther := context.WithCancel(context.Background())
		otherDone := make(chan struct{})
		go func() { b.WaitAny(other, 2, ^uint64(0)); close(otherDone) }()
		mine := make(chan error, 1)
		go func() { _, err := b.WaitAny(context.Background(), 1, ^uint64(0)); mine <- err }()
		time.Sleep(5 * time.Millisecond)
		if _, err := b.Irecv(1, ^uint64(0), [][]byte{make([]byte, 8)}, nil); err != nil {
			t.Fatal(err)
		}
		s, err := a.Isend(b.Addr(), 1, [][]byte{make([]byte, 8)}, nil)
		if err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-mine:
			if err != nil {
				t.Fatalf("round %d: WaitAny: %v", i, err)
			}
		case <-time.After(2 * time.Second):
			t.Fatalf("round %d: WaitAny missed its completion", i)
		}
		cancelOther()
		<-otherDone
		a.Wait(context.Background(), s)
	}
}

// TestCloseWakesAnyWaiters: Close ends WaitAny, Peek and Probe at once,
// also with nothing pending and the engine kept open by another endpoint.
func TestCloseWakesAnyWaiters(t *testing.T) {
	l, _ := xdp.NewPair(xdp.MemConfig{})
	e1, err := Open(Config{Link: l, EndpointID: 1})
	if err != nil {
		t.Fatal(err)
	}
	e2, err := Open(Config{Link: l, EndpointID: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer e2.Close()
	ctx := context.Background()
	res := make(chan error, 3)
	go func() { _, err := e1.Probe(ctx, 0, 0); res <- err }()
	go func() { _, err := e1.WaitAny(ctx, 0, 0); res <- err }()
	go func() { _, err := e1.Peek(ctx); res <- err }()
	time.Sleep(50 * time.Millisecond)
	e1.Close()
	for i := range 3 {
		select {
		case err := <-res:
			if !errors.Is(err, ErrClosed) {
				t.Errorf("a waiter ended with %v, want %v", err, ErrClosed)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("%d of 3 waiters still blocked after Close", 3-i)
		}
	}
	if _, err := e1.WaitAny(ctx, 0, 0); !errors.Is(err, ErrClosed) {
		t.Errorf("WaitAny after Close: %v, want %v", err, ErrClosed)
	}
}
