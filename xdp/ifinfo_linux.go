package xdp

// Interface information for "xmx info" (the Open-MX omx_info of xmx): what
// the kernel says about an interface and its XDP abilities. Everything is
// asked of the kernel through sockets (rtnetlink, generic netlink, the
// ethtool ioctl) created by the calling thread, never through /sys, so that
// a caller whose OS thread switched network namespaces sees that
// namespace's interfaces (sysfs shows the namespace it was mounted in).

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"runtime"
	"strings"
	"time"
	"unsafe"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// XDPFeatures is the XDP feature bitmask a driver advertises to the kernel
// (enum netdev_xdp_act of linux/netdev.h, Linux 6.3 and later).
type XDPFeatures uint64

// The XDP features. The names in comments are those of the kernel's
// netdev.yaml, which String uses.
const (
	XDPBasic       XDPFeatures = 1 << iota // basic: XDP_ABORTED, XDP_DROP, XDP_PASS, XDP_TX in the driver
	XDPRedirect                            // redirect: XDP_REDIRECT (what AF_XDP needs)
	XDPNdoXmit                             // ndo-xmit: the device can be the target of a redirect
	XDPXskZeroCopy                         // xsk-zerocopy: AF_XDP zero-copy
	XDPHwOffload                           // hw-offload: programs run on the NIC
	XDPRxSG                                // rx-sg: multi-buffer (frames larger than a page) on receive
	XDPNdoXmitSG                           // ndo-xmit-sg: multi-buffer frames as a redirect target
)

var xdpFeatureNames = []string{"basic", "redirect", "ndo-xmit", "xsk-zerocopy", "hw-offload", "rx-sg", "ndo-xmit-sg"}

// Names lists the features set in f, by their kernel names; unknown bits
// are named by their value ("bit9").
func (f XDPFeatures) Names() []string {
	names := []string{}
	for i := 0; i < 64; i++ {
		if f&(1<<i) == 0 {
			continue
		}
		if i < len(xdpFeatureNames) {
			names = append(names, xdpFeatureNames[i])
		} else {
			names = append(names, fmt.Sprintf("bit%d", i))
		}
	}
	return names
}

// String joins Names with commas; "none" when no bit is set.
func (f XDPFeatures) String() string {
	if f == 0 {
		return "none"
	}
	return strings.Join(f.Names(), ",")
}

// XDPProg is an XDP program attached to an interface.
type XDPProg struct {
	Mode string `json:"mode"` // "drv" (native), "skb" (generic) or "hw" (offloaded)
	ID   uint32 `json:"id"`   // kernel program id (bpftool prog show id ID)
	// Name is the program's name, "" when it cannot be read (reading it
	// needs CAP_SYS_ADMIN).
	Name string `json:"name"`
}

// IfaceInfo describes a network interface as xmx sees it.
type IfaceInfo struct {
	Name      string
	Index     int
	MAC       net.HardwareAddr
	MTU       int
	Kind      string    // rtnetlink link kind: "veth", "bridge"...; "" for NICs and lo
	Flags     net.Flags // administrative up, running (carrier), loopback...
	OperState string    // RFC 2863 state: "up", "down", "lowerlayerdown", "unknown"...

	// Driver, DriverVersion, FirmwareVersion and BusInfo are what ethtool -i
	// reports; Driver falls back to Kind for devices without ethtool driver
	// information, and is "" when there is neither (lo).
	Driver, DriverVersion, FirmwareVersion, BusInfo string

	// RxQueues and TxQueues count the queues in use (ethtool channels,
	// combined channels included) or, for devices without channel
	// information, the queues allocated (rtnetlink); QueuesFrom says which.
	RxQueues, TxQueues int
	QueuesFrom         string // "ethtool" or "rtnetlink"

	// XDPFeaturesKnown is false when the kernel does not report XDP
	// features (no "netdev" generic netlink family: Linux before 6.3);
	// XDPFeaturesWhy then says why, and XDPFeatures is 0.
	XDPFeaturesKnown bool
	XDPFeaturesWhy   string
	XDPFeatures      XDPFeatures
	// XDPZeroCopyMaxSegs is the most buffers of one frame an AF_XDP
	// zero-copy socket may use (0 unless zero-copy is supported).
	XDPZeroCopyMaxSegs int

	// XDPProgs are the XDP programs attached now (none, one, or one per
	// mode).
	XDPProgs []XDPProg
}

