package msglayer

import (
	"math"
	"math/bits"
	"time"
)

// Rendezvous pulls. A large (or synchronous, or converted) message leaves
// only its record at the receiver; once a receive matches it, the
// receiver pulls the data in blocks of pullBlockFrames frames, several
// blocks in flight. The sender answers pull requests statelessly, from
// the send's buffers, and in order: each reply echoes the stamp of the
// request it answers, and the frames still missing from the blocks last
// asked for before a request whose reply brings a frame, or from a block
// when the last frame asked for comes, were lost and are asked for again
// (at once, or after the peer's reordering window if its replies were
// seen overtaken). A block that goes quiet is probed for its last missing
// frame. When
// everything arrived, the receiver sends a reliable notify and the send
// completes.

// pull is a receive pulling a rendezvous message. Owned by the endpoint
// (e.pulls), guarded by the engine lock.
type pull struct {
	id           uint32
	r            *request
	peer         *peer
	rndvID       uint32
	total        uint32 // bytes to pull: min(message, receive buffer)
	frameBytes   uint32
	next         uint32 // offset of the next block to request
	got          uint32 // bytes received
	lastProgress int64
	reqs         uint32 // the stamp of the pull's latest request (the requests sent)
	answered     uint32 // the latest stamp of a reply that stored a frame
	blocks       []pullBlock
	hint         int   // the block the last reply belonged to: most replies follow it
	waiting      int   // its index in engine.starved[waitList] while it waits for the pull budget, else -1
	waitList     int   // the list of engine.starved it waits in
	ended        bool  // endPull ran: its timer, if already taken out to run, stays idle
	tm           timer // in the endpoint's timers while blocks are in flight
}

// delivered is the length of the prefix of the data that has arrived:
// the blocks below next, but for those still in flight.
func (pl *pull) delivered() uint32 {
	d := pl.next
	for i := range pl.blocks {
		if b := &pl.blocks[i]; b.active && b.offset < d {
			d = b.offset
		}
	}
	return d
}

type pullBlock struct {
	active         bool
	frames         int // frames of the block, counted in the engine's budget
	offset, length uint32
	want           uint32 // frames still missing
	sentAt         int64  // last (re-)request or probe
	firstSent      int64  // first request
	retries        int
	backoffs       int    // probes since the block's last frame: they back its timeout off
	probe          uint32 // the frame a probe asked for again, until it comes
	req            uint32 // the stamp of the block's latest request or probe
	asked          uint32 // the stamp of its latest request for all its missing frames (not a probe)
	tail           uint32 // the last frame that request asked for
	suspect        int64  // when frames of the block were found missing behind later ones; 0: none
	inferred       bool   // the latest request asks for frames found missing so: the next frame stored tells whether they were lost
	lost           bool   // frames of the block were found lost and asked for again
}

// probedBlock is a block that completed after probes of one frame and
// no frame found lost. Its time counts only if the probes were needless:
// the sender was slow, not lossy, and the probed frame comes once more
// for each probe. (Had the first copy been lost, one fewer would come.)
type probedBlock struct {
	pullID uint32
	offset uint32 // of the probed frame
	copies int    // copies of it still to come
	took   int64
}

// due is when the block is probed by its timer: when the pull has gone
// without any frame for the peer's pull timeout, counted from the block's
// request or from the pull's last frame, whichever is later. While frames
// of the pull flow, the sender is working through the requests in order,
// and a block waiting behind others is not probed; a block whose frames
// were lost is found sooner, when the last frame its request asked for or
// a reply to a later request arrives (onPullReply).
//
// The timeout is backed off per probe since the block's last frame: a
// silent peer is asked less and less often, but a frame's arrival shows
// the peer answers, and the next loss waits the plain timeout again.
// (Backed off per probe over the block's life, a block at 20 % loss went
// through 3 to 4 probes and waited up to MaxRTO: in BenchmarkPullLossMem
// at 20 % loss, a 1 MiB message took 1.77 s with one block in flight and
// 114 ms with 16; backed off only while silent, 0.35 s and 14 ms.)
func (b *pullBlock) due(pl *pull, maxRTO int64) int64 {
	return max(b.sentAt, pl.lastProgress) + min(backoff(pl.peer.pullTimeout(), b.backoffs), maxRTO)
}

