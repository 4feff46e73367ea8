package xdp

import (
	"errors"
	"fmt"
	"net"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/xmx-stack/xmx/bpf"
)

// BindMode chooses how an AF_XDP socket moves frames.
type BindMode int

const (
	// BindAuto binds in zero-copy mode where the driver allows it and in
	// copy mode otherwise.
	BindAuto BindMode = iota
	// BindZeroCopy requires zero-copy mode (XDP_ZEROCOPY).
	BindZeroCopy
	// BindCopy forces copy mode (XDP_COPY).
	BindCopy
)

func (m BindMode) String() string {
	switch m {
	case BindAuto:
		return "auto"
	case BindZeroCopy:
		return "zerocopy"
	case BindCopy:
		return "copy"
	}
	return fmt.Sprintf("BindMode(%d)", int(m))
}

// AFXDPConfig configures an AF_XDP link.
type AFXDPConfig struct {
	Interface string
	Queue     int    // the receive queue the socket binds to
	EtherType uint16 // steered to the socket; 0 → DefaultEtherType

	// FrameSize is the size of one UMEM frame: 2048 or 4096 (0 → DefaultFrameSize).
	// A received frame fits in FrameSize minus 256 bytes of XDP headroom, a
	// sent one in FrameSize; a longer frame (MTU+14 > FrameSize-256) needs
	// multi-buffer (see MultiBuffer), which the link then uses by itself.
	FrameSize int
	// NumFrames is the number of UMEM frames, a power of two (0 → 4096):
	// half receive, half transmit. Of the receive frames, the link gives
	// the kernel only as many as the traffic needs (see RxLevel).
	NumFrames int
	// RxLevel, if above 0, is how many receive frames the kernel holds
	// while the traffic comes in small batches (at most half of
	// NumFrames; 0: always all of them, and a burst as large is never
	// dropped). The fill ring is FIFO: a frame given back is used again
	// only after all the others on the ring, so with every receive frame
	// on it each packet lands in a page not touched for thousands of
	// packets, and the kernel's copy into it and our read of it miss the
	// caches and the TLB; a few frames in turn stay warm (QuietRxLevel).
	// The link raises the level to every receive frame as soon as one
	// receive finds half the level waiting, and lowers it by halves while
	// the batches stay small; but a burst larger than the level that
	// comes while nobody receives is dropped in part (RxDropped), which
	// only a protocol that recovers lost frames should accept.
	RxLevel int

	Bind   BindMode       // zero-copy or copy; BindAuto by default
	Attach bpf.AttachMode // XDP attach mode; AttachAuto (driver, then generic)

	// MultiBuffer forces multi-buffer mode even when the MTU fits one UMEM
	// frame. Multi-buffer mode is used without asking when it does not
	// (MTU+14 > FrameSize-256, e.g. MTU 9000): the socket is bound with
	// XDP_USE_SG, the steering program is its xdp.frags variant, and a
	// frame may span several UMEM frames and ring descriptors, which Send
	// splits and Recv reassembles. The links of this process on one
	// interface share one steering program, so they must all be
	// multi-buffer or all not. Needs Linux 6.6 or later.
	MultiBuffer bool

	// Spin makes a waiting Recv spin on the RX ring instead of sleeping in
	// poll(2): lowest latency, one CPU burnt while waiting.
	Spin bool

	// SendTimeout bounds how long Send waits for transmit space before
	// failing with ErrTxStalled (0 → 1 s).
	SendTimeout time.Duration

	// BufferBytes is the size of the buffer area, UMEM lent by AllocBuffer
	// for frames sent without a copy (SendGather), rounded up to whole
	// frames; 0: none. With a buffer area, a link that need not be
	// multi-buffer binds in zero-copy mode with XDP_USE_SG when the driver
	// allows it, and falls back to copy mode without it.
	BufferBytes int
	// Gather says how SendGather sends tails (see GatherMode).
	Gather GatherMode
}

// GatherMode says how an AF_XDP link sends the tail of a gathered frame.
type GatherMode int

const (
	// GatherAuto: as TX descriptors of their own when the socket is bound
	// in zero-copy and multi-buffer mode (the NIC reads the buffer, the
	// CPU copies nothing), or when frames span several UMEM frames anyway
	// (jumbo MTUs: the tail's descriptors replace the slot's, and our copy
	// is saved); copied behind the head otherwise. In copy mode with
	// frames that fit one UMEM frame, one descriptor per frame is the
	// cheaper way: the kernel copies every descriptor into a socket buffer
	// anyway, and allocates a page per extra one.
	GatherAuto GatherMode = iota
	// GatherDescriptors: always as descriptors of their own (the socket is
	// bound in multi-buffer mode, as with MultiBuffer).
	GatherDescriptors
	// GatherCopy: always copied behind the head.
	GatherCopy
)

