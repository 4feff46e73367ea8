package msglayer

import (
	"context"
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/xmx-stack/xmx/xdp"
)

// The engine drives one link for every endpoint of this process on it.
//
// Pipeline: a driver (a goroutine waiting on a request, or the background
// goroutine when nobody waits) receives a batch of frames from the link,
// decodes each, and hands it to its endpoint under the engine lock; the
// handlers match messages, copy data, complete requests and queue answer
// frames (acks, pull replies, notifies) on the endpoint's transmit queue;
// the driver then runs the timers that are due (retransmissions, delayed
// acks, pull re-requests, keepalives) and flushes the transmit queues.
// API calls (Isend, Irecv...) take the same lock, queue frames and flush
// them themselves. At most one driver at a time holds the drive token.
//
// A goroutine holds one engine's lock at a time: the same-process path
// joins endpoints of one engine only.
type engine struct {
	key     string // in engines: the interface name or the given link
	link    xdp.Link
	waker   xdp.Waker            // nil if the link cannot be woken
	visitor xdp.FrameVisitor     // nil if the link cannot lend received frames
	prober  xdp.IdleProber       // nil if the link cannot tell it is idle without a syscall
	builder xdp.FrameBuilder     // nil if the link cannot build frames in place
	gather  xdp.BufferLink       // nil if the link cannot send from lent buffers
	tails   xdp.TailSender       // nil if the link's kernel cannot read tails where they lie
	checker xdp.InterfaceChecker // nil if the link cannot lose its interface
	// linkGone is set once the link said its interface is gone
	// (xdp.ErrInterfaceGone): no new endpoint joins the engine (Open
	// makes a new one, on the interface that replaced it), and the
	// background goroutine looks in less and less often.
	linkGone atomic.Bool
	// lendsBuffers: the link has a buffer area for AllocBuffer. Set
	// before the background goroutine starts, read-only after.
	lendsBuffers bool
	ifname       string
	mac          [6]byte
	mtu          int
	ethType      uint16
	busyPoll     bool
	// traceSide is the log of the link's trace points (xdp.Trace).
	traceSide int
	// noPredict sends every frame down dispatch's general path, past
	// predictEager: tests compare the two. Set under mu.
	noPredict bool
	// spinFirst: in blocking mode, a wait polls this many nanoseconds
	// before it sleeps in the kernel (0: it sleeps at once). Fixed, but
	// with spinAuto, when the driver adapts it (nextSpin); atomic only so
	// that tests may read it.
	spinFirst atomic.Int64
	spinAuto  bool
	spinClock func() int64  // the polls' clock: nanotime (tests: their own)
	yield     func()        // gives up the CPU to runnable threads: xdp.YieldCPU
	resched   func()        // passes through Go's scheduler: runtime.Gosched
	randN     func(int) int // the random draws of feedStarved: rand.IntN (tests: their own)
	randKey   func() uint64 // the keys of registered windows: rand.Uint64 (tests: their own); called under mu
	clock     Clock
	spinCfg   time.Duration // Config.SpinBeforeSleep as given
	// The fields below keep the offsets they had before spinCfg came:
	// PingPongAFXDP/busy with them 8 bytes lower was 1.25×floor (median of
	// 14 runs) against 1.21 (12 runs), better in 1 of 6 direct pairs.
	// Within the noise, perhaps, but free.
	_ [8]byte

	// drive is the drive token: its holder drives the link.
	drive driveToken
	// Drivers: API waiters that find the token taken want it
	// (wantDrive); the background goroutine drives when no API call has
	// waited or driven for a while (apiWaited).
	wantDrive atomic.Int32
	bgDriving atomic.Bool
	inKernel  atomic.Bool // the driver is (or is about to be) blocked in Recv
	// sleepEnd is when the driver's last sleep in the kernel ends at the
	// latest (the clock; prepareSleep), for flushAndUnlock.
	sleepEnd  atomic.Int64
	apiWaited atomic.Bool // an API call waited since the background goroutine last looked
	bgStop    chan struct{}
	bgDone    chan struct{}
	stopped   chan struct{} // closed once stopped and out of the engine map (releaseEngine)
	closed    atomic.Bool
	refs      int // endpoints open; guarded by enginesMu
	// completion moves at every completion or unexpected arrival on an
	// endpoint with goroutines waiting for any (Endpoint.notifyAny).
	completion atomic.Uint64
	// handlerPanic is what an unexpected-message handler panicked with
	// (callHandler), until the goroutine that ran it panics with it
	// again (rethrow); handlerPanicked says there is one. Set under mu.
	handlerPanic    any
	handlerPanicked atomic.Bool

	// Owned by the driver (the drive token holder).
	rxBufs  [][]byte
	rxSizes []int
	vis     rxVisitor
	// polledNow is the clock as the spinning driver last read it, good
	// for nowPolls more empty polls (0: read the clock). A frame that
	// arrives while the driver spins is handled at that time: no clock
	// read between the frame and the answer to it. A new driver, a sleep
	// in the kernel and a batch of frames handled leave it stale.
	polledNow int64
	nowPolls  int
	// checkedAt is when (spinClock) a polling driver last asked the link
	// whether its interface is there (a link's sleeps ask by themselves).
	checkedAt int64
	// sleptFrom is, during a driveOnce after prepareSleep, the clock
	// prepareSleep read (0: none, or used). Frames that receive wakes up
	// to are handled at sleptFrom plus the time the link says it waited
	// (meter), without a clock read between the wake-up and the answer.
	sleptFrom int64
	meter     xdp.WaitMeter // nil: read the clock after a sleep
	// reap is the request the driver's Wait waits for: once done, the
	// driver collects it (reapSt, reaped) while it holds the engine lock
	// for the frames that completed it, rather than Wait taking the lock
	// again.
	reap   reaping
	reapSt Status
	reaped bool
	// acksLeft: the driver's last round left acks to process (ackq): a
	// spinning driver's empty poll then takes the lock to settle them.
	acksLeft bool
	// reschedAt is when the driver last passed through Go's scheduler
	// (prepareSleep).
	reschedAt int64

	// localQueued: localIn or localRetry is not empty. Set
	// under the lock; the driver looks at it without, at each poll and
	// before each sleep.
	localQueued atomic.Bool

	mu sync.Mutex // the engine lock: guards everything below and all endpoint state
	// +checklocks:mu
	eps [256]*Endpoint // by endpoint id
	// localIn[localHead:]: same-process messages waiting for the driver,
	// in the order they were sent (Endpoint.sendLocal): those whose
	// receiver's unexpected-message handler must see them, and any sent
	// after them. localCur is the one runLocal hands over (its handler
	// runs without the lock); localRunning: runLocal is under way.
	// +checklocks:mu
	localIn []localMsg
	// +checklocks:mu
	localHead int
	// +checklocks:mu
	localCur localMsg
	// +checklocks:mu
	localRunning bool
	// localRetry: the endpoints that may have room again for the
	// same-process messages held at their MaxUnexpectedRndv bound
	// (Endpoint.heldRoom); runLocal hands some of those messages over
	// again (retryHeld). retrying: the endpoints of the round under way,
	// whose chains settleHeld puts in order when it ends.
	// +checklocks:mu
	localRetry []*Endpoint
	// +checklocks:mu
	retrying []*Endpoint
	// heldRetried counts the held messages retryHeld took (for tests: a
	// message's hand-overs, not one a held message at every event).
	// +checklocks:mu
	heldRetried int
	// localData holds a same-process message's data while the handler
	// looks at it (arriveLocal): one call at a time.
	// +checklocks:mu
	localData []byte
	// +checklocks:mu
	epList []*Endpoint // the open endpoints, for loops
	// +checklocks:mu
	hostnames map[string]int // the host names the endpoints answer for, and how many endpoints give each
	// +checklocks:mu
	hostReplies map[string]*hostQuery // our host queries under way, by name
	// hosts is what the pulls wait for from each host (MAC) that any of
	// the engine's peers is on: feedStarved gives the budget to a pull
	// from a host with less. Entries stay while the engine lives: a
	// host's load is a few bytes.
	// +checklocks:mu
	hosts map[[6]byte]*hostLoad
	// lastRead is the latest clock reading taken under the lock
	// (readClock): the time after a sleep (sleptFrom plus the wait) is
	// never earlier, so no stamp or sample taken meanwhile comes out
	// later than it.
	// +checklocks:mu
	lastRead int64
	// +checklocks:mu
	txq []txEntry // frames queued for the link, in order
	// txHdrs holds the headers of the pull replies in txq, one per pull
	// request answered: its replies differ only in offset and length.
	// +checklocks:mu
	txHdrs []pullHdr
	// +checklocks:mu
	scratch [][]byte // free frame buffers: unreliable frames, window slots, frames held out of order
	// +checklocks:mu
	badFrames uint64 // frames that failed to decode or name no endpoint
	// +checklocks:mu
	visiting bool // the driver is inside RecvVisit: nobody may call the link
	// dispatching: the lock is held by the driver handling a batch of
	// frames and the timers after it (so g.reap, which the driver owns,
	// may be read).
	// +checklocks:mu
	dispatching bool
	// recvWindow is the receive window said in every frame (0: no limit),
	// census the number of the last census of senders (recvwindow.go):
	// what the frame path reads of recv, in the hole before nextTimer.
	// +checklocks:mu
	recvWindow uint8
	// +checklocks:mu
	census uint32
	// nextTimer is when the earliest timer of any endpoint (or the next
	// census of senders) is due, or earlier (0: none): Endpoint.armAt
	// lowers it, runTimers recomputes it. A driver looks at it instead of
	// at every endpoint, which an engine with dozens of endpoints would do
	// per batch of frames.
	// +checklocks:mu
	nextTimer int64
	// acksDue: some endpoint holds delayed acks (Endpoint.acksDue).
	// +checklocks:mu
	acksDue bool
	// Pull budget: frames asked for by all pulls and not arrived yet, at
	// most maxPullFrames (half the link's receive buffering) and less
	// than a block more (budgetLeft).
	// +checklocks:mu
	pullFrames, maxPullFrames int
	// starved: pulls waiting for budget, in no order, in two lists:
	// [0] pulls under way (they have asked for data before), [1] pulls
	// not started.
	// +checklocks:mu
	starved [2][]*pull
	// +checklocks:mu
	bufs []*Buffer // lent buffers not freed, for sends to find their data in
	// flushing: a goroutine is sending the queued frames (flushAndUnlock)
	// and owns the four fields below until it clears it. A flag under the
	// engine lock rather than a mutex of its own: it is set and cleared
	// while the lock is held anyway, and a flush then costs no atomic
	// operation beyond the engine lock's.
	// +checklocks:mu
	flushing bool
	// slotBlocked: some endpoint's blockedOnSlot is set, so a flush that
	// frees a window slot looks for messages to frame (most never find
	// one: the loop over the endpoints is skipped).
	// +checklocks:mu
	slotBlocked bool
	// unstamped: window slots whose frames a flush handed to the link
	// without reading the clock (txSlot.stamp). The next driver to read
	// the clock stamps them (stampSent), within a batch or a sleep.
	// +checklocks:mu
	unstamped []*txSlot
	// ackq: peers whose ack the frames handled carried (peer.noteAck),
	// for settleAcks; an entry whose peer settled since is skipped.
	// +checklocks:mu
	ackq []*peer
	// ackqOld: entries of ackq from before the batch being handled (the
	// last round's, unless a Test settled them since): they are settled
	// with the batch's.
	// +checklocks:mu
	ackqOld int

	txSending []txEntry // owned by the flusher
	txHdrsOut []pullHdr // owned by the flusher: txSending's txHdrs
	txFrames  [][]byte  // owned by the flusher
	txb       txBuilder // owned by the flusher
	txScratch [][]byte  // owned by the flusher

	// recv: the receive window's bookkeeping (recvwindow.go), at the end:
	// a field that moves the hot ones costs the frame path several per
	// cent (BenchmarkEngineCost).
	// +checklocks:mu
	recv recvState
}

