// Package xdp moves Ethernet frames between a network interface and user
// memory. It knows frames, not messages: everything above it (matching,
// reliability, the file protocol) lives in msglayer and fileproto.
//
// Three links implement the one narrow, batch-shaped [Link] interface:
//
//   - [OpenAFXDP]: an AF_XDP socket (UMEM, four rings, need-wakeup, zero-copy
//     where the driver allows it) fed by the steering program of package bpf;
//   - [OpenAFPacket]: an AF_PACKET socket filtered to the stack's EtherType in
//     the kernel, for interfaces without AF_XDP;
//   - [NewPair] and [NewHub]: in-memory links with loss, reordering,
//     duplication, delay and MTU knobs, for tests without root.
package xdp

import (
	"errors"
	"fmt"
	"net"
	"time"
)

// DefaultEtherType is the EtherType the stack speaks unless configured
// otherwise (0x88B5 is reserved by IEEE 802 for local experimental use).
const DefaultEtherType = 0x88B5

// DefaultFrameSize is the size of an AF_XDP link's UMEM frames unless
// AFXDPConfig.FrameSize says otherwise; a lent buffer takes whole frames.
const DefaultFrameSize = 4096

// EthHeaderLen is the length of an Ethernet header without VLAN tags.
const EthHeaderLen = 14

// MinFrameLen is the shortest Ethernet frame (without FCS) a link sends;
// shorter frames are padded by the NIC on real hardware.
const MinFrameLen = 60

// Link sends and receives batches of complete Ethernet frames (destination,
// source, EtherType, payload; no FCS).
//
// Send and Recv may be called concurrently with each other; calls of Send
// are serialised by the link, and so are calls of Recv. Close may be called
// at any time from any goroutine: calls blocked in Send or Recv return
// net.ErrClosed, and so does every later call. Close returns once the calls
// under way have ended.
type Link interface {
	// Send queues frames for transmission and returns how many it took,
	// in order. The frames are copied (or handed to the kernel) before Send
	// returns, so the caller may reuse them at once. Send waits while the
	// transmit ring is full; it returns n < len(frames) only with an error.
	// A frame longer than MaxFrameLen is refused with ErrFrameTooLong.
	Send(frames [][]byte) (n int, err error)

	// Recv copies up to len(bufs) received frames into bufs, stores each
	// frame's length in sizes (len(sizes) >= len(bufs), or the Recv fails
	// with ErrShortSizes), and returns how many it stored. A frame longer than its buffer is truncated to the
	// buffer and counted in Stats.RxTruncated.
	//
	// timeout bounds the wait for the first frame: 0 polls once and may
	// return 0 frames, a negative timeout waits until a frame arrives or the
	// link is closed. A timed-out Recv returns 0, nil, and so does a Recv
	// with no buffers, at once.
	Recv(bufs [][]byte, sizes []int, timeout time.Duration) (n int, err error)

	// HardwareAddr is the link's MAC address.
	HardwareAddr() net.HardwareAddr

	// MTU is the largest payload after the Ethernet header that the link
	// carries; MaxFrameLen() == MTU() + EthHeaderLen.
	MTU() int

	// Info describes the link: its kind, interface, queue and mode.
	Info() Info

	// Stats returns a snapshot of the link's counters.
	Stats() Stats

	// Close releases everything the link holds. It is safe to call more
	// than once and concurrently with Send and Recv.
	Close() error
}

// Waker is implemented by links whose waiting Recv another goroutine can
// end early. Wake makes a Recv that is waiting, or else the next Recv that
// would wait, return (0, nil) at once. A progress engine blocked in Recv
// uses it to learn that something other than a frame needs its attention.
// Every link of this package implements it.
type Waker interface {
	Wake()
}

// WaitMeter is implemented by links whose bounded receive knows how long it
// has waited without reading a clock: ppoll(2) leaves the time left in its
// timespec. Waited returns that time for the receive with a timeout above
// zero under way (asked from its Visitor), or else the last one: 0 if it
// found frames without waiting, and false if the link cannot tell (a
// spinning link). Polls (timeout 0) and unbounded receives leave it as it
// was. A progress engine that read the clock before it slept adds it to
// that reading instead of reading the clock again on the way from a
// wake-up to the answer. Only the receiving goroutine may call it. The
// AF_XDP and AF_PACKET links implement it.
type WaitMeter interface {
	Waited() (time.Duration, bool)
}

