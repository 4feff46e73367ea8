package xdp

// White-box tests of multi-buffer reassembly and splitting on rings held in
// ordinary memory, playing the kernel's part by hand: the cases the kernel
// never produces on purpose (a packet whose last fragment is not published
// yet, a corrupted ring) are exercised here.

import (
	"bytes"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// fakeRing points a ring at index words in Go memory.
func fakeRing(r *ring, size uint32) {
	idx := make([]uint32, 3)
	r.producer, r.consumer, r.flags = &idx[0], &idx[1], &idx[2]
	r.size, r.mask = size, size-1
}

// fakeLink is an AF_XDP link without a socket: UMEM and rings in Go memory,
// the receive half of the UMEM on the fill ring as OpenAFXDP leaves it.
func fakeLink(t testing.TB, frameSize, numFrames int, sg bool) *AFXDPLink {
	t.Helper()
	half := uint32(numFrames / 2)
	l := &AFXDPLink{
		ifname:    "fake0",
		mtu:       9000,
		maxFrame:  9000 + EthHeaderLen,
		frameSize: uint64(frameSize),
		sg:        sg,
		spin:      true,
		sendWait:  20 * time.Millisecond,
		fd:        -1,
		efd:       -1,
		umem:      make([]byte, numFrames*frameSize),
	}
	l.txPoll = [2]unix.PollFd{{Fd: -1}, {Fd: -1}}
	l.rxMu.Lock()
	defer l.rxMu.Unlock()
	l.txMu.Lock()
	defer l.txMu.Unlock()
	for _, r := range []*ring{&l.rx.ring, &l.fill.ring, &l.tx.ring, &l.comp.ring} {
		fakeRing(r, half)
	}
	l.rx.descs = make([]unix.XDPDesc, half)
	l.tx.descs = make([]unix.XDPDesc, half)
	l.fill.addrs = make([]uint64, half)
	l.comp.addrs = make([]uint64, half)
	for i := uint32(0); i < half; i++ {
		l.fill.addrs[i] = uint64(i) * l.frameSize
	}
	l.fill.cachedProd = half
	l.fill.submit()
	l.tx.cachedCons = half // producer side: consumer + size
	l.fill.cachedCons = half
	l.pointIdle()
	l.initTxFree(numFrames)
	return l
}

// kernelRx plays the kernel's receive side: it takes frames from the fill
// ring, copies pkt into them (FrameSize-256 bytes a fragment, after the
// headroom) and produces the descriptors, publishing only the first publish
// of them (all if publish < 0). It returns the number of descriptors.
func kernelRx(l *AFXDPLink, pkt []byte, publish int) int {
	room := int(l.frameSize) - xdpHeadroom
	n := 0
	for off := 0; off < len(pkt); off += room {
		end := min(off+room, len(pkt))
		fc := *l.fill.consumer
		addr := l.fill.addrs[fc&l.fill.mask] + xdpHeadroom
		*l.fill.consumer = fc + 1
		copy(l.umem[addr:], pkt[off:end])
		var opts uint32
		if end < len(pkt) {
			opts = unix.XDP_PKT_CONTD
		}
		p := *l.rx.producer
		l.rx.descs[(p+uint32(n))&l.rx.mask] = unix.XDPDesc{Addr: addr, Len: uint32(end - off), Options: opts}
		n++
	}
	if publish < 0 || publish > n {
		publish = n
	}
	*l.rx.producer += uint32(publish)
	return n
}

func pattern(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7) ^ seed
	}
	return b
}

func (l *AFXDPLink) fakeRecv(bufs [][]byte, sizes []int) int {
	l.rxMu.Lock()
	defer l.rxMu.Unlock()
	return l.recvReady(bufs, sizes)
}

