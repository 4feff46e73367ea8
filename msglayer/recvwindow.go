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
// (Config.RecvBudget) among the peers that sent it reliable frames lately
// (activeSpan), and says each peer's share, its receive window, in every
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
// which the last census did not count, is added at once. A crowd arriving thus shrinks the share at its
// first frames; one leaving widens it activeSpan later.

// minRecvWindow is the smallest receive window said: twice the delayed
// acks' default count (Config.AckEvery), so that a sender at its window
// still has acks coming.
const minRecvWindow = 8

// activeSpan is how lately a peer must have been heard from to count as a
// sender:
// longer than the round trips of a loaded server (tens of milliseconds),
// over which a sender with data is heard from at least once.
const activeSpan = int64(100 * time.Millisecond)

// censusPeriod is how often the senders are counted afresh.
const censusPeriod = int64(10 * time.Millisecond)

// recvState is an engine's receive-window bookkeeping. Guarded by the
// engine lock.
type recvState struct {
	// budget: frames in flight from all peers together (0: no window is
	// said).
	budget int
	// recvWindow is the window said in every frame (0: no limit).
	recvWindow uint8
	census     uint32 // the last census's number (from 1)
	nextCensus int64  // when the next one is due (the engine clock)
	senders    int    // peers that census counted, and those heard since
	divisor    int    // peers the window was computed for
}

// initRecvWindow sets up the budget: given frames if given (-1: none),
// else three quarters of what the link holds (frames), if it says (0:
// it does not).
func (s *recvState) initRecvWindow(given, frames int) {
	switch {
	case given > 0:
		s.budget = given
	case given == 0:
		s.budget = frames * 3 / 4
	}
	s.census = 1
	s.setDivisor(1)
}

// setDivisor computes the window for n peers sending at once.
func (s *recvState) setDivisor(n int) {
	n = max(n, 1)
	s.divisor = n
	share := s.budget / n
	switch {
	case s.budget == 0 || share >= 256:
		s.recvWindow = 0
	default:
		s.recvWindow = uint8(max(share, minRecvWindow))
	}
}

// noteSender counts p, which sent a reliable frame or connected, if the
// last census did not: the window shrinks at once when there are more
// senders than it was computed for. (The census finds it by
// p.lastHeard, which the caller has set.)
//
// +checklocks:g.mu
func (g *engine) noteSender(p *peer) {
	s := &g.recv
	if p.census == s.census || s.budget == 0 {
		return
	}
	p.census = s.census
	if s.senders++; s.senders > s.divisor {
		s.setDivisor(s.senders)
	}
}

// takeCensus counts the senders afresh once a census is due: the peers of
// every endpoint heard from within activeSpan. The window is then
// computed for them.
//
// +checklocks:g.mu
func (g *engine) takeCensus(now int64) {
	s := &g.recv
	if now < s.nextCensus || s.budget == 0 {
		return
	}
	s.census++
	s.nextCensus = now + censusPeriod
	s.senders = 0
	for _, e := range g.epList {
		for _, p := range e.peers {
			if p.lastHeard != 0 && now-p.lastHeard <= activeSpan {
				p.census = s.census
				s.senders++
			}
		}
	}
	s.setDivisor(s.senders)
}

// sendLimit is how many reliable frames may be in flight to p: its
// congestion window, or the receive window p said if that is smaller.
func (p *peer) sendLimit() uint32 {
	if w := uint32(p.rwnd); w != 0 && w < p.cwnd {
		return w
	}
	return p.cwnd
}
