package xdp

// In-place sending and receiving on AF_XDP (FrameBuilder and FrameVisitor):
// the caller writes frames straight into idle send slots of the UMEM and
// reads received frames where the kernel put them.
//
// Send side. Every frame goes in a send slot, which is one UMEM frame on a
// single-buffer link and a run of adjacent UMEM frames large enough for
// MaxFrameLen on a multi-buffer one (see AFXDPLink). Build is handed the
// idle slot on top of txFree, sliced to MaxFrameLen: the frame is built in
// place, and nothing is copied, whatever its length. The descriptors then
// point into the slot as Send's would.
//
// The slot is taken off txFree only after Build returns, so a Build that
// panics leaks nothing, and the frames built before it are sent (the
// deferred txFinish publishes them and wakes the kernel).
//
// Receive side. A single-descriptor packet is shown to Visit in place in the
// UMEM; a multi-buffer packet is reassembled in rxScratch first (its
// fragments each sit behind their frame's headroom, so they are not
// contiguous). The ring state moves past a packet, and its frames are queued
// (not yet submitted) for the fill ring, before Visit is called: the kernel
// gets them back only when the RX consumer and the fill producer are
// published at the end of the call, after the last Visit, and a Visit that
// panics leaves the rings consistent (the deferred rxPublish publishes).

import (
	"errors"
	"time"
)

var (
	errNilBuilder  = errors.New("nil Builder")
	errNilVisitor  = errors.New("nil Visitor")
	errNilGatherer = errors.New("nil Gatherer")
	errNilTailer   = errors.New("nil Tailer")
)

// txBatch counts the frames produced on the TX ring but not yet submitted.
type txBatch struct {
	frames int
	bytes  uint64
}

// txCommit submits the pending TX descriptors and counts them.
//
// +checklocks:l.txMu
func (l *AFXDPLink) txCommit(p *txBatch) {
	if p.frames == 0 {
		return
	}
	l.tx.submit()
	l.txFrames.Add(uint64(p.frames))
	l.txBytes.Add(p.bytes)
	*p = txBatch{}
}

// txFinish submits the frames built before a Build or Gather that panicked,
// and wakes the kernel to send them. On every other way out of
// sendBuiltLocked nothing is left pending: it has done both itself.
//
// +checklocks:l.txMu
func (l *AFXDPLink) txFinish(p *txBatch) {
	if p.frames > 0 {
		l.txCommit(p)
		l.kickTx()
	}
}

// SendBuilt implements FrameBuilder: every frame is built in place in the
// UMEM, in the send slot Send would have copied it into (one UMEM frame, or
// in multi-buffer mode a run of adjacent ones).
func (l *AFXDPLink) SendBuilt(n int, b Builder) (int, error) {
	Trace(l.traceSide, TraceLinkSend)
	var missing error
	if b == nil {
		missing = errNilBuilder
	}
	return l.sendInPlace(n, b, nil, missing)
}

// sendInPlace is SendBuilt (b) or SendGather (g); missing is the error of
// a nil argument, reported once the link is known to be open.
func (l *AFXDPLink) sendInPlace(n int, b Builder, g Gatherer, missing error) (int, error) {
	l.txMu.Lock()
	defer l.txMu.Unlock()
	if l.closed.Load() {
		return 0, l.closedErr("send")
	}
	if l.gone.Load() != 0 {
		return 0, l.goneErr("send")
	}
	if missing != nil {
		return 0, &OpError{Op: "send", Interface: l.ifname, Err: missing}
	}
	sent, _, err := l.sendBuiltLocked(0, n, b, g, nil, 0)
	return sent, err
}

// sendBuiltRouted is SendBuilt of frames from..n-1 for the multi-queue link
// m, of which l is queue index q: see sendBuiltLocked.
func (l *AFXDPLink) sendBuiltRouted(from, n int, b Builder, m *AFXDPMultiLink, q int) (next, spilled int, err error) {
	l.txMu.Lock()
	defer l.txMu.Unlock()
	if l.closed.Load() {
		return from, 0, l.closedErr("send")
	}
	if l.gone.Load() != 0 {
		return from, 0, l.goneErr("send")
	}
	return l.sendBuiltLocked(from, n, b, nil, m, q)
}

// txBurst is how many frames sendBuiltLocked builds before it asks the
// kernel to send them: what one copy-mode sendto transmits (the kernel's
// TX_BATCH_SIZE). The kernel copies each frame out of the UMEM while it is
// still in the cache of the CPU that built it; building a whole pull
// window first (hundreds of frames) left the early ones in memory by then.
const txBurst = 32

