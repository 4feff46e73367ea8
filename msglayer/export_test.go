package msglayer

import (
	"context"
	"fmt"
	"time"

	"github.com/xmx-stack/xmx/xdp"
)

// FailAFXDP makes every AF_XDP open fail with err, as on a kernel or an
// interface without AF_XDP, until restore is called.
func FailAFXDP(err error) (restore func()) {
	old := openAFXDP
	openAFXDP = func(xdp.AFXDPConfig) (*xdp.AFXDPLink, error) { return nil, err }
	return func() { openAFXDP = old }
}

// DebugPeer describes the endpoint's reliable channel to a, for test
// failure messages.
func (e *Endpoint) DebugPeer(a Addr) string {
	e.eng.mu.Lock()
	defer e.eng.mu.Unlock()
	p := e.peers[a]
	if p == nil {
		return "no peer"
	}
	s := fmt.Sprintf("next %d acked %d expected %d ooo %d refused %v@%d rto %v sendq %v rndvs %d pulls %d nextTimer %d now %d\n",
		p.nextSeq, p.acked, p.expected, p.oooCount, p.refused, p.refusedSeq, p.rto, p.sendHead != nil, p.rndvs, p.pulls, e.nextTimer, e.eng.clock.Now())
	for seq := p.acked; seq != p.nextSeq && seq-p.acked < 12; seq++ {
		sl := &p.win[seq%uint32(len(p.win))]
		kind := ""
		if sl.req != nil {
			kind = fmt.Sprintf("req rndv=%v first=%v last=%v", sl.req.rndv, sl.first, sl.last)
		}
		s += fmt.Sprintf("  slot %d: used %v seq %d pending %d retries %d sacked %v sentAt %d %s\n", seq, sl.used, sl.seq, sl.pending, sl.retries, sl.sacked, sl.sentAt, kind)
	}
	return s
}

// EagerFrame decodes an eager data frame for tests that drop chosen
// frames: its sequence number, match info, offset, payload length and
// message length.
func EagerFrame(f []byte) (seq uint32, match uint64, offset, n, msgLen uint32, ok bool) {
	h, err := decodeHeader(f)
	if err != nil || h.typ != tEager {
		return 0, 0, 0, 0, 0, false
	}
	th, payload := typeHdr(f, &h)
	var eh eagerHdr
	if eh.decode(th, len(payload)) != nil {
		return 0, 0, 0, 0, 0, false
	}
	return h.seq, eh.match, eh.offset, uint32(len(payload)), eh.msgLen, true
}

// SetSeqBase makes the sessions of peers met from now on number their
// frames from base (0 normally) until restore is called.
func SetSeqBase(base uint32) (restore func()) {
	old := seqBase
	seqBase = base
	return func() { seqBase = old }
}

// DebugSeqs returns the endpoint's sequence numbers with peer a: the next
// to send, the oldest unacked, and the next expected.
func (e *Endpoint) DebugSeqs(a Addr) (next, acked, expected uint32) {
	e.eng.mu.Lock()
	defer e.eng.mu.Unlock()
	if p := e.peers[a]; p != nil {
		return p.nextSeq, p.acked, p.expected
	}
	return 0, 0, 0
}

// SetWaitAnyHook runs f in WaitAny between its look at the done queue and
// its wait (nil: nothing).
func SetWaitAnyHook(f func()) { testHookWaitAny = f }

// SetSleepHook runs f in the driver before each receive that may sleep in
// the kernel, with whether the background goroutine is the driver (nil:
// nothing).
func SetSleepHook(f func(background bool)) { testHookSleep = f }

// BackgroundDriving reports whether e's engine is driven by its background
// goroutine.
func BackgroundDriving(e *Endpoint) bool { return e.eng.bgDriving.Load() }

// DriveWanted reports how many API calls wait for e's engine's drive token.
func DriveWanted(e *Endpoint) int32 { return e.eng.wantDrive.Load() }

// PullReplyFrame decodes a pull reply frame for tests that drop or hold
// chosen frames: the offset of its data in the message.
func PullReplyFrame(f []byte) (offset uint32, ok bool) {
	h, err := decodeHeader(f)
	if err != nil || h.typ != tPullReply {
		return 0, false
	}
	th, _ := typeHdr(f, &h)
	var ph pullReplyHdr
	ph.decode(th)
	return ph.offset, true
}

