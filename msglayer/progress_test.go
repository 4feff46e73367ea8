package msglayer_test

import (
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/xmx-stack/xmx/msglayer"
	"github.com/xmx-stack/xmx/xdp"
)

// These tests come from a review of the progress machinery (2026-11-28);
// each failed before its fix.

// processCPU is the CPU time the process has used.
func processCPU() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// TestBackgroundPausesOnLinkError: a link that keeps failing (here
// closed under the engine) must not make the background goroutine spin.
func TestBackgroundPausesOnLinkError(t *testing.T) {
	hub := xdp.NewHub(xdp.MemConfig{})
	l := hub.Attach()
	openEP(t, msglayer.Config{Link: l, EndpointID: 1})
	time.Sleep(50 * time.Millisecond)
	c0 := processCPU()
	time.Sleep(500 * time.Millisecond)
	idle := processCPU() - c0
	l.Close()
	time.Sleep(50 * time.Millisecond)
	c1 := processCPU()
	time.Sleep(500 * time.Millisecond)
	after := processCPU() - c1
	t.Logf("CPU over 500ms idle: %v; after link error: %v", idle, after)
	if after > 250*time.Millisecond {
		t.Errorf("background goroutine burns %v of CPU per 500 ms once the link fails", after)
	}
}

// TestPeekHandleNotRecycled: the handle Peek returns is made under the
// lock; made after it, a request collected and recycled meanwhile gave a
// handle valid for a later operation.
func TestPeekHandleNotRecycled(t *testing.T) {
	l, _ := xdp.NewPair(xdp.MemConfig{})
	t.Cleanup(func() { l.Close() }) // after the endpoints' Close
	a := openEP(t, msglayer.Config{Link: l, EndpointID: 1})
	s := openEP(t, msglayer.Config{Link: l, EndpointID: 2})
	ctx := ctxFor(t, 5*time.Second)
	if err := s.Connect(ctx, a.Addr(), 0); err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // completes receives on a and collects them at once
		defer wg.Done()
		buf := [][]byte{make([]byte, 8)}
		for {
			select {
			case <-stop:
				return
			default:
			}
			sr, _ := s.Isend(a.Addr(), 1, buf, nil)
			s.Forget(sr)
			r, err := a.Irecv(1, ^uint64(0), buf, nil) // matches the unexpected message: done at once
			if err != nil {
				return
			}
			a.Test(r) // may be stale: the peeker collected it
		}
	}()
	bad := 0
	deadline := time.Now().Add(3 * time.Second)
	for n := 0; time.Now().Before(deadline) && bad == 0; n++ {
		h, err := a.Peek(ctx)
		if err != nil {
			t.Fatal(err)
		}
		_, ok, err := a.Test(h)
		if err == nil && !ok {
			bad++
			t.Errorf("after %d peeks: Peek returned a handle that is valid but not done (a recycled request's)", n)
		}
	}
	close(stop)
	wg.Wait()
}

// wakeableDropLink is a dropLink whose driver can be woken (xdp.Waker).
type wakeableDropLink struct{ *dropLink }

func (l wakeableDropLink) Wake() { l.Link.(xdp.Waker).Wake() }

// TestRetransmitWhileDriverSleeps: a frame sent by an API call (Isend)
// while the background goroutine sleeps in the kernel is stamped, and its
// timeout armed, when that goroutine wakes: it must be woken, or a lost
// frame waits for the sleep to end (250 ms) rather than its timeout.
func TestRetransmitWhileDriverSleeps(t *testing.T) {
	hub := xdp.NewHub(xdp.MemConfig{})
	ma, mb := hub.Attach(), hub.Attach()
	t.Cleanup(func() { ma.Close(); mb.Close() })
	// The first copy of each round's message (match i) is dropped.
	la := wakeableDropLink{&dropLink{Link: ma, dropped: map[uint32]bool{}, drop: func(f []byte) (uint32, bool) {
		_, match, _, _, _, ok := msglayer.EagerFrame(f)
		return uint32(match), ok
	}}}
	a := openEP(t, msglayer.Config{Link: la, EndpointID: 1, Key: 0xa})
	b := openEP(t, msglayer.Config{Link: mb, EndpointID: 2, Key: 0xb})
	ctx := ctxFor(t, 5*time.Second)
	if err := a.Connect(ctx, b.Addr(), 0xb); err != nil {
		t.Fatal(err)
	}
	var worst time.Duration
	for i := range 5 {
		r, _ := b.Irecv(uint64(i), ^uint64(0), [][]byte{make([]byte, 8)}, nil)
		time.Sleep(30 * time.Millisecond) // both background goroutines asleep in the kernel
		start := time.Now()
		s, _ := a.Isend(b.Addr(), uint64(i), [][]byte{make([]byte, 8)}, nil)
		for {
			if _, ok, _ := b.Test(r); ok {
				break
			}
			if time.Since(start) > 2*time.Second {
				t.Fatal("never arrived")
			}
			time.Sleep(200 * time.Microsecond)
		}
		el := time.Since(start)
		worst = max(worst, el)
		t.Logf("round %d: the dropped frame arrived after %v", i, el)
		a.Forget(s)
	}
	if worst > 50*time.Millisecond {
		t.Errorf("a frame lost with an RTO of a few ms was resent after %v", worst)
	}
}

// TestHandOffWhileBackgroundGoesToSleep: an API call that comes to drive
// while the background goroutine is between its look at the waiting API
// calls and its sleep in the kernel finds it not yet asleep, so it does
// not signal it; the background goroutine must notice the call itself
// before sleeping, or the call waits for the token until a frame or the
// end of that sleep (250 ms).
func TestHandOffWhileBackgroundGoesToSleep(t *testing.T) {
	// The hook is set before the engine starts and cleared after it
	// stopped (cleanups run last in, first out).
	atSleep, proceed := make(chan struct{}), make(chan struct{})
	var armed atomic.Bool
	msglayer.SetSleepHook(func(background bool) {
		if background && armed.CompareAndSwap(true, false) {
			atSleep <- struct{}{}
			<-proceed
		}
	})
	t.Cleanup(func() { msglayer.SetSleepHook(nil) })
	l := xdp.NewHub(xdp.MemConfig{}).Attach()
	t.Cleanup(func() { l.Close() })
	e := openEP(t, msglayer.Config{Link: l, EndpointID: 1, BusyPoll: true})
	armed.Store(true)
	select {
	case <-atSleep: // the background goroutine drives, about to sleep
	case <-time.After(5 * time.Second):
		t.Fatal("the background goroutine never went to sleep")
	}
	r, err := e.Irecv(0, 0, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	go e.Wait(ctxFor(t, 2*time.Second), r) // never completes: it wants to drive
	for msglayer.DriveWanted(e) == 0 {
		time.Sleep(100 * time.Microsecond)
	}
	close(proceed)
	start := time.Now()
	for msglayer.BackgroundDriving(e) {
		if time.Since(start) > 100*time.Millisecond {
			t.Fatalf("the background goroutine kept the drive token for %v while an API call waited for it", time.Since(start))
		}
		time.Sleep(100 * time.Microsecond)
	}
	t.Logf("handed over after %v", time.Since(start))
}
