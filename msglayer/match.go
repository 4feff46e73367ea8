package msglayer

import "unsafe"

// The matcher holds the posted receives and the unexpected messages of an
// endpoint, each in arrival order, as intrusive doubly linked lists (no
// allocation to post, match or cancel), one pair of lists per context id. A message matches a receive when
// message.match & recv.mask == recv.info; an arriving message takes the
// oldest posted receive it matches, a posted receive takes the oldest
// unexpected message that matches it. The matcher is owned by its endpoint
// and guarded by the endpoint's mu.

// unexp is a message that arrived before a matching receive was posted.
type unexp struct {
	prev, next *unexp
	seq        uint64 // arrival stamp (matcher.unexpSeq)
	src        *peer
	match      uint64
	msgLen     uint32

	// Eager messages: their data, held in memory counted against the
	// endpoint's unexpected-bytes bound; complete once received == msgLen.
	data     []byte
	received uint32

	// Rendezvous messages cost only this record: the data stays at the
	// sender until a receive matches and pulls it.
	rndv      bool
	rndvID    uint32
	localSend *request // same-engine rendezvous: the send to copy from
}

func (u *unexp) complete() bool { return u.rndv || u.received == u.msgLen }

// unexpCost is what an unexpected eager message of n bytes counts against
// the endpoint's unexpected-bytes bound: its data and its record, so that
// empty messages, which hold no data, are bounded too.
func unexpCost(n int) int { return n + int(unsafe.Sizeof(unexp{})) }

type matcher struct {
	// Context ids (Config.ContextIDBits, ContextIDShift): the bits
	// (m >> ctxShift) & ctxMask of a match info name its context, and each
	// context has its own two queues. A receive names its context exactly
	// (it may not wildcard those bits), so it only ever looks at one
	// queue; arrival order still holds within each context, which is
	// all that matching can observe.
	ctxShift uint
	ctxMask  uint64
	queues   []ctxQueue // by context id; one without context bits
	nRecvs   int
	nUnexp   int
	unexpSeq uint64 // stamps unexpected messages, to find the oldest across contexts
}

// ctxQueue is one context's posted receives and unexpected messages.
type ctxQueue struct {
	recvHead, recvTail   *request
	unexpHead, unexpTail *unexp
}

// init sets up the context queues.
func (q *matcher) init(bits, shift uint) {
	q.ctxShift = shift
	q.ctxMask = 1<<bits - 1
	q.queues = make([]ctxQueue, 1<<bits)
}

// ctxBits is the mask of the context bits in a match info.
func (q *matcher) ctxBits() uint64 { return q.ctxMask << q.ctxShift }

// of returns the queues of the context of match info m.
func (q *matcher) of(m uint64) *ctxQueue {
	if len(q.queues) == 1 {
		return &q.queues[0]
	}
	return &q.queues[(m>>q.ctxShift)&q.ctxMask]
}

// matches reports whether a message with match info m fits (info, mask).
func matches(m, info, mask uint64) bool { return m&mask == info }

// arrive returns the oldest posted receive matching m, removed from the
// queue, or nil.
func (q *matcher) arrive(m uint64) *request {
	for r := q.of(m).recvHead; r != nil; r = r.rnext {
		if matches(m, r.info, r.mask) {
			q.removeRecv(r)
			return r
		}
	}
	return nil
}

// post returns the oldest unexpected message matching (info, mask), removed
// from the queue, or nil.
func (q *matcher) post(info, mask uint64) *unexp {
	if u := q.probe(info, mask); u != nil {
		q.removeUnexp(u)
		return u
	}
	return nil
}

// probe returns the oldest unexpected message matching (info, mask) and
// leaves it queued. A probe that wildcards context bits looks at every
// context.
func (q *matcher) probe(info, mask uint64) *unexp {
	if mask&q.ctxBits() == q.ctxBits() {
		for u := q.of(info).unexpHead; u != nil; u = u.next {
			if matches(u.match, info, mask) {
				return u
			}
		}
		return nil
	}
	var oldest *unexp
	for i := range q.queues {
		for u := q.queues[i].unexpHead; u != nil; u = u.next {
			if matches(u.match, info, mask) {
				if oldest == nil || u.seq < oldest.seq {
					oldest = u
				}
				break
			}
		}
	}
	return oldest
}

// firstRecv returns a posted receive, or nil if there is none.
func (q *matcher) firstRecv() *request {
	for i := range q.queues {
		if r := q.queues[i].recvHead; r != nil {
			return r
		}
	}
	return nil
}

// eachUnexp calls f for every unexpected message; f may remove the one it
// is given.
func (q *matcher) eachUnexp(f func(u *unexp)) {
	for i := range q.queues {
		for u := q.queues[i].unexpHead; u != nil; {
			next := u.next
			f(u)
			u = next
		}
	}
}

func (q *matcher) pushRecv(r *request) {
	c := q.of(r.info)
	r.rprev, r.rnext = c.recvTail, nil
	if c.recvTail != nil {
		c.recvTail.rnext = r
	} else {
		c.recvHead = r
	}
	c.recvTail = r
	r.queued = true
	q.nRecvs++
}

func (q *matcher) removeRecv(r *request) {
	if !r.queued {
		return
	}
	c := q.of(r.info)
	if r.rprev != nil {
		r.rprev.rnext = r.rnext
	} else {
		c.recvHead = r.rnext
	}
	if r.rnext != nil {
		r.rnext.rprev = r.rprev
	} else {
		c.recvTail = r.rprev
	}
	r.rprev, r.rnext, r.queued = nil, nil, false
	q.nRecvs--
}

func (q *matcher) pushUnexp(u *unexp) {
	c := q.of(u.match)
	q.unexpSeq++
	u.seq = q.unexpSeq
	u.prev, u.next = c.unexpTail, nil
	if c.unexpTail != nil {
		c.unexpTail.next = u
	} else {
		c.unexpHead = u
	}
	c.unexpTail = u
	q.nUnexp++
	if u.src != nil {
		u.src.unexps++
	}
}

func (q *matcher) removeUnexp(u *unexp) {
	if u.src != nil {
		u.src.unexps--
	}
	c := q.of(u.match)
	if u.prev != nil {
		u.prev.next = u.next
	} else {
		c.unexpHead = u.next
	}
	if u.next != nil {
		u.next.prev = u.prev
	} else {
		c.unexpTail = u.prev
	}
	u.prev, u.next = nil, nil
	q.nUnexp--
}