func TestSGRecvWaitsForLastFragment(t *testing.T) {
	l := fakeLink(t, 4096, 64, true)
	pkt := pattern(9014, 1)
	if n := kernelRx(l, pkt, 2); n != 3 {
		t.Fatalf("9014-byte packet took %d descriptors, want 3", n)
	}
	buf, sizes := [][]byte{make([]byte, 9100)}, []int{0}
	fillBefore := *l.fill.producer
	if n := l.fakeRecv(buf, sizes); n != 0 {
		t.Fatalf("recv with 2 of 3 fragments published = %d, want 0", n)
	}
	if *l.rx.consumer != 0 || *l.fill.producer != fillBefore {
		t.Fatalf("partial packet consumed: rx consumer %d, fill producer %d → %d", *l.rx.consumer, fillBefore, *l.fill.producer)
	}
	*l.rx.producer++ // publish the last fragment
	if n := l.fakeRecv(buf, sizes); n != 1 || sizes[0] != len(pkt) || !bytes.Equal(buf[0][:sizes[0]], pkt) {
		t.Fatalf("recv of the whole packet = %d, size %d; want 1 intact packet of %d bytes", n, sizes[0], len(pkt))
	}
	if *l.rx.consumer != 3 || *l.fill.producer != fillBefore+3 {
		t.Fatalf("rx consumer %d, fill producer +%d; want 3 and +3", *l.rx.consumer, *l.fill.producer-fillBefore)
	}
	if s := l.rxFrames.Load(); s != 1 || l.rxBytes.Load() != uint64(len(pkt)) {
		t.Fatalf("counters: %d frames, %d bytes", s, l.rxBytes.Load())
	}
}

func TestSGRecvBatchAndTruncation(t *testing.T) {
	l := fakeLink(t, 2048, 64, true)
	sizes := []int{60, 1792, 1793, 9014, 3584, 3585, 100}
	var pkts [][]byte
	for i, n := range sizes {
		pkts = append(pkts, pattern(n, byte(i)))
		kernelRx(l, pkts[i], -1)
	}
	// Two buffers: the first call takes two packets and leaves the rest.
	bufs, got := [][]byte{make([]byte, 9014), make([]byte, 9014)}, make([]int, 2)
	if n := l.fakeRecv(bufs, got); n != 2 || got[0] != 60 || got[1] != 1792 {
		t.Fatalf("first recv = %d %v", n, got)
	}
	// A 3000-byte buffer truncates 3584 and 9014 byte packets across fragments.
	small := [][]byte{make([]byte, 3000)}
	for _, i := range []int{2, 3, 4, 5, 6} {
		want := pkts[i]
		trunc := len(want) > len(small[0])
		if n := l.fakeRecv(small, got); n != 1 {
			t.Fatalf("recv of packet %d = %d", i, n)
		}
		if trunc {
			want = want[:len(small[0])]
		}
		if got[0] != len(want) || !bytes.Equal(small[0][:got[0]], want) {
			t.Fatalf("packet %d (%d bytes): got %d bytes, want %d intact", i, len(pkts[i]), got[0], len(want))
		}
	}
	if tr := l.rxTrunc.Load(); tr != 3 {
		t.Errorf("RxTruncated = %d, want 3 (9014, 3584, 3585)", tr)
	}
	// Every fragment's frame is back on the fill ring.
	if *l.fill.producer-*l.fill.consumer != l.fill.size {
		t.Errorf("fill ring holds %d frames, want all %d", *l.fill.producer-*l.fill.consumer, l.fill.size)
	}
}

func TestSGRecvCorruptRing(t *testing.T) {
	l := fakeLink(t, 4096, 8, true) // rings of 4
	// A whole ring of continuation descriptors can never complete.
	for i := uint32(0); i < 4; i++ {
		l.rx.descs[i] = unix.XDPDesc{Addr: uint64(i)*4096 + xdpHeadroom, Len: 100, Options: unix.XDP_PKT_CONTD}
	}
	*l.fill.consumer += 4
	*l.rx.producer = 4
	buf, got := [][]byte{make([]byte, 9014)}, []int{0}
	if n := l.fakeRecv(buf, got); n != 0 {
		t.Fatalf("recv of a corrupt ring = %d", n)
	}
	if *l.rx.consumer != 4 || l.badDescs.Load() != 1 || *l.fill.producer-*l.fill.consumer != 4 {
		t.Fatalf("rx consumer %d, bad %d, fill %d; want the run dropped, counted and its frames recycled",
			*l.rx.consumer, l.badDescs.Load(), *l.fill.producer-*l.fill.consumer)
	}
	// A fragment pointing outside the UMEM drops its packet, not the next.
	kernelRx(l, pattern(5000, 3), -1)
	l.rx.descs[(*l.rx.producer-1)&l.rx.mask].Addr = uint64(len(l.umem))
	kernelRx(l, pattern(200, 4), -1)
	if n := l.fakeRecv(buf, got); n != 1 || got[0] != 200 || !bytes.Equal(buf[0][:200], pattern(200, 4)) {
		t.Fatalf("recv after a bad packet = %d, size %d", n, got[0])
	}
	if l.badDescs.Load() != 2 {
		t.Fatalf("bad packets %d, want 2", l.badDescs.Load())
	}
}