// reRequestOvertaken asks again for the missing frames of the blocks last
// asked for before the request with stamp k, whose first reply just
// arrived: the sender answers a peer's requests in order, so their frames
// were lost. (Asked for again, a block's latest request is later than k.)
//
// +checklocks:e.eng.mu
func (e *Endpoint) reRequestOvertaken(pl *pull, k uint32, now int64) {
	for i := range pl.blocks {
		b := &pl.blocks[i]
		if b.active && b.want != 0 && int32(b.req-k) < 0 {
			e.foundMissing(pl, b, now)
		}
	}
}

// foundMissing takes block b's missing frames, asked for before frames
// that came, for lost: they are asked for again at once, or, on a link
// seen to reorder the peer's replies, once the peer's reordering window
// has passed without them (pullTimers).
//
// +checklocks:e.eng.mu
func (e *Endpoint) foundMissing(pl *pull, b *pullBlock, now int64) {
	if reo := pl.peer.pullReo; reo != 0 {
		if b.suspect == 0 {
			b.suspect = now
			e.arm(&pl.tm, now+reo)
		}
		return
	}
	e.reRequestLost(pl, b, now)
}

// reRequestLost asks again for the missing frames of block b, found lost.
//
// +checklocks:e.eng.mu
func (e *Endpoint) reRequestLost(pl *pull, b *pullBlock, now int64) {
	b.retries++
	b.lost = true
	e.stats.PullReRequests++
	e.sendPullReq(pl, b, now)
	b.inferred = true
}

// reordered adapts p's reordering window to what a block's inference of
// lost frames proved, at the first frame stored after it: a copy from an
// earlier request came, so the frames were not lost but overtaken (the
// window doubles, from a quarter of the round trip, up to half the pull
// timeout); or the new request's, so they were (the window shrinks by an
// eighth, and closes below half its floor). On a link that does not
// reorder, the window stays closed and a loss is asked for again at
// once; one that reorders pays the window instead of the frames twice.
// (In BenchmarkPullLossMem, 16 blocks, jitter 200 µs: 45 frames per 1 MiB
// message came twice, against 688 with no window and 73 before the
// stamps; with 5 % loss too, the message took 21.6 ms, 6.4 ms and 30.5.
// Grown by a quarter round trip at a time instead, up to one, it took
// 15.8 ms and 128 frames came twice, 125 with jitter alone.)
func (p *peer) reordered(overtaken bool) {
	floor := max(p.srtt/4, int64(10*time.Microsecond))
	if overtaken {
		p.pullReo = min(max(2*p.pullReo, floor), p.pullTimeout()/2)
		return
	}
	if p.pullReo -= p.pullReo / 8; p.pullReo < floor/2 {
		p.pullReo = 0
	}
}

// probeBlock asks again for the last missing frame of a block whose pull
// went quiet: a tail-loss probe. The sender answers a peer's requests in
// order, so the probe's frame comes after every frame the block's request
// will ever bring: the frames still missing then were lost, and are asked
// for (onPullReply). A sender that was only slow (descheduled, its queue
// long) costs one frame sent twice rather than the block.
//
// +checklocks:e.eng.mu
func (e *Endpoint) probeBlock(pl *pull, b *pullBlock, now int64) {
	b.retries++
	b.backoffs++
	e.stats.PullProbes++
	probe := uint32(1) << (31 - bits.LeadingZeros32(b.want))
	e.pullReq(pl, b, probe, now)
	b.probe = probe
}

