// Package linktest is the conformance suite of xdp.Link: one set of tests
// that the in-memory, AF_PACKET and AF_XDP links all pass.
package linktest

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"net"
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/xmx-stack/xmx/xdp"
)

// Pair is a connected pair of links made for one subtest. The maker
// registers the links' Close (and whatever else it set up) in tb.Cleanup.
type Pair struct {
	A, B xdp.Link
	// KernelDrops, when set, returns frames dropped on the path between A
	// and B by something other than the links themselves (for example the
	// interface counters of a veth pair). The suite reads it before and
	// after a burst and allows that many frames to be missing.
	KernelDrops func() uint64
}

// MakePair makes a fresh pair for a subtest.
type MakePair func(tb testing.TB) Pair

// Options tune the suite for one link kind.
type Options struct {
	// Frames is the number of frames in the full-rate burst (0 → 20000).
	Frames int
	// Lossless requires every frame of the burst to arrive (the in-memory
	// link without knobs and with a large enough queue).
	Lossless bool
	// Faults says the pair injects loss, duplication or reordering: the
	// suite then checks accounting instead of order.
	Faults bool
}

// Run runs the whole suite.
func Run(t *testing.T, mk MakePair, opts Options) {
	if opts.Frames == 0 {
		opts.Frames = 20000
	}
	t.Run("Basics", func(t *testing.T) { testBasics(t, mk) })
	t.Run("EverySizeFullRate", func(t *testing.T) { testBurst(t, mk, opts) })
	t.Run("BothDirections", func(t *testing.T) { testBothDirections(t, mk, opts) })
	t.Run("Truncation", func(t *testing.T) { testTruncation(t, mk, opts) })
	t.Run("RecvTimeout", func(t *testing.T) { testRecvTimeout(t, mk, opts) })
	t.Run("WaitMeter", func(t *testing.T) { testWaitMeter(t, mk) })
	t.Run("WakeEndsWait", func(t *testing.T) { testWake(t, mk) })
	t.Run("CloseUnblocksRecv", func(t *testing.T) { testCloseUnblocks(t, mk) })
	t.Run("CloseWhilePolling", func(t *testing.T) { testCloseWhilePolling(t, mk) })
	t.Run("IdleProber", func(t *testing.T) { testIdleProber(t, mk) })
	t.Run("NoLeaks", func(t *testing.T) { testNoLeaks(t, mk) })
	// FrameBuilder and FrameVisitor, on the links that implement them.
	t.Run("BuiltVisitedEverySize", func(t *testing.T) { testBuiltBurst(t, mk, opts) })
	t.Run("BuiltVisitedBothDirections", func(t *testing.T) { testBuiltBothDirections(t, mk, opts) })
	t.Run("BuiltErrors", func(t *testing.T) { testBuiltErrors(t, mk, opts) })
	t.Run("VisitMax", func(t *testing.T) { testVisitMax(t, mk, opts) })
	t.Run("VisitTimeoutWakeClose", func(t *testing.T) { testVisitWait(t, mk) })
	t.Run("WakeInVisitDuringClose", func(t *testing.T) { testWakeInVisitDuringClose(t, mk) })
	t.Run("CloseWaitsForCalls", func(t *testing.T) { testCloseWaitsForCalls(t, mk) })
	t.Run("BuiltVisitedNoAllocs", func(t *testing.T) { testBuiltNoAllocs(t, mk, opts) })
	// BufferLink.
	t.Run("Gather", func(t *testing.T) { testGather(t, mk, opts) })
	// TailSender.
	t.Run("Tails", func(t *testing.T) { testTails(t, mk, opts) })
}

// How a burst moves its frames: with Send or SendBuilt, Recv or RecvVisit,
// or alternating between the two every batch.
type ioMode int

const (
	plain   ioMode = iota // Send, Recv
	inPlace               // SendBuilt, RecvVisit
	mixed                 // both, alternating
)

func (m ioMode) String() string { return [...]string{"plain", "in place", "mixed"}[m] }

const (
	hdr       = xdp.EthHeaderLen
	magic     = 0x786d78636f6e6600 // "xmxconf\0"
	payloadAt = hdr + 24           // where the pattern starts
)

