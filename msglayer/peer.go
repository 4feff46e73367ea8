package msglayer

import (
	"encoding/binary"
	"math"
	"time"

	"github.com/xmx-stack/xmx/xdp"
)

// peer is an endpoint's state for one remote endpoint: the reliable
// channel in both directions. Owned by the endpoint, guarded by the engine
// lock.
type peer struct {
	ep   *Endpoint
	addr Addr
	// localID and remoteID name the connection (see newID): ours, and
	// the peer's as we last learned it (0: never), with their generations.
	localID, localGen   uint32
	remoteID, remoteGen uint32
	// shown: localID went out in a connect, a connect reply or a nack
	// since newID. An id never shown (nor paired) names nothing the peer
	// could hold, so a reset keeps it (reset).
	shown bool
	// taken and prevTaken are the last two connects of the peer that we
	// took (the id each came from, 0 for none, and its connect id): a
	// late copy of one, or an older connect of the same id, pairs us
	// nothing (isCopy).
	taken, prevTaken connTaken
	connected        bool      // paired with remoteID: a connect or its reply named it
	dead             bool      // retransmissions gave up: sends fail until a new connect
	local            *Endpoint // same-process endpoint: messages skip the NIC
	mtu              int       // frames to the peer: the smaller of both MTUs
	tm               timer     // in ep.timers while it has frames in flight or an ack due

	// Send side: frames nextSeq-acked in flight, in the window.
	nextSeq uint32
	acked   uint32 // every frame below was acknowledged
	win     []txSlot
	// cwnd is how many of the window's frames may be in flight: a
	// receiver that many senders flood at once loses frames (its receive
	// ring overflows), and each sender then resending its whole window
	// at every timeout kept it flooded. A loss found by a selective ack
	// halves cwnd (at most once a round trip, down to minCwnd); a timeout
	// drops it to minCwnd and starts a recovery (below). Below ssthresh
	// each frame acked grows cwnd by one (slow start: it doubles every
	// round trip); above it, each cwnd frames acked grow it by one
	// (cwndAcked counts them), up to the window.
	cwnd, cwndAcked, ssthresh uint32
	// rwnd is the receive window the peer said in its last frame (0: no
	// limit): reliable frames in flight to it stay below it too
	// (sendLimit). It fills the hole before cwndCutAt: a field that moves
	// the record's hot fields costs the frame path several per cent
	// (BenchmarkEngineCost).
	rwnd uint8
	// saidWin is the receive window we said in our last frame to the peer
	// (0: no limit): a window that comes down to half of it or less is
	// said to the peer at once (engine.sayShrunk). In the same hole.
	saidWin   uint8
	cwndCutAt int64 // when cwnd last shrank
	// recovery: after a timeout, every frame in flight then (below
	// recoverEnd) is presumed lost and resent from the oldest, as acks
	// make room in cwnd, rather than all at once; rexmitNext is the next
	// one to resend. Only the frames resent, and the oldest, are timed
	// meanwhile (awaitsRecovery).
	recovering             bool
	rexmitNext, recoverEnd uint32
	sendHead               *request // messages waiting for window space, in order
	sendTail               *request
	srtt                   int64 // smoothed round trip (ns); 0 before the first sample
	rttvar                 int64
	rto                    int64
	// Pull blocks: smoothed time from request to last frame (ns; 0 before
	// the first block), which includes the wait behind other blocks.
	pullSRTT, pullVar int64
	// pullReo is how long a pull block found missing frames behind a
	// later one waits for them before asking again (ns): 0 until the
	// peer's pull replies are seen reordered (onPullReply).
	pullReo int64
	// probed: the last block that completed after probes and no frame
	// found lost, timed only if its probes turn out needless (onPullReply).
	probed    probedBlock
	lastHeard int64 // last frame from the peer
	retx      uint64
	// ackIn is the newest cumulative ack a received data frame carried,
	// not processed yet (ackQueued): the driver processes it after the
	// batch (engine.settleAcks), or, when the batch completed the request
	// its Wait waits for, after Wait has returned: at its next round.
	// Whatever reads the window first calls settle.
	ackIn     uint32
	census    uint32 // the engine's census that last counted the peer as a sender (engine.noteSender; in the hole before ackInAt)
	ackInAt   int64
	ackQueued bool

	// Receive side.
	expected   uint32 // next in-order sequence number
	ooo        []rxSlot
	oooCount   int
	ackPending int   // in-order frames not yet acknowledged
	ackDue     int64 // when a delayed ack must go (0: none)
	// ackLazy: the delayed ack covers rendezvous records only, which
	// complete no send: it may wait lazyAckDelay, also while the driver
	// sleeps, and ride in the bundle of another peer's ack (sendAck).
	ackLazy   bool
	inAcksDue bool // in ep.acksDue
	refused   bool // an eager message at refusedSeq was refused: wait for its rendezvous version
	// refusedSeen: the unexpected handler saw the refused message (and
	// let it queue): its rendezvous version is not shown again.
	refusedSeen bool
	refusedSeq  uint32
	in          inMsg // the eager message being reassembled
	unexps      int   // unexpected messages of the peer queued (unexp.src)
	// dialed: our connect to the peer succeeded (until a reset): the
	// record is neither counted against MaxPeers nor given to others
	// (evictable, Endpoint.dialed).
	dialed    bool
	pulls     int       // active pulls from this peer
	host      *hostLoad // what pulls wait for from the peer's host (engine.hosts)
	rndvs     int       // our rendezvous sends to this peer awaiting notify
	kaSent    int64     // last keepalive
	waiting   bool      // we wait on the peer for a notify or pull data
	waitStart int64     // since when

	// resets counts clear()s: a handler, which runs unlocked, that sees
	// it change finds its peer's exchange forgotten (Disconnect, reset).
	resets uint32

	// ch is what a challenge left (nil before the first): rare, and
	// apart from the record, whose size the frame path feels.
	ch *challengeState

	// held: a same-process peer's messages to us held at our
	// MaxUnexpectedRndv bound (nil before the first), apart from the
	// record as ch is.
	held *heldChain
}