// DebugPullBudget returns the frames the engine's pulls have asked for and
// not received, and the number of pulls waiting for that budget.
func (e *Endpoint) DebugPullBudget() (frames, starved int) {
	e.eng.mu.Lock()
	defer e.eng.mu.Unlock()
	return e.eng.pullFrames, len(e.eng.starved[0]) + len(e.eng.starved[1])
}

// DebugPullsUnderWay returns the number of the endpoint's pulls that
// have asked for data and not ended.
func (e *Endpoint) DebugPullsUnderWay() int {
	e.eng.mu.Lock()
	defer e.eng.mu.Unlock()
	n := 0
	for _, pl := range e.pulls {
		if pl.next > 0 {
			n++
		}
	}
	return n
}

// DebugHostFrames returns, per host, the frames the endpoint's engine
// asked it for and has not received (hosts with none left out).
func (e *Endpoint) DebugHostFrames() map[[6]byte]int {
	e.eng.mu.Lock()
	defer e.eng.mu.Unlock()
	m := map[[6]byte]int{}
	for mac, h := range e.eng.hosts {
		if h.frames != 0 {
			m[mac] = h.frames
		}
	}
	return m
}

// PickStarved builds an engine whose pulls waiting for budget (in list
// k) come from hosts with the given frames asked for (one pull per host,
// in order), makes its random draws return draws in turn, and returns the
// host index of the pull it picks next.
func PickStarved(k int, frames []int, draws []int) int {
	g := &engine{}
	hosts := make(map[*hostLoad]int)
	for i, n := range frames {
		h := &hostLoad{frames: n}
		hosts[h] = i
		g.starved[k] = append(g.starved[k], &pull{peer: &peer{host: h}, waiting: i, waitList: k})
	}
	g.randN = func(n int) int {
		d := draws[0]
		draws = draws[1:]
		return d % n
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	return hosts[g.pickStarved(k).peer.host]
}

// DebugPullTimeout returns how long a pull block from a may go without a
// frame before it is probed (before backoff).
func (e *Endpoint) DebugPullTimeout(a Addr) time.Duration {
	e.eng.mu.Lock()
	defer e.eng.mu.Unlock()
	if p := e.peers[a]; p != nil {
		return time.Duration(p.pullTimeout())
	}
	return 0
}

// SpinNow is how long the endpoint's engine polls before it sleeps.
func (e *Endpoint) SpinNow() time.Duration { return time.Duration(e.eng.spinFirst.Load()) }

// underToken runs set holding the engine's drive token. Drivers read the
// hooks below only while they hold it, the background goroutine among
// them, which may be driving already: taking the token orders the
// write before their next reads.
func (g *engine) underToken(set func()) {
	if !g.drive.tryTake() {
		if ok, err := g.takeTokenUnless(context.Background(), func() bool { return false }, nil, nil); !ok {
			panic(fmt.Sprintf("test hook: no drive token: %v", err))
		}
	}
	set()
	g.drive.release()
}

// SetSpinClock makes now the clock of the endpoint's engine's polls
// before sleeping. Call it before any wait of the test's traffic.
func (e *Endpoint) SetSpinClock(now func() int64) { e.eng.underToken(func() { e.eng.spinClock = now }) }

// SetYield makes yield what the endpoint's engine calls to give up the
// CPU while it polls before sleeping. Call it before any wait.
func (e *Endpoint) SetYield(yield func()) { e.eng.underToken(func() { e.eng.yield = yield }) }

// SetResched makes resched what the endpoint's engine calls to pass
// through Go's scheduler before a sleep.
func (e *Endpoint) SetResched(resched func()) { e.eng.underToken(func() { e.eng.resched = resched }) }

// LiveEngines returns the number of engines open in the process.
func LiveEngines() int { return int(liveEngines.Load()) }

// NextSpin is nextSpin, for its test.
var NextSpin = nextSpin

// The bounds of the adaptive poll.
const (
	MinAutoSpin    = minAutoSpin
	MaxAutoSpin    = maxAutoSpin
	AutoSpinWindow = autoSpinWindow
)

// HeldRetried returns how many same-process messages held at a receiver's
// MaxUnexpectedRndv bound the endpoint's engine took to hand over again.
func (e *Endpoint) HeldRetried() int {
	e.eng.mu.Lock()
	defer e.eng.mu.Unlock()
	return e.eng.heldRetried
}