// frame writes a test frame of length size into b: Ethernet header, then
// magic|run, sequence number, length, CRC-32 of everything after it, then a
// pattern derived from the sequence number.
func frame(b []byte, dst, src net.HardwareAddr, run uint32, seq uint64, size int) []byte {
	b = b[:size]
	copy(b[0:6], dst)
	copy(b[6:12], src)
	binary.BigEndian.PutUint16(b[12:14], xdp.DefaultEtherType)
	binary.BigEndian.PutUint64(b[hdr:], magic|uint64(run&0xff))
	binary.BigEndian.PutUint64(b[hdr+8:], seq)
	binary.BigEndian.PutUint32(b[hdr+16:], uint32(size))
	x := uint32(seq*2654435761) | 1
	for i := payloadAt; i < size; i++ {
		x ^= x << 13
		x ^= x >> 17
		x ^= x << 5
		b[i] = byte(x)
	}
	binary.BigEndian.PutUint32(b[hdr+20:], crc32.ChecksumIEEE(b[payloadAt:size]))
	return b
}

// parse checks a received test frame and returns its sequence number.
func parse(b []byte, dst, src net.HardwareAddr, run uint32) (seq uint64, err error) {
	switch {
	case len(b) < payloadAt:
		return 0, errors.New("runt frame")
	case string(b[0:6]) != string(dst) || string(b[6:12]) != string(src):
		return 0, errors.New("wrong addresses")
	case binary.BigEndian.Uint16(b[12:14]) != xdp.DefaultEtherType:
		return 0, errors.New("wrong EtherType")
	case binary.BigEndian.Uint64(b[hdr:]) != magic|uint64(run&0xff):
		return 0, errStale
	case int(binary.BigEndian.Uint32(b[hdr+16:])) != len(b):
		return 0, errors.New("length differs from the length sent")
	case binary.BigEndian.Uint32(b[hdr+20:]) != crc32.ChecksumIEEE(b[payloadAt:]):
		return 0, errors.New("checksum mismatch")
	}
	return binary.BigEndian.Uint64(b[hdr+8:]), nil
}

var errStale = errors.New("frame of another run")

func bufs(n, size int) ([][]byte, []int) {
	b := make([][]byte, n)
	for i := range b {
		b[i] = make([]byte, size)
	}
	return b, make([]int, n)
}

func testBasics(t *testing.T, mk MakePair) {
	p := mk(t)
	for _, l := range []xdp.Link{p.A, p.B} {
		if len(l.HardwareAddr()) != 6 {
			t.Errorf("%v: hardware address %v is not 6 bytes", l.Info(), l.HardwareAddr())
		}
		if l.MTU() < 576 {
			t.Errorf("%v: MTU %d", l.Info(), l.MTU())
		}
		if l.Info().Kind == "" {
			t.Errorf("Info().Kind is empty")
		}
		long := make([]byte, xdp.MaxFrameLen(l)+1)
		if n, err := l.Send([][]byte{long}); n != 0 || !errors.Is(err, xdp.ErrFrameTooLong) {
			t.Errorf("%v: send of a %d-byte frame = %d, %v; want 0, ErrFrameTooLong", l.Info(), len(long), n, err)
		}
		if n, err := l.Send([][]byte{make([]byte, 10)}); n != 0 || !errors.Is(err, xdp.ErrFrameTooShort) {
			t.Errorf("%v: send of a 10-byte frame = %d, %v; want 0, ErrFrameTooShort", l.Info(), n, err)
		}
		if n, err := l.Recv(make([][]byte, 2), make([]int, 1), 0); n != 0 || !errors.Is(err, xdp.ErrShortSizes) {
			t.Errorf("%v: recv into 2 buffers with 1 size = %d, %v; want 0, ErrShortSizes", l.Info(), n, err)
		}
	}
	if string(p.A.HardwareAddr()) == string(p.B.HardwareAddr()) {
		t.Errorf("both links have hardware address %v", p.A.HardwareAddr())
	}
}

// burst sends n frames of every size from 60 bytes to the largest frame
// from a to b at full rate and checks what arrives.
func burst(t *testing.T, p Pair, a, b xdp.Link, n int, opts Options, run uint32) {
	t.Helper()
	burstIO(t, p, a, b, n, opts, run, plain, plain)
}

