package msglayer

// handle counts one frame in for the endpoint and processes it. The
// caller (the driver) holds the engine lock and the drive token.
//
// +checklocks:e.eng.mu
func (e *Endpoint) handle(f []byte, h *header, now int64) {
	if e.closed {
		return
	}
	e.stats.FramesIn++
	e.stats.BytesIn += uint64(len(f))
	e.handleOne(f, h, now)
}

// handleOne processes one frame, or one ack entry riding in a frame
// counted elsewhere (engine.ackEntries), for the endpoint.
//
// +checklocks:e.eng.mu
func (e *Endpoint) handleOne(f []byte, h *header, now int64) {
	th, payload := typeHdr(f, h)
	switch h.typ {
	case tConnect:
		e.onConnect(srcAddr(f, h), h, th, now)
		return
	case tConnectReply:
		e.onConnectReply(srcAddr(f, h), h, th, now)
		return
	case tNack:
		if e.onSessionNack(srcAddr(f, h), h, th) {
			return
		}
	}
	p := e.peerFrom(f, h)
	if p == nil || !p.connected || p.local != nil || h.srcSession != p.remoteID || h.dstSession != p.localID {
		e.stats.StaleFrames++
		if (h.typ.reliable() || h.typ == tPullReq || h.typ == tKeepalive) && !e.awaitsReply(p, h) {
			e.nackSession(srcAddr(f, h), h, p)
		}
		return
	}
	e.heard(p, h.typ, h.window, h.ack, now)
	if h.typ.reliable() {
		e.onReliable(p, f, h, now)
		return
	}
	switch h.typ {
	case tAck:
		e.stats.AcksIn++
		p.onSack(h.ack, payload, now)
	case tNack:
		e.onNack(p, th, now)
	case tPullReq:
		e.onPullReq(p, h, th)
	case tPullReply:
		e.onPullReply(p, h.seq, th, payload, now)
	case tKeepalive:
		p.sendAck()
	case tDisconnect:
		p.reset(Aborted)
	}
}

// heard takes what every frame of the pair from p says, a frame of type
// t: the peer lives, its receive window, its ack.
//
// +checklocks:e.eng.mu
func (e *Endpoint) heard(p *peer, t frameType, window uint8, ack uint32, now int64) {
	p.lastHeard = now
	p.rwnd = window
	if t.reliable() {
		e.eng.noteSender(p, now)
	}
	switch {
	case t.reliable() || t == tPullReply || t == tPullReq:
		// Handling these does not look at the send window: its ack
		// waits for the end of the batch, or for after the Wait that the
		// batch completes (engine.settleAcks).
		if p.noteAck(ack, now) {
			e.eng.ackq = append(e.eng.ackq, p)
		}
	default:
		p.onAck(ack, now)
	}
}

// awaitsReply reports whether a frame of the peer p that names our id but
// not the pair as we know it comes from a peer that took a connect of
// ours whose reply has not arrived yet: it is dropped without a nack, and
// comes again once we know.
//
// +checklocks:e.eng.mu
func (e *Endpoint) awaitsReply(p *peer, h *header) bool {
	if p == nil || p.local != nil || h.dstSession != p.localID {
		return false
	}
	for _, r := range e.connects {
		if r.connAddr == p.addr {
			return true
		}
	}
	return false
}

// sayClosed tells peer p, as we close, what our engine would tell it at
// its next frame for us: no such endpoint (a nack naming the pair, as
// onSessionNack wants it), so that what it has under way with us fails
// at once rather than at its give-up, also when this is the engine's
// last endpoint and nobody would be left to answer. A lost one leaves
// it to the give-up.
//
// +checklocks:e.eng.mu
func (e *Endpoint) sayClosed(p *peer) {
	g := e.eng
	b := g.scratchBuf()
	out := header{typ: tNack, dstEP: p.addr.EP, srcEP: e.id, dstSession: p.remoteID, srcSession: p.localID}
	th := putHeader(b, &p.addr.MAC, &g.mac, g.ethType, &out)
	putNack(th, 0, nackBadEndpoint, p.localID)
	e.sendFrame(padded(b, tNack, 0))
}

