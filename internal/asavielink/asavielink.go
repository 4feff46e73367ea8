// Package asavielink wraps github.com/asavie/xdp's AF_XDP socket in an
// xdp.Link so that the link benchmark measures it with the same code as
// xmx's own links. It is the reference floor the benchmark compares against,
// not a link xmx uses: the library reads and writes ring indices without
// atomics, leaves its ring mappings mapped at Close and panics on unexpected
// errnos (see the README's dependency table).
//
// The frames are steered by xmx's own steering program (attached with a
// bpf_link), not by the library's program, which would take every frame of
// the queue (ARP and IP too) and stay attached after a crash.
package asavielink

import (
	"errors"
	"fmt"
	"net"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	axdp "github.com/asavie/xdp"
	"golang.org/x/sys/unix"

	"github.com/xmx-stack/xmx/bpf"
	"github.com/xmx-stack/xmx/xdp"
)

// Link is an xdp.Link over an asavie/xdp socket. Like the library's socket
// it is meant for one goroutine: Send and Recv are serialised by one mutex.
type Link struct {
	ifname string
	hw     net.HardwareAddr
	mtu    int
	spin   bool
	steer  *bpf.Steering
	mode   bpf.AttachMode

	mu     sync.Mutex
	sock   *axdp.Socket
	closed atomic.Bool

	rxFrames, rxBytes, txFrames, txBytes, trunc atomic.Uint64
}

var _ xdp.Link = (*Link)(nil)

// Open opens an asavie/xdp socket on queue 0 of ifname and steers the
// stack's EtherType to it. With spin, Recv spins on the RX ring; otherwise
// it sleeps in the library's Poll.
func Open(ifname string, spin bool) (_ *Link, err error) {
	ifi, err := net.InterfaceByName(ifname)
	if err != nil {
		return nil, fmt.Errorf("asavielink: open %s: %w", ifname, err)
	}
	opts := axdp.DefaultSocketOptions
	opts.NumFrames = 4096
	opts.FrameSize = 4096
	opts.FillRingNumDescs = 2048
	opts.CompletionRingNumDescs = 2048
	opts.RxRingNumDescs = 2048
	opts.TxRingNumDescs = 2048
	sock, err := newSocket(ifi.Index, &opts)
	if err != nil {
		return nil, fmt.Errorf("asavielink: socket on %s: %w", ifname, err)
	}
	l := &Link{ifname: ifname, hw: ifi.HardwareAddr, mtu: ifi.MTU, spin: spin, sock: sock}
	defer func() {
		if err != nil {
			l.Close()
		}
	}()
	if l.steer, err = bpf.Load(bpf.LoadOptions{}); err != nil {
		return nil, fmt.Errorf("asavielink: %w", err)
	}
	if l.mode, err = l.steer.Attach(ifi.Index, bpf.AttachAuto); err != nil {
		return nil, fmt.Errorf("asavielink: %w", err)
	}
	if err = l.steer.Register(0, sock.FD()); err != nil {
		return nil, fmt.Errorf("asavielink: %w", err)
	}
	// The library's idiom: give it half of the frames to receive into.
	sock.Fill(sock.GetDescs(opts.NumFrames / 2))
	return l, nil
}

// newSocket is axdp.NewSocket on queue 0, tried again while the bind fails
// with EBUSY: the kernel releases a closed socket's hold on the queue in
// the background (after 5–50 ms on the kernel of 2026-11-28), so a link
// opened right after another on the same queue closed (linkbench's systems
// one after the other) found it busy. Each failed try leaks what the
// library's cleanup leaves (its ring mappings, which keep the unbound
// socket and its UMEM registration until the process exits), so the tries
// are few: seven, 10 ms apart and then twice as long each time (1.3 s in
// all).
func newSocket(ifindex int, opts *axdp.SocketOptions) (*axdp.Socket, error) {
	busy := unix.EBUSY.Error()
	wait := 10 * time.Millisecond
	for try := 0; ; try++ {
		sock, err := axdp.NewSocket(ifindex, 0, opts)
		if err == nil || try == 7 || !strings.Contains(err.Error(), busy) {
			return sock, err
		}
		time.Sleep(wait)
		wait *= 2
	}
}

func (l *Link) HardwareAddr() net.HardwareAddr { return l.hw }
func (l *Link) MTU() int                       { return l.mtu }

func (l *Link) Info() xdp.Info {
	mode := "poll"
	if l.spin {
		mode = "spin"
	}
	return xdp.Info{Kind: "asavie", Interface: l.ifname, Mode: "copy " + l.mode.String() + " " + mode}
}