// AFXDPLink is a Link on one AF_XDP socket bound to one (interface, queue).
//
// The UMEM is split in two fixed halves. Receive frames live on the fill
// ring, are handed back by the kernel on the RX ring, copied out by Recv and
// returned to the fill ring at once; they belong to the receive side. Send
// frames wait on txFree (in slots, below), are copied into by Send, go out
// on the TX ring and come back on the completion ring; they belong to the
// send side. The two
// sides share no mutable state but the counters, so Send and Recv run
// concurrently without contention.
//
// In multi-buffer mode (sg) an Ethernet frame (a "packet" in the kernel's
// words) may occupy several UMEM frames, one ring descriptor each, all but
// the last flagged XDP_PKT_CONTD. Ownership is unchanged: every UMEM frame
// of a received packet goes back to the fill ring when Recv consumes the
// packet, every UMEM frame of a sent one comes back on the completion ring
// by itself. A packet is only ever consumed, or queued, whole.
//
// The send half is handed out in slots of txDescs(MaxFrameLen) adjacent
// UMEM frames, one slot per packet whatever its length: a single frame
// without multi-buffer, a run of frames with it (three of 4096 bytes at MTU
// 9000), so that a packet is contiguous in the UMEM and SendBuilt can have
// it built in place. txFree holds the idle slots; a slot is idle again once
// every descriptor of its packet has completed (txPending counts them).
//
// SendBuilt and RecvVisit (FrameBuilder, FrameVisitor; afxdp_build_linux.go)
// skip the copies: the caller builds frames in idle send slots and reads
// received ones where the kernel put them, under the same locks and with
// the same ownership as Send and Recv.
//
// Send, SendBuilt, Recv and RecvVisit take only the lock of their side
// (txMu, rxMu), and look at closed under it: Close sets closed, wakes the
// callers asleep in poll, and takes both locks before it releases the
// rings and the socket. A poll with nothing to do takes no lock at all
// (RxIdle).
//
// LOCK ORDERING: closeMu > rxMu, closeMu > txMu.
type AFXDPLink struct {
	ifname    string
	ifindex   int
	queue     int
	hw        net.HardwareAddr
	mtu       int
	maxFrame  int
	frameSize uint64
	spin      bool
	zeroCopy  bool
	sg        bool // multi-buffer: XDP_USE_SG, xdp.frags steering program
	sgIfZC    bool // try XDP_USE_SG with zero-copy only (for gathered tails)
	gatherDsc bool // SendGather sends tails as descriptors of their own
	sendWait  time.Duration
	attach    bpf.AttachMode
	steerKey  steerKey
	steer     *steerEntry

	// zcSegs is the driver's xdp-zc-max-segs (0: unknown, or copy mode
	// asked for), read before the bind; maxDescs is the most descriptors
	// a sent packet may take in the mode bound (copyModeMaxDescs, or
	// zcSegs in zero-copy mode). Set at open; maxDescs is read under
	// txMu, where tests lower it.
	zcSegs   int
	maxDescs int

	fd   int    // the AF_XDP socket
	efd  int    // eventfd written by Close to wake blocked callers
	wk   waker  // Wake's eventfd and flag
	umem []byte // the UMEM mapping

	closed atomic.Bool
	shut   atomic.Bool // Close has closed the socket: the kernel holds no descriptor
	// closeMu is held shared by the calls other than Send and Recv and
	// their in-place forms that use fd or wk (Wake, Stats) or lend the
	// UMEM (AllocBuffer), and exclusively by Close, once, before it
	// releases them: a barrier after which those calls see closed.
	closeMu sync.RWMutex

	// idle points at the RX ring's producer and consumer indices and the
	// fill ring's flags, for RxIdle, which looks without a lock. Set at
	// open, never changed: Close retires the two rings (ring.retire)
	// rather than unmapping them, and a cleanup unmaps the placeholders
	// once the link is unreachable.
	idle struct{ rxProd, rxCons, fillFlags *uint32 }

	rxMu sync.Mutex
	// +checklocks:rxMu
	rx descRing
	// +checklocks:rxMu
	fill addrRing
	// +checklocks:rxMu
	rxPoll [3]unix.PollFd // socket, close eventfd, wake eventfd
	// +checklocks:rxMu
	rxTimer recvTimer
	// rxScratch reassembles a multi-buffer packet for RecvVisit.
	// +checklocks:rxMu
	rxScratch []byte
	// lvl decides how many receive frames the kernel holds.
	// +checklocks:rxMu
	lvl rxLevel
	// traceSide is the log this link's trace points go to (xmxtrace).
	traceSide int

	txMu sync.Mutex
	// txStalled says that the last kick left frames on the TX ring (the
	// kernel refused them for now): receives kick again (kickStalled),
	// and RxIdle says not idle so that pollers come to receive. Written
	// under txMu.
	txStalled atomic.Bool
	// gone is the errno with which the kernel said that the interface
	// went away (0: it has not): the socket is unbound for good. Set
	// once, by a receive (askGone, or a kick) or a send (a kick); read
	// by every call.
	gone atomic.Uint32
	// siblings are the links of the other queues of the interface, when
	// l is one queue of an AFXDPMultiLink (set at its open, l included):
	// markGone marks them too.
	siblings []*AFXDPLink
	// +checklocks:txMu
	tx descRing
	// +checklocks:txMu
	comp addrRing
	// +checklocks:txMu
	txFree []uint64 // UMEM addresses of idle send slots (a stack)
	// txPending counts the descriptors in flight of each send slot.
	// +checklocks:txMu
	txPending []uint8
	txBase    uint64 // UMEM address of the first send slot
	txSlot    uint64 // bytes per send slot: txDescs(maxFrame) frames
	// +checklocks:txMu
	txPoll [2]unix.PollFd
	// txStuck: a send waited sendWait and no frame completed since
	// (waitTx): sends that find no room fail at once.
	// +checklocks:txMu
	txStuck bool

	// The buffer area (AllocBuffer): UMEM frames from bufBase on, lent to
	// callers, guarded by txMu like the rest of the send side. bufOwner
	// names the buffer holding each of its frames (nil: idle); bufLive
	// counts the buffers not freed: the UMEM stays mapped after Close
	// until it is 0 (umemKept).
	bufBase uint64
	// +checklocks:txMu
	bufOwner []*Buffer
	// +checklocks:txMu
	bufLive int
	// +checklocks:txMu
	umemKept bool

	rxFrames, rxBytes, rxTrunc atomic.Uint64
	txFrames, txBytes, txErrs  atomic.Uint64
	wakeups, badDescs          atomic.Uint64

	// final is the kernel's XDP_STATISTICS read just before Close.
	// +checklocks:closeMu
	final unix.XDPStatistics
}

var (
	_ Link             = (*AFXDPLink)(nil)
	_ Waker            = (*AFXDPLink)(nil)
	_ WaitMeter        = (*AFXDPLink)(nil)
	_ IdleProber       = (*AFXDPLink)(nil)
	_ InterfaceChecker = (*AFXDPLink)(nil)
	_ FrameBuilder     = (*AFXDPLink)(nil)
	_ FrameVisitor     = (*AFXDPLink)(nil)
	_ BufferLink       = (*AFXDPLink)(nil)
)

// bindBusyWait bounds how long bind retries while the queue is still held
// by a socket closed moments ago.
const bindBusyWait = 2 * time.Second

// xdpHeadroom is the headroom the kernel keeps in front of every received
// frame in aligned UMEM mode.
const xdpHeadroom = unix.XDP_PACKET_HEADROOM

