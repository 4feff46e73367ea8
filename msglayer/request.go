package msglayer

import (
	"sync/atomic"
	"unsafe"
)

type reqKind uint8

const (
	kindSend reqKind = iota
	kindRecv
	kindConnect
	kindNotify    // internal: a notify frame waiting for window space
	kindGet       // one-sided read of a peer's region (a pull from the region)
	kindPutTarget // internal: pulling a peer's Put into one of our regions
)

// request is the engine's record of one operation. Requests are recycled
// through the endpoint's free list; the user holds a Request handle whose
// generation must match. All fields are guarded by the engine lock except
// the ones after requestState, which a Wait reads without it: release
// leaves them out of the state it clears, so that a Wait on a spent
// handle (which may run while the request is recycled) races with no
// plain store.
type request struct {
	requestState
	ep *Endpoint // set once: a request stays on its endpoint's free list
	// liveGen is gen, for Wait's look without the lock: release (and
	// Forget, which spends the handle) store it.
	liveGen  atomic.Uint64
	doneFlag atomic.Bool   // done, for Wait's look without the lock (see Endpoint.complete)
	wake     chan struct{} // capacity 1, set once: signalled at completion if waiters > 0
	// waiters counts the goroutines asleep in Wait on the request (not
	// the one driving). Each counts itself in and out, whatever the
	// request's generation meanwhile: release leaves the count alone.
	waiters atomic.Int32
}

// poke signals r.wake unless a signal is pending already.
func (r *request) poke() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// requestState is what release clears.
type requestState struct {
	// gen counts the request's uses; 64 bits, so that a handle kept
	// after it was spent never becomes valid again.
	gen  uint64
	kind reqKind

	done      bool // completed: status is final
	signalled bool // wake was signalled: release drains it
	forgotten bool // Forget: release at completion, report nothing
	inDoneQ   bool
	private   bool     // a blocking call's own (Connect): never in a done queue
	dprev     *request // done queue (the endpoint's or the group's)
	dnext     *request
	group     *Group
	status    Status
	segs      [][]byte
	length    int // total length of segs

	// Receives.
	info, mask   uint64
	rprev, rnext *request // posted-receive queue
	queued       bool
	pull         *pull

	// Sends.
	peer     *peer
	match    uint64
	sync     bool
	rndv     bool   // large, synchronous or converted: completes at notify
	rndvID   uint32 // in ep.rndvs while the receiver may pull
	framed   int    // bytes of an eager message already framed
	unacked  int    // reliable frames of this message not yet acked
	buffered bool   // the user's buffer is no longer needed
	sprev    *request
	snext    *request // peer's send queue (waiting for window space)
	// An eager message the receiver refused while some of its frames
	// were still being handed to the link: converted to rendezvous once
	// the last of them is back (convertSent). convertFirst is its first
	// frame.
	convertWanted bool
	convertFirst  uint32
	// txRefs counts pull replies queued to be built from this send's data;
	// while it is above 0 the data must stay, so a completion waits
	// (completeLater, laterCode) until the last one is sent.
	txRefs        int
	completeLater bool
	laterCode     Code
	inSendQ       bool
	// zbuf is the lent buffer the send's data lies in (one segment, at
	// zoff): its pull replies are sent from it without a copy.
	zbuf *Buffer
	zoff int
	// held: the send failed with laterCode, and its completion waits for
	// the link to be done with zbuf, until heldEnd at the latest
	// (Endpoint.holdFailed).
	held    bool
	heldEnd int64

	// One-sided operations: the region addressed (Get: the peer's; Put
	// target: ours) and, for Put, the initiator's record.
	put       bool // a Put: its record is a tPut frame, it completes at notify
	regionID  uint32
	regionKey uint64
	regionOff uint64

	// Connects.
	connAddr     Addr
	connKey      uint32
	connID       uint32
	connDeadline int64
	connNext     int64
}

// Request is a handle on a pending operation. The zero Request is invalid.
// A handle is spent once Test, Wait or Forget has reported its completion:
// using it again returns ErrStaleRequest.
type Request struct {
	r   *request
	gen uint64
}

// valid reports whether the handle still refers to its request. The
// caller holds the engine lock.
func (h Request) valid() bool { return h.r != nil && h.r.gen == h.gen }

// checkOn returns why h cannot be used on endpoint e (ErrStaleRequest,
// ErrForeignRequest), or nil. The caller holds the engine lock.
func (h Request) checkOn(e *Endpoint) error {
	switch {
	case !h.valid():
		return ErrStaleRequest
	case h.r.ep != e:
		return ErrForeignRequest
	}
	return nil
}

// copyFromSegs copies into dst the bytes of segs starting at offset off
// and returns how many it copied.
func copyFromSegs(dst []byte, segs [][]byte, off int) int {
	n := 0
	for _, s := range segs {
		if off >= len(s) {
			off -= len(s)
			continue
		}
		c := copy(dst[n:], s[off:])
		n += c
		off = 0
		if n == len(dst) {
			break
		}
	}
	return n
}

// segSpan returns the n bytes at offset off of segs when they lie in one
// segment, else nil.
func segSpan(segs [][]byte, off, n int) []byte {
	for _, s := range segs {
		if off >= len(s) {
			off -= len(s)
			continue
		}
		if len(s)-off < n {
			return nil
		}
		return s[off : off+n : off+n]
	}
	return nil
}

// copyToSegs copies src into segs starting at offset off, as far as segs
// reach, and returns how many bytes it copied.
func copyToSegs(segs [][]byte, off int, src []byte) int {
	n := 0
	for _, s := range segs {
		if off >= len(s) {
			off -= len(s)
			continue
		}
		c := copy(s[off:], src[n:])
		n += c
		off = 0
		if n == len(src) {
			break
		}
	}
	return n
}

func segsLen(segs [][]byte) int {
	n := 0
	for _, s := range segs {
		n += len(s)
	}
	return n
}

// doneQueue is an intrusive list of completed requests, guarded by the
// engine lock.
type doneQueue struct {
	head, tail *request
}

func (q *doneQueue) push(r *request) {
	r.dprev, r.dnext = q.tail, nil
	if q.tail != nil {
		q.tail.dnext = r
	} else {
		q.head = r
	}
	q.tail = r
	r.inDoneQ = true
}

func (q *doneQueue) remove(r *request) {
	if !r.inDoneQ {
		return
	}
	if r.dprev != nil {
		r.dprev.dnext = r.dnext
	} else {
		q.head = r.dnext
	}
	if r.dnext != nil {
		r.dnext.dprev = r.dprev
	} else {
		q.tail = r.dprev
	}
	r.dprev, r.dnext, r.inDoneQ = nil, nil, false
}

// find returns the oldest request whose status match info fits
// (info, mask).
func (q *doneQueue) find(info, mask uint64) *request {
	for r := q.head; r != nil; r = r.dnext {
		if matches(r.status.Match, info, mask) {
			return r
		}
	}
	return nil
}

// uintptrOf is the address of b's first byte.
func uintptrOf(b []byte) uintptr { return uintptr(unsafe.Pointer(unsafe.SliceData(b))) }
