package xdp

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// MemConfig are the knobs of an in-memory segment (a [Hub], or the two ends
// of a [NewPair]). Probabilities are in [0,1]; values outside are clamped.
//
// The fault knobs act on each copy of a frame delivered to one receiving
// link (a broadcast frame to three links is three independent deliveries):
//
//   - Loss drops the copy; it is counted in the sender's
//     Stats.InjectedLoss.
//   - Duplicate delivers the copy twice, back to back; the extra copy is
//     counted in the sender's Stats.InjectedDuplicate.
//   - Reorder (drawn only for copies that are not duplicated) holds the copy
//     back until the next frame on the same path (sender, receiver) has been
//     queued, and delivers it right after that frame (and its duplicate,
//     if it has one); it is counted in the
//     sender's Stats.InjectedReorder when that happens. If no frame follows
//     on that path within memReorderHold (1 ms), the copy is delivered late
//     but in order and is not counted. One copy at most is held per path.
//   - Delay and Jitter make the copy visible to Recv only Delay plus a
//     uniform draw in [0,Jitter) after it was sent. Jitter may reorder
//     frames; such reordering is not counted.
type MemConfig struct {
	// MTU is the largest payload after the Ethernet header; 0 means 1500.
	// It is fixed when the segment is made: SetConfig ignores it.
	MTU int

	Loss, Reorder, Duplicate float64

	// Delay is the one-way delay added to every frame, Jitter the bound of
	// a uniform extra delay in [0,Jitter).
	Delay, Jitter time.Duration

	// QueueLen bounds the frames buffered per receiving link, like a NIC
	// ring; 0 means 4096. A frame arriving at a full queue is dropped and
	// counted in the receiver's Stats.QueueDrops.
	QueueLen int

	// Seed seeds the fault knobs' random streams; 0 means a fixed default,
	// so that runs are reproducible. Each link draws from its own stream
	// (derived from Seed and the link's port number), so the decisions for
	// one sender do not depend on how other senders interleave with it.
	// It is fixed when the segment is made: SetConfig ignores it.
	Seed int64

	// BufferBytes bounds the bytes each link lends with AllocBuffer at
	// once, as an AF_XDP link's buffer area does: an AllocBuffer past it
	// fails with ErrNoBufferSpace, and a Free makes room again. 0 means
	// no bound. It is fixed when the segment is made: SetConfig ignores it.
	BufferBytes int

	// SendWait is how long a send waits on a link whose transmit is
	// stalled (StallTx) before it fails with ErrTxStalled; 0 means 1 s, as
	// the AF_XDP link's default.
	SendWait time.Duration
}

const (
	memDefaultMTU      = 1500
	memDefaultQueueLen = 4096
	memDefaultSeed     = 0x786d78 // "xmx"
	memDefaultSendWait = time.Second

	// memReorderHold bounds how long a frame picked for reordering waits
	// for the next frame on its path before it is delivered anyway.
	memReorderHold = time.Millisecond
)

// memConf is a normalised, immutable MemConfig, swapped atomically by
// SetConfig. Durations are nanoseconds.
type memConf struct {
	loss, reorder, dup float64
	delay, jitter      int64
	queueLen           int
	sendWait           time.Duration
	mode               string // Info().Mode
}

func clampProb(p float64) float64 {
	if !(p > 0) { // also NaN
		return 0
	}
	return min(p, 1)
}

func newMemConf(cfg MemConfig) *memConf {
	c := &memConf{
		loss:     clampProb(cfg.Loss),
		reorder:  clampProb(cfg.Reorder),
		dup:      clampProb(cfg.Duplicate),
		delay:    int64(max(cfg.Delay, 0)),
		jitter:   int64(max(cfg.Jitter, 0)),
		queueLen: cfg.QueueLen,
		sendWait: cfg.SendWait,
	}
	if c.queueLen <= 0 {
		c.queueLen = memDefaultQueueLen
	}
	if c.sendWait <= 0 {
		c.sendWait = memDefaultSendWait
	}
	var knobs []string
	pct := func(name string, p float64) {
		if p > 0 {
			knobs = append(knobs, name+"="+strconv.FormatFloat(p*100, 'g', 4, 64)+"%")
		}
	}
	pct("loss", c.loss)
	pct("reorder", c.reorder)
	pct("dup", c.dup)
	if c.delay > 0 {
		knobs = append(knobs, "delay="+time.Duration(c.delay).String())
	}
	if c.jitter > 0 {
		knobs = append(knobs, "jitter="+time.Duration(c.jitter).String())
	}
	if len(knobs) == 0 {
		c.mode = "ideal"
	} else {
		c.mode = strings.Join(knobs, " ")
	}
	return c
}