// nackSession tells a sender that we do not know the connection its frame
// names: we restarted or forgot it, or it never connected. p is our record
// of the sender, if any.
//
// +checklocks:e.eng.mu
func (e *Endpoint) nackSession(src Addr, h *header, p *peer) {
	g := e.eng
	b := g.scratchBuf()
	id := e.session
	if p != nil {
		id = p.localID
		p.shown = true
	}
	out := header{typ: tNack, dstEP: src.EP, srcEP: e.id, dstSession: h.srcSession, srcSession: id}
	th := putHeader(b, &src.MAC, &g.mac, g.ethType, &out)
	putNack(th, h.seq, nackBadSession, h.dstSession)
	e.sendFrame(padded(b, tNack, 0))
}

// onSessionNack handles a nack saying the peer does not know our
// connection or has no such endpoint: it forgot us (restarted, gave up,
// disconnected) and we must reconnect. It reports whether the frame was
// such a nack.
//
// +checklocks:e.eng.mu
func (e *Endpoint) onSessionNack(src Addr, h *header, th []byte) bool {
	_, reason, refused := getNack(th)
	if reason != nackBadSession && reason != nackBadEndpoint {
		return false
	}
	p := e.peers[src]
	// The nack must name the pair as we know it: the refused frame came
	// from our id and was for the peer's. One about a frame of an older
	// connection, still on its way when a new one began, is not ours.
	if p == nil || !p.connected || h.dstSession != p.localID || refused != p.remoteID {
		return true
	}
	code := BadSession
	if reason == nackBadEndpoint {
		code = BadEndpoint
	}
	var held [2]heldConnect
	if p.ch != nil {
		held = p.ch.held
	}
	p.reset(code)
	if code != BadSession {
		return true
	}
	for _, c := range held {
		if c.from != 0 && c.from == h.srcSession {
			// It answers a challenge, from a self whose connect we
			// held: that self holds the peer's address now.
			e.takeConnect(src, p, c.from, c.gen, c.connID, c.mtu, e.eng.readClock())
			break
		}
	}
	return true
}

// onConnect answers a connect request. A connect from the peer's id we
// are paired with is answered again, changing nothing; a new connect
// pairs us with its id (pair), unless we are paired with a newer id of
// the peer's self, or with another self, which we first ask whether it
// lives (challenge); a copy of a connect we took before pairs nothing.
//
// +checklocks:e.eng.mu
func (e *Endpoint) onConnect(src Addr, h *header, th []byte, now int64) {
	key, connID, mtu := getConnect(th)
	if key != e.cfg.Key {
		e.sendConnReply(src, h.srcSession, e.session, 0, connID, BadKey)
		return
	}
	p := e.peers[src]
	if p == nil {
		if !e.roomForPeer(now) {
			e.stats.PeersRefused++
			e.sendConnReply(src, h.srcSession, e.session, 0, connID, Aborted)
			return
		}
		p = e.peerFor(src)
	}
	x, xgen := h.srcSession, h.seq
	copied := p.isCopy(x, connID)
	switch {
	case p.connected && p.is(x, xgen):
		// A copy, or another connect of the id we are paired with.
	case p.older(x, xgen):
		e.stats.StaleFrames++ // its sender is gone: nobody waits for the answer
		return
	case copied:
		// A copy of a connect we took before: we forgot the peer since,
		// or the peer moved on. It is over, and must not pair us again.
		p.shown = true
		e.sendConnReply(src, x, p.localID, p.localGen, connID, Aborted)
		return
	case p.connected && !p.sameSelf(x, xgen):
		p.challenge(x, xgen, connID, mtu, now)
		return
	}
	e.takeConnect(src, p, x, xgen, connID, mtu, now)
}