// challengeState is a peer's state of challenges: the connects of the
// last two other selves of the peer that came while we were connected,
// newest first, and when we last asked the self we know whether it
// lives.
type challengeState struct {
	held [2]heldConnect
	at   int64
}

// heldConnect is a connect that waits for the answer to a challenge: the
// id it came from (0: none), that id's generation, its connect id and MTU.
type heldConnect struct {
	from, gen, connID uint32
	mtu               int
}

// txSlot holds one reliable frame until it is acknowledged.
type txSlot struct {
	buf       []byte // lent from the engine while the slot is in use
	sentAt    int64  // last transmission
	firstSent int64
	req       *request // the message the frame belongs to
	peer      *peer
	n         int32 // frame length
	seq       uint32
	pending   int32 // queued for or being handed to the link
	retries   int32
	used      bool
	// stamp: sentAt and firstSent are not known yet: the frame is on its
	// way to the link, or was handed over and waits for the next clock
	// reading (engine.stampSent), which sets them and arms the timer.
	stamp  bool
	sacked bool
	// retimed: sentAt was moved to when a recovery ended
	// (peer.overtaken) without the frame being resent: its round trip is
	// not known.
	retimed bool
	first   bool // first frame of req
	last    bool // last frame of req
}

// rxSlot holds a reliable frame received ahead of order.
type rxSlot struct {
	buf  []byte
	n    int
	full bool
}

// inMsg is the eager message whose fragments are arriving.
type inMsg struct {
	active   bool
	recv     *request // matched receive, or
	u        *unexp   // unexpected message being filled
	match    uint64
	msgLen   uint32
	received uint32
}

// seqBase is where a session's sequence numbers start, both ways: 0, or
// just below 2^32 in tests that make them wrap (SetSeqBase).
var seqBase uint32

// newPeer returns a new record of peer a.
//
// +checklocks:e.eng.mu
func newPeer(e *Endpoint, a Addr) *peer {
	p := &peer{ep: e, addr: a, rto: int64(e.cfg.InitialRTO), host: e.eng.joinHost(a.MAC), localID: e.session}
	p.nextSeq, p.acked, p.expected = seqBase, seqBase, seqBase
	p.tm = timer{slot: -1, peer: p}
	p.win = make([]txSlot, e.cfg.Window)
	p.cwnd, p.ssthresh = uint32(len(p.win)), uint32(len(p.win))
	for i := range p.win {
		p.win[i].peer = p
	}
	return p
}

// setDialed marks (or unmarks) the record as one of a peer we connected
// to, keeping the endpoint's count of them.
//
// +checklocks:p.ep.eng.mu
func (p *peer) setDialed(on bool) {
	if p.dialed != on {
		p.dialed = on
		if on {
			p.ep.dialed++
		} else {
			p.ep.dialed--
		}
	}
}

// evictable reports whether the record may be forgotten for a new peer's
// (Endpoint.roomForPeer): it is not a peer we connected to (dialed:
// MaxPeers bounds those that connect to us), nothing is under way with it (no frame
// in flight or held, no ack owed, no timer, no pull, rendezvous or
// unexpected message of its, not a connected same-process peer), and it is
// disconnected or was silent for GiveUp. What a forgotten record knew is
// its ids: a connected peer's next frame is answered as a stranger's
// (it reconnects), and a late connect of one of its old ids can pair
// again, as with a peer never seen.
//
// +checklocks:p.ep.eng.mu
func (p *peer) evictable(now int64) bool {
	if p.dialed || p.local != nil && p.connected || p.tm.armed() || p.inAcksDue || p.ackDue != 0 || p.ackQueued ||
		p.sendHead != nil || p.nextSeq != p.acked || p.oooCount != 0 || p.in.active ||
		p.pulls != 0 || p.rndvs != 0 || p.waiting || p.unexps != 0 {
		return false
	}
	return !p.connected || now-p.lastHeard >= int64(p.ep.cfg.GiveUp)
}

// Connection ids. Each side of a connection names it by an id of its own
// (localID), which the other side learns from its connect or connect
// reply (remoteID); every frame carries both, the receiver's as the
// destination session and the sender's as the source session, and a frame
// that does not name the pair exactly as the receiver knows it is stale.
// Each side holds the state of a connection once, from its start, and
// both start their sequence numbers at 0, so that nothing of an older
// exchange, a late frame, ack, nack, connect or disconnect, can touch a
// newer one: a record never goes back to a pair of ids it left. It takes
// a new id when it forgets the exchange (it gave up on the peer,
// disconnected, or was told the peer does not know it: reset) and when it
// leaves a connection for one with another self of the peer (pair).
//
// An id is the endpoint's session (random at Open: its self) plus a
// generation that the record moves on at each new id; connects and their
// replies carry the generation in the sequence number field, so that of
// two ids of one self the older is known, and a connected record never
// pairs with an older id of the peer's self than the one it has.

// newID moves the record on to its next id. A connect to the peer under
// way goes again at once, from the new id and as a new connect (a new
// connect id): the peer may have taken it from the old one.
//
// +checklocks:p.ep.eng.mu
func (p *peer) newID() {
	p.shown = false
	p.localGen++
	p.localID = p.ep.session + p.localGen
	if p.localID == 0 { // 0 means "unknown"
		p.newID()
		return
	}
	e := p.ep
	for _, r := range e.connects {
		if r.connAddr == p.addr {
			r.connID = e.newConnID()
			e.sendConnect(r, e.eng.readClock())
		}
	}
}

// is reports whether id x of generation gen is the peer's id we know (two
// selves' ids may be equal; their generations then differ).
func (p *peer) is(x, gen uint32) bool { return x == p.remoteID && gen == p.remoteGen }

// sameSelf reports whether id x of generation gen comes from the self of
// the peer whose id we know.
func (p *peer) sameSelf(x, gen uint32) bool {
	return p.remoteID != 0 && x-gen == p.remoteID-p.remoteGen
}

// older reports whether id x of generation gen is an earlier one of the
// peer's self than the id we know.
func (p *peer) older(x, gen uint32) bool {
	return p.sameSelf(x, gen) && int32(gen-p.remoteGen) < 0
}

// connTaken is a connect we took: the id it came from and its connect id.
type connTaken struct{ from, connID uint32 }

