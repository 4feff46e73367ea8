package msglayer

import (
	"sync/atomic"
	"testing"
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
// non-blocking calls in turn. It returns what went wrong, if anything.
func pollPingPong(e *Endpoint, peer Addr, n int, ping bool) string {
	grp := e.NewGroup()
	out, in := []byte("8 bytes!"), make([]byte, 8)
	send := func(i int) string {
		s, err := e.Isend(peer, uint64(i), [][]byte{out}, nil)
		if err != nil {
			return err.Error()
		}
		for ok, _ := e.Ibuffered(s); !ok; ok, _ = e.Ibuffered(s) {
		}
		for _, ok, _ := e.Test(s); !ok; _, ok, _ = e.Test(s) {
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
			}
		case 1:
			e.Irecv(m, ^uint64(0), [][]byte{in}, nil)
			for _, ok := e.TestAny(m, ^uint64(0)); !ok; _, ok = e.TestAny(m, ^uint64(0)) {
			}
		case 2:
			for _, ok := e.Iprobe(m, ^uint64(0)); !ok; _, ok = e.Iprobe(m, ^uint64(0)) {
			}
			r, _ := e.Irecv(m, ^uint64(0), [][]byte{in}, nil)
			for h, ok := e.IPeek(); !ok || h != r; h, ok = e.IPeek() {
			}
			e.Test(r)
		case 3:
			grp.Irecv(m, ^uint64(0), [][]byte{in}, nil)
			for _, ok := grp.Test(); !ok; _, ok = grp.Test() {
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