// Send copies frames into free UMEM frames and transmits them. The library
// panics on unexpected sendto errors; that panic is turned into an error.
func (l *Link) Send(frames [][]byte) (n int, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed.Load() {
		return 0, net.ErrClosed
	}
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("asavielink: send on %s: library panicked: %v", l.ifname, r)
		}
	}()
	deadline := time.Now().Add(time.Second)
	for n < len(frames) {
		if c := l.sock.NumCompleted(); c > 0 {
			l.sock.Complete(c)
		}
		descs := l.sock.GetDescs(min(len(frames)-n, l.sock.NumFreeTxSlots()))
		if len(descs) == 0 {
			if time.Now().After(deadline) {
				return n, fmt.Errorf("asavielink: send on %s: %w", l.ifname, xdp.ErrTxStalled)
			}
			l.sock.Poll(1)
			continue
		}
		for i := range descs {
			f := frames[n+i]
			if len(f) > l.mtu+xdp.EthHeaderLen {
				return n, xdp.ErrFrameTooLong
			}
			descs[i].Len = uint32(copy(l.sock.GetFrame(descs[i]), f))
			l.txBytes.Add(uint64(len(f)))
		}
		sent := l.sock.Transmit(descs)
		n += sent
		l.txFrames.Add(uint64(sent))
	}
	return n, nil
}

// Recv copies received frames out and hands their UMEM frames back to the
// fill ring.
func (l *Link) Recv(bufs [][]byte, sizes []int, timeout time.Duration) (int, error) {
	deadline := time.Now().Add(timeout)
	for {
		l.mu.Lock()
		if l.closed.Load() {
			l.mu.Unlock()
			return 0, net.ErrClosed
		}
		avail := l.sock.NumReceived()
		if avail == 0 && !l.spin && timeout != 0 {
			ms := -1
			if timeout > 0 {
				ms = max(1, int(time.Until(deadline)/time.Millisecond))
			}
			var err error
			avail, _, err = l.sock.Poll(ms)
			if err != nil {
				l.mu.Unlock()
				return 0, fmt.Errorf("asavielink: poll on %s: %w", l.ifname, err)
			}
		}
		if avail > 0 {
			descs := l.sock.Receive(min(avail, len(bufs)))
			for i, d := range descs {
				c := copy(bufs[i], l.sock.GetFrame(d))
				sizes[i] = c
				if c < int(d.Len) {
					l.trunc.Add(1)
				}
				l.rxBytes.Add(uint64(d.Len))
			}
			l.sock.Fill(descs)
			l.mu.Unlock()
			l.rxFrames.Add(uint64(len(descs)))
			return len(descs), nil
		}
		l.mu.Unlock()
		if timeout == 0 || (timeout > 0 && !time.Now().Before(deadline)) {
			return 0, nil
		}
	}
}

func (l *Link) Stats() xdp.Stats {
	return xdp.Stats{
		TxFrames: l.txFrames.Load(), TxBytes: l.txBytes.Load(),
		RxFrames: l.rxFrames.Load(), RxBytes: l.rxBytes.Load(),
		RxTruncated: l.trunc.Load(),
	}
}

// Close closes the socket and the steering program. The library leaves its
// four ring mappings mapped; they are unmapped when the process exits.
func (l *Link) Close() error {
	if !l.closed.CompareAndSwap(false, true) {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	var err error
	if l.steer != nil {
		l.steer.Unregister(0)
		err = l.steer.Close()
	}
	if uerr := unmapRings(l.sock); err == nil {
		err = uerr
	}
	if cerr := l.sock.Close(); err == nil {
		err = cerr
	}
	return err
}

// unmapRings unmaps the four ring mappings that the library's Close leaves
// mapped. A mapping of a socket holds the socket open, so without this the
// queue stays bound until the process exits and the next link on it fails
// with EBUSY. The mappings' addresses are recovered from the library's
// unexported ring slices (read-only reflection) and the kernel's ring
// offsets; the library's data path is left untouched.
func unmapRings(sock *axdp.Socket) error {
	var off unix.XDPMmapOffsets
	size := uint32(unsafe.Sizeof(off))
	if _, _, e := unix.Syscall6(unix.SYS_GETSOCKOPT, uintptr(sock.FD()), unix.SOL_XDP, unix.XDP_MMAP_OFFSETS,
		uintptr(unsafe.Pointer(&off)), uintptr(unsafe.Pointer(&size)), 0); e != 0 {
		return fmt.Errorf("asavielink: read ring offsets: %w", e)
	}
	v := reflect.ValueOf(sock).Elem()
	var errs []error
	for _, r := range []struct {
		field string
		ro    unix.XDPRingOffset
	}{{"fillRing", off.Fr}, {"completionRing", off.Cr}, {"rxRing", off.Rx}, {"txRing", off.Tx}} {
		descs := v.FieldByName(r.field).FieldByName("Descs")
		if descs.Len() == 0 {
			continue
		}
		entry := descs.Type().Elem().Size()
		base := descs.Pointer() - uintptr(r.ro.Desc)
		length := uintptr(r.ro.Desc) + uintptr(descs.Len())*entry
		if _, _, e := unix.Syscall(unix.SYS_MUNMAP, base, length, 0); e != 0 {
			errs = append(errs, fmt.Errorf("asavielink: unmap %s: %w", r.field, e))
		}
	}
	return errors.Join(errs...)
}