// startPull begins pulling total bytes of rendezvous rndvID from p into r.
//
// +checklocks:e.eng.mu
func (e *Endpoint) startPull(r *request, p *peer, rndvID, total uint32, now int64) {
	id := freeID(e, e.pulls)
	pl := &pull{
		id:           id,
		r:            r,
		peer:         p,
		rndvID:       rndvID,
		total:        total,
		frameBytes:   uint32(p.pullPayload()),
		lastProgress: now,
		blocks:       make([]pullBlock, e.cfg.PullBlocks),
	}
	pl.tm = timer{slot: -1, pull: pl}
	pl.waiting = -1
	r.pull = pl
	e.pulls[pl.id] = pl
	p.pulls++
	e.stats.Pulls++
	e.requestBlocks(pl, now)
	e.arm(&p.tm, now+p.rto) // the peer's keepalives while we pull from it
}

// requestBlocks asks for new blocks while fewer than PullBlocks are in
// flight.
//
// +checklocks:e.eng.mu
func (e *Endpoint) requestBlocks(pl *pull, now int64) {
	g := e.eng
	for i := range pl.blocks {
		b := &pl.blocks[i]
		if b.active || pl.next >= pl.total {
			continue
		}
		if !g.budgetLeft() {
			if pl.waiting < 0 {
				pl.waitList = 0
				if pl.next == 0 {
					pl.waitList = 1
				}
				pl.waiting = len(g.starved[pl.waitList])
				g.starved[pl.waitList] = append(g.starved[pl.waitList], pl)
				e.stats.PullBudgetWaits++
			}
			return
		}
		length := min(pl.frameBytes*pullBlockFrames, pl.total-pl.next)
		frames := int((length + pl.frameBytes - 1) / pl.frameBytes)
		g.pullFrames += frames
		pl.peer.host.frames += frames
		b.active = true
		b.firstSent = now
		b.offset = pl.next
		b.length = length
		b.frames = frames
		b.want = uint32(uint64(1)<<frames - 1)
		b.retries, b.backoffs = 0, 0
		b.lost = false
		pl.next += b.length
		e.sendPullReq(pl, b, now)
	}
}

// hostLoad is what the engine's pulls wait for from one host (MAC): the
// frames they asked it for and have not received, counted in the engine's
// pull budget too.
type hostLoad struct {
	frames int
	peers  int // records of the host's endpoints
}

// joinHost returns the load of host mac, for a new peer record there.
//
// +checklocks:g.mu
func (g *engine) joinHost(mac [6]byte) *hostLoad {
	h := g.hosts[mac]
	if h == nil {
		h = new(hostLoad)
		g.hosts[mac] = h
	}
	h.peers++
	return h
}

// leaveHost forgets p's share of its host's load: the host's record goes
// with its last peer's.
//
// +checklocks:g.mu
func (g *engine) leaveHost(p *peer) {
	h := p.host
	if h.peers--; h.peers == 0 && h.frames == 0 {
		delete(g.hosts, p.addr.MAC)
	}
}

// budgetLeft reports whether a pull may ask for a block now: while the
// frames asked for and not arrived are fewer than maxPullFrames. Every
// frame asked for lands in the link's receive ring, shared by all pulls of
// the engine: they ask for no more than it can hold, or the ring overflows
// and the frames are asked for again. The last block may go past the
// budget by less than a block, which the ring has room for (pullBudget):
// so the budget is used whole, whatever the sizes of the blocks waiting.
//
// +checklocks:g.mu
func (g *engine) budgetLeft() bool {
	return g.pullFrames < g.maxPullFrames
}

// releaseBlock returns a finished (or abandoned) block's frames to the
// engine's pull budget; it reports whether the block was under way.
//
// +checklocks:e.eng.mu
func (e *Endpoint) releaseBlock(pl *pull, b *pullBlock) bool {
	if !b.active {
		return false
	}
	b.active = false
	e.eng.pullFrames -= b.frames
	pl.peer.host.frames -= b.frames
	return true
}

