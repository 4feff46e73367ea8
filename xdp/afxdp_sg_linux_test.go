package xdp_test

// Lab tests of multi-buffer (XDP_USE_SG) AF_XDP links: jumbo frames on a
// 9000-MTU veth lab, and frames of up to 65549 bytes at veth's largest MTU.

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/xmx-stack/xmx/internal/netlab"
	"github.com/xmx-stack/xmx/xdp"
	"github.com/xmx-stack/xmx/xdp/linktest"
)

const jumboMTU = 9000

// TestAFXDPConformanceJumbo runs the conformance suite (every frame size
// from 60 to 9014 bytes, full rate, checksummed) over multi-buffer links.
func TestAFXDPConformanceJumbo(t *testing.T) {
	lab := netlab.New(t, netlab.Options{Hosts: 2, MTU: jumboMTU})
	h1, h2 := lab.Hosts[0], lab.Hosts[1]
	for _, spin := range []bool{false, true} {
		name := map[bool]string{false: "poll", true: "spin"}[spin]
		t.Run(name, func(t *testing.T) {
			linktest.Run(t, func(tb testing.TB) linktest.Pair {
				// Gathered tails as descriptors of their own, although the
				// link is in copy mode (where they would be copied).
				a := openAFXDP(tb, h1, xdp.AFXDPConfig{Spin: spin, BufferBytes: 256 << 10, Gather: xdp.GatherDescriptors})
				b := openAFXDP(tb, h2, xdp.AFXDPConfig{Spin: spin, BufferBytes: 256 << 10, Gather: xdp.GatherDescriptors})
				for _, l := range []*xdp.AFXDPLink{a, b} {
					// The xdp.frags program runs in driver mode on veth at
					// MTU 9000; the plain one would have fallen back to skb.
					if want := "copy drv " + name + " sg"; l.Info().Mode != want || !l.MultiBuffer() || xdp.MaxFrameLen(l) != jumboMTU+xdp.EthHeaderLen {
						tb.Fatalf("%s: mode %q, multi-buffer %v, max frame %d; want %q, true, %d",
							l.Info().Interface, l.Info().Mode, l.MultiBuffer(), xdp.MaxFrameLen(l), want, jumboMTU+xdp.EthHeaderLen)
					}
				}
				return linktest.Pair{A: a, B: b, KernelDrops: kernelDrops(tb, lab)}
			}, linktest.Options{})
		})
	}
}

// boundarySizes are the frame sizes around every multiple of the receive
// fragment (frameSize-256) and send fragment (frameSize) sizes up to the
// largest frame, plus the smallest and largest frames.
func boundarySizes(frameSize, maxLen int) []int {
	seen := map[int]bool{}
	var out []int
	add := func(n int) {
		if n >= xdp.MinFrameLen && n <= maxLen && !seen[n] {
			seen[n] = true
			out = append(out, n)
		}
	}
	add(xdp.MinFrameLen)
	for _, step := range []int{frameSize - 256, frameSize} {
		for k := step; k <= maxLen+1; k += step {
			add(k - 1)
			add(k)
			add(k + 1)
		}
	}
	add(maxLen - 1)
	add(maxLen)
	slices.Sort(out)
	return out
}

// jumboFrame is a frame of n bytes from src to dst whose payload depends on
// n and seed, so that a misplaced or reordered fragment shows.
func jumboFrame(dst, src []byte, n int, seed byte) []byte {
	f := make([]byte, n)
	copy(f, dst)
	copy(f[6:], src)
	f[12], f[13] = 0x88, 0xb5
	x := uint32(n)*2654435761 | uint32(seed) | 1
	for i := 14; i < n; i++ {
		x ^= x << 13
		x ^= x >> 17
		x ^= x << 5
		f[i] = byte(x)
	}
	return f
}

