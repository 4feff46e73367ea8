package msglayer_test

import (
	"bytes"
	"context"
	"errors"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/xmx-stack/xmx/msglayer"
	"github.com/xmx-stack/xmx/xdp"
)

// The tests of this file hold handles, wake-ups and handlers to what a
// goroutine that misuses one of them, or a panicking handler, may do to
// the others: nothing.

// drivingWait starts a Wait on a receive nothing matches, in a goroutine
// of its own: it drives e's link (asleep in the kernel, in blocking mode)
// until the test ends, so that the test's other waits do not.
func drivingWait(t *testing.T, e *msglayer.Endpoint) {
	t.Helper()
	never, err := e.Irecv(0x7fff, ^uint64(0), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		e.Wait(ctx, never)
	}()
	t.Cleanup(func() { cancel(); <-done })
	time.Sleep(20 * time.Millisecond) // it takes the drive token and sleeps
}

type waitResult struct {
	st  msglayer.Status
	err error
	at  time.Duration
}

// waitIn runs Wait(h) in a goroutine and returns where its result comes.
func waitIn(ctx context.Context, e *msglayer.Endpoint, h msglayer.Request, t0 time.Time) <-chan waitResult {
	c := make(chan waitResult, 1)
	go func() {
		st, err := e.Wait(ctx, h)
		c <- waitResult{st, err, time.Since(t0)}
	}()
	return c
}