// Hub is a simulated Ethernet segment joining in-memory links.
//
// A frame sent by one of its links is delivered, after the fault knobs, to
// the link whose MAC equals the frame's destination MAC (bytes 0..5). A
// broadcast or multicast destination (bit 0 of the first byte set) is
// delivered to every other link of the hub. Unknown unicast is not
// flooded: a unicast frame to a MAC that no other link has (the sender's own
// MAC included) is delivered to nobody and counted nowhere. Frames to a
// closed link are dropped and counted nowhere.
//
// The hub has no goroutines of its own: senders deliver directly into the
// receivers' queues, and Recv waits with a timer for delayed frames.
type Hub struct {
	mtu   int       // fixed at NewHub
	seed  uint64    // fixed at NewHub
	lend  int       // MemConfig.BufferBytes, fixed at NewHub
	epoch time.Time // zero of the frames' due times (monotonic clock)

	// pool recycles frame buffers of capacity mtu+EthHeaderLen.
	pool sync.Pool
	// junk (mtu+EthHeaderLen bytes of memJunk, fixed at NewHub) overwrites
	// a frame as it goes back to the pool, so that a receiver that kept
	// a visited frame past its Visit reads junk at once, as it would on a
	// kernel link once the slot is refilled, not only when the pool
	// happens to hand the buffer out again.
	junk []byte

	cfg   atomic.Pointer[memConf]  // current knobs; written under mu
	ports atomic.Pointer[memPorts] // current links; written under mu

	// mu serialises the writers of cfg and ports (SetConfig, Attach).
	// Readers (Send, Info) load the atomic pointers without it.
	mu sync.Mutex
}

// memPorts is an immutable snapshot of a hub's links, replaced by Attach.
type memPorts struct {
	links []*MemLink
	byMAC map[[6]byte]*MemLink
}

// NewHub returns an empty segment with the given knobs. Attach links to it.
func NewHub(cfg MemConfig) *Hub {
	h := &Hub{
		mtu:   cfg.MTU,
		seed:  uint64(cfg.Seed),
		lend:  max(cfg.BufferBytes, 0),
		epoch: time.Now(),
	}
	if h.mtu <= 0 {
		h.mtu = memDefaultMTU
	}
	if h.seed == 0 {
		h.seed = memDefaultSeed
	}
	maxLen := h.mtu + EthHeaderLen
	h.pool.New = func() any { return &memFrame{buf: make([]byte, 0, maxLen)} }
	h.junk = bytes.Repeat([]byte{memJunk}, maxLen)
	h.cfg.Store(newMemConf(cfg))
	h.ports.Store(&memPorts{byMAC: map[[6]byte]*MemLink{}})
	return h
}

// NewPair returns two links joined by a segment with the given knobs: a has
// MAC 02:00:00:00:00:01 (interface "mem0"), b has 02:00:00:00:00:02
// ("mem1"). a.Hub() changes the knobs at run time.
func NewPair(cfg MemConfig) (a, b *MemLink) {
	h := NewHub(cfg)
	return h.Attach(), h.Attach()
}

// Attach adds a link to the segment. The n-th link attached (from 0) is
// named "mem<n>" and has the locally administered MAC 02:00:xx:xx:xx:xx
// holding n+1 in its last four bytes: 02:00:00:00:00:01, :02, ...
func (h *Hub) Attach() *MemLink {
	h.mu.Lock()
	defer h.mu.Unlock()
	old := h.ports.Load()
	index := len(old.links)
	l := &MemLink{
		hub:      h,
		index:    index,
		name:     "mem" + strconv.Itoa(index),
		done:     make(chan struct{}),
		wake:     make(chan struct{}, 1),
		txResume: make(chan struct{}, 1),
		rng:      rand.New(rand.NewPCG(h.seed, uint64(index))),
	}
	n := uint32(index + 1)
	l.mac = [6]byte{0x02, 0x00, byte(n >> 24), byte(n >> 16), byte(n >> 8), byte(n)}

	ports := &memPorts{
		links: append(old.links[:len(old.links):len(old.links)], l),
		byMAC: make(map[[6]byte]*MemLink, len(old.links)+1),
	}
	for _, p := range ports.links {
		ports.byMAC[p.mac] = p
	}
	h.ports.Store(ports)
	return l
}

