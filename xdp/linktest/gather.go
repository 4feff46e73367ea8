package linktest

// Subtests of xdp.BufferLink: frames whose tails are sent from lent link
// memory where they lie. Skipped on links that lack the interface.

import (
	"errors"
	"testing"
	"time"

	"github.com/xmx-stack/xmx/xdp"
)

// gatherSpec is one frame of a gather batch: its head length and where its
// tail lies in the buffer.
type gatherSpec struct {
	head int
	tail xdp.Span
}

// gatherer sends frames whose whole bytes are in whole[i]: the first
// specs[i].head bytes built as the head, the rest (already copied into the
// buffer) as the tail.
type gatherer struct {
	whole [][]byte
	specs []gatherSpec
}

func (g *gatherer) Gather(i int, head []byte) (int, xdp.Span) {
	s := g.specs[i]
	return copy(head, g.whole[i][:s.head]), s.tail
}

// testGather sends frames of every size split into a head and a tail at
// varying points, the tails at offsets of the buffer that cross UMEM frame
// boundaries, and checks each frame arrives whole and intact; then the
// refusals of bad spans.
func testGather(t *testing.T, mk MakePair, opts Options) {
	p := mk(t)
	ab, ok := p.A.(xdp.BufferLink)
	_, okb := p.B.(xdp.BufferLink)
	_, okv := p.B.(xdp.FrameVisitor)
	if !ok || !okb || !okv {
		t.Skipf("%s does not implement xdp.BufferLink", p.A.Info().Kind)
	}
	maxLen := xdp.MaxFrameLen(p.A)
	const batch = 8
	stride := maxLen + 1237 // tails start at ever different offsets in a UMEM frame
	buf, err := ab.AllocBuffer(batch * stride)
	if errors.Is(err, xdp.ErrNoBufferSpace) {
		t.Skipf("the link has no buffer area of %d bytes", batch*stride)
	}
	if err != nil {
		t.Fatalf("AllocBuffer(%d): %v", batch*stride, err)
	}
	defer buf.Free()
	if buf.Len() != batch*stride {
		t.Fatalf("buffer of %d bytes, asked for %d", buf.Len(), batch*stride)
	}
	t.Logf("%s: tails sent without a copy: %v", p.A.Info().Kind, ab.GatherZeroCopy())
	if !ab.BufferSent(buf) {
		t.Fatal("BufferSent of a buffer nothing was sent from: false")
	}

	const run = 30
	src, dst := p.A.HardwareAddr(), p.B.HardwareAddr()
	g := &gatherer{whole: make([][]byte, batch), specs: make([]gatherSpec, batch)}
	for i := range g.whole {
		g.whole[i] = make([]byte, maxLen)
	}
	sent, got := 0, 0
	splitFrames(maxLen, batch, func(n int, seq uint64, size, head int) {
		f := frame(g.whole[n], dst, src, run, seq, size)
		off := n * stride
		copy(buf.Bytes()[off:], f[head:])
		g.specs[n] = gatherSpec{head: head}
		if head < size {
			g.specs[n].tail = xdp.Span{Buf: buf, Off: off, Len: size - head}
		}
	}, func(n int) {
		g.whole, g.specs = g.whole[:n], g.specs[:n]
		if k, err := ab.SendGather(n, g); k != n || err != nil {
			t.Fatalf("SendGather(%d) = %d, %v", n, k, err)
		}
		sent += n
		// The next batch overwrites the buffer: the frames must be out.
		seqs := collect(t, p.B, p.B.(xdp.FrameVisitor), src, run, n, 2*time.Second)
		got += len(seqs)
		if !opts.Faults && len(seqs) != n {
			t.Fatalf("batch of %d gathered frames: received %d (%v)", n, len(seqs), seqs)
		}
		waitBufferSent(t, ab, buf)
		g.whole, g.specs = g.whole[:batch], g.specs[:batch]
	})
	t.Logf("%d gathered frames of %d..%d bytes sent, %d received intact", sent, xdp.MinFrameLen, maxLen, got)

	// Refusals: the frames before the bad one go out, the call stops there.
	other, err := p.B.(xdp.BufferLink).AllocBuffer(64)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Free()
	if !ab.BufferSent(other) {
		t.Error("BufferSent of another link's buffer: false")
	}
	freed, err := ab.AllocBuffer(64)
	if err != nil {
		t.Fatal(err)
	}
	freed.Free()
	freed.Free() // a second Free does nothing
	frame(g.whole[0], dst, src, run+1, 0, 100)
	for _, c := range []struct {
		name string
		tail xdp.Span
		want error
	}{
		{"FreedBuffer", xdp.Span{Buf: freed, Off: 0, Len: 20}, xdp.ErrBadSpan},
		{"OtherLinksBuffer", xdp.Span{Buf: other, Off: 0, Len: 20}, xdp.ErrBadSpan},
		{"BeyondBuffer", xdp.Span{Buf: buf, Off: buf.Len() - 10, Len: 20}, xdp.ErrBadSpan},
		{"NegativeOffset", xdp.Span{Buf: buf, Off: -1, Len: 20}, xdp.ErrBadSpan},
		{"EmptyTail", xdp.Span{Buf: buf, Off: 0, Len: 0}, xdp.ErrBadSpan},
		{"LenWithoutBuffer", xdp.Span{Len: 5}, xdp.ErrBadSpan},
		{"OffsetWithoutBuffer", xdp.Span{Off: 5}, xdp.ErrBadSpan},
		{"TooLong", xdp.Span{Buf: buf, Off: 0, Len: maxLen}, xdp.ErrFrameTooLong},
	} {
		t.Run(c.name, func(t *testing.T) {
			bad := &gatherer{whole: [][]byte{g.whole[0], g.whole[0]}, specs: []gatherSpec{{head: 100}, {head: 80, tail: c.tail}}}
			if n, err := ab.SendGather(2, bad); n != 1 || !errors.Is(err, c.want) {
				t.Errorf("SendGather with tail %+v = %d, %v; want 1, %v", c.tail, n, err, c.want)
			}
		})
	}
	if n, err := ab.SendGather(1, nil); n != 0 || err == nil {
		t.Errorf("SendGather with a nil Gatherer = %d, %v; want an error", n, err)
	}
	if _, err := ab.AllocBuffer(0); err == nil {
		t.Error("AllocBuffer(0) succeeded")
	}
	collect(t, p.B, p.B.(xdp.FrameVisitor), src, run+1, 7, 200*time.Millisecond)
}

// waitBufferSent fails t unless the link is done with buf within two
// seconds: every frame sent from it was received, so only the completions
// may be late.
func waitBufferSent(t *testing.T, l xdp.BufferLink, buf *xdp.Buffer) {
	t.Helper()
	for deadline := time.Now().Add(2 * time.Second); !l.BufferSent(buf); {
		if time.Now().After(deadline) {
			t.Fatal("BufferSent still false 2 s after the frames sent from the buffer were received")
		}
		time.Sleep(50 * time.Microsecond)
	}
}
