package xdp

import (
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/xmx-stack/xmx/bpf"
)

// AFPacketConfig configures [OpenAFPacket].
type AFPacketConfig struct {
	Interface string // interface name, e.g. "eth0" (required)
	EtherType uint16 // EtherType to send and receive; 0 means DefaultEtherType
	// Batch is the number of frames per recvmmsg/sendmmsg call; 0 means 64.
	// It also caps the frames one Recv returns. At most 1024 (UIO_MAXIOV).
	Batch int
	// Spin makes Recv with a non-zero timeout spin on recvmmsg(MSG_DONTWAIT)
	// instead of blocking in poll: lower latency, one core burnt.
	Spin bool
	// NoQdiscBypass keeps frames going through the interface's qdisc; by
	// default the link sets PACKET_QDISC_BYPASS and hands them straight to
	// the driver.
	NoQdiscBypass bool
	// RcvBuf and SndBuf are the socket buffer sizes in bytes; 0 means
	// DefaultAFPacketBuf, a negative value leaves the kernel's default. As
	// root the sizes are forced past net.core.{r,w}mem_max.
	RcvBuf, SndBuf int
}

// DefaultAFPacketBuf is the socket buffer size (each direction) used when
// AFPacketConfig.RcvBuf or SndBuf is 0.
const DefaultAFPacketBuf = 4 << 20

const (
	afpacketDefaultBatch = 64
	afpacketMaxBatch     = 1024 // UIO_MAXIOV: the kernel clamps vlen to it

	// afpacketSendStall bounds how long Send waits without progress while
	// the kernel answers EAGAIN (socket buffer full) or ENOBUFS (driver or
	// peer queue full, frame dropped): past it the frame counts as refused.
	afpacketSendStall = time.Second
	// While the kernel answers ENOBUFS, Send backs off from
	// afpacketMinBackoff, doubling up to afpacketMaxBackoff, between tries.
	afpacketMinBackoff = 20 * time.Microsecond
	afpacketMaxBackoff = time.Millisecond
	// afpacketMaxPollOut bounds one poll(POLLOUT) wait inside Send, so that a
	// socket stuck in POLLERR cannot make Send miss its stall deadline.
	afpacketMaxPollOut = 10 * time.Millisecond

	// afpacketFilterSnap is what the BPF filter accepts of a matching frame
	// (more than any frame the link can carry).
	afpacketFilterSnap = 262144
)

// AFPacketLink is a [Link] over an AF_PACKET raw socket bound to one
// interface and one EtherType. It suits interfaces without AF_XDP support
// (and veth pairs in tests). Frames move with recvmmsg and sendmmsg in
// batches, through arrays allocated once at open, so Send and Recv make no
// heap allocation in the steady state.
//
// Concurrency: Recv calls are serialised by rxMu and Send calls by txMu, so a
// Recv and a Send can run at the same time. Close sets the closed flag,
// signals the eventfd that every blocking wait polls, then takes rxMu, txMu
// and statsMu before closing the descriptors: no call can use a closed (or
// reused) descriptor.
type AFPacketLink struct {
	// Immutable after OpenAFPacket; read by anyone without a lock.
	name      string
	hwaddr    net.HardwareAddr
	mtu       int
	etherType uint16
	batch     int
	spin      bool
	info      Info

	// closed is set by Close before it wakes and waits for the calls in
	// flight; every call checks it after taking its mutex and while waiting.
	closed atomic.Bool
	// gone is the errno with which the kernel said that the interface went
	// away (0: it has not): the socket, bound to its index, cannot reach it
	// again. Set once, by a receive (askGone) or a send (ENXIO); read by
	// every call.
	gone atomic.Uint32

	// closeMu serialises Close. The descriptors fd (the AF_PACKET socket)
	// and efd (the eventfd Close signals) change only in Close, which holds
	// closeMu, rxMu, txMu and statsMu at the time; reading them under any
	// one of these mutexes is therefore safe. Both are -1 once closed.
	closeMu sync.Mutex
	fd, efd int
	wk      waker // Wake's eventfd (closed with efd) and flag

	// rxMu serialises Recv and guards the receive arrays: rxMsgs[i] points
	// at rxIov[i], whose Base points at the caller's bufs[i] during a Recv
	// (and is cleared before Recv returns, so the link does not pin the
	// caller's buffers).
	rxMu    sync.Mutex
	rxMsgs  []mmsghdr
	rxIov   []unix.Iovec
	rxPoll  [3]unix.PollFd // socket POLLIN, eventfd POLLIN, wake eventfd POLLIN
	rxTimer recvTimer      // bounds a Recv's wait
	// rxVisit holds Batch receive slots of rxSlot bytes into which RecvVisit
	// receives and where it shows the frames; allocated by the first
	// RecvVisit.
	rxVisit []byte

	// txMu serialises Send and guards the transmit arrays: txMsgs[i]
	// points at txIov[2i], and at txIov[2i+1] too (Iovlen 2) while
	// SendTails sends a frame with a tail. During a Send txIov[2i].Base
	// points at the caller's frame, during a SendTails txIov[2i+1].Base
	// at the caller's tail; both are cleared before the call returns.
	txMu   sync.Mutex
	txMsgs []mmsghdr
	txIov  []unix.Iovec
	txPoll [2]unix.PollFd // socket POLLOUT, eventfd POLLIN
	txTs   unix.Timespec  // poll timeout of a Send waiting for room
	// txStuck: a Send waited afpacketSendStall for a frame to go, and
	// none went since (a peer whose carrier is gone, say): a Send tries
	// once and fails at once, instead of waiting again.
	txStuck bool
	// txBuild holds Batch frames of MaxFrameLen bytes, where SendBuilt and
	// SendTails have them built before one sendmmsg; allocated by the
	// first of them. txWhole is SendBuilt's Builder as a Tailer.
	txBuild []byte
	txWhole wholeFrames

	// statsMu guards rxDropped, the sum of the PACKET_STATISTICS tp_drops
	// read so far (the getsockopt resets the kernel counters), and the use
	// of fd by Stats.
	statsMu   sync.Mutex
	rxDropped uint64

	// Counters, written by the owner of the matching mutex (tx* and
	// wakeups by Send under txMu, rx* by Recv under rxMu, plus wakeups by
	// Recv) and read at any time by Stats.
	txFrames, txBytes, txErrors    atomic.Uint64
	rxFrames, rxBytes, rxTruncated atomic.Uint64
	wakeups                        atomic.Uint64
}