// txEntry is a queued frame: a window slot's buffer, a scratch buffer, or
// (buf nil, r set) a pull reply to build at send time straight from the
// send's data into the link's memory. An entry is written for every frame
// a sender streams, so a pull reply's holds only what differs between the
// replies to one pull request: the bytes of the send it carries (off, n)
// and which header of engine.txHdrs it shares.
type txEntry struct {
	buf  []byte
	slot *txSlot  // nil for scratch frames
	r    *request // a pull reply's send, pinned (txRefs) until it is sent
	off  uint32   // a pull reply's offset in the send
	n    uint32   // a pull reply's payload bytes
	hdr  uint32   // a pull reply's header: its index in txHdrs
}

// pullHdr is the Ethernet, common and pull-reply header of the replies to
// one pull request, as written for the first of them.
type pullHdr [hdrLen + pullReplyHdrLen]byte

// pullHdrLen is the length of a pull reply's headers.
const pullHdrLen = len(pullHdr{})

// txBuilder builds the frames of a flush in the link's memory. Owned by
// the flusher (engine.flushing).
type txBuilder struct {
	frames []txEntry
	hdrs   []pullHdr
}

func (b *txBuilder) Build(i int, buf []byte) int {
	e := &b.frames[i]
	if e.buf != nil {
		return copy(buf, e.buf)
	}
	return b.build(e, buf)
}

// Gather builds frame i, leaving the data of a pull reply from a lent
// buffer where it lies.
func (b *txBuilder) Gather(i int, buf []byte) (int, xdp.Span) {
	e := &b.frames[i]
	if e.buf == nil && e.r.zbuf != nil && pullHdrLen+int(e.n) >= xdp.MinFrameLen {
		return b.header(e, buf), xdp.Span{Buf: e.r.zbuf.xb, Off: e.r.zoff + int(e.off), Len: int(e.n)}
	}
	return b.Build(i, buf), xdp.Span{}
}

// minTail is the shortest tail a TailSender is given rather than a frame
// copied whole into its memory: below it, the copy costs less than the
// kernel's walk of a second iovec.
const minTail = 256

// Tail builds frame i for a TailSender, leaving its bytes where they lie
// for the kernel to copy from there: a pull reply's data when it is one
// piece of a segment of the send (which is pinned until the flush ends),
// and a frame built beforehand all but its Ethernet header (a window
// slot's buffer is not reused while it is being sent, nor a scratch
// frame's before the flush ends).
func (b *txBuilder) Tail(i int, buf []byte) (int, []byte) {
	e := &b.frames[i]
	switch {
	case e.buf != nil:
		if len(e.buf) >= xdp.EthHeaderLen+minTail {
			return copy(buf, e.buf[:xdp.EthHeaderLen]), e.buf[xdp.EthHeaderLen:]
		}
	case e.n >= minTail:
		if tail := segSpan(e.r.segs, int(e.off), int(e.n)); tail != nil {
			return b.header(e, buf), tail
		}
	}
	return b.Build(i, buf), nil
}

// build writes pull reply e into buf. The request is pinned, so its data
// stays in place even though the engine lock is not held.
func (b *txBuilder) build(e *txEntry, buf []byte) int {
	h := b.header(e, buf)
	copyFromSegs(buf[h:h+int(e.n)], e.r.segs, int(e.off))
	return len(padded(buf, tPullReply, int(e.n)))
}

// header writes pull reply e's headers into buf and returns their length.
func (b *txBuilder) header(e *txEntry, buf []byte) int {
	copy(buf, b.hdrs[e.hdr][:])
	setPayloadLen(buf, int(e.n))
	putPullReplyOffset(buf[hdrLen:], e.off)
	return pullHdrLen
}

var (
	enginesMu sync.Mutex
	engines   = map[string]*engine{} // by key; guarded by enginesMu
	// liveEngines counts the engines open in the process (reschedEvery).
	liveEngines atomic.Int32
)

