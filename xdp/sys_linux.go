package xdp

// Raw syscall helpers shared by the Linux links (owned by the AF_PACKET link;
// the AF_XDP link may reuse them). They make no heap allocation: errors are
// returned as a bare unix.Errno (0 on success) rather than as an error
// interface, and every pointer they take refers to memory the caller keeps
// alive (the links preallocate their arrays at open).

import (
	"encoding/binary"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// mmsghdr mirrors struct mmsghdr of recvmmsg(2) and sendmmsg(2): a msghdr
// followed by the number of bytes transferred. Go pads the struct to the
// alignment of Msghdr, which gives the C layout on every Linux arch (64
// bytes on 64-bit, 32 bytes on 32-bit).
type mmsghdr struct {
	Hdr unix.Msghdr
	Len uint32 // msg_len: bytes received or sent, written by the kernel
}

// The data path's non-blocking syscalls (recvmmsg and sendmmsg here, the
// AF_XDP kicks in afxdp_linux.go, all with MSG_DONTWAIT) are raw syscalls:
// they do not tell the Go scheduler, as Syscall6 does. A copy-mode AF_XDP
// sendto moves up to 32 frames through the kernel (tens of microseconds);
// when every P is busy, sysmon takes the P of a goroutine whose syscall
// passes 20 µs and starts another thread on it, and the goroutine comes
// back from the kernel without a P: it is queued and resumes on another
// thread, later. A busy-polling driver next to another (two endpoints in
// one process, or the application) lost a fifth of its stream bandwidth
// that way. A raw syscall keeps the P. None of them waits for data; one
// may wait briefly for the socket's mutex (a copy-mode transmit run by a
// ppoll on the same socket), which delays a stop-the-world pause by one
// batch's transmit at most. Syscalls that sleep (ppoll) stay plain.
// unix.RawSyscall6 is called directly, so that the compiler keeps the
// objects of the uintptr(unsafe.Pointer(...)) arguments alive.

// recvmmsg is recvmmsg(2) without a timeout: it fills up to len(msgs)
// messages and returns how many it filled. It returns errno 0 on success.
// flags must include MSG_DONTWAIT (a raw syscall: see above).
func recvmmsg(fd int, msgs []mmsghdr, flags int) (int, unix.Errno) {
	if len(msgs) == 0 {
		return 0, 0
	}
	r, _, e := unix.RawSyscall6(unix.SYS_RECVMMSG, uintptr(fd),
		uintptr(unsafe.Pointer(&msgs[0])), uintptr(len(msgs)),
		uintptr(flags), 0, 0)
	if e != 0 {
		return 0, e
	}
	return int(r), 0
}

// sendmmsg is sendmmsg(2): it sends up to len(msgs) messages and returns
// how many the kernel took. The kernel reports an error only when it took
// none, so a partial count means the next call will meet the error (if any)
// on msgs[n]. It returns errno 0 on success. flags must include
// MSG_DONTWAIT (a raw syscall: see above).
func sendmmsg(fd int, msgs []mmsghdr, flags int) (int, unix.Errno) {
	if len(msgs) == 0 {
		return 0, 0
	}
	r, _, e := unix.RawSyscall6(unix.SYS_SENDMMSG, uintptr(fd),
		uintptr(unsafe.Pointer(&msgs[0])), uintptr(len(msgs)),
		uintptr(flags), 0, 0)
	if e != 0 {
		return 0, e
	}
	return int(r), 0
}

// interfaceGone is ErrInterfaceGone with the kernel's word for it.
func interfaceGone(errno unix.Errno) error {
	return fmt.Errorf("%w (%w)", ErrInterfaceGone, errno)
}

// YieldCPU lets the threads waiting for this CPU run before the caller
// goes on (sched_yield(2)), for a caller that polls for frames: on one
// machine the process it waits for may be queued on this CPU, woken there
// by the frames the caller sent it. Alone on the CPU, it costs a syscall.
// It is a raw syscall: it keeps the caller's P, as the kernel's own
// preemption would.
func YieldCPU() {
	unix.RawSyscall(unix.SYS_SCHED_YIELD, 0, 0, 0)
}

// recvTimer bounds a receive's wait. A sleeping receive reads no clock on
// its way to sleep (a reading costs 40-70 ns on this project's virtual
// machines, on the path from a send to the answer): ppoll(2) writes the
// time left back into its timespec, so the timespec set at the start
// carries the bound through every later poll. A spinning receive has a
// deadline, which its caller looks at as often as it can afford.
type recvTimer struct {
	ts       unix.Timespec
	timeout  time.Duration // > 0: bounded
	deadline time.Time     // spinning
	// The last bounded wait in ppoll, for waited: its timeout, and
	// whether there was one since the last bounded spin.
	full     time.Duration
	measured bool
	// slice is the timespec of the poll under way when it is a slice of
	// the wait (pollSlice), sliced says it is.
	slice  unix.Timespec
	sliced bool
	// spins counts a spinning wait's turns, for its looks at the socket.
	spins uint32
}

// start begins a wait of at most timeout (< 0: no bound), spinning or
// sleeping in ppoll.
func (t *recvTimer) start(timeout time.Duration, spin bool) {
	t.timeout = timeout
	switch {
	case timeout <= 0:
	case spin:
		t.deadline = time.Now().Add(timeout)
		t.measured = false
	default:
		t.ts = unix.NsecToTimespec(int64(timeout))
		t.full, t.measured = timeout, true
	}
}

// pollTimeout returns the timespec to give the next poll (nil: no bound),
// and false once the time is up.
func (t *recvTimer) pollTimeout() (*unix.Timespec, bool) {
	if t.timeout <= 0 {
		return nil, true
	}
	if t.ts.Sec <= 0 && t.ts.Nsec <= 0 {
		return nil, false
	}
	return &t.ts, true
}

// pollSlice is pollTimeout cut to goneCheck: the kernel never wakes a
// wait on a socket whose interface is gone, so no poll lasts longer than
// goneCheck, and the link asks the socket after one that saw nothing.
// afterPoll charges the slice's time to the bound.
func (t *recvTimer) pollSlice() (*unix.Timespec, bool) {
	ts, ok := t.pollTimeout()
	if !ok {
		return nil, false
	}
	t.sliced = ts == nil || ts.Nano() > int64(goneCheck)
	if !t.sliced {
		return ts, true
	}
	t.slice = unix.NsecToTimespec(int64(goneCheck))
	return &t.slice, true
}

// afterPoll takes the time a sliced poll spent from what the bound left
// (ppoll wrote what was left of the slice into it).
func (t *recvTimer) afterPoll() {
	if t.sliced && t.timeout > 0 {
		spent := int64(goneCheck) - max(t.slice.Nano(), 0)
		t.ts = unix.NsecToTimespec(max(t.ts.Nano()-spent, 0))
	}
}

// spinLook reports, every few ten thousand turns of a spinning wait
// (milliseconds apart), that it is time to ask the socket whether its
// interface went away: a spinning wait never sleeps in ppoll.
func (t *recvTimer) spinLook() bool {
	t.spins++
	return t.spins&0xffff == 0
}

// waited returns how long the current or last bounded wait has waited,
// when the timespec tells (WaitMeter).
func (t *recvTimer) waited() (time.Duration, bool) {
	if !t.measured {
		return 0, false
	}
	return t.full - max(time.Duration(t.ts.Nano()), 0), true
}

// expired reports that a spinning wait's deadline has passed.
func (t *recvTimer) expired() bool {
	return t.timeout > 0 && !time.Now().Before(t.deadline)
}

// pollFds is ppoll(2) without a signal mask: it waits until one of fds is
// ready or timeout expires (nil waits forever) and returns the number of
// ready descriptors (0 on timeout). Entries with a negative Fd are ignored
// by the kernel. It returns errno 0 on success, EINTR when a signal
// interrupted the wait.
func pollFds(fds []unix.PollFd, timeout *unix.Timespec) (int, unix.Errno) {
	var p unsafe.Pointer
	if len(fds) > 0 {
		p = unsafe.Pointer(&fds[0])
	}
	r, _, e := unix.Syscall6(unix.SYS_PPOLL, uintptr(p), uintptr(len(fds)),
		uintptr(unsafe.Pointer(timeout)), 0, 0, 0)
	if e != 0 {
		return 0, e
	}
	return int(r), 0
}

// newEventFd returns a non-blocking, close-on-exec eventfd used to wake
// goroutines blocked in pollFds (see eventfdSignal).
func newEventFd() (int, error) {
	return unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
}

// eventfdSignal adds 1 to the eventfd's counter, which makes it readable
// (POLLIN) until someone reads it. The links never read it: once signalled
// at Close, it stays readable and wakes every later poll at once.
func eventfdSignal(fd int) error {
	var b [8]byte
	binary.NativeEndian.PutUint64(b[:], 1)
	for {
		_, err := unix.Write(fd, b[:])
		if err == unix.EINTR {
			continue
		}
		if err == unix.EAGAIN {
			return nil // counter saturated: already readable
		}
		return err
	}
}

// htons converts a 16-bit value from host to network byte order, as the
// AF_PACKET socket protocol and sockaddr_ll.sll_protocol want it.
func htons(v uint16) uint16 {
	var b [2]byte
	binary.BigEndian.PutUint16(b[:], v)
	return binary.NativeEndian.Uint16(b[:])
}

// setsockopt and getsockopt pass a struct option by pointer.
func setsockopt(fd, level, opt int, p unsafe.Pointer, size uintptr) error {
	_, _, e := unix.Syscall6(unix.SYS_SETSOCKOPT, uintptr(fd), uintptr(level), uintptr(opt), uintptr(p), size, 0)
	if e != 0 {
		return e
	}
	return nil
}

func getsockopt(fd, level, opt int, p unsafe.Pointer, size uintptr) error {
	l := uint32(size)
	_, _, e := unix.Syscall6(unix.SYS_GETSOCKOPT, uintptr(fd), uintptr(level), uintptr(opt), uintptr(p), uintptr(unsafe.Pointer(&l)), 0)
	if e != 0 {
		return e
	}
	return nil
}

// waker ends a Recv's wait early (see Waker). The eventfd wakes a Recv
// blocked in poll; pending tells a spinning or about-to-wait Recv.
//
// Its own lock keeps fd open for wake: a Wake needs no lock of the link's,
// so a visitor may call it while Close waits for the receive to end.
type waker struct {
	// mu is held shared by wake while it signals fd, exclusively by close.
	mu sync.RWMutex
	// fd is the eventfd, -1 once closed (and before open, for the links
	// that may close a waker they did not open). The receiving side reads
	// it without mu: the links close it only once no receive can run.
	fd      int
	pending atomic.Bool
}

func (w *waker) open() (err error) {
	w.fd, err = newEventFd()
	return err
}

// wake requests a wake-up; after close it does nothing.
func (w *waker) wake() {
	w.mu.RLock()
	if w.fd >= 0 && !w.pending.Swap(true) {
		eventfdSignal(w.fd)
	}
	w.mu.RUnlock()
}

// close closes the eventfd, once no receive can poll it.
func (w *waker) close() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.fd < 0 {
		return nil
	}
	err := unix.Close(w.fd)
	w.fd = -1
	return err
}

// drain empties the eventfd after poll reported it readable.
func (w *waker) drain() {
	var b [8]byte
	unix.Read(w.fd, b[:])
}

// take reports and clears a pending wake-up.
func (w *waker) take() bool {
	return w.pending.Load() && w.pending.Swap(false)
}