// InterfaceChecker is implemented by links that can lose their interface
// (it is deleted, or moved to another network namespace): CheckInterface
// asks the kernel (a syscall) and returns an error wrapping
// ErrInterfaceGone once the interface is gone, nil while it is there. A
// link's waits in the kernel ask by themselves after every wait that saw
// nothing (at least every goneCheck); a caller that only polls (timeout
// 0) asks now and then (msglayer's busy-polling driver, about once a
// goneCheck). The AF_XDP and AF_PACKET links implement it.
type InterfaceChecker interface {
	CheckInterface() error
}

// IdleProber is implemented by links that can tell, without a syscall,
// that a receive would find no frame: RxIdle reports true only if a Recv
// or RecvVisit with timeout 0 would return none now (false: it may find
// some). A progress engine about to sleep polls first only when RxIdle is
// false. The AF_XDP links (no lock: three loads of the shared rings) and
// the in-memory link implement it; AF_PACKET, whose queue is the
// socket's, does not.
type IdleProber interface {
	RxIdle() bool
}

// RxBudget is implemented by links that hold a bounded number of received
// frames: frames that arrive faster than they are received wait in the
// link, and beyond RxFrames of them some are dropped (the AF_XDP links:
// their receive frames; the in-memory link: its queue). A protocol with
// many senders shares the bound among them (msglayer's receive window).
// AF_PACKET, whose bound is the socket's buffer in bytes, does not
// implement it.
type RxBudget interface {
	RxFrames() int
}

// FrameBuilder is implemented by links that let the caller write frames
// directly into transmit memory (the UMEM for AF_XDP), saving the copy Send
// makes. Every link of this package implements it.
//
// Calls of SendBuilt are serialised with each other and with Send, and hold
// the link's send lock while Build runs: Build must not call back into the
// link (Send, SendBuilt or Close would deadlock). Close may be called at
// any time from another goroutine, as with Send.
type FrameBuilder interface {
	// SendBuilt sends n frames, each written in place by b.Build(i, buf):
	// buf is link memory of MaxFrameLen bytes (len and cap; its contents
	// are whatever an earlier frame left there) and Build returns the
	// frame's length. Frames go out in order i = 0..n-1. SendBuilt waits
	// for transmit space like Send and returns how many frames it sent; its
	// errors are those of Send. A frame whose length is below EthHeaderLen
	// (ErrFrameTooShort) or above MaxFrameLen (ErrFrameTooLong) is not sent
	// and SendBuilt stops there. buf must not be retained after Build
	// returns. Build is not called for frames SendBuilt does not reach
	// (after an error, or once the link is closed). n <= 0 sends nothing;
	// a nil b is refused with an error.
	SendBuilt(n int, b Builder) (int, error)
}

// Builder writes frame i of a SendBuilt call into buf and returns its
// length. It is an interface rather than a func so that a pointer to a
// long-lived value can be passed without a heap allocation.
type Builder interface {
	Build(i int, buf []byte) int
}

// TailSender is implemented by links whose kernel copies each frame from
// several pieces of memory during the send call (AF_PACKET's sendmmsg):
// the tail of a frame is read where it lies, in the caller's memory,
// saving the copy into link memory that SendBuilt makes. The AF_PACKET
// and in-memory links implement it; AF_XDP, whose kernel reads only the
// UMEM, does not (BufferLink is its way to the same end).
type TailSender interface {
	// SendTails is SendBuilt for frames made of a head built in link
	// memory by t.Tail and a tail that Tail returns: frame i is head
	// followed by tail, of at most MaxFrameLen bytes. The tail is read
	// before SendTails returns and never after, so it must not change
	// during the call and may be reused at once. Its calling rules, waits
	// and errors are those of SendBuilt.
	SendTails(n int, t Tailer) (int, error)
}

// Tailer writes the head of frame i of a SendTails call into head (link
// memory of MaxFrameLen bytes) and returns its length and the frame's tail
// (nil for none).
type Tailer interface {
	Tail(i int, head []byte) (int, []byte)
}

// tailCopy builds whole frames from a Tailer, for links that copy tails
// behind their heads.
type tailCopy struct {
	t      Tailer
	maxLen int
}