// newEngine makes the engine of link for the endpoints of cfg and starts
// its background goroutine: every field that goroutine reads without the
// engine lock is set before.
func newEngine(link xdp.Link, cfg *Config) *engine {
	g := &engine{
		link:        link,
		ifname:      link.Info().Interface,
		mtu:         link.MTU(),
		ethType:     cfg.EtherType,
		busyPoll:    cfg.BusyPoll,
		spinAuto:    cfg.SpinBeforeSleep == 0,
		spinCfg:     cfg.SpinBeforeSleep,
		clock:       cfg.Clock,
		hostnames:   map[string]int{},
		drive:       driveToken{free: make(chan struct{}, 1)},
		bgStop:      make(chan struct{}),
		bgDone:      make(chan struct{}),
		stopped:     make(chan struct{}),
		hostReplies: map[string]*hostQuery{},
		hosts:       map[[6]byte]*hostLoad{},
	}
	g.spinFirst.Store(int64(max(cfg.SpinBeforeSleep, 0)))
	g.spinClock = nanotime
	g.yield = xdp.YieldCPU
	g.resched = runtime.Gosched
	g.randN = rand.IntN
	g.randKey = rand.Uint64
	g.maxPullFrames = pullBudget(g.mtu)
	// A given link's optional interfaces are those of the link itself,
	// not of the wrapper that keeps the engine from closing it.
	base := link
	if nc, ok := link.(noClose); ok {
		base = nc.Link
	}
	g.waker, _ = base.(xdp.Waker)
	if _, real := cfg.Clock.(realClock); real {
		// The link's waits are real time: an injected clock's are not.
		g.meter, _ = base.(xdp.WaitMeter)
	}
	g.visitor, _ = base.(xdp.FrameVisitor)
	g.prober, _ = base.(xdp.IdleProber)
	g.builder, _ = base.(xdp.FrameBuilder)
	g.gather, _ = base.(xdp.BufferLink)
	g.tails, _ = base.(xdp.TailSender)
	g.checker, _ = base.(xdp.InterfaceChecker)
	if t, ok := base.(interface{ TraceSide() int }); ok {
		g.traceSide = t.TraceSide()
	}
	rxFrames := 0
	if rb, ok := base.(xdp.RxBudget); ok {
		rxFrames = rb.RxFrames()
	}
	g.initRecvWindow(cfg.RecvBudget, rxFrames)
	// A given link lends what it has; one we open, what we asked for.
	g.lendsBuffers = g.gather != nil && (cfg.Link != nil || cfg.UMEMBufferBytes > 0)
	g.vis.g = g
	copy(g.mac[:], link.HardwareAddr())
	const batch = 64
	g.rxBufs = make([][]byte, batch)
	g.rxSizes = make([]int, batch)
	for i := range g.rxBufs {
		g.rxBufs[i] = make([]byte, xdp.MaxFrameLen(link))
	}
	g.txSending = make([]txEntry, 0, 256)
	g.txFrames = make([][]byte, 0, 256)
	go g.background()
	return g
}

// maxFrame is the longest frame the engine builds.
func (g *engine) maxFrame() int { return g.mtu + xdp.EthHeaderLen }

// maxFreeFrames bounds the free frame buffers an engine keeps.
const maxFreeFrames = 1024

// freeBuf gives a frame buffer back to the engine's free list.
//
// +checklocks:g.mu
func (g *engine) freeBuf(b []byte) {
	if len(g.scratch) < maxFreeFrames {
		g.scratch = append(g.scratch, b[:cap(b)])
	}
}

// scratchBuf returns a frame buffer (for an unreliable frame, a window
// slot, a frame held out of order). Buffers are lent while in use and
// come back when done, so an engine's memory follows the frames in
// flight, not its number of peers times their windows.
//
// +checklocks:g.mu
func (g *engine) scratchBuf() []byte {
	if n := len(g.scratch); n > 0 {
		b := g.scratch[n-1]
		g.scratch = g.scratch[:n-1]
		return b
	}
	return make([]byte, g.maxFrame())
}

// queuePullHdr adds a header for pull replies queued next
// (queuePullReply) and returns it, to be written, with its index.
//
// +checklocks:g.mu
func (g *engine) queuePullHdr() (*pullHdr, uint32) {
	g.txHdrs = append(g.txHdrs, pullHdr{})
	return &g.txHdrs[len(g.txHdrs)-1], uint32(len(g.txHdrs) - 1)
}

// queuePullReply queues a pull reply of n bytes at off of the send r, with
// header hdr (queuePullHdr; its offset and length are the reply's), to be
// built at send time.
//
// +checklocks:g.mu
func (g *engine) queuePullReply(r *request, off uint32, n int, hdr uint32) {
	r.txRefs++
	e := g.nextTxEntry()
	e.r, e.off, e.n, e.hdr = r, off, uint32(n), hdr
}

// nextTxEntry appends a zero entry to the transmit queue and returns it,
// for the caller to fill in place: an entry built apart and appended is
// copied whole from the fields just stored, which costs a failed
// store-to-load forwarding.
//
// +checklocks:g.mu
func (g *engine) nextTxEntry() *txEntry {
	g.txq = append(g.txq, txEntry{})
	return &g.txq[len(g.txq)-1]
}

// unpin drops a queued reply's hold on its send; a completion that waited
// for the send's data to be let go happens now.
//
// +checklocks:g.mu
func (g *engine) unpin(r *request) {
	r.txRefs--
	if r.txRefs == 0 && r.completeLater {
		r.completeLater = false
		r.ep.complete(r, r.laterCode)
	}
}

// scratchFlush returns a scratch buffer for building frame i of a flush
// without the engine lock (links without FrameBuilder). The caller is the
// flusher.
func (g *engine) scratchFlush(i int) []byte {
	for len(g.txScratch) <= i {
		g.txScratch = append(g.txScratch, make([]byte, g.maxFrame()))
	}
	return g.txScratch[i]
}

// queue appends a frame to the transmit queue.
//
// +checklocks:g.mu
func (g *engine) queue(buf []byte, slot *txSlot) {
	if slot != nil {
		slot.pending++
	}
	e := g.nextTxEntry()
	e.buf, e.slot = buf, slot
}

// flushAndUnlock sends the queued frames and releases the engine lock,
// which the caller holds. Frames leave in the order they were queued: one
// goroutine at a time flushes (g.flushing), and it keeps going while
// others queue behind it; a goroutine that finds a flush under way leaves
// its frames to that flusher. A window slot's buffer is not reused while
// it is being sent (slot.pending).
//
// Reliable frames queued by an API call are stamped with their send time
// once the link took them (txSlot.stamp), but the flush reads no clock
// for it: the driver that next reads one stamps them (stampSent). An API
// call then reads no clock at all, on the way to the wire or after.
func (g *engine) flushAndUnlock() {
	// Inside a RecvVisit (an unexpected-message handler posting a
	// receive), the link's locks are held: the driver flushes after it.
	if len(g.txq) == 0 || g.visiting || g.flushing {
		g.mu.Unlock()
		return
	}
	g.flushing = true
	for {
		// Swap the queues' arrays rather than copy the entries: the
		// emptied txSending (cleared after its last flush) becomes txq.
		g.txSending, g.txq = g.txq, g.txSending[:0]
		g.txHdrsOut, g.txHdrs = g.txHdrs, g.txHdrsOut[:0]
		g.txb.frames, g.txb.hdrs = g.txSending, g.txHdrsOut
		g.mu.Unlock()

		// A failed send is like a lost frame: reliable frames are
		// retransmitted, the others re-requested by their timers.
		if g.lendsBuffers {
			// Pull replies from a lent buffer may leave where the data lies.
			g.gather.SendGather(len(g.txSending), &g.txb)
		} else if g.tails != nil {
			// The kernel reads pull replies' data, and the frames
			// built beforehand, where they lie (txBuilder.Tail).
			g.tails.SendTails(len(g.txSending), &g.txb)
		} else if g.builder != nil {
			g.builder.SendBuilt(len(g.txSending), &g.txb)
		} else {
			g.txFrames = g.txFrames[:0]
			for i := range g.txSending {
				e := &g.txSending[i]
				if e.buf == nil {
					// A pull reply: build it in a scratch buffer.
					b := g.scratchFlush(i)
					e.buf = b[:g.txb.build(e, b)]
				}
				g.txFrames = append(g.txFrames, e.buf)
			}
			g.link.Send(g.txFrames)
			clear(g.txFrames)
		}
		g.txb.frames, g.txb.hdrs = nil, nil

		g.mu.Lock()
		repump := false
		// The clock is read at the first need: most flushes have none.
		var now int64
		clock := func() int64 {
			if now == 0 {
				now = g.readClock()
			}
			return now
		}
		for i := range g.txSending {
			e := &g.txSending[i]
			switch {
			case e.slot != nil:
				e.slot.pending--
				if e.slot.stamp {
					g.unstamped = append(g.unstamped, e.slot)
				}
				if e.slot.pending == 0 {
					repump = true
					g.releaseSlot(e.slot) // if it was acked while being sent
					if r := e.slot.req; e.slot.used && r != nil && r.convertWanted {
						convertSent(r, clock())
					}
				}
			case e.r != nil:
				g.unpin(e.r) // e.buf, if set, is one of txScratch
			default:
				g.freeBuf(e.buf)
			}
		}
		clear(g.txSending)
		if repump && g.slotBlocked {
			// Messages may have waited for a slot still being sent.
			g.slotBlocked = false
			for _, e := range g.epList {
				if e.blockedOnSlot {
					e.blockedOnSlot = false
					e.pumpAll(clock())
				}
			}
		}
		if now != 0 || len(g.unstamped) >= maxUnstamped {
			g.stampSent(clock())
		}
		if len(g.txq) == 0 {
			g.flushing = false
			// Reliable frames sent by a goroutine that is not the
			// driver are stamped, and their timeouts armed, by the
			// driver's next clock reading: wake a driver asleep for
			// longer than a blocking driver's shortest sleep, or a lost
			// one would wait for that sleep to end (up to 250 ms for
			// the background goroutine).
			wake := len(g.unstamped) > 0 && g.inKernel.Load() && g.sleepEnd.Load() > clock()+int64(minKernelSleep)
			g.mu.Unlock()
			if wake {
				g.signal()
			}
			return
		}
	}
}