// Up reports whether the interface is administratively up.
func (i *IfaceInfo) Up() bool { return i.Flags&net.FlagUp != 0 }

// NativeXDP reports whether the driver runs XDP programs itself (the basic
// feature set). False also when the features are unknown.
func (i *IfaceInfo) NativeXDP() bool { return i.XDPFeatures&XDPBasic != 0 }

// GenericXDP reports whether generic (skb) XDP is available: always, on
// any interface, at the cost of running after the kernel built an skb.
func (i *IfaceInfo) GenericXDP() bool { return true }

// ZeroCopy reports whether the driver supports AF_XDP zero-copy.
func (i *IfaceInfo) ZeroCopy() bool { return i.XDPFeatures&XDPXskZeroCopy != 0 }

// MultiBuffer reports whether native XDP takes frames larger than a page
// (jumbo frames through AF_XDP without generic mode).
func (i *IfaceInfo) MultiBuffer() bool { return i.XDPFeatures&XDPRxSG != 0 }

// ErrNoInterface is returned (wrapped) by InterfaceInfo for an interface
// that does not exist in the calling thread's network namespace.
var ErrNoInterface = errors.New("no such interface")

// InterfaceInfo describes the interface name of the calling thread's
// network namespace.
func InterfaceInfo(name string) (IfaceInfo, error) {
	if name == "" || len(name) >= unix.IFNAMSIZ || strings.ContainsAny(name, "/ \x00") {
		return IfaceInfo{}, &OpError{Op: "interface info", Interface: fmt.Sprintf("%q", name),
			Err: errors.New("invalid interface name")}
	}
	rt, err := dialNetlink(unix.NETLINK_ROUTE)
	if err != nil {
		return IfaceInfo{}, &OpError{Op: "open rtnetlink socket", Interface: name, Err: err}
	}
	defer rt.close()
	body := make([]byte, unix.SizeofIfInfomsg)
	body[0] = unix.AF_UNSPEC
	body = appendAttr(body, unix.IFLA_IFNAME, append([]byte(name), 0))
	body = appendAttr(body, unix.IFLA_EXT_MASK, binary.NativeEndian.AppendUint32(nil, rtextFilterSkipStats))
	var infos []IfaceInfo
	err = rt.roundTrip(unix.RTM_GETLINK, 0, body, func(typ uint16, data []byte) error {
		if typ == unix.RTM_NEWLINK {
			if info, ok := parseLink(data); ok {
				infos = append(infos, info)
			}
		}
		return nil
	})
	if errors.Is(err, unix.ENODEV) || err == nil && len(infos) == 0 {
		return IfaceInfo{}, &OpError{Op: "interface info", Interface: name, Err: ErrNoInterface}
	}
	if err != nil {
		return IfaceInfo{}, &OpError{Op: "rtnetlink RTM_GETLINK", Interface: name, Err: err}
	}
	info := infos[0]
	feats, why := xdpFeatures()
	completeInfo(&info, feats, why)
	return info, nil
}

// Interfaces describes every interface of the calling thread's network
// namespace, in index order.
func Interfaces() ([]IfaceInfo, error) {
	rt, err := dialNetlink(unix.NETLINK_ROUTE)
	if err != nil {
		return nil, &OpError{Op: "open rtnetlink socket", Err: err}
	}
	defer rt.close()
	body := make([]byte, unix.SizeofIfInfomsg)
	body[0] = unix.AF_UNSPEC
	body = appendAttr(body, unix.IFLA_EXT_MASK, binary.NativeEndian.AppendUint32(nil, rtextFilterSkipStats))
	var infos []IfaceInfo
	err = rt.roundTrip(unix.RTM_GETLINK, unix.NLM_F_DUMP, body, func(typ uint16, data []byte) error {
		if typ == unix.RTM_NEWLINK {
			if info, ok := parseLink(data); ok {
				infos = append(infos, info)
			}
		}
		return nil
	})
	if err != nil {
		return nil, &OpError{Op: "rtnetlink RTM_GETLINK dump", Err: err}
	}
	feats, why := xdpFeatures()
	for i := range infos {
		completeInfo(&infos[i], feats, why)
	}
	return infos, nil
}

