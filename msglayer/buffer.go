package msglayer

// Lent buffers. An endpoint whose link lends memory (xdp.BufferLink: the
// UMEM of an AF_XDP link opened with Config.UMEMBufferBytes) hands it out
// as Buffers. A rendezvous send (large, synchronous, or a Put) whose data
// is one segment inside a Buffer is answered from it where it lies: each
// pull reply is a header built in a transmit frame followed by a span of
// the buffer, which on a multi-buffer AF_XDP socket is a descriptor of its
// own, so the CPU never copies the data (a zero-copy NIC reads it from the
// buffer). A send that fails completes only once the link is done with
// the buffer (Endpoint.holdFailed), so that the user's next data never
// leaves in a reply to it. Eager messages are still copied into their
// frames, which the reliability layer keeps for retransmission.

import (
	"errors"

	"github.com/xmx-stack/xmx/xdp"
)

// Buffer is memory for messages lent by an endpoint (AllocBuffer). Use
// Bytes like any slice. Free it once the sends from it have completed;
// a Free while sends still use it takes effect when the last completes.
type Buffer struct {
	g  *engine
	xb *xdp.Buffer // nil: ordinary memory (the link lends none)
	b  []byte
	// +checklocks:g.mu
	users int // sends answered from xb, not completed yet
	// +checklocks:g.mu
	freed bool
}

// Bytes is the buffer's memory.
func (b *Buffer) Bytes() []byte { return b.b }

// ZeroCopy reports whether large sends from the buffer leave without the
// CPU copying their data (the link sends it from where it lies).
func (b *Buffer) ZeroCopy() bool {
	return b.xb != nil && b.g.gather.GatherZeroCopy()
}

// Free gives the buffer back to the link. Bytes must not be used after
// it. A second Free does nothing.
func (b *Buffer) Free() {
	g := b.g
	g.mu.Lock()
	defer g.mu.Unlock()
	if b.freed {
		return
	}
	b.freed = true
	if b.users == 0 {
		g.dropBuffer(b)
	}
}

// AllocBuffer lends n bytes for messages: link memory when the link lends
// it (see Buffer), else ordinary memory (ZeroCopy reports which). A link
// whose buffer area is exhausted also gives ordinary memory.
func (e *Endpoint) AllocBuffer(n int) (*Buffer, error) {
	if n <= 0 {
		return nil, &ArgError{Arg: "n", Err: errors.New("buffer length must be positive")}
	}
	g := e.eng
	g.mu.Lock()
	defer g.mu.Unlock()
	if e.closed {
		return nil, ErrClosed
	}
	b := &Buffer{g: g}
	if g.lendsBuffers {
		xb, err := g.gather.AllocBuffer(n)
		switch {
		case err == nil:
			b.xb, b.b = xb, xb.Bytes()
			g.bufs = append(g.bufs, b)
			return b, nil
		case !errors.Is(err, xdp.ErrNoBufferSpace):
			return nil, err
		}
		e.stats.BufferFallbacks++
	}
	b.b = make([]byte, n)
	return b, nil
}

// spanOf finds the lent buffer holding all of seg and takes a use of it
// for a send.
//
// +checklocks:g.mu
func (g *engine) spanOf(seg []byte) (*Buffer, int) {
	for _, b := range g.bufs {
		if off, ok := b.xb.Offset(seg); ok && !b.freed {
			b.users++
			return b, off
		}
	}
	return nil, 0
}

// unuse ends a send's use of b.
//
// +checklocks:g.mu
func (g *engine) unuse(b *Buffer) {
	b.users--
	if b.users == 0 && b.freed {
		g.dropBuffer(b)
	}
}

// dropBuffer forgets a freed buffer and gives its memory back to the link
// (which reuses it once the frames sent from it have completed).
//
// +checklocks:g.mu
func (g *engine) dropBuffer(b *Buffer) {
	if b.xb == nil {
		return
	}
	for i, x := range g.bufs {
		if x == b {
			g.bufs = append(g.bufs[:i], g.bufs[i+1:]...)
			break
		}
	}
	b.xb.Free()
}