var (
	_ Link             = (*AFPacketLink)(nil)
	_ Waker            = (*AFPacketLink)(nil)
	_ InterfaceChecker = (*AFPacketLink)(nil)
	_ WaitMeter        = (*AFPacketLink)(nil)
	_ FrameBuilder     = (*AFPacketLink)(nil)
	_ FrameVisitor     = (*AFPacketLink)(nil)
	_ TailSender       = (*AFPacketLink)(nil)
)

// OpenAFPacket opens an AF_PACKET link on cfg.Interface. It needs
// CAP_NET_RAW in the interface's network namespace (the socket belongs to
// the namespace of the calling thread).
//
// The socket is bound to the interface and the EtherType, and a classic BPF
// filter accepting only that EtherType is attached as well; frames that
// reached the socket before the filter are drained.
func OpenAFPacket(cfg AFPacketConfig) (*AFPacketLink, error) {
	name := cfg.Interface
	fail := func(op string, err error) (*AFPacketLink, error) {
		return nil, &OpError{Op: op, Interface: name, Err: err}
	}
	if name == "" {
		return fail("open afpacket", errors.New("no interface given"))
	}
	et := cfg.EtherType
	if et == 0 {
		et = DefaultEtherType
	}
	if err := bpf.CheckEtherType(et); err != nil {
		// The peers' kernels would take our frames for theirs.
		return fail("open afpacket", err)
	}
	batch := cfg.Batch
	switch {
	case batch == 0:
		batch = afpacketDefaultBatch
	case batch < 0:
		return fail("open afpacket", errors.New("negative batch size"))
	case batch > afpacketMaxBatch:
		batch = afpacketMaxBatch
	}

	ifi, err := net.InterfaceByName(name)
	if err != nil {
		return fail("lookup interface", err)
	}
	if len(ifi.HardwareAddr) != 6 {
		return fail("open afpacket", ErrNotEthernet)
	}

	fd, err := unix.Socket(unix.AF_PACKET,
		unix.SOCK_RAW|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, int(htons(et)))
	if err != nil {
		return fail("socket", err)
	}
	efd := -1
	var wk waker
	wk.fd = -1
	ok := false
	defer func() {
		if !ok {
			unix.Close(fd)
			if efd >= 0 {
				unix.Close(efd)
			}
			if wk.fd >= 0 {
				unix.Close(wk.fd)
			}
		}
	}()

	// The socket receives every frame of the EtherType, on any interface,
	// from socket() until bind. Shut it with a drop-all filter, bind, drain
	// what queued up meanwhile, then install the real filter.
	if err := attachFilter(fd, dropAllFilter[:]); err != nil {
		return fail("attach drop-all filter", err)
	}
	sa := &unix.SockaddrLinklayer{Protocol: htons(et), Ifindex: ifi.Index}
	if err := unix.Bind(fd, sa); err != nil {
		return fail("bind", err)
	}
	if err := drainSocket(fd); err != nil {
		return fail("drain", err)
	}
	filter := etherTypeFilter(ifi.Index, et)
	if err := attachFilter(fd, filter[:]); err != nil {
		return fail("attach filter", err)
	}

	bypass := false
	if !cfg.NoQdiscBypass {
		// Older kernels lack it (ENOPROTOOPT): fall back to the qdisc.
		bypass = unix.SetsockoptInt(fd, unix.SOL_PACKET, unix.PACKET_QDISC_BYPASS, 1) == nil
	}
	// Since Linux 4.20; frames this socket sends are never looped back to
	// it anyway because it is bound to one EtherType, so failure is fine.
	_ = unix.SetsockoptInt(fd, unix.SOL_PACKET, unix.PACKET_IGNORE_OUTGOING, 1)

	if err := setSockBuf(fd, cfg.RcvBuf, unix.SO_RCVBUFFORCE, unix.SO_RCVBUF); err != nil {
		return fail("set receive buffer", err)
	}
	if err := setSockBuf(fd, cfg.SndBuf, unix.SO_SNDBUFFORCE, unix.SO_SNDBUF); err != nil {
		return fail("set send buffer", err)
	}

	efd, err = newEventFd()
	if err != nil {
		efd = -1
		return fail("eventfd", err)
	}
	if err := wk.open(); err != nil {
		wk.fd = -1
		return fail("eventfd", err)
	}

	mode := []string{"qdisc"}
	if bypass {
		mode[0] = "qdisc-bypass"
	}
	if cfg.Spin {
		mode = append(mode, "spin")
	} else {
		mode = append(mode, "poll")
	}

	l := &AFPacketLink{
		name:      name,
		hwaddr:    append(net.HardwareAddr(nil), ifi.HardwareAddr...),
		mtu:       ifi.MTU,
		etherType: et,
		batch:     batch,
		spin:      cfg.Spin,
		info: Info{
			Kind:      "afpacket",
			Interface: name,
			Queue:     -1,
			Mode:      strings.Join(mode, " "),
		},
		fd:     fd,
		efd:    efd,
		rxMsgs: make([]mmsghdr, batch),
		rxIov:  make([]unix.Iovec, batch),
		txMsgs: make([]mmsghdr, batch),
		txIov:  make([]unix.Iovec, 2*batch),
	}
	for i := range batch {
		l.rxMsgs[i].Hdr.Iov = &l.rxIov[i]
		l.rxMsgs[i].Hdr.SetIovlen(1)
		l.txMsgs[i].Hdr.Iov = &l.txIov[2*i]
		l.txMsgs[i].Hdr.SetIovlen(1)
	}
	l.wk.fd = wk.fd
	l.rxPoll = [3]unix.PollFd{
		{Fd: int32(fd), Events: unix.POLLIN},
		{Fd: int32(efd), Events: unix.POLLIN},
		{Fd: int32(wk.fd), Events: unix.POLLIN},
	}
	l.txPoll = [2]unix.PollFd{
		{Fd: int32(fd), Events: unix.POLLOUT},
		{Fd: int32(efd), Events: unix.POLLIN},
	}
	ok = true
	return l, nil
}