// recvExactly receives len(want) frames from l (in order) and compares them.
func recvExactly(t *testing.T, l xdp.Link, want [][]byte, bufLen int) {
	t.Helper()
	bufs := make([][]byte, 8)
	for i := range bufs {
		bufs[i] = make([]byte, bufLen)
	}
	sizes := make([]int, len(bufs))
	deadline := time.Now().Add(5 * time.Second)
	for got := 0; got < len(want); {
		n, err := l.Recv(bufs, sizes, 200*time.Millisecond)
		if err != nil {
			t.Fatalf("recv: %v", err)
		}
		for i := 0; i < n; i++ {
			w := want[got]
			if sizes[i] != len(w) || !bytes.Equal(bufs[i][:sizes[i]], w) {
				t.Fatalf("frame %d: received %d bytes, want %d intact", got, sizes[i], len(w))
			}
			got++
		}
		if n == 0 && time.Now().After(deadline) {
			t.Fatalf("received %d of %d frames; stats %+v", got, len(want), l.Stats())
		}
	}
}

// TestAFXDPJumboBoundaries sends frames of every size around the fragment
// boundaries, one per Send and all in one batch, with 4096- and 2048-byte
// UMEM frames, between two AF_XDP links and between AF_XDP and AF_PACKET
// (which sees the frames as the kernel does), and checks that they arrive
// byte for byte; then truncation of a frame across fragments.
//
// It runs at MTU 9000 and at veth's largest MTU, 65535, where a frame takes
// 17 UMEM frames of 4096 bytes (2048-byte frames would need 33 descriptors
// per packet, more than copy mode takes, and are refused).
func TestAFXDPJumboBoundaries(t *testing.T) {
	for _, mtu := range []int{jumboMTU, 65535} {
		t.Run(fmt.Sprint(mtu), func(t *testing.T) { testJumboBoundaries(t, mtu) })
	}
}

func testJumboBoundaries(t *testing.T, mtu int) {
	lab := netlab.New(t, netlab.Options{Hosts: 2, MTU: mtu})
	h1, h2 := lab.Hosts[0], lab.Hosts[1]
	openPacket := func(t *testing.T, h *netlab.Host) xdp.Link {
		var l *xdp.AFPacketLink
		if err := h.Do(func() (err error) {
			l, err = xdp.OpenAFPacket(xdp.AFPacketConfig{Interface: h.Interface})
			return err
		}); err != nil {
			t.Fatalf("open AF_PACKET on %s: %v", h.Name, err)
		}
		t.Cleanup(func() { l.Close() })
		return l
	}
	// The kernel takes at most MAX_SKB_FRAGS+1 (18) descriptors per packet
	// in copy mode; a frame that needs more cannot be sent at all.
	const copyModeMaxDescs = 18
	maxLen := mtu + xdp.EthHeaderLen
	frameSizes := []int{4096, 2048}
	if (maxLen+2047)/2048 > copyModeMaxDescs {
		frameSizes = frameSizes[:1]
		err := h1.Do(func() error {
			l, err := xdp.OpenAFXDP(xdp.AFXDPConfig{Interface: h1.Interface, FrameSize: 2048})
			if err == nil {
				l.Close()
			}
			return err
		})
		if !errors.Is(err, xdp.ErrNotSupported) {
			t.Errorf("open with 2048-byte frames at MTU %d: %v, want ErrNotSupported", mtu, err)
		}
	}
	for _, fs := range frameSizes {
		for _, peer := range []string{"afxdp", "afpacket"} {
			t.Run(peer+"/"+map[int]string{4096: "4K", 2048: "2K"}[fs], func(t *testing.T) {
				a := openAFXDP(t, h1, xdp.AFXDPConfig{FrameSize: fs})
				var b xdp.Link
				if peer == "afxdp" {
					b = openAFXDP(t, h2, xdp.AFXDPConfig{FrameSize: fs})
				} else {
					b = openPacket(t, h2)
				}
				sizes := boundarySizes(fs, maxLen)
				t.Logf("%d sizes: %v", len(sizes), sizes)
				for dir, p := range [][2]xdp.Link{{a, b}, {b, a}} {
					src, dst := p[0], p[1]
					var all [][]byte
					for i, n := range sizes {
						f := jumboFrame(dst.HardwareAddr(), src.HardwareAddr(), n, byte(i+dir))
						all = append(all, f)
						if _, err := src.Send([][]byte{f}); err != nil {
							t.Fatalf("send %d bytes: %v", n, err)
						}
						recvExactly(t, dst, [][]byte{f}, maxLen)
					}
					if n, err := src.Send(all); n != len(all) || err != nil {
						t.Fatalf("send batch = %d, %v", n, err)
					}
					recvExactly(t, dst, all, maxLen)
				}
				// Truncation across fragments and in the first fragment; the
				// frame after a truncated one arrives whole.
				f := jumboFrame(b.HardwareAddr(), a.HardwareAddr(), maxLen, 99)
				before := b.Stats().RxTruncated
				for _, bufLen := range []int{5000, 100} {
					if _, err := a.Send([][]byte{f, f}); err != nil {
						t.Fatal(err)
					}
					short := [][]byte{make([]byte, bufLen)}
					got := []int{0}
					if n, err := b.Recv(short, got, 2*time.Second); n != 1 || err != nil || got[0] != bufLen || !bytes.Equal(short[0], f[:bufLen]) {
						t.Fatalf("recv into %d bytes = %d, %v, size %d; want the first %d bytes", bufLen, n, err, got[0], bufLen)
					}
					recvExactly(t, b, [][]byte{f}, maxLen)
				}
				if tr := b.Stats().RxTruncated - before; tr != 2 {
					t.Errorf("RxTruncated grew by %d, want 2", tr)
				}
				for _, l := range []xdp.Link{a, b} {
					if s := l.Stats(); s.Lost() != 0 || s.RxInvalidDescs != 0 || s.TxInvalidDescs != 0 {
						t.Errorf("%s: %+v, want no loss, no invalid descriptor", l.Info().Kind, s)
					}
				}
			})
		}
	}
}