// SetConfig changes the fault knobs and the queue length at run time, for
// instance to cut the segment (Loss: 1) and mend it again. It applies to
// the batches sent after it returns; frames already queued keep their
// delivery times. MTU and Seed are fixed at NewHub and ignored here.
func (h *Hub) SetConfig(cfg MemConfig) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.cfg.Store(newMemConf(cfg))
}

// Config returns the segment's current knobs (normalised: defaults filled
// in, probabilities clamped).
func (h *Hub) Config() MemConfig {
	c := h.cfg.Load()
	return MemConfig{
		MTU:         h.mtu,
		Loss:        c.loss,
		Reorder:     c.reorder,
		Duplicate:   c.dup,
		Delay:       time.Duration(c.delay),
		Jitter:      time.Duration(c.jitter),
		QueueLen:    c.queueLen,
		SendWait:    c.sendWait,
		Seed:        int64(h.seed),
		BufferBytes: h.lend,
	}
}

// now is the time in nanoseconds since the hub was made (monotonic).
func (h *Hub) now() int64 { return int64(time.Since(h.epoch)) }

func (h *Hub) getFrame(data []byte) *memFrame {
	f := h.pool.Get().(*memFrame)
	f.buf = append(f.buf[:0], data...)
	return f
}

// memJunk is the byte a frame is overwritten with as it is released.
const memJunk = 0xA5

func (h *Hub) putFrame(f *memFrame) {
	copy(f.buf, h.junk)
	*f = memFrame{buf: f.buf[:0]}
	h.pool.Put(f)
}

// memFrame is one copy of a frame queued for a receiver. Once queued it is
// owned by the receiver and guarded by the receiver's mu.
type memFrame struct {
	buf  []byte
	due  int64  // hub time at which Recv may see it
	seq  uint64 // receiver-assigned; orders frames with equal due
	idx  int    // position in the receiver's heap
	from int    // index of the sending link, while held

	// held: the frame was picked for reordering and waits for the next
	// frame on its path until holdUntil (hub time); it is in the
	// receiver's held list.
	held      bool
	holdUntil int64
}

// frameHeap is a min-heap of frames ordered by (due, seq).
type frameHeap []*memFrame

func (q frameHeap) less(i, j int) bool {
	if q[i].due != q[j].due {
		return q[i].due < q[j].due
	}
	return q[i].seq < q[j].seq
}

func (q frameHeap) swap(i, j int) {
	q[i], q[j] = q[j], q[i]
	q[i].idx = i
	q[j].idx = j
}

func (q frameHeap) up(j int) {
	for j > 0 {
		i := (j - 1) / 2
		if !q.less(j, i) {
			break
		}
		q.swap(i, j)
		j = i
	}
}

func (q frameHeap) down(i int) bool {
	i0 := i
	for {
		j := 2*i + 1
		if j >= len(q) {
			break
		}
		if r := j + 1; r < len(q) && q.less(r, j) {
			j = r
		}
		if !q.less(j, i) {
			break
		}
		q.swap(i, j)
		i = j
	}
	return i > i0
}

func (q *frameHeap) push(f *memFrame) {
	f.idx = len(*q)
	*q = append(*q, f)
	q.up(f.idx)
}

func (q *frameHeap) pop() *memFrame {
	old := *q
	n := len(old) - 1
	old.swap(0, n)
	f := old[n]
	old[n] = nil
	*q = old[:n]
	q.down(0)
	return f
}

// fix restores the heap order after the frame at i changed its key.
func (q frameHeap) fix(i int) {
	if !q.down(i) {
		q.up(i)
	}
}

// memStats are a link's counters; each is written with atomic adds by the
// goroutine that owns the event (sender or receiver) and read by Stats.
type memStats struct {
	txFrames, txBytes           atomic.Uint64 // by Send of this link
	rxFrames, rxBytes           atomic.Uint64 // by Recv of this link
	rxTruncated                 atomic.Uint64 // by Recv of this link
	injectedLoss, injectedDup   atomic.Uint64 // by Send of this link
	injectedReorder, queueDrops atomic.Uint64 // reorder: by Send of this link; drops: by Sends of other links
	txErrors                    atomic.Uint64 // by Send of this link: sends that gave up on a stalled transmit
}

