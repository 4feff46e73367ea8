package msglayer

// Same-process messages at the receiver's MaxUnexpectedRndv bound.
//
// Over the network a rendezvous record that finds the receiver's records
// at the bound is dropped and sent again, and the frames its sender sent
// after it wait behind it. A same-process message in that place is held:
// it stays pending, in its sender's chain at the receiver (heldChain),
// and every message that sender sends the receiver after it joins the
// chain, so that each sender's messages are still matched in the order it
// sent them. When the receiver may have room again (a receive posted, a
// record taken or dropped: heldRoom), the driver's next round of runLocal
// takes the first messages of each chain, as many as there is room for
// and one more (a posted receive may match it), and hands them over
// ahead of the messages queued since (retryHeld). Those that still find
// no room, and the ones after them, go back to the front of their chain
// when the round ends (settleHeld); a receiver one of whose chains went
// on whole is tried again in the next round. So an event costs a look at
// the first message of each sender's chain (at most one chain an
// endpoint of the process), not one a held message, and nothing polls
// while the receiver has no room.

// heldChain is one sender's messages held at a receiver: msgs[head:] in
// the order they were sent; reheld, those of the round under way held
// again; batched, the round took some; listed, in the receiver's
// heldPeers.
type heldChain struct {
	msgs    []localMsg
	head    int
	reheld  []localMsg
	batched bool
	listed  bool
}

func (c *heldChain) len() int { return len(c.msgs) - c.head + len(c.reheld) }

// holdsBefore reports whether m, from this same-process peer, must wait
// behind its messages held here: a new message while any is held, or one
// a retry took after another of the same round was held again.
func (p *peer) holdsBefore(m localMsg) bool {
	c := p.held
	switch {
	case c == nil:
		return false
	case m.retried:
		return len(c.reheld) > 0
	}
	return c.len() > 0
}

// holdLocal holds m, from peer tp, at t: at the end of tp's chain, or,
// taken from it by the round under way, back to its front (in order).
//
// +checklocks:t.eng.mu
func (t *Endpoint) holdLocal(tp *peer, m localMsg) {
	c := tp.held
	if c == nil {
		c = &heldChain{}
		tp.held = c
	}
	if m.retried {
		m.retried = false
		c.reheld = append(c.reheld, m)
	} else {
		c.msgs = append(c.msgs, m)
	}
	t.heldLocal++
	if !c.listed {
		c.listed = true
		t.heldPeers = append(t.heldPeers, tp)
	}
}

// heldRoom notes that the endpoint may take a held message again (a
// receive posted, a record taken or dropped, unexpected memory freed):
// the driver hands the messages held for it over again (runLocal).
//
// +checklocks:e.eng.mu
func (e *Endpoint) heldRoom() {
	if e.heldLocal == 0 || e.heldRetry {
		return
	}
	g := e.eng
	e.heldRetry = true
	g.localRetry = append(g.localRetry, e)
	g.localQueued.Store(true)
	g.signal()
}

// retryHeld takes the first messages of the chains of the endpoints that
// may have room to the front of localIn, in order. runLocal calls it
// before its round.
//
// +checklocks:g.mu
func (g *engine) retryHeld() {
	var moved []localMsg
	for _, t := range g.localRetry {
		t.heldRetry = false
		k := max(t.cfg.MaxUnexpectedRndv-t.unexpRndv, 0) + 1
		for _, tp := range t.heldPeers {
			c := tp.held
			n := min(k, len(c.msgs)-c.head)
			if n == 0 {
				continue
			}
			for _, m := range c.msgs[c.head : c.head+n] {
				m.retried = true
				moved = append(moved, m)
			}
			clear(c.msgs[c.head : c.head+n])
			c.head += n
			c.batched = true
			t.heldLocal -= n
		}
		g.retrying = append(g.retrying, t)
	}
	clear(g.localRetry)
	g.localRetry = g.localRetry[:0]
	g.heldRetried += len(moved)
	g.localIn = append(moved, g.localIn[g.localHead:]...)
	g.localHead = 0
}

// settleHeld ends a round that retried held messages: those held again
// go back to the front of their chains; an endpoint one of whose chains
// went on whole, and holds more, is tried again next round.
//
// +checklocks:g.mu
func (g *engine) settleHeld() {
	for _, t := range g.retrying {
		again := false
		kept := t.heldPeers[:0]
		for _, tp := range t.heldPeers {
			c := tp.held
			if c.batched {
				c.batched = false
				if n := len(c.reheld); n > 0 {
					// The round took at least n from the front.
					c.head -= n
					copy(c.msgs[c.head:], c.reheld)
					clear(c.reheld)
					c.reheld = c.reheld[:0]
				} else if c.len() > 0 {
					again = true
				}
			}
			if c.len() == 0 {
				clear(c.msgs)
				c.msgs, c.head, c.listed = c.msgs[:0], 0, false
				continue
			}
			kept = append(kept, tp)
		}
		clear(t.heldPeers[len(kept):])
		t.heldPeers = kept
		if again {
			t.heldRoom()
		}
	}
	clear(g.retrying)
	g.retrying = g.retrying[:0]
}

// dropHeld completes with code the messages of tp's chain at e: the
// exchange ended (Close, Disconnect, a reset).
//
// +checklocks:e.eng.mu
func (e *Endpoint) dropHeld(tp *peer, code Code) {
	c := tp.held
	if c == nil || c.len() == 0 {
		return
	}
	n := c.len()
	for _, m := range c.reheld {
		m.r.ep.complete(m.r, code)
	}
	for _, m := range c.msgs[c.head:] {
		m.r.ep.complete(m.r, code)
	}
	clear(c.reheld)
	clear(c.msgs)
	c.msgs, c.head, c.reheld = c.msgs[:0], 0, c.reheld[:0]
	e.heldLocal -= n
}

// dropHeldIf completes the held messages drop picks; all of a chain's
// messages share their sender and receiver, which drop looks at.
//
// +checklocks:g.mu
func (g *engine) dropHeldIf(drop func(localMsg) (Code, bool)) {
	for _, t := range g.eps {
		if t == nil || t.heldLocal == 0 {
			continue
		}
		kept := t.heldPeers[:0]
		for _, tp := range t.heldPeers {
			c := tp.held
			var m localMsg
			switch {
			case len(c.reheld) > 0:
				m = c.reheld[0]
			case c.len() > 0:
				m = c.msgs[c.head]
			}
			if m.r != nil {
				if code, ok := drop(m); ok {
					t.dropHeld(tp, code)
				}
			}
			if c.len() == 0 && !c.batched {
				// (a chain of the round under way is settleHeld's to unlist)
				c.listed = false
				continue
			}
			kept = append(kept, tp)
		}
		clear(t.heldPeers[len(kept):])
		t.heldPeers = kept
	}
}