// TestAFXDPMultiBufferForced checks AFXDPConfig.MultiBuffer on a 1500-MTU
// lab, where single-buffer would do.
func TestAFXDPMultiBufferForced(t *testing.T) {
	lab := netlab.New(t, netlab.Options{Hosts: 2})
	h1, h2 := lab.Hosts[0], lab.Hosts[1]
	linktest.Run(t, func(tb testing.TB) linktest.Pair {
		a := openAFXDP(tb, h1, xdp.AFXDPConfig{MultiBuffer: true, BufferBytes: 64 << 10, Gather: xdp.GatherDescriptors})
		b := openAFXDP(tb, h2, xdp.AFXDPConfig{MultiBuffer: true, FrameSize: 2048, BufferBytes: 64 << 10, Gather: xdp.GatherDescriptors})
		for _, l := range []*xdp.AFXDPLink{a, b} {
			if !l.MultiBuffer() || !strings.HasSuffix(l.Info().Mode, " sg") {
				tb.Fatalf("forced multi-buffer: MultiBuffer() %v, mode %q", l.MultiBuffer(), l.Info().Mode)
			}
		}
		return linktest.Pair{A: a, B: b, KernelDrops: kernelDrops(tb, lab)}
	}, linktest.Options{Frames: 5000})
}

// TestAFXDPMultiBufferConflict opens a multi-buffer and a single-buffer link
// on two queues of one interface: they would need different steering
// programs, and an interface has one.
func TestAFXDPMultiBufferConflict(t *testing.T) {
	lab := netlab.New(t, netlab.Options{Hosts: 2, Queues: 2})
	h := lab.Hosts[0]
	for _, first := range []bool{true, false} {
		a := openAFXDP(t, h, xdp.AFXDPConfig{Queue: 0, MultiBuffer: first})
		var err error
		h.Do(func() error {
			var l *xdp.AFXDPLink
			if l, err = xdp.OpenAFXDP(xdp.AFXDPConfig{Interface: h.Interface, Queue: 1, MultiBuffer: !first}); err == nil {
				l.Close()
			}
			return nil
		})
		t.Logf("multi-buffer %v, then %v: %v", first, !first, err)
		if err == nil || !strings.Contains(err.Error(), "multi-buffer") || !strings.Contains(err.Error(), h.Interface) {
			t.Errorf("multi-buffer %v then %v on one interface: %v; want an error naming the interface and multi-buffer", first, !first, err)
		}
		// The same setting shares the program.
		openAFXDP(t, h, xdp.AFXDPConfig{Queue: 1, MultiBuffer: first}).Close()
		a.Close()
	}
}