// MemLink is an in-memory [Link], one port of a [Hub]. Make one with
// [NewPair] or [Hub.Attach].
//
// Locking: sendMu and recvMu serialise Send and Recv. mu guards the
// receive queue and is taken by the Sends of the other links of the hub to
// deliver into it. A goroutine holds at most one mu at a time, always after
// (inside) its own sendMu or recvMu, so there is no lock-order cycle.
type MemLink struct {
	hub   *Hub
	index int     // port number in the hub
	name  string  // "mem<index>"
	mac   [6]byte // immutable

	closeOnce sync.Once
	closed    atomic.Bool   // set by Close, before it takes mu
	done      chan struct{} // closed by Close; wakes a blocked Recv

	// partitioned cuts the link off the segment: frames to and from it are
	// lost (counted in the sender's InjectedLoss).
	partitioned atomic.Bool

	// txStalled holds the link's sends (StallTx); txResume, of capacity 1,
	// carries a token from StallTx(false) to a send waiting.
	txStalled atomic.Bool
	txResume  chan struct{}

	// wake, of capacity 1, carries a token from a sender to a Recv waiting
	// for frames (see waiting).
	wake chan struct{}
	// wakeReq is set by Wake: the next Recv that would wait returns at once.
	wakeReq atomic.Bool

	// sendMu serialises Send and guards rng, gather, tails, copier, lent
	// and the lent buffers' freed flags.
	sendMu sync.Mutex
	lent   int // bytes of the buffers AllocBuffer lent and not freed
	// gather adapts SendGather's Gatherer, tails SendTails' Tailer and
	// copier Send's frames to sendBuiltLocked (kept here: no allocation
	// per call).
	gather gatherCopy
	tails  tailCopy
	copier frameCopier
	rng    *rand.Rand // fault-knob draws for the frames this link sends

	// recvMu serialises Recv and RecvVisit and guards timer and visitQ.
	recvMu sync.Mutex
	timer  *time.Timer // wakes Recv at its deadline or the earliest due frame
	visitQ []*memFrame // frames RecvVisit took off q and shows to its visitor

	// mu guards the receive queue below. Senders (Sends of the other links)
	// fill it; Recv empties it; Close discards it.
	mu      sync.Mutex
	q       frameHeap   // queued frames by (due, seq); len(q) <= queueLen
	seq     uint64      // next memFrame.seq
	held    []*memFrame // frames held back for reordering, one per sender at most; all in q
	waiting bool        // Recv is about to wait on wake: a sender must send a token

	stats memStats
}

var (
	_ Link         = (*MemLink)(nil)
	_ Waker        = (*MemLink)(nil)
	_ FrameBuilder = (*MemLink)(nil)
	_ BufferLink   = (*MemLink)(nil)
	_ FrameVisitor = (*MemLink)(nil)
	_ TailSender   = (*MemLink)(nil)
	_ IdleProber   = (*MemLink)(nil)
)

