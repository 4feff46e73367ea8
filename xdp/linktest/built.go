package linktest

// Subtests of the optional in-place interfaces, xdp.FrameBuilder and
// xdp.FrameVisitor. Each is skipped on a link that lacks the interface.

import (
	"errors"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/xmx-stack/xmx/xdp"
)

// inPlacePair returns the pair's links as builders and visitors, skipping
// the test when one of them lacks either interface.
func inPlacePair(t *testing.T, p Pair) (ab, bb xdp.FrameBuilder, av, bv xdp.FrameVisitor) {
	t.Helper()
	var ok [4]bool
	ab, ok[0] = p.A.(xdp.FrameBuilder)
	bb, ok[1] = p.B.(xdp.FrameBuilder)
	av, ok[2] = p.A.(xdp.FrameVisitor)
	bv, ok[3] = p.B.(xdp.FrameVisitor)
	if ok != [4]bool{true, true, true, true} {
		t.Skipf("%s does not implement xdp.FrameBuilder and xdp.FrameVisitor", p.A.Info().Kind)
	}
	return ab, bb, av, bv
}

// testBuiltBurst sends bursts of every size built in place and receives them
// in place, then mixed with Send and Recv, and checks what arrives and what
// the counters say, as the plain burst does.
func testBuiltBurst(t *testing.T, mk MakePair, opts Options) {
	p := mk(t)
	inPlacePair(t, p)
	t.Run("InPlace", func(t *testing.T) { burstIO(t, p, p.A, p.B, opts.Frames, opts, 11, inPlace, inPlace) })
	t.Run("Mixed", func(t *testing.T) { burstIO(t, p, p.A, p.B, opts.Frames/2, opts, 12, mixed, mixed) })
	t.Run("BuiltToRecv", func(t *testing.T) { burstIO(t, p, p.A, p.B, opts.Frames/8, opts, 13, inPlace, plain) })
	t.Run("SendToVisit", func(t *testing.T) { burstIO(t, p, p.A, p.B, opts.Frames/8, opts, 14, plain, inPlace) })
}

// testBuiltBothDirections runs in-place bursts both ways at once, so that
// SendBuilt and RecvVisit of one link run concurrently.
func testBuiltBothDirections(t *testing.T, mk MakePair, opts Options) {
	p := mk(t)
	inPlacePair(t, p)
	n := opts.Frames / 4
	t.Run("AtoB", func(t *testing.T) { t.Parallel(); burstIO(t, p, p.A, p.B, n, opts, 15, inPlace, mixed) })
	t.Run("BtoA", func(t *testing.T) { t.Parallel(); burstIO(t, p, p.B, p.A, n, opts, 16, mixed, inPlace) })
}

// lenBuilder builds valid frames, except that it returns bad[i] as the
// length of frame i when present; it records the indexes it was called for.
type lenBuilder struct {
	dst, src net.HardwareAddr
	run      uint32
	size     int
	bad      map[int]int
	calls    []int
}

func (b *lenBuilder) Build(i int, buf []byte) int {
	b.calls = append(b.calls, i)
	f := frame(buf, b.dst, b.src, b.run, uint64(i), b.size)
	if n, ok := b.bad[i]; ok {
		return n
	}
	return len(f)
}

// collect receives frames of run from l with RecvVisit, until it has want
// of them and then none comes for 20 ms, or for d, and returns their
// sequence numbers.
func collect(t *testing.T, l xdp.Link, v xdp.FrameVisitor, src net.HardwareAddr, run uint32, want int, d time.Duration) []uint64 {
	t.Helper()
	var seqs []uint64
	visit := visitFunc(func(f []byte) {
		if seq, err := parse(f, l.HardwareAddr(), src, run); err == nil {
			seqs = append(seqs, seq)
		} else if !errors.Is(err, errStale) {
			t.Errorf("frame received: %v", err)
		}
	})
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		n, err := v.RecvVisit(64, 20*time.Millisecond, visit)
		if err != nil {
			t.Fatalf("RecvVisit: %v", err)
		}
		if n == 0 && len(seqs) >= want {
			break
		}
	}
	return seqs
}