// takeConnect pairs p with id x of generation gen, whose connect connID
// (MTU mtu) we take, and answers it. A copy of a connect taken before,
// from the id we are paired with, is answered again.
//
// +checklocks:e.eng.mu
func (e *Endpoint) takeConnect(src Addr, p *peer, x, gen, connID uint32, mtu int, now int64) {
	if !p.isCopy(x, connID) {
		p.took(x, connID)
	}
	if !(p.connected && p.is(x, gen)) {
		p.pair(x, gen)
	}
	p.mtu = negotiateMTU(e.eng.mtu, mtu)
	p.lastHeard = now
	// A peer that connects is about to send: its share is counted, and
	// said in the reply, before its first frames come.
	e.eng.noteSender(p, now)
	p.saidWin = e.eng.recvWindow
	p.shown = true
	e.sendConnReply(src, x, p.localID, p.localGen, connID, Success)
}

// sendConnReply answers connect connID of id dst at src with code, from
// our id (of generation gen).
//
// +checklocks:e.eng.mu
func (e *Endpoint) sendConnReply(src Addr, dst, id, gen, connID uint32, code Code) {
	g := e.eng
	b := g.scratchBuf()
	out := header{typ: tConnectReply, dstEP: src.EP, srcEP: e.id, dstSession: dst, srcSession: id, seq: gen, window: g.recvWindow}
	rt := putHeader(b, &src.MAC, &g.mac, g.ethType, &out)
	putConnReply(rt, connID, code, g.mtu)
	e.sendFrame(padded(b, tConnectReply, 0))
}

// onConnectReply completes the connect the reply answers. A success pairs
// us with the id the reply comes from; while we are paired with another
// id of the peer, a reply from an older one of its self is left for the
// answer to the connect's next copy, and one from another self makes us
// ask the self we know whether it lives (challenge).
//
// +checklocks:e.eng.mu
func (e *Endpoint) onConnectReply(src Addr, h *header, th []byte, now int64) {
	connID, code, mtu := getConnReply(th)
	for i, r := range e.connects {
		if r.connID != connID || r.connAddr != src {
			continue
		}
		p := e.peerFor(src)
		if h.dstSession != p.localID {
			return // it answers a copy sent from an older id of ours
		}
		if code == Success {
			x, gen := h.srcSession, h.seq
			switch {
			case !p.connected || p.is(x, gen) || (p.sameSelf(x, gen) && !p.older(x, gen)):
				p.pair(x, gen)
				p.setDialed(true)
			case p.older(x, gen):
				return
			default:
				// Another self of the peer took the connect while we are
				// paired with one: the peer restarted, or the reply is a
				// late one from a self that is gone. We ask the self we
				// know (challenge). If another self holds the address
				// now, its nack resets us, and the connect, sent again
				// from our new id, pairs us with it: pairing now would
				// take us a new id (pair), which it does not know.
				p.challenge(0, 0, 0, 0, now)
				return
			}
			p.mtu = negotiateMTU(e.eng.mtu, mtu)
			p.lastHeard = now
			p.rwnd = h.window
		}
		e.connects = append(e.connects[:i], e.connects[i+1:]...)
		e.complete(r, code)
		return
	}
}