// Wake implements Waker.
func (l *MemLink) Wake() {
	l.wakeReq.Store(true)
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

// Hub returns the segment the link is attached to.
func (l *MemLink) Hub() *Hub { return l.hub }

// Partition cuts the link off its segment (cut true) or reconnects it
// (cut false). While cut, every frame it sends and every frame sent to it
// is dropped and counted in the sender's Stats.InjectedLoss. Frames already
// queued for it stay queued.
func (l *MemLink) Partition(cut bool) { l.partitioned.Store(cut) }

// StallTx stops the link's transmit (stall true), as a kernel that stopped
// draining a NIC's transmit ring (interface down, queue stuck), or starts
// it again (stall false). While stalled, a send waits before its next
// frame; one that waited MemConfig.SendWait fails with ErrTxStalled,
// having sent the frames before, and is counted in Stats.TxErrors. Close
// ends the wait with net.ErrClosed. Receiving is not affected.
func (l *MemLink) StallTx(stall bool) {
	l.txStalled.Store(stall)
	if !stall {
		select {
		case l.txResume <- struct{}{}:
		default:
		}
	}
}

// waitTx waits while the transmit is stalled. l.sendMu is held: the
// link's other sends wait behind this one, as behind a full ring.
func (l *MemLink) waitTx(wait time.Duration) error {
	var timer *time.Timer
	for l.txStalled.Load() {
		if timer == nil {
			timer = time.NewTimer(wait)
			defer timer.Stop()
		}
		select {
		case <-l.txResume: // look again: stalled anew, or a stale token
		case <-l.done:
			return net.ErrClosed
		case <-timer.C:
			l.stats.txErrors.Add(1)
			return fmt.Errorf("transmit stalled for %v: %w", wait, ErrTxStalled)
		}
	}
	return nil
}

func (l *MemLink) opErr(op string, err error) error {
	return &OpError{Op: op, Interface: l.name, Err: err}
}

// Send implements [Link]. It copies each frame into each receiver's queue
// and waits only while the transmit is stalled (StallTx): a full receiving
// queue drops the frame (counted in the receiver's Stats.QueueDrops), like
// a NIC ring. A frame shorter than an
// Ethernet header or longer than MaxFrameLen stops the batch.
func (l *MemLink) Send(frames [][]byte) (int, error) {
	l.sendMu.Lock()
	defer l.sendMu.Unlock()
	l.copier.frames = frames
	defer func() { l.copier.frames = nil }() // do not pin the caller's frames
	return l.sendBuiltLocked(len(frames), &l.copier)
}

// frameCopier builds Send's frames by copying them. A frame too long for
// buf is reported with its own length, so that sendBuiltLocked refuses it
// as Send must.
type frameCopier struct{ frames [][]byte }

func (c *frameCopier) Build(i int, buf []byte) int {
	copy(buf, c.frames[i])
	return len(c.frames[i])
}

// AllocBuffer implements [BufferLink] with ordinary memory: the in-memory
// link copies tails (GatherZeroCopy is false).
func (l *MemLink) AllocBuffer(n int) (*Buffer, error) {
	if n <= 0 {
		return nil, l.opErr("allocate buffer", badAlloc(n))
	}
	if l.closed.Load() {
		return nil, l.opErr("allocate buffer", net.ErrClosed)
	}
	l.sendMu.Lock()
	defer l.sendMu.Unlock()
	if l.hub.lend > 0 && n > l.hub.lend-l.lent {
		return nil, l.opErr("allocate buffer", ErrNoBufferSpace)
	}
	l.lent += n
	return &Buffer{mem: make([]byte, n), owner: l}, nil
}

// freeBuffer marks b freed and gives its bytes back to the bound; sendMu
// guards the flag, as SendGather reads it. The tails of frames sent from b
// were copied, so the room is free at once.
func (l *MemLink) freeBuffer(b *Buffer) {
	l.sendMu.Lock()
	if !b.freed {
		b.freed = true
		l.lent -= len(b.mem)
	}
	l.sendMu.Unlock()
}

// SendGather implements [BufferLink]: tails are copied behind their heads.
func (l *MemLink) SendGather(n int, g Gatherer) (int, error) {
	if l.closed.Load() { // a closed link says so first
		return 0, l.opErr("send", net.ErrClosed)
	}
	if g == nil {
		return 0, l.opErr("send", errNilGatherer)
	}
	l.sendMu.Lock()
	defer l.sendMu.Unlock()
	c := &l.gather
	*c = gatherCopy{g: g, owner: l, maxLen: l.hub.mtu + EthHeaderLen}
	sent, err := l.sendBuiltLocked(n, c)
	if c.err != nil {
		err = l.opErr("send", c.err)
	}
	*c = gatherCopy{}
	return sent, err
}

// SendTails implements [TailSender]: tails are copied behind their heads.
func (l *MemLink) SendTails(n int, t Tailer) (int, error) {
	if l.closed.Load() { // a closed link says so first
		return 0, l.opErr("send", net.ErrClosed)
	}
	if t == nil {
		return 0, l.opErr("send", errNilTailer)
	}
	l.sendMu.Lock()
	defer l.sendMu.Unlock()
	l.tails = tailCopy{t: t, maxLen: l.hub.mtu + EthHeaderLen}
	defer func() { l.tails = tailCopy{} }()
	return l.sendBuiltLocked(n, &l.tails)
}

// GatherZeroCopy implements [BufferLink]: the in-memory link copies.
func (*MemLink) GatherZeroCopy() bool { return false }

// BufferSent implements [BufferLink]: SendGather copied the tails, so the
// frames sent from a buffer are done with it when SendGather returns.
func (*MemLink) BufferSent(*Buffer) bool { return true }

// SendBuilt implements [FrameBuilder]: each frame is built in a frame
// buffer of the hub's pool, which is queued as it is for its receiver (a
// broadcast frame is copied for every receiver but the last). Otherwise it
// behaves as Send.
func (l *MemLink) SendBuilt(n int, b Builder) (int, error) {
	if l.closed.Load() { // a closed link says so first
		return 0, l.opErr("send", net.ErrClosed)
	}
	if b == nil {
		return 0, l.opErr("send", errNilBuilder)
	}
	return l.sendBuilt(n, b)
}

func (l *MemLink) sendBuilt(n int, b Builder) (int, error) {
	l.sendMu.Lock()
	defer l.sendMu.Unlock()
	return l.sendBuiltLocked(n, b)
}

func (l *MemLink) sendBuiltLocked(n int, b Builder) (int, error) {
	if l.closed.Load() {
		return 0, l.opErr("send", net.ErrClosed)
	}
	h := l.hub
	c := h.cfg.Load()
	ports := h.ports.Load()
	maxLen := h.mtu + EthHeaderLen
	var txBytes uint64
	sent := 0
	defer func() {
		l.stats.txFrames.Add(uint64(sent))
		l.stats.txBytes.Add(txBytes)
	}()
	for i := 0; i < n; i++ {
		if l.closed.Load() {
			return sent, l.opErr("send", net.ErrClosed)
		}
		if l.txStalled.Load() {
			if err := l.waitTx(c.sendWait); err != nil {
				return sent, l.opErr("send", err)
			}
		}
		f := h.pool.Get().(*memFrame)
		if cap(f.buf) < maxLen {
			f.buf = make([]byte, 0, maxLen)
		}
		buf := f.buf[:maxLen:maxLen]
		size := b.Build(i, buf)
		if err := checkBuilt(size, maxLen); err != nil {
			h.putFrame(f)
			return sent, l.opErr("send", err)
		}
		f.buf = buf[:size]
		data := f.buf
		now := h.now()
		if data[0]&1 != 0 {
			// Every other link gets a copy; the last one gets f itself.
			var last *MemLink
			for _, r := range ports.links {
				if r == l {
					continue
				}
				if last != nil {
					l.deliver(last, data, c, now, nil)
				}
				last = r
			}
			if last != nil {
				l.deliver(last, data, c, now, f)
			} else {
				h.putFrame(f)
			}
		} else if r := ports.byMAC[[6]byte(data[:6])]; r != nil && r != l {
			l.deliver(r, data, c, now, f)
		} else {
			h.putFrame(f)
		}
		sent++
		txBytes += uint64(size)
	}
	return sent, nil
}

// deliver applies the fault knobs to one copy of data sent at hub time now
// and queues it for r. l.sendMu is held. With own set (a pooled frame
// holding data), deliver queues own instead of a copy of data and takes
// ownership of it either way.
func (l *MemLink) deliver(r *MemLink, data []byte, c *memConf, now int64, own *memFrame) {
	drop := func() {
		l.stats.injectedLoss.Add(1)
		if own != nil {
			l.hub.putFrame(own)
		}
	}
	if l.partitioned.Load() || r.partitioned.Load() {
		drop()
		return
	}
	if c.loss > 0 && l.rng.Float64() < c.loss {
		drop()
		return
	}
	dup := c.dup > 0 && l.rng.Float64() < c.dup
	reorder := !dup && c.reorder > 0 && l.rng.Float64() < c.reorder
	due := now + c.delay
	if c.jitter > 0 {
		due += l.rng.Int64N(c.jitter)
	}

	// Copy outside r.mu.
	h := l.hub
	f := own
	if f == nil {
		f = h.getFrame(data)
	}
	var f2 *memFrame
	if dup {
		f2 = h.getFrame(data)
	}

	r.mu.Lock()
	if r.closed.Load() {
		r.mu.Unlock()
		h.putFrame(f)
		if f2 != nil {
			h.putFrame(f2)
		}
		return
	}
	oldTop := int64(-1)
	if len(r.q) > 0 {
		oldTop = r.q[0].due
	}
	queued := r.enqueueLocked(f, due, c.queueLen)
	// The copy right behind f, before a frame released below.
	// (enqueueLocked frees a frame it drops.)
	if f2 != nil && r.enqueueLocked(f2, due, c.queueLen) {
		l.stats.injectedDup.Add(1)
	}
	if queued {
		// Release the frame held back on this path, if any, right after f
		// (and its copy).
		for i, hf := range r.held {
			if hf.from != l.index {
				continue
			}
			r.unholdLocked(i)
			if now < hf.holdUntil {
				hf.due = f.due
				hf.seq = r.seq
				r.seq++
				r.q.fix(hf.idx)
				l.stats.injectedReorder.Add(1)
				reorder = false // f is the frame hf waited for
			}
			break
		}
		if reorder {
			f.held = true
			f.from = l.index
			f.holdUntil = now + int64(memReorderHold)
			f.due += int64(memReorderHold)
			r.q.fix(f.idx)
			r.held = append(r.held, f)
		}
	}
	if r.waiting && len(r.q) > 0 && (oldTop < 0 || r.q[0].due < oldTop) {
		r.waiting = false
		select {
		case r.wake <- struct{}{}:
		default:
		}
	}
	r.mu.Unlock()
}

// enqueueLocked queues f with the given due time, or drops it (counting a
// queue drop) when the queue is full. l.mu is held.
func (l *MemLink) enqueueLocked(f *memFrame, due int64, queueLen int) bool {
	if len(l.q) >= queueLen {
		l.stats.queueDrops.Add(1)
		l.hub.putFrame(f)
		return false
	}
	f.due = due
	f.seq = l.seq
	l.seq++
	l.q.push(f)
	return true
}

// unholdLocked removes l.held[i] from the held list. l.mu is held.
func (l *MemLink) unholdLocked(i int) {
	hf := l.held[i]
	hf.held = false
	last := len(l.held) - 1
	l.held[i] = l.held[last]
	l.held[last] = nil
	l.held = l.held[:last]
}

// Recv implements [Link]. It returns the queued frames whose delivery time
// has come, earliest first. sizes[i] is the number of bytes stored in
// bufs[i]: the frame's length, or len(bufs[i]) for a truncated frame.
func (l *MemLink) Recv(bufs [][]byte, sizes []int, timeout time.Duration) (int, error) {
	l.recvMu.Lock()
	defer l.recvMu.Unlock()
	if len(sizes) < len(bufs) {
		return 0, l.opErr("recv", shortSizes(len(bufs), len(sizes)))
	}
	return l.recvLocked(bufs, sizes, len(bufs), nil, timeout)
}

// RecvVisit implements [FrameVisitor]: the frames due are taken off the
// receive queue (under the queue lock, which senders need) and then shown
// to v where they lie, in their pooled buffers.
func (l *MemLink) RecvVisit(max int, timeout time.Duration, v Visitor) (int, error) {
	l.recvMu.Lock()
	defer l.recvMu.Unlock()
	if l.closed.Load() {
		return 0, l.opErr("recv", net.ErrClosed)
	}
	if v == nil {
		return 0, l.opErr("recv", errNilVisitor)
	}
	if max <= 0 {
		return 0, nil
	}
	return l.recvLocked(nil, nil, max, v, timeout)
}

// RxFrames implements RxBudget: the frames the link's queue holds
// (MemConfig.QueueLen).
func (l *MemLink) RxFrames() int { return l.hub.cfg.Load().queueLen }

// RxIdle implements IdleProber: the receive queue is empty (a frame
// queued but not yet due counts as one).
func (l *MemLink) RxIdle() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.q) == 0
}