// builder builds the frames of one SendBuilt call of a burst.
type builder struct {
	dst, src net.HardwareAddr
	run      uint32
	seq      int // sequence number of frame 0
	sizeOf   func(seq int) int
	maxLen   int
	bad      error // first wrong buffer handed to Build
}

func (b *builder) Build(i int, buf []byte) int {
	if (len(buf) != b.maxLen || cap(buf) != b.maxLen) && b.bad == nil {
		b.bad = fmt.Errorf("Build(%d) got a buffer of len %d cap %d, want MaxFrameLen %d", i, len(buf), cap(buf), b.maxLen)
	}
	return len(frame(buf, b.dst, b.src, b.run, uint64(b.seq+i), b.sizeOf(b.seq+i)))
}

// visitFunc is a Visitor calling a function.
type visitFunc func([]byte)

func (f visitFunc) Visit(b []byte) { f(b) }

// burstIO is burst with the sender and the receiver using the given calls.
func burstIO(t *testing.T, p Pair, a, b xdp.Link, n int, opts Options, run uint32, send, recv ioMode) {
	t.Helper()
	maxLen := min(xdp.MaxFrameLen(a), xdp.MaxFrameLen(b))
	sizeOf := func(seq int) int { return xdp.MinFrameLen + seq%(maxLen-xdp.MinFrameLen+1) }
	dst, src := b.HardwareAddr(), a.HardwareAddr()
	aBefore, bBefore := a.Stats(), b.Stats()
	var kBefore uint64
	if p.KernelDrops != nil {
		kBefore = p.KernelDrops()
	}

	var wg sync.WaitGroup
	var sendErr error
	sendDone := make(chan struct{})
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer close(sendDone)
		const batch = 32
		frames := make([][]byte, batch)
		for i := range frames {
			frames[i] = make([]byte, maxLen)
		}
		fb, _ := a.(xdp.FrameBuilder)
		bld := &builder{dst: dst, src: src, run: run, sizeOf: sizeOf, maxLen: xdp.MaxFrameLen(a)}
		for call, seq := 0, 0; seq < n; call++ {
			k := min(batch, n-seq)
			var m int
			var err error
			if send == inPlace || send == mixed && call%2 == 1 {
				bld.seq = seq
				m, err = fb.SendBuilt(k, bld)
				if bld.bad != nil && err == nil {
					err = bld.bad
				}
			} else {
				out := frames[:k]
				for i := range out {
					out[i] = frame(frames[i][:cap(frames[i])], dst, src, run, uint64(seq+i), sizeOf(seq+i))
				}
				m, err = a.Send(out)
			}
			seq += m
			if err != nil {
				sendErr = err
				return
			}
		}
	}()

	seen := make([]bool, n)
	got, dups, outOfOrder, stale := 0, 0, 0, 0
	delivered, deliveredBytes := 0, uint64(0)
	var firstErr error
	rb, sizes := bufs(64, maxLen+64)
	last := -1
	check := func(f []byte) {
		delivered++
		deliveredBytes += uint64(len(f))
		seq, err := parse(f, dst, src, run)
		if errors.Is(err, errStale) {
			stale++
			return
		}
		if err == nil && seq >= uint64(n) {
			err = errors.New("sequence number out of range")
		}
		if err == nil && len(f) != sizeOf(int(seq)) {
			err = errors.New("wrong size for its sequence number")
		}
		if err != nil {
			if firstErr == nil {
				firstErr = err
			}
			return
		}
		if seen[seq] {
			dups++
			return
		}
		seen[seq] = true
		got++
		if int(seq) < last {
			outOfOrder++
		}
		last = int(seq)
	}
	fv, _ := b.(xdp.FrameVisitor)
	visitor := visitFunc(check)
	idleSince := time.Time{}
	for call := 0; got < n; call++ {
		var k int
		var err error
		if recv == inPlace || recv == mixed && call%2 == 1 {
			k, err = fv.RecvVisit(len(rb), 20*time.Millisecond, visitor)
		} else {
			k, err = b.Recv(rb, sizes, 20*time.Millisecond)
			for i := 0; i < k; i++ {
				check(rb[i][:sizes[i]])
			}
		}
		if err != nil {
			t.Fatalf("recv: %v", err)
		}
		if k == 0 {
			select {
			case <-sendDone:
				if idleSince.IsZero() {
					idleSince = time.Now()
				} else if time.Since(idleSince) > time.Second {
					goto done
				}
			default:
			}
			continue
		}
		idleSince = time.Time{}
	}