// dropAllFilter is a classic BPF program that accepts nothing.
var dropAllFilter = [...]unix.SockFilter{
	{Code: unix.BPF_RET | unix.BPF_K, K: 0},
}

// Classic BPF ancillary loads (linux/filter.h: SKF_AD_OFF + SKF_AD_*): the
// packet type, and the index of the device the frame is for.
const (
	skfAdPktType = 0xfffff000 + 4
	skfAdIfindex = 0xfffff000 + 8
)

// etherTypeFilter returns the classic BPF program of a socket bound to
// interface ifindex: it accepts the frames of EtherType et whole and drops
// the others, and those that are not for the interface itself. Those are
// frames the kernel already handed to a device stacked on it (a macvlan, a
// VLAN the host is on: the frame's device is then the upper one, while the
// kernel still shows it to sockets bound to the lower), and frames the
// kernel marked as for another host: to another MAC on a promiscuous
// interface, or tagged with a VLAN the host is not on (the kernel strips
// the tag before the socket sees the frame, leaving the inner EtherType at
// offset 12, and marks the frame so; AF_XDP's steering program, which sees
// the tag, passes them to the kernel):
//
//	ld ifidx
//	jeq #ifindex, jt 0, jf 5
//	ldh [12]
//	jeq #et, jt 0, jf 3
//	ld pkttype
//	jeq #PACKET_OTHERHOST, jt 1, jf 0
//	ret #262144
//	ret #0
func etherTypeFilter(ifindex int, et uint16) [8]unix.SockFilter {
	return [8]unix.SockFilter{
		{Code: unix.BPF_LD | unix.BPF_W | unix.BPF_ABS, K: skfAdIfindex},
		{Code: unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K, Jt: 0, Jf: 5, K: uint32(ifindex)},
		{Code: unix.BPF_LD | unix.BPF_H | unix.BPF_ABS, K: 12},
		{Code: unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K, Jt: 0, Jf: 3, K: uint32(et)},
		{Code: unix.BPF_LD | unix.BPF_W | unix.BPF_ABS, K: skfAdPktType},
		{Code: unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K, Jt: 1, Jf: 0, K: unix.PACKET_OTHERHOST},
		{Code: unix.BPF_RET | unix.BPF_K, K: afpacketFilterSnap},
		{Code: unix.BPF_RET | unix.BPF_K, K: 0},
	}
}

