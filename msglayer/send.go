package msglayer

// eagerPayload is the data one eager frame to p carries.
func (p *peer) eagerPayload() int { return p.mtuOr(p.ep.eng.mtu) - commonLen - eagerHdrLen }

// pullPayload is the data one pull reply from p carries.
func (p *peer) pullPayload() int { return p.mtuOr(p.ep.eng.mtu) - commonLen - pullReplyHdrLen }

func (p *peer) mtuOr(def int) int {
	if p.mtu == 0 {
		return def
	}
	return p.mtu
}

// maxPullPayload is the most data one pull reply we send may carry.
func (e *Endpoint) maxPullPayload() int { return e.eng.mtu - commonLen - pullReplyHdrLen }

// frameMessage frames as much of a queued message (send or notify) as the
// window allows and reports whether it is fully framed.
//
// +checklocks:e.eng.mu
func (e *Endpoint) frameMessage(p *peer, r *request, now int64) bool {
	switch {
	case r.kind == kindNotify:
		s := p.nextSlot()
		if s == nil {
			return false
		}
		n := notifyHdr{rndvID: r.rndvID, xferLen: uint32(r.status.XferLen), code: r.status.Code}
		n.put(s.buf[hdrLen:])
		r.unacked++
		p.sendReliable(s, tNotify, 0, 0, r, true, true, now)
		return true
	case r.put:
		s := p.nextSlot()
		if s == nil {
			return false
		}
		ph := putHdr{region: r.regionID, putID: r.rndvID, key: r.regionKey, offset: r.regionOff, length: uint32(r.length)}
		ph.put(s.buf[hdrLen:])
		r.unacked++
		r.framed = r.length
		p.sendReliable(s, tPut, 0, 0, r, true, true, now)
		return true
	case r.rndv:
		s := p.nextSlot()
		if s == nil {
			return false
		}
		rh := rndvHdr{match: r.match, msgLen: uint32(r.length), rndvID: r.rndvID}
		rh.put(s.buf[hdrLen:])
		var flags uint8
		if r.sync {
			flags = flagSync
		}
		r.unacked++
		r.framed = r.length
		p.sendReliable(s, tRndv, flags, 0, r, true, true, now)
		return true
	}
	maxPay := p.eagerPayload()
	for {
		s := p.nextSlot()
		if s == nil {
			return false
		}
		first := r.framed == 0
		chunk := min(maxPay, r.length-r.framed)
		th := s.buf[hdrLen:]
		eh := eagerHdr{match: r.match, msgLen: uint32(r.length), offset: uint32(r.framed)}
		eh.put(th)
		copyFromSegs(th[eagerHdrLen:eagerHdrLen+chunk], r.segs, r.framed)
		r.framed += chunk
		last := r.framed == r.length
		r.unacked++
		p.sendReliable(s, tEager, 0, chunk, r, first, last, now)
		if last {
			r.buffered = true
			return true
		}
	}
}

// pumpAll frames queued messages of every peer.
//
// +checklocks:e.eng.mu
func (e *Endpoint) pumpAll(now int64) {
	for _, p := range e.peers {
		if p.sendHead != nil {
			p.pump(now)
		}
	}
}

// localMsg is a same-process message waiting for the driver
// (engine.localIn), or for room at its receiver (peer.held).
type localMsg struct {
	r       *request
	to      *Endpoint
	seen    bool // the receiver's unexpected-message handler saw it
	retried bool // taken from its sender's held chain (retryHeld)
}

// sendLocal delivers a message to an endpoint of the same engine without
// the NIC: straight into a matching receive, else into the unexpected
// queue (a copy within the bound, else a record that the receive will copy
// from when it is posted).
//
// When the receiver has an unexpected-message handler and no receive
// matches, the message waits for the driver (engine.localIn), which calls
// the handler as it would for a frame: on its goroutine, one call at a
// time. So does every same-process message sent while some wait or the
// driver hands them over, which keeps each sender's messages in order.
//
// +checklocks:e.eng.mu
func (e *Endpoint) sendLocal(p *peer, r *request) {
	g := e.eng
	if g.localHead == len(g.localIn) && !g.localRunning && e.arriveLocal(localMsg{r: r, to: p.local}, false) {
		return
	}
	g.localIn = append(g.localIn, localMsg{r: r, to: p.local})
	g.localQueued.Store(true)
	g.signal()
}