// rtextFilterSkipStats is RTEXT_FILTER_SKIP_STATS: no counters in the
// answer (we do not use them and they make it large).
const rtextFilterSkipStats = 1 << 3

// IFLA_XDP_ATTACHED values (enum of linux/if_link.h).
const (
	xdpAttachedNone = iota
	xdpAttachedDrv
	xdpAttachedSkb
	xdpAttachedHw
	xdpAttachedMulti
)

// operStates names IF_OPER_* (linux/if.h) as ip(8) does, in lower case.
var operStates = []string{"unknown", "notpresent", "down", "lowerlayerdown", "testing", "dormant", "up"}

// parseLink decodes an RTM_NEWLINK message (ifinfomsg and attributes).
func parseLink(data []byte) (IfaceInfo, bool) {
	if len(data) < unix.SizeofIfInfomsg {
		return IfaceInfo{}, false
	}
	info := IfaceInfo{
		Index: int(int32(binary.NativeEndian.Uint32(data[4:8]))),
		Flags: netFlags(binary.NativeEndian.Uint32(data[8:12])),
	}
	var xdpAttached byte
	var progID, drvID, skbID, hwID uint32
	for typ, val := range attrs(data[unix.SizeofIfInfomsg:]) {
		switch typ {
		case unix.IFLA_IFNAME:
			info.Name = cString(val)
		case unix.IFLA_ADDRESS:
			if len(val) > 0 {
				info.MAC = net.HardwareAddr(append([]byte(nil), val...))
			}
		case unix.IFLA_MTU:
			info.MTU = int(u32(val))
		case unix.IFLA_OPERSTATE:
			if len(val) > 0 && int(val[0]) < len(operStates) {
				info.OperState = operStates[val[0]]
			} else if len(val) > 0 {
				info.OperState = fmt.Sprintf("state%d", val[0])
			}
		case unix.IFLA_NUM_TX_QUEUES:
			info.TxQueues = int(u32(val))
		case unix.IFLA_NUM_RX_QUEUES:
			info.RxQueues = int(u32(val))
		case unix.IFLA_LINKINFO:
			for t, v := range attrs(val) {
				if t == unix.IFLA_INFO_KIND {
					info.Kind = cString(v)
				}
			}
		case unix.IFLA_XDP:
			for t, v := range attrs(val) {
				switch t {
				case unix.IFLA_XDP_ATTACHED:
					if len(v) > 0 {
						xdpAttached = v[0]
					}
				case unix.IFLA_XDP_PROG_ID:
					progID = u32(v)
				case unix.IFLA_XDP_DRV_PROG_ID:
					drvID = u32(v)
				case unix.IFLA_XDP_SKB_PROG_ID:
					skbID = u32(v)
				case unix.IFLA_XDP_HW_PROG_ID:
					hwID = u32(v)
				}
			}
		}
	}
	if info.Name == "" {
		return info, false
	}
	info.QueuesFrom = "rtnetlink"
	switch xdpAttached {
	case xdpAttachedDrv:
		info.XDPProgs = []XDPProg{{Mode: "drv", ID: progID}}
	case xdpAttachedSkb:
		info.XDPProgs = []XDPProg{{Mode: "skb", ID: progID}}
	case xdpAttachedHw:
		info.XDPProgs = []XDPProg{{Mode: "hw", ID: progID}}
	case xdpAttachedMulti:
		for _, p := range []XDPProg{{"drv", drvID, ""}, {"skb", skbID, ""}, {"hw", hwID, ""}} {
			if p.ID != 0 {
				info.XDPProgs = append(info.XDPProgs, p)
			}
		}
	}
	return info, true
}

// netFlags converts IFF_* flags to net.Flags.
func netFlags(f uint32) net.Flags {
	var fl net.Flags
	for _, m := range []struct {
		iff uint32
		fl  net.Flags
	}{{unix.IFF_UP, net.FlagUp}, {unix.IFF_BROADCAST, net.FlagBroadcast}, {unix.IFF_LOOPBACK, net.FlagLoopback},
		{unix.IFF_POINTOPOINT, net.FlagPointToPoint}, {unix.IFF_MULTICAST, net.FlagMulticast}, {unix.IFF_RUNNING, net.FlagRunning}} {
		if f&m.iff != 0 {
			fl |= m.fl
		}
	}
	return fl
}

