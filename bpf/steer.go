//go:build linux

package bpf

import (
	"errors"
	"fmt"
	"sync"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
)

// DefaultEtherType is the EtherType steered to AF_XDP when
// LoadOptions.EtherType is zero (0x88B5, "local experimental").
const DefaultEtherType uint16 = 0x88B5

// MaxQueues is the number of XSKMAP slots: Register accepts RX queue indexes
// 0 to MaxQueues-1. Frames received on a higher queue are never redirected
// (they count as NoSocket and go to the kernel).
const MaxQueues = 64

// Steering is a loaded steering program with its XSKMAP and counters.
//
// The program redirects frames whose outer EtherType is the configured one to
// the AF_XDP socket registered for the receiving RX queue, and passes every
// other frame (and stack frames on a queue with no socket) to the kernel.
//
// A Steering is safe for concurrent use: in particular Register, Unregister
// and Stats may be called from several goroutines at once, since every map
// update is a single syscall synchronised by the kernel.
//
// One interface holds at most one xmx steering program: the program is
// attached through a bpf_link, which the kernel refuses to install on an
// interface that already has an XDP program in the same (or the other) mode,
// and a Steering itself is attached to at most one interface.
type Steering struct {
	mu      sync.RWMutex // guards the fields below against Close
	prog    *ebpf.Program
	xsks    *ebpf.Map
	stats   *ebpf.Map
	lnk     link.Link // nil until Attach succeeds
	ifindex int       // interface attached to; 0 if none
	closed  bool
}

// LoadOptions configures Load.
type LoadOptions struct {
	// EtherType is the outer EtherType (host byte order, e.g. 0x88B5) of the
	// frames to steer to AF_XDP. Zero means DefaultEtherType.
	EtherType uint16
	// Frags selects the multi-buffer variant of the program (xmx_steer_frags,
	// SEC("xdp.frags")), needed for jumbo frames and AF_XDP sockets bound
	// with XDP_USE_SG. It requires Linux 5.18 or later.
	Frags bool
	// HardwareAddr is the MAC of the interface the program will serve.
	// When it is not all zeros, unicast frames of the EtherType to another
	// MAC (those of a macvlan stacked on the interface, or of other hosts
	// on a promiscuous one) are passed to the kernel and counted in
	// Stats.OtherHost; broadcast and multicast frames are steered whatever
	// their destination. All zeros steers every frame of the EtherType.
	HardwareAddr [6]byte
}

// CheckEtherType reports why et cannot be the stack's EtherType: frames of
// it are steered away from the kernel, which must keep ARP, IP, VLANs and
// the link-layer protocols the kernel or common daemons speak (MPLS, PPPoE,
// MACsec, LLDP, 802.1X, PTP), and a value below 0x0600 is an 802.3 length,
// not a type. The local experimental values 0x88B5 (the default) and 0x88B6
// are the safe choices.
func CheckEtherType(et uint16) error {
	var what string
	switch et {
	case 0x0800:
		what = "IPv4"
	case 0x0806:
		what = "ARP"
	case 0x8035:
		what = "RARP"
	case 0x86DD:
		what = "IPv6"
	case 0x8100, 0x88A8, 0x9100:
		what = "a VLAN tag"
	case 0x8847, 0x8848:
		what = "MPLS"
	case 0x8863, 0x8864:
		what = "PPPoE"
	case 0x88E5:
		what = "MACsec"
	case 0x88CC:
		what = "LLDP"
	case 0x888E:
		what = "EAPOL (802.1X)"
	case 0x88F7:
		what = "PTP"
	default:
		if et >= 0x0600 {
			return nil
		}
		return fmt.Errorf("EtherType %#04x is an 802.3 length field, not an EtherType (want 0x0600 or above)", et)
	}
	return fmt.Errorf("EtherType %#04x is %s: the kernel must keep those frames", et, what)
}

// Load loads the steering program and its maps into the kernel. It does not
// attach it to any interface: see Steering.Attach. Loading needs
// CAP_BPF/CAP_NET_ADMIN (in practice: root). The caller must Close the
// returned Steering.
func Load(opts LoadOptions) (*Steering, error) {
	et := opts.EtherType
	if et == 0 {
		et = DefaultEtherType
	}
	if err := CheckEtherType(et); err != nil {
		return nil, fmt.Errorf("bpf: load steering program: %w", err)
	}
	progName := steerProgXmxSteer
	if opts.Frags {
		progName = steerProgXmxSteerFrags
	}

	spec, err := loadSteer()
	if err != nil {
		return nil, fmt.Errorf("bpf: load steering spec: %w", err)
	}
	if err := setVar(spec, steerVarEthertype, et); err != nil {
		return nil, err
	}
	if opts.HardwareAddr != [6]byte{} {
		if err := setVar(spec, steerVarIfmac, opts.HardwareAddr); err != nil {
			return nil, err
		}
		if err := setVar(spec, steerVarMatchMac, uint8(1)); err != nil {
			return nil, err
		}
	}
	// Load only the requested program so that a kernel without xdp.frags
	// support can still load the plain one.
	for name := range spec.Programs {
		if name != progName {
			delete(spec.Programs, name)
		}
	}

	coll, err := ebpf.NewCollection(spec)
	if err != nil {
		// A verifier rejection wraps an *ebpf.VerifierError; format it
		// with %+v for the whole log.
		return nil, fmt.Errorf("bpf: load steering program %s: %w", progName, err)
	}
	// Take what we keep out of the collection; closing it releases the rest
	// (the .rodata map stays alive through the program's reference).
	s := &Steering{
		prog:  coll.DetachProgram(progName),
		xsks:  coll.DetachMap(steerMapXsks),
		stats: coll.DetachMap(steerMapStats),
	}
	coll.Close()
	if s.prog == nil || s.xsks == nil || s.stats == nil {
		s.Close()
		return nil, fmt.Errorf("bpf: load steering program %s: object lacks a program or map", progName)
	}
	return s, nil
}