// isCopy reports whether connect connID from id x is a copy of a connect
// we took, or an older connect of the same id. A copy always comes from
// the id of its first: a new id sends its pending connects again as new
// ones (newID).
func (p *peer) isCopy(x, connID uint32) bool {
	for _, t := range [2]connTaken{p.taken, p.prevTaken} {
		if t.from != 0 && x == t.from && int32(connID-t.connID) <= 0 {
			return true
		}
	}
	return false
}

// Challenges. A connect (or a connect's reply) from another self of the
// peer, while we are connected to one, means that the peer restarted, or
// is a late copy from a self that is gone: sessions are random, so two
// selves cannot be ordered. Taking it in the second case would leave a
// live connection for a dead self. So we ask instead, as TCP answers a
// SYN in an established connection with a challenge ack (RFC 5961): a
// keepalive to the self we know, at the peer's address, which only one
// self holds at a time. That self, alive, answers it with an ack and the
// connect stays unanswered (its sender is gone); another self there now
// nacks it (it does not know the pair), and we reset (onSessionNack) and
// take the held connect at once if the nack comes from its id. Two
// connects are held, of the last two selves that sent one: a late copy
// from a third, dead self does not push out the live one's. A live
// sender whose connect we still lost (its nack lost too, or pushed out)
// sends it again (ConnectRetry), which asks again.
//
// The self we know answers with an ack when its record is paired with
// us as we are with it; one that forgot us nacks (it does not know the
// pair) and we reset, as we would at any of its frames; one waiting for
// the reply to a connect of its own drops it (awaitsReply), and its
// connect, which pairs us again, comes anyway. No endpoint at the
// address (an engine that lives on) nacks it as bad endpoint: we reset,
// dropping the connects held, which their senders send again.

// challenge holds connect connID of id x (generation gen), MTU mtu, and
// asks the self we know whether it lives, at most once per timeout. A
// reply's challenge (x is 0) holds nothing and keeps the connects held:
// the reset the nack brings sends our connect again from a new id, which
// the new self takes.
//
// +checklocks:p.ep.eng.mu
func (p *peer) challenge(x, gen, connID uint32, mtu int, now int64) {
	if p.ch == nil {
		p.ch = new(challengeState)
	}
	ch := p.ch
	if x != 0 {
		if ch.held[0].from != x {
			ch.held[1] = ch.held[0]
		}
		ch.held[0] = heldConnect{from: x, gen: gen, connID: connID, mtu: mtu}
	}
	if ch.at != 0 && now-ch.at < p.rto {
		return
	}
	ch.at = now
	p.ep.stats.Challenges++
	p.sendCtl(tKeepalive, flagWantAck, nil)
}

// took records that we took connect connID from id x.
func (p *peer) took(x, connID uint32) {
	if x != p.taken.from {
		p.prevTaken = p.taken
	}
	p.taken = connTaken{x, connID}
}

// reset forgets the exchange with the peer: it gave up on it, this side
// disconnected, or the peer said it does not know our id. Pending
// operations with the peer complete with code; the record takes a new id
// and keeps the peer's (to tell its later ids from earlier ones). An id
// that was never paired nor shown (a Disconnect of a record not connected)
// is kept: nothing names it, and moving it at each call would, after 2^31
// calls, make the peer take our next connect for an older id's.
//
// +checklocks:p.ep.eng.mu
func (p *peer) reset(code Code) {
	moved := p.connected || p.shown
	p.clear(code)
	p.setDialed(false)
	p.connected = false
	if moved {
		p.newID()
	}
}

// pair makes x, of generation gen, the peer's id we exchange with: a
// connect of the peer, or its reply to ours, named it. What we had with
// another id of the peer is gone (it restarted, or forgot us): its
// operations complete with BadSession. Leaving an id of another self of
// the peer, we take a new id too: that self's ids are not ordered with
// the new one's, and a late connect of it could otherwise bring us back to
// the pair we left, whose other side may still hold its state.
//
// +checklocks:p.ep.eng.mu
func (p *peer) pair(x, gen uint32) {
	leaving := p.connected && !p.is(x, gen)
	sameSelf := p.sameSelf(x, gen)
	if leaving {
		p.clear(BadSession)
		p.setDialed(false) // ours no more (onConnectReply marks it again)
	}
	p.remoteID, p.remoteGen = x, gen
	p.connected, p.dead, p.local = true, false, nil
	if p.ch != nil {
		p.ch.held = [2]heldConnect{}
	}
	if leaving && !sameSelf {
		p.newID()
	}
}

// clear completes every pending operation with the peer with code and
// empties the window, the frames held out of order and the round-trip
// estimates; sequence numbers start again at seqBase both ways.
//
// +checklocks:p.ep.eng.mu
func (p *peer) clear(code Code) {
	e := p.ep
	p.failAll(code)
	for i := range p.win {
		s := &p.win[i]
		s.used, s.req, s.sacked, s.retries = false, nil, false, 0
		e.eng.releaseSlot(s)
	}
	for i := range p.ooo {
		p.releaseOOO(&p.ooo[i])
	}
	e.oooHeld -= p.oooCount
	p.nextSeq, p.acked, p.expected = seqBase, seqBase, seqBase
	// cwnd is the path's and stays; it grows back by slow start.
	p.recovering, p.ssthresh = false, uint32(len(p.win))
	p.ackQueued = false
	p.oooCount, p.ackPending, p.ackDue, p.ackLazy = 0, 0, 0, false
	p.refused, p.refusedSeen = false, false
	p.resets++
	p.in = inMsg{}
	p.srtt, p.rttvar, p.rto = 0, 0, int64(e.cfg.InitialRTO)
	p.pullSRTT, p.pullVar, p.pullReo = 0, 0, 0
	p.probed = probedBlock{}
	p.waiting = false // a new wait's silence counts from its own start
	p.dead = false
	p.ch = nil
}