// sendBuiltLocked builds and sends frames from..n-1 of b (or, with g set,
// gathers them from g) and returns the index of the first frame not sent.
// A gathered tail gets descriptors of its own in multi-buffer mode and is
// copied behind its head otherwise. With a multi-queue link m (never with
// g), a frame that
// m routes to a queue other than q is not sent: it is copied into m.spill,
// sendBuiltLocked returns its index and its length as spilled, and m sends it
// on its own queue.
//
// +checklocks:l.txMu
func (l *AFXDPLink) sendBuiltLocked(from, n int, b Builder, g Gatherer, m *AFXDPMultiLink, q int) (next, spilled int, err error) {
	var p txBatch
	defer l.txFinish(&p) // sends what was built should Build panic
	// A frame's length is known only once built: secure the TX ring entries
	// of the longest (with a tail that may start anywhere in a frame).
	nd := uint32(l.txDescs(l.maxFrame))
	if g != nil && l.gatherDsc {
		nd = uint32(l.gatherSlots())
	}
	maxLen := uint64(l.maxFrame)
	i := from
	var stalledSince time.Time
	for i < n {
		l.reclaim()
		var bad error
		for i < n && p.frames < txBurst {
			if len(l.txFree) == 0 || l.tx.free(nd) < nd {
				break
			}
			base := l.txFree[len(l.txFree)-1]
			buf := l.umem[base : base+maxLen : base+maxLen]
			var size int
			var tail Span
			if g != nil {
				size, tail = g.Gather(i, buf)
			} else {
				size = b.Build(i, buf)
			}
			if err := checkBuilt(size, l.maxFrame); err != nil {
				bad = err
				break
			}
			if tail != (Span{}) {
				if err := checkSpan(tail, l, size, l.maxFrame); err != nil {
					bad = err
					break
				}
				// A tail that would take the packet past the descriptors
				// the kernel (or the driver) takes per packet (one starting near a frame's end
				// takes one more) is copied too: the kernel would drop it.
				if !l.gatherDsc || l.txDescs(size)+l.spanDescs(tail) > l.maxDescs {
					size += copy(buf[size:], tail.Buf.mem[tail.Off:tail.Off+tail.Len])
					tail = Span{}
				}
			}
			if m != nil && m.queueFor(buf[:size]) != q {
				spilled = copy(m.spill, buf[:size])
				break
			}
			l.queueSlot(base, size, tail.Buf != nil)
			if tail.Buf != nil {
				l.queueTail(tail)
			}
			p.frames++
			p.bytes += uint64(size + tail.Len)
			i++
		}
		if p.frames > 0 {
			l.txCommit(&p)
			stalledSince = time.Time{}
		} else if bad == nil && spilled == 0 {
			if stalledSince.IsZero() {
				stalledSince = time.Now()
			}
			if err := l.waitTx(stalledSince); err != nil {
				return i, 0, err
			}
			continue
		}
		if err := l.kickTx(); err != nil {
			return i, 0, err
		}
		if bad != nil {
			return i, 0, &OpError{Op: "send", Interface: l.ifname, Err: bad}
		}
		if spilled > 0 {
			return i, spilled, nil
		}
	}
	return i, 0, nil
}

// RecvVisit implements FrameVisitor. A single-descriptor frame is shown in
// place in the UMEM; a multi-buffer one is reassembled in a scratch buffer
// first.
func (l *AFXDPLink) RecvVisit(max int, timeout time.Duration, v Visitor) (int, error) {
	if l.closed.Load() {
		return 0, l.closedErr("recv")
	}
	if v == nil {
		return 0, &OpError{Op: "recv", Interface: l.ifname, Err: errNilVisitor}
	}
	if max <= 0 || (timeout == 0 && l.RxIdle()) {
		return 0, nil
	}
	l.rxMu.Lock()
	defer l.rxMu.Unlock()
	return l.recvLocked(nil, nil, max, v, timeout)
}

// rxPending tracks what visitReady consumed and has not yet published.
type rxPending struct {
	start  uint32 // RX consumer index when the call began
	queued uint32 // fill ring producer index (cached) when the call began
	avail  uint32 // descriptors waiting on the RX ring when the call began
	frames int
	bytes  uint64
}

// rxPublish hands the consumed RX entries back to the kernel, submits the
// frames queued for the fill ring and counts the frames visited.
//
// +checklocks:l.rxMu
func (l *AFXDPLink) rxPublish(p *rxPending) {
	if l.rx.cachedCons == p.start {
		return
	}
	l.rx.release()
	l.refill(p.avail, l.rx.cachedCons-p.start, l.fill.cachedProd-p.queued)
	if p.frames > 0 {
		l.rxFrames.Add(uint64(p.frames))
		l.rxBytes.Add(p.bytes)
	}
}

// visitReady shows up to max packets waiting on the RX ring to v, as
// recvReady copies them out (same packet boundaries, same handling of a
// packet not wholly published and of corrupted descriptors), and gives
// their UMEM frames back to the fill ring.
//
// +checklocks:l.rxMu
func (l *AFXDPLink) visitReady(max int, v Visitor) int {
	want := uint32(min(max, int(l.rx.size)))
	if l.sg {
		want = l.rx.size
	}
	avail := l.rx.avail(want)
	if avail == 0 {
		return 0
	}
	Trace(l.traceSide, TraceRxSeen)
	l.fill.free(avail)
	end := l.rx.cachedCons + avail
	p := rxPending{start: l.rx.cachedCons, queued: l.fill.cachedProd, avail: avail}
	defer l.rxPublish(&p)
	for p.frames < max && l.rx.cachedCons != end {
		first := l.rx.cachedCons
		next, complete := l.packetEnd(first, end)
		if !complete && next-first < l.rx.size {
			break // the rest of the packet is not published yet
		}
		var frame []byte
		bad := !complete
		if next-first == 1 && !bad {
			var ok bool
			frame, ok = l.takeDesc(first)
			bad = !ok
		} else {
			l.rxScratch = l.rxScratch[:0]
			for i := first; i != next; i++ {
				data, ok := l.takeDesc(i)
				if !ok {
					bad = true
				} else if !bad {
					l.rxScratch = append(l.rxScratch, data...)
				}
			}
			frame = l.rxScratch
		}
		l.rx.cachedCons = next
		if bad {
			l.badDescs.Add(1)
			continue
		}
		p.frames++
		p.bytes += uint64(len(frame))
		v.Visit(frame)
	}
	return p.frames
}