// testBuiltErrors checks SendBuilt's refusals: a frame of a bad length stops
// the call there, unsent and uncounted, the frames before it going out; and
// the degenerate calls.
func testBuiltErrors(t *testing.T, mk MakePair, opts Options) {
	p := mk(t)
	ab, _, _, bv := inPlacePair(t, p)
	maxLen := xdp.MaxFrameLen(p.A)
	for _, c := range []struct {
		name string
		bad  int
		want error
	}{
		{"TooLong", maxLen + 1, xdp.ErrFrameTooLong},
		{"TooShort", xdp.EthHeaderLen - 1, xdp.ErrFrameTooShort},
		{"Negative", -1, xdp.ErrFrameTooShort},
	} {
		t.Run(c.name, func(t *testing.T) {
			b := &lenBuilder{dst: p.B.HardwareAddr(), src: p.A.HardwareAddr(), run: 20, size: 200, bad: map[int]int{2: c.bad}}
			before := p.A.Stats()
			n, err := ab.SendBuilt(4, b)
			if n != 2 || !errors.Is(err, c.want) {
				t.Fatalf("SendBuilt with frame 2 of length %d = %d, %v; want 2, %v", c.bad, n, err, c.want)
			}
			if len(b.calls) != 3 || b.calls[0] != 0 || b.calls[1] != 1 || b.calls[2] != 2 {
				t.Errorf("Build called for %v, want [0 1 2]", b.calls)
			}
			after := p.A.Stats()
			if after.TxFrames-before.TxFrames != 2 || after.TxBytes-before.TxBytes != 400 {
				t.Errorf("counted %d frames, %d bytes sent; want 2, 400", after.TxFrames-before.TxFrames, after.TxBytes-before.TxBytes)
			}
			seqs := collect(t, p.B, bv, p.A.HardwareAddr(), 20, 2, time.Second)
			if !opts.Faults && (len(seqs) != 2 || seqs[0] != 0 || seqs[1] != 1) {
				t.Errorf("received frames %v, want [0 1]", seqs)
			}
		})
	}
	t.Run("Degenerate", func(t *testing.T) {
		b := &lenBuilder{dst: p.B.HardwareAddr(), src: p.A.HardwareAddr(), run: 21, size: 100}
		if n, err := ab.SendBuilt(0, b); n != 0 || err != nil || len(b.calls) != 0 {
			t.Errorf("SendBuilt(0) = %d, %v with %d Build calls; want 0, nil, none", n, err, len(b.calls))
		}
		if n, err := ab.SendBuilt(-1, b); n != 0 || err != nil || len(b.calls) != 0 {
			t.Errorf("SendBuilt(-1) = %d, %v with %d Build calls; want 0, nil, none", n, err, len(b.calls))
		}
		if n, err := ab.SendBuilt(1, nil); n != 0 || err == nil {
			t.Errorf("SendBuilt with a nil Builder = %d, %v; want an error", n, err)
		}
		if n, err := bv.RecvVisit(4, 0, nil); n != 0 || err == nil {
			t.Errorf("RecvVisit with a nil Visitor = %d, %v; want an error", n, err)
		}
	})
}

// testVisitMax checks that RecvVisit shows at most max frames per call, each
// exactly once, and that max <= 0 shows none.
func testVisitMax(t *testing.T, mk MakePair, opts Options) {
	p := mk(t)
	ab, _, _, bv := inPlacePair(t, p)
	const total = 7
	b := &lenBuilder{dst: p.B.HardwareAddr(), src: p.A.HardwareAddr(), run: 22, size: 300}
	if n, err := ab.SendBuilt(total, b); n != total || err != nil {
		t.Fatalf("SendBuilt(%d) = %d, %v", total, n, err)
	}
	var seqs []uint64
	calls := 0
	visit := visitFunc(func(f []byte) {
		calls++
		if len(f) != 300 {
			t.Errorf("visited a frame of %d bytes, want 300", len(f))
		}
		if seq, err := parse(f, p.B.HardwareAddr(), p.A.HardwareAddr(), 22); err == nil {
			seqs = append(seqs, seq)
		}
	})
	// Let the frames arrive, then check max <= 0.
	time.Sleep(20 * time.Millisecond)
	for _, max := range []int{0, -1} {
		if n, err := bv.RecvVisit(max, 10*time.Millisecond, visit); n != 0 || err != nil || calls != 0 {
			t.Fatalf("RecvVisit(max %d) = %d, %v with %d visits; want 0, nil, none", max, n, err, calls)
		}
	}
	deadline := time.Now().Add(2 * time.Second)
	for len(seqs) < total && time.Now().Before(deadline) {
		before := calls
		n, err := bv.RecvVisit(2, 100*time.Millisecond, visit)
		if err != nil {
			t.Fatal(err)
		}
		if n > 2 || calls-before != n {
			t.Fatalf("RecvVisit(max 2) = %d with %d visits", n, calls-before)
		}
		if n == 0 && opts.Faults {
			break
		}
	}
	if opts.Faults {
		return
	}
	for i, s := range seqs {
		if s != uint64(i) || len(seqs) != total {
			t.Fatalf("visited %v, want 0..%d in order", seqs, total-1)
		}
	}
}