// onReliable delivers reliable frames in sequence order, holding frames
// that arrive early and dropping duplicates.
//
// +checklocks:e.eng.mu
func (e *Endpoint) onReliable(p *peer, f []byte, h *header, now int64) {
	w := uint32(e.cfg.Window)
	d := h.seq - p.expected
	switch {
	case int32(d) < 0:
		e.stats.Duplicates++
		p.sendAck() // our ack may have been lost
		return
	case d >= w:
		e.stats.BeyondWindow++
		return
	case d > 0:
		if p.ooo == nil {
			// Most peers never see a frame out of order: the slots come
			// with the first one.
			p.ooo = make([]rxSlot, w)
		}
		s := &p.ooo[h.seq%w]
		switch {
		case s.full:
			e.stats.Duplicates++
		case len(f) > e.eng.maxFrame():
			// Longer than the link carries: only a forged frame is. Held
			// cut short, it would fail to decode once its turn came, and
			// its sequence number be taken without a message.
			e.stats.BadFrames++
			return
		case e.oooHeld > 0 && (e.oooHeld+1)*e.eng.maxFrame() > e.cfg.OutOfOrderBytes:
			// Not acked, not held: its sender resends it.
			e.stats.OutOfOrderDropped++
		default:
			if s.buf == nil {
				s.buf = e.eng.scratchBuf()
			}
			s.n = copy(s.buf, f)
			s.full = true
			p.oooCount++
			e.oooHeld++
			e.stats.OutOfOrder++
		}
		p.sendAck() // the selective ack shows the hole
		return
	}
	switch e.process(p, f, h, now) {
	case refused:
		e.nack(p, h.seq, nackEagerRefused)
		return
	case gone, dropped:
		return
	}
	p.expected++
	records := h.typ == tRndv // every frame this ack covers is a rendezvous record
	filled := false           // a hole closed: the sender learns it at once
	for p.oooCount > 0 {
		s := &p.ooo[p.expected%w]
		if !s.full {
			break
		}
		// Handled or not, the frame leaves its slot, and before it is
		// handled: a reset while the unexpected handler runs (unlocked)
		// finds the slot empty and leaves the buffer, which the
		// handler's Data points into, alone. One dropped (no room yet)
		// comes again from the sender, which it was not acked to, and a
		// copy left in the slot would be taken for frame
		// expected+Window once the sequence numbers come round to it.
		buf := s.buf[:s.n]
		s.buf, s.full = nil, false
		p.oooCount--
		e.oooHeld--
		fh, err := decodeHeader(buf)
		res := accepted
		if err == nil {
			res = e.process(p, buf, &fh, now)
		}
		e.eng.freeBuf(buf[:cap(buf)])
		if res == gone {
			return
		}
		if res == dropped {
			break
		}
		if res == refused {
			// The rendezvous version of this message will come with the
			// same sequence number.
			e.nack(p, fh.seq, nackEagerRefused)
			break
		}
		p.expected++
		filled = true
		records = records && fh.typ == tRndv
	}
	if p.in.active && !p.tm.armed() {
		// The rest of the message is to come: the timers watch the peer
		// meanwhile (keepalives, give-up), whatever the acks do.
		e.arm(&p.tm, now+int64(e.cfg.KeepaliveInterval))
	}
	e.consumed(p, records, filled, now)
}

// consumed schedules the ack of the in-order reliable frames of p just
// consumed: records tells whether all of them are rendezvous records,
// filled whether they closed a hole.
//
// +checklocks:e.eng.mu
func (e *Endpoint) consumed(p *peer, records, filled bool, now int64) {
	p.ackPending++
	// An ack of rendezvous records alone completes no send (the notify
	// does): it waits longer, for a pull request to carry it or for the
	// acks owed to other endpoints of the host to go with it. A server
	// that cannot serve a record yet (no receive posted, pull budget
	// spent) would otherwise send an ack frame, and wake a client host,
	// for each.
	lazy := records && (p.ackDue == 0 || p.ackLazy)
	switch {
	case p.ackPending >= e.cfg.AckEvery || filled:
		p.sendAck()
	case p.ackDue == 0 || (p.ackLazy && !lazy):
		due := now + int64(e.cfg.AckDelay)
		if lazy {
			due = now + p.lazyAckDelay()
		}
		if p.ackDue == 0 || due < p.ackDue {
			p.ackDue = due
		}
		p.ackLazy = lazy
		e.arm(&p.tm, p.ackDue)
		if !p.inAcksDue {
			p.inAcksDue = true
			e.acksDue = append(e.acksDue, p)
			e.eng.acksDue = true
		}
	}
}

// nack refuses a frame.
//
// +checklocks:e.eng.mu
func (e *Endpoint) nack(p *peer, seq uint32, reason uint8) {
	p.sendCtl(tNack, 0, func(b []byte) int {
		putNack(b, seq, reason, p.remoteID)
		return 0
	})
}

// outcome of processing one in-order reliable frame.
type outcome int

const (
	accepted outcome = iota // processed: the sequence number is consumed
	refused                 // eager data refused for want of memory: nack, do not consume
	dropped                 // not processed, not consumed: the sender will retransmit
	gone                    // the endpoint or the peer went away meanwhile
)