done:
	wg.Wait()
	if sendErr != nil {
		t.Fatalf("send: %v", sendErr)
	}
	if firstErr != nil {
		t.Errorf("corrupt frame received: %v", firstErr)
	}
	aAfter, bAfter := a.Stats(), b.Stats()
	var kernel uint64
	if p.KernelDrops != nil {
		kernel = p.KernelDrops() - kBefore
	}
	counted := (aAfter.Lost() - aBefore.Lost()) + (bAfter.Lost() - bBefore.Lost()) + kernel
	injectedDup := aAfter.InjectedDuplicate - aBefore.InjectedDuplicate
	missing := n - got
	t.Logf("%s→%s (send %v, receive %v): %d frames of %d..%d bytes: received %d, missing %d, counted drops %d (kernel path %d), duplicates %d (injected %d), out of order %d, stale %d",
		a.Info().Kind, b.Info().Kind, send, recv, n, xdp.MinFrameLen, maxLen, got, missing, counted, kernel, dups, injectedDup, outOfOrder, stale)
	if uint64(missing) > counted {
		t.Errorf("%d frames missing but only %d drops counted", missing, counted)
	}
	if opts.Lossless && missing > 0 {
		t.Errorf("%d frames missing on a lossless pair", missing)
	}
	if uint64(dups) > injectedDup {
		t.Errorf("%d duplicate frames delivered, %d injected", dups, injectedDup)
	}
	if !opts.Faults && outOfOrder > 0 {
		t.Errorf("%d frames delivered out of order", outOfOrder)
	}
	if sent := aAfter.TxFrames - aBefore.TxFrames; sent != uint64(n) {
		t.Errorf("sender counted %d frames sent, want %d", sent, n)
	}
	var wantBytes uint64
	for seq := 0; seq < n; seq++ {
		wantBytes += uint64(sizeOf(seq))
	}
	if sent := aAfter.TxBytes - aBefore.TxBytes; sent != wantBytes {
		t.Errorf("sender counted %d bytes sent, want %d", sent, wantBytes)
	}
	if rx := bAfter.RxFrames - bBefore.RxFrames; rx != uint64(delivered) {
		t.Errorf("receiver counted %d frames received, %d were delivered", rx, delivered)
	}
	if rx := bAfter.RxBytes - bBefore.RxBytes; rx != deliveredBytes {
		t.Errorf("receiver counted %d bytes received, %d were delivered", rx, deliveredBytes)
	}
	if tr := bAfter.RxTruncated - bBefore.RxTruncated; tr != 0 {
		t.Errorf("receiver counted %d truncated frames", tr)
	}
}

func testBurst(t *testing.T, mk MakePair, opts Options) {
	p := mk(t)
	burst(t, p, p.A, p.B, opts.Frames, opts, 1)
}

func testBothDirections(t *testing.T, mk MakePair, opts Options) {
	p := mk(t)
	n := opts.Frames / 4
	// Parallel subtests run together once this function returns.
	t.Run("AtoB", func(t *testing.T) { t.Parallel(); burst(t, p, p.A, p.B, n, opts, 2) })
	t.Run("BtoA", func(t *testing.T) { t.Parallel(); burst(t, p, p.B, p.A, n, opts, 3) })
}

func testTruncation(t *testing.T, mk MakePair, opts Options) {
	p := mk(t)
	f := frame(make([]byte, 300), p.B.HardwareAddr(), p.A.HardwareAddr(), 4, 0, 300)
	st0 := p.B.Stats()
	before := st0.RxTruncated
	small := make([]byte, 100)
	sizes := []int{0}
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		if _, err := p.A.Send([][]byte{f}); err != nil {
			t.Fatal(err)
		}
		n, err := p.B.Recv([][]byte{small}, sizes, 200*time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		if n == 1 {
			if sizes[0] != 100 || string(small) != string(f[:100]) {
				t.Fatalf("truncated frame: size %d, want 100 and the first 100 bytes", sizes[0])
			}
			st := p.B.Stats()
			if got := st.RxTruncated - before; got != 1 {
				t.Fatalf("RxTruncated grew by %d, want 1", got)
			}
			// RxBytes counts what Recv stored, not what the wire carried.
			if got := st.RxBytes - st0.RxBytes; got != 100 && !opts.Faults {
				t.Errorf("RxBytes grew by %d for a frame truncated to 100 bytes, want 100", got)
			}
			return
		}
		if !opts.Faults {
			break
		}
	}
	t.Fatal("no frame received")
}