// OpenAFXDP opens an AF_XDP link on cfg.Interface and cfg.Queue, attaching
// the steering program (shared by every link of this process on the
// interface) so that frames of cfg.EtherType reach the socket and all others
// reach the kernel. The calling goroutine's network namespace is used: a
// caller that switched namespaces must keep its OS thread locked.
func OpenAFXDP(cfg AFXDPConfig) (_ *AFXDPLink, err error) {
	if cfg.FrameSize == 0 {
		cfg.FrameSize = DefaultFrameSize
	}
	if cfg.NumFrames == 0 {
		cfg.NumFrames = 4096
	}
	if cfg.EtherType == 0 {
		cfg.EtherType = DefaultEtherType
	}
	if cfg.SendTimeout <= 0 {
		cfg.SendTimeout = time.Second
	}
	if cfg.FrameSize != 2048 && cfg.FrameSize != 4096 {
		return nil, fmt.Errorf("xdp: open AF_XDP: frame size %d: must be 2048 or 4096", cfg.FrameSize)
	}
	if err := bpf.CheckEtherType(cfg.EtherType); err != nil {
		return nil, &OpError{Op: "open AF_XDP", Interface: cfg.Interface, Err: err}
	}
	if err := checkRingSize("xdp: open AF_XDP: frame count", cfg.NumFrames); err != nil || cfg.NumFrames < 4 {
		return nil, fmt.Errorf("xdp: open AF_XDP: frame count %d: must be a power of two, at least 4", cfg.NumFrames)
	}
	if cfg.Queue < 0 {
		return nil, fmt.Errorf("xdp: open AF_XDP: queue %d: must not be negative", cfg.Queue)
	}
	if cfg.BufferBytes < 0 || cfg.BufferBytes > MaxBufferBytes {
		return nil, fmt.Errorf("xdp: open AF_XDP: buffer area of %d bytes: want 0..1 GiB", cfg.BufferBytes)
	}
	bufFrames := (cfg.BufferBytes + cfg.FrameSize - 1) / cfg.FrameSize
	ifi, err := net.InterfaceByName(cfg.Interface)
	if err == nil && len(ifi.HardwareAddr) != 6 {
		err = ErrNotEthernet
	}
	if err != nil {
		return nil, &OpError{Op: "open AF_XDP", Interface: cfg.Interface, Err: err}
	}
	if cfg.Gather < GatherAuto || cfg.Gather > GatherCopy {
		return nil, fmt.Errorf("xdp: open AF_XDP: gather mode %d unknown", cfg.Gather)
	}
	sg, err := multiBufferNeeded(ifi.MTU, cfg.FrameSize, cfg.NumFrames, cfg.MultiBuffer || cfg.Gather == GatherDescriptors)
	if err != nil {
		return nil, &OpError{Op: "open AF_XDP", Interface: cfg.Interface, Err: err}
	}

	l := &AFXDPLink{
		ifname:    ifi.Name,
		ifindex:   ifi.Index,
		queue:     cfg.Queue,
		hw:        ifi.HardwareAddr,
		mtu:       ifi.MTU,
		maxFrame:  ifi.MTU + EthHeaderLen,
		frameSize: uint64(cfg.FrameSize),
		spin:      cfg.Spin,
		sg:        sg,
		sgIfZC:    !sg && cfg.BufferBytes > 0 && cfg.Gather == GatherAuto,
		sendWait:  cfg.SendTimeout,
		fd:        -1,
		efd:       -1,
		traceSide: nextTraceSide(),
	}
	// Undo partial set-up in reverse order on failure.
	var undo []func()
	defer func() {
		if err != nil {
			for i := len(undo) - 1; i >= 0; i-- {
				undo[i]()
			}
		}
	}()
	fail := func(op string, e error) error { return &OpError{Op: op, Interface: l.ifname, Err: e} }

	l.fd, err = unix.Socket(unix.AF_XDP, unix.SOCK_RAW|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		if errors.Is(err, unix.EAFNOSUPPORT) {
			err = fmt.Errorf("%w: %w (kernel without CONFIG_XDP_SOCKETS)", err, ErrNotSupported)
		}
		return nil, fail("create AF_XDP socket", err)
	}
	undo = append(undo, func() { unix.Close(l.fd) })

	l.umem, err = unix.Mmap(-1, 0, (cfg.NumFrames+bufFrames)*cfg.FrameSize, unix.PROT_READ|unix.PROT_WRITE,
		unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_POPULATE)
	if err != nil {
		return nil, fail("map UMEM", err)
	}
	undo = append(undo, func() { unix.Munmap(l.umem) })

	reg := unix.XDPUmemReg{
		Addr: uint64(uintptr(unsafe.Pointer(&l.umem[0]))),
		Len:  uint64(len(l.umem)),
		Size: uint32(cfg.FrameSize),
	}
	if err := setsockopt(l.fd, unix.SOL_XDP, unix.XDP_UMEM_REG, unsafe.Pointer(&reg), unsafe.Sizeof(reg)); err != nil {
		return nil, fail("register UMEM", err)
	}
	half := cfg.NumFrames / 2
	for _, r := range []struct {
		opt  int
		name string
	}{
		{unix.XDP_UMEM_FILL_RING, "size fill ring"},
		{unix.XDP_UMEM_COMPLETION_RING, "size completion ring"},
		{unix.XDP_RX_RING, "size RX ring"},
		{unix.XDP_TX_RING, "size TX ring"},
	} {
		if err := unix.SetsockoptInt(l.fd, unix.SOL_XDP, r.opt, half); err != nil {
			return nil, fail(r.name, err)
		}
	}
	var off unix.XDPMmapOffsets
	if err := getsockopt(l.fd, unix.SOL_XDP, unix.XDP_MMAP_OFFSETS, unsafe.Pointer(&off), unsafe.Sizeof(off)); err != nil {
		return nil, fail("read ring offsets", err)
	}
	size := uint32(half)
	if err := l.fill.mmap(l.fd, unix.XDP_UMEM_PGOFF_FILL_RING, off.Fr, size); err != nil {
		return nil, fail("map fill ring", err)
	}
	undo = append(undo, func() { l.fill.unmap() })
	if err := l.comp.mmap(l.fd, unix.XDP_UMEM_PGOFF_COMPLETION_RING, off.Cr, size); err != nil {
		return nil, fail("map completion ring", err)
	}
	undo = append(undo, func() { l.comp.unmap() })
	if err := l.rx.mmap(l.fd, unix.XDP_PGOFF_RX_RING, off.Rx, size); err != nil {
		return nil, fail("map RX ring", err)
	}
	undo = append(undo, func() { l.rx.unmap() })
	l.pointIdle()
	if err := l.tx.mmap(l.fd, unix.XDP_PGOFF_TX_RING, off.Tx, size); err != nil {
		return nil, fail("map TX ring", err)
	}
	undo = append(undo, func() { l.tx.unmap() })

	// Receive frames: the level's on the fill ring, the others spare.
	// Send frames: all idle.
	rxRoom := int(l.frameSize) - xdpHeadroom
	l.lvl.init(cfg.RxLevel, half, l.frameSize, (l.maxFrame+rxRoom-1)/rxRoom)
	l.fill.free(l.fill.size) // reads the consumer: the cached view starts true
	for _, a := range l.lvl.take(l.lvl.target) {
		l.fill.addrs[l.fill.cachedProd&l.fill.mask] = a
		l.fill.cachedProd++
	}
	l.fill.submit()
	l.initTxFree(cfg.NumFrames)
	l.bufBase = uint64(cfg.NumFrames) * l.frameSize
	l.bufOwner = make([]*Buffer, bufFrames)
	if cfg.Bind != BindCopy {
		l.zcSegs = driverZCMaxSegs(l.ifindex)
	}
	if err := l.bind(cfg.Bind); err != nil {
		return nil, fail("bind AF_XDP socket to queue "+fmt.Sprint(cfg.Queue), err)
	}
	l.maxDescs = copyModeMaxDescs
	if l.zeroCopy && l.zcSegs > 0 {
		l.maxDescs = l.zcSegs
	}
	if l.sg {
		l.rxScratch = make([]byte, 0, l.maxFrame)
	}
	l.gatherDsc = l.sg && (cfg.Gather == GatherDescriptors ||
		cfg.Gather == GatherAuto && (l.zeroCopy || l.maxFrame > int(l.frameSize)))
	if need := l.gatherSlots(); l.gatherDsc && need > int(l.tx.size) {
		// A gathered frame reserves more send ring entries than the ring
		// has: no such send could ever start.
		if cfg.Gather == GatherDescriptors {
			return nil, fail("open AF_XDP", fmt.Errorf("frame count %d: a gathered %d-byte frame reserves %d send ring entries, the ring has %d: %w",
				cfg.NumFrames, l.maxFrame, need, l.tx.size, ErrNotSupported))
		}
		l.gatherDsc = false // tails are copied behind their heads
	}

	l.efd, err = newEventFd()
	if err != nil {
		return nil, fail("create eventfd", err)
	}
	undo = append(undo, func() { unix.Close(l.efd) })
	if err := l.wk.open(); err != nil {
		return nil, fail("create eventfd", err)
	}
	undo = append(undo, func() { unix.Close(l.wk.fd) })
	l.rxPoll = [3]unix.PollFd{
		{Fd: int32(l.fd), Events: unix.POLLIN},
		{Fd: int32(l.efd), Events: unix.POLLIN},
		{Fd: int32(l.wk.fd), Events: unix.POLLIN},
	}
	l.txPoll = [2]unix.PollFd{{Fd: int32(l.fd), Events: unix.POLLOUT}, {Fd: int32(l.efd), Events: unix.POLLIN}}

	steerOpts := bpf.LoadOptions{EtherType: cfg.EtherType, Frags: l.sg, HardwareAddr: [6]byte(l.hw)}
	l.steerKey, l.steer, err = acquireSteering(l.ifname, l.ifindex, steerOpts, cfg.Attach)
	if err != nil {
		return nil, err
	}
	undo = append(undo, func() { releaseSteering(l.steerKey, l.steer, -1) })
	l.attach = l.steer.mode
	if err := l.steer.steer.Register(l.queue, l.fd); err != nil {
		return nil, fail("register socket in XSKMAP", err)
	}
	return l, nil
}

