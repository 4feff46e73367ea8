package xdp

import (
	"errors"
	"fmt"
	"unsafe"
)

// BufferLink is implemented by links that lend the caller memory from their
// transmit area (the UMEM for AF_XDP) and send frames whose tail is taken
// from that memory where it lies: on an AF_XDP socket bound in multi-buffer
// mode the tail becomes its own TX descriptors, so the CPU never copies it
// (on a NIC with zero-copy AF_XDP, the NIC reads it straight from the
// buffer). The AF_XDP and in-memory links implement it.
type BufferLink interface {
	FrameBuilder

	// AllocBuffer lends n bytes of link memory, rounded up to whole UMEM
	// frames. It fails with ErrNoBufferSpace when the link's buffer area is
	// exhausted (or has none).
	AllocBuffer(n int) (*Buffer, error)

	// SendGather is SendBuilt for frames made of a head built in place by
	// g.Gather and a tail taken from a Buffer of this link. Its calling
	// rules and errors are those of SendBuilt; a Span naming a freed
	// buffer, another link's buffer or bytes outside its buffer is refused
	// with ErrBadSpan, and SendGather stops there.
	SendGather(n int, g Gatherer) (int, error)

	// GatherZeroCopy reports whether SendGather sends tails without
	// copying them (false: they are copied behind the head).
	GatherZeroCopy() bool

	// BufferSent reports whether the frames sent from b are done with
	// it: no descriptor handed to the kernel (or the NIC) points into it
	// any more, so writing into it changes no frame sent before. It
	// reaps the completions the kernel posted and kicks frames a refused
	// kick left queued, so that calling it again makes progress without
	// another send. It does not wait for a send under way, or for a Close
	// under way: it says false then. A closed link, and a buffer it did
	// not lend, are done.
	BufferSent(b *Buffer) bool
}

// Gatherer writes the head of frame i of a SendGather call into head (link
// memory of MaxFrameLen bytes) and returns the head's length and the
// frame's tail: a Span of a Buffer of the link, or the zero Span for none.
// The frame is head followed by tail; its length must not exceed
// MaxFrameLen.
type Gatherer interface {
	Gather(i int, head []byte) (int, Span)
}

// Span is Len bytes at offset Off of a Buffer.
type Span struct {
	Buf      *Buffer
	Off, Len int
}

// Buffer is link memory lent by AllocBuffer. Its bytes may be read and
// written like any slice's; a frame sent from it with SendGather leaves
// with whatever the bytes hold when the link (or the NIC) reads them, so
// they must not change until the caller knows the frame is out (for
// msglayer: until the send completes).
//
// Free gives the memory back; if frames taking their tail from it are
// still in flight, the memory is reused only once they have completed.
// Bytes must not be used after Free. A buffer outlives its link: after
// the link is closed the memory stays mapped until the last buffer is
// freed.
type Buffer struct {
	mem   []byte
	addr  uint64 // UMEM address of mem[0] (AF_XDP)
	owner bufferOwner
	// Owned by the owner's buffer lock.
	inflight int  // TX descriptors in flight that point into the buffer
	freed    bool // Free was called
}

// bufferOwner is the link a Buffer belongs to.
type bufferOwner interface {
	freeBuffer(b *Buffer)
}

// Bytes is the buffer's memory.
func (b *Buffer) Bytes() []byte { return b.mem }

// Len is the buffer's length.
func (b *Buffer) Len() int { return len(b.mem) }

// Free gives the buffer back to its link. A second Free does nothing.
func (b *Buffer) Free() { b.owner.freeBuffer(b) }

// Offset reports where p starts in the buffer, and whether all of p lies
// inside it.
func (b *Buffer) Offset(p []byte) (int, bool) {
	if len(p) == 0 || len(b.mem) == 0 {
		return 0, false
	}
	base := uintptr(unsafe.Pointer(unsafe.SliceData(b.mem)))
	at := uintptr(unsafe.Pointer(unsafe.SliceData(p)))
	if at < base || at-base+uintptr(len(p)) > uintptr(len(b.mem)) {
		return 0, false
	}
	return int(at - base), true
}

var (
	// ErrNoBufferSpace: AllocBuffer found no room in the link's buffer area.
	ErrNoBufferSpace = errors.New("no room in the link's buffer area")
	// ErrBadSpan: a Span passed to SendGather names a freed buffer, another
	// link's buffer, or bytes outside its buffer.
	ErrBadSpan = errors.New("span outside a live buffer of this link")
)

// checkSpan validates a tail for a frame whose head is head bytes long.
func checkSpan(s Span, owner bufferOwner, head, maxLen int) error {
	if s.Buf == nil {
		// Only the zero Span means "no tail"; a Span with an offset or
		// a length but no buffer names no memory.
		if s != (Span{}) {
			return ErrBadSpan
		}
		return nil
	}
	if s.Buf.owner != owner || s.Buf.freed || s.Off < 0 || s.Len <= 0 || s.Off+s.Len > len(s.Buf.mem) || s.Off+s.Len < s.Off {
		return ErrBadSpan
	}
	if head+s.Len > maxLen {
		return ErrFrameTooLong
	}
	return nil
}

// badAlloc is the error of an AllocBuffer of a non-positive size.
func badAlloc(n int) error { return fmt.Errorf("allocate buffer of %d bytes: want > 0", n) }

// gatherCopy adapts a Gatherer to a Builder for links that copy tails
// behind their heads (the in-memory link). The caller holds what guards
// the buffers' freed flags.
type gatherCopy struct {
	g      Gatherer
	owner  bufferOwner
	maxLen int
	err    error // why the last Build refused its frame
}

func (c *gatherCopy) Build(i int, buf []byte) int {
	n, t := c.g.Gather(i, buf)
	if t == (Span{}) {
		return n
	}
	if err := checkBuilt(n, c.maxLen); err != nil {
		return n
	}
	if err := checkSpan(t, c.owner, n, c.maxLen); err != nil {
		c.err = err
		return -1
	}
	return n + copy(buf[n:], t.Buf.mem[t.Off:t.Off+t.Len])
}