// attachFilter attaches (or replaces) the socket's classic BPF filter.
func attachFilter(fd int, prog []unix.SockFilter) error {
	fprog := unix.SockFprog{Len: uint16(len(prog)), Filter: &prog[0]}
	return unix.SetsockoptSockFprog(fd, unix.SOL_SOCKET, unix.SO_ATTACH_FILTER, &fprog)
}

// drainSocket discards the frames queued on the non-blocking socket fd.
func drainSocket(fd int) error {
	var b [1]byte
	for range 1 << 16 { // bound the loop should frames keep coming
		_, _, err := unix.Recvfrom(fd, b[:], unix.MSG_DONTWAIT|unix.MSG_TRUNC)
		switch err {
		case nil, unix.EINTR:
		case unix.ENETDOWN:
			// Bound to an interface that is down: the kernel noted it as
			// the socket's pending error, which this read cleared. The
			// socket works once the interface is up (see Recv).
		case unix.EAGAIN:
			return nil
		default:
			return err
		}
	}
	return nil
}

// setSockBuf sets a socket buffer size (see AFPacketConfig.RcvBuf), forcing
// it with optForce when the process may, with opt otherwise.
func setSockBuf(fd, size, optForce, opt int) error {
	if size < 0 {
		return nil
	}
	if size == 0 {
		size = DefaultAFPacketBuf
	}
	if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, optForce, size); err == nil {
		return nil
	}
	return unix.SetsockoptInt(fd, unix.SOL_SOCKET, opt, size)
}

func (l *AFPacketLink) opErr(op string, err error) error {
	return &OpError{Op: op, Interface: l.name, Err: err}
}

// goneErr is the error of operation op once the interface is gone.
func (l *AFPacketLink) goneErr(op string) error {
	return l.opErr(op, interfaceGone(unix.Errno(l.gone.Load())))
}

// markGone notes that the interface went away (errno says how the kernel
// told) and returns the error of operation op.
func (l *AFPacketLink) markGone(op string, errno unix.Errno) error {
	l.gone.CompareAndSwap(0, uint32(errno))
	return l.goneErr(op)
}

// CheckInterface implements InterfaceChecker.
//
// It takes closeMu, which keeps fd open, not rxMu, which a waiting Recv
// holds for its whole wait.
func (l *AFPacketLink) CheckInterface() error {
	l.closeMu.Lock()
	defer l.closeMu.Unlock()
	switch {
	case l.closed.Load():
		return l.opErr("check interface", net.ErrClosed)
	case l.gone.Load() != 0:
		return l.goneErr("check interface")
	}
	if err := l.askGone(); err != nil {
		return l.goneErr("check interface")
	}
	return nil
}

// askGone asks the socket, after a receive that failed ENETDOWN or a wait
// that saw nothing, whether its interface went away: the kernel unbinds a
// packet socket from a device it unregisters (its index reads -1) and
// leaves ENETDOWN as its error once, which wakes one wait and no later one.
// The caller holds rxMu or closeMu, which keep fd open.
func (l *AFPacketLink) askGone() error {
	// getsockname by hand: unix.Getsockname allocates, and a timed-out
	// receive allocates nothing.
	var sa unix.RawSockaddrLinklayer
	n := uint32(unsafe.Sizeof(sa))
	_, _, e := unix.RawSyscall(unix.SYS_GETSOCKNAME, uintptr(l.fd), uintptr(unsafe.Pointer(&sa)), uintptr(unsafe.Pointer(&n)))
	if e == 0 && sa.Family == unix.AF_PACKET && sa.Ifindex <= 0 {
		return l.markGone("recv", unix.ENODEV)
	}
	return nil
}