// feedStarved gives the budget left to pulls waiting for it, those under
// way first.
//
// A pull keeps the frames its finished blocks free for its next blocks
// (onPullReply), and a pull under way gets the budget before one not
// started: few pulls are under way at once, each finishes sooner, and a
// sender's frames come in longer runs. (Handed to any waiting pull at each
// finished block, the budget had every message in flight pulled a block
// at a time: in the many-clients experiment at N=128 that cost 6 % of the
// goodput and 10 % more server CPU per message, medians of 8 alternating
// pairs.)
//
// Within each list, the budget goes to the better of two pulls taken at
// random (pickStarved): the one whose host has fewer frames asked for and
// not received. The cost does not grow with their number. (First come,
// first served spread each pull's blocks further apart in time: in the
// many-clients experiment, blocks overtaken by later ones of their pull,
// and so asked for again, rose sixfold.) The senders' hosts then share
// the work, and a host slow to answer (its process not running) is asked
// for less. Taken at random alone, the budget could pile up on a few
// client hosts, which then worked in turn while the others had nothing
// to send. In the many-clients experiment at N=128 (4 client hosts, 22
// messages pulled at a time out of 256 in flight): choosing a pull not
// started by its host's pulls under way led in 10 of 13 alternating
// pairs (by 8 % in the median pair), and choosing every pull by its
// host's frames led that in 7 of 9.
//
// +checklocks:e.eng.mu
func (e *Endpoint) feedStarved(now int64) {
	g := e.eng
	for k := range g.starved {
		for len(g.starved[k]) > 0 && g.budgetLeft() {
			pl := g.pickStarved(k)
			g.unstarve(pl)
			// The wait was ours, not the peer's: it does not count
			// towards giving up on the peer.
			pl.lastProgress = max(pl.lastProgress, now)
			pl.peer.ep.requestBlocks(pl, now)
		}
	}
}

// pickStarved chooses the pull of starved list k that gets the budget
// next: of two taken at random, the one whose host has fewer frames asked
// for and not received (the better of two random choices: it keeps the
// hosts' loads close, at the cost of a second draw).
//
// +checklocks:g.mu
func (g *engine) pickStarved(k int) *pull {
	list := g.starved[k]
	pl := list[g.randN(len(list))]
	if other := list[g.randN(len(list))]; other.peer.host.frames < pl.peer.host.frames {
		pl = other
	}
	return pl
}

// unstarve takes pl out of the pulls waiting for budget.
//
// +checklocks:g.mu
func (g *engine) unstarve(pl *pull) {
	list := g.starved[pl.waitList]
	i, last := pl.waiting, len(list)-1
	moved := list[last]
	list[i], moved.waiting = moved, i
	list[last] = nil
	g.starved[pl.waitList] = list[:last]
	pl.waiting = -1
}

// sendPullReq asks for the missing frames of a block.
//
// +checklocks:e.eng.mu
func (e *Endpoint) sendPullReq(pl *pull, b *pullBlock, now int64) {
	b.probe = 0
	e.pullReq(pl, b, b.want, now)
	b.asked = b.req
}

// pullReq asks for the frames of block b in mask.
//
// +checklocks:e.eng.mu
func (e *Endpoint) pullReq(pl *pull, b *pullBlock, mask uint32, now int64) {
	b.sentAt = now
	pl.reqs++
	b.req = pl.reqs
	b.tail = uint32(1) << (31 - bits.LeadingZeros32(mask))
	b.suspect, b.inferred = 0, false
	e.armPull(pl, b)
	e.stats.PullRequests++
	req := pullReqHdr{rndvID: pl.rndvID, pullID: pl.id, offset: b.offset, length: b.length,
		mask: mask, frameBytes: pl.frameBytes}
	var flags uint8
	if r := pl.r; r.kind == kindGet {
		// A Get pulls from a registered region of the peer.
		flags, req.key, req.base = flagRegion, r.regionKey, r.regionOff
	}
	p := pl.peer
	p.sendCtlSeq(tPullReq, b.req, flags, func(th []byte) int {
		req.put(th)
		// The delayed acks the endpoint owes other endpoints of p's host
		// ride along, as in a bundle (tAcks): a server whose receives
		// are all taken acks the records of the clients it pulls from
		// next without frames, or wake-ups, of their own.
		return p.bundleAcks(th[pullReqHdrLen:], ackRoom(p.mtu, pullReqHdrLen), true)
	})
}