func TestSGSendSplitsWholeFrames(t *testing.T) {
	l := fakeLink(t, 4096, 64, true)
	f := pattern(9014, 5)
	if n, err := l.Send([][]byte{f}); n != 1 || err != nil {
		t.Fatalf("send = %d, %v", n, err)
	}
	if p := *l.tx.producer; p != 3 {
		t.Fatalf("9014-byte frame produced %d descriptors, want 3", p)
	}
	var joined []byte
	for i, want := range []struct {
		len  uint32
		opts uint32
	}{{4096, unix.XDP_PKT_CONTD}, {4096, unix.XDP_PKT_CONTD}, {822, 0}} {
		d := l.tx.descs[i]
		if d.Len != want.len || d.Options != want.opts || d.Addr%4096 != 0 {
			t.Fatalf("descriptor %d = %+v, want len %d options %d at a frame start", i, d, want.len, want.opts)
		}
		joined = append(joined, l.umem[d.Addr:d.Addr+uint64(d.Len)]...)
	}
	if !bytes.Equal(joined, f) {
		t.Fatal("fragments do not reassemble to the frame sent")
	}

	// One idle send slot left: a small frame goes, the jumbo one does not
	// go in part; Send stalls without producing any of its descriptors.
	l.txMu.Lock()
	l.txFree = l.txFree[:1]
	l.txMu.Unlock()
	prod := *l.tx.producer
	n, err := l.Send([][]byte{pattern(100, 6), f})
	if n != 1 || !errors.Is(err, ErrTxStalled) {
		t.Fatalf("send with 2 free frames = %d, %v; want 1, ErrTxStalled", n, err)
	}
	if got := *l.tx.producer - prod; got != 1 || l.tx.descs[prod&l.tx.mask].Len != 100 {
		t.Fatalf("%d descriptors produced, want only the small frame's", got)
	}
	// Completions give the first frame's slot back; then the jumbo frame
	// goes whole.
	for i := uint32(0); i < 3; i++ {
		l.comp.addrs[i] = l.tx.descs[i].Addr
	}
	*l.comp.producer = 3
	if n, err := l.Send([][]byte{f}); n != 1 || err != nil {
		t.Fatalf("send after completions = %d, %v", n, err)
	}
	if got := *l.tx.producer - prod; got != 4 {
		t.Fatalf("%d descriptors produced, want 1+3", got)
	}
}

func TestMultiBufferNeeded(t *testing.T) {
	for _, c := range []struct {
		mtu, frameSize, numFrames int
		force, sg                 bool
		err                       string
	}{
		{1500, 4096, 4096, false, false, ""},
		{3826, 4096, 4096, false, false, ""}, // 3840 bytes: still one frame
		{3827, 4096, 4096, false, true, ""},
		{1500, 4096, 4096, true, true, ""},
		{9000, 4096, 4096, false, true, ""},
		{9000, 2048, 4096, false, true, ""},
		{1778, 2048, 4096, false, false, ""},
		{1779, 2048, 4096, false, true, ""},
		{9000, 4096, 4, false, false, "frame count 4"},
		{65000, 2048, 4096, false, false, "descriptors"},
	} {
		sg, err := multiBufferNeeded(c.mtu, c.frameSize, c.numFrames, c.force)
		if c.err != "" {
			if err == nil || !bytes.Contains([]byte(err.Error()), []byte(c.err)) {
				t.Errorf("MTU %d frames %d×%d: err %v, want one mentioning %q", c.mtu, c.numFrames, c.frameSize, err, c.err)
			}
			continue
		}
		if err != nil || sg != c.sg {
			t.Errorf("MTU %d frames %d×%d force %v: %v, %v; want %v", c.mtu, c.numFrames, c.frameSize, c.force, sg, err, c.sg)
		}
	}
}

