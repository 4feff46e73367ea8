package msglayer

import "time"

// Receive windows: a receiver's flow control of its senders.
//
// A link holds a bounded number of received frames (xdp.RxBudget: on
// AF_XDP, the receive half of the UMEM): frames that come faster than the
// driver takes them wait there, and beyond the bound the kernel drops
// them. One sender's window (Config.Window, its congestion window) cannot
// see that bound, and many senders' windows together exceed it: 128 clients
// with two 32 KiB eager messages each in flight are 5,900 frames toward a
// server whose ring holds 2,048, and the frames dropped come back as
// retransmissions, many of them of frames that were only queued.
//
// So the engine shares a budget of frames in flight toward it
// (Config.RecvBudget) among the peers heard from lately (activeSpan), and
// says each peer's share, its receive window, in every
// frame it sends (the common header's window byte). A sender keeps no more
// reliable frames in flight to a peer than the last window the peer said
// (peer.sendLimit). A share of 256 frames or more is said as 0, no limit,
// so that a lone sender runs on its own window, and a share is never below
// minRecvWindow: more peers than the budget holds at that share are allowed
// over it, and their losses are recovered as before.
//
// The peers counted are those heard from (any frame, a connect included)
// within the last activeSpan: a census every censusPeriod counts them
// afresh, and a peer that sends a reliable frame or connects meanwhile,
// which the last census did not count, is added at once. A crowd
// arriving thus shrinks the share at its first frames; one leaving
// widens it activeSpan later.
//
// A sender knows only the last window said to it, and one that sends
// steadily hears it in every ack. But the first to connect of a crowd
// were said large windows (shares of few), and each of them may send a
// whole burst by it before a frame of ours comes back. So when the window
// comes down to half or less of what a counted sender was last said, that
// sender is told at once, in an explicit ack (sayShrunk): a burst goes by
// at most twice the share. A crowd of n arriving one by one costs about
// 2n such acks, as the share halves a few times.

// minRecvWindow is the smallest receive window said: twice the delayed
// acks' default count (Config.AckEvery; a larger count raises it), so
// that a sender at its window still has acks coming.
const minRecvWindow = 8

// activeSpan is how lately a peer must have been heard from to count as a
// sender: longer than the round trips of a loaded server (tens of
// milliseconds), over which a sender with data is heard from at least
// once.
const activeSpan = int64(100 * time.Millisecond)

// censusPeriod is how often the senders are counted afresh.
const censusPeriod = int64(10 * time.Millisecond)

// recvState is an engine's receive-window bookkeeping, but for what the
// frame path reads (engine.recvWindow, engine.census). Guarded by the
// engine lock.
type recvState struct {
	// budget: frames in flight from all peers together (0: no window is
	// said).
	budget int
	// nextCensus is when the next census is due (0: none is: no sender
	// was counted since the last found none); it is among the timers
	// (engine.nextTimer).
	nextCensus int64
	senders    int // peers the last census counted, and those counted since
	divisor    int // peers the window was computed for
}

// initRecvWindow sets up the budget: given frames if given (-1: none),
// else three quarters of what the link holds (frames), if it says (0:
// it does not).
//
// +checklocksignore: the engine is being built.
func (g *engine) initRecvWindow(given, frames int) {
	s := &g.recv
	switch {
	case given > 0:
		s.budget = given
	case given == 0:
		s.budget = frames * 3 / 4
	}
	g.census = 1
	g.setDivisor(1)
}

// setDivisor computes the window for n peers sending at once.
//
// +checklocks:g.mu
func (g *engine) setDivisor(n int) {
	s := &g.recv
	n = max(n, 1)
	s.divisor = n
	share := s.budget / n
	old := g.recvWindow
	switch {
	case s.budget == 0 || share >= 256:
		g.recvWindow = 0
	default:
		// Never below twice the delayed acks' count of any endpoint:
		// a sender at its window still has acks coming.
		least := minRecvWindow
		for _, e := range g.epList {
			least = max(least, 2*e.cfg.AckEvery)
		}
		g.recvWindow = uint8(min(max(share, least), 255))
	}
	if w := g.recvWindow; w != 0 && (old == 0 || w < old) {
		g.sayShrunk(w)
	}
}

// sayShrunk sends the window w, smaller than the last one, in an explicit
// ack to each peer counted as a sender that was last said a window of at
// least twice w (or no limit).
//
// +checklocks:g.mu
func (g *engine) sayShrunk(w uint8) {
	for _, e := range g.epList {
		if e.closed {
			continue
		}
		for _, p := range e.peers {
			said := int(p.saidWin)
			if said == 0 {
				said = 256 // no limit
			}
			if p.census == g.census && p.connected && !p.dead && p.local == nil && said >= 2*int(w) {
				p.sendAck()
			}
		}
	}
}

// noteSender counts p, which sent a reliable frame or connected at now,
// if the last census did not: the window shrinks at once when there are
// more senders than it was computed for. The census finds it by
// p.lastHeard, which the caller has set.
//
// +checklocks:g.mu
func (g *engine) noteSender(p *peer, now int64) {
	if p.census == g.census {
		return
	}
	s := &g.recv
	if s.budget == 0 {
		return
	}
	p.census = g.census
	if s.senders++; s.senders > s.divisor {
		g.setDivisor(s.senders)
	}
	if s.nextCensus == 0 {
		s.nextCensus = now + censusPeriod
		if g.nextTimer == 0 || s.nextCensus < g.nextTimer {
			g.nextTimer = s.nextCensus
		}
	}
}

// takeCensus counts the senders afresh if a census is due: the peers of
// every endpoint heard from within activeSpan. The window is then
// computed for them. It returns when the next census is due (0: none, as
// none was counted).
//
// +checklocks:g.mu
func (g *engine) takeCensus(now int64) int64 {
	s := &g.recv
	if s.nextCensus == 0 || now < s.nextCensus {
		return s.nextCensus
	}
	g.census++
	s.senders = 0
	for _, e := range g.epList {
		for _, p := range e.peers {
			if p.lastHeard != 0 && now-p.lastHeard <= activeSpan {
				p.census = g.census
				s.senders++
			}
		}
	}
	g.setDivisor(s.senders)
	s.nextCensus = 0
	if s.senders > 0 {
		s.nextCensus = now + censusPeriod
	}
	return s.nextCensus
}

// sendLimit is how many reliable frames may be in flight to p: its
// congestion window, or the receive window p said if that is smaller.
func (p *peer) sendLimit() uint32 {
	if w := uint32(p.rwnd); w != 0 && w < p.cwnd {
		return w
	}
	return p.cwnd
}