// recvLocked is Recv of up to max frames into bufs or, with a visitor v,
// RecvVisit of up to max frames. recvMu is held.
func (l *MemLink) recvLocked(bufs [][]byte, sizes []int, max int, v Visitor, timeout time.Duration) (int, error) {
	h := l.hub
	var deadline int64
	if timeout > 0 {
		deadline = h.now() + int64(timeout)
	}
	for {
		now := h.now()
		l.mu.Lock()
		l.waiting = false
		if l.closed.Load() {
			l.mu.Unlock()
			return 0, l.opErr("recv", net.ErrClosed)
		}
		var n int
		if v == nil {
			n = l.popDueLocked(bufs, sizes, now)
		} else {
			n = l.popDueVisitLocked(max, now)
		}
		if n > 0 || max == 0 || timeout == 0 || l.wakeReq.Swap(false) {
			l.mu.Unlock()
			if v != nil && n > 0 {
				l.visitPopped(v)
			}
			return n, nil
		}
		wait := int64(-1) // forever
		if timeout > 0 {
			if now >= deadline {
				l.mu.Unlock()
				return 0, nil
			}
			wait = deadline - now
		}
		if len(l.q) > 0 {
			// The earliest frame is not due yet (else n > 0).
			if d := l.q[0].due - now; wait < 0 || d < wait {
				wait = d
			}
		}
		l.waiting = true
		l.mu.Unlock()

		var tc <-chan time.Time
		if wait >= 0 {
			if l.timer == nil {
				l.timer = time.NewTimer(time.Duration(wait))
			} else {
				l.timer.Reset(time.Duration(wait))
			}
			tc = l.timer.C
		}
		select {
		case <-l.wake:
		case <-tc:
		case <-l.done:
		}
		if tc != nil {
			l.timer.Stop()
		}
	}
}

