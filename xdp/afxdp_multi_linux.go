package xdp

import (
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// AFXDPMultiLink is a Link over one AF_XDP socket per receive queue of an
// interface, for multi-queue NICs whose RSS spreads incoming frames over
// several queues. Recv gathers from every queue; Send puts every frame on
// the queue chosen by its destination address, so frames to one peer leave
// through one socket and stay in order.
//
// SendBuilt builds each frame in the UMEM of the queue the previous frame
// went to; a frame that turns out to be bound for another queue (its
// destination decides, as for Send) is copied to that queue, which is where
// the following frames are then built.
//
// LOCK ORDERING: rxMu > the queue links' own locks; txMu > the queue links'
// own locks.
type AFXDPMultiLink struct {
	links []*AFXDPLink
	spin  bool
	wk    waker

	closed atomic.Bool
	// closeMu is held shared by Recv while it polls the queue links' file
	// descriptors, exclusively by Close while it closes them.
	closeMu sync.RWMutex

	rxMu sync.Mutex
	// +checklocks:rxMu
	next int // queue where the next Recv starts, for fairness
	// +checklocks:rxMu
	pollFds []unix.PollFd // every socket, then every close eventfd, then wk's
	// +checklocks:rxMu
	timer recvTimer

	// txMu serialises SendBuilt.
	txMu sync.Mutex
	// +checklocks:txMu
	txQ int // queue index where SendBuilt builds the next frame
	// spill holds a frame SendBuilt built on the wrong queue (MaxFrameLen
	// bytes; nil with one queue).
	// +checklocks:txMu
	spill []byte
	// +checklocks:txMu
	spillFrames [1][]byte
}

var (
	_ Link             = (*AFXDPMultiLink)(nil)
	_ Waker            = (*AFXDPMultiLink)(nil)
	_ FrameBuilder     = (*AFXDPMultiLink)(nil)
	_ FrameVisitor     = (*AFXDPMultiLink)(nil)
	_ IdleProber       = (*AFXDPMultiLink)(nil)
	_ InterfaceChecker = (*AFXDPMultiLink)(nil)
)

// OpenAFXDPQueues opens one AF_XDP socket on each of the given queues of
// cfg.Interface (cfg.Queue is ignored) and returns them as one link.
func OpenAFXDPQueues(cfg AFXDPConfig, queues []int) (*AFXDPMultiLink, error) {
	if len(queues) == 0 {
		return nil, fmt.Errorf("xdp: open AF_XDP on %s: no queue given", cfg.Interface)
	}
	m := &AFXDPMultiLink{spin: cfg.Spin}
	m.wk.fd = -1 // not open yet: a failed open's Close leaves it
	seen := map[int]bool{}
	for _, q := range queues {
		if seen[q] {
			m.Close()
			return nil, fmt.Errorf("xdp: open AF_XDP on %s: queue %d given twice", cfg.Interface, q)
		}
		seen[q] = true
		c := cfg
		c.Queue = q
		l, err := OpenAFXDP(c)
		if err != nil {
			m.Close()
			return nil, err
		}
		m.links = append(m.links, l)
	}
	for _, l := range m.links {
		m.pollFds = append(m.pollFds, unix.PollFd{Fd: int32(l.fd), Events: unix.POLLIN})
	}
	for _, l := range m.links {
		m.pollFds = append(m.pollFds, unix.PollFd{Fd: int32(l.efd), Events: unix.POLLIN})
	}
	if err := m.wk.open(); err != nil {
		m.Close()
		return nil, &OpError{Op: "create eventfd", Interface: cfg.Interface, Err: err}
	}
	m.pollFds = append(m.pollFds, unix.PollFd{Fd: int32(m.wk.fd), Events: unix.POLLIN})
	if len(m.links) > 1 {
		m.spill = make([]byte, m.links[0].maxFrame)
	}
	for _, l := range m.links {
		l.siblings = m.links // one interface: gone for one, gone for all
	}
	return m, nil
}

// Queues returns the per-queue links.
func (m *AFXDPMultiLink) Queues() []*AFXDPLink { return m.links }

// HardwareAddr implements Link.
func (m *AFXDPMultiLink) HardwareAddr() net.HardwareAddr { return m.links[0].HardwareAddr() }

// MTU implements Link.
func (m *AFXDPMultiLink) MTU() int { return m.links[0].MTU() }

// Info implements Link; Queue is the first queue and Mode lists them all.
func (m *AFXDPMultiLink) Info() Info {
	info := m.links[0].Info()
	qs := make([]string, len(m.links))
	for i, l := range m.links {
		qs[i] = fmt.Sprint(l.queue)
	}
	info.Mode += " queues=" + strings.Join(qs, ",")
	return info
}

// queueFor picks the send queue of a frame from its destination address.
func (m *AFXDPMultiLink) queueFor(f []byte) int {
	if len(m.links) == 1 || len(f) < 6 {
		return 0
	}
	h := uint32(2166136261)
	for _, b := range f[:6] {
		h = (h ^ uint32(b)) * 16777619
	}
	return int(h % uint32(len(m.links)))
}

// Send implements Link: runs of consecutive frames bound for the same queue
// go out in one batch.
func (m *AFXDPMultiLink) Send(frames [][]byte) (int, error) {
	sent := 0
	for sent < len(frames) {
		q := m.queueFor(frames[sent])
		end := sent + 1
		for end < len(frames) && m.queueFor(frames[end]) == q {
			end++
		}
		n, err := m.links[q].Send(frames[sent:end])
		sent += n
		if err != nil {
			return sent, err
		}
	}
	return sent, nil
}

// SendBuilt implements FrameBuilder: frames are built in place in the UMEM
// of one queue, and copied only when they turn out to be bound for another
// (see AFXDPMultiLink).
func (m *AFXDPMultiLink) SendBuilt(n int, b Builder) (int, error) {
	if len(m.links) == 1 {
		return m.links[0].SendBuilt(n, b)
	}
	if m.closed.Load() {
		return 0, m.links[0].closedErr("send")
	}
	if b == nil {
		return 0, &OpError{Op: "send", Interface: m.links[0].ifname, Err: errNilBuilder}
	}
	m.txMu.Lock()
	defer m.txMu.Unlock()
	sent := 0
	for sent < n {
		next, spilled, err := m.links[m.txQ].sendBuiltRouted(sent, n, b, m, m.txQ)
		sent = next
		if err != nil || spilled == 0 {
			return sent, err
		}
		f := m.spill[:spilled]
		q := m.queueFor(f)
		m.spillFrames[0] = f
		k, err := m.links[q].Send(m.spillFrames[:])
		m.spillFrames[0] = nil
		sent += k
		if err != nil {
			return sent, err
		}
		m.txQ = q
	}
	return sent, nil
}

// Recv implements Link: it takes what every queue has ready, starting with
// a different queue each call, and waits on all of them when none has any.
func (m *AFXDPMultiLink) Recv(bufs [][]byte, sizes []int, timeout time.Duration) (int, error) {
	return m.recv(bufs, sizes, 0, nil, timeout)
}

// RecvVisit implements FrameVisitor, gathering from the queues as Recv does.
func (m *AFXDPMultiLink) RecvVisit(max int, timeout time.Duration, v Visitor) (int, error) {
	if m.closed.Load() {
		return 0, m.links[0].closedErr("recv")
	}
	if v == nil {
		return 0, &OpError{Op: "recv", Interface: m.links[0].ifname, Err: errNilVisitor}
	}
	return m.recv(nil, nil, max, v, timeout)
}

// recv is Recv, or with a visitor v RecvVisit of up to max frames.
func (m *AFXDPMultiLink) recv(bufs [][]byte, sizes []int, max int, v Visitor, timeout time.Duration) (int, error) {
	m.closeMu.RLock()
	defer m.closeMu.RUnlock()
	if m.closed.Load() {
		return 0, m.links[0].closedErr("recv")
	}
	if v == nil && len(sizes) < len(bufs) {
		return 0, &OpError{Op: "recv", Interface: m.links[0].ifname, Err: shortSizes(len(bufs), len(sizes))}
	}
	limit := len(bufs)
	if v != nil {
		limit = max
	}
	if limit <= 0 {
		return 0, nil // no room: nothing could be received
	}
	m.rxMu.Lock()
	defer m.rxMu.Unlock()
	if timeout != 0 {
		m.timer.start(timeout, m.spin)
	}
	for spins := 0; ; spins++ {
		got := 0
		for i := range m.links {
			if got == limit {
				break
			}
			l := m.links[(m.next+i)%len(m.links)]
			var n int
			var err error
			if v == nil {
				n, err = l.Recv(bufs[got:], sizes[got:], 0)
			} else {
				n, err = l.RecvVisit(limit-got, 0, v)
			}
			if err != nil {
				return got, err
			}
			got += n
		}
		m.next = (m.next + 1) % len(m.links)
		if got > 0 || timeout == 0 || m.wk.take() {
			return got, nil
		}
		if m.closed.Load() {
			return 0, m.links[0].closedErr("recv")
		}
		if m.spin {
			// Reading the clock costs tens of nanoseconds; look at it
			// every few hundred turns only.
			if spins&255 == 255 && m.timer.expired() {
				return 0, nil
			}
			if m.timer.spinLook() {
				if err := m.links[0].CheckInterface(); err != nil && !errors.Is(err, net.ErrClosed) {
					return 0, err
				}
			}
			continue
		}
		tsp, ok := m.timer.pollSlice()
		if !ok {
			return 0, nil
		}
		ready, e := pollFds(m.pollFds, tsp)
		m.timer.afterPoll()
		if e != 0 && e != unix.EINTR {
			return 0, &OpError{Op: "recv: poll", Interface: m.links[0].ifname, Err: e}
		}
		for _, p := range m.pollFds[len(m.links) : 2*len(m.links)] {
			if p.Revents != 0 {
				return 0, m.links[0].closedErr("recv")
			}
		}
		if m.pollFds[2*len(m.links)].Revents != 0 {
			m.wk.drain()
		}
		if ready == 0 && e == 0 {
			// No frame came: ask whether the interface went away (one
			// socket is enough: markGone marks them all).
			l := m.links[0]
			l.rxMu.Lock()
			err := l.askGone()
			l.rxMu.Unlock()
			if err != nil {
				return 0, err
			}
		}
	}
}

// CheckInterface implements InterfaceChecker (one socket tells for the
// interface: markGone marks every queue).
func (m *AFXDPMultiLink) CheckInterface() error {
	if m.closed.Load() {
		return m.links[0].closedErr("check interface")
	}
	return m.links[0].CheckInterface()
}

// RxFrames implements RxBudget: the receive frames of every queue.
func (m *AFXDPMultiLink) RxFrames() int {
	n := 0
	for _, l := range m.links {
		n += l.RxFrames()
	}
	return n
}

// RxIdle implements IdleProber: every queue's link is idle. It takes no
// lock (the queue links are set at open and look at their rings without
// one).
func (m *AFXDPMultiLink) RxIdle() bool {
	for _, l := range m.links {
		if !l.RxIdle() {
			return false
		}
	}
	return true
}

// Wake implements Waker.
//
// It takes no lock of the link's (only the waker's), so a visitor may call
// it while Close waits for the receive to end.
func (m *AFXDPMultiLink) Wake() { m.wk.wake() }

// Stats implements Link: the sum over the queues.
func (m *AFXDPMultiLink) Stats() Stats {
	var s Stats
	for _, l := range m.links {
		s.Add(l.Stats())
	}
	return s
}

// Close implements Link: it closes every queue's link.
func (m *AFXDPMultiLink) Close() error {
	if !m.closed.CompareAndSwap(false, true) {
		return nil
	}
	// Wake a Recv blocked in poll before waiting for it to leave.
	for _, l := range m.links {
		eventfdSignal(l.efd)
	}
	m.closeMu.Lock()
	defer m.closeMu.Unlock()
	var errs []error
	for _, l := range m.links {
		errs = append(errs, l.Close())
	}
	errs = append(errs, m.wk.close())
	return errors.Join(errs...)
}