// maxUnstamped bounds the frames sent and not stamped (engine.unstamped):
// a flush that finds that many reads the clock and stamps them itself.
const maxUnstamped = 256

// stampSent stamps the frames handed to the link since the clock was last
// read (engine.unstamped) with now, which is later than they left: their
// timeouts count from now, and a round trip measured from it is short by
// at most the time they waited, microseconds when a driver polls or is
// about to sleep. A slot acknowledged meanwhile (or by an ack not
// processed yet, peer.acks) is not stamped, and one
// queued again (pending) is stamped after its next flush.
//
// +checklocks:g.mu
func (g *engine) stampSent(now int64) {
	for i, s := range g.unstamped {
		if s.stamp && s.pending == 0 && !s.peer.acks(s.seq) {
			s.stamped(now)
		}
		g.unstamped[i] = nil
	}
	g.unstamped = g.unstamped[:0]
}

// testHookSleep, when set by a test, runs in driveOnce before a receive
// that may sleep, with whether the background goroutine is the driver.
var testHookSleep func(background bool)

// testHookBackgroundTurn, when set by a test, runs at each turn of engine
// g's background goroutine.
var testHookBackgroundTurn func(g *engine)

// testHookEngineStop, when set by a test, runs in releaseEngine before the
// last endpoint's release stops engine g.
var testHookEngineStop func(g *engine)

// driveOnce receives one batch of frames (waiting up to timeout), handles
// them and runs the due timers, and returns how many it received. sleptFrom is the clock prepareSleep read
// before a receive that may sleep (0: none; a poll, timeout 0, ignores
// it). The caller holds the drive token.
func (g *engine) driveOnce(timeout time.Duration, sleptFrom int64) (int, error) {
	carried := g.acksLeft
	g.sleptFrom = 0
	if timeout != 0 {
		g.sleptFrom = sleptFrom
		g.nowPolls = 0
		if testHookSleep != nil {
			testHookSleep(g.bgDriving.Load())
		}
		g.inKernel.Store(true)
		// A same-process message queued since prepareSleep looked saw
		// inKernel false and did not wake us, and an API call that came
		// to drive since the background goroutine last looked found it
		// awake and did not signal it: look again after the store
		// (sendLocal stores localQueued, waitForSleeping adds to
		// wantDrive, then each loads inKernel).
		if g.localQueued.Load() || (g.bgDriving.Load() && g.wantDrive.Load() > 0) {
			timeout = 0
			g.inKernel.Store(false)
		}
	}
	var n int
	var err error
	if g.visitor != nil {
		// Frames are handled in place, in the link's memory; the visitor
		// takes the engine lock at the first frame and keeps it.
		n, err = g.visitor.RecvVisit(len(g.rxBufs), timeout, &g.vis)
	} else {
		n, err = g.link.Recv(g.rxBufs, g.rxSizes, timeout)
	}
	if timeout != 0 {
		g.inKernel.Store(false)
	}
	if err != nil {
		g.sleptFrom = 0 // the receive may have ended before its wait began
		g.noteLinkErr(err)
	}
	if n == 0 && timeout == 0 {
		// Spinning: reading the clock costs tens of nanoseconds, so read
		// it every few empty polls, and then look at the timers and stamp
		// the frames sent meanwhile. Acks left by the last batch, and
		// same-process messages, are processed at the first empty poll.
		if g.nowPolls--; g.nowPolls > 0 && !carried && !g.localQueued.Load() {
			return 0, err
		}
		if g.nowPolls <= 0 {
			g.polledNow, g.nowPolls = g.clock.Now(), nowPolls
			if err == nil {
				err = g.checkInterface()
			}
		}
	}
	g.handled(n)
	return n, err
}

// checkInterface asks the link, about once an interfaceCheck of a
// driver that only polls (a sleeping link asks by itself), whether its
// interface is still there.
func (g *engine) checkInterface() error {
	if g.checker == nil {
		return nil
	}
	// Real time: the link's is, whatever the engine's clock says.
	now := g.spinClock()
	if now-g.checkedAt < int64(interfaceCheck) {
		return nil
	}
	g.checkedAt = now
	err := g.checker.CheckInterface()
	if err != nil && !errors.Is(err, xdp.ErrInterfaceGone) {
		return nil // closed under us: the next receive says so
	}
	g.noteLinkErr(err)
	return err
}

// interfaceCheck is how often a polling driver asks the link whether its
// interface is there: as often as a sleeping link asks itself.
const interfaceCheck = time.Second

// noteLinkErr notes a receive's error: once the interface is gone, an
// Open on the interface that replaced it makes a new engine rather than
// join this one (acquireEngine).
func (g *engine) noteLinkErr(err error) {
	if err != nil && !g.linkGone.Load() && errors.Is(err, xdp.ErrInterfaceGone) {
		g.linkGone.Store(true)
	}
}

// peek handles the frames waiting on the link, if there are any, and
// reports whether there were. It looks only where the link can tell it
// is idle without a syscall (xdp.IdleProber: on AF_XDP three loads, no
// lock); an idle link costs that look, no clock reading, and leaves
// timers and acks to the next round. The caller holds the drive token.
func (g *engine) peek() (bool, error) {
	if g.visitor == nil || g.prober == nil || g.prober.RxIdle() {
		return false, nil
	}
	g.sleptFrom = 0
	n, err := g.visitor.RecvVisit(len(g.rxBufs), 0, &g.vis)
	if n == 0 {
		return false, err
	}
	g.handled(n)
	return true, err
}

// handled finishes a driver's round after the receive: the frames the
// visitor handled (under the lock it took), or the n frames copied into
// rxBufs; then the acks, the timers, the Wait's request and the flush.
// The caller holds the drive token.
func (g *engine) handled(n int) {
	var now int64
	if g.vis.locked {
		g.vis.locked = false
		g.visiting = false
		now = g.vis.now
	} else {
		g.mu.Lock()
		g.ackqOld = len(g.ackq)
		now = g.driverNow()
		g.dispatching = true
		for i := 0; i < n; i++ {
			g.dispatch(g.rxBufs[i][:g.rxSizes[i]], now)
		}
	}
	if n > 0 {
		g.nowPolls = 0 // handling the frames took time
	}
	// The acks the frames carried release window slots and complete
	// sends: work that waits when the batch completed what the driver's
	// Wait waits for, which returns first. The next round does it, at
	// its first empty poll or after its batch.
	if len(g.ackq) > 0 {
		if r := g.reapTarget(); g.ackqOld > 0 || r == nil || !r.done {
			g.settleAcks()
		}
	}
	g.acksLeft = len(g.ackq) > 0
	if g.localQueued.Load() {
		g.runLocal()
	}
	// After the frames (runTimers stamps): an ack among them spares a
	// stamp, and a round trip is never measured from a stamp made on the
	// ack's arrival.
	g.runTimers(now)
	if r := g.reapTarget(); r != nil && r.done {
		r.ep.collectTo(r, &g.reapSt)
		g.reaped = true
	}
	g.dispatching = false
	g.flushAndUnlock()
}