// popDueLocked copies out the frames due at now, up to len(bufs). l.mu is
// held.
func (l *MemLink) popDueLocked(bufs [][]byte, sizes []int, now int64) int {
	n := 0
	var rxBytes, truncated uint64
	for n < len(bufs) && len(l.q) > 0 && l.q[0].due <= now {
		f := l.q.pop()
		if f.held {
			for i, hf := range l.held {
				if hf == f {
					l.unholdLocked(i)
					break
				}
			}
		}
		c := copy(bufs[n], f.buf)
		if c < len(f.buf) {
			truncated++
		}
		sizes[n] = c
		rxBytes += uint64(c)
		l.hub.putFrame(f)
		n++
	}
	if n > 0 {
		l.stats.rxFrames.Add(uint64(n))
		l.stats.rxBytes.Add(rxBytes)
		if truncated > 0 {
			l.stats.rxTruncated.Add(truncated)
		}
	}
	return n
}

// popDueVisitLocked moves the frames due at now, up to max, from the queue
// to visitQ and counts them. l.mu and l.recvMu are held.
func (l *MemLink) popDueVisitLocked(max int, now int64) int {
	clear(l.visitQ)
	l.visitQ = l.visitQ[:0]
	var rxBytes uint64
	for len(l.visitQ) < max && len(l.q) > 0 && l.q[0].due <= now {
		f := l.q.pop()
		if f.held {
			for i, hf := range l.held {
				if hf == f {
					l.unholdLocked(i)
					break
				}
			}
		}
		l.visitQ = append(l.visitQ, f)
		rxBytes += uint64(len(f.buf))
	}
	if n := len(l.visitQ); n > 0 {
		l.stats.rxFrames.Add(uint64(n))
		l.stats.rxBytes.Add(rxBytes)
	}
	return len(l.visitQ)
}