// failAll completes every pending operation with this peer with code.
//
// +checklocks:p.ep.eng.mu
func (p *peer) failAll(code Code) {
	e := p.ep
	// A same-process sender learns what a sender over the network would:
	// that we are gone (the engine nacks frames for a closed endpoint),
	// or that the exchange was dropped.
	sendCode := Aborted
	if code == Closed {
		sendCode = BadEndpoint
	}
	if t := p.local; t != nil {
		// Our same-process messages to it that wait for the driver, and
		// its to us held at our bound (as its records here, below).
		e.eng.dropLocalTo(e, t, code)
		e.eng.dropLocalIf(func(m localMsg) (Code, bool) { return sendCode, m.r.ep == t && m.to == e })
	}
	// Sends: in the window, waiting for it, and rendezvous offered to the
	// peer. One send may be all three (a message partly framed, or a
	// rendezvous record in flight), and completing a forgotten request
	// recycles it at once: take each off every list first, then complete
	// it once.
	var sends []*request
	failing := map[*request]bool{}
	fail := func(r *request) {
		if r != nil && !r.done && !failing[r] {
			failing[r] = true
			sends = append(sends, r)
		}
	}
	for i := range p.win {
		s := &p.win[i]
		if s.used {
			fail(s.req)
		}
		s.req = nil
	}
	for r := p.sendHead; r != nil; {
		next := r.snext
		p.removeSend(r)
		fail(r)
		r = next
	}
	for id, r := range e.rndvs {
		if r.peer == p {
			delete(e.rndvs, id)
			p.rndvs--
			fail(r)
		}
	}
	if t := p.local; t != nil {
		// Same-process rendezvous sends waiting in the peer's unexpected
		// queue: their data is ours.
		t.match.eachUnexp(func(u *unexp) {
			if s := u.localSend; s != nil && s.ep == e {
				t.match.removeUnexp(u)
				t.unexpRndv--
				t.heldRoom()
				fail(s)
			}
		})
	}
	for _, r := range sends {
		e.complete(r, code)
	}
	// Pulls from the peer.
	for _, pl := range e.pulls {
		if pl.peer == p {
			e.endPull(pl, code)
		}
	}
	p.abandonIn(code)
	// Unexpected messages whose data will never come: rendezvous records
	// (the data was at the peer) and eager messages still incomplete. A
	// complete eager message is kept: its data is here.
	e.match.eachUnexp(func(u *unexp) {
		if u.src == p && !(u.localSend == nil && !u.rndv && u.complete()) {
			e.dropUnexp(u, sendCode)
		}
	})
}

// abandonIn gives up the eager message being reassembled: its receive
// completes with code, or its unexpected record is dropped.
//
// +checklocks:p.ep.eng.mu
func (p *peer) abandonIn(code Code) {
	e := p.ep
	if p.in.active {
		if r := p.in.recv; r != nil {
			// Eager frames come in order: what arrived is a prefix.
			r.status.XferLen = min(int(p.in.received), r.length)
			e.complete(r, code)
		}
		if u := p.in.u; u != nil {
			e.dropUnexp(u, Aborted) // a network message: no local send
		}
	}
	p.in = inMsg{}
}

// pushSend queues a message for framing.
func (p *peer) pushSend(r *request) {
	r.sprev, r.snext = p.sendTail, nil
	if p.sendTail != nil {
		p.sendTail.snext = r
	} else {
		p.sendHead = r
	}
	p.sendTail = r
	r.inSendQ = true
}

func (p *peer) removeSend(r *request) {
	if !r.inSendQ {
		return
	}
	if r.sprev != nil {
		r.sprev.snext = r.snext
	} else {
		p.sendHead = r.snext
	}
	if r.snext != nil {
		r.snext.sprev = r.sprev
	} else {
		p.sendTail = r.sprev
	}
	r.sprev, r.snext, r.inSendQ = nil, nil, false
}

// slot returns the window slot of sequence number seq. The window's
// length is a power of two (Config.Window): a mask, not a division.
func (p *peer) slot(seq uint32) *txSlot { return &p.win[seq&uint32(len(p.win)-1)] }

// inFlight is the number of reliable frames sent and not acknowledged.
func (p *peer) inFlight() uint32 { return p.nextSeq - p.acked }

// slotFor returns the window slot of the next sequence number, or nil if
// the window is full or the slot's previous frame is still being sent.
//
// +checklocks:p.ep.eng.mu
func (p *peer) nextSlot() *txSlot {
	if p.inFlight() >= p.sendLimit() {
		// The caller is framing: take a noted ack without pumping the
		// send queue.
		if !p.takeAck() || p.inFlight() >= p.sendLimit() {
			if p.sendLimit() < p.cwnd {
				p.ep.stats.WindowHeld++
			}
			return nil
		}
	}
	s := p.slot(p.nextSeq)
	if s.pending > 0 {
		p.ep.blockedOnSlot, p.ep.eng.slotBlocked = true, true
		return nil
	}
	if s.buf == nil {
		s.buf = p.ep.eng.scratchBuf()
	}
	return s
}

// releaseSlot gives an idle window slot's buffer back to the engine,
// unless the link is still sending it: the flush that sends it calls
// releaseSlot again once it is out.
//
// +checklocks:g.mu
func (g *engine) releaseSlot(s *txSlot) {
	if !s.used && s.pending == 0 && s.buf != nil {
		g.freeBuf(s.buf)
		s.buf = nil
	}
}

// releaseOOO empties an out-of-order slot and gives its buffer back.
//
// +checklocks:p.ep.eng.mu
func (p *peer) releaseOOO(s *rxSlot) {
	s.full = false
	if s.buf != nil {
		p.ep.eng.freeBuf(s.buf)
		s.buf = nil
	}
}

// putHeader writes into f the Ethernet and common headers of a frame of
// type t to the peer, with the sequence number, flags and payload length
// given, and returns the type header slice. It writes them from the
// peer's fields: every frame to the peer is headed so, and a header value
// built first would be stored and loaded again on the way (and, copied
// whole, cost a failed store-to-load forwarding).
func (p *peer) putHeader(f []byte, t frameType, seq uint32, flags uint8, payload int) []byte {
	g := p.ep.eng
	*(*[6]byte)(f[0:6]) = p.addr.MAC
	*(*[6]byte)(f[6:12]) = g.mac
	binary.BigEndian.PutUint16(f[12:14], g.ethType)
	b := f[xdp.EthHeaderLen:hdrLen]
	b[0] = wireVersion
	b[1] = byte(t)
	b[2] = p.addr.EP
	b[3] = p.ep.id
	binary.BigEndian.PutUint32(b[4:], p.remoteID)
	binary.BigEndian.PutUint32(b[8:], p.localID)
	binary.BigEndian.PutUint32(b[12:], seq)
	binary.BigEndian.PutUint32(b[16:], p.expected)
	b[20] = g.recvWindow
	p.saidWin = g.recvWindow
	b[21] = flags
	binary.BigEndian.PutUint16(b[22:], uint16(payload))
	return f[hdrLen:]
}

