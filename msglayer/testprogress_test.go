package msglayer

import (
	"context"
	"errors"
	"runtime"
	"sync/atomic"
	"testing"
	"time"
)

// TestNonBlockingCallsDrive: a loop of Test (or TestAny, IPeek, Iprobe,
// Ibuffered, Group.Test) drives the link by itself, as mx_test does, in
// busy-poll and in blocking mode, instead of leaving every frame to the
// background goroutine's sleeps in the kernel. Found by an audit: in
// busy-poll mode, 200 round trips polled by Test made that goroutine
// sleep 415 times, and a message took up to 2.9 ms one way.
func TestNonBlockingCallsDrive(t *testing.T) {
	for _, busy := range []bool{true, false} {
		name := map[bool]string{true: "busy", false: "blocking"}[busy]
		t.Run(name, func(t *testing.T) {
			// Set before the engines start and cleared after they stop
			// (cleanups run last first).
			var bgSleeps atomic.Int64
			testHookSleep = func(bg bool) {
				if bg {
					bgSleeps.Add(1)
				}
			}
			t.Cleanup(func() { testHookSleep = nil })
			a, b, _, _ := connectedPair(t, Config{BusyPoll: busy}, Config{BusyPoll: busy})
			before := bgSleeps.Load() // the connects'
			const n = 200
			failed := make(chan string, 1)
			go func() { // the echo, polling its endpoint alone
				if msg := pollPingPong(b, a.Addr(), n, false); msg != "" {
					failed <- msg
				}
				close(failed)
			}()
			if msg := pollPingPong(a, b.Addr(), n, true); msg != "" {
				t.Fatal(msg)
			}
			if msg := <-failed; msg != "" {
				t.Fatal("echo: " + msg)
			}
			// A few sleeps: before the first calls asked the background
			// goroutine to step aside, or when a pause of the test's
			// goroutines (GC, the race detector) outlasted lingerAPI.
			if got := bgSleeps.Load() - before; got > n/10 {
				t.Errorf("%d round trips by polling calls: the background goroutines slept in the link %d times, want at most %d", n, got, n/10)
			}
		})
	}
}

// pollPingPong runs n round trips of 8-byte messages with peer (first
// sending if ping), waiting for each completion by polling one of the
// non-blocking calls in turn, and yielding between polls (with one P, a
// loop that does not yield holds off the other side until the scheduler
// preempts it, 10 ms later). It returns what went wrong, if anything.
func pollPingPong(e *Endpoint, peer Addr, n int, ping bool) string {
	grp := e.NewGroup()
	out, in := []byte("8 bytes!"), make([]byte, 8)
	send := func(i int) string {
		s, err := e.Isend(peer, uint64(i), [][]byte{out}, nil)
		if err != nil {
			return err.Error()
		}
		for ok, _ := e.Ibuffered(s); !ok; ok, _ = e.Ibuffered(s) {
			runtime.Gosched() // one P (-cpu 1): let the other side run
		}
		for _, ok, _ := e.Test(s); !ok; _, ok, _ = e.Test(s) {
			runtime.Gosched() // one P (-cpu 1): let the other side run
		}
		return ""
	}
	for i := range n {
		if ping {
			if msg := send(i); msg != "" {
				return msg
			}
		}
		m := uint64(i)
		switch i % 4 {
		case 0:
			r, _ := e.Irecv(m, ^uint64(0), [][]byte{in}, nil)
			for _, ok, _ := e.Test(r); !ok; _, ok, _ = e.Test(r) {
				runtime.Gosched() // one P (-cpu 1): let the other side run
			}
		case 1:
			e.Irecv(m, ^uint64(0), [][]byte{in}, nil)
			for _, ok := e.TestAny(m, ^uint64(0)); !ok; _, ok = e.TestAny(m, ^uint64(0)) {
				runtime.Gosched() // one P (-cpu 1): let the other side run
			}
		case 2:
			for _, ok := e.Iprobe(m, ^uint64(0)); !ok; _, ok = e.Iprobe(m, ^uint64(0)) {
				runtime.Gosched() // one P (-cpu 1): let the other side run
			}
			r, _ := e.Irecv(m, ^uint64(0), [][]byte{in}, nil)
			for h, ok := e.IPeek(); !ok || h != r; h, ok = e.IPeek() {
				runtime.Gosched() // one P (-cpu 1): let the other side run
			}
			e.Test(r)
		case 3:
			grp.Irecv(m, ^uint64(0), [][]byte{in}, nil)
			for _, ok := grp.Test(); !ok; _, ok = grp.Test() {
				runtime.Gosched() // one P (-cpu 1): let the other side run
			}
		}
		if string(in) != string(out) {
			return "message " + string(rune('0'+i%10)) + ": " + string(in)
		}
		clear(in)
		if !ping {
			if msg := send(i); msg != "" {
				return msg
			}
		}
	}
	return ""
}

// TestParkedWaitLeavesBackgroundAsleep: while a Wait drives the link,
// asleep in it, the background goroutine sleeps until the Wait lets go of
// the link, whether the Wait took the drive token at once or had to wait
// for it (the background goroutine held it). It woke every lingerAPI
// instead, about 250 times a second, for as long as the Wait lasted:
// 4-5 % of a CPU for an endpoint waiting for a message that did not come
// (83-106 ms of CPU in 2 s, against 3 ms idle).
func TestParkedWaitLeavesBackgroundAsleep(t *testing.T) {
	var turns atomic.Int64
	var eng atomic.Pointer[engine]
	testHookBackgroundTurn = func(g *engine) {
		if g == eng.Load() {
			turns.Add(1)
		}
	}
	t.Cleanup(func() { testHookBackgroundTurn = nil })
	a, _, _, _ := connectedPair(t, Config{}, Config{})
	eng.Store(a.eng)
	park := func(d time.Duration) int64 {
		r, err := a.Irecv(77, ^uint64(0), nil, nil) // nothing will match
		if err != nil {
			t.Fatal(err)
		}
		defer a.Cancel(r)
		ctx, cancel := context.WithTimeout(context.Background(), d)
		defer cancel()
		t0 := turns.Load()
		if _, err := a.Wait(ctx, r); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Wait for a message that never comes: %v", err)
		}
		return turns.Load() - t0
	}
	// After an idle spell the background goroutine drives, and the Wait
	// waits for the token; right after a Wait it is free.
	time.Sleep(100 * time.Millisecond)
	afterIdle := park(500 * time.Millisecond)
	again := park(500 * time.Millisecond)
	if afterIdle > 20 || again > 20 {
		t.Errorf("the background goroutine turned %d and %d times during Waits of 500 ms (token waited for, token free); want a few", afterIdle, again)
	}
}