// settleAcks processes the acks that frames handled by the driver
// carried: peer.noteAck left them for after the batch. The driver calls
// it, and so do the calls that look for completions without waiting
// (Test, TestAny, IPeek, Group.Test) when another goroutine drives (see
// progress), so that they see the sends those acks complete.
//
// It reports whether there were any.
//
// +checklocks:g.mu
func (g *engine) settleAcks() bool {
	if len(g.ackq) == 0 {
		return false
	}
	for i, p := range g.ackq {
		if p.ep.closed {
			p.ackQueued = false
		} else {
			p.settle()
		}
		g.ackq[i] = nil
	}
	g.ackq = g.ackq[:0]
	return true
}

// nowPolls is how many empty polls a spinning driver's clock reading
// stands for: at a few tens of nanoseconds a poll, it is at most about a
// microsecond old, against timeouts of milliseconds.
const nowPolls = 16

// driverNow is the time for frames the driver is about to handle: the
// clock it read while it spun, if recent; after a receive that may have
// slept, the clock read before it plus the time the link waited (early by
// the moments around the syscall, never earlier than a reading taken
// meanwhile: lastRead); else the clock.
//
// +checklocks:g.mu
func (g *engine) driverNow() int64 {
	if g.nowPolls > 0 {
		return g.polledNow
	}
	if from := g.sleptFrom; from != 0 && g.meter != nil {
		g.sleptFrom = 0
		if d, ok := g.meter.Waited(); ok {
			return max(from+int64(d), g.lastRead)
		}
	}
	return g.readClock()
}

// readClock reads the clock and keeps the reading in lastRead.
//
// +checklocks:g.mu
func (g *engine) readClock() int64 {
	t := g.clock.Now()
	g.lastRead = max(g.lastRead, t)
	return t
}

// rxVisitor handles frames the link lends (RecvVisit). Owned by the
// driver; it holds the engine lock from the first frame of a batch until
// driveOnce takes over after RecvVisit returns.
type rxVisitor struct {
	g      *engine
	locked bool
	now    int64
}

func (v *rxVisitor) Visit(f []byte) {
	g := v.g
	if !v.locked {
		// The driver is awake: completions need not wake it (and must not
		// call into the link, whose receive lock is held).
		if g.inKernel.Load() {
			g.inKernel.Store(false)
		}
		g.mu.Lock()
		v.locked = true
		g.ackqOld = len(g.ackq)
		g.visiting, g.dispatching = true, true
		v.now = g.driverNow()
	}
	g.dispatch(f, v.now)
	xdp.Trace(g.traceSide, xdp.TraceDispatched)
}

// sleepFor returns how long the driver may sleep: until the earliest
// timer of any endpoint, at most maxSleep.
//
// +checklocks:g.mu
func (g *engine) sleepFor(now int64, maxSleep time.Duration) time.Duration {
	d := maxSleep
	if g.nextTimer != 0 {
		d = min(d, time.Duration(g.nextTimer-now))
	}
	return max(d, 0)
}

// minKernelSleep is the shortest timeout the driver gives the kernel when
// it sleeps in Recv. Arming and cancelling a short kernel timer on every
// wait costs microseconds of wake-up latency (measured on this project's
// virtual machines: 8-byte round trips of 13 µs with timeouts under
// 100 µs, 5.5 µs with 5 ms), so in blocking mode timers fire with 5 ms
// granularity: a frame lost while the driver sleeps is retransmitted up to
// 5 ms late. Busy-poll mode keeps full precision.
const minKernelSleep = 5 * time.Millisecond

// reschedEvery bounds the time between a sleeping driver's passes through
// Go's scheduler, while the process has fewer engines than Ps.
//
// A goroutine that drives turn after turn, sleeping in the kernel through
// syscall.Syscall (the links' blocking receives), otherwise never passes
// through it. Once it has held its P for 10 ms in one scheduling slice,
// the runtime's monitor thread (sysmon) takes the P at each such sleep
// it sees, and each P taken resets sysmon's own sleep to 20 µs. The
// many-clients experiment's client processes (one engine each) woke
// sysmon about a thousand times a second, each wake-up a context switch
// on a CPU the stack needs. A runtime.Gosched every millisecond (a few
// hundred nanoseconds) keeps the slices short and sysmon asleep.
//
// But those retakes are also what frees the P of a driver asleep in the
// kernel for other goroutines. With as many engines as Ps, every P may be
// held by a sleeping driver, and without the retakes the other goroutines
// waited up to 10 ms: the two-engine blocking ping-pong with GOMAXPROCS 2
// went from 1.155× the link floor to 1.359× (p99 up to 589 µs); with
// GOMAXPROCS 3 it stayed at 1.15-1.21×.
const reschedEvery = time.Millisecond

// prepareSleep runs the timers that are due and sends the acks that wait
// for a reply to ride on — the driver is about to sleep, so no reply is
// coming soon — then returns how long to sleep: until the next timer
// (at least minKernelSleep), at most maxSleep; and the clock it read, for
// driveOnce.
func (g *engine) prepareSleep(maxSleep time.Duration) (time.Duration, int64) {
	// Frames already waiting go before the timers: an ack among them
	// spares a timeout the timers would take as expired after a driver's
	// absence (an application working between waits, the background
	// goroutine's lingerAPI). If there are any, they are handled (the
	// timers run after them) and the caller polls rather than sleeps.
	// (driveOnce's receive, inline there: it is the spinning driver's.)
	var n int
	if g.visitor != nil {
		n, _ = g.visitor.RecvVisit(len(g.rxBufs), 0, &g.vis)
	} else {
		n, _ = g.link.Recv(g.rxBufs, g.rxSizes, 0)
	}
	if n > 0 {
		g.sleptFrom = 0
		g.handled(n)
		return 0, 0
	}
	g.mu.Lock()
	if g.localQueued.Load() {
		g.runLocal()
	}
	g.settleAcks()
	g.acksLeft = false
	now := g.readClock()
	g.runTimers(now)
	var lazyAt int64
	if g.acksDue {
		g.acksDue = false
		for _, e := range g.epList {
			if t := e.flushAcks(now); t != 0 && (lazyAt == 0 || t < lazyAt) {
				lazyAt = t
			}
		}
		g.acksDue = lazyAt != 0
	}
	d := g.sleepFor(now, maxSleep)
	g.flushAndUnlock()
	if now-g.reschedAt >= int64(reschedEvery) {
		g.reschedAt = now
		if int(liveEngines.Load()) < runtime.GOMAXPROCS(0) {
			g.resched()
		}
	}
	if lazyAt == 0 {
		d = max(d, minKernelSleep)
	} // else a lazy ack waits for its time, not for the next 5 ms tick
	g.sleepEnd.Store(now + int64(d))
	return d, now
}

// runTimers stamps the frames sent since the clock was last read
// (stampSent), then runs the endpoints' timers that are due: every driver
// round that reads the clock passes here.
//
// +checklocks:g.mu
func (g *engine) runTimers(now int64) {
	g.stampSent(now)
	if g.nextTimer == 0 || now < g.nextTimer {
		return
	}
	// A timer may arm another endpoint's, one the loop has passed: armAt
	// lowers g.nextTimer from zero meanwhile.
	g.nextTimer = 0
	next := g.takeCensus(now)
	for _, e := range g.epList {
		if e.nextTimer != 0 && now >= e.nextTimer {
			e.runTimers(now)
		}
		if t := e.nextTimer; t != 0 && (next == 0 || t < next) {
			next = t
		}
	}
	if g.nextTimer == 0 || (next != 0 && next < g.nextTimer) {
		g.nextTimer = next
	}
}

// dispatch decodes a received frame and hands it to its endpoint.
//
// +checklocks:g.mu
func (g *engine) dispatch(f []byte, now int64) {
	if !g.noPredict && g.predictEager(f, now) {
		return
	}
	if len(f) < xdp.EthHeaderLen || binary.BigEndian.Uint16(f[12:14]) != g.ethType {
		g.badFrames++
		return
	}
	var h header
	if h.decode(f) != nil || !g.addressedToUs(f, h.typ) {
		g.badFrames++
		return
	}
	var riders []byte // acks to other endpoints riding with a pull request
	switch h.typ {
	case tHostQuery, tHostReply:
		g.onHost(f, &h)
		return
	case tAcks:
		g.onAcks(f, &h, now)
		return
	case tPullReq:
		if _, riders = typeHdr(f, &h); !validAckEntries(riders) {
			g.badFrames++
			return
		}
	}
	if e := g.eps[h.dstEP]; e != nil {
		e.handle(f, &h, now)
	} else {
		g.badFrames++
		// The frames whose sender waits for an answer: a connect, a
		// reliable frame, a pull request (the receive it serves could
		// never complete), a keepalive (its sender waits on us for a
		// notify or pull data: a receiver that closed mid-pull).
		if h.typ == tConnect || h.typ.reliable() || h.typ == tPullReq || h.typ == tKeepalive {
			g.nackNoEndpoint(f, &h)
		}
	}
	if len(riders) > 0 {
		g.ackEntries(f, &h, riders, now)
	}
}