// armPull makes pl's timer run when block b is due, or at the give-up,
// at the latest.
//
// +checklocks:e.eng.mu
func (e *Endpoint) armPull(pl *pull, b *pullBlock) {
	e.arm(&pl.tm, min(b.due(pl, int64(e.cfg.MaxRTO)), e.pullGiveUpAt(pl)))
}

// onPullReq answers a pull request with the frames it asks for, from a
// rendezvous send or (flagRegion) from a registered region.
//
// +checklocks:e.eng.mu
func (e *Endpoint) onPullReq(p *peer, h *header, th []byte) {
	var req pullReqHdr
	req.decode(th)
	fb := req.frameBytes
	end := uint64(req.offset) + uint64(req.length)
	if fb == 0 || fb > uint32(e.maxPullPayload()) {
		e.stats.BadFrames++
		return
	}
	var src *request
	if h.flags&flagRegion != 0 {
		// Check the whole block once: id, key and bounds.
		if err := e.regLookup(req.rndvID, req.key, req.base+uint64(req.offset), uint64(req.length)); err != nil ||
			req.base+uint64(req.offset) < req.base {
			e.stats.RegionRefused++
			e.nack(p, req.pullID, nackBadRegion)
			return
		}
	} else {
		r := e.rndvs[req.rndvID]
		if r == nil || r.peer != p {
			e.nack(p, req.rndvID, nackBadRndv)
			return
		}
		if end > uint64(r.length) {
			e.stats.BadFrames++
			return
		}
		src = r
	}
	g := e.eng
	hdr, first := uint32(0), true
	for i := uint32(0); i < pullBlockFrames; i++ {
		if req.mask&(1<<i) == 0 {
			continue
		}
		off := uint64(req.offset) + uint64(i)*uint64(fb)
		if off >= end {
			break
		}
		n := int(min(uint64(fb), end-off))
		ph := pullReplyHdr{pullID: req.pullID, offset: uint32(off)}
		if src != nil {
			// Built at send time, straight from the send's data into the
			// link's memory: the replies share the first one's headers
			// (the builder writes each one's offset and length).
			if first {
				var b *pullHdr
				b, hdr = g.queuePullHdr()
				ph.put(p.putHeader(b[:], tPullReply, h.seq, 0, n))
				first = false
			}
			g.queuePullReply(src, uint32(off), n, hdr)
			if src.zbuf != nil { // zbuf: the engine lends buffers, so the gather path sends it
				e.stats.GatheredReplies++
			}
		} else {
			// From a region: copied now, holding the region (an unmap
			// waits for the copy).
			mem, reg, err := e.regHold(req.rndvID, req.key, req.base+off, uint64(n))
			if err != nil {
				e.stats.RegionRefused++
				e.nack(p, req.pullID, nackBadRegion)
				break
			}
			b := g.scratchBuf()
			th := p.putHeader(b, tPullReply, h.seq, 0, n)
			ph.put(th)
			copy(th[pullReplyHdrLen:pullReplyHdrLen+n], mem)
			reg.Unhold()
			g.queue(padded(b, tPullReply, n), nil)
		}
		e.stats.PullReplies++
		e.stats.FramesOut++
		e.stats.BytesOut += uint64(frameLen(tPullReply, n))
	}
	p.ackSent()
}