// setVar sets the load-time constant name of spec to value.
func setVar(spec *ebpf.CollectionSpec, name string, value any) error {
	v, ok := spec.Variables[name]
	if !ok {
		return fmt.Errorf("bpf: load steering: variable %q missing from object", name)
	}
	if err := v.Set(value); err != nil {
		return fmt.Errorf("bpf: load steering: set %s to %v: %w", name, value, err)
	}
	return nil
}

// AttachMode selects how Attach hooks the program into an interface.
type AttachMode int

const (
	// AttachAuto tries driver (native) mode first and falls back to generic
	// mode if the driver refuses.
	AttachAuto AttachMode = iota
	// AttachDriver attaches in driver (native) mode only (XDP_FLAGS_DRV_MODE).
	AttachDriver
	// AttachGeneric attaches in generic mode only (XDP_FLAGS_SKB_MODE):
	// works on every interface, but frames are copied into an skb first.
	AttachGeneric
)

// String returns "auto", "drv" or "skb", the names ip-link(8) uses.
func (m AttachMode) String() string {
	switch m {
	case AttachAuto:
		return "auto"
	case AttachDriver:
		return "drv"
	case AttachGeneric:
		return "skb"
	default:
		return fmt.Sprintf("AttachMode(%d)", int(m))
	}
}

// Attach attaches the program to the interface ifindex with a bpf_link
// (cilium/ebpf link.AttachXDP), so that a killed process leaves nothing
// attached: the kernel detaches the program when the last reference to the
// link goes away. AttachAuto tries driver mode first and falls back to
// generic (skb) mode; the mode in force (AttachDriver or AttachGeneric) is
// returned.
//
// The ifindex is resolved in the network namespace of the calling thread. A
// Steering is attached at most once; to move it, Close it and Load anew. The
// kernel refuses (EBUSY/EEXIST) an interface that already holds an XDP
// program, so an interface holds at most one xmx steering program.
func (s *Steering) Attach(ifindex int, mode AttachMode) (AttachMode, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return mode, fmt.Errorf("bpf: attach xdp (%s) to ifindex %d: %w", mode, ifindex, ErrClosed)
	}
	if s.lnk != nil {
		return mode, fmt.Errorf("bpf: attach xdp (%s) to ifindex %d: already attached to ifindex %d", mode, ifindex, s.ifindex)
	}
	if ifindex <= 0 {
		return mode, fmt.Errorf("bpf: attach xdp (%s) to ifindex %d: invalid interface index", mode, ifindex)
	}

	var (
		lnk link.Link
		err error
		got = mode
	)
	switch mode {
	case AttachDriver:
		lnk, err = s.attach(ifindex, link.XDPDriverMode)
	case AttachGeneric:
		lnk, err = s.attach(ifindex, link.XDPGenericMode)
	case AttachAuto:
		got = AttachDriver
		lnk, err = s.attach(ifindex, link.XDPDriverMode)
		if err != nil {
			drvErr := err
			got = AttachGeneric
			lnk, err = s.attach(ifindex, link.XDPGenericMode)
			if err != nil {
				err = fmt.Errorf("drv: %w; skb: %w", drvErr, err)
			}
		}
	default:
		return mode, fmt.Errorf("bpf: attach xdp (%s) to ifindex %d: unknown attach mode", mode, ifindex)
	}
	if err != nil {
		return mode, fmt.Errorf("bpf: attach xdp (%s) to ifindex %d: %w", mode, ifindex, err)
	}
	s.lnk, s.ifindex = lnk, ifindex
	return got, nil
}

func (s *Steering) attach(ifindex int, flags link.XDPAttachFlags) (link.Link, error) {
	return link.AttachXDP(link.XDPOptions{Program: s.prog, Interface: ifindex, Flags: flags})
}

// ErrClosed is returned (wrapped) by methods of a closed Steering.
var ErrClosed = errors.New("steering closed")