func testRecvTimeout(t *testing.T, mk MakePair, opts Options) {
	p := mk(t)
	b, sizes := bufs(4, 2048)
	start := time.Now()
	n, err := p.B.Recv(b, sizes, 0)
	if n != 0 || err != nil {
		t.Fatalf("Recv(timeout 0) on an idle link = %d, %v", n, err)
	}
	start = time.Now()
	n, err = p.B.Recv(b, sizes, 50*time.Millisecond)
	if el := time.Since(start); n != 0 || err != nil || el < 45*time.Millisecond {
		t.Fatalf("Recv(timeout 50ms) on an idle link = %d, %v after %v", n, err, el)
	}

	// No buffers: nothing to wait for, even with a frame waiting and no
	// bound on the wait; the frame stays for the next Recv.
	f := frame(make([]byte, 64), p.B.HardwareAddr(), p.A.HardwareAddr(), 5, 0, 64)
	if _, err := p.A.Send([][]byte{f}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(20 * time.Millisecond)
	done := make(chan error, 1)
	go func() {
		n, err := p.B.Recv(nil, nil, -1)
		if n != 0 && err == nil {
			err = fmt.Errorf("%d frames", n)
		}
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Recv with no buffers = %v, want 0, nil", err)
		}
	case <-time.After(2 * time.Second):
		p.B.Close()
		<-done
		t.Fatal("Recv with no buffers and no bound did not return")
	}
	if n, err := p.B.Recv(b, sizes, time.Second); (n != 1 && !opts.Faults) || err != nil {
		t.Fatalf("Recv after one with no buffers = %d, %v; want the frame sent", n, err)
	}
}