// onPullReply stores one frame of pulled data, a reply to the request
// with stamp k.
//
// +checklocks:e.eng.mu
func (e *Endpoint) onPullReply(p *peer, k uint32, th, payload []byte, now int64) {
	var ph pullReplyHdr
	ph.decode(th)
	if c := &p.probed; c.copies > 0 && c.pullID == ph.pullID && c.offset == ph.offset {
		c.copies--
		if c.copies == 0 {
			// Every probe was answered after the frame itself came: they
			// were needless, and the block's time was the sender's.
			p.pullSample(c.took)
		}
	}
	pl := e.pulls[ph.pullID]
	if pl == nil || pl.peer != p || ph.offset >= pl.total {
		e.stats.PullRepliesLate++ // the pull ended: a re-request was not needed
		return
	}
	for j := range pl.blocks {
		i := (pl.hint + j) % len(pl.blocks)
		b := &pl.blocks[i]
		if !b.active || ph.offset < b.offset || ph.offset >= b.offset+b.length {
			continue
		}
		pl.hint = i
		rel := ph.offset - b.offset
		if rel%pl.frameBytes != 0 {
			e.stats.BadFrames++ // no sender starts a frame there
			return
		}
		bit := uint32(1) << (rel / pl.frameBytes)
		if b.want&bit == 0 {
			e.stats.PullRepliesLate++
			return
		}
		n := min(pl.frameBytes, b.offset+b.length-ph.offset)
		if uint32(len(payload)) < n {
			// Shorter than the frame it stands for (a sender always
			// fills it): the frame stays wanted.
			e.stats.BadFrames++
			return
		}
		if r := pl.r; r.kind == kindPutTarget {
			// Our region: hold it for the copy; if it went away meanwhile
			// (deregistered, unmapped), the Put fails.
			mem, reg, err := e.regHold(r.regionID, r.regionKey, r.regionOff+uint64(ph.offset), uint64(n))
			if err != nil {
				e.stats.RegionRefused++
				e.sendNotify(p, pl.rndvID, 0, BadRegion, now)
				e.endPull(pl, BadRegion)
				return
			}
			copy(mem, payload[:n])
			reg.Unhold()
		} else {
			copyToSegs(pl.r.segs, int(ph.offset), payload[:n])
		}
		b.want &^= bit
		if b.backoffs != 0 {
			// The timer waits for the backed-off timeout: the next loss
			// waits the plain one.
			b.backoffs = 0
			e.armPull(pl, b)
		}
		pl.got += n
		pl.lastProgress = now
		if b.inferred {
			b.inferred = false
			p.reordered(k != b.req)
		}
		if int32(k-pl.answered) > 0 && int32(k-pl.reqs) <= 0 {
			// The first frame stored from a request later than those
			// answered so far. (Only a frame stored: replies that fill
			// nothing, copies that came already or frames the sender got
			// wrong, had two blocks ask for each other again without
			// end, with no timer between.)
			pl.answered = k
			e.reRequestOvertaken(pl, k, now)
		}
		if bit == b.tail && b.want != 0 && int32(k-b.asked) >= 0 {
			// The last frame the block's latest request asked for came,
			// in a reply to the block's latest request for all its
			// missing frames or to a probe since (a probe asks for the
			// last frame missing), and frames asked for before it did
			// not: the sender answers in order, so they were lost. (A
			// copy from an earlier request proves nothing on a link that
			// reorders: the later request's copies of the frames missing
			// may be on their way. Taken as proof, a block whose 32
			// frames came in reverse order was asked for 31 times. Taken
			// from the latest request only, a block probed twice, the
			// first probe's answer late, waited for a third probe.)
			e.foundMissing(pl, b, now)
		}
		if b.want == 0 {
			// A block asked for again is timed only when it proves to
			// have lost nothing. A block that lost frames waited for its
			// probe: timing it would grow the timeout the next loss waits
			// for with every loss, up to MaxRTO per loss. A block that
			// was probed and completed without a frame found lost either
			// lost only the probed frame, or had a slow sender: the
			// probed frame's later copies tell which (probedBlock).
			switch {
			case b.retries == 0:
				p.pullSample(now - b.firstSent)
			case !b.lost && b.probe != 0:
				p.probed = probedBlock{pullID: pl.id, copies: b.retries, took: now - b.firstSent,
					offset: b.offset + uint32(bits.TrailingZeros32(b.probe))*pl.frameBytes}
			}
			// The pull that freed the frames asks for its next block
			// first; only what it leaves goes to the pulls waiting.
			e.releaseBlock(pl, b)
			e.requestBlocks(pl, now)
			e.feedStarved(now)
		}
		if pl.got >= pl.total {
			if pl.r.kind != kindGet {
				e.sendNotify(p, pl.rndvID, pl.total, Success, now)
			}
			pl.r.status.XferLen = int(pl.total)
			e.endPull(pl, Success)
		}
		return
	}
	// No block asked for holds it: it belongs to one completed (a copy
	// that a re-request or a probe asked for), or to none we asked for.
	if ph.offset < pl.next {
		e.stats.PullRepliesLate++
	} else {
		e.stats.BadFrames++
	}
}