// TestCorruptRingAddresses: a receive descriptor in the send half of the
// UMEM, or a completion given twice, changes no frame's owner: the frame is
// neither put on the fill ring nor given out twice for sending.
func TestCorruptRingAddresses(t *testing.T) {
	l := fakeLink(t, 4096, 8, false) // rings of 4, one-frame send slots
	l.txMu.Lock()
	l.maxFrame = 1514
	l.initTxFree(8)
	free := len(l.txFree)
	l.txMu.Unlock()

	fill := *l.fill.producer
	l.rx.descs[0] = unix.XDPDesc{Addr: l.txBase + xdpHeadroom, Len: 100}
	*l.fill.consumer++ // the kernel took a fill frame (and wrote a bad descriptor)
	*l.rx.producer = 1
	buf, got := [][]byte{make([]byte, 1514)}, []int{0}
	if n := l.fakeRecv(buf, got); n != 0 || l.badDescs.Load() != 1 {
		t.Fatalf("a descriptor in the send half: %d frames, %d bad; want 0, 1", n, l.badDescs.Load())
	}
	if *l.fill.producer != fill {
		t.Fatalf("the send half's frame went on the fill ring")
	}

	if n, err := l.Send([][]byte{pattern(100, 1)}); n != 1 || err != nil {
		t.Fatalf("send = %d, %v", n, err)
	}
	addr := l.tx.descs[0].Addr
	l.comp.addrs[0], l.comp.addrs[1] = addr, addr // completed twice
	*l.comp.producer = 2
	l.txMu.Lock()
	l.reclaim()
	after := len(l.txFree)
	l.txMu.Unlock()
	if after != free {
		t.Fatalf("%d idle send slots after a completion given twice, want %d", after, free)
	}
}

// TestTxStallKickedByReceives checks that frames the kernel refuses for a
// while (a stopped queue, a full completion ring: every sendto answers
// EAGAIN) are kicked again by the receives, which RxIdle sends pollers
// to, until the kernel takes them; a spinning receiver used to leave them
// on the ring until the next send.
func TestTxStallKickedByReceives(t *testing.T) {
	l := fakeLink(t, 4096, 64, false)
	// The socket: one end of a datagram pair whose buffer is full, so
	// that every kick answers EAGAIN.
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_DGRAM|unix.SOCK_NONBLOCK, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fds[0]); unix.Close(fds[1]) })
	for {
		if _, err := unix.Write(fds[0], []byte{1}); err != nil {
			break
		}
	}
	l.fd = fds[0]
	atomic.StoreUint32(l.tx.flags, unix.XDP_RING_NEED_WAKEUP)

	if n, err := l.Send([][]byte{make([]byte, 60)}); n != 1 || err != nil {
		t.Fatalf("Send = %d, %v", n, err)
	}
	if !l.txStalled.Load() || l.RxIdle() {
		t.Fatalf("after a refused kick: stalled %v, RxIdle %v; want true, false", l.txStalled.Load(), l.RxIdle())
	}
	bufs, sizes := [][]byte{make([]byte, 100)}, []int{0}
	w0 := l.wakeups.Load()
	if _, err := l.Recv(bufs, sizes, 0); err != nil {
		t.Fatal(err)
	}
	if l.wakeups.Load() == w0 {
		t.Error("a receive while frames wait on the TX ring did not kick")
	}
	// The kernel takes the frame: the next receive's kick sees the ring
	// empty, and the link is idle again.
	l.txMu.Lock()
	atomic.StoreUint32(l.tx.consumer, l.tx.cachedProd)
	l.txMu.Unlock()
	if _, err := l.Recv(bufs, sizes, 0); err != nil {
		t.Fatal(err)
	}
	if l.txStalled.Load() || !l.RxIdle() {
		t.Errorf("once the kernel took the frames: stalled %v, RxIdle %v; want false, true", l.txStalled.Load(), l.RxIdle())
	}
}

// TestSendStallFailsFastUntilProgress: a Send that found no send slot for
// sendWait fails with ErrTxStalled; later ones that find none fail at once
// until a frame completes (each used to wait sendWait again); then a new
// stall waits again.
func TestSendStallFailsFastUntilProgress(t *testing.T) {
	l := newFakeSG(t)
	l.sendWait = 300 * time.Millisecond
	frames := make([][]byte, len(l.txFree))
	for i := range frames {
		frames[i] = pattern(60, byte(i))
	}
	fill := func() {
		t.Helper()
		if n, err := l.Send(frames); n != len(frames) || err != nil {
			t.Fatalf("Send of %d frames into %d idle slots = %d, %v", len(frames), len(frames), n, err)
		}
	}
	stalled := func(what string, min, max time.Duration) {
		t.Helper()
		start := time.Now()
		n, err := l.Send(frames[:1])
		if el := time.Since(start); n != 0 || !errors.Is(err, ErrTxStalled) || el < min || el > max {
			t.Fatalf("%s: Send with no idle slot = %d, %v after %v; want 0, ErrTxStalled after %v to %v", what, n, err, el, min, max)
		}
	}
	fill()
	stalled("first", l.sendWait, l.sendWait+time.Second)
	for range 3 {
		stalled("after the stall", 0, l.sendWait/2)
	}
	complete(l)
	fill()
	stalled("after frames completed", l.sendWait, l.sendWait+time.Second)
}