// TestAFXDPNoAllocsJumbo is TestAFXDPNoAllocs with 9014-byte frames over
// multi-buffer links.
func TestAFXDPNoAllocsJumbo(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are meaningless under the race detector")
	}
	lab := netlab.New(t, netlab.Options{Hosts: 2, MTU: jumboMTU})
	for _, spin := range []bool{false, true} {
		a := openAFXDP(t, lab.Hosts[0], xdp.AFXDPConfig{Spin: spin})
		b := openAFXDP(t, lab.Hosts[1], xdp.AFXDPConfig{Spin: spin})
		f := jumboFrame(b.HardwareAddr(), a.HardwareAddr(), jumboMTU+xdp.EthHeaderLen, 1)
		frames := [][]byte{f}
		bufs, sizes := [][]byte{make([]byte, len(f))}, []int{0}
		allocs := testing.AllocsPerRun(2000, func() {
			if _, err := a.Send(frames); err != nil {
				t.Fatal(err)
			}
			if n, err := b.Recv(bufs, sizes, time.Second); n != 1 || err != nil || sizes[0] != len(f) {
				t.Fatalf("recv = %d, %v, size %d", n, err, sizes[0])
			}
		})
		if allocs != 0 {
			t.Errorf("spin=%v: %.1f allocations per Send+Recv of a jumbo frame, want 0", spin, allocs)
		}
		if !bytes.Equal(bufs[0], f) {
			t.Error("jumbo frame corrupted")
		}
		a.Close()
		b.Close()
	}
}

// spanSender gathers n frames, each a 60-byte head and a tail of the
// buffer.
type spanSender struct {
	head []byte
	tail xdp.Span
}

func (s *spanSender) Gather(_ int, head []byte) (int, xdp.Span) { return copy(head, s.head), s.tail }

// TestAFXDPBufferArea checks the buffer area's accounting: it is handed out
// until exhausted, a buffer freed while its frames are in flight comes back
// once they complete, and a buffer outlives the link it came from.
func TestAFXDPBufferArea(t *testing.T) {
	lab := netlab.New(t, netlab.Options{Hosts: 2})
	const area = 64 << 10
	a := openAFXDP(t, lab.Hosts[0], xdp.AFXDPConfig{BufferBytes: area, Gather: xdp.GatherDescriptors})
	b := openAFXDP(t, lab.Hosts[1], xdp.AFXDPConfig{MultiBuffer: true})
	if !a.GatherZeroCopy() || !a.MultiBuffer() {
		t.Fatalf("GatherDescriptors: GatherZeroCopy %v, MultiBuffer %v; want both", a.GatherZeroCopy(), a.MultiBuffer())
	}

	whole, err := a.AllocBuffer(area)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.AllocBuffer(1); !errors.Is(err, xdp.ErrNoBufferSpace) {
		t.Fatalf("AllocBuffer beyond the area = %v, want ErrNoBufferSpace", err)
	}
	head := make([]byte, 60)
	copy(head, b.HardwareAddr())
	copy(head[6:], a.HardwareAddr())
	head[12], head[13] = 0x88, 0xb5
	s := &spanSender{head: head, tail: xdp.Span{Buf: whole, Off: 4000, Len: 1000}} // crosses a frame boundary
	if n, err := a.SendGather(64, s); n != 64 || err != nil {
		t.Fatalf("SendGather = %d, %v", n, err)
	}
	whole.Free()
	// The area comes back once the frames' completions are reaped (by a
	// later send).
	var again *xdp.Buffer
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		if _, err := a.Send([][]byte{head}); err != nil {
			t.Fatal(err)
		}
		if again, err = a.AllocBuffer(area); err == nil {
			break
		}
	}
	if again == nil {
		t.Fatalf("the area never came back after Free: %v", err)
	}
	half, err := a.AllocBuffer(area / 2)
	if err == nil || half != nil {
		t.Fatalf("AllocBuffer of a full area = %v, %v", half, err)
	}
	again.Free()
	first, err := a.AllocBuffer(area / 2)
	if err != nil {
		t.Fatal(err)
	}
	second, err := a.AllocBuffer(area / 2)
	if err != nil {
		t.Fatal(err)
	}
	first.Free()
	// Close with a buffer lent: its memory stays usable until freed.
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	clear(second.Bytes())
	second.Bytes()[len(second.Bytes())-1] = 1
	if _, err := a.AllocBuffer(10); err == nil {
		t.Error("AllocBuffer on a closed link succeeded")
	}
	if n, err := a.SendGather(1, s); n != 0 || err == nil {
		t.Errorf("SendGather on a closed link = %d, %v", n, err)
	}
	second.Free()
	second.Free()

	// By default a link with a buffer area tries zero-copy with
	// multi-buffer; veth has no zero-copy, so it falls back to copy mode
	// without multi-buffer and copies tails.
	c := openAFXDP(t, lab.Hosts[0], xdp.AFXDPConfig{BufferBytes: area})
	if c.GatherZeroCopy() || c.MultiBuffer() || c.ZeroCopy() {
		t.Errorf("default link with a buffer area on veth: GatherZeroCopy %v, MultiBuffer %v, ZeroCopy %v; want all false",
			c.GatherZeroCopy(), c.MultiBuffer(), c.ZeroCopy())
	}
}