// visitPopped shows the frames of visitQ to v and returns them to the pool.
// l.recvMu is held, l.mu is not.
func (l *MemLink) visitPopped(v Visitor) {
	for i, f := range l.visitQ {
		l.visitQ[i] = nil
		v.Visit(f.buf[:len(f.buf):len(f.buf)])
		l.hub.putFrame(f)
	}
	l.visitQ = l.visitQ[:0]
}

// HardwareAddr implements [Link].
func (l *MemLink) HardwareAddr() net.HardwareAddr {
	mac := l.mac
	return mac[:]
}

// MTU implements [Link].
func (l *MemLink) MTU() int { return l.hub.mtu }

// Info implements [Link]: Kind "mem", Interface "mem<n>", Queue -1 and the
// segment's current knobs as Mode ("ideal" when there are none).
func (l *MemLink) Info() Info {
	return Info{Kind: "mem", Interface: l.name, Queue: -1, Mode: l.hub.cfg.Load().mode}
}

// Stats implements [Link]. The Tx and Injected counters count the frames
// this link sent; QueueDrops and the Rx counters the frames sent to it.
func (l *MemLink) Stats() Stats {
	s := &l.stats
	return Stats{
		TxFrames:          s.txFrames.Load(),
		TxBytes:           s.txBytes.Load(),
		RxFrames:          s.rxFrames.Load(),
		RxBytes:           s.rxBytes.Load(),
		RxTruncated:       s.rxTruncated.Load(),
		InjectedLoss:      s.injectedLoss.Load(),
		InjectedDuplicate: s.injectedDup.Load(),
		InjectedReorder:   s.injectedReorder.Load(),
		QueueDrops:        s.queueDrops.Load(),
		TxErrors:          s.txErrors.Load(),
	}
}

// Close implements [Link]. It discards the frames queued for the link;
// frames sent to it afterwards are dropped. The other links of the hub are
// not affected.
func (l *MemLink) Close() error {
	l.closeOnce.Do(func() {
		l.closed.Store(true)
		close(l.done) // ends a Recv waiting
		// Wait for the calls under way, as the kernel links do: once
		// Close returns no Send, Build, Recv or Visit of this link runs.
		l.recvMu.Lock()
		l.sendMu.Lock()
		l.mu.Lock()
		for i, f := range l.q {
			l.hub.putFrame(f)
			l.q[i] = nil
		}
		l.q = nil
		l.held = nil
		l.mu.Unlock()
		l.sendMu.Unlock()
		l.recvMu.Unlock()
	})
	return nil
}