// bind binds the socket in the requested mode, falling back from zero-copy
// to copy mode under BindAuto when the driver refuses zero-copy.
func (l *AFXDPLink) bind(mode BindMode) error {
	sa := &unix.SockaddrXDP{Ifindex: uint32(l.ifindex), QueueID: uint32(l.queue)}
	try := func(flags uint16, sg bool) error {
		sa.Flags = flags | unix.XDP_USE_NEED_WAKEUP
		if sg {
			sa.Flags |= unix.XDP_USE_SG
		}
		// The kernel releases a closed socket's hold on the queue in the
		// background, so binding right after a Close on the same queue can
		// fail with EBUSY for a short while.
		deadline := time.Now().Add(bindBusyWait)
		for {
			err := unix.Bind(l.fd, sa)
			if err != unix.EBUSY || time.Now().After(deadline) {
				return err
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	// zeroCopy binds in zero-copy mode, multi-buffer if the link must be,
	// or else if gathered tails want it and the driver takes it.
	zeroCopy := func() error {
		if l.sg {
			if err := zeroCopyFits(l.zcSegs, l.txDescs(l.maxFrame), l.maxFrame); err != nil {
				return err
			}
		}
		if l.sgIfZC && l.zcSegs != 1 {
			if err := try(unix.XDP_ZEROCOPY, true); err == nil {
				l.sg = true
				return nil
			}
		}
		return try(unix.XDP_ZEROCOPY, l.sg)
	}
	switch mode {
	case BindCopy:
		err := l.sgBindErr(try(unix.XDP_COPY, l.sg))
		if errors.Is(err, unix.EBUSY) {
			return fmt.Errorf("%w (%w)", ErrQueueBusy, err)
		}
		return err
	case BindZeroCopy:
		if err := zeroCopy(); err != nil {
			return fmt.Errorf("zero-copy: %w", l.sgBindErr(err))
		}
		l.zeroCopy = true
		return nil
	default:
		err := zeroCopy()
		if err == nil {
			l.zeroCopy = true
			return nil
		}
		if errors.Is(err, unix.EBUSY) {
			// Not a refusal of zero-copy: copy mode would be refused too.
			return fmt.Errorf("%w (%w)", ErrQueueBusy, err)
		}
		if !errors.Is(err, unix.EOPNOTSUPP) && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.EPROTONOSUPPORT) {
			return fmt.Errorf("zero-copy: %w", err)
		}
		return l.sgBindErr(try(unix.XDP_COPY, l.sg))
	}
}

// HardwareAddr implements Link.
func (l *AFXDPLink) HardwareAddr() net.HardwareAddr { return l.hw }

// MTU implements Link.
func (l *AFXDPLink) MTU() int { return l.mtu }

// TraceSide is the side this link's trace points are logged under in an
// xmxtrace build (see Trace).
func (l *AFXDPLink) TraceSide() int { return l.traceSide }

// ZeroCopy reports whether the socket is bound in zero-copy mode.
func (l *AFXDPLink) ZeroCopy() bool { return l.zeroCopy }

// MultiBuffer reports whether the link runs in multi-buffer mode
// (XDP_USE_SG; frames may span several UMEM frames).
func (l *AFXDPLink) MultiBuffer() bool { return l.sg }

// Info implements Link. Mode is "zerocopy" or "copy", the XDP attach mode,
// "spin" or "poll", and " sg" at the end in multi-buffer mode.
func (l *AFXDPLink) Info() Info {
	var b strings.Builder
	if l.zeroCopy {
		b.WriteString("zerocopy ")
	} else {
		b.WriteString("copy ")
	}
	b.WriteString(l.attach.String())
	if l.spin {
		b.WriteString(" spin")
	} else {
		b.WriteString(" poll")
	}
	if l.sg {
		b.WriteString(" sg")
	}
	return Info{Kind: "afxdp", Interface: l.ifname, Queue: l.queue, Mode: b.String()}
}

func (l *AFXDPLink) closedErr(op string) error {
	return &OpError{Op: op, Interface: l.ifname, Err: net.ErrClosed}
}

// goneErr is the error of operation op once the interface is gone.
func (l *AFXDPLink) goneErr(op string) error {
	return &OpError{Op: op, Interface: l.ifname, Err: interfaceGone(unix.Errno(l.gone.Load()))}
}

// markGone notes that the kernel unbound the socket from its device
// (errno says how it told), takes the steering program off the device
// (detachGone) and returns the error of operation op.
func (l *AFXDPLink) markGone(op string, errno unix.Errno) error {
	if l.gone.CompareAndSwap(0, uint32(errno)) {
		detachGone(l.steerKey, l.steer)
	}
	for _, s := range l.siblings {
		s.gone.CompareAndSwap(0, uint32(errno))
	}
	return l.goneErr(op)
}

// askGone asks the socket, after a wait that saw nothing, whether its
// interface went away. The kernel never makes an unbound AF_XDP socket
// ready; it leaves ENETDOWN as the socket's error when it unbinds it.
//
// +checklocks:l.rxMu
func (l *AFXDPLink) askGone() error {
	if l.gone.Load() != 0 {
		return l.goneErr("recv")
	}
	if l.closed.Load() {
		return nil // the fd is Close's (a queue of a multi-queue link)
	}
	if e := l.soError(); e != 0 {
		return l.markGone("recv", e)
	}
	return nil
}

// soError reads and clears the socket's pending error (SO_ERROR), which
// only the unbinding of its device sets. The caller holds rxMu, txMu or
// closeMu (shared), which keep fd open.
func (l *AFXDPLink) soError() unix.Errno {
	v, err := unix.GetsockoptInt(l.fd, unix.SOL_SOCKET, unix.SO_ERROR)
	if err != nil {
		return 0
	}
	return unix.Errno(v)
}

// unbound reports whether a kick's errno says that the socket lost its
// device: ENXIO, which in copy mode only an unbound socket returns; in
// zero-copy mode it is the driver's answer (some return it while their
// rings reset), taken as gone only if the socket's error says so too.
func (l *AFXDPLink) unbound(err error) bool {
	if err != unix.ENXIO {
		return false
	}
	return !l.zeroCopy || l.soError() != 0
}

// CheckInterface implements InterfaceChecker.
func (l *AFXDPLink) CheckInterface() error {
	if l.gone.Load() != 0 {
		return l.goneErr("check interface")
	}
	// closeMu, which keeps fd open, not rxMu, which a waiting Recv holds
	// for its whole wait.
	l.closeMu.RLock()
	defer l.closeMu.RUnlock()
	if l.closed.Load() {
		return l.closedErr("check interface")
	}
	if e := l.soError(); e != 0 {
		return l.markGone("check interface", e)
	}
	return nil
}

// Recv implements Link.
func (l *AFXDPLink) Recv(bufs [][]byte, sizes []int, timeout time.Duration) (int, error) {
	if len(sizes) < len(bufs) {
		return 0, &OpError{Op: "recv", Interface: l.ifname, Err: shortSizes(len(bufs), len(sizes))}
	}
	if l.closed.Load() {
		return 0, l.closedErr("recv")
	}
	if len(bufs) == 0 || (timeout == 0 && l.RxIdle()) {
		return 0, nil // no buffers: nothing could be received
	}
	l.rxMu.Lock()
	// A busy-polling caller comes here millions of times a second: the
	// lock is released by hand rather than by defer.
	n, err := l.recvLocked(bufs, sizes, 0, nil, timeout)
	l.rxMu.Unlock()
	return n, err
}

// RxFrames implements RxBudget: the link's receive frames, all of which
// the kernel holds while traffic comes in bursts (see RxLevel).
//
// +checklocksignore: lvl.high is set when the link is built, never after.
func (l *AFXDPLink) RxFrames() int { return int(l.lvl.high) }

// RxIdle implements IdleProber. It reports, without a lock, that a poll
// would find nothing to do: the RX ring is empty (its producer index is
// where we last consumed to), the kernel asks for no wake-up on the
// fill ring, and no frames the kernel refused wait on the TX ring for a
// receive to kick them again (kickStalled). A busy-polling caller then takes no lock. After Close it reads the retired rings'
// zeros (idle), and the caller finds the link closed at its next call.
func (l *AFXDPLink) RxIdle() bool {
	idle := atomic.LoadUint32(l.idle.rxProd) == atomic.LoadUint32(l.idle.rxCons) &&
		!needWakeup(l.idle.fillFlags) && !l.txStalled.Load() && l.gone.Load() == 0
	// The placeholders stay mapped while l is reachable: keep it so
	// until the loads are done.
	runtime.KeepAlive(l)
	return idle
}

// pointIdle points l.idle at the mapped RX and fill rings.
//
// +checklocksignore: called while l is being built, before any receive.
func (l *AFXDPLink) pointIdle() {
	l.idle.rxProd, l.idle.rxCons, l.idle.fillFlags = l.rx.producer, l.rx.consumer, l.fill.flags
}

// recvLocked is Recv with rxMu held; with a visitor v it is RecvVisit,
// showing up to max frames to v instead of copying them into bufs.
//
// +checklocks:l.rxMu
func (l *AFXDPLink) recvLocked(bufs [][]byte, sizes []int, max int, v Visitor, timeout time.Duration) (int, error) {
	if l.closed.Load() {
		// Close has released the rings, or waits for rxMu to do so.
		return 0, l.closedErr("recv")
	}
	if l.gone.Load() != 0 {
		return 0, l.goneErr("recv")
	}
	if timeout != 0 {
		l.rxTimer.start(timeout, l.spin)
	}
	for spins := 0; ; spins++ {
		var n int
		if v == nil {
			n = l.recvReady(bufs, sizes)
		} else {
			n = l.visitReady(max, v)
		}
		if n > 0 {
			return n, nil
		}
		if l.fill.needWakeup() && l.unbound(l.kick(unix.SYS_RECVFROM)) {
			return 0, l.markGone("recv", unix.ENXIO)
		}
		l.kickStalled()
		if timeout == 0 || l.wk.take() {
			return 0, nil
		}
		if l.closed.Load() {
			return 0, l.closedErr("recv")
		}
		if l.spin {
			// Reading the clock costs tens of nanoseconds; look at it
			// every few hundred turns only.
			if spins&255 == 255 && l.rxTimer.expired() {
				return 0, nil
			}
			if l.rxTimer.spinLook() {
				if err := l.askGone(); err != nil {
					return 0, err
				}
			}
			continue
		}
		ts, ok := l.rxTimer.pollSlice()
		if !ok {
			return 0, nil
		}
		Trace(l.traceSide, TraceSleep)
		err := l.wait(l.rxPoll[:], ts)
		Trace(l.traceSide, TraceWoke)
		l.rxTimer.afterPoll()
		if err != nil {
			return 0, &OpError{Op: "recv: poll", Interface: l.ifname, Err: err}
		}
		if l.rxPoll[1].Revents != 0 {
			return 0, l.closedErr("recv")
		}
		if l.rxPoll[2].Revents != 0 {
			l.wk.drain()
		} else if l.rxPoll[0].Revents == 0 {
			// Time up, or a slice of the wait: no frame came.
			if err := l.askGone(); err != nil {
				return 0, err
			}
		}
	}
}

// Waited implements WaitMeter.
//
// +checklocksignore: the receiving goroutine, which writes rxTimer, reads it.
func (l *AFXDPLink) Waited() (time.Duration, bool) { return l.rxTimer.waited() }

// Wake implements Waker.
//
// It takes no lock of the link's (only the waker's), so a visitor may call
// it while Close waits for the receive to end.
func (l *AFXDPLink) Wake() { l.wk.wake() }

// recvReady copies the packets waiting on the RX ring into bufs and gives
// their UMEM frames back to the fill ring.
//
// A packet is one descriptor or, in multi-buffer mode, a run of descriptors
// of which all but the last carry XDP_PKT_CONTD. Its fragments are copied
// into the caller's buffer in order; the RX consumer index only ever moves
// past whole packets. The kernel publishes a packet's descriptors together,
// but recvReady does not rely on it: it looks ahead for the last fragment
// and, if that is not on the ring yet, leaves the packet (and every packet
// after it) for a later call, its UMEM frames still held.
//
// +checklocks:l.rxMu
func (l *AFXDPLink) recvReady(bufs [][]byte, sizes []int) int {
	want := uint32(len(bufs))
	if l.sg {
		// One packet may span many descriptors: see all the kernel published.
		want = l.rx.size
	}
	avail := l.rx.avail(want)
	if avail == 0 || len(bufs) == 0 {
		return 0
	}
	Trace(l.traceSide, TraceRxSeen)
	// The fill ring is as large as the receive half of the UMEM, so it always
	// has room for the frames the RX ring hands back.
	l.fill.free(avail)
	start, end := l.rx.cachedCons, l.rx.cachedCons+avail
	queued0 := l.fill.cachedProd
	out := 0
	var bytes uint64
	for out < len(bufs) && l.rx.cachedCons != end {
		first := l.rx.cachedCons
		// next: one past the packet's last descriptor.
		next, complete := l.packetEnd(first, end)
		if !complete && next-first < l.rx.size {
			// The rest of the packet is not published yet: leave it, and
			// its frames, on the ring for a later call.
			break
		}
		// An incomplete packet that fills the whole ring can never complete
		// (only a corrupted ring shows one): it is dropped below.
		buf := bufs[out]
		copied, total, bad := 0, 0, !complete
		for i := first; i != next; i++ {
			data, ok := l.takeDesc(i)
			if !ok {
				bad = true // counted and dropped below
			} else if !bad {
				copied += copy(buf[copied:], data)
				total += len(data)
			}
		}
		l.rx.cachedCons = next
		if bad {
			l.badDescs.Add(1)
			continue
		}
		sizes[out] = copied
		if copied < total {
			l.rxTrunc.Add(1)
		}
		bytes += uint64(copied) // what Recv stored, as the other links count
		out++
	}
	if l.rx.cachedCons == start {
		return 0
	}
	l.rx.release()
	l.refill(avail, l.rx.cachedCons-start, l.fill.cachedProd-queued0)
	l.rxFrames.Add(uint64(out))
	l.rxBytes.Add(bytes)
	return out
}

// refill settles the fill ring after a receive that found waiting RX
// descriptors, consumed consumed of them and queued requeued of their
// frames for the fill ring again (the last entries produced, not yet
// submitted): it adds spare frames, or takes back some of those just
// queued, to bring the kernel's share to the level (rxLevel), and submits
// the ring.
//
// +checklocks:l.rxMu
func (l *AFXDPLink) refill(waiting, consumed, requeued uint32) {
	v := &l.lvl
	v.note(waiting, consumed, requeued)
	switch {
	case v.out < v.target:
		// The kernel holds at most every receive frame, as many as the
		// fill ring has entries: there is room.
		n := v.target - v.out
		for _, a := range v.take(min(n, l.fill.free(n))) {
			l.fill.addrs[l.fill.cachedProd&l.fill.mask] = a
			l.fill.cachedProd++
		}
	case v.out > v.target:
		for n := min(v.out-v.target, requeued); n > 0; n-- {
			l.fill.cachedProd--
			v.put(l.fill.addrs[l.fill.cachedProd&l.fill.mask])
		}
	}
	l.fill.submit()
}

// takeDesc returns the data of RX descriptor i and queues its UMEM frame
// for the fill ring (published by the caller once the data is consumed).
// ok is false for a descriptor outside the receive half of the UMEM or
// across a frame boundary: the kernel validates descriptors, so only a
// corrupted ring shows one, and the caller drops its packet and counts it.
//
// +checklocks:l.rxMu
func (l *AFXDPLink) takeDesc(i uint32) (data []byte, ok bool) {
	d := l.rx.descs[i&l.rx.mask]
	e := d.Addr + uint64(d.Len)
	// In the receive half (where the fill ring's frames are), within one
	// frame: first and last byte agree above the frame bits. Anything
	// else, from a corrupted ring only, names no frame of ours to give
	// back.
	if e > l.txBase || e < d.Addr || d.Addr^(e-1) >= l.frameSize {
		return nil, false
	}
	l.fill.addrs[l.fill.cachedProd&l.fill.mask] = d.Addr &^ (l.frameSize - 1)
	l.fill.cachedProd++
	return l.umem[d.Addr:e:e], true
}

// Send implements Link.
func (l *AFXDPLink) Send(frames [][]byte) (int, error) {
	l.txMu.Lock()
	defer l.txMu.Unlock()
	if l.closed.Load() {
		// Close has released the rings, or waits for txMu to do so.
		return 0, l.closedErr("send")
	}
	if l.gone.Load() != 0 {
		return 0, l.goneErr("send")
	}

	sent := 0
	var stalledSince time.Time
	for sent < len(frames) {
		l.reclaim()
		var bytes uint64
		var bad error
		queued := 0
		for sent+queued < len(frames) {
			f := frames[sent+queued]
			if err := checkFrame(f, l.maxFrame); err != nil {
				bad = err
				break
			}
			// A frame is queued whole or not at all: its send slot and
			// TX ring entries are secured first.
			nd := l.txDescs(len(f))
			if len(l.txFree) == 0 || l.tx.free(uint32(nd)) < uint32(nd) {
				break
			}
			l.queueFrame(f)
			bytes += uint64(len(f))
			queued++
		}
		if queued > 0 {
			l.tx.submit()
			sent += queued
			l.txFrames.Add(uint64(queued))
			l.txBytes.Add(bytes)
			stalledSince = time.Time{}
		} else if bad == nil {
			if stalledSince.IsZero() {
				stalledSince = time.Now()
			}
			if err := l.waitTx(stalledSince); err != nil {
				return sent, err
			}
			continue
		}
		if err := l.kickTx(); err != nil {
			return sent, err
		}
		if bad != nil {
			return sent, &OpError{Op: "send", Interface: l.ifname, Err: bad}
		}
	}
	return sent, nil
}

// txDescs is the number of TX descriptors (and UMEM frames) a frame of n
// bytes takes: one, or in multi-buffer mode one per FrameSize bytes.
// gatherSlots is how many send ring entries a frame with a gathered tail
// reserves: its head's, and a tail's of the longest frame starting
// anywhere in a frame.
func (l *AFXDPLink) gatherSlots() int {
	return l.txDescs(l.maxFrame) + l.maxFrame/int(l.frameSize) + 2
}

func (l *AFXDPLink) txDescs(n int) int {
	fs := int(l.frameSize)
	if n <= fs {
		return 1
	}
	return (n + fs - 1) / fs
}

// initTxFree cuts the send half of a UMEM of numFrames frames into slots
// and makes them all idle, the lowest address on top. It is called before
// the link is shared (by OpenAFXDP), or with txMu held.
func (l *AFXDPLink) initTxFree(numFrames int) {
	half := numFrames / 2
	k := l.txDescs(l.maxFrame)
	l.txBase = uint64(half) * l.frameSize
	l.txSlot = uint64(k) * l.frameSize
	slots := (numFrames - half) / k
	l.txFree = make([]uint64, 0, slots)
	for i := slots - 1; i >= 0; i-- {
		l.txFree = append(l.txFree, l.txBase+uint64(i)*l.txSlot)
	}
	l.txPending = make([]uint8, slots)
}

// queueFrame copies f into an idle send slot and produces its descriptors
// (not yet submitted). The caller has checked that txFree has a slot and the
// TX ring room for txDescs(len(f)) descriptors.
//
// +checklocks:l.txMu
func (l *AFXDPLink) queueFrame(f []byte) {
	base := l.txFree[len(l.txFree)-1]
	copy(l.umem[base:base+l.txSlot], f)
	l.queueSlot(base, len(f), false)
}

// queueSlot takes the idle send slot at base off the top of txFree and
// produces the descriptors of the size-byte frame written there (not yet
// submitted): FrameSize bytes per descriptor, in consecutive UMEM frames,
// XDP_PKT_CONTD on all but the last, and on the last too when more
// descriptors (a gathered tail) follow.
//
// +checklocks:l.txMu
func (l *AFXDPLink) queueSlot(base uint64, size int, more bool) {
	l.txFree = l.txFree[:len(l.txFree)-1]
	nd := l.queueDescs(base, uint64(size), more)
	l.txPending[(base-l.txBase)/l.txSlot] = uint8(nd)
}

// queueDescs produces the descriptors of n bytes of the UMEM at addr (not
// yet submitted), one per UMEM frame they touch and at least one,
// XDP_PKT_CONTD on all but the last, and on the last too if more
// descriptors follow. It returns how many it produced. The caller secured
// the TX ring entries.
//
// +checklocks:l.txMu
func (l *AFXDPLink) queueDescs(addr, n uint64, more bool) int {
	nd := 0
	for {
		k := min(n, l.frameSize-addr&(l.frameSize-1))
		n -= k
		var opts uint32
		if n > 0 || more {
			opts = unix.XDP_PKT_CONTD
		}
		l.tx.descs[l.tx.cachedProd&l.tx.mask] = unix.XDPDesc{Addr: addr, Len: uint32(k), Options: opts}
		l.tx.cachedProd++
		nd++
		addr += k
		if n == 0 {
			return nd
		}
	}
}

// reclaim gives the send slots whose descriptors have all completed back to
// txFree.
//
// +checklocks:l.txMu
func (l *AFXDPLink) reclaim() {
	n := l.comp.avail(l.comp.size)
	if n == 0 {
		return
	}
	l.txStuck = false
	for i := uint32(0); i < n; i++ {
		addr := l.comp.addrs[l.comp.cachedCons&l.comp.mask] &^ (l.frameSize - 1)
		l.comp.cachedCons++
		if addr >= l.bufBase && len(l.bufOwner) > 0 {
			l.bufCompleted(addr)
			continue
		}
		// The slot is idle once its last descriptor is back. An address
		// that is no send frame, or one more than its slot has in
		// flight, can only come from a corrupted ring: ignore it (a slot
		// given out twice would be written while the kernel reads it).
		slot := (addr - l.txBase) / l.txSlot
		if addr < l.txBase || slot >= uint64(len(l.txPending)) || l.txPending[slot] == 0 {
			continue
		}
		l.txPending[slot]--
		if l.txPending[slot] == 0 {
			l.txFree = append(l.txFree, l.txBase+slot*l.txSlot)
		}
	}
	l.comp.release()
}

// kickTx asks the kernel to transmit what the TX ring holds when it wants to
// be asked (need_wakeup). In copy mode one sendto transmits a bounded batch
// and answers EAGAIN while more remains, so it is repeated until the ring is
// drained; a refusal (a stopped queue, a full completion ring, which the
// retries reap) is retried likewise. Frames still refused after that stay
// on the ring and the link notes it (txStalled): the receives kick again
// until they are gone, as nothing else would in copy mode but the next
// send. An error is returned only when the interface is gone or down.
//
// +checklocks:l.txMu
func (l *AFXDPLink) kickTx() error {
	for i := 0; i <= int(l.tx.size/16); i++ {
		if !l.tx.needWakeup() {
			l.noteTxStall(false)
			return nil
		}
		Trace(l.traceSide, TraceKick)
		err := l.kick(unix.SYS_SENDTO)
		Trace(l.traceSide, TraceKicked)
		switch err {
		case nil:
		case unix.EBUSY:
			// Copy mode: the driver dropped one frame (NET_XMIT_DROP:
			// completed, not sent; a carrier off, a full peer queue).
			if !l.zeroCopy {
				l.txErrs.Add(1)
			}
			l.reclaim()
		case unix.EAGAIN, unix.ENOBUFS, unix.EINTR:
			l.reclaim()
		case unix.ENXIO:
			l.txErrs.Add(1)
			if l.unbound(err) {
				return l.markGone("send: wake kernel", unix.ENXIO)
			}
			return &OpError{Op: "send: wake kernel", Interface: l.ifname, Err: err}
		default:
			l.txErrs.Add(1)
			return &OpError{Op: "send: wake kernel", Interface: l.ifname, Err: err}
		}
		if atomic.LoadUint32(l.tx.consumer) == l.tx.cachedProd {
			l.noteTxStall(false)
			return nil
		}
	}
	l.noteTxStall(true)
	return nil
}

// noteTxStall records whether frames were left on the TX ring.
//
// +checklocks:l.txMu
func (l *AFXDPLink) noteTxStall(stalled bool) {
	if l.txStalled.Load() != stalled {
		l.txStalled.Store(stalled)
	}
}

// kickStalled kicks the frames the last kick left on the TX ring, unless a
// sender is at it (it kicks them itself).
func (l *AFXDPLink) kickStalled() {
	if !l.txStalled.Load() || !l.txMu.TryLock() {
		return
	}
	if !l.closed.Load() {
		l.kickTx()
	}
	l.txMu.Unlock()
}

// waitTx waits for the kernel to complete some sends, failing once the link
// has made no progress for the send timeout; after that, until a send
// completes (reclaim), it fails at once: an outage costs the link's
// callers one wait, not one each.
//
// +checklocks:l.txMu
func (l *AFXDPLink) waitTx(since time.Time) error {
	if err := l.kickTx(); err != nil {
		return err
	}
	if l.comp.avail(1) > 0 {
		return nil
	}
	if l.closed.Load() {
		return l.closedErr("send")
	}
	if l.txStuck {
		return &OpError{Op: "send", Interface: l.ifname, Err: fmt.Errorf("no frame completed since a wait of %v: %w", l.sendWait, ErrTxStalled)}
	}
	if time.Since(since) > l.sendWait {
		l.txStuck = true
		return &OpError{Op: "send", Interface: l.ifname, Err: fmt.Errorf("no frame completed for %v: %w", l.sendWait, ErrTxStalled)}
	}
	if l.spin {
		return nil
	}
	ts := unix.NsecToTimespec(int64(100 * time.Microsecond))
	if err := l.wait(l.txPoll[:], &ts); err != nil {
		return &OpError{Op: "send: poll", Interface: l.ifname, Err: err}
	}
	if l.txPoll[1].Revents != 0 {
		return l.closedErr("send")
	}
	return nil
}

// kick makes the no-data syscall (sendto or recvfrom) that wakes the kernel.
// It is a raw syscall, which keeps the caller's P (see recvmmsg in
// sys_linux.go for why).
func (l *AFXDPLink) kick(trap uintptr) error {
	l.wakeups.Add(1)
	_, _, e := unix.RawSyscall6(trap, uintptr(l.fd), 0, 0, unix.MSG_DONTWAIT, 0, 0)
	if e != 0 {
		return e
	}
	return nil
}

// wait sleeps in ppoll(2) on fds until one is ready or the time in ts
// is up (nil: no bound); ppoll leaves the time left in ts. EINTR is not an
// error: the caller re-checks its rings.
func (l *AFXDPLink) wait(fds []unix.PollFd, ts *unix.Timespec) error {
	l.wakeups.Add(1)
	if _, e := pollFds(fds, ts); e != 0 && e != unix.EINTR {
		return e
	}
	return nil
}

// Stats implements Link.
func (l *AFXDPLink) Stats() Stats {
	l.closeMu.RLock()
	defer l.closeMu.RUnlock()
	k := l.final
	if !l.closed.Load() {
		l.readKernelStats(&k)
	}
	return Stats{
		TxFrames:        l.txFrames.Load(),
		TxBytes:         l.txBytes.Load(),
		RxFrames:        l.rxFrames.Load(),
		RxBytes:         l.rxBytes.Load(),
		TxErrors:        l.txErrs.Load(),
		RxTruncated:     l.rxTrunc.Load(),
		RxDropped:       k.Rx_dropped,
		RxInvalidDescs:  k.Rx_invalid_descs + l.badDescs.Load(),
		TxInvalidDescs:  k.Tx_invalid_descs,
		RxRingFull:      k.Rx_ring_full,
		RxFillRingEmpty: k.Rx_fill_ring_empty_descs,
		TxRingEmpty:     k.Tx_ring_empty_descs,
		Wakeups:         l.wakeups.Load(),
	}
}

// readKernelStats reads XDP_STATISTICS; on error it leaves k unchanged.
func (l *AFXDPLink) readKernelStats(k *unix.XDPStatistics) {
	var s unix.XDPStatistics
	if getsockopt(l.fd, unix.SOL_XDP, unix.XDP_STATISTICS, unsafe.Pointer(&s), unsafe.Sizeof(s)) == nil {
		*k = s
	}
}

// Close implements Link. Calls blocked in Send or Recv return net.ErrClosed;
// Close waits for them to leave before it releases the rings (the RX and
// fill rings are retired: see ring.retire), the socket and the UMEM.
func (l *AFXDPLink) Close() error {
	if !l.closed.CompareAndSwap(false, true) {
		return nil
	}
	eventfdSignal(l.efd) // wake pollers; the eventfd stays readable
	// The calls that hold closeMu shared look at closed under it: once
	// Close has held it, none is left and none will touch fd, wk or the
	// UMEM. Close does not keep it while it waits for the two sides'
	// locks below: a visitor, which runs under rxMu, may call AllocBuffer.
	l.closeMu.Lock()
	l.readKernelStats(&l.final)
	l.closeMu.Unlock()

	var errs []error
	var retired [2][]byte
	note := func(op string, err error) {
		if err != nil {
			errs = append(errs, &OpError{Op: op, Interface: l.ifname, Err: err})
		}
	}
	note("release steering program", releaseSteering(l.steerKey, l.steer, l.queue))
	// The rings are mappings of the socket: unmap them before closing it,
	// and unmap the UMEM only once the kernel has let go of it. The RX and
	// fill rings, which RxIdle reads without a lock, are retired instead.
	l.rxMu.Lock()
	var err error
	retired[0], err = l.rx.retire()
	note("retire RX ring", err)
	retired[1], err = l.fill.retire()
	note("retire fill ring", err)
	runtime.AddCleanup(l, unmapAll, retired)
	l.rxScratch = nil
	l.rxMu.Unlock()
	l.txMu.Lock()
	note("unmap TX ring", l.tx.unmap())
	note("unmap completion ring", l.comp.unmap())
	l.txFree = nil
	// Lent buffers keep the UMEM mapped until the last is freed (which
	// may happen as soon as txMu is released: look at kept, not umemKept).
	kept := l.bufLive > 0
	l.umemKept = kept
	l.txMu.Unlock()
	note("close socket", unix.Close(l.fd))
	l.shut.Store(true)
	if !kept {
		note("unmap UMEM", unix.Munmap(l.umem))
	}
	note("close eventfd", unix.Close(l.efd))
	note("close wake eventfd", l.wk.close())
	return errors.Join(errs...)
}

// unmapAll unmaps the retired rings of a closed link that is unreachable.
func unmapAll(mems [2][]byte) {
	for _, m := range mems {
		if m != nil {
			unix.Munmap(m)
		}
	}
}

// packetEnd finds the end of the packet whose first RX descriptor is at
// first, looking no further than end: one past its last descriptor (the
// first without XDP_PKT_CONTD), and whether that descriptor was found.
//
// +checklocks:l.rxMu
func (l *AFXDPLink) packetEnd(first, end uint32) (next uint32, complete bool) {
	for next = first; next != end; {
		last := l.rx.descs[next&l.rx.mask].Options&unix.XDP_PKT_CONTD == 0
		next++
		if last {
			return next, true
		}
	}
	return next, false
}