// TestAFXDPGatherSmallRing: a send ring too small for the entries a
// gathered frame reserves is refused at open when gathering into
// descriptors is asked for, and makes the link copy tails otherwise:
// SendGather sends (it used to wait out the send timeout, every time).
func TestAFXDPGatherSmallRing(t *testing.T) {
	lab := netlab.New(t, netlab.Options{Hosts: 2, MTU: 9000})
	cfg := xdp.AFXDPConfig{NumFrames: 8, BufferBytes: 16384, Gather: xdp.GatherDescriptors, Interface: lab.Hosts[0].Interface}
	if err := lab.Hosts[0].Do(func() error {
		l, err := xdp.OpenAFXDP(cfg)
		if err == nil {
			l.Close()
		}
		if !errors.Is(err, xdp.ErrNotSupported) || !strings.Contains(err.Error(), "send ring entries") {
			t.Errorf("open with descriptors asked for: %v, want a refusal naming the send ring", err)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	a := openAFXDP(t, lab.Hosts[0], xdp.AFXDPConfig{NumFrames: 8, BufferBytes: 16384})
	b := openAFXDP(t, lab.Hosts[1], xdp.AFXDPConfig{})
	buf, err := a.AllocBuffer(8192)
	if err != nil {
		t.Fatal(err)
	}
	head := make([]byte, 60)
	copy(head, b.HardwareAddr())
	copy(head[6:], a.HardwareAddr())
	head[12], head[13] = 0x88, 0xb5
	start := time.Now()
	if n, err := a.SendGather(1, &spanSender{head: head, tail: xdp.Span{Buf: buf, Len: 100}}); n != 1 || err != nil {
		t.Fatalf("SendGather: %d, %v after %v", n, err, time.Since(start))
	}
	bufs, sizes := [][]byte{make([]byte, 9014)}, []int{0}
	if n, err := b.Recv(bufs, sizes, 2*time.Second); n != 1 || err != nil || sizes[0] != 160 {
		t.Fatalf("Recv: %d frames, %v, %d bytes; want 1, nil, 160", n, err, sizes[0])
	}
}

// TestAFXDPGatherDescriptorLimit checks that a gathered frame whose head
// and tail would take more descriptors than the kernel takes per packet
// (a head of one byte past a frame, a tail starting at a frame's last
// byte, at MTU 65535 in 4 KiB frames) arrives whole: its tail is copied.
// Such frames used to be dropped by the kernel as invalid, and counted
// as sent.
func TestAFXDPGatherDescriptorLimit(t *testing.T) {
	const mtu = 65535
	lab := netlab.New(t, netlab.Options{Hosts: 2, MTU: mtu})
	a := openAFXDP(t, lab.Hosts[0], xdp.AFXDPConfig{NumFrames: 128, BufferBytes: 128 << 10, Gather: xdp.GatherDescriptors})
	b := openAFXDP(t, lab.Hosts[1], xdp.AFXDPConfig{})
	maxLen := xdp.MaxFrameLen(a)
	buf, err := a.AllocBuffer(100 << 10)
	if err != nil {
		t.Fatal(err)
	}
	defer buf.Free()
	head := make([]byte, 4097)
	copy(head, b.HardwareAddr())
	copy(head[6:], a.HardwareAddr())
	head[12], head[13] = 0x88, 0xb5
	for i := range head[14:] {
		head[14+i] = byte(i)
	}
	tail := xdp.Span{Buf: buf, Off: 4095, Len: maxLen - len(head)}
	for i := range tail.Len {
		buf.Bytes()[tail.Off+i] = byte(i * 7)
	}
	want := append(append([]byte(nil), head...), buf.Bytes()[tail.Off:tail.Off+tail.Len]...)
	const n = 3
	if sent, err := a.SendGather(n, &spanSender{head: head, tail: tail}); sent != n || err != nil {
		t.Fatalf("SendGather = %d, %v", sent, err)
	}
	bufs, sizes := [][]byte{make([]byte, maxLen)}, []int{0}
	for i := range n {
		k, err := b.Recv(bufs, sizes, 2*time.Second)
		if err != nil || k != 1 {
			t.Fatalf("frame %d: Recv = %d, %v (sender's invalid descriptors: %d)", i, k, err, a.Stats().TxInvalidDescs)
		}
		if !bytes.Equal(bufs[0][:sizes[0]], want) {
			t.Fatalf("frame %d: %d bytes, not the %d sent", i, sizes[0], len(want))
		}
	}
	if s := a.Stats(); s.TxInvalidDescs != 0 {
		t.Errorf("sender's invalid descriptors: %d", s.TxInvalidDescs)
	}
}

// TestAFXDPGatherDriverSegLimit checks that gathered frames keep to the
// descriptors per packet the link may use (in zero-copy mode the driver's
// xdp-zc-max-segs, here lowered to 3 on a copy-mode link): a tail that
// would take the packet past it is copied behind the head, the others stay
// descriptors of their own, and every frame arrives whole.
func TestAFXDPGatherDriverSegLimit(t *testing.T) {
	lab := netlab.New(t, netlab.Options{Hosts: 2, MTU: jumboMTU})
	a := openAFXDP(t, lab.Hosts[0], xdp.AFXDPConfig{BufferBytes: 64 << 10, Gather: xdp.GatherDescriptors})
	b := openAFXDP(t, lab.Hosts[1], xdp.AFXDPConfig{})
	a.SetMaxDescsForTest(3)
	buf, err := a.AllocBuffer(32 << 10)
	if err != nil {
		t.Fatal(err)
	}
	defer buf.Free()
	for i := range buf.Bytes() {
		buf.Bytes()[i] = byte(i * 7)
	}
	head := make([]byte, 60)
	copy(head, b.HardwareAddr())
	copy(head[6:], a.HardwareAddr())
	head[12], head[13] = 0x88, 0xb5
	_, from := a.TxPacketDescsForTest(0)
	rbuf, sizes := [][]byte{make([]byte, xdp.MaxFrameLen(b))}, []int{0}
	for _, c := range []struct {
		off, n, descs int
	}{
		{0, 4096, 2},    // head, one frame of tail
		{100, 4096, 3},  // head, a tail across a frame boundary
		{4095, 8000, 2}, // head and three frames of tail: copied, two frames
		{0, 0, 1},       // no tail
	} {
		tail := xdp.Span{Buf: buf, Off: c.off, Len: c.n}
		if c.n == 0 {
			tail = xdp.Span{}
		}
		if sent, err := a.SendGather(1, &spanSender{head: head, tail: tail}); sent != 1 || err != nil {
			t.Fatalf("tail %d+%d: SendGather = %d, %v", c.off, c.n, sent, err)
		}
		var packets []int
		packets, from = a.TxPacketDescsForTest(from)
		if len(packets) != 1 || packets[0] != c.descs {
			t.Errorf("tail %d+%d: packets of %v descriptors, want one of %d", c.off, c.n, packets, c.descs)
		}
		want := append(slices.Clip(head), buf.Bytes()[c.off:c.off+c.n]...)
		k, err := b.Recv(rbuf, sizes, 2*time.Second)
		if err != nil || k != 1 {
			t.Fatalf("tail %d+%d: Recv = %d, %v", c.off, c.n, k, err)
		}
		if !bytes.Equal(rbuf[0][:sizes[0]], want) {
			t.Fatalf("tail %d+%d: %d bytes arrived, not the %d sent", c.off, c.n, sizes[0], len(want))
		}
	}
}

// TestZeroCopyFits checks when zero-copy multi-buffer mode is refused for
// the driver's limit, and that the refusal lets BindAuto fall back.
func TestZeroCopyFits(t *testing.T) {
	for _, c := range []struct {
		segs, descs int
		ok          bool
	}{{0, 3, true}, {3, 3, true}, {17, 3, true}, {1, 3, false}, {2, 3, false}} {
		err := xdp.ZeroCopyFitsForTest(c.segs, c.descs, 9014)
		if (err == nil) != c.ok || err != nil && !errors.Is(err, unix.EOPNOTSUPP) {
			t.Errorf("segs %d, descs %d: %v", c.segs, c.descs, err)
		}
	}
}

// closeInVisit closes the link from inside a visit, where Close waits for
// the receive lock, and records BufferSent of buf while it waits.
type closeInVisit struct {
	l      *xdp.AFXDPLink
	buf    *xdp.Buffer
	closed chan error
	during bool
}

func (v *closeInVisit) Visit([]byte) {
	if v.closed != nil {
		return
	}
	v.closed = make(chan error, 1)
	go func() { v.closed <- v.l.Close() }()
	for !v.l.ClosingForTest() {
		time.Sleep(time.Millisecond)
	}
	v.during = v.l.BufferSent(v.buf)
}

// TestAFXDPBufferSentDuringClose: while Close is under way the kernel may
// still hold descriptors into a lent buffer, so BufferSent says false; once
// Close has returned it says true. It used to say true from the moment
// Close began.
func TestAFXDPBufferSentDuringClose(t *testing.T) {
	lab := netlab.New(t, netlab.Options{Hosts: 2})
	a := openAFXDP(t, lab.Hosts[0], xdp.AFXDPConfig{BufferBytes: 16 << 10, Gather: xdp.GatherDescriptors})
	b := openAFXDP(t, lab.Hosts[1], xdp.AFXDPConfig{})
	buf, err := a.AllocBuffer(8 << 10)
	if err != nil {
		t.Fatal(err)
	}
	defer buf.Free()
	head := make([]byte, 60)
	copy(head, b.HardwareAddr())
	copy(head[6:], a.HardwareAddr())
	head[12], head[13] = 0x88, 0xb5
	if n, err := a.SendGather(1, &spanSender{head: head, tail: xdp.Span{Buf: buf, Len: 1000}}); n != 1 || err != nil {
		t.Fatalf("SendGather = %d, %v", n, err)
	}
	back := slices.Clone(head)
	copy(back, a.HardwareAddr())
	copy(back[6:], b.HardwareAddr())
	if _, err := b.Send([][]byte{back}); err != nil {
		t.Fatal(err)
	}
	v := &closeInVisit{l: a, buf: buf}
	if n, err := a.RecvVisit(1, 2*time.Second, v); n != 1 || err != nil {
		t.Fatalf("RecvVisit = %d, %v", n, err)
	}
	if err := <-v.closed; err != nil {
		t.Fatal(err)
	}
	if v.during {
		t.Error("BufferSent while Close waited: true")
	}
	if !a.BufferSent(buf) {
		t.Error("BufferSent after Close: false")
	}
}