// completeInfo adds what rtnetlink does not say: driver and channels
// (ethtool), XDP features (from feats, the netdev family's answer by
// ifindex, or why it is unknown) and the names of attached programs.
func completeInfo(info *IfaceInfo, feats map[int]devFeatures, why string) {
	if fd, err := ethtoolSocket(); err == nil {
		if d, err := unix.IoctlGetEthtoolDrvinfo(fd, info.Name); err == nil {
			info.Driver = unix.ByteSliceToString(d.Driver[:])
			info.DriverVersion = unix.ByteSliceToString(d.Version[:])
			info.FirmwareVersion = unix.ByteSliceToString(d.Fw_version[:])
			info.BusInfo = unix.ByteSliceToString(d.Bus_info[:])
		}
		if ch, err := ethtoolChannels(fd, info.Name); err == nil && ch.rxCount+ch.combinedCount > 0 {
			info.RxQueues = int(ch.rxCount + ch.combinedCount)
			info.TxQueues = int(ch.txCount + ch.combinedCount)
			info.QueuesFrom = "ethtool"
		}
		unix.Close(fd)
	}
	if info.Driver == "" {
		info.Driver = info.Kind
	}
	if why != "" {
		info.XDPFeaturesWhy = why
	} else if f, ok := feats[info.Index]; ok {
		info.XDPFeaturesKnown = true
		info.XDPFeatures = f.features
		info.XDPZeroCopyMaxSegs = f.zcMaxSegs
	} else {
		info.XDPFeaturesWhy = "the kernel's netdev family did not report this interface"
	}
	for i := range info.XDPProgs {
		info.XDPProgs[i].Name = progName(info.XDPProgs[i].ID)
	}
}

// progName returns the name of BPF program id, "" when it cannot be read.
func progName(id uint32) string {
	if id == 0 {
		return ""
	}
	p, err := ebpf.NewProgramFromID(ebpf.ProgramID(id))
	if err != nil {
		return ""
	}
	defer p.Close()
	pi, err := p.Info()
	if err != nil {
		return ""
	}
	return pi.Name
}

// ethtoolSocket returns a socket for the ethtool ioctl in the calling
// thread's network namespace.
func ethtoolSocket() (int, error) {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		// A kernel without IPv4: any socket will do for SIOCETHTOOL.
		fd, err = unix.Socket(unix.AF_UNIX, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	}
	return fd, err
}

// ethtoolChannelsMsg is struct ethtool_channels (linux/ethtool.h).
type ethtoolChannelsMsg struct {
	cmd                                         uint32
	maxRx, maxTx, maxOther, maxCombined         uint32
	rxCount, txCount, otherCount, combinedCount uint32
}

// ifreqPtr is struct ifreq with its union holding a pointer (ifr_data).
type ifreqPtr struct {
	name [unix.IFNAMSIZ]byte
	data unsafe.Pointer
	_    [24 - unsafe.Sizeof(uintptr(0))]byte
}

// ethtoolChannels is "ethtool -l": ETHTOOL_GCHANNELS.
func ethtoolChannels(fd int, name string) (ethtoolChannelsMsg, error) {
	ch := ethtoolChannelsMsg{cmd: unix.ETHTOOL_GCHANNELS}
	var ifr ifreqPtr
	copy(ifr.name[:unix.IFNAMSIZ-1], name)
	ifr.data = unsafe.Pointer(&ch)
	_, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.SIOCETHTOOL, uintptr(unsafe.Pointer(&ifr)))
	runtime.KeepAlive(&ch)
	if e != 0 {
		return ch, e
	}
	return ch, nil
}

// Generic netlink "netdev" family (linux/netdev.h, Linux 6.3+).
const (
	netdevFamilyName       = "netdev"
	netdevCmdDevGet        = 1
	netdevADevIfindex      = 1
	netdevADevXDPFeatures  = 3
	netdevADevXDPZCMaxSegs = 4
	genlCtrlVersion        = 2
	genlNetdevVersion      = 1
	sizeofGenlMsghdr       = 4
	whyNoNetdevFamily      = "the kernel has no netdev generic netlink family (Linux before 6.3 does not report XDP features)"
)