func (c *tailCopy) Build(i int, buf []byte) int {
	n, tail := c.t.Tail(i, buf)
	if len(tail) == 0 || checkBuilt(n, c.maxLen) != nil {
		return n
	}
	if n+len(tail) > c.maxLen {
		return n + len(tail) // refused as too long
	}
	return n + copy(buf[n:], tail)
}

// FrameVisitor is implemented by links that let the caller read received
// frames in place (in the UMEM for AF_XDP), saving the copy Recv makes.
// Every link of this package implements it.
//
// Calls of RecvVisit are serialised with each other and with Recv, and hold
// the link's receive lock while Visit runs: Visit must not call back into
// the link (Recv, RecvVisit or Close would deadlock; Wake may be called)
// and should be quick, since the frames it is shown stay out of the link's
// receive ring until the call returns. Close may be called at any time
// from another goroutine: a frame being visited stays valid until Visit
// returns.
type FrameVisitor interface {
	// RecvVisit waits like Recv (the timeout semantics are identical, and
	// so are Wake and Close: a RecvVisit blocked when the link is closed
	// returns net.ErrClosed), calls v.Visit(frame) for each of up to max
	// received frames, in the order Recv would return them, and returns
	// their number. frame is link memory valid only during the call: it
	// must not be retained. Truncation does not apply: the visitor sees the
	// whole frame. max <= 0 returns 0, nil at once (after the closed
	// check); a nil v is refused with an error. The counters move as for
	// Recv (RxFrames, RxBytes with each frame's whole length).
	RecvVisit(max int, timeout time.Duration, v Visitor) (int, error)
}

// Visitor is shown received frames by RecvVisit, one call per frame. It is
// an interface rather than a func so that a pointer to a long-lived value
// can be passed without a heap allocation.
type Visitor interface {
	Visit(frame []byte)
}

// checkBuilt validates the length Build returned for a frame written into
// a buffer of maxLen bytes.
func checkBuilt(n, maxLen int) error {
	if n < EthHeaderLen {
		return ErrFrameTooShort
	}
	if n > maxLen {
		return ErrFrameTooLong
	}
	return nil
}

// MaxFrameLen is the longest frame (Ethernet header included) l carries.
func MaxFrameLen(l Link) int { return l.MTU() + EthHeaderLen }

// Info describes a link.
type Info struct {
	Kind      string // "afxdp", "afpacket" or "mem"
	Interface string // interface name ("" for in-memory links)
	Queue     int    // receive queue (AF_XDP), -1 when not applicable
	// Mode says how frames move: for AF_XDP "zerocopy" or "copy" followed by
	// the XDP attach mode ("drv" or "skb") and "spin" or "poll"; for
	// AF_PACKET "qdisc-bypass" when set; for in-memory links the knobs.
	Mode string
}

// Stats are a link's counters. Every field counts since the link was opened.
type Stats struct {
	TxFrames, TxBytes uint64 // frames handed to the wire
	RxFrames, RxBytes uint64 // frames delivered to Recv
	TxErrors          uint64 // frames the link took but the kernel refused to send
	RxTruncated       uint64 // frames longer than the buffer given to Recv

	// Kernel counters (AF_XDP XDP_STATISTICS; AF_PACKET PACKET_STATISTICS
	// drops in RxDropped).
	RxDropped       uint64 // frames the kernel dropped for this socket
	RxInvalidDescs  uint64
	TxInvalidDescs  uint64
	RxRingFull      uint64
	RxFillRingEmpty uint64
	TxRingEmpty     uint64
	Wakeups         uint64 // syscalls made to wake the kernel (sendto/poll)

	// In-memory fault injection.
	InjectedLoss      uint64 // frames dropped on purpose
	InjectedDuplicate uint64 // extra copies delivered
	InjectedReorder   uint64 // frames delivered after a later one
	QueueDrops        uint64 // frames dropped because the receiver's queue was full
}

// Lost is the number of frames this link's counters account for as dropped
// on the receive side or by fault injection: the frames a conformance test
// may find missing. The AF_XDP kernel counters overlap: a frame dropped for
// want of a fill-ring entry counts in both RxDropped and RxFillRingEmpty, so
// only RxDropped and RxRingFull (which RxDropped excludes) are summed.
func (s Stats) Lost() uint64 {
	return s.RxDropped + s.RxRingFull + s.InjectedLoss + s.QueueDrops + s.TxErrors
}