// process handles one reliable frame whose turn it is.
//
// +checklocks:e.eng.mu
func (e *Endpoint) process(p *peer, f []byte, h *header, now int64) outcome {
	if p.in.active && h.typ != tEager {
		// The sender left the message under way for another frame: no
		// sender does (a message's fragments follow one another), and
		// the message can never complete.
		p.abandonIn(Aborted)
	}
	res := e.processFrame(p, f, h, now)
	if res == accepted && p.refused && h.seq == p.refusedSeq {
		// The frame at a refused message's sequence number is taken,
		// whatever it is (the rendezvous record, from a correct sender):
		// the refusal is over.
		p.refused, p.refusedSeen = false, false
	}
	return res
}

// processFrame is process's handling of the frame by its type.
//
// +checklocks:e.eng.mu
func (e *Endpoint) processFrame(p *peer, f []byte, h *header, now int64) outcome {
	th, payload := typeHdr(f, h)
	switch h.typ {
	case tNop:
		return accepted
	case tNotify:
		var n notifyHdr
		n.decode(th)
		if r := e.rndvs[n.rndvID]; r != nil && r.peer == p {
			if int64(n.xferLen) > int64(r.length) || int(n.code) >= len(codeNames) {
				// No receiver sends this: it took more than was sent, or
				// ended with a code there is none of. The frame is counted
				// and the send fails: the peer's answer cannot be trusted.
				e.stats.BadFrames++
				n.xferLen, n.code = 0, Aborted
			}
			delete(e.rndvs, n.rndvID)
			p.rndvs--
			r.status.XferLen = int(n.xferLen)
			r.buffered = true
			if r.unacked > 0 {
				// The notify overtook the acks of frames of the message
				// that were lost (a converted eager message's tail):
				// they are no-ops now, and the request will be reused.
				p.detach(r)
			}
			e.complete(r, n.code)
		} else {
			// Notifies are reliable: none comes twice, and none for a
			// rendezvous we did not offer this peer.
			e.stats.BadFrames++
		}
		return accepted
	case tPut:
		var ph putHdr
		ph.decode(th)
		e.onPut(p, &ph, now)
		return accepted
	case tRndv:
		var rh rndvHdr
		rh.decode(th)
		// The rendezvous version of a refused eager message: the
		// refusal ends once this record is taken (process; a late copy
		// of the eager frame is refused until then).
		converted := p.refused && h.seq == p.refusedSeq
		if r := e.match.arrive(rh.match); r != nil {
			e.matchedRndv(r, p, rh.match, rh.msgLen, rh.rndvID, now)
			return accepted
		}
		if e.unexpRndv >= e.cfg.MaxUnexpectedRndv {
			// The sender retransmits until there is room; the handler
			// sees the message then, once.
			e.stats.RndvDeferred++
			return dropped
		}
		if !converted || !p.refusedSeen {
			act, ok := e.callHandler(p, rh.match, int(rh.msgLen), nil)
			if !ok {
				return gone
			}
			if act == Finished {
				e.sendNotify(p, rh.rndvID, 0, Success, now)
				return accepted
			}
			if r := e.match.arrive(rh.match); r != nil {
				e.matchedRndv(r, p, rh.match, rh.msgLen, rh.rndvID, now)
				return accepted
			}
		}
		u := &unexp{src: p, match: rh.match, msgLen: rh.msgLen, rndv: true, rndvID: rh.rndvID}
		e.unexpRndv++
		e.addUnexp(u)
		return accepted
	case tEager:
		var eh eagerHdr
		if eh.decode(th, len(payload)) != nil {
			e.stats.BadFrames++
			return accepted
		}
		if eh.offset != 0 {
			e.continueEager(p, &eh, payload)
			return accepted
		}
		if p.in.active {
			// A new message while the previous one is incomplete: the
			// sender abandoned it (converted to rendezvous).
			p.abandonIn(Aborted)
		}
		if p.refused && h.seq == p.refusedSeq {
			return refused
		}
		if r := e.match.arrive(eh.match); r != nil {
			e.startEager(p, r, &eh, payload)
			return accepted
		}
		var data []byte
		if int(eh.msgLen) == len(payload) {
			data = payload
		}
		act, ok := e.callHandler(p, eh.match, int(eh.msgLen), data)
		if !ok {
			return gone
		}
		if act == Finished {
			if int(eh.msgLen) > len(payload) {
				p.in = inMsg{active: true, match: eh.match, msgLen: eh.msgLen, received: uint32(len(payload))}
			}
			return accepted
		}
		if r := e.match.arrive(eh.match); r != nil {
			e.startEager(p, r, &eh, payload)
			return accepted
		}
		if e.unexpBytes+unexpCost(int(eh.msgLen)) > e.cfg.UnexpectedBytes {
			e.stats.EagerRefused++
			// The handler saw it and let it queue: its rendezvous
			// version goes to the queue without showing it again.
			p.refused, p.refusedSeq, p.refusedSeen = true, h.seq, e.cfg.UnexpectedHandler != nil
			return refused
		}
		u := &unexp{src: p, match: eh.match, msgLen: eh.msgLen, data: make([]byte, eh.msgLen)}
		e.unexpBytes += unexpCost(int(eh.msgLen))
		e.stats.UnexpectedBytes += uint64(eh.msgLen)
		u.received = uint32(copy(u.data, payload))
		e.addUnexp(u)
		if !u.complete() {
			p.in = inMsg{active: true, u: u, match: eh.match, msgLen: eh.msgLen, received: u.received}
		}
		return accepted
	}
	return accepted
}