// Send hands frames to the kernel with sendmmsg, Batch at a time, and
// returns how many it took. It waits while the kernel has no room (EAGAIN,
// or ENOBUFS when the driver or the peer's queue dropped the frame, which it
// resends) for at most a second without progress, then fails with
// ErrTxStalled; until a frame goes again, later Sends try once and fail
// with it at once, so that an outage (a peer's carrier gone) costs its
// callers one wait, not one each. Frames are validated as they come: the frames before an
// invalid one (too long: ErrFrameTooLong; too short: ErrFrameTooShort) are
// sent and counted in n. A frame the kernel refuses (ENETDOWN, ENXIO,
// EMSGSIZE..., or a stalled wait) is counted in Stats.TxErrors and Send
// returns its index as n with an *OpError wrapping the errno.
func (l *AFPacketLink) Send(frames [][]byte) (int, error) {
	l.txMu.Lock()
	defer l.txMu.Unlock()
	if l.closed.Load() {
		return 0, l.opErr("send", net.ErrClosed)
	}
	maxLen := l.mtu + EthHeaderLen
	sent := 0
	for sent < len(frames) {
		if sent > 0 && l.closed.Load() {
			// Close waits for txMu: stop at a batch's end rather than
			// send the rest of a long call first.
			return sent, l.opErr("send", net.ErrClosed)
		}
		k := 0
		var bad error
		for k < l.batch && sent+k < len(frames) {
			f := frames[sent+k]
			if err := checkFrame(f, maxLen); err != nil {
				bad = err
				break
			}
			l.txIov[2*k].Base = unsafe.SliceData(f)
			l.txIov[2*k].SetLen(len(f))
			k++
		}
		m, err := l.sendBatch(k)
		for i := range k {
			l.txIov[2*i].Base = nil // do not pin the caller's frames
		}
		sent += m
		if err != nil {
			return sent, err
		}
		if bad != nil {
			return sent, l.opErr("send", bad)
		}
	}
	return sent, nil
}

// SendBuilt implements [FrameBuilder]. Up to Batch frames at a time are
// built in the link's own buffers, which the iovecs of one sendmmsg point
// at: the kernel copies them from there, as it copies the caller's frames
// for Send. Waits, errors and counters are those of Send.
func (l *AFPacketLink) SendBuilt(n int, b Builder) (int, error) {
	l.txMu.Lock()
	defer l.txMu.Unlock()
	if l.closed.Load() {
		return 0, l.opErr("send", net.ErrClosed)
	}
	if b == nil {
		return 0, l.opErr("send", errNilBuilder)
	}
	l.txWhole = wholeFrames{b}
	defer func() { l.txWhole = wholeFrames{} }()
	return l.sendTailsLocked(n, &l.txWhole)
}

// SendTails implements [TailSender]: a frame's head is built in the
// link's buffers and its tail is a second iovec of the frame's message,
// which the kernel copies from the caller's memory as it copies the head.
// Waits, errors and counters are those of Send.
func (l *AFPacketLink) SendTails(n int, t Tailer) (int, error) {
	l.txMu.Lock()
	defer l.txMu.Unlock()
	if l.closed.Load() {
		return 0, l.opErr("send", net.ErrClosed)
	}
	if t == nil {
		return 0, l.opErr("send", errNilTailer)
	}
	return l.sendTailsLocked(n, t)
}

// wholeFrames is a Builder as a Tailer: its frames have no tail.
type wholeFrames struct{ b Builder }

func (w *wholeFrames) Tail(i int, head []byte) (int, []byte) { return w.b.Build(i, head), nil }