// addressedToUs reports whether frame f, of type t, has addresses it may
// have: from one station (not a group address) other than us, to our MAC,
// or to the broadcast address for a host query. Another frame to a group
// address would be answered by every engine that sees it; one from our own
// MAC is forged (or our own query come back): a peer with our MAC is of
// this process and never uses the NIC, and such a frame could reset or
// re-pair a same-process peer.
func (g *engine) addressedToUs(f []byte, t frameType) bool {
	if f[6]&1 != 0 || [6]byte(f[6:12]) == g.mac {
		return false
	}
	if [6]byte(f[0:6]) == g.mac {
		return true
	}
	return t == tHostQuery && [6]byte(f[0:6]) == broadcastMAC
}

// broadcastMAC is the Ethernet broadcast address.
var broadcastMAC = [6]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}

// validAckEntries reports whether b is a list of ack entries a bundle
// (tAcks) or a pull request may carry: a whole number of them, at most
// maxAckEntries. A frame with any other payload is dropped whole.
func validAckEntries(b []byte) bool {
	return len(b)%ackEntryLen == 0 && len(b) <= maxAckEntries*ackEntryLen
}

// onAcks hands each ack of a bundle to its endpoint as a tAck frame of
// its own: the one its common header carries, then its entries.
//
// +checklocks:g.mu
func (g *engine) onAcks(f []byte, h *header, now int64) {
	_, entries := typeHdr(f, h)
	if !validAckEntries(entries) {
		g.badFrames++
		return
	}
	one := *h
	one.typ, one.payloadLen = tAck, 0
	g.ackTo(f, &one, now, true)
	g.ackEntries(f, h, entries, now)
}

// ackEntries hands each ack entry of frame f (a bundle, or a pull request
// with acks riding along; h its header) to its endpoint as a tAck frame
// of its own, from h's source.
//
// +checklocks:g.mu
func (g *engine) ackEntries(f []byte, h *header, entries []byte, now int64) {
	one := *h
	one.typ, one.flags, one.seq, one.payloadLen = tAck, 0, 0, 0
	var a ackEntry
	for ; len(entries) > 0; entries = entries[ackEntryLen:] {
		a.decode(entries)
		one.dstEP, one.dstSession, one.srcSession, one.ack = a.dstEP, a.dstSession, a.srcSession, a.ack
		g.ackTo(f, &one, now, false)
	}
}

// ackTo hands one ack of frame f (h, of type tAck) to its endpoint; count
// says whether f counts in there too (for the endpoint f was sent to, not
// for the entries riding in it).
//
// +checklocks:g.mu
func (g *engine) ackTo(f []byte, h *header, now int64, count bool) {
	switch e := g.eps[h.dstEP]; {
	case e == nil:
		g.badFrames++
	case count:
		e.handle(f, h, now)
	case !e.closed:
		e.handleOne(f, h, now)
	}
}

// nackNoEndpoint tells a sender that no endpoint has its destination id.
//
// +checklocks:g.mu
func (g *engine) nackNoEndpoint(f []byte, h *header) {
	b := g.scratchBuf()
	out := header{typ: tNack, dstEP: h.srcEP, srcEP: h.dstEP, dstSession: h.srcSession}
	if h.typ == tConnect {
		// Answer the connect itself so that it fails at once.
		out.typ = tConnectReply
		th := putHeader(b, (*[6]byte)(f[6:12]), &g.mac, g.ethType, &out)
		th0, _ := typeHdr(f, h)
		_, connID, _ := getConnect(th0)
		putConnReply(th, connID, BadEndpoint, g.mtu)
		g.queue(padded(b, tConnectReply, 0), nil)
		return
	}
	th := putHeader(b, (*[6]byte)(f[6:12]), &g.mac, g.ethType, &out)
	putNack(th, h.seq, nackBadEndpoint, h.dstSession)
	g.queue(padded(b, tNack, 0), nil)
}

// hostQuery is a host name being resolved: the answer, and how many
// Resolve calls wait for it.
type hostQuery struct {
	mac      [6]byte // zero until answered
	waiters  int
	answered chan struct{} // closed at the first answer: wakes the Resolves not driving
}

// onHost answers host queries naming this host and records answers.
//
// +checklocks:g.mu
func (g *engine) onHost(f []byte, h *header) {
	_, name := typeHdr(f, h)
	switch h.typ {
	case tHostQuery:
		if g.hostnames[string(name)] == 0 {
			return
		}
		b := g.scratchBuf()
		out := header{typ: tHostReply, dstEP: h.srcEP, payloadLen: len(name)}
		p := putHeader(b, (*[6]byte)(f[6:12]), &g.mac, g.ethType, &out)
		copy(p, name)
		g.queue(padded(b, tHostReply, len(name)), nil)
	case tHostReply:
		// An answer comes from a NIC: a zero or group source address is
		// no answer.
		// The first answer is the one every Resolve sharing the query
		// gets: a later one (a second host of the name, a spoofer) does
		// not change it under them.
		if q := g.hostReplies[string(name)]; q != nil && [6]byte(f[6:12]) != ([6]byte{}) && f[6]&1 == 0 {
			select {
			case <-q.answered: // answered before (the lock makes one closer)
			default:
				copy(q.mac[:], f[6:12])
				close(q.answered)
			}
		}
	}
}

// signal wakes the driver if it sleeps in the kernel: something other
// than a frame needs attention (a request completed outside the driver, a
// timer armed earlier than the driver's sleep).
func (g *engine) signal() {
	if g.inKernel.Load() && g.waker != nil {
		g.waker.Wake()
	}
}

// progress makes one round of progress for a call that looks for a
// completion without waiting (Test, TestAny, IPeek, Iprobe, Ibuffered,
// Group.Test), as mx_test and mx_iprobe do: if no one drives, it polls the
// link once without waiting, handles what came and runs the timers due.
// It reports whether it did. While another goroutine drives, it leaves
// the link alone: the background goroutine, asked to step aside as for a
// Wait (apiWaited, and a wake-up if it sleeps in the kernel), lets a loop
// of such calls drive from a later turn on, for lingerAPI after the last.
func (g *engine) progress() bool {
	g.noteAPIWait()
	if !g.drive.tryTake() {
		if g.bgDriving.Load() {
			g.signal()
		}
		return false
	}
	if g.closed.Load() {
		g.drive.release()
		return false
	}
	g.nowPolls = 0    // the last driver's clock reading may be stale
	g.driveOnce(0, 0) // an error is noted (noteLinkErr); the waits report it
	g.drive.release()
	g.rethrow() // a handler's panic, in the goroutine that ran it
	return true
}

// waitFor waits until done() reports true, driving the link while no one
// else does. done is called without the engine lock; wake is signalled by
// whoever makes done true. A zero deadline waits without bound.
func (g *engine) waitFor(ctx context.Context, done func() bool, wake <-chan struct{}) error {
	_, _, err := g.waitForSleeping(ctx, done, wake, nil, reaping{})
	return err
}

// waitForSleeping is waitFor that counts itself in sleepers (when not nil)
// while it may sleep on wake: a completion needs to signal wake only then.
// The count goes up before done is looked at again, and a completion
// marks itself done before it reads the count, so one of the two sees the
// other.
//
// If it drives the link and reap's request completes meanwhile, the
// driver collects it: its status is returned with true, and the handle is
// spent.
func (g *engine) waitForSleeping(ctx context.Context, done func() bool, wake <-chan struct{}, sleepers *atomic.Int32, reap reaping) (Status, bool, error) {
	if done() {
		return Status{}, false, nil
	}
	g.noteAPIWait()
	// The token is usually free: take it without counting in wantDrive
	// (driveUntil keeps apiWaited set while it drives, which keeps the
	// background goroutine away as well).
	if g.drive.tryTake() {
		return g.driveReaping(ctx, done, reap)
	}
	if drove, err := g.takeTokenUnless(ctx, done, wake, sleepers); !drove {
		return Status{}, false, err
	}
	return g.driveReaping(ctx, done, reap)
}