// atSend, given to sendReliable (through frameMessage) as the time, stamps
// the frame after the link has taken it (engine.stampSent) rather than
// now: an API call sends without reading the clock.
const atSend = math.MinInt64

// sendReliable assigns the next sequence number to the frame of type t
// being built in s (type header and payload of the given length already
// written after hdrLen), writes its common header, and queues it.
//
// +checklocks:p.ep.eng.mu
func (p *peer) sendReliable(s *txSlot, t frameType, flags uint8, payload int, req *request, first, last bool, now int64) {
	e := p.ep
	p.putHeader(s.buf, t, p.nextSeq, flags, payload)
	n := len(padded(s.buf, t, payload))
	s.n = int32(n)
	s.seq = p.nextSeq
	s.used = true
	s.retries = 0
	s.sacked, s.retimed = false, false
	s.req, s.first, s.last = req, first, last
	p.nextSeq++
	p.ackSent()
	e.eng.queue(s.buf[:n], s)
	e.stats.FramesOut++
	e.stats.BytesOut += uint64(n)
	s.stamp = now == atSend // then the first clock reading after its flush stamps it
	if !s.stamp {
		s.stamped(now)
	}
}

// stamped records that the link took the slot's frame at now (sent at
// atSend: at the first clock reading after the flush handed it over; else
// at once): its round trip and its timeout count from there.
//
// +checklocks:s.peer.ep.eng.mu
func (s *txSlot) stamped(now int64) {
	s.stamp = false
	p := s.peer
	if !s.used {
		// Acknowledged (or the peer reset) on its way out. A rendezvous
		// record so acknowledged still waits for its notify: the timers
		// must watch the peer (keepalives, give-up), as they would had
		// the record been timed.
		if p.waitsOn() {
			p.ep.arm(&p.tm, now+int64(p.ep.cfg.KeepaliveInterval))
		}
		return
	}
	s.sentAt, s.firstSent = now, now
	p.ep.arm(&p.tm, now+p.rto)
}

// ackSent notes that a frame carrying the current ack is going out.
func (p *peer) ackSent() {
	p.ackPending = 0
	p.ackDue = 0
	p.ackLazy = false
}

// lazyAckDelay is how long an ack of rendezvous records alone may wait:
// a quarter of the retransmission timeout, so that it arrives well before
// the sender's own timeout, and at most maxLazyAck; never less than
// AckDelay.
func (p *peer) lazyAckDelay() int64 {
	return max(min(p.rto/4, int64(maxLazyAck)), int64(p.ep.cfg.AckDelay))
}

// maxLazyAck bounds lazyAckDelay. A server that many clients keep busy
// owes acks of records it cannot pull from yet to many endpoints of each
// client host; within a millisecond it owes several per host, and one
// bundle (tAcks) wakes the host once for all of them.
const maxLazyAck = time.Millisecond

// sendCtl queues an unreliable frame to the peer: th writes the type
// header and payload into b (after hdrLen) and returns the payload length.
//
// +checklocks:p.ep.eng.mu
func (p *peer) sendCtl(t frameType, flags uint8, th func(b []byte) int) {
	p.sendCtlSeq(t, 0, flags, th)
}

// sendCtlSeq is sendCtl with seq in the common header's sequence field,
// which unreliable frames do not use otherwise: a pull request's stamp,
// which its replies echo.
//
// +checklocks:p.ep.eng.mu
func (p *peer) sendCtlSeq(t frameType, seq uint32, flags uint8, th func(b []byte) int) {
	e := p.ep
	b := e.eng.scratchBuf()
	n := 0
	if th != nil {
		n = th(b[hdrLen:])
	}
	p.putHeader(b, t, seq, flags, n)
	f := padded(b, t, n)
	l := len(f)
	p.ackSent()
	e.eng.queue(f, nil)
	e.stats.FramesOut++
	e.stats.BytesOut += uint64(l)
}

// sendFrame queues frame b, built in a scratch buffer, that no window
// slot holds (a control frame of no peer record), and counts it.
//
// +checklocks:e.eng.mu
func (e *Endpoint) sendFrame(b []byte) {
	e.eng.queue(b, nil)
	e.stats.FramesOut++
	e.stats.BytesOut += uint64(len(b))
}

// sendAck sends an explicit ack with the selective-ack bitmap of the
// frames held out of order (bit i: frame ack+1+i arrived). The delayed
// acks the endpoint owes to other endpoints of the peer's host go in the
// same frame, then a bundle (tAcks), when there is no bitmap to send.
//
// +checklocks:p.ep.eng.mu
func (p *peer) sendAck() {
	e := p.ep
	e.stats.AcksOut++
	if p.oooCount == 0 && len(e.acksDue) > 1 && p.bundles() {
		p.sendCtl(tAcks, 0, func(b []byte) int { return p.bundleAcks(b, ackRoom(p.mtu, acksHdrLen), false) })
		return
	}
	p.sendCtl(tAck, 0, func(b []byte) int {
		if p.oooCount == 0 {
			return 0
		}
		w := uint32(p.ep.cfg.Window)
		nbits := min(int(w)-1, sackBytes*8)
		n := 0
		for i := 0; i < nbits; i++ {
			if i%8 == 0 {
				b[i/8] = 0
			}
			if p.ooo[(p.expected+1+uint32(i))%w].full {
				b[i/8] |= 1 << (i % 8)
				n = i/8 + 1
			}
		}
		return n
	})
}

// bundles reports whether another peer's delayed ack can ride with p's
// (bundleAcks).
//
// +checklocks:p.ep.eng.mu
func (p *peer) bundles() bool {
	for _, q := range p.ep.acksDue {
		if p.rides(q) {
			return true
		}
	}
	return false
}