// sendTailsLocked sends n frames of t, up to Batch at a time in one
// sendmmsg. The caller holds txMu.
func (l *AFPacketLink) sendTailsLocked(n int, t Tailer) (int, error) {
	maxLen := l.mtu + EthHeaderLen
	if n > 0 && l.txBuild == nil {
		l.txBuild = make([]byte, l.batch*maxLen)
	}
	// k: messages of the batch being built. Should Tail panic, those get
	// their single iovec back, as Send expects.
	k := 0
	defer func() { l.dropTails(k) }()
	sent := 0
	for sent < n {
		if sent > 0 && l.closed.Load() {
			return sent, l.opErr("send", net.ErrClosed) // as in Send
		}
		var bad error
		for k < l.batch && sent+k < n {
			buf := l.txBuild[k*maxLen : (k+1)*maxLen : (k+1)*maxLen]
			size, tail := t.Tail(sent+k, buf)
			if err := checkBuilt(size, maxLen); err != nil {
				bad = err
				break
			}
			if size+len(tail) > maxLen {
				bad = ErrFrameTooLong
				break
			}
			l.txIov[2*k].Base = unsafe.SliceData(buf)
			l.txIov[2*k].SetLen(size)
			if len(tail) > 0 {
				l.txIov[2*k+1].Base = unsafe.SliceData(tail)
				l.txIov[2*k+1].SetLen(len(tail))
				l.txMsgs[k].Hdr.SetIovlen(2)
			}
			k++
		}
		m, err := l.sendBatch(k)
		l.dropTails(k)
		k = 0
		sent += m
		if err != nil {
			return sent, err
		}
		if bad != nil {
			return sent, l.opErr("send", bad)
		}
	}
	return sent, nil
}

// dropTails gives txMsgs[:k] back their single iovec, unpinning the
// caller's tails. The caller holds txMu.
func (l *AFPacketLink) dropTails(k int) {
	for i := range k {
		if l.txMsgs[i].Hdr.Iovlen == 2 {
			l.txIov[2*i+1] = unix.Iovec{}
			l.txMsgs[i].Hdr.SetIovlen(1)
		}
	}
}

// sendBatch sends txMsgs[:k] and returns how many went; it returns fewer
// only with an error. The caller holds txMu.
func (l *AFPacketLink) sendBatch(k int) (int, error) {
	if l.gone.Load() != 0 {
		return 0, l.goneErr("send")
	}
	done := 0
	var stall time.Time // deadline of the current wait without progress
	backoff := afpacketMinBackoff
	for done < k {
		r, e := sendmmsg(l.fd, l.txMsgs[done:k], unix.MSG_DONTWAIT)
		if r > 0 {
			var bytes uint64
			for i := done; i < done+r; i++ {
				bytes += uint64(l.txIov[2*i].Len)
				if l.txMsgs[i].Hdr.Iovlen == 2 {
					bytes += uint64(l.txIov[2*i+1].Len)
				}
			}
			l.txFrames.Add(uint64(r))
			l.txBytes.Add(bytes)
			done += r
			stall = time.Time{}
			backoff = afpacketMinBackoff
			l.txStuck = false
			continue
		}
		switch e {
		case unix.EINTR:
			continue
		case 0: // no frame taken, no error: treat as a full buffer
			e = unix.EAGAIN
		case unix.EAGAIN, unix.ENOBUFS:
		case unix.ENXIO: // no device of the bound index: it is gone
			l.txErrors.Add(1)
			return done, l.markGone("send", e)
		default:
			l.txErrors.Add(1)
			return done, l.opErr("send", e)
		}
		if l.closed.Load() {
			return done, l.opErr("send", net.ErrClosed)
		}
		if l.txStuck {
			l.txErrors.Add(1)
			return done, l.opErr("send", fmt.Errorf("%w: no progress since a wait of %v (%w)", ErrTxStalled, afpacketSendStall, e))
		}
		now := time.Now()
		if stall.IsZero() {
			stall = now.Add(afpacketSendStall)
		} else if !now.Before(stall) {
			l.txErrors.Add(1)
			l.txStuck = true
			return done, l.opErr("send", fmt.Errorf("%w: no progress for %v (%w)", ErrTxStalled, afpacketSendStall, e))
		}
		var fds []unix.PollFd
		var wait time.Duration
		if e == unix.EAGAIN {
			// The socket buffer is full: wait until it drains.
			fds = l.txPoll[:]
			wait = min(stall.Sub(now), afpacketMaxPollOut)
		} else {
			// The frame was dropped below the socket, which is still
			// writable: back off, listening only for Close.
			fds = l.txPoll[1:]
			wait = min(stall.Sub(now), backoff)
			backoff = min(2*backoff, afpacketMaxBackoff)
		}
		l.txTs = unix.NsecToTimespec(int64(wait))
		l.txPoll[0].Revents, l.txPoll[1].Revents = 0, 0
		l.wakeups.Add(1)
		if _, pe := pollFds(fds, &l.txTs); pe != 0 && pe != unix.EINTR {
			return done, l.opErr("poll", pe)
		}
		if l.txPoll[1].Revents != 0 || l.closed.Load() {
			return done, l.opErr("send", net.ErrClosed)
		}
	}
	return done, nil
}