// takeTokenUnless waits for the drive token, counted in wantDrive, until it
// takes it (true) or done() or the context ends first (false, and the
// context's error if it ended). It counts in wantDrive only while it
// waits: the background goroutine lingers while someone waits for the
// token, and waits for the token's release while an API call holds it.
// Counted for a whole Wait that had to wait for the token, it woke every
// lingerAPI for as long as the Wait lasted.
func (g *engine) takeTokenUnless(ctx context.Context, done func() bool, wake <-chan struct{}, sleepers *atomic.Int32) (bool, error) {
	g.wantDrive.Add(1)
	defer g.wantDrive.Add(-1)
	for {
		g.noteAPIWait()
		if g.bgDriving.Load() {
			g.signal()
		}
		var err error
		drove, finished := g.drive.tryTake(), false
		if !drove {
			if sleepers != nil {
				sleepers.Add(1)
				if done() {
					sleepers.Add(-1)
					return false, nil
				}
			}
			switch waitToken(&g.drive, wake, ctx.Done()) {
			case tokenTaken:
				drove = true
			case tokenWokeA:
				finished = done()
			case tokenWokeB:
				finished = true
				if !done() {
					err = ctx.Err()
				}
			}
			if sleepers != nil {
				sleepers.Add(-1)
			}
		}
		if drove {
			return true, nil
		}
		if finished {
			return false, err
		}
		if g.closed.Load() {
			// Close completes what is pending before it stops the
			// engine: a completion just before the close counts.
			if done() {
				return false, nil
			}
			return false, ErrClosed
		}
	}
}

// driveReaping drives until done() (or reap is collected) and releases
// the drive token, which the caller holds.
func (g *engine) driveReaping(ctx context.Context, done func() bool, reap reaping) (Status, bool, error) {
	g.reap = reap
	err := g.driveUntil(ctx, done)
	st, reaped := g.reapSt, g.reaped
	g.reap, g.reapSt, g.reaped = reaping{}, Status{}, false
	g.drive.release()
	if reaped {
		err = nil // the request completed, whatever came after
	} else {
		g.rethrow() // a handler's panic (when reaped: at the next drive's end)
	}
	return st, reaped, err
}

// reapTarget returns the request the driver's Wait names, while it is
// still to be collected, its handle is valid and it is of the Wait's
// endpoint; else nil. Only the driver may call it.
//
// +checklocks:g.mu
func (g *engine) reapTarget() *request {
	if h := g.reap.h; h.r != nil && !g.reaped && h.valid() && h.r.ep == g.reap.e {
		return h.r
	}
	return nil
}

// reapsNow reports whether r, completing now, is the request the driver
// collects at the end of the batch it is handling (driveOnce): the lock
// is held by the driver, r is its Wait's, and no other goroutine sleeps
// on r.
//
// +checklocks:g.mu
func (g *engine) reapsNow(r *request) bool {
	return g.dispatching && g.reapTarget() == r && r.waiters.Load() == 0
}

// reaping names a request for its waiting driver to collect: handle h, if
// it is still valid and of endpoint e. The zero reaping names none.
type reaping struct {
	h Request
	e *Endpoint
}

// noteAPIWait tells the background goroutine that an API call waits or
// drives, so that it stays away (lingerAPI).
func (g *engine) noteAPIWait() {
	if !g.apiWaited.Load() { // a store only once per look of the background goroutine
		g.apiWaited.Store(true)
	}
}

// driveUntil drives the link until done() or the context ends. The
// caller holds the drive token.
func (g *engine) driveUntil(ctx context.Context, done func() bool) error {
	deadline, hasDeadline := ctx.Deadline()
	// A cancel comes without a frame: it must wake a driver asleep in the
	// kernel. The hook is registered before the first sleep only (most
	// waits end without one): a context that ended before that runs it
	// at once, and the sleep that follows returns.
	var stopHook func() bool
	defer func() {
		if stopHook != nil {
			stopHook()
		}
	}()
	g.nowPolls = 0 // the last driver's reading is stale
	// In blocking mode, poll for spinFirst before each sleep, from the
	// start of the wait and again after each batch of frames: an answer
	// that comes within it costs no kernel wake-up (tens of microseconds
	// on a VM whose other vCPU must be woken by an interrupt).
	spinFor := g.spinFirst.Load()
	spin := !g.busyPoll && (spinFor > 0 || g.spinAuto)
	var spinUntil, active int64 // active: the last activity (nanotime)
	pollAgain := func() {
		active = g.spinClock()
		if spinFor > 0 {
			spinUntil = active + spinFor
		}
	}
	if spin {
		pollAgain()
	}
	for spins := 0; ; spins++ {
		if g.reaped || done() || g.handlerPanicked.Load() {
			return nil // a handler's panic goes on at once (rethrow)
		}
		if g.closed.Load() {
			// A completion between the look above and the close (Close
			// completes what is pending, then stops the engine) is
			// the wait's answer, not the close.
			if done() {
				return nil
			}
			return ErrClosed
		}
		// A busy-polling driver turns millions of times a second: look at
		// the context now and then. A sleeping one turns at most once per
		// wake-up: look every time, or a cancel waits for many sleeps.
		polling := g.busyPoll || spinUntil != 0
		if !polling || spins&63 == 63 {
			if err := ctx.Err(); err != nil {
				return err
			}
			g.noteAPIWait()
		}
		if spinUntil != 0 && spins&63 == 63 {
			if now := g.spinClock(); now >= spinUntil {
				spinUntil, polling = 0, false
			} else if now-active >= yieldAfter {
				// Once the poll has gone yieldAfter without frames, every
				// 64 turns, let whatever else is runnable on this CPU
				// run: often the very process whose frames the poll
				// waits for, which the kernel woke (with the frames we
				// sent it) onto our CPU. Alone on the CPU, the yield
				// costs a syscall.
				g.yield()
			}
		}
		var timeout time.Duration
		var sleptFrom int64
		if !polling {
			// One look before preparing to sleep. Where one vCPU runs
			// both ends of an exchange, the answer is often there by the
			// time a send returns (the other end ran while the sendto
			// woke it): handling it now skips the timers' clock reading
			// and the receive's set-up for a sleep.
			if got, err := g.peek(); err != nil {
				return g.driveErr(err)
			} else if got {
				if spin {
					pollAgain()
				}
				continue
			}
			if stopHook == nil && ctx.Done() != nil && g.waker != nil {
				stopHook = context.AfterFunc(ctx, g.waker.Wake)
			}
			timeout, sleptFrom = g.prepareSleep(100 * time.Millisecond)
			// Said before the last look: a completion by another
			// goroutine after the look sees the driver as asleep and
			// wakes it (signal), one before it is seen by the look.
			g.inKernel.Store(true)
			if done() {
				g.inKernel.Store(false)
				return nil // completed by a timer or an ack processed just now
			}
			if hasDeadline {
				timeout = min(timeout, time.Until(deadline))
			}

			if timeout <= 0 {
				timeout = 0 // a poll, not a sleep
				g.inKernel.Store(false)
				if err := ctx.Err(); err != nil {
					return err
				}
			}
		}
		n, err := g.driveOnce(timeout, sleptFrom)
		if err != nil {
			return g.driveErr(err)
		}
		if spin && n > 0 {
			if timeout != 0 && g.spinAuto {
				spinFor = int64(nextSpin(time.Duration(spinFor), time.Duration(g.spinClock()-active)))
				g.spinFirst.Store(spinFor)
			}
			pollAgain()
		}
	}
}

// Adaptive polling before sleeping (Config.SpinBeforeSleep 0), as Linux's
// haltpoll governor polls an idle vCPU: a sleep that frames ended within
// autoSpinWindow of the last activity (the sleep's wake-up included,
// which alone takes tens of microseconds on a VM) might have been spared
// by a longer poll, so the next polls twice as long, from minAutoSpin up
// to maxAutoSpin; a longer one halves it, down to no poll below
// minAutoSpin. Frames that come while polling keep it. An exchange whose
// answers come within microseconds is then served without kernel
// wake-ups, and an idle or slow one sleeps at once.
const (
	minAutoSpin    = 10 * time.Microsecond
	maxAutoSpin    = 50 * time.Microsecond
	autoSpinWindow = 200 * time.Microsecond
)