// dropUnexp removes an unexpected message whose data will never be
// complete, returning its memory to the bound. A same-process send whose
// record it was completes with sendCode.
//
// +checklocks:e.eng.mu
func (e *Endpoint) dropUnexp(u *unexp, sendCode Code) {
	e.match.removeUnexp(u)
	switch {
	case u.localSend != nil:
		e.unexpRndv--
		e.heldRoom()
		u.localSend.ep.complete(u.localSend, sendCode)
	case u.rndv:
		e.unexpRndv--
		e.heldRoom()
	default:
		e.unexpBytes -= unexpCost(int(u.msgLen))
		e.heldRoom() // an eager message held for want of memory may fit now
	}
}

// addUnexp queues an unexpected message.
//
// +checklocks:e.eng.mu
func (e *Endpoint) addUnexp(u *unexp) {
	e.stats.Unexpected++
	e.match.pushUnexp(u)
	e.notifyAny() // wakes probes
}

// callHandler runs the unexpected-message handler without the engine
// lock (it may post receives). It reports false when the endpoint closed
// meanwhile.
//
// +checklocks:e.eng.mu
func (e *Endpoint) callHandler(p *peer, match uint64, n int, data []byte) (HandlerAction, bool) {
	h := e.cfg.UnexpectedHandler
	if h == nil {
		return Continue, true
	}
	m := UnexpectedMessage{Source: p.addr, Match: match, Length: n, Data: data}
	g := e.eng
	// Others may take the lock while the handler runs: they are not the
	// driver.
	dispatching := g.dispatching
	g.dispatching = false
	resets := p.resets
	g.mu.Unlock()
	act, pv := runHandler(h, m)
	g.mu.Lock()
	g.dispatching = dispatching
	if pv != nil {
		// The handler panicked. The engine's state stays whole (the
		// message queues as if the handler had said Continue) and the
		// panic goes on once the goroutine that ran the handler lets go
		// of the engine (engine.rethrow).
		if g.handlerPanic == nil {
			g.handlerPanic = pv
			g.handlerPanicked.Store(true)
		}
		act = Continue
	}
	if e.closed || p.resets != resets {
		// The endpoint closed, or the exchange with the peer was
		// forgotten (Disconnect, a reset) meanwhile: the message goes
		// with it.
		return act, false
	}
	if act == Finished {
		e.stats.Unexpected++ // taken by the handler: addUnexp counts the rest
	}
	return act, true
}

// runHandler calls the unexpected-message handler h and returns what it
// said, or what it panicked with.
func runHandler(h func(UnexpectedMessage) HandlerAction, m UnexpectedMessage) (act HandlerAction, pv any) {
	defer func() {
		if v := recover(); v != nil {
			pv = v
		}
	}()
	return h(m), nil
}