// Add adds o's counters to s (to total the links of several queues).
func (s *Stats) Add(o Stats) {
	s.TxFrames += o.TxFrames
	s.TxBytes += o.TxBytes
	s.RxFrames += o.RxFrames
	s.RxBytes += o.RxBytes
	s.TxErrors += o.TxErrors
	s.RxTruncated += o.RxTruncated
	s.RxDropped += o.RxDropped
	s.RxInvalidDescs += o.RxInvalidDescs
	s.TxInvalidDescs += o.TxInvalidDescs
	s.RxRingFull += o.RxRingFull
	s.RxFillRingEmpty += o.RxFillRingEmpty
	s.TxRingEmpty += o.TxRingEmpty
	s.Wakeups += o.Wakeups
	s.InjectedLoss += o.InjectedLoss
	s.InjectedDuplicate += o.InjectedDuplicate
	s.InjectedReorder += o.InjectedReorder
	s.QueueDrops += o.QueueDrops
}

// MaxBufferBytes bounds the buffer area an AF_XDP link lends
// (AFXDPConfig.BufferBytes).
const MaxBufferBytes = 1 << 30

// Errors returned by links. They are matched with errors.Is; the errors a
// link returns wrap them with the operation and the interface.
var (
	// ErrFrameTooLong: a frame passed to Send is longer than MaxFrameLen.
	ErrFrameTooLong = errors.New("frame longer than the link's MTU")
	// ErrFrameTooShort: a frame passed to Send is shorter than an Ethernet header.
	ErrFrameTooShort = errors.New("frame shorter than an Ethernet header")
	// ErrShortSizes: a Recv was given fewer sizes than buffers.
	ErrShortSizes = errors.New("fewer sizes than buffers")
	// ErrNotSupported: the kernel or the interface lacks the feature.
	ErrNotSupported = errors.New("not supported")
	// ErrNotEthernet: the interface has no 6-byte hardware address
	// (loopback, a tun device): no peer could address frames to it.
	ErrNotEthernet = errors.New("not an Ethernet interface: no 6-byte hardware address")
	// ErrQueueBusy: another AF_XDP socket (of another process) is bound
	// to the queue. Its steering program takes every frame of the
	// EtherType there, so no other socket of this host would receive.
	ErrQueueBusy = errors.New("queue taken by another AF_XDP socket")
	// ErrTxStalled: the link could not queue a frame within its send
	// timeout (the kernel stopped taking frames: interface down, queue stuck).
	ErrTxStalled = errors.New("transmit stalled")
	// ErrInterfaceGone: the link's interface was deleted (or moved to
	// another network namespace) while the link was open. The socket
	// cannot reach it again: every later Send and Recv fails with it, a
	// Recv waiting in the kernel within about a second (goneCheck), and
	// a spinning one within milliseconds; a polling caller learns it from
	// a send or from InterfaceChecker. Close the link and open a new one
	// on the interface that replaced it.
	ErrInterfaceGone = errors.New("interface gone")
)

// goneCheck bounds how long a Recv waiting in the kernel goes without
// learning that its interface is gone: a socket whose device is gone is
// never ready (AF_XDP), or is ready once and never again (AF_PACKET), so
// a wait is cut into slices of at most goneCheck, and the link asks the
// socket after each one that ended without a frame.
const goneCheck = time.Second

// OpError is an error from a link operation, naming the operation and the
// interface it failed on. It unwraps to the cause (often a syscall.Errno).
type OpError struct {
	Op        string // "send", "recv", "bind", "mmap rx ring"...
	Interface string
	Err       error
}

func (e *OpError) Error() string {
	if e.Interface == "" {
		return "xdp: " + e.Op + ": " + e.Err.Error()
	}
	return "xdp: " + e.Op + " on " + e.Interface + ": " + e.Err.Error()
}

func (e *OpError) Unwrap() error { return e.Err }

// shortSizes is the error of a Recv given fewer sizes than buffers.
func shortSizes(bufs, sizes int) error {
	return fmt.Errorf("%w: %d for %d buffers", ErrShortSizes, sizes, bufs)
}

// checkFrame validates a frame passed to Send against the link's MTU.
func checkFrame(f []byte, maxLen int) error {
	if len(f) < EthHeaderLen {
		return ErrFrameTooShort
	}
	if len(f) > maxLen {
		return ErrFrameTooLong
	}
	return nil
}