// yieldAfter is how long a poll before sleeping goes without frames
// before it starts yielding its CPU (driveUntil): a yield delays an
// answer that comes meanwhile by a syscall (in a ping-pong of the default
// blocking mode, about a microsecond of the median), and an answer that
// takes longer may be waiting for our CPU.
const yieldAfter = int64(minAutoSpin)

// nextSpin is the poll that follows poll cur when a sleep after it ended
// with frames idle since the last activity (the poll included).
func nextSpin(cur, idle time.Duration) time.Duration {
	if idle <= autoSpinWindow {
		return min(max(2*cur, minAutoSpin), maxAutoSpin)
	}
	if cur /= 2; cur < minAutoSpin {
		return 0
	}
	return cur
}

// nanotime is a monotonic clock in nanoseconds for polls, which spend
// real time whatever the engine's Clock says.
func nanotime() int64 { return int64(time.Since(monoBase)) }

var monoBase = time.Now()

// driveErr is the error a wait returns for a failed receive: ErrClosed if
// the engine was closed meanwhile, else the link's.
func (g *engine) driveErr(err error) error {
	if g.closed.Load() {
		return ErrClosed
	}
	return err
}

// pullBudget is the frames all pulls of an engine may have asked for and
// not received (and less than a block more, budgetLeft): maxPullFrames
// receive descriptors' worth, a frame taking several when it spans UMEM
// frames (multi-buffer, e.g. three of 4096 bytes at MTU 9000).
func pullBudget(mtu int) int {
	const rxRoom = 4096 - 256 // a default UMEM frame after XDP headroom
	descs := (mtu + xdp.EthHeaderLen + rxRoom - 1) / rxRoom
	return max(maxPullFrames/descs, 2*pullBlockFrames)
}

// maxPullFrames bounds the frames all pulls of an engine have asked for
// and not received: half the receive half of a default AF_XDP UMEM (2048
// frames), so that many clients pulled at once never overflow the ring.
const maxPullFrames = 1024

// lingerAPI is how long the background goroutine stays away after an API
// call waited, so that a loop of waits never hands the token back and
// forth.
const lingerAPI = 2 * time.Millisecond

// background drives the link while no API call does, so that acks,
// retransmissions and pulls make progress when the application is busy
// elsewhere. It sleeps in the kernel (need-wakeup) when there is nothing
// to do.
func (g *engine) background() {
	defer close(g.bgDone)
	linger := time.NewTimer(lingerAPI)
	defer linger.Stop()
	pause := lingerAPI // after a failed drive: grows while the link fails
	for {
		if testHookBackgroundTurn != nil {
			testHookBackgroundTurn(g)
		}
		select {
		case <-g.bgStop:
			return
		default:
		}
		if g.apiWaited.Swap(false) || g.wantDrive.Load() > 0 {
			linger.Reset(lingerAPI)
			select {
			case <-g.bgStop:
				return
			case <-linger.C:
			}
			continue
		}
		// An API call holds the token (a Wait asleep in the kernel, say):
		// wait for its release without a timeout. Looking again every
		// lingerAPI woke this goroutine 250 times a second for as long
		// as the Wait lasted: 4-5 % of a CPU while idle.
		if !g.drive.tryTake() && waitToken(&g.drive, g.bgStop, noWake) != tokenTaken {
			continue // the loop's top looks at bgStop
		}
		if g.apiWaited.Load() {
			// An API call drove while we waited for the token, and may
			// wait again at once: stay away.
			g.drive.release()
			continue
		}
		g.bgDriving.Store(true)
		failed := false
		// An API call that wants to drive (a Wait) counts in wantDrive;
		// one that makes progress without waiting (progress) only notes
		// itself in apiWaited.
		for g.wantDrive.Load() == 0 && !g.apiWaited.Load() && !g.closed.Load() && !g.handlerPanicked.Load() {
			if _, err := g.driveOnce(g.prepareSleep(250 * time.Millisecond)); err != nil {
				failed = !g.closed.Load()
				break
			}
			pause = lingerAPI
		}
		g.bgDriving.Store(false)
		g.drive.release()
		g.rethrow()
		if failed {
			// A link that keeps failing (its interface gone, say) must
			// not make this loop spin: pause, longer each time, up to
			// an idle sleep (timers still run, in prepareSleep: a dead
			// peer is given up), and without the token, which an API
			// call may take meanwhile to learn the link's error.
			linger.Reset(pause)
			pause = min(2*pause, 250*time.Millisecond)
			select {
			case <-g.bgStop:
				return
			case <-linger.C:
			}
		}
	}
}

// noWake is a wake-up that never comes, for waitToken.
var noWake <-chan struct{}

// rethrow panics again with what an unexpected-message handler panicked
// with, if one did, in the goroutine that ran it (handlers run in the
// driver only, for same-process messages too) once it holds neither the
// lock nor the drive token: at the end of a wait's drive, or of the
// background goroutine's.
func (g *engine) rethrow() {
	if !g.handlerPanicked.Load() {
		return
	}
	g.mu.Lock()
	pv := g.handlerPanic
	g.handlerPanic = nil
	g.handlerPanicked.Store(false)
	g.mu.Unlock()
	if pv != nil {
		panic(pv)
	}
}

// driveToken is the right to drive the link, held by one goroutine at a
// time. Taking it when free costs a compare-and-swap. A goroutine that
// must wait for it counts itself in waiting, tries once more, and then
// waits on free (with its other wake-ups); a release signals free only
// when someone counts as waiting. The count goes up before the second try
// and a release frees the token before it reads the count, so either the
// try succeeds or the release signals. A signal can outlive its waiter:
// whoever takes it next tries, and waits again if the token is taken.
type driveToken struct {
	held    atomic.Bool
	waiting atomic.Int32
	free    chan struct{} // capacity 1
}

func (t *driveToken) tryTake() bool {
	return !t.held.Load() && t.held.CompareAndSwap(false, true)
}

// tokenWait is how waitToken ended.
type tokenWait int

const (
	tokenTaken tokenWait = iota // the caller holds the token
	tokenLost                   // freed, but someone else took it first: look again
	tokenWokeA                  // a was ready first
	tokenWokeB                  // b was ready first
)

// waitToken waits for t after a failed tryTake, until the caller takes it
// or one of the caller's own wake-ups, a or b, comes first.
func waitToken[B any](t *driveToken, a <-chan struct{}, b <-chan B) tokenWait {
	t.waiting.Add(1)
	defer t.waiting.Add(-1)
	if t.tryTake() {
		return tokenTaken
	}
	select {
	case <-t.free:
		if t.tryTake() {
			return tokenTaken
		}
		return tokenLost
	case <-a:
		return tokenWokeA
	case <-b:
		return tokenWokeB
	}
}

func (t *driveToken) release() {
	t.held.Store(false)
	if t.waiting.Load() > 0 {
		select {
		case t.free <- struct{}{}:
		default:
		}
	}
}

// stop ends the background goroutine and closes the link; the caller has
// made sure no endpoint remains.
func (g *engine) stop() error {
	g.closed.Store(true)
	close(g.bgStop)
	g.signal()
	if g.waker != nil {
		g.waker.Wake()
	}
	<-g.bgDone
	// An API call may still drive: a Wait the Close woke, between its
	// look at closed and its receive. Wait until it lets go (it leaves
	// at its next look), so that it takes no frame of the engine an Open
	// makes next on a given link. Any driver after it sees closed first.
	tick := time.NewTicker(time.Millisecond)
	for !g.drive.tryTake() {
		if g.waker != nil {
			g.waker.Wake()
		}
		if waitToken(&g.drive, nil, tick.C) == tokenTaken {
			break
		}
	}
	tick.Stop()
	g.drive.release()
	// A goroutine flushing may be sending frames the last Close queued
	// behind its own (flushAndUnlock leaves them to it): that Close's
	// acks and goodbyes. No API call queues more now, and a link's
	// send waits a bounded time (a stalled link fails it after its
	// stall timeout), but wait no longer than flushWait for a link that
	// does not.
	for deadline := time.Now().Add(flushWait); g.isFlushing() && time.Now().Before(deadline); {
		time.Sleep(50 * time.Microsecond)
	}
	return g.link.Close()
}

func (g *engine) isFlushing() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.flushing
}

// flushWait bounds how long an engine's stop waits for a flush under way
// before it closes the link: longer than the links' send-stall timeout.
const flushWait = 2 * time.Second