// runLocal hands the same-process messages queued so far to their
// receivers, in order (arriveLocal), after the held ones whose receiver
// has room again. The driver calls it. The handlers it calls release the
// lock: messages sent meanwhile queue behind (they wait for the next
// round), and Close or Disconnect complete the queued ones they concern,
// and the one being handed over (localCur), at once.
//
// +checklocks:g.mu
func (g *engine) runLocal() {
	if g.localRunning {
		return
	}
	g.localRunning = true
	if len(g.localRetry) > 0 {
		g.retryHeld()
	}
	for n := len(g.localIn) - g.localHead; n > 0 && g.localHead < len(g.localIn); n-- {
		m := g.localIn[g.localHead]
		g.localIn[g.localHead] = localMsg{}
		g.localHead++
		g.localCur = m
		m.r.ep.arriveLocal(m, true)
		g.localCur = localMsg{}
	}
	// The messages left (sent meanwhile) move to the front: the slice
	// does not grow under a steady flow.
	n := copy(g.localIn, g.localIn[g.localHead:])
	clear(g.localIn[n:])
	g.localIn, g.localHead = g.localIn[:n], 0
	if len(g.retrying) > 0 {
		g.settleHeld()
	}
	g.localRunning = false
	g.localQueued.Store(g.localHead < len(g.localIn) || len(g.localRetry) > 0)
}

// dropLocal completes the same-process messages waiting for the driver,
// or being handed over by it, that closing endpoint c sent (Closed) or
// was sent (BadEndpoint: as over the network, where c's engine nacks
// what comes for it).
//
// +checklocks:g.mu
func (g *engine) dropLocal(c *Endpoint) {
	g.dropLocalIf(func(m localMsg) (Code, bool) {
		switch {
		case m.r.ep == c:
			return Closed, true
		case m.to == c:
			return BadEndpoint, true
		}
		return 0, false
	})
}

// dropLocalTo completes with code the same-process messages from e to t
// waiting for the driver, or being handed over: e forgot t (Disconnect, a
// reset), as a network peer's messages in flight would.
//
// +checklocks:g.mu
func (g *engine) dropLocalTo(e, t *Endpoint, code Code) {
	g.dropLocalIf(func(m localMsg) (Code, bool) { return code, m.r.ep == e && m.to == t })
}

// dropLocalIf completes and takes out the messages drop picks.
//
// +checklocks:g.mu
func (g *engine) dropLocalIf(drop func(localMsg) (Code, bool)) {
	if m := g.localCur; m.r != nil {
		if code, ok := drop(m); ok {
			g.localCur = localMsg{} // arriveLocal sees it is done
			m.r.ep.complete(m.r, code)
		}
	}
	kept := g.localIn[:g.localHead]
	for _, m := range g.localIn[g.localHead:] {
		if code, ok := drop(m); ok {
			m.r.ep.complete(m.r, code)
		} else {
			kept = append(kept, m)
		}
	}
	clear(g.localIn[len(kept):])
	g.localIn = kept
	if g.localHead == len(g.localIn) {
		g.localIn, g.localHead = g.localIn[:0], 0
	}
	g.dropHeldIf(drop)
	g.localQueued.Store(g.localHead < len(g.localIn) || len(g.localRetry) > 0)
}

// localGone reports whether same-process endpoint t can take nothing
// from e, and with which code, as over the network: t closed
// (BadEndpoint: its engine nacks frames for an endpoint it does not
// have), or t forgot e (BadSession: a disconnect, as a peer that no
// longer knows our session says).
//
// +checklocks:e.eng.mu
func localGone(t, e *Endpoint) (Code, bool) {
	switch {
	case t.closed:
		return BadEndpoint, true
	case t.peers[e.addr] == nil:
		return BadSession, true
	}
	return 0, false
}