// Recv receives up to min(len(bufs), len(sizes), Batch) frames with
// recvmmsg; see [Link.Recv] for the timeout. A blocking Recv waits in poll
// on the socket and on the eventfd Close signals, or spins on recvmmsg when
// the link was opened with Spin. Kernel errors come back as an *OpError
// (after an ENETDOWN, for instance, the socket works again once the
// interface is up).
func (l *AFPacketLink) Recv(bufs [][]byte, sizes []int, timeout time.Duration) (int, error) {
	l.rxMu.Lock()
	defer l.rxMu.Unlock()
	if l.closed.Load() {
		return 0, l.opErr("recv", net.ErrClosed)
	}
	if len(sizes) < len(bufs) {
		return 0, l.opErr("recv", shortSizes(len(bufs), len(sizes)))
	}
	n := min(len(bufs), l.batch)
	if n == 0 {
		return 0, nil
	}
	for i := range n {
		l.rxIov[i].Base = unsafe.SliceData(bufs[i])
		l.rxIov[i].SetLen(len(bufs[i]))
	}
	r, err := l.recvLocked(n, timeout)
	for i := range n {
		l.rxIov[i].Base = nil // do not pin the caller's buffers
	}
	if r == 0 {
		return 0, err
	}
	var bytes, trunc uint64
	for i := range r {
		m := &l.rxMsgs[i]
		size := int(m.Len)
		if m.Hdr.Flags&unix.MSG_TRUNC != 0 || size > len(bufs[i]) {
			trunc++
			size = min(size, len(bufs[i]))
		}
		sizes[i] = size
		bytes += uint64(size)
	}
	l.rxFrames.Add(uint64(r))
	l.rxBytes.Add(bytes)
	if trunc > 0 {
		l.rxTruncated.Add(trunc)
	}
	return r, nil
}

// rxSlot is the size of one RecvVisit receive slot: MaxFrameLen rounded up
// to 64 bytes (room for a VLAN tag the interface lets through).
func (l *AFPacketLink) rxSlot() int {
	return (l.mtu + EthHeaderLen + 4 + 63) &^ 63
}

// RecvVisit implements [FrameVisitor]: up to min(max, Batch) frames are
// received with recvmmsg into the link's own buffers and shown to v there.
// A frame longer than its slot (MaxFrameLen plus at least 4 bytes, which an
// interface of this MTU does not deliver) is shown truncated and counted in
// Stats.RxTruncated.
func (l *AFPacketLink) RecvVisit(max int, timeout time.Duration, v Visitor) (int, error) {
	l.rxMu.Lock()
	defer l.rxMu.Unlock()
	if l.closed.Load() {
		return 0, l.opErr("recv", net.ErrClosed)
	}
	if v == nil {
		return 0, l.opErr("recv", errNilVisitor)
	}
	n := min(max, l.batch)
	if n <= 0 {
		return 0, nil
	}
	slot := l.rxSlot()
	if l.rxVisit == nil {
		l.rxVisit = make([]byte, l.batch*slot)
	}
	for i := range n {
		l.rxIov[i].Base = &l.rxVisit[i*slot]
		l.rxIov[i].SetLen(slot)
	}
	r, err := l.recvLocked(n, timeout)
	if r == 0 {
		return 0, err
	}
	var bytes, trunc uint64
	for i := range r {
		m := &l.rxMsgs[i]
		if m.Hdr.Flags&unix.MSG_TRUNC != 0 || int(m.Len) > slot {
			trunc++
		}
		bytes += uint64(min(int(m.Len), slot))
	}
	l.rxFrames.Add(uint64(r))
	l.rxBytes.Add(bytes)
	if trunc > 0 {
		l.rxTruncated.Add(trunc)
	}
	for i := range r {
		off := i * slot
		end := off + min(int(l.rxMsgs[i].Len), slot)
		v.Visit(l.rxVisit[off:end:end])
	}
	return r, nil
}