// testVisitWait checks RecvVisit's waiting: the timeouts, Wake, and Close
// ending a blocked call with net.ErrClosed; and SendBuilt after Close.
func testVisitWait(t *testing.T, mk MakePair) {
	p := mk(t)
	ab, bb, _, bv := inPlacePair(t, p)
	nop := visitFunc(func([]byte) { t.Error("visited a frame on an idle link") })
	if n, err := bv.RecvVisit(4, 0, nop); n != 0 || err != nil {
		t.Fatalf("RecvVisit(timeout 0) on an idle link = %d, %v", n, err)
	}
	start := time.Now()
	if n, err := bv.RecvVisit(4, 50*time.Millisecond, nop); n != 0 || err != nil || time.Since(start) < 45*time.Millisecond {
		t.Fatalf("RecvVisit(timeout 50ms) on an idle link = %d, %v after %v", n, err, time.Since(start))
	}
	if w, ok := p.B.(xdp.Waker); ok {
		w.Wake()
		start := time.Now()
		if n, err := bv.RecvVisit(4, 5*time.Second, nop); n != 0 || err != nil || time.Since(start) > time.Second {
			t.Fatalf("RecvVisit after Wake = %d, %v after %v; want 0, nil at once", n, err, time.Since(start))
		}
		res := make(chan error, 1)
		go func() {
			_, err := bv.RecvVisit(4, -1, nop)
			res <- err
		}()
		time.Sleep(50 * time.Millisecond)
		w.Wake()
		select {
		case err := <-res:
			if err != nil {
				t.Fatalf("woken RecvVisit = %v", err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("RecvVisit still waiting 5 s after Wake")
		}
	}
	errc := make(chan error, 1)
	go func() {
		_, err := bv.RecvVisit(4, -1, nop)
		errc <- err
	}()
	time.Sleep(50 * time.Millisecond)
	if err := p.B.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}
	select {
	case err := <-errc:
		if !errors.Is(err, net.ErrClosed) {
			t.Fatalf("blocked RecvVisit returned %v after Close, want net.ErrClosed", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("RecvVisit still blocked 5 s after Close")
	}
	if _, err := bv.RecvVisit(4, 0, nop); !errors.Is(err, net.ErrClosed) {
		t.Errorf("RecvVisit after Close = %v, want net.ErrClosed", err)
	}
	b := &lenBuilder{dst: p.A.HardwareAddr(), src: p.B.HardwareAddr(), run: 23, size: 100}
	if _, err := bb.SendBuilt(1, b); !errors.Is(err, net.ErrClosed) || len(b.calls) != 0 {
		t.Errorf("SendBuilt after Close = %v with %d Build calls, want net.ErrClosed and none", err, len(b.calls))
	}
	// A closed link says so first, whatever else is wrong with the call.
	if _, err := bb.SendBuilt(1, nil); !errors.Is(err, net.ErrClosed) {
		t.Errorf("SendBuilt(1, nil) after Close = %v, want net.ErrClosed", err)
	}
	if _, err := bv.RecvVisit(4, 0, nil); !errors.Is(err, net.ErrClosed) {
		t.Errorf("RecvVisit(4, 0, nil) after Close = %v, want net.ErrClosed", err)
	}
	if ts, ok := p.B.(xdp.TailSender); ok {
		if _, err := ts.SendTails(1, nil); !errors.Is(err, net.ErrClosed) {
			t.Errorf("SendTails(1, nil) after Close = %v, want net.ErrClosed", err)
		}
	}
	if bl, ok := p.B.(xdp.BufferLink); ok {
		if _, err := bl.SendGather(1, nil); !errors.Is(err, net.ErrClosed) {
			t.Errorf("SendGather(1, nil) after Close = %v, want net.ErrClosed", err)
		}
	}
	if err := p.A.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}
	if _, err := ab.SendBuilt(1, b); !errors.Is(err, net.ErrClosed) {
		t.Errorf("SendBuilt after Close = %v, want net.ErrClosed", err)
	}
}

// oneBuilder builds one fixed frame; oneVisitor counts what it is shown.
// Pointers to them are passed, so that the calls need not allocate.
type oneBuilder struct{ f []byte }

func (b *oneBuilder) Build(_ int, buf []byte) int { return copy(buf, b.f) }

type oneVisitor struct{ n, bytes int }

func (v *oneVisitor) Visit(f []byte) { v.n++; v.bytes += len(f) }

// testWakeInVisitDuringClose closes a link while a visitor, shown a frame
// in RecvVisit, calls Wake: Close waits for the receive to end, so Wake
// must not wait for Close.
func testWakeInVisitDuringClose(t *testing.T, mk MakePair) {
	p := mk(t)
	w, ok := p.B.(xdp.Waker)
	if !ok {
		t.Skipf("%s does not implement xdp.Waker", p.B.Info().Kind)
	}
	ab, _, _, bv := inPlacePair(t, p)
	started := make(chan struct{})
	var once sync.Once
	v := visitFunc(func([]byte) {
		once.Do(func() {
			close(started)
			time.Sleep(100 * time.Millisecond) // Close is waiting by now
			w.Wake()
		})
	})
	visited := visitOne(bv, v)
	b := &lenBuilder{dst: p.B.HardwareAddr(), src: p.A.HardwareAddr(), run: 29, size: 100}
	for deadline := time.Now().Add(5 * time.Second); ; {
		if _, err := ab.SendBuilt(1, b); err != nil {
			t.Fatal(err)
		}
		select {
		case <-started:
		case <-time.After(20 * time.Millisecond):
			if time.Now().Before(deadline) {
				continue
			}
			t.Fatal("no frame visited")
		}
		break
	}
	closed := make(chan error, 1)
	go func() { closed <- p.B.Close() }()
	select {
	case err := <-closed:
		if err != nil {
			t.Errorf("Close = %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Close and a visitor calling Wake deadlocked")
	}
	<-visited
	w.Wake() // after Close: nothing to wake, no harm
}

// visitOne receives with v, in a goroutine, until a frame was visited or
// 5 s have passed, and then sends what the last RecvVisit returned.
func visitOne(bv xdp.FrameVisitor, v xdp.Visitor) <-chan error {
	done := make(chan error, 1)
	go func() {
		var err error
		for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); {
			var n int
			if n, err = bv.RecvVisit(4, 50*time.Millisecond, v); n > 0 || err != nil {
				break
			}
		}
		done <- err
	}()
	return done
}

// blockBuilder builds one frame, but first tells started and waits for
// release.
type blockBuilder struct {
	lenBuilder
	started, release chan struct{}
}

func (b *blockBuilder) Build(i int, buf []byte) int {
	close(b.started)
	<-b.release
	return b.lenBuilder.Build(i, buf)
}

// testCloseWaitsForCalls closes a link while a Build, then a Visit, of it
// runs: Close returns only once the call has ended, so that after Close
// nothing of the link runs any more.
func testCloseWaitsForCalls(t *testing.T, mk MakePair) {
	closeDuring := func(t *testing.T, l xdp.Link, started, release chan struct{}, call <-chan error) {
		t.Helper()
		select {
		case <-started:
		case <-time.After(5 * time.Second):
			t.Fatal("the call did not start")
		}
		closed := make(chan error, 1)
		go func() { closed <- l.Close() }()
		select {
		case <-closed:
			close(release)
			<-call
			t.Fatal("Close returned while a call of the link was under way")
		case <-time.After(100 * time.Millisecond):
		}
		close(release)
		select {
		case <-closed:
		case <-time.After(5 * time.Second):
			t.Fatal("Close did not return after the call ended")
		}
		<-call
	}
	t.Run("Build", func(t *testing.T) {
		p := mk(t)
		ab, _, _, _ := inPlacePair(t, p)
		b := &blockBuilder{lenBuilder: lenBuilder{dst: p.B.HardwareAddr(), src: p.A.HardwareAddr(), run: 31, size: 100},
			started: make(chan struct{}), release: make(chan struct{})}
		call := make(chan error, 1)
		go func() { _, err := ab.SendBuilt(1, b); call <- err }()
		closeDuring(t, p.A, b.started, b.release, call)
	})
	t.Run("Visit", func(t *testing.T) {
		p := mk(t)
		ab, _, _, bv := inPlacePair(t, p)
		started, release := make(chan struct{}), make(chan struct{})
		var once sync.Once
		v := visitFunc(func([]byte) { once.Do(func() { close(started); <-release }) })
		call := visitOne(bv, v)
		b := &lenBuilder{dst: p.B.HardwareAddr(), src: p.A.HardwareAddr(), run: 32, size: 100}
		go func() { // until the frame is seen (the link may lose some)
			for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); {
				if _, err := ab.SendBuilt(1, b); err != nil {
					return
				}
				select {
				case <-started:
					return
				case <-time.After(20 * time.Millisecond):
				}
			}
		}()
		closeDuring(t, p.B, started, release, call)
	})
}

// testBuiltNoAllocs checks that SendBuilt and RecvVisit make no heap
// allocation in steady state.
func testBuiltNoAllocs(t *testing.T, mk MakePair, opts Options) {
	if raceEnabled {
		t.Skip("allocation counts are meaningless under the race detector")
	}
	if opts.Faults {
		t.Skip("frames may be lost")
	}
	p := mk(t)
	ab, _, _, bv := inPlacePair(t, p)
	b := &oneBuilder{f: frame(make([]byte, 1000), p.B.HardwareAddr(), p.A.HardwareAddr(), 24, 0, 1000)}
	v := &oneVisitor{}
	allocs := testing.AllocsPerRun(2000, func() {
		if n, err := ab.SendBuilt(1, b); n != 1 || err != nil {
			t.Fatalf("SendBuilt = %d, %v", n, err)
		}
		if n, err := bv.RecvVisit(1, time.Second, v); n != 1 || err != nil {
			t.Fatalf("RecvVisit = %d, %v", n, err)
		}
	})
	if allocs != 0 {
		t.Errorf("%.1f allocations per SendBuilt+RecvVisit, want 0", allocs)
	}
	if v.bytes != v.n*1000 {
		t.Errorf("visited %d bytes in %d frames, want 1000 each", v.bytes, v.n)
	}

	// A receive that times out (it asks the link whether its interface
	// is gone) allocates nothing either.
	idle := testing.AllocsPerRun(20, func() {
		if n, err := bv.RecvVisit(1, 100*time.Microsecond, v); n != 0 || err != nil {
			t.Fatalf("RecvVisit with nothing sent = %d, %v", n, err)
		}
	})
	if idle != 0 {
		t.Errorf("%.1f allocations per timed-out RecvVisit, want 0", idle)
	}

	// SendGather, on links that lend buffers.
	bl, ok := p.A.(xdp.BufferLink)
	if !ok {
		return
	}
	buf, err := bl.AllocBuffer(1000)
	if errors.Is(err, xdp.ErrNoBufferSpace) {
		return
	}
	if err != nil {
		t.Fatal(err)
	}
	defer buf.Free()
	copy(buf.Bytes(), b.f)
	g := &gatherer{whole: [][]byte{b.f}, specs: []gatherSpec{{head: 100, tail: xdp.Span{Buf: buf, Off: 100, Len: 900}}}}
	*v = oneVisitor{}
	allocs = testing.AllocsPerRun(2000, func() {
		if n, err := bl.SendGather(1, g); n != 1 || err != nil {
			t.Fatalf("SendGather = %d, %v", n, err)
		}
		if n, err := bv.RecvVisit(1, time.Second, v); n != 1 || err != nil {
			t.Fatalf("RecvVisit = %d, %v", n, err)
		}
	})
	if allocs != 0 {
		t.Errorf("%.1f allocations per SendGather+RecvVisit, want 0", allocs)
	}
	if v.bytes != v.n*1000 {
		t.Errorf("visited %d bytes in %d gathered frames, want 1000 each", v.bytes, v.n)
	}
}