// rides reports whether q's delayed ack can ride in p's ack bundle: q is
// another remote peer on p's host, and owes a plain cumulative ack.
//
// +checklocks:p.ep.eng.mu
func (p *peer) rides(q *peer) bool {
	return q != p && q.ackDue != 0 && q.oooCount == 0 && q.connected && q.local == nil && q.addr.MAC == p.addr.MAC
}

// bundleAcks writes the entries of an ack bundle riding in a frame to p
// into b: the delayed acks of other peers on p's host (rides), at most
// room, which count as sent. It returns their length. With prune it also
// drops from acksDue the peers that owe no ack any more (theirs went out
// in another frame), so that a server pulling from many clients does not
// walk them at every pull request; flushAcks, which walks acksDue, must
// not be under way.
//
// +checklocks:p.ep.eng.mu
func (p *peer) bundleAcks(b []byte, room int, prune bool) int {
	e := p.ep
	n, kept := 0, 0
	for _, q := range e.acksDue {
		if n < room && p.rides(q) {
			a := ackEntry{dstEP: q.addr.EP, dstSession: q.remoteID, srcSession: q.localID, ack: q.expected}
			a.put(b[n*ackEntryLen:])
			q.ackSent()
			q.saidWin = e.eng.recvWindow // the bundle's window is q's too (engine.ackEntries)
			e.stats.AcksOut++
			e.stats.AcksBundled++
			n++
		}
		if prune {
			if q.ackDue == 0 {
				q.inAcksDue = false
				continue
			}
			e.acksDue[kept] = q
			kept++
		}
	}
	if prune {
		clear(e.acksDue[kept:])
		e.acksDue = e.acksDue[:kept]
	}
	return n * ackEntryLen
}

// ackRoom is how many ack entries fit in a frame to a peer of path MTU
// mtu after a type header of thLen bytes.
func ackRoom(mtu, thLen int) int {
	return max(0, min(maxAckEntries, (mtu-commonLen-thLen)/ackEntryLen))
}

// onAck processes a cumulative ack: frames below ack are delivered.
//
// +checklocks:p.ep.eng.mu
func (p *peer) onAck(ack uint32, now int64) {
	noted := p.takeAck()
	if p.ackUpTo(ack, now) || noted {
		p.pump(now)
	}
}

// noteAck records the cumulative ack of a data frame for the driver to
// process after the batch (settle), and reports whether it is new.
//
// +checklocks:p.ep.eng.mu
func (p *peer) noteAck(ack uint32, now int64) bool {
	if !p.moves(ack) {
		return false
	}
	if p.ackQueued {
		if ack-p.acked > p.ackIn-p.acked {
			p.ackIn, p.ackInAt = ack, now
		}
		return false
	}
	p.ackIn, p.ackInAt, p.ackQueued = ack, now, true
	return true
}

// settle processes the ack noteAck recorded, if any.
//
// +checklocks:p.ep.eng.mu
func (p *peer) settle() {
	if p.takeAck() && (p.sendHead != nil || p.recovering) {
		// Now, not when the ack came (milliseconds ago, when it waited
		// for the background goroutine): the frames the window lets go
		// leave now, and their timeouts count from then.
		p.pump(p.ep.eng.readClock())
	}
}

// takeAck processes the ack noteAck recorded, if any, but leaves the send
// queue to its caller; it reports whether the window moved.
//
// +checklocks:p.ep.eng.mu
func (p *peer) takeAck() bool {
	if !p.ackQueued {
		return false
	}
	p.ackQueued = false
	return p.ackUpTo(p.ackIn, p.ackInAt)
}

// moves reports whether cumulative ack ack moves the send window: it is
// neither old nor beyond the frames in flight.
func (p *peer) moves(ack uint32) bool {
	n := ack - p.acked
	return n != 0 && n <= p.inFlight()
}

// acks reports whether frame seq is covered by an ack noteAck recorded.
func (p *peer) acks(seq uint32) bool {
	return p.ackQueued && seq-p.acked < p.ackIn-p.acked
}

// ackUpTo releases the window slots below ack and completes the messages
// whose last frame it acknowledges; it reports whether the window moved.
//
// +checklocks:p.ep.eng.mu
func (p *peer) ackUpTo(ack uint32, now int64) bool {
	if !p.moves(ack) {
		return false
	}
	e := p.ep
	flight := p.inFlight() // frames acked per round trip: samples per round trip
	for seq := p.acked; seq != ack; seq++ {
		s := p.slot(seq)
		if s.retries == 0 && !s.sacked && !s.stamp && !s.retimed {
			p.rttSample(now-s.sentAt, flight)
		}
		if r := s.req; r != nil {
			r.unacked--
			if s.last && !r.rndv && r.unacked == 0 && !r.done {
				r.status.XferLen = r.length
				e.complete(r, Success)
			}
		}
		s.used, s.req, s.sacked = false, nil, false
		e.eng.releaseSlot(s)
		p.grow()
	}
	p.acked = ack
	p.lastHeard = max(p.lastHeard, now)
	return true
}

// detach unlinks r from the window slots that still name it, so that it
// can complete and be reused while they wait for their acks.
//
// +checklocks:p.ep.eng.mu
func (p *peer) detach(r *request) {
	for seq := p.acked; seq != p.nextSeq && r.unacked > 0; seq++ {
		if s := p.slot(seq); s.req == r {
			s.req = nil
			r.unacked--
		}
	}
}

// rttSample updates the round-trip estimate (RFC 6298) from one sample
// and derives the retransmission timeout. Every frame acked is a sample,
// and a window of n frames in flight gives n of them per round trip: the
// gains are divided by n (RFC 7323, appendix G), so that the estimate
// forgets a spike of delay over round trips, as with one sample per
// round trip, not over the frames of one (the next spike would then find
// the timeout back at the usual round trip, and fire spuriously).
func (p *peer) rttSample(rtt int64, n uint32) {
	if rtt <= 0 {
		rtt = 1
	}
	k := int64(max(n, 1))
	if p.srtt == 0 {
		p.srtt = rtt
		p.rttvar = rtt / 2
	} else {
		d := p.srtt - rtt
		if d < 0 {
			d = -d
		}
		p.rttvar += (d - p.rttvar) / (4 * k)
		p.srtt += (rtt - p.srtt) / (8 * k)
	}
	cfg := &p.ep.cfg
	p.rto = min(max(p.srtt+4*p.rttvar, int64(cfg.MinRTO)), int64(cfg.MaxRTO))
}

