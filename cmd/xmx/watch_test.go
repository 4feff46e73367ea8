package main

import (
	"context"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/xmx-stack/xmx/msglayer"
	"github.com/xmx-stack/xmx/xdp"
)

// watchPair opens a server (serve) and a client on an in-memory hub
// with a one-way delay, connected, and the client's session begun.
func watchPair(t *testing.T, delay time.Duration, size int) (cl, srv *msglayer.Endpoint) {
	t.Helper()
	hub := xdp.NewHub(xdp.MemConfig{MTU: 9000, Delay: delay})
	l0, l1 := hub.Attach(), hub.Attach()
	t.Cleanup(func() { l0.Close(); l1.Close() })
	srv, err := msglayer.Open(msglayer.Config{Link: l1, EndpointID: 2, Key: 2})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	go serve(srv, 64<<20, false, io.Discard)
	cl, err = msglayer.Open(msglayer.Config{Link: l0, EndpointID: 1, Key: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cl.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := cl.Connect(ctx, srv.Addr(), 2); err != nil {
		t.Fatal(err)
	}
	if err := hello(cl, srv.Addr(), size, 1, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	return cl, srv
}

// TestWatchSparesSlowAnswers: a healthy ping-pong whose round trips take
// longer than -timeout (a large message on a slow path: 16 MiB with 15 ms
// one-way delay, about 440 ms a round trip, against 250 ms) is not ended:
// the peer is heard meanwhile (found by a review: it was ended). A shorter
// -timeout (100 ms) failed on a loaded machine under -race, the server's
// goroutines starved for that long.
func TestWatchSparesSlowAnswers(t *testing.T) {
	const size = 16 << 20
	cl, srv := watchPair(t, 15*time.Millisecond, size)
	ctx, watch := watchAnswers(cl, srv.Addr(), 250*time.Millisecond)
	defer watch.stop()
	st := time.Now()
	if _, err := pingSize(ctx, watch, cl, srv.Addr(), size, 0, 3, false, false); err != nil {
		t.Fatalf("healthy measurement ended: %v", err)
	}
	t.Logf("3 round trips: %v", time.Since(st))
}

// TestWatchEndsSilentPeer: a server that stops answering, with nothing of
// the client's in flight (its ping acked, no pong coming), ends the
// measurement within about -timeout, naming the peer.
func TestWatchEndsSilentPeer(t *testing.T) {
	cl, srv := watchPair(t, 0, 8)
	ctx, watch := watchAnswers(cl, srv.Addr(), 300*time.Millisecond)
	defer watch.stop()
	if _, err := pingSize(ctx, watch, cl, srv.Addr(), 8, 0, 10, false, false); err != nil {
		t.Fatal(err)
	}
	// The server's endpoint goes silent: a ping left now is not answered
	// (the server's Close acks what it took).
	srv.Close()
	start := time.Now()
	_, err := pingSize(ctx, watch, cl, srv.Addr(), 8, 0, 10, false, false)
	if err == nil || !strings.Contains(err.Error(), srv.Addr().String()) {
		t.Fatalf("ping-pong with a silent server: %v", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("ended after %v, with -timeout 300ms", d)
	}
}