// startEager delivers the first fragment of an eager message into the
// receive it matched.
//
// +checklocks:e.eng.mu
func (e *Endpoint) startEager(p *peer, r *request, eh *eagerHdr, payload []byte) {
	r.status.Source, r.status.Match, r.status.MsgLen = p.addr, eh.match, int(eh.msgLen)
	copyToSegs(r.segs, 0, payload)
	if int(eh.msgLen) == len(payload) {
		r.status.XferLen = min(int(eh.msgLen), r.length)
		e.complete(r, Success)
		return
	}
	p.in = inMsg{active: true, recv: r, match: eh.match, msgLen: eh.msgLen, received: uint32(len(payload))}
}

// continueEager delivers a later fragment of the message being
// reassembled; fragments of abandoned messages are ignored. One that does
// not continue the message under way (another length or match, bytes
// already received or past them) no sender sends: it is counted.
//
// +checklocks:e.eng.mu
func (e *Endpoint) continueEager(p *peer, eh *eagerHdr, payload []byte) {
	in := &p.in
	if !in.active {
		return
	}
	if eh.offset != in.received || eh.msgLen != in.msgLen || eh.match != in.match {
		e.stats.BadFrames++
		return
	}
	in.received += uint32(len(payload))
	switch {
	case in.recv != nil:
		copyToSegs(in.recv.segs, int(eh.offset), payload)
	case in.u != nil:
		copy(in.u.data[eh.offset:], payload)
		in.u.received = in.received
	}
	if in.received < in.msgLen {
		return
	}
	if r := in.recv; r != nil {
		r.status.XferLen = min(int(in.msgLen), r.length)
		e.complete(r, Success)
	} else if in.u != nil {
		e.notifyAny() // an unexpected message is whole: wakes probes
	}
	*in = inMsg{}
}

// takeUnexp gives an unexpected message to a receive just posted.
//
// +checklocks:e.eng.mu
func (e *Endpoint) takeUnexp(r *request, u *unexp, now int64) {
	r.status.Source, r.status.Match, r.status.MsgLen = u.src.addr, u.match, int(u.msgLen)
	if u.rndv {
		e.unexpRndv--
		if s := u.localSend; s != nil {
			e.deliverLocal(s, r, u.src.addr)
			return
		}
		e.matchedRndv(r, u.src, u.match, u.msgLen, u.rndvID, now)
		return
	}
	copyToSegs(r.segs, 0, u.data[:u.received])
	e.unexpBytes -= unexpCost(int(u.msgLen))
	if u.complete() {
		r.status.XferLen = min(int(u.msgLen), r.length)
		e.complete(r, Success)
		return
	}
	// The rest of the message goes straight into the receive.
	if p := u.src; p.in.u == u {
		p.in.u, p.in.recv = nil, r
	}
}

// matchedRndv starts pulling a rendezvous message into the receive it
// matched.
//
// +checklocks:e.eng.mu
func (e *Endpoint) matchedRndv(r *request, p *peer, match uint64, msgLen, rndvID uint32, now int64) {
	r.status.Source, r.status.Match, r.status.MsgLen = p.addr, match, int(msgLen)
	total := min(int(msgLen), r.length)
	if total == 0 {
		r.status.XferLen = 0
		e.sendNotify(p, rndvID, 0, Success, now)
		e.complete(r, Success)
		return
	}
	e.startPull(r, p, rndvID, uint32(total), now)
}

// sendNotify tells a rendezvous (or Put) sender that the receiver is done
// with it: xfer bytes delivered, or code for a refused Put.
//
// +checklocks:e.eng.mu
func (e *Endpoint) sendNotify(p *peer, rndvID, xfer uint32, code Code, now int64) {
	r := e.newRequest(kindNotify, nil)
	r.forgotten = true
	r.peer = p
	r.rndvID = rndvID
	r.status.XferLen = int(xfer)
	r.status.Code = code
	if p.sendHead != nil || !e.frameMessage(p, r, now) {
		p.pushSend(r)
	}
}