// pullSample updates the estimate of a pull block's time from a block that
// came back without a re-request.
func (p *peer) pullSample(t int64) {
	t = max(t, 1)
	if p.pullSRTT == 0 {
		p.pullSRTT, p.pullVar = t, t/2
		return
	}
	d := p.pullSRTT - t
	if d < 0 {
		d = -d
	}
	p.pullVar = (3*p.pullVar + d) / 4
	p.pullSRTT = (7*p.pullSRTT + t) / 8
}

// pullTimeout is how long a pull block may go without a frame before its
// missing frames are asked for again: the reliable channel's RTO, or more
// when blocks have been taking longer than that.
func (p *peer) pullTimeout() int64 {
	return max(p.rto, p.pullSRTT+4*p.pullVar)
}

// onSack marks frames the receiver holds out of order and retransmits the
// holes below them that have been out longer than a round trip.
//
// +checklocks:p.ep.eng.mu
func (p *peer) onSack(ack uint32, sack []byte, now int64) {
	if len(sack) == 0 || ack != p.acked {
		return
	}
	highest := -1
	for i := 0; i < len(sack)*8; i++ {
		if sack[i/8]&(1<<(i%8)) == 0 {
			continue
		}
		seq := ack + 1 + uint32(i)
		if seq-p.acked >= p.inFlight() {
			break
		}
		p.slot(seq).sacked = true
		highest = i
	}
	// Frames below the highest sacked one that are not held were lost.
	quiet := max(p.srtt, int64(100*time.Microsecond))
	for i := -1; i < highest; i++ {
		seq := ack + 1 + uint32(i)
		s := p.slot(seq)
		if s.used && !s.sacked && !s.stamp && now-s.sentAt > quiet {
			p.retransmit(s, now)
			p.lost(now)
		}
	}
}

// minCwnd is the fewest frames a peer's congestion window lets out at
// once.
const minCwnd = 2

// grow opens the congestion window for one frame acked.
func (p *peer) grow() {
	switch {
	case p.cwnd >= uint32(len(p.win)):
	case p.cwnd < p.ssthresh:
		p.cwnd++
	default:
		if p.cwndAcked++; p.cwndAcked >= p.cwnd {
			p.cwnd, p.cwndAcked = p.cwnd+1, 0
		}
	}
}

// lost halves the congestion window for frames a selective ack found
// lost, once per round trip: the losses of one flood are one event.
//
// +checklocks:p.ep.eng.mu
func (p *peer) lost(now int64) {
	if p.cwndCutAt != 0 && now-p.cwndCutAt < max(p.srtt, int64(p.ep.cfg.MinRTO)) {
		return
	}
	p.cwnd, p.cwndAcked, p.cwndCutAt = max(p.cwnd/2, minCwnd), 0, now
	p.ssthresh = p.cwnd
	p.ep.stats.CwndCuts++
}

// timedOut handles the timeout of a frame in flight: nothing came back
// for a whole timeout, so every frame in flight is presumed lost. The
// window shrinks to minCwnd (ssthresh to half the frames in flight, so
// that a timeout repeated while a partition lasts does not leave it
// small once the path heals), and a recovery resends the frames from the
// oldest, cwnd at a time, each ack letting more go (recover). A timeout
// during a recovery starts it again from the oldest frame.
//
// +checklocks:p.ep.eng.mu
func (p *peer) timedOut(now int64) {
	p.ssthresh = max(p.inFlight()/2, minCwnd)
	p.cwnd, p.cwndAcked, p.cwndCutAt = minCwnd, 0, now
	p.ep.stats.CwndCuts++
	p.recovering, p.rexmitNext, p.recoverEnd = true, p.acked, p.nextSeq
	p.recover(now)
}

// recover resends the frames of a recovery (timedOut) while cwnd has
// room for them: the frames from the oldest in flight to rexmitNext
// count as in flight again.
//
// +checklocks:p.ep.eng.mu
func (p *peer) recover(now int64) {
	if !p.recovering {
		return
	}
	if p.rexmitNext-p.acked > p.inFlight() {
		p.overtaken(now)
		return
	}
	if p.recoverEnd-p.acked > p.inFlight() {
		p.recovering = false // every frame of the recovery is acked
		return
	}
	for p.rexmitNext-p.acked < p.cwnd {
		if p.rexmitNext == p.recoverEnd {
			p.recovering = false
			return
		}
		if s := p.slot(p.rexmitNext); p.resendable(p.rexmitNext, s) {
			p.retransmit(s, now)
		}
		p.rexmitNext++
	}
}

// overtaken ends a recovery that acks overtook: they acknowledge frames
// it had not resent yet, which came through. The timeout was early (the
// frames waited in a queue longer than it: the acks' round trips raise
// it) or the receiver held them behind the one resent. Either way the
// rest of the flight is not presumed lost any more (as F-RTO, RFC 5682,
// concludes): its frames are timed afresh from now, selective acks and
// timeouts find those really lost, and the window goes back to half the
// flight (ssthresh) rather than growing from minCwnd.
//
// +checklocks:p.ep.eng.mu
func (p *peer) overtaken(now int64) {
	p.recovering = false
	p.cwnd, p.cwndAcked = max(p.cwnd, p.ssthresh), 0
	end := p.recoverEnd
	if end-p.acked > p.inFlight() {
		end = p.acked // all of it acked
	}
	for seq := p.acked; seq != end; seq++ {
		if s := p.slot(seq); s.used && !s.stamp {
			s.sentAt, s.retimed = now, true
		}
	}
}