// recvLocked receives into rxMsgs[:n], waiting as timeout says. The caller
// holds rxMu.
func (l *AFPacketLink) recvLocked(n int, timeout time.Duration) (int, error) {
	if l.gone.Load() != 0 {
		return 0, l.goneErr("recv")
	}
	if timeout != 0 {
		l.rxTimer.start(timeout, l.spin)
	}
	for {
		r, e := recvmmsg(l.fd, l.rxMsgs[:n], unix.MSG_DONTWAIT)
		if r > 0 {
			return r, nil
		}
		switch e {
		case 0, unix.EAGAIN:
		case unix.EINTR:
			continue
		case unix.ENETDOWN:
			if err := l.askGone(); err != nil {
				return 0, err
			}
			return 0, l.opErr("recv", e) // down, not gone: works once up
		default:
			return 0, l.opErr("recv", e)
		}
		if timeout == 0 || l.wk.take() {
			return 0, nil
		}
		if l.closed.Load() {
			return 0, l.opErr("recv", net.ErrClosed)
		}
		if l.spin {
			if l.rxTimer.expired() {
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
		l.rxPoll[0].Revents, l.rxPoll[1].Revents, l.rxPoll[2].Revents = 0, 0, 0
		l.wakeups.Add(1)
		ready, pe := pollFds(l.rxPoll[:], ts)
		l.rxTimer.afterPoll()
		if pe != 0 && pe != unix.EINTR {
			return 0, l.opErr("poll", pe)
		}
		if l.rxPoll[1].Revents != 0 || l.closed.Load() {
			return 0, l.opErr("recv", net.ErrClosed)
		}
		if l.rxPoll[2].Revents != 0 {
			l.wk.drain()
		}
		if ready == 0 && pe == 0 {
			// No frame came: ask whether the interface went away.
			if err := l.askGone(); err != nil {
				return 0, err
			}
		}
	}
}

// Waited implements WaitMeter.
//
// +checklocksignore: the receiving goroutine, which writes rxTimer, reads it.
func (l *AFPacketLink) Waited() (time.Duration, bool) { return l.rxTimer.waited() }

// Wake implements Waker.
//
// It takes no lock of the link's (only the waker's), so a visitor may call
// it while Close waits for the receive to end.
func (l *AFPacketLink) Wake() { l.wk.wake() }

// HardwareAddr returns (a copy of) the interface's MAC address as it was at
// open.
func (l *AFPacketLink) HardwareAddr() net.HardwareAddr {
	return append(net.HardwareAddr(nil), l.hwaddr...)
}

// MTU returns the interface's MTU as it was at open.
func (l *AFPacketLink) MTU() int { return l.mtu }

// Info describes the link: Kind "afpacket", Queue -1, Mode "qdisc-bypass"
// or "qdisc" followed by "spin" or "poll".
func (l *AFPacketLink) Info() Info { return l.info }

// Stats returns the link's counters. RxDropped sums the kernel's
// PACKET_STATISTICS drops, read (and thereby reset in the kernel) on each
// call and at Close.
func (l *AFPacketLink) Stats() Stats {
	l.statsMu.Lock()
	l.pollDropsLocked()
	dropped := l.rxDropped
	l.statsMu.Unlock()
	return Stats{
		TxFrames:    l.txFrames.Load(),
		TxBytes:     l.txBytes.Load(),
		TxErrors:    l.txErrors.Load(),
		RxFrames:    l.rxFrames.Load(),
		RxBytes:     l.rxBytes.Load(),
		RxTruncated: l.rxTruncated.Load(),
		RxDropped:   dropped,
		Wakeups:     l.wakeups.Load(),
	}
}

// pollDropsLocked adds the kernel's drops since the last read to rxDropped.
// The caller holds statsMu.
func (l *AFPacketLink) pollDropsLocked() {
	if l.fd < 0 {
		return
	}
	if st, err := unix.GetsockoptTpacketStats(l.fd, unix.SOL_PACKET, unix.PACKET_STATISTICS); err == nil {
		l.rxDropped += uint64(st.Drops)
	}
}

// Close wakes the calls blocked in Send or Recv (they return net.ErrClosed),
// waits for the calls in flight, and closes the socket and the eventfd.
// Later calls return net.ErrClosed; closing again returns nil.
func (l *AFPacketLink) Close() error {
	l.closeMu.Lock()
	defer l.closeMu.Unlock()
	if l.fd < 0 {
		return nil
	}
	l.closed.Store(true)
	werr := eventfdSignal(l.efd)

	l.rxMu.Lock()
	l.txMu.Lock()
	l.statsMu.Lock()
	l.pollDropsLocked()
	err := unix.Close(l.fd)
	if e := unix.Close(l.efd); err == nil {
		err = e
	}
	if e := l.wk.close(); err == nil {
		err = e
	}
	l.fd, l.efd = -1, -1
	l.statsMu.Unlock()
	l.txMu.Unlock()
	l.rxMu.Unlock()

	if err == nil {
		err = werr
	}
	if err != nil {
		return l.opErr("close", err)
	}
	return nil
}