// devFeatures is one device's answer to NETDEV_CMD_DEV_GET.
type devFeatures struct {
	features  XDPFeatures
	zcMaxSegs int
}

// xdpFeatures dumps the XDP features of every device of the calling
// thread's namespace by ifindex. When they cannot be had, it returns why
// (a missing family is not an error: the features are unknown).
func xdpFeatures() (map[int]devFeatures, string) {
	c, err := dialNetlink(unix.NETLINK_GENERIC)
	if err != nil {
		return nil, "opening a generic netlink socket: " + err.Error()
	}
	defer c.close()
	family, err := c.genlFamily(netdevFamilyName)
	if errors.Is(err, unix.ENOENT) {
		return nil, whyNoNetdevFamily
	}
	if err != nil {
		return nil, "resolving the netdev generic netlink family: " + err.Error()
	}
	out := map[int]devFeatures{}
	body := []byte{netdevCmdDevGet, genlNetdevVersion, 0, 0}
	err = c.roundTrip(family, unix.NLM_F_DUMP, body, func(typ uint16, data []byte) error {
		if typ != family || len(data) < sizeofGenlMsghdr {
			return nil
		}
		var idx int
		var f devFeatures
		for t, v := range attrs(data[sizeofGenlMsghdr:]) {
			switch t {
			case netdevADevIfindex:
				idx = int(u32(v))
			case netdevADevXDPFeatures:
				f.features = XDPFeatures(u64(v))
			case netdevADevXDPZCMaxSegs:
				f.zcMaxSegs = int(u32(v))
			}
		}
		if idx > 0 {
			out[idx] = f
		}
		return nil
	})
	if err != nil {
		return nil, "netdev NETDEV_CMD_DEV_GET dump: " + err.Error()
	}
	return out, ""
}

// genlFamily resolves a generic netlink family name to its id
// (CTRL_CMD_GETFAMILY); a missing family is ENOENT.
func (c *nlConn) genlFamily(name string) (uint16, error) {
	body := []byte{unix.CTRL_CMD_GETFAMILY, genlCtrlVersion, 0, 0}
	body = appendAttr(body, unix.CTRL_ATTR_FAMILY_NAME, append([]byte(name), 0))
	var id uint16
	err := c.roundTrip(unix.GENL_ID_CTRL, 0, body, func(typ uint16, data []byte) error {
		if typ != unix.GENL_ID_CTRL || len(data) < sizeofGenlMsghdr {
			return nil
		}
		for t, v := range attrs(data[sizeofGenlMsghdr:]) {
			if t == unix.CTRL_ATTR_FAMILY_ID && len(v) >= 2 {
				id = binary.NativeEndian.Uint16(v)
			}
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	if id == 0 {
		return 0, errors.New("CTRL_CMD_GETFAMILY answered without a family id")
	}
	return id, nil
}

// nlConn is a netlink socket for request/answer exchanges.
type nlConn struct {
	fd  int
	seq uint32
	buf []byte
}

// dialNetlink opens a netlink socket of protocol proto in the calling
// thread's network namespace.
func dialNetlink(proto int) (*nlConn, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, proto)
	if err != nil {
		return nil, err
	}
	// An answer that never comes must not hang the caller.
	tv := unix.NsecToTimeval(int64(5 * time.Second))
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		unix.Close(fd)
		return nil, err
	}
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		unix.Close(fd)
		return nil, err
	}
	return &nlConn{fd: fd, seq: uint32(time.Now().UnixNano()), buf: make([]byte, 64<<10)}, nil
}

func (c *nlConn) close() { unix.Close(c.fd) }