// timeouts starts a recovery (timedOut) if a frame timed out, and
// returns when the next one times out. The frames timed are the
// resendable ones a recovery is not yet to resend.
//
// +checklocks:p.ep.eng.mu
func (p *peer) timeouts(now int64) int64 {
	p.recover(now) // acks taken without a pump (nextSlot) may have made room
	for pass := 0; ; pass++ {
		due, expired := int64(0), false
		for seq := p.acked; seq != p.nextSeq && !p.awaitsRecovery(seq); seq++ {
			s := p.slot(seq)
			if !p.resendable(seq, s) {
				continue
			}
			t := s.sentAt + p.rtoFor(s)
			if now >= t {
				// Not resent (still on its way out): timed from now.
				expired, t = true, now+p.rtoFor(s)
			}
			if due == 0 || t < due {
				due = t
			}
		}
		if !expired || pass > 0 {
			return due
		}
		p.timedOut(now)
	}
}

// resendable reports whether the frame of slot s, sequence number seq,
// is one that a timeout times and a recovery resends: in flight, handed
// to the link (stamped), and not held by the receiver, but for the
// oldest: a selective ack is advisory, the receiver may drop a frame it
// held when it refuses an eager message it has no room for.
func (p *peer) resendable(seq uint32, s *txSlot) bool {
	return s.used && !s.stamp && (!s.sacked || seq == p.acked)
}

// awaitsRecovery reports whether frame seq, in flight, waits for a
// recovery to resend it: it is not timed meanwhile. The oldest frame is
// always timed, so that a recovery whose acks are lost starts again.
func (p *peer) awaitsRecovery(seq uint32) bool {
	return p.recovering && seq != p.acked && seq-p.acked >= p.rexmitNext-p.acked
}

// retransmit sends a window slot's frame again with the current ack and
// receive window (the peer takes the window of every frame it hears: the
// first send's could lift a limit said since).
//
// +checklocks:p.ep.eng.mu
func (p *peer) retransmit(s *txSlot, now int64) {
	if s.pending > 0 {
		return // still on its way out
	}
	setAck(s.buf, p.expected)
	g := p.ep.eng
	setWindow(s.buf, g.recvWindow)
	p.saidWin = g.recvWindow
	p.ackSent()
	s.sentAt = now
	s.retries++
	p.retx++
	p.ep.stats.Retransmits++
	p.ep.eng.queue(s.buf[:s.n], s)
}

// pump frames queued messages while the window has room.
//
// +checklocks:p.ep.eng.mu
func (p *peer) pump(now int64) {
	e := p.ep
	p.recover(now) // the frames presumed lost go first
	for r := p.sendHead; r != nil; r = p.sendHead {
		if !e.frameMessage(p, r, now) {
			return
		}
		p.removeSend(r)
	}
}

// runTimers retransmits, sends delayed acks and keepalives, and declares
// the peer dead when it stopped answering. It returns when it next needs
// to run (0: no timer).
//
// +checklocks:p.ep.eng.mu
func (p *peer) runTimers(now int64) int64 {
	p.settle()
	e := p.ep
	cfg := &e.cfg
	next := int64(0)
	at := func(t int64) {
		if t != 0 && (next == 0 || t < next) {
			next = t
		}
	}
	if p.ackDue != 0 {
		if now >= p.ackDue {
			p.sendAck()
		} else {
			at(p.ackDue)
		}
	}
	if p.inFlight() > 0 {
		// A peer is dead when it has been silent for GiveUp while we wait
		// for it; a slow receiver that keeps answering is not.
		// A frame not stamped yet is on its way out: nothing to time.
		oldest := p.slot(p.acked)
		if !oldest.stamp {
			since := max(p.lastHeard, oldest.firstSent)
			if now-since > int64(cfg.GiveUp) {
				p.die(now)
				return 0
			}
			// On time: retries back off, and may come long after.
			at(giveUpAt(since, cfg.GiveUp))
		}
		at(p.timeouts(now))
	}
	// Keepalive while we wait on the peer for something other than acks
	// (a notify, pull data, the rest of an eager message): a dead peer
	// must not leave requests hanging.
	if p.waitsOn() {
		if !p.waiting {
			// Silence counts from the start of the wait, not from the
			// last frame of an idle connection.
			p.waiting, p.waitStart = true, now
		}
		since := max(p.lastHeard, p.waitStart)
		if now-since > int64(cfg.GiveUp) {
			p.die(now)
			return 0
		}
		if now-p.lastHeard > int64(cfg.KeepaliveInterval) && now-p.kaSent > int64(cfg.KeepaliveInterval) {
			p.kaSent = now
			p.sendCtl(tKeepalive, flagWantAck, nil)
		}
		at(max(p.lastHeard, p.kaSent) + int64(cfg.KeepaliveInterval))
		at(giveUpAt(since, cfg.GiveUp)) // a GiveUp below KeepaliveInterval too
	} else {
		p.waiting = false
	}
	return next
}

// giveUpAt is when a peer silent since since is given up (the test is
// "more than GiveUp": one nanosecond past it), saturating for a GiveUp of
// "never".
func giveUpAt(since int64, giveUp time.Duration) int64 {
	if since > math.MaxInt64-int64(giveUp)-1 {
		return math.MaxInt64
	}
	return since + int64(giveUp) + 1
}

// waitsOn reports whether we wait on the peer for something other than
// acks: the notify of a rendezvous, pull data, or the rest of an eager
// message whose first fragments arrived.
func (p *peer) waitsOn() bool { return p.rndvs > 0 || p.pulls > 0 || p.in.active }

// rtoFor is the timeout of a slot after its retries (exponential backoff).
func (p *peer) rtoFor(s *txSlot) int64 {
	return min(backoff(p.rto, int(s.retries)), int64(p.ep.cfg.MaxRTO))
}

// backoff is timeout d doubled per retry, at most 10 times, saturating
// (MaxRTO may be "never", 2^62 ns).
func backoff(d int64, retries int) int64 {
	k := min(retries, 10)
	if d > math.MaxInt64>>k {
		return math.MaxInt64
	}
	return d << k
}

// die declares the peer unreachable: every pending operation with it
// completes with Unreachable, and sends fail until it is connected again.
//
// +checklocks:p.ep.eng.mu
func (p *peer) die(now int64) {
	p.ep.stats.PeersDead++
	p.reset(Unreachable)
	p.dead = true
}
