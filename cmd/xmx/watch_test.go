package main

import (
	"bytes"
	"context"
	"errors"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/xmx-stack/xmx/msglayer"
	"github.com/xmx-stack/xmx/xdp"
)

// servePair opens a server (serve, with maxSize and maxRecvBytes,
// logging to log) and a client on an in-memory hub with a one-way delay,
// connected.
func servePair(t *testing.T, delay time.Duration, maxSize, maxRecvBytes int, log io.Writer) (cl, srv *msglayer.Endpoint) {
	t.Helper()
	hub := xdp.NewHub(xdp.MemConfig{MTU: 9000, Delay: delay})
	l0, l1 := hub.Attach(), hub.Attach()
	t.Cleanup(func() { l0.Close(); l1.Close() })
	return servePairOn(t, l0, l1, maxSize, maxRecvBytes, log)
}

// servePairOn is servePair on given links: the client on l0, the server
// on l1.
func servePairOn(t *testing.T, l0, l1 xdp.Link, maxSize, maxRecvBytes int, log io.Writer) (cl, srv *msglayer.Endpoint) {
	t.Helper()
	srv = openOn(t, l1, 2)
	go serve(srv, maxSize, maxRecvBytes, false, log)
	cl = openOn(t, l0, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := cl.Connect(ctx, srv.Addr(), 2); err != nil {
		t.Fatal(err)
	}
	return cl, srv
}

// openOn opens endpoint id, with key id, on l, closed at the test's end.
func openOn(t *testing.T, l xdp.Link, id uint8) *msglayer.Endpoint {
	t.Helper()
	e, err := msglayer.Open(msglayer.Config{Link: l, EndpointID: id, Key: uint32(id)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

// sessionOnHub opens a server taking maxSize and a client on a fresh hub
// without faults (MTU 1500), begins a session of 8-byte messages, and
// returns the server's link too, for the test to cut or reuse.
func sessionOnHub(t *testing.T, maxSize int) (cl, srv *msglayer.Endpoint, l1 *xdp.MemLink) {
	t.Helper()
	hub := xdp.NewHub(xdp.MemConfig{})
	l0, l1 := hub.Attach(), hub.Attach()
	t.Cleanup(func() { l0.Close(); l1.Close() })
	cl, srv = servePairOn(t, l0, l1, maxSize, defaultMaxRecvBytes, io.Discard)
	if err := hello(cl, srv.Addr(), 8, 1, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	return cl, srv, l1
}

// watchPair is servePair's pair with the server's default bounds, and
// the client's session begun.
func watchPair(t *testing.T, delay time.Duration, size int) (cl, srv *msglayer.Endpoint) {
	t.Helper()
	cl, srv = servePair(t, delay, 64<<20, defaultMaxRecvBytes, io.Discard)
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

// TestWatchEndsCutPeer: a server cut off the segment (nothing of it
// heard, a ping in flight) ends the measurement after -timeout, not
// before, as unreachable, well before msglayer gives the peer up.
func TestWatchEndsCutPeer(t *testing.T) {
	cl, srv, l1 := sessionOnHub(t, 64<<20)
	const timeout = 300 * time.Millisecond
	wctx, watch := watchAnswers(cl, srv.Addr(), timeout)
	defer watch.stop()
	if _, err := pingSize(wctx, watch, cl, srv.Addr(), 8, 0, 10, false, false); err != nil {
		t.Fatal(err)
	}
	l1.Partition(true)
	start := time.Now()
	_, err := pingSize(wctx, watch, cl, srv.Addr(), 8, 0, 10, false, false)
	d := time.Since(start)
	if err == nil || !strings.Contains(err.Error(), "-timeout") {
		t.Fatalf("ping-pong with a cut server: %v", err)
	}
	if err := context.Cause(wctx); !errors.Is(err, msglayer.ErrUnreachable) {
		t.Errorf("watch ended with %v, want ErrUnreachable", err)
	}
	if d < timeout || d > 5*time.Second {
		t.Errorf("ended after %v, with -timeout %v", d, timeout)
	}
}

// lockedBuffer is a buffer that a server goroutine writes and a test reads.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestServeBoundsReceives: a session whose receives, window + 4 of its
// largest size, would pass the server's -max-recv-bytes is refused, and
// the client says which flags to change, as a usage error marked as the
// server's (no hint at its own -h) (found by a review: xmx stream
// -window 256 -sizes 16M made the server post 4 GiB of buffers); a
// smaller session then runs.
func TestServeBoundsReceives(t *testing.T) {
	var log lockedBuffer
	cl, srv := servePair(t, 0, 64<<20, 8<<20, &log)
	for _, c := range []struct {
		size, window int
		want, not    string
	}{
		// 260 receives of 1 MiB; 5 of 4 MiB (pingpong's window): above 8 MiB.
		{1 << 20, 256, "a smaller -window or smaller sizes, or restart it with -max-recv-bytes 272629760 or more", ""},
		{4 << 20, 1, "(its -max-recv-bytes), and 5 receives of 4194304 bytes need 20971520: use smaller sizes", "-window"},
		// No -max-recv-bytes takes 260 receives of 64 MiB.
		{64 << 20, 256, "use a smaller -window or smaller sizes", "restart"},
		{128 << 20, 1, "(its -max-size)", ""},
	} {
		err := hello(cl, srv.Addr(), c.size, c.window, 5*time.Second)
		if !errors.Is(err, errServerLimit) || !strings.Contains(err.Error(), c.want) || c.not != "" && strings.Contains(err.Error(), c.not) {
			t.Errorf("hello for %d-byte messages, window %d: %v; want a server-limit usage error with %q (and no %q)", c.size, c.window, err, c.want, c.not)
		}
	}
	for _, want := range []string{"with a window of 256: 272629760 bytes of receives, above -max-recv-bytes 8388608: refused", "above -max-size 67108864: refused"} {
		if !strings.Contains(log.String(), want) {
			t.Errorf("the server's log has no %q:\n%s", want, log.String())
		}
	}
	// 6 receives of 1 MiB fit.
	if err := hello(cl, srv.Addr(), 1<<20, 2, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	ctx, watch := watchAnswers(cl, srv.Addr(), 5*time.Second)
	defer watch.stop()
	if _, err := pingSize(ctx, watch, cl, srv.Addr(), 1<<20, 0, 3, false, false); err != nil {
		t.Fatalf("ping-pong after the refusals: %v", err)
	}
}

// TestRecvPool checks the server's receives: a refused session grows
// nothing, and the pool stays within its budget when a session's size
// meets an earlier session's window.
func TestRecvPool(t *testing.T) {
	hub := xdp.NewHub(xdp.MemConfig{})
	l := hub.Attach()
	t.Cleanup(func() { l.Close() })
	e := openOn(t, l, 2)
	p := &recvPool{e: e, grp: e.NewGroup(), size: 64 << 10, maxSize: 64 << 20, budget: 8 << 20}
	if err := p.grow(4, p.size); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ want, window, ack int }{{128 << 20, 1, 8}, {1 << 20, 256, 16}, {4 << 20, 1, 16}} {
		ack, refused, err := p.admit(c.want, c.window)
		if err != nil || refused == "" || len(ack) != c.ack {
			t.Errorf("admit(%d, %d) = %d-byte ack, %q, %v; want a refusal with a %d-byte ack", c.want, c.window, len(ack), refused, err, c.ack)
		}
		if len(p.slots) != 4 || p.size != 64<<10 {
			t.Errorf("refused admit(%d, %d) left %d receives of %d bytes, want 4 of 64 KiB", c.want, c.window, len(p.slots), p.size)
		}
	}
	// 104 receives of 64 KiB (the pool's size): 6.5 MiB.
	if _, refused, err := p.admit(1<<10, 100); err != nil || refused != "" || len(p.slots) != 104 {
		t.Fatalf("admit(1k, 100): %q, %v, %d receives", refused, err, len(p.slots))
	}
	// 6 receives of 1 MiB fit; 104 would be 104 MiB: the pool keeps 8.
	if _, refused, err := p.admit(1<<20, 2); err != nil || refused != "" || len(p.slots) != 8 || p.size != 1<<20 {
		t.Fatalf("admit(1M, 2): %q, %v, %d receives of %d bytes; want 8 of 1 MiB", refused, err, len(p.slots), p.size)
	}
	// The 96 receives retired and the 8 posted anew with 1 MiB were taken
	// back: 104 cancelled completions.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for n := 0; n < 104; n++ {
		st, _ := p.grp.Wait(ctx)
		if st.Code != msglayer.Cancelled {
			t.Fatalf("completion %d: %+v, want a cancelled receive", n, st)
		}
	}
	for _, slot := range p.slots {
		if slot.retired || len(slot.buf) != 1<<20 {
			t.Fatalf("a receive of the pool: retired %v, %d bytes", slot.retired, len(slot.buf))
		}
	}
}

// TestWatchEndsForgottenSession: a server that dies and restarts (same address, a
// new session) refuses the client's next ping: the measurement ends at
// once, saying the server forgot the session, rather than after -timeout
// blaming a stopped server.
func TestWatchEndsForgottenSession(t *testing.T) {
	cl, srv, l1 := sessionOnHub(t, 64<<10)
	wctx, watch := watchAnswers(cl, srv.Addr(), 2*time.Second)
	defer watch.stop()
	if _, err := pingSize(wctx, watch, cl, srv.Addr(), 8, 0, 10, false, false); err != nil {
		t.Fatal(err)
	}
	// The server dies: no goodbye reaches the client, which still holds
	// the old session.
	l1.Partition(true)
	srv.Close()
	l1.Partition(false)
	srv2 := openOn(t, l1, 2) // the restarted server
	go serve(srv2, 64<<10, defaultMaxRecvBytes, false, io.Discard)
	start := time.Now()
	_, err := pingSize(wctx, watch, cl, srv.Addr(), 8, 0, 10, false, false)
	if err == nil || !strings.Contains(err.Error(), "ended our session") {
		t.Fatalf("ping-pong with a restarted server: %v", err)
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("ended after %v, with -timeout 2s", d)
	}
}

// TestServeDeadClientHoldsNoOne: a client that dies while the server's
// large pong to it waits to be pulled does not hold up the server's other
// clients (found by a review: the server waited for that pong, until it
// gave the dead client up, 5 s later, before it took another message).
func TestServeDeadClientHoldsNoOne(t *testing.T) {
	hub := xdp.NewHub(xdp.MemConfig{MTU: 9000})
	ls, la, lb := hub.Attach(), hub.Attach(), hub.Attach()
	t.Cleanup(func() { ls.Close(); la.Close(); lb.Close() })
	srv := openOn(t, ls, 2)
	go serve(srv, 16<<20, defaultMaxRecvBytes, false, io.Discard)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	a, b := openOn(t, la, 1), openOn(t, lb, 3)
	for _, c := range []*msglayer.Endpoint{a, b} {
		if err := c.Connect(ctx, srv.Addr(), 2); err != nil {
			t.Fatal(err)
		}
		if err := hello(c, srv.Addr(), 1<<20, 1, 5*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	// a's large ping, pulled whole by the server; then a dies before it
	// pulls the pong.
	if err := sendWait(ctx, a, srv.Addr(), match(kindPing, 0), make([]byte, 1<<20)); err != nil {
		t.Fatal(err)
	}
	la.Partition(true)
	start := time.Now()
	watchCtx, watch := watchAnswers(b, srv.Addr(), 5*time.Second)
	defer watch.stop()
	if _, err := pingSize(watchCtx, watch, b, srv.Addr(), 8, 0, 3, false, false); err != nil {
		t.Fatalf("ping-pong of another client: %v", err)
	}
	if el := time.Since(start); el > 2*time.Second {
		t.Errorf("another client's ping-pong took %v with the server's pong to a dead client pending", el)
	}
}

// TestWatchEndsUnknownPeer: the watch ends a measurement whose peer is no
// peer of the endpoint (its record given up) once no answer came for
// -timeout (found by a review: it never fired, the peer table being all
// it looked at).
func TestWatchEndsUnknownPeer(t *testing.T) {
	l := xdp.NewHub(xdp.MemConfig{}).Attach()
	t.Cleanup(func() { l.Close() })
	e := openOn(t, l, 1)
	nobody := msglayer.Addr{MAC: [6]byte{0x02, 0x78, 0x6d, 0, 0, 0x99}, EP: 4}
	start := time.Now()
	ctx, watch := watchAnswers(e, nobody, 200*time.Millisecond)
	defer watch.stop()
	select {
	case <-ctx.Done():
		if d := time.Since(start); d < 200*time.Millisecond {
			t.Errorf("the watch ended after %v, before -timeout (200ms)", d)
		}
		if err := context.Cause(ctx); !errors.Is(err, msglayer.ErrUnreachable) {
			t.Errorf("watch ended with %v, want ErrUnreachable", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the watch of a peer the endpoint does not know never ended")
	}
}