// Register makes the AF_XDP socket fd the destination of steered frames
// received on RX queue queue (XSKMAP[queue] = fd), replacing any socket
// registered before. The map does not hold the socket open: closing the
// socket's last fd takes it out of the map (the kernel does so when it
// releases the socket), and frames of that queue then go to the kernel.
// The socket should be bound to the same interface and queue, or the kernel
// drops the frames. Safe for concurrent use.
func (s *Steering) Register(queue int, fd int) error {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if err := s.checkQueue("register xsk", queue); err != nil {
		return err
	}
	if fd < 0 {
		return fmt.Errorf("bpf: register xsk for queue %d on %s: invalid fd %d", queue, s.where(), fd)
	}
	if err := s.xsks.Put(uint32(queue), uint32(fd)); err != nil {
		return fmt.Errorf("bpf: register xsk fd %d for queue %d on %s: %w", fd, queue, s.where(), err)
	}
	return nil
}

// Unregister removes the socket registered for RX queue queue, if any; stack
// frames on that queue then go to the kernel again. Unregistering an empty
// queue is not an error. Safe for concurrent use.
func (s *Steering) Unregister(queue int) error {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if err := s.checkQueue("unregister xsk", queue); err != nil {
		return err
	}
	if err := s.xsks.Delete(uint32(queue)); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("bpf: unregister xsk for queue %d on %s: %w", queue, s.where(), err)
	}
	return nil
}

// checkQueue validates queue for op; the caller holds s.mu.
func (s *Steering) checkQueue(op string, queue int) error {
	if s.closed {
		return fmt.Errorf("bpf: %s for queue %d on %s: %w", op, queue, s.where(), ErrClosed)
	}
	if queue < 0 || queue >= MaxQueues {
		return fmt.Errorf("bpf: %s for queue %d on %s: queue out of range [0, %d)", op, queue, s.where(), MaxQueues)
	}
	return nil
}

// where names the interface for error messages; the caller holds s.mu.
func (s *Steering) where() string {
	if s.ifindex == 0 {
		return "unattached program"
	}
	return fmt.Sprintf("ifindex %d", s.ifindex)
}

// Stats are the program's packet counters, summed over all CPUs since Load.
type Stats struct {
	// Redirected counts frames of the stack's EtherType that found a socket
	// registered for their RX queue.
	Redirected uint64
	// Passed counts frames of any other EtherType, passed to the kernel.
	Passed uint64
	// Runt counts frames shorter than an Ethernet header, passed to the
	// kernel.
	Runt uint64
	// NoSocket counts frames of the stack's EtherType received on a queue
	// with no registered socket; they are passed to the kernel.
	NoSocket uint64
	// OtherHost counts unicast frames of the stack's EtherType to a MAC
	// other than LoadOptions.HardwareAddr; they are passed to the kernel.
	OtherHost uint64
}

// Stats reads and sums the per-CPU counters. Safe for concurrent use; the
// counters are read one after the other, not as an atomic snapshot.
func (s *Steering) Stats() (Stats, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		return Stats{}, fmt.Errorf("bpf: read stats on %s: %w", s.where(), ErrClosed)
	}
	var st Stats
	for _, c := range [...]struct {
		idx steerXmxStat
		dst *uint64
	}{
		{steerXmxStatXMX_STAT_REDIRECTED, &st.Redirected},
		{steerXmxStatXMX_STAT_PASSED, &st.Passed},
		{steerXmxStatXMX_STAT_RUNT, &st.Runt},
		{steerXmxStatXMX_STAT_NO_SOCKET, &st.NoSocket},
		{steerXmxStatXMX_STAT_OTHER_HOST, &st.OtherHost},
	} {
		var perCPU []uint64 // one value per possible CPU
		if err := s.stats.Lookup(uint32(c.idx), &perCPU); err != nil {
			return Stats{}, fmt.Errorf("bpf: read stats counter %d on %s: %w", c.idx, s.where(), err)
		}
		for _, n := range perCPU {
			*c.dst += n
		}
	}
	return st, nil
}

// Compile-time check that Stats covers every counter of steer.c: this fails
// to build when enum xmx_stat gains or loses a counter.
var _ = [1]struct{}{}[steerXmxStatXMX_STAT_MAX-5]

// Program returns the loaded XDP program, e.g. to run it with
// BPF_PROG_TEST_RUN or to attach it by other means. It stays owned by the
// Steering: do not close it. It returns nil after Close.
func (s *Steering) Program() *ebpf.Program {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		return nil
	}
	return s.prog
}

// Close detaches the program (closes the bpf_link) and releases the program
// and its maps. Registered sockets stay open: the map never held them, and
// each is its owner's to close. It is idempotent: calls after the first
// return nil.
func (s *Steering) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true

	var errs []error
	if s.lnk != nil {
		if err := s.lnk.Close(); err != nil {
			errs = append(errs, fmt.Errorf("bpf: detach xdp from ifindex %d: %w", s.ifindex, err))
		}
		s.lnk = nil
	}
	for _, c := range []struct {
		what string
		obj  interface{ Close() error }
	}{{"program", s.prog}, {"xskmap", s.xsks}, {"stats map", s.stats}} {
		// Close is nil-safe for ebpf objects (Load cleans up after a
		// partial collection that way).
		if err := c.obj.Close(); err != nil {
			errs = append(errs, fmt.Errorf("bpf: close %s on %s: %w", c.what, s.where(), err))
		}
	}
	return errors.Join(errs...)
}