// arriveLocal delivers m.r, sent by e, to m.to (t): into the receive it
// matches, else to t's unexpected queue after t's handler saw it (only
// when driver is set: the handler runs on the driver), else, at t's
// MaxUnexpectedRndv bound or behind e's messages held there, into e's
// held chain at t (held.go). When driver is not set it reports false,
// having done nothing, if t's handler must see the message.
//
// +checklocks:e.eng.mu
func (e *Endpoint) arriveLocal(m localMsg, driver bool) bool {
	t, r := m.to, m.r
	tp := t.peers[e.addr]
	switch {
	case e.closed: // only from the driver: queued, then its sender closed
		e.complete(r, Closed)
		return true
	case t.closed || tp == nil:
		// Closed would say that this endpoint closed.
		code, _ := localGone(t, e)
		e.complete(r, code)
		return true
	case tp.holdsBefore(m):
		// Behind our messages held at t's bound: each sender's messages
		// are matched in the order it sent them.
		t.holdLocal(tp, m)
		return true
	}
	if rr := t.match.arrive(r.match); rr != nil {
		t.deliverLocal(r, rr, e.addr)
		return true
	}
	if t.cfg.UnexpectedHandler != nil && !m.seen {
		if !driver {
			return false
		}
		if !localEager(r) && t.unexpRndv >= t.cfg.MaxUnexpectedRndv {
			// As over the network, where the handler sees a rendezvous
			// message once its record finds room.
			t.stats.RndvDeferred++
			t.holdLocal(tp, m)
			return true
		}
		// The handler sees what it would over the network: the data of a
		// message that would go in one eager frame (eager: not above the
		// sender's rendezvous threshold), in a buffer of ours (as a frame
		// would be): Close or Disconnect may complete the send while the
		// handler runs, and the sender reuse its memory.
		var data []byte
		if localEager(r) && r.length <= tp.eagerPayload() {
			g := e.eng
			if g.localData == nil || cap(g.localData) < r.length {
				// (nil: an empty message's Data is empty, not nil)
				g.localData = make([]byte, tp.eagerPayload())
			}
			data = g.localData[:r.length]
			copyFromSegs(data, r.segs, 0)
		}
		act, ok := t.callHandler(tp, r.match, r.length, data)
		switch {
		case e.eng.localCur.r != r: // completed meanwhile (dropLocalIf)
			return true
		case e.closed:
			e.complete(r, Closed)
			return true
		case !ok && t.closed:
			e.complete(r, BadEndpoint)
			return true
		case !ok: // the exchange was forgotten meanwhile
			e.complete(r, Aborted)
			return true
		}
		if act == Finished {
			// As over the network: an eager message was taken whole; a
			// rendezvous one, whose data stays here, had none delivered.
			r.status.XferLen = r.length
			if !localEager(r) {
				r.status.XferLen = 0
			}
			e.complete(r, Success)
			return true
		}
		if rr := t.match.arrive(r.match); rr != nil {
			t.deliverLocal(r, rr, e.addr)
			return true
		}
		m.seen = true
	}
	if t.unexpRndv >= t.cfg.MaxUnexpectedRndv && !t.takesCopy(r) {
		t.stats.RndvDeferred++
		t.holdLocal(tp, m)
		return true
	}
	t.queueLocal(tp, r)
	return true
}

// localEager reports whether same-process send r goes as an eager
// message would over the network: not synchronous, and not above its
// sender's rendezvous threshold.
func localEager(r *request) bool {
	return !r.sync && r.length <= r.ep.cfg.RendezvousThreshold
}

// takesCopy reports whether same-process send r, unexpected at t, goes to
// t's unexpected queue as a copy (an eager message within the memory
// bound) rather than as a record.
//
// +checklocks:t.eng.mu
func (t *Endpoint) takesCopy(r *request) bool {
	return localEager(r) && t.unexpBytes+unexpCost(r.length) <= t.cfg.UnexpectedBytes
}

// queueLocal puts r, from peer tp, in t's unexpected queue: a copy within
// the bound, else a record the receive will copy from.
//
// +checklocks:t.eng.mu
func (t *Endpoint) queueLocal(tp *peer, r *request) {
	u := &unexp{src: tp, match: r.match, msgLen: uint32(r.length)}
	if t.takesCopy(r) {
		u.data = make([]byte, r.length)
		copyFromSegs(u.data, r.segs, 0)
		u.received = u.msgLen
		t.unexpBytes += unexpCost(r.length)
		t.stats.UnexpectedBytes += uint64(r.length)
		r.buffered = true
		r.status.XferLen = r.length
		r.ep.complete(r, Success)
	} else {
		if localEager(r) {
			// Refused for want of memory and sent as a record, as over
			// the network, and counted so on both sides.
			t.stats.EagerRefused++
			r.ep.stats.EagerConverted++
		}
		u.rndv, u.localSend = true, r
		r.rndv = true
		t.unexpRndv++
	}
	t.addUnexp(u)
	// An arrival made outside the driver, like a completion: a Probe or
	// Peek may be the driver, asleep in the kernel.
	t.eng.signal()
}

// deliverLocal copies a same-engine send into the receive it matched and
// completes both.
//
// +checklocks:e.eng.mu
func (e *Endpoint) deliverLocal(s, r *request, from Addr) {
	n := min(s.length, r.length)
	done := 0
	for done < n {
		// Copy segment by segment of the destination.
		off := done
		for _, seg := range r.segs {
			if off >= len(seg) {
				off -= len(seg)
				continue
			}
			c := copyFromSegs(seg[off:min(len(seg), off+n-done)], s.segs, done)
			done += c
			break
		}
	}
	r.status.Source, r.status.Match, r.status.MsgLen, r.status.XferLen = from, s.match, s.length, n
	e.complete(r, Success)
	s.status.XferLen = n
	s.buffered = true
	s.ep.complete(s, Success)
}
