package msglayer

// The matcher holds the posted receives and the unexpected messages of an
// endpoint, each in arrival order, as intrusive doubly linked lists (no
// allocation to post, match or cancel). A message matches a receive when
// message.match & recv.mask == recv.info; an arriving message takes the
// oldest posted receive it matches, a posted receive takes the oldest
// unexpected message that matches it. The matcher is owned by its endpoint
// and guarded by the endpoint's mu.

// unexp is a message that arrived before a matching receive was posted.
type unexp struct {
	prev, next *unexp
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
	sync      bool
	localSend *request // same-engine rendezvous: the send to copy from
}

func (u *unexp) complete() bool { return u.rndv || u.received == u.msgLen }

type matcher struct {
	recvHead, recvTail   *request
	nRecvs               int
	unexpHead, unexpTail *unexp
	nUnexp               int
}

// matches reports whether a message with match info m fits (info, mask).
func matches(m, info, mask uint64) bool { return m&mask == info }

// arrive returns the oldest posted receive matching m, removed from the
// queue, or nil.
func (q *matcher) arrive(m uint64) *request {
	for r := q.recvHead; r != nil; r = r.rnext {
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
// leaves it queued.
func (q *matcher) probe(info, mask uint64) *unexp {
	for u := q.unexpHead; u != nil; u = u.next {
		if matches(u.match, info, mask) {
			return u
		}
	}
	return nil
}

func (q *matcher) pushRecv(r *request) {
	r.rprev, r.rnext = q.recvTail, nil
	if q.recvTail != nil {
		q.recvTail.rnext = r
	} else {
		q.recvHead = r
	}
	q.recvTail = r
	r.queued = true
	q.nRecvs++
}

func (q *matcher) removeRecv(r *request) {
	if !r.queued {
		return
	}
	if r.rprev != nil {
		r.rprev.rnext = r.rnext
	} else {
		q.recvHead = r.rnext
	}
	if r.rnext != nil {
		r.rnext.rprev = r.rprev
	} else {
		q.recvTail = r.rprev
	}
	r.rprev, r.rnext, r.queued = nil, nil, false
	q.nRecvs--
}

func (q *matcher) pushUnexp(u *unexp) {
	u.prev, u.next = q.unexpTail, nil
	if q.unexpTail != nil {
		q.unexpTail.next = u
	} else {
		q.unexpHead = u
	}
	q.unexpTail = u
	q.nUnexp++
}

func (q *matcher) removeUnexp(u *unexp) {
	if u.prev != nil {
		u.prev.next = u.next
	} else {
		q.unexpHead = u.next
	}
	if u.next != nil {
		u.next.prev = u.prev
	} else {
		q.unexpTail = u.prev
	}
	u.prev, u.next = nil, nil
	q.nUnexp--
}