// onNack handles a refusal of one of our frames.
//
// +checklocks:e.eng.mu
func (e *Endpoint) onNack(p *peer, th []byte, now int64) {
	seq, reason, _ := getNack(th)
	switch reason {
	case nackEagerRefused:
		if r := p.eagerFirst(seq); r != nil {
			e.convert(p, r, seq, now)
		}
	case nackBadRndv:
		// A Get's pull names a region, whose id may equal the
		// rendezvous': the nack is not for it.
		for _, pl := range e.pulls {
			if pl.peer == p && pl.rndvID == seq && pl.r.kind != kindGet {
				e.endPull(pl, Aborted)
			}
		}
	case nackBadRegion:
		// Only a Get pulls from a region. A nack naming a pull that has
		// ended is a late one (each of a block's requests is refused);
		// one naming a pull from a rendezvous send, no peer sends.
		if pl := e.pulls[seq]; pl != nil && pl.peer == p {
			if pl.r.kind != kindGet {
				e.stats.BadFrames++
				return
			}
			e.endPull(pl, BadRegion)
		}
	}
}

// convert turns an eager message the receiver refused into a rendezvous:
// its first frame is rewritten as the rendezvous record, its other frames
// as no-ops, and the data is kept until the receiver pulls it.
//
// +checklocks:e.eng.mu
func (e *Endpoint) convert(p *peer, r *request, first uint32, now int64) {
	w := uint32(len(p.win))
	for seq := first; seq != p.nextSeq; seq++ {
		if s := &p.win[seq%w]; s.req == r && s.pending > 0 {
			// A frame is on its way to the link: its buffer cannot be
			// rewritten yet. The flush that hands it over converts the
			// message (convertSent).
			r.convertWanted, r.convertFirst = true, first
			return
		}
	}
	r.convertWanted = false
	e.stats.EagerConverted++
	buf := make([]byte, r.length)
	for seq := first; seq != p.nextSeq; seq++ {
		s := &p.win[seq%w]
		if s.req != r {
			continue
		}
		fh, err := decodeHeader(s.buf[:s.n])
		if err != nil {
			continue
		}
		th, payload := typeHdr(s.buf[:s.n], &fh)
		var eh eagerHdr
		if eh.decode(th, len(payload)) == nil {
			copy(buf[eh.offset:], payload)
		}
	}
	if r.framed < r.length {
		copyFromSegs(buf[r.framed:], r.segs, r.framed)
		r.framed = r.length
		p.removeSend(r)
	}
	// From now on the send reads from the engine's copy, not the user's
	// buffers (which the user may already have reused).
	r.segs, r.rndv, r.buffered = [][]byte{buf}, true, true
	e.offerRndv(p, r)
	for seq := first; seq != p.nextSeq; seq++ {
		s := &p.win[seq%w]
		if s.req != r {
			continue
		}
		t := tNop
		if seq == first {
			t = tRndv
		}
		th := p.putHeader(s.buf, t, seq, 0, 0)
		if t == tRndv {
			rh := rndvHdr{match: r.match, msgLen: uint32(r.length), rndvID: r.rndvID}
			rh.put(th)
		}
		s.n = int32(len(padded(s.buf, t, 0)))
		s.last = seq == first
	}
	p.retransmit(&p.win[first%w], now)
}

// eagerFirst returns the eager send (not converted yet) whose first frame
// seq is in p's window, or nil.
//
// +checklocks:p.ep.eng.mu
func (p *peer) eagerFirst(seq uint32) *request {
	s := p.slot(seq)
	if s.used && s.seq == seq && s.first && s.req != nil && s.req.kind == kindSend && !s.req.rndv {
		return s.req
	}
	return nil
}

// convertSent converts the refused eager message r, one of whose frames
// the link has just taken back, once none of them is on its way any more.
//
// +checklocks:r.ep.eng.mu
func convertSent(r *request, now int64) {
	p := r.peer
	if p.eagerFirst(r.convertFirst) == r {
		p.ep.convert(p, r, r.convertFirst, now)
	} else {
		r.convertWanted = false // acked or gone meanwhile
	}
}

// negotiateMTU is the MTU of frames to a peer: the smaller of ours and its
// (a peer that did not say is assumed to have ours).
func negotiateMTU(ours, theirs int) int {
	if theirs < 576 {
		return ours
	}
	return min(ours, theirs)
}