// roundTrip sends one request of type typ with body and calls fn for every
// message of the answer until it ends: NLMSG_DONE for a dump (flags with
// NLM_F_DUMP), the acknowledgement otherwise. An error answer is returned
// as its unix.Errno.
func (c *nlConn) roundTrip(typ uint16, flags uint16, body []byte, fn func(typ uint16, data []byte) error) error {
	c.seq++
	dump := flags&unix.NLM_F_DUMP == unix.NLM_F_DUMP
	if !dump {
		flags |= unix.NLM_F_ACK
	}
	msg := make([]byte, unix.NLMSG_HDRLEN, unix.NLMSG_HDRLEN+len(body))
	binary.NativeEndian.PutUint32(msg[0:4], uint32(unix.NLMSG_HDRLEN+len(body)))
	binary.NativeEndian.PutUint16(msg[4:6], typ)
	binary.NativeEndian.PutUint16(msg[6:8], flags|unix.NLM_F_REQUEST)
	binary.NativeEndian.PutUint32(msg[8:12], c.seq)
	msg = append(msg, body...)
	if err := unix.Sendto(c.fd, msg, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return fmt.Errorf("send: %w", err)
	}
	for {
		n, _, err := unix.Recvfrom(c.fd, c.buf, unix.MSG_TRUNC)
		if err == unix.EINTR {
			continue
		}
		if err == unix.EAGAIN {
			return errors.New("no answer from the kernel within 5 s")
		}
		if err != nil {
			return fmt.Errorf("receive: %w", err)
		}
		if n > len(c.buf) {
			return fmt.Errorf("receive: answer of %d bytes truncated to %d", n, len(c.buf))
		}
		b := c.buf[:n]
		for len(b) >= unix.NLMSG_HDRLEN {
			l := int(binary.NativeEndian.Uint32(b[0:4]))
			if l < unix.NLMSG_HDRLEN || l > len(b) {
				return fmt.Errorf("receive: malformed message (length %d of %d)", l, len(b))
			}
			mtyp := binary.NativeEndian.Uint16(b[4:6])
			seq := binary.NativeEndian.Uint32(b[8:12])
			data := b[unix.NLMSG_HDRLEN:l]
			if al := nlAlign(l); al < len(b) {
				b = b[al:]
			} else {
				b = nil
			}
			if seq != c.seq {
				continue // a late answer to an earlier request
			}
			switch mtyp {
			case unix.NLMSG_DONE:
				if len(data) >= 4 {
					if code := int32(binary.NativeEndian.Uint32(data)); code < 0 {
						return unix.Errno(-code)
					}
				}
				return nil
			case unix.NLMSG_ERROR:
				if len(data) < 4 {
					return errors.New("receive: short error message")
				}
				if code := int32(binary.NativeEndian.Uint32(data)); code < 0 {
					return unix.Errno(-code)
				}
				if !dump {
					return nil // the acknowledgement
				}
			case unix.NLMSG_NOOP, unix.NLMSG_OVERRUN:
			default:
				if err := fn(mtyp, data); err != nil {
					return err
				}
			}
		}
	}
}

func nlAlign(n int) int { return (n + unix.NLA_ALIGNTO - 1) &^ (unix.NLA_ALIGNTO - 1) }

// appendAttr appends a netlink attribute to b (which must be 4-aligned).
func appendAttr(b []byte, typ uint16, val []byte) []byte {
	b = binary.NativeEndian.AppendUint16(b, uint16(unix.SizeofNlAttr+len(val)))
	b = binary.NativeEndian.AppendUint16(b, typ)
	b = append(b, val...)
	for len(b)%unix.NLA_ALIGNTO != 0 {
		b = append(b, 0)
	}
	return b
}

// attrs iterates over the netlink attributes in b, yielding each type
// (without the nested and byte-order flags) and value. It stops at the
// first malformed attribute.
func attrs(b []byte) func(yield func(uint16, []byte) bool) {
	return func(yield func(uint16, []byte) bool) {
		for len(b) >= unix.SizeofNlAttr {
			l := int(binary.NativeEndian.Uint16(b[0:2]))
			typ := binary.NativeEndian.Uint16(b[2:4]) &^ (unix.NLA_F_NESTED | unix.NLA_F_NET_BYTEORDER)
			if l < unix.SizeofNlAttr || l > len(b) {
				return
			}
			if !yield(typ, b[unix.SizeofNlAttr:l]) {
				return
			}
			if al := nlAlign(l); al < len(b) {
				b = b[al:]
			} else {
				return
			}
		}
	}
}

func u32(b []byte) uint32 {
	if len(b) < 4 {
		return 0
	}
	return binary.NativeEndian.Uint32(b)
}

func u64(b []byte) uint64 {
	switch {
	case len(b) >= 8:
		return binary.NativeEndian.Uint64(b)
	case len(b) >= 4:
		return uint64(binary.NativeEndian.Uint32(b))
	}
	return 0
}

func cString(b []byte) string { return unix.ByteSliceToString(b) }