// pullGiveUpAt is when pull pl gives up on its peer if no data comes
// before (GiveUp after its last progress; saturated, for a GiveUp that
// means never). The pull's timer runs then at the latest (pullReq,
// pullTimers): a probe backed off past it (GiveUp below MaxRTO, or a
// first probe after a round trip longer than GiveUp) must not leave the
// give-up to be found only at that probe, by then perhaps after the peer
// came back and began a new exchange, which the give-up would tear down.
//
// +checklocks:e.eng.mu
func (e *Endpoint) pullGiveUpAt(pl *pull) int64 {
	g := int64(e.cfg.GiveUp)
	if pl.lastProgress > math.MaxInt64-1-g {
		return math.MaxInt64
	}
	return pl.lastProgress + g + 1
}

// pullTimers re-requests what did not come back in time and gives up on a
// silent peer; it returns when it next needs to run: the next probe, or
// the give-up, whichever is first.
//
// +checklocks:e.eng.mu
func (e *Endpoint) pullTimers(pl *pull, now int64) int64 {
	giveUp := e.pullGiveUpAt(pl)
	if now >= giveUp {
		pl.peer.die(now)
		return 0
	}
	next := int64(0)
	maxRTO := int64(e.cfg.MaxRTO)
	for i := range pl.blocks {
		b := &pl.blocks[i]
		if !b.active {
			continue
		}
		if b.suspect != 0 {
			if at := b.suspect + pl.peer.pullReo; now >= at {
				e.reRequestLost(pl, b, now)
			} else if next == 0 || at < next {
				next = at
			}
		}
		if now >= b.due(pl, maxRTO) {
			e.probeBlock(pl, b, now)
		}
		if t := b.due(pl, maxRTO); next == 0 || t < next {
			next = t
		}
	}
	if next == 0 {
		// Nothing in flight: the pull waits for the engine's pull
		// budget, a wait of ours that does not count (feedStarved).
		return 0
	}
	return min(next, giveUp)
}

// endPull finishes a pull and its receive with code.
//
// +checklocks:e.eng.mu
func (e *Endpoint) endPull(pl *pull, code Code) {
	if code != Success {
		pl.r.status.XferLen = int(pl.delivered())
	}
	delete(e.pulls, pl.id)
	pl.ended = true
	e.timers.remove(&pl.tm)
	if pl.waiting >= 0 {
		e.eng.unstarve(pl)
	}
	freed := false
	for i := range pl.blocks {
		freed = e.releaseBlock(pl, &pl.blocks[i]) || freed
	}
	if freed {
		e.feedStarved(e.eng.readClock())
	}
	pl.peer.pulls--
	pl.r.pull = nil
	e.complete(pl.r, code)
}

// onPut checks a peer's Put against our registry and pulls its data into
// the region, or refuses it with BadRegion.
//
// +checklocks:e.eng.mu
func (e *Endpoint) onPut(p *peer, ph *putHdr, now int64) {
	e.stats.PutsIn++
	if err := e.regLookup(ph.region, ph.key, ph.offset, uint64(ph.length)); err != nil {
		e.stats.RegionRefused++
		e.sendNotify(p, ph.putID, 0, BadRegion, now)
		return
	}
	if ph.length == 0 {
		e.sendNotify(p, ph.putID, 0, Success, now)
		return
	}
	r := e.newRequest(kindPutTarget, nil)
	r.forgotten = true
	r.regionID, r.regionKey, r.regionOff = ph.region, ph.key, ph.offset
	r.status.Source, r.status.MsgLen = p.addr, int(ph.length)
	e.startPull(r, p, ph.putID, ph.length, now)
}