// testWaitMeter checks what a WaitMeter says of a receive that timed
// out, of one that found a frame at once, and of a poll.
func testWaitMeter(t *testing.T, mk MakePair) {
	p := mk(t)
	m, ok := p.B.(xdp.WaitMeter)
	if !ok {
		t.Logf("%s does not implement xdp.WaitMeter", p.B.Info().Kind)
		return
	}
	b, sizes := bufs(4, 2048)
	if n, err := p.B.Recv(b, sizes, 30*time.Millisecond); n != 0 || err != nil {
		t.Fatalf("Recv(timeout 30ms) on an idle link = %d, %v", n, err)
	}
	d, ok := m.Waited()
	if !ok && strings.Contains(p.B.Info().Mode, "spin") {
		return // a spinning receive reads the clock: it cannot tell
	}
	if !ok || d != 30*time.Millisecond {
		t.Errorf("Waited after a receive that timed out after 30ms = %v, %v; want 30ms, true", d, ok)
	}
	f := make([]byte, 64)
	copy(f[0:6], p.B.HardwareAddr())
	copy(f[6:12], p.A.HardwareAddr())
	binary.BigEndian.PutUint16(f[12:14], xdp.DefaultEtherType)
	if _, err := p.A.Send([][]byte{f}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(20 * time.Millisecond) // the frame is there before the receive
	if n, err := p.B.Recv(b, sizes, time.Second); n != 1 || err != nil {
		t.Fatalf("Recv(timeout 1s) with a frame waiting = %d, %v", n, err)
	}
	d, ok = m.Waited()
	if !ok || d > 10*time.Millisecond {
		t.Errorf("Waited after a receive that found its frame = %v, %v; want about 0, true", d, ok)
	}
	// A poll leaves it as it was.
	if n, err := p.B.Recv(b, sizes, 0); n != 0 || err != nil {
		t.Fatalf("Recv(timeout 0) on an idle link = %d, %v", n, err)
	}
	if d2, ok := m.Waited(); !ok || d2 != d {
		t.Errorf("Waited after a poll = %v, %v; want %v, true as before it", d2, ok, d)
	}
}

func testWake(t *testing.T, mk MakePair) {
	p := mk(t)
	w, ok := p.B.(xdp.Waker)
	if !ok {
		t.Skipf("%s does not implement xdp.Waker", p.B.Info().Kind)
	}
	b, sizes := bufs(4, 2048)
	// A wake-up requested before Recv ends its wait at once.
	w.Wake()
	start := time.Now()
	if n, err := p.B.Recv(b, sizes, 5*time.Second); n != 0 || err != nil || time.Since(start) > time.Second {
		t.Fatalf("Recv after Wake = %d, %v after %v; want 0, nil at once", n, err, time.Since(start))
	}
	// A wake-up ends a Recv that is already waiting.
	type result struct {
		n   int
		err error
	}
	res := make(chan result, 1)
	go func() {
		n, err := p.B.Recv(b, sizes, -1)
		res <- result{n, err}
	}()
	time.Sleep(50 * time.Millisecond)
	w.Wake()
	select {
	case r := <-res:
		if r.n != 0 || r.err != nil {
			t.Fatalf("woken Recv = %d, %v; want 0, nil", r.n, r.err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Recv still waiting 5 s after Wake")
	}
	// The wake-up is used up: the next Recv waits for its timeout again.
	start = time.Now()
	if n, err := p.B.Recv(b, sizes, 50*time.Millisecond); n != 0 || err != nil || time.Since(start) < 40*time.Millisecond {
		t.Fatalf("Recv after a used wake-up = %d, %v after %v; want a 50 ms wait", n, err, time.Since(start))
	}
}

func testCloseUnblocks(t *testing.T, mk MakePair) {
	p := mk(t)
	b, sizes := bufs(4, 2048)
	errc := make(chan error, 1)
	go func() {
		_, err := p.B.Recv(b, sizes, -1)
		errc <- err
	}()
	time.Sleep(50 * time.Millisecond) // let it block
	if err := p.B.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}
	select {
	case err := <-errc:
		if !errors.Is(err, net.ErrClosed) {
			t.Fatalf("blocked Recv returned %v after Close, want net.ErrClosed", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Recv still blocked 5 s after Close")
	}
	if _, err := p.B.Recv(b, sizes, 0); !errors.Is(err, net.ErrClosed) {
		t.Errorf("Recv after Close = %v, want net.ErrClosed", err)
	}
	f := frame(make([]byte, 100), p.A.HardwareAddr(), p.B.HardwareAddr(), 5, 0, 100)
	if _, err := p.B.Send([][]byte{f}); !errors.Is(err, net.ErrClosed) {
		t.Errorf("Send after Close = %v, want net.ErrClosed", err)
	}
	if err := p.B.Close(); err != nil {
		t.Errorf("second Close = %v", err)
	}
	_ = p.B.Stats() // must not crash after Close
}

// testCloseWhilePolling closes a link while goroutines poll it (Recv and,
// if it has it, RecvVisit, with timeout 0: calls that may take no lock)
// and send on it as fast as they can, with frames arriving: each call
// returns net.ErrClosed once the link is closed, none crashes. It runs on
// a few pairs, so that Close lands at different points of the calls.
func testCloseWhilePolling(t *testing.T, mk MakePair) {
	for round := range 3 {
		p := mk(t)
		var calls [3]atomic.Int64
		var closing atomic.Bool
		errc := make(chan error, 3)
		loop := func(i int, call func() error) {
			for {
				calls[i].Add(1)
				if err := call(); err != nil {
					if !closing.Load() {
						err = fmt.Errorf("before Close: %v", err) // not net.ErrClosed
					}
					errc <- err
					return
				}
			}
		}
		b, sizes := bufs(4, 2048)
		go loop(0, func() error { _, err := p.B.Recv(b, sizes, 0); return err })
		nop := visitFunc(func([]byte) {})
		v, visits := p.B.(xdp.FrameVisitor)
		if visits {
			go loop(1, func() error { _, err := v.RecvVisit(4, 0, nop); return err })
		}
		out := frame(make([]byte, 100), p.A.HardwareAddr(), p.B.HardwareAddr(), 7, 0, 100)
		go loop(2, func() error { _, err := p.B.Send([][]byte{out}); return err })
		in := frame(make([]byte, 100), p.B.HardwareAddr(), p.A.HardwareAddr(), 7, 0, 100)
		for i := 0; i < 200 && (calls[0].Load() < 1000 || calls[2].Load() < 100); i++ {
			p.A.Send([][]byte{in, in})
			time.Sleep(time.Millisecond)
		}
		closing.Store(true)
		if err := p.B.Close(); err != nil {
			t.Fatalf("round %d: close: %v", round, err)
		}
		want := 2
		if visits {
			want = 3
		}
		for range want {
			select {
			case err := <-errc:
				if !errors.Is(err, net.ErrClosed) {
					t.Fatalf("round %d: a call returned %v, want net.ErrClosed after Close", round, err)
				}
			case <-time.After(5 * time.Second):
				t.Fatalf("round %d: a call still running 5 s after Close", round)
			}
		}
		t.Logf("round %d: %d receives, %d visits, %d sends before Close", round, calls[0].Load(), calls[1].Load(), calls[2].Load())
		if err := p.A.Close(); err != nil { // the next pair may want its queue
			t.Fatalf("round %d: close: %v", round, err)
		}
	}
}

// testIdleProber checks RxIdle, on the links that implement it: true on
// an idle link, false once frames are there to receive, true again once
// they are received. A link may need a receive to settle first (an AF_XDP
// fill ring asking for a wake-up at the start counts as not idle).
func testIdleProber(t *testing.T, mk MakePair) {
	p := mk(t)
	ip, ok := p.B.(xdp.IdleProber)
	if !ok {
		t.Logf("%s does not implement xdp.IdleProber", p.B.Info().Kind)
		return
	}
	b, sizes := bufs(16, 2048)
	settle := func(what string) {
		t.Helper()
		for deadline := time.Now().Add(2 * time.Second); !ip.RxIdle(); {
			if time.Now().After(deadline) {
				t.Fatalf("RxIdle still false 2 s %s", what)
			}
			if _, err := p.B.Recv(b, sizes, 0); err != nil {
				t.Fatal(err)
			}
			time.Sleep(time.Millisecond)
		}
	}
	settle("after opening, receiving all the while")
	// Several frames: a link with injected loss keeps some.
	f := frame(make([]byte, 100), p.B.HardwareAddr(), p.A.HardwareAddr(), 8, 0, 100)
	if _, err := p.A.Send([][]byte{f, f, f, f, f, f, f, f}); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(2 * time.Second); ip.RxIdle(); {
		if time.Now().After(deadline) {
			t.Fatal("RxIdle still true 2 s after frames were sent to the link")
		}
		time.Sleep(time.Millisecond)
	}
	if n, err := p.B.Recv(b, sizes, time.Second); n == 0 || err != nil {
		t.Fatalf("Recv after RxIdle said false = %d, %v; want frames", n, err)
	}
	settle("after the frames were received")
}

// testNoLeaks opens and closes pairs, with traffic and a blocked receiver,
// and checks that goroutines and file descriptors come back to where they
// were.
func testNoLeaks(t *testing.T, mk MakePair) {
	// One pair first so that lazily created process-wide state exists.
	closeAll(t, mk(t))
	g0, fd0 := runtime.NumGoroutine(), countFDs()
	for i := 0; i < 3; i++ {
		p := mk(t)
		f := frame(make([]byte, 200), p.B.HardwareAddr(), p.A.HardwareAddr(), 6, uint64(i), 200)
		if _, err := p.A.Send([][]byte{f, f, f}); err != nil {
			t.Fatal(err)
		}
		done := make(chan struct{})
		go func() {
			defer close(done)
			b, sizes := bufs(4, 2048)
			for {
				if _, err := p.B.Recv(b, sizes, -1); err != nil {
					return
				}
			}
		}()
		time.Sleep(10 * time.Millisecond)
		closeAll(t, p)
		<-done
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		g, fd := runtime.NumGoroutine(), countFDs()
		if g <= g0 && fd <= fd0 {
			return
		}
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<16)
			buf = buf[:runtime.Stack(buf, true)]
			t.Fatalf("leak: goroutines %d → %d, file descriptors %d → %d\n%s", g0, g, fd0, fd, buf)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func closeAll(t *testing.T, p Pair) {
	t.Helper()
	for _, l := range []xdp.Link{p.A, p.B} {
		if err := l.Close(); err != nil {
			t.Errorf("close %v: %v", l.Info(), err)
		}
	}
}

// countFDs counts this process's open file descriptors (-1 if unknown).
func countFDs() int {
	d, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return -1
	}
	return len(d)
}
