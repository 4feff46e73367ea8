package xdp

import (
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestRecvTimerPoll checks what recvTimer relies on: ppoll(2) writes the
// time left back into its timespec, nothing of it after a timeout and
// most of it when a descriptor was ready at once; and the timer reports
// the end of a bounded wait.
func TestRecvTimerPoll(t *testing.T) {
	fd, err := newEventFd()
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}

	var tm recvTimer
	tm.start(20*time.Millisecond, false)
	ts, ok := tm.pollTimeout()
	if !ok || ts == nil {
		t.Fatalf("pollTimeout at the start = %v, %v", ts, ok)
	}
	start := time.Now()
	if n, e := pollNoIntr(fds, ts); n != 0 || e != 0 {
		t.Fatalf("ppoll on an idle eventfd = %d, %v", n, e)
	}
	if el := time.Since(start); el < 15*time.Millisecond {
		t.Fatalf("ppoll(20ms) returned after %v", el)
	}
	if ts, ok := tm.pollTimeout(); ok {
		t.Fatalf("pollTimeout after the wait timed out = %v, true (time left %v)", ts, ts)
	}

	tm.start(time.Second, false)
	if err := eventfdSignal(fd); err != nil {
		t.Fatal(err)
	}
	ts, _ = tm.pollTimeout()
	if n, e := pollNoIntr(fds, ts); n != 1 || e != 0 {
		t.Fatalf("ppoll on a signalled eventfd = %d, %v", n, e)
	}
	if left := time.Duration(ts.Nano()); left < 900*time.Millisecond || left > time.Second {
		t.Fatalf("time left after a ready descriptor = %v, want nearly 1s", left)
	}
	if _, ok := tm.pollTimeout(); !ok {
		t.Fatal("pollTimeout with time left = false")
	}
	// What the wait took, from the time left alone (WaitMeter).
	if d, ok := tm.waited(); !ok || d < 0 || d > 100*time.Millisecond {
		t.Fatalf("waited after a ready descriptor = %v, %v; want about 0, true", d, ok)
	}
	waited := func() time.Duration { d, _ := tm.waited(); return d }
	before := waited()

	tm.start(-1, false)
	if ts, ok := tm.pollTimeout(); ts != nil || !ok {
		t.Fatalf("pollTimeout without a bound = %v, %v; want nil, true", ts, ok)
	}
	if d, ok := tm.waited(); !ok || d != before {
		t.Fatalf("waited after an unbounded start = %v, %v; want the last bounded wait's %v", d, ok, before)
	}
	tm.start(20*time.Millisecond, false)
	ts, _ = tm.pollTimeout()
	if n, e := pollNoIntr(fds[:0], ts); n != 0 || e != 0 { // no descriptor: sleeps the whole 20 ms
		t.Fatalf("ppoll without a descriptor = %d, %v", n, e)
	}
	if d, ok := tm.waited(); !ok || d != 20*time.Millisecond {
		t.Fatalf("waited after a 20 ms wait that timed out = %v, %v", d, ok)
	}
	tm.start(time.Millisecond, true)
	if _, ok := tm.waited(); ok {
		t.Fatal("waited after a spinning start = true: a spin's time is not measured")
	}
}

// pollNoIntr is pollFds called again, with the time the kernel left in
// timeout, while a signal interrupts it, as the links do: the Go runtime
// preempts a goroutine with a signal (SIGURG), which ends a ppoll with
// EINTR at any moment (it failed the 20 ms wait after 361 ns under -race).
func pollNoIntr(fds []unix.PollFd, timeout *unix.Timespec) (int, unix.Errno) {
	for {
		n, e := pollFds(fds, timeout)
		if e != unix.EINTR {
			return n, e
		}
	}
}

// TestRecvTimerSpin checks a spinning wait's deadline: it counts from
// the start, and an unbounded wait has none.
func TestRecvTimerSpin(t *testing.T) {
	var tm recvTimer
	start := time.Now()
	tm.start(10*time.Millisecond, true)
	for !tm.expired() {
		if time.Since(start) > 5*time.Second {
			t.Fatal("a 10 ms spinning wait did not end in 5 s")
		}
	}
	if el := time.Since(start); el < 10*time.Millisecond {
		t.Fatalf("spinning wait of 10 ms ended after %v", el)
	}
	tm.start(-1, true)
	if tm.expired() {
		t.Fatal("an unbounded spinning wait expired")
	}
}
