package msglayer

// An endpoint's timers: each peer with frames in flight or an ack due, and
// each pull with blocks requested, has one timer in a min-heap ordered by
// due time. Running the timers costs what is due rather than a look at
// every peer and every pull: a server with 128 clients would otherwise
// scan them all whenever one of their delayed acks falls due.
//
// A timer may run early (it is only ever moved earlier when armed, and a
// peer's or pull's state may have moved its real due time later): the
// peer or pull then finds nothing to do and says when it next needs to run.

// timer is a peer's or a pull's place in its endpoint's timer heap.
// Guarded by the engine lock.
type timer struct {
	at   int64 // when it is due
	slot int   // its index in the heap; -1 when not in it
	peer *peer // exactly one of peer and pull is set
	pull *pull
}

func (t *timer) armed() bool { return t.slot >= 0 }

// timerHeap is a binary min-heap of timers by due time.
type timerHeap []*timer

// schedule makes t due at when, or earlier if it already is.
func (h *timerHeap) schedule(t *timer, at int64) {
	if t.armed() {
		if at < t.at {
			t.at = at
			h.up(t.slot)
		}
		return
	}
	t.at, t.slot = at, len(*h)
	*h = append(*h, t)
	h.up(t.slot)
}

// remove takes t out of the heap, if it is in it.
func (h *timerHeap) remove(t *timer) {
	if !t.armed() {
		return
	}
	i, last := t.slot, len(*h)-1
	if i != last {
		h.swap(i, last)
	}
	(*h)[last] = nil
	*h = (*h)[:last]
	t.slot = -1
	if i != last {
		h.down(i)
		h.up(i)
	}
}

// popDue removes and returns the earliest timer if it is due at now.
func (h *timerHeap) popDue(now int64) *timer {
	if len(*h) == 0 || (*h)[0].at > now {
		return nil
	}
	t := (*h)[0]
	h.remove(t)
	return t
}

// next returns when the earliest timer is due, 0 if none is armed.
func (h timerHeap) next() int64 {
	if len(h) == 0 {
		return 0
	}
	return h[0].at
}

func (h timerHeap) swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].slot, h[j].slot = i, j
}

func (h timerHeap) up(i int) {
	for i > 0 {
		p := (i - 1) / 2
		if h[p].at <= h[i].at {
			return
		}
		h.swap(i, p)
		i = p
	}
}

func (h timerHeap) down(i int) {
	for {
		l := 2*i + 1
		if l >= len(h) {
			return
		}
		c := l
		if r := l + 1; r < len(h) && h[r].at < h[l].at {
			c = r
		}
		if h[i].at <= h[c].at {
			return
		}
		h.swap(i, c)
		i = c
	}
}
