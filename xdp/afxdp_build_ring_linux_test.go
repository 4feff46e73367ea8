package xdp

// White-box tests of SendBuilt and RecvVisit on rings held in ordinary
// memory (see afxdp_sg_ring_linux_test.go): where frames are built, which
// descriptors come out, what goes back to txFree and the fill ring, and what
// a panicking Build or Visit leaves behind.

import (
	"bytes"
	"encoding/binary"
	"errors"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// patBuilder builds frames of the given sizes with pattern(size, i); it
// records the buffers it was handed and panics at frame panicAt (>= 0).
type patBuilder struct {
	sizes   []int
	bufs    [][]byte
	panicAt int
}

func (b *patBuilder) Build(i int, buf []byte) int {
	if i == b.panicAt {
		panic("build")
	}
	b.bufs = append(b.bufs, buf)
	copy(buf, pattern(b.sizes[i], byte(i)))
	return b.sizes[i]
}

// txFrame returns the frame produced on the TX ring starting at descriptor
// index at, and the index after it.
func txFrame(l *AFXDPLink, at uint32) ([]byte, uint32) {
	var f []byte
	for {
		d := l.tx.descs[at&l.tx.mask]
		f = append(f, l.umem[d.Addr:d.Addr+uint64(d.Len)]...)
		at++
		if d.Options&unix.XDP_PKT_CONTD == 0 {
			return f, at
		}
	}
}

// complete plays the kernel's completion of every descriptor produced so
// far, in order.
func complete(l *AFXDPLink) {
	for c := *l.tx.consumer; c != *l.tx.producer; c++ {
		p := *l.comp.producer
		l.comp.addrs[p&l.comp.mask] = l.tx.descs[c&l.tx.mask].Addr
		*l.comp.producer = p + 1
	}
	*l.tx.consumer = *l.tx.producer
}

// newFakeSG is a multi-buffer fake link at MTU 9000 with 4096-byte frames:
// send slots of 3 frames, 10 of them in the 32-frame send half.
func newFakeSG(t *testing.T) *AFXDPLink {
	l := fakeLink(t, 4096, 64, true)
	l.rxScratch = make([]byte, 0, l.maxFrame)
	if len(l.txFree) != 10 || l.txSlot != 3*4096 {
		t.Fatalf("%d send slots of %d bytes, want 10 of 3×4096", len(l.txFree), l.txSlot)
	}
	return l
}

func TestSendBuiltSingleBufferInPlace(t *testing.T) {
	l := fakeLink(t, 4096, 64, false)
	l.mtu, l.maxFrame = 1500, 1514
	l.initTxFree(64)
	b := &patBuilder{sizes: []int{60, 1514, 700}, panicAt: -1}
	if n, err := l.SendBuilt(3, b); n != 3 || err != nil {
		t.Fatalf("SendBuilt = %d, %v", n, err)
	}
	at := uint32(0)
	for i, size := range b.sizes {
		d := l.tx.descs[at]
		if d.Options != 0 || d.Len != uint32(size) || d.Addr%4096 != 0 || d.Addr < 32*4096 {
			t.Fatalf("frame %d: descriptor %+v", i, d)
		}
		// Build wrote into the UMEM frame the descriptor points at.
		if buf := b.bufs[i]; len(buf) != 1514 || cap(buf) != 1514 || &buf[0] != &l.umem[d.Addr] {
			t.Fatalf("frame %d: built in a buffer of len %d cap %d, not in place", i, len(buf), cap(buf))
		}
		var f []byte
		f, at = txFrame(l, at)
		if !bytes.Equal(f, pattern(size, byte(i))) {
			t.Fatalf("frame %d differs", i)
		}
	}
	if l.txFrames.Load() != 3 || l.txBytes.Load() != 60+1514+700 || len(l.txFree) != 29 {
		t.Fatalf("counters: %d frames, %d bytes; %d idle frames", l.txFrames.Load(), l.txBytes.Load(), len(l.txFree))
	}
}

func TestSendBuiltMultiBuffer(t *testing.T) {
	l := newFakeSG(t)
	half := len(l.txFree)
	sizes := []int{9014, 100, 4096, 4097, 8192, 8193, 60, 9014}
	b := &patBuilder{sizes: sizes, panicAt: -1}
	if n, err := l.SendBuilt(len(sizes), b); n != len(sizes) || err != nil {
		t.Fatalf("SendBuilt = %d, %v", n, err)
	}
	at := uint32(0)
	used := 0
	for i, size := range sizes {
		start := at
		var f []byte
		f, at = txFrame(l, at)
		if !bytes.Equal(f, pattern(size, byte(i))) {
			t.Fatalf("frame %d (%d bytes) differs", i, size)
		}
		// In place: consecutive UMEM frames, the first where Build wrote.
		for j := start; j < at; j++ {
			d := l.tx.descs[j&l.tx.mask]
			if want := l.tx.descs[start&l.tx.mask].Addr + uint64(j-start)*4096; d.Addr != want {
				t.Fatalf("frame %d fragment %d at %#x, want %#x", i, j-start, d.Addr, want)
			}
		}
		if &b.bufs[i][0] != &l.umem[l.tx.descs[start&l.tx.mask].Addr] {
			t.Fatalf("frame %d not built in place", i)
		}
		if want := (size + 4095) / 4096; int(at-start) != want {
			t.Fatalf("frame %d: %d descriptors, want %d", i, at-start, want)
		}
		used += int(at - start)
	}
	if used != 16 || len(l.txFree) != half-len(sizes) {
		t.Errorf("%d descriptors, %d idle slots; want 16, %d", used, len(l.txFree), half-len(sizes))
	}
	// Completions in two halves: a slot is idle once all its descriptors
	// are back, not before.
	complete(l)
	*l.comp.producer -= 8
	l.txMu.Lock()
	l.reclaim()
	free := len(l.txFree)
	l.txMu.Unlock()
	if free != half-len(sizes)+4 { // 3+1+1+2 descriptors: four slots
		t.Fatalf("%d idle slots after 8 completions, want %d", free, half-len(sizes)+4)
	}
	*l.comp.producer += 8
	l.txMu.Lock()
	l.reclaim()
	free = len(l.txFree)
	l.txMu.Unlock()
	if free != half {
		t.Fatalf("%d idle slots after all completions, want %d", free, half)
	}
	// A completion of nothing in flight (a corrupted ring) is ignored.
	l.comp.addrs[*l.comp.producer&l.comp.mask] = l.txBase
	*l.comp.producer++
	l.txMu.Lock()
	l.reclaim()
	free = len(l.txFree)
	l.txMu.Unlock()
	if free != half {
		t.Fatalf("%d idle slots after a stray completion, want %d", free, half)
	}
}

func TestSendBuiltPanic(t *testing.T) {
	l := newFakeSG(t)
	half := len(l.txFree)
	b := &patBuilder{sizes: []int{9014, 200, 300}, panicAt: 2}
	*l.tx.flags = unix.XDP_RING_NEED_WAKEUP // the kernel waits to be asked
	func() {
		defer func() {
			if recover() == nil {
				t.Fatal("Build's panic did not reach the caller")
			}
		}()
		l.SendBuilt(3, b)
	}()
	// Frames 0 and 1 were submitted and counted; no frame leaked.
	if p := *l.tx.producer; p != 4 {
		t.Fatalf("TX producer %d after the panic, want 4 (3+1 descriptors)", p)
	}
	if l.txFrames.Load() != 2 || len(l.txFree) != half-2 {
		t.Fatalf("%d frames counted, %d idle slots; want 2, %d", l.txFrames.Load(), len(l.txFree), half-2)
	}
	// And the kernel was asked to send them.
	if l.wakeups.Load() == 0 {
		t.Fatal("the frames built before the panic were submitted but the kernel was not woken")
	}
	*l.tx.flags = 0
	// The locks were released.
	if n, err := l.SendBuilt(1, &patBuilder{sizes: []int{60}, panicAt: -1}); n != 1 || err != nil {
		t.Fatalf("SendBuilt after a panic = %d, %v", n, err)
	}
}

func TestSendBuiltStallAndErrors(t *testing.T) {
	l := newFakeSG(t)
	l.txMu.Lock()
	l.txFree = l.txFree[:0]
	l.txMu.Unlock()
	b := &patBuilder{sizes: []int{60}, panicAt: -1}
	if n, err := l.SendBuilt(1, b); n != 0 || !errors.Is(err, ErrTxStalled) || len(b.bufs) != 0 {
		t.Fatalf("SendBuilt with no idle slot = %d, %v after %d Builds; want 0, ErrTxStalled, none", n, err, len(b.bufs))
	}
	l = newFakeSG(t)
	half := len(l.txFree)
	b = &patBuilder{sizes: []int{60, 9015}, panicAt: -1}
	if n, err := l.SendBuilt(2, b); n != 1 || !errors.Is(err, ErrFrameTooLong) {
		t.Fatalf("SendBuilt of a 9015-byte frame = %d, %v", n, err)
	}
	if *l.tx.producer != 1 || len(l.txFree) != half-1 || l.txFrames.Load() != 1 || len(b.bufs) != 2 {
		t.Fatalf("after a refused frame: producer %d, %d idle, %d counted", *l.tx.producer, len(l.txFree), l.txFrames.Load())
	}
}

// recorder is a Visitor keeping copies of the frames it is shown; it panics
// at frame panicAt (>= 0).
type recorder struct {
	frames  [][]byte
	umem    []byte
	inPlace []bool
	panicAt int
}

func (r *recorder) Visit(f []byte) {
	if len(r.frames) == r.panicAt {
		r.panicAt = -1
		panic("visit")
	}
	r.frames = append(r.frames, bytes.Clone(f))
	p, lo := uintptr(unsafe.Pointer(unsafe.SliceData(f))), uintptr(unsafe.Pointer(unsafe.SliceData(r.umem)))
	in := p >= lo && p < lo+uintptr(len(r.umem))
	r.inPlace = append(r.inPlace, in)
}

func (l *AFXDPLink) fakeVisit(max int, v Visitor) int {
	l.rxMu.Lock()
	defer l.rxMu.Unlock()
	return l.visitReady(max, v)
}

func TestVisitReadyMultiBuffer(t *testing.T) {
	l := newFakeSG(t)
	sizes := []int{60, 3840, 3841, 9014, 100}
	for i, n := range sizes {
		kernelRx(l, pattern(n, byte(i)), -1)
	}
	r := &recorder{umem: l.umem, panicAt: -1}
	if n := l.fakeVisit(2, r); n != 2 {
		t.Fatalf("visit(max 2) = %d", n)
	}
	if n := l.fakeVisit(10, r); n != 3 {
		t.Fatalf("visit(max 10) = %d", n)
	}
	for i, f := range r.frames {
		if !bytes.Equal(f, pattern(sizes[i], byte(i))) {
			t.Fatalf("frame %d (%d bytes) differs", i, sizes[i])
		}
		// One-fragment packets are shown in place, the others reassembled.
		if want := sizes[i] <= 3840; r.inPlace[i] != want {
			t.Errorf("frame %d (%d bytes): in place %v, want %v", i, sizes[i], r.inPlace[i], want)
		}
	}
	var total uint64
	for _, n := range sizes {
		total += uint64(n)
	}
	if l.rxFrames.Load() != 5 || l.rxBytes.Load() != total {
		t.Errorf("counters: %d frames, %d bytes", l.rxFrames.Load(), l.rxBytes.Load())
	}
	if *l.fill.producer-*l.fill.consumer != l.fill.size || *l.rx.consumer != *l.rx.producer {
		t.Errorf("frames not all back on the fill ring, or RX not consumed")
	}

	// A packet whose last fragment is not published yet waits.
	kernelRx(l, pattern(9014, 9), 2)
	if n := l.fakeVisit(4, r); n != 0 {
		t.Fatalf("visit with 2 of 3 fragments = %d", n)
	}
	*l.rx.producer++
	if n := l.fakeVisit(4, r); n != 1 || !bytes.Equal(r.frames[5], pattern(9014, 9)) {
		t.Fatalf("visit of the completed packet = %d", n)
	}
}

func TestVisitReadyPanic(t *testing.T) {
	l := newFakeSG(t)
	for i := range 4 {
		kernelRx(l, pattern(500+i, byte(i)), -1)
	}
	r := &recorder{umem: l.umem, panicAt: 1}
	func() {
		defer func() {
			if recover() == nil {
				t.Fatal("Visit's panic did not reach the caller")
			}
		}()
		l.RecvVisit(4, 0, r)
	}()
	// Frames 0 and 1 are consumed (1 when its Visit panicked), published
	// and counted; the link works on.
	if *l.rx.consumer != 2 || l.rxFrames.Load() != 2 || *l.fill.producer-*l.fill.consumer != l.fill.size-2 {
		t.Fatalf("after the panic: RX consumer %d, %d counted, fill %d", *l.rx.consumer, l.rxFrames.Load(), *l.fill.producer-*l.fill.consumer)
	}
	if n, err := l.RecvVisit(4, 0, r); n != 2 || err != nil {
		t.Fatalf("RecvVisit after a panic = %d, %v", n, err)
	}
	if len(r.frames) != 3 || !bytes.Equal(r.frames[2], pattern(503, 3)) {
		t.Fatalf("frames %d", len(r.frames))
	}
}

// The fake-ring benchmarks measure what the in-place calls save in user
// space, without the kernel (whose share of a frame's cost on a veth lab
// dwarfs and blurs it): the CPU time per 1514-byte frame of a messaging
// engine's sender (write a header and 1492 payload bytes of a message, then
// Send; or SendBuilt) and receiver (Recv, then copy the payload into the
// message; or RecvVisit doing the copy), the "kernel" side reduced to moving
// ring indices.

const benchFrame = 1514

func benchFakeLink(b *testing.B) *AFXDPLink {
	l := fakeLink(b, 4096, 512, false)
	l.mtu, l.maxFrame = 1500, 1514
	l.txMu.Lock()
	l.initTxFree(512)
	l.txMu.Unlock()
	return l
}

type benchMsg struct {
	msg []byte
	seq uint64
}

func (m *benchMsg) Build(i int, buf []byte) int {
	seq := m.seq + uint64(i)
	for j := range 12 {
		buf[j] = byte(j)
	}
	buf[12], buf[13] = 0x88, 0xb5
	binary.BigEndian.PutUint64(buf[14:], seq)
	const payload = benchFrame - 22
	off := int(seq*payload) % (len(m.msg) - payload)
	copy(buf[22:benchFrame], m.msg[off:off+payload])
	return benchFrame
}

func (m *benchMsg) Visit(f []byte) {
	seq := binary.BigEndian.Uint64(f[14:])
	payload := len(f) - 22
	off := int(seq*uint64(payload)) % (len(m.msg) - payload)
	copy(m.msg[off:], f[22:])
}

func BenchmarkFakeRingSend1514(b *testing.B) {
	const batch = 64
	for _, inPlace := range []bool{false, true} {
		b.Run(map[bool]string{false: "plain", true: "inplace"}[inPlace], func(b *testing.B) {
			l := benchFakeLink(b)
			m := &benchMsg{msg: make([]byte, 1<<20)}
			frames := make([][]byte, batch)
			for i := range frames {
				frames[i] = make([]byte, benchFrame)
			}
			b.SetBytes(benchFrame)
			b.ResetTimer()
			for done := 0; done < b.N; done += batch {
				m.seq = uint64(done)
				if inPlace {
					if _, err := l.SendBuilt(batch, m); err != nil {
						b.Fatal(err)
					}
				} else {
					for i := range frames {
						m.Build(i, frames[i])
					}
					if _, err := l.Send(frames); err != nil {
						b.Fatal(err)
					}
				}
				complete(l)
			}
		})
	}
}

// kernelRxQuick plays the kernel's receive side for n frames of size bytes
// whose contents are already in place: it only moves descriptors.
func kernelRxQuick(l *AFXDPLink, n, size int) {
	fc, p := *l.fill.consumer, *l.rx.producer
	for i := 0; i < n; i++ {
		addr := l.fill.addrs[(fc+uint32(i))&l.fill.mask] + xdpHeadroom
		l.rx.descs[(p+uint32(i))&l.rx.mask] = unix.XDPDesc{Addr: addr, Len: uint32(size)}
	}
	*l.fill.consumer = fc + uint32(n)
	*l.rx.producer = p + uint32(n)
}

func BenchmarkFakeRingRecv1514(b *testing.B) {
	const batch = 64
	for _, inPlace := range []bool{false, true} {
		b.Run(map[bool]string{false: "plain", true: "inplace"}[inPlace], func(b *testing.B) {
			l := benchFakeLink(b)
			m := &benchMsg{msg: make([]byte, 1<<20)}
			bufs, sizes := make([][]byte, batch), make([]int, batch)
			for i := range bufs {
				bufs[i] = make([]byte, benchFrame)
			}
			// Sequence numbers in every receive frame.
			for i := uint32(0); i < l.fill.size; i++ {
				binary.BigEndian.PutUint64(l.umem[uint64(i)*l.frameSize+xdpHeadroom+14:], uint64(i))
			}
			b.SetBytes(benchFrame)
			b.ResetTimer()
			for done := 0; done < b.N; done += batch {
				kernelRxQuick(l, batch, benchFrame)
				var n int
				var err error
				if inPlace {
					n, err = l.RecvVisit(batch, 0, m)
				} else {
					n, err = l.Recv(bufs, sizes, 0)
					for i := range n {
						m.Visit(bufs[i][:sizes[i]])
					}
				}
				if n != batch || err != nil {
					b.Fatalf("receive = %d, %v", n, err)
				}
			}
		})
	}
}
