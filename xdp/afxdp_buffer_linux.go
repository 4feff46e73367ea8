package xdp

// The buffer area of an AF_XDP link: UMEM lent to the caller (AllocBuffer)
// and sent from where it lies (SendGather). A gathered frame is its head,
// built in a send slot like any frame, followed by its tail's descriptors,
// which point into the buffer: split at UMEM frame boundaries (a descriptor
// may not cross one in aligned mode), XDP_PKT_CONTD on all but the last.
// Their completions come back on the completion ring with buffer-area
// addresses; they count down the buffer's inflight, and a freed buffer's
// frames are idle again once it reaches zero.

import (
	"golang.org/x/sys/unix"
)

// AllocBuffer implements BufferLink: n bytes of the buffer area, starting
// on a UMEM frame, the first run of idle frames that holds them.
func (l *AFXDPLink) AllocBuffer(n int) (*Buffer, error) {
	if n <= 0 {
		return nil, &OpError{Op: "allocate buffer", Interface: l.ifname, Err: badAlloc(n)}
	}
	l.closeMu.RLock()
	defer l.closeMu.RUnlock()
	if l.closed.Load() {
		return nil, l.closedErr("allocate buffer")
	}
	l.txMu.Lock()
	defer l.txMu.Unlock()
	need := (n + int(l.frameSize) - 1) / int(l.frameSize)
	run := 0
	for i, o := range l.bufOwner {
		if o != nil {
			run = 0
			continue
		}
		if run++; run < need {
			continue
		}
		first := i + 1 - need
		addr := l.bufBase + uint64(first)*l.frameSize
		b := &Buffer{mem: l.umem[addr : addr+uint64(n) : addr+uint64(n)], addr: addr, owner: l}
		for j := first; j <= i; j++ {
			l.bufOwner[j] = b
		}
		l.bufLive++
		return b, nil
	}
	return nil, &OpError{Op: "allocate buffer", Interface: l.ifname, Err: ErrNoBufferSpace}
}

// freeBuffer gives b's frames back once no descriptor points into them.
func (l *AFXDPLink) freeBuffer(b *Buffer) {
	l.txMu.Lock()
	defer l.txMu.Unlock()
	if b.freed {
		return
	}
	b.freed = true
	l.bufLive--
	if l.closed.Load() {
		// Nothing completes any more. The last buffer of a closed link
		// takes the UMEM with it.
		if l.bufLive == 0 && l.umemKept {
			l.umemKept = false
			unix.Munmap(l.umem)
		}
		return
	}
	if b.inflight == 0 {
		l.releaseBuffer(b)
	}
}

// releaseBuffer makes b's frames idle.
//
// +checklocks:l.txMu
func (l *AFXDPLink) releaseBuffer(b *Buffer) {
	first := (b.addr - l.bufBase) / l.frameSize
	for j := first; j < uint64(len(l.bufOwner)) && l.bufOwner[j] == b; j++ {
		l.bufOwner[j] = nil
	}
}

// BufferSent implements [BufferLink].
func (l *AFXDPLink) BufferSent(b *Buffer) bool {
	l.closeMu.RLock()
	defer l.closeMu.RUnlock()
	if b == nil || b.owner != bufferOwner(l) {
		return true
	}
	if l.closed.Load() {
		// Until Close has closed the socket, descriptors handed to the
		// kernel may still be read (the rings are no longer ours to reap).
		return l.shut.Load()
	}
	if !l.txMu.TryLock() {
		return false // a send is under way: it reaps, and we ask again
	}
	defer l.txMu.Unlock()
	if b.inflight > 0 {
		l.reclaim()
	}
	if b.inflight > 0 && l.kickTx() == nil {
		// Frames the kernel refused, or that it has not been asked to
		// send (need_wakeup): kickTx asks, reaping as it retries.
		l.reclaim()
	}
	return b.inflight == 0
}

// bufCompleted accounts for a completed descriptor that pointed into the
// buffer area, at the UMEM frame addr. An address naming no buffer with
// descriptors in flight can only come from a corrupted ring: ignored.
//
// +checklocks:l.txMu
func (l *AFXDPLink) bufCompleted(addr uint64) {
	j := (addr - l.bufBase) / l.frameSize
	if j >= uint64(len(l.bufOwner)) {
		return
	}
	b := l.bufOwner[j]
	if b == nil || b.inflight == 0 {
		return
	}
	b.inflight--
	if b.inflight == 0 && b.freed {
		l.releaseBuffer(b)
	}
}

// spanDescs is how many TX descriptors queueTail gives tail s: one per
// UMEM frame it touches.
func (l *AFXDPLink) spanDescs(s Span) int {
	first := (s.Buf.addr + uint64(s.Off)) / l.frameSize
	last := (s.Buf.addr + uint64(s.Off+max(s.Len, 1)) - 1) / l.frameSize
	return int(last-first) + 1
}

// queueTail produces the descriptors of a gathered tail (not yet
// submitted). The caller secured the TX ring entries.
//
// +checklocks:l.txMu
func (l *AFXDPLink) queueTail(s Span) {
	s.Buf.inflight += l.queueDescs(s.Buf.addr+uint64(s.Off), uint64(s.Len), false)
}

// SendGather implements BufferLink.
func (l *AFXDPLink) SendGather(n int, g Gatherer) (int, error) {
	var missing error
	if g == nil {
		missing = errNilGatherer
	}
	return l.sendInPlace(n, nil, g, missing)
}

// GatherZeroCopy implements BufferLink: tails are descriptors of their own
// (see GatherMode).
func (l *AFXDPLink) GatherZeroCopy() bool { return l.gatherDsc }