// TestTwoWaitsOneHandle checks that of two goroutines asleep in Wait on
// one receive, one gets its status and the other ErrStaleRequest, both at
// once; and that the request, recycled, completes its next Wait at once
// (two such Waits used to leave its count of sleepers at -1, and the next
// Wait on it asleep until the driver let go).
func TestTwoWaitsOneHandle(t *testing.T) {
	w := memWorld(t, xdp.MemConfig{})
	cfg := msglayer.Config{SpinBeforeSleep: msglayer.NoSpin}
	a, b := w.pair(t, cfg, cfg)
	drivingWait(t, b)
	ctx := ctxFor(t, 20*time.Second)

	buf := make([]byte, 8)
	r, err := b.Irecv(1, ^uint64(0), [][]byte{buf}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	w1, w2 := waitIn(ctx, b, r, t0), waitIn(ctx, b, r, t0)
	time.Sleep(20 * time.Millisecond) // both asleep
	if _, err := a.Isend(b.Addr(), 1, [][]byte{[]byte("12345678")}, nil); err != nil {
		t.Fatal(err)
	}
	got := []waitResult{<-w1, <-w2}
	slices.SortFunc(got, func(x, y waitResult) int { // the status first
		if x.err == nil {
			return -1
		}
		return 1
	})
	if got[0].err != nil || got[0].st.XferLen != 8 || !errors.Is(got[1].err, msglayer.ErrStaleRequest) {
		t.Fatalf("two Waits on one handle: %+v, %v and %+v, %v; want the status and ErrStaleRequest",
			got[0].st, got[0].err, got[1].st, got[1].err)
	}
	if slow := max(got[0].at, got[1].at); slow > 10*time.Second {
		t.Errorf("two Waits on one handle ended after %v", slow)
	}

	// The next receives (the recycled request among them), each waited
	// on by a goroutine that does not drive.
	var next []<-chan waitResult
	for m := uint64(2); m < 6; m++ {
		r, err := b.Irecv(m, ^uint64(0), [][]byte{make([]byte, 8)}, nil)
		if err != nil {
			t.Fatal(err)
		}
		next = append(next, waitIn(ctx, b, r, time.Now()))
	}
	time.Sleep(20 * time.Millisecond)
	for m := uint64(2); m < 6; m++ {
		if _, err := a.Isend(b.Addr(), m, [][]byte{[]byte("x")}, nil); err != nil {
			t.Fatal(err)
		}
	}
	for i, c := range next {
		if res := <-c; res.err != nil {
			t.Errorf("receive %d after the two Waits: %v", i+2, res.err)
		}
	}
}

// TestForgetSpendsHandle checks that Forget spends the handle of a
// pending request, as Test or Wait do at completion: every later use of
// it, and a Wait asleep on it, gets ErrStaleRequest at once, while the
// request still takes its message.
func TestForgetSpendsHandle(t *testing.T) {
	w := memWorld(t, xdp.MemConfig{})
	cfg := msglayer.Config{SpinBeforeSleep: msglayer.NoSpin}
	a, b := w.pair(t, cfg, cfg)
	ctx := ctxFor(t, 20*time.Second)

	r, err := b.Irecv(1, ^uint64(0), [][]byte{make([]byte, 8)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Forget(r); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Wait(ctx, r); !errors.Is(err, msglayer.ErrStaleRequest) {
		t.Errorf("Wait after Forget: %v, want ErrStaleRequest", err)
	}
	if _, _, err := b.Test(r); !errors.Is(err, msglayer.ErrStaleRequest) {
		t.Errorf("Test after Forget: %v, want ErrStaleRequest", err)
	}
	if _, err := b.Cancel(r); !errors.Is(err, msglayer.ErrStaleRequest) {
		t.Errorf("Cancel after Forget: %v, want ErrStaleRequest", err)
	}
	if err := b.Forget(r); !errors.Is(err, msglayer.ErrStaleRequest) {
		t.Errorf("Forget after Forget: %v, want ErrStaleRequest", err)
	}
	// The forgotten receive still takes message 1: the next receive of
	// match 1 gets message 2.
	s, err := a.Isend(b.Addr(), 1, [][]byte{[]byte("first")}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Wait(ctx, s); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 8)
	r2, err := b.Irecv(1, ^uint64(0), [][]byte{buf}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Isend(b.Addr(), 1, [][]byte{[]byte("second")}, nil); err != nil {
		t.Fatal(err)
	}
	if st, err := b.Wait(ctx, r2); err != nil || !bytes.Equal(buf[:st.XferLen], []byte("second")) {
		t.Fatalf("receive after a forgotten one: %q, %v; want %q", buf[:st.XferLen], err, "second")
	}

	// A Wait asleep (not driving) on a handle another goroutine forgets.
	drivingWait(t, b)
	r3, err := b.Irecv(3, ^uint64(0), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	c := waitIn(ctx, b, r3, time.Now())
	time.Sleep(20 * time.Millisecond)
	if err := b.Forget(r3); err != nil {
		t.Fatal(err)
	}
	if res := <-c; !errors.Is(res.err, msglayer.ErrStaleRequest) {
		t.Errorf("Wait on a handle forgotten meanwhile: %v, want ErrStaleRequest", res.err)
	}
}

// medianOf3 runs f three times and returns the median of its times.
func medianOf3(t *testing.T, f func() time.Duration) time.Duration {
	t.Helper()
	d := []time.Duration{f(), f(), f()}
	slices.Sort(d)
	return d[1]
}

// TestProbeWokenByLocalRendezvous checks that a Probe driving the link,
// asleep in the kernel, wakes for a same-process message that arrives as
// a rendezvous record (an Issend), as it does for an eager one: it used
// to sleep on until its sleep ended (tens of milliseconds). A median of
// three keeps a loaded machine's delays out.
func TestProbeWokenByLocalRendezvous(t *testing.T) {
	w := memWorld(t, xdp.MemConfig{})
	cfg := msglayer.Config{SpinBeforeSleep: msglayer.NoSpin}
	a := w.open(t, 0, msglayer.Config{EndpointID: 1, Key: 1, SpinBeforeSleep: msglayer.NoSpin})
	cfg.EndpointID, cfg.Key = 2, 2
	c := w.open(t, 0, cfg)
	ctx := ctxFor(t, 20*time.Second)
	if err := a.Connect(ctx, c.Addr(), 2); err != nil {
		t.Fatal(err)
	}
	match := uint64(0)
	d := medianOf3(t, func() time.Duration {
		match++
		probed := make(chan time.Time, 1)
		go func() {
			if _, err := c.Probe(ctx, match, ^uint64(0)); err != nil {
				t.Error(err)
			}
			probed <- time.Now()
		}()
		time.Sleep(30 * time.Millisecond) // the Probe drives, asleep
		t0 := time.Now()
		s, err := a.Issend(c.Addr(), match, [][]byte{[]byte("rndv")}, nil)
		if err != nil {
			t.Fatal(err)
		}
		d := (<-probed).Sub(t0)
		r, err := c.Irecv(match, ^uint64(0), nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, h := range []struct {
			e *msglayer.Endpoint
			r msglayer.Request
		}{{c, r}, {a, s}} {
			if _, err := h.e.Wait(ctx, h.r); err != nil && !errors.Is(err, msglayer.ErrTruncated) {
				t.Fatal(err)
			}
		}
		return d
	})
	if d > 20*time.Millisecond {
		t.Errorf("a Probe asleep saw a same-process Issend after %v (median of 3)", d)
	}
}

// TestResolveWokenWhileAnotherDrives checks that a Resolve whose answer
// another goroutine's wait receives returns at once, rather than at the
// end of its query's 100 ms (it waited with nothing to wake it).
func TestResolveWokenWhileAnotherDrives(t *testing.T) {
	w := memWorld(t, xdp.MemConfig{})
	w.open(t, 0, msglayer.Config{EndpointID: 1, Key: 1, Hostname: "hosta", SpinBeforeSleep: msglayer.NoSpin})
	b := w.open(t, 1, msglayer.Config{EndpointID: 2, Key: 2, Hostname: "hostb", SpinBeforeSleep: msglayer.NoSpin})
	drivingWait(t, b)
	ctx := ctxFor(t, 20*time.Second)
	d := medianOf3(t, func() time.Duration {
		t0 := time.Now()
		if _, err := b.Resolve(ctx, "hosta", 1); err != nil {
			t.Fatal(err)
		}
		return time.Since(t0)
	})
	if d > 50*time.Millisecond {
		t.Errorf("Resolve while another goroutine drives took %v (median of 3)", d)
	}
}

// TestHandlerPanicGoesOn checks that a panic in the unexpected-message
// handler reaches the goroutine whose wait ran it, and leaves the engine
// whole: the message queues as if the handler had said Continue, and
// frames keep going both ways (a recovered panic used to leave the drive
// token taken and every later send unsent).
func TestHandlerPanicGoesOn(t *testing.T) {
	type boom struct{ n int }
	h := func(m msglayer.UnexpectedMessage) msglayer.HandlerAction {
		if m.Match == 7 {
			panic(boom{7})
		}
		return msglayer.Continue
	}
	// The handler must run in the Wait's goroutine below: had the
	// background goroutine run it, it would end the process (as
	// documented). The message is sent once the Wait drives b's link and
	// sleeps in it: it holds the drive token until it returns. Only b is
	// waited on then, so the one API driver to sleep is the Wait. (The
	// hook is set before, and cleared after, the engines run.)
	var armed atomic.Bool
	asleep := make(chan struct{})
	msglayer.SetSleepHook(func(background bool) {
		if !background && armed.CompareAndSwap(true, false) {
			close(asleep)
		}
	})
	t.Cleanup(func() { msglayer.SetSleepHook(nil) })
	w := memWorld(t, xdp.MemConfig{})
	a, b := w.pair(t, msglayer.Config{}, msglayer.Config{UnexpectedHandler: h})
	ctx := ctxFor(t, 20*time.Second)

	never, err := b.Irecv(0x7fff, ^uint64(0), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	armed.Store(true)
	panicked := make(chan any, 1)
	go func() {
		defer func() { panicked <- recover() }()
		b.Wait(ctx, never)
	}()
	select {
	case <-asleep:
	case <-ctx.Done():
		t.Fatal("the Wait never slept in the link")
	}
	if _, err := a.Isend(b.Addr(), 7, [][]byte{[]byte("seven")}, nil); err != nil {
		t.Fatal(err)
	}
	if pv := <-panicked; pv != (boom{7}) {
		t.Fatalf("the waiting goroutine recovered %v, want the handler's %v", pv, boom{7})
	}
	if ok, err := b.Cancel(never); !ok || err != nil {
		t.Errorf("Cancel of the receive whose Wait panicked: %v, %v", ok, err)
	}

	buf := make([]byte, 8)
	r, err := b.Irecv(7, ^uint64(0), [][]byte{buf}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if st, err := b.Wait(ctx, r); err != nil || string(buf[:st.XferLen]) != "seven" {
		t.Fatalf("the message the handler panicked on: %q, %v; want it queued", buf[:st.XferLen], err)
	}
	back, err := a.Irecv(8, ^uint64(0), [][]byte{make([]byte, 8)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Isend(a.Addr(), 8, [][]byte{[]byte("back")}, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Wait(ctx, back); err != nil {
		t.Fatalf("a send after the panic: %v", err)
	}
}
