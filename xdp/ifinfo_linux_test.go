package xdp_test

import (
	"errors"
	"net"
	"slices"
	"strings"
	"testing"

	"github.com/xmx-stack/xmx/internal/netlab"
	"github.com/xmx-stack/xmx/xdp"
)

func TestIfInfoFeatureNames(t *testing.T) {
	for _, c := range []struct {
		f    xdp.XDPFeatures
		want string
	}{
		{0, "none"},
		{xdp.XDPBasic | xdp.XDPRedirect | xdp.XDPRxSG, "basic,redirect,rx-sg"},
		{xdp.XDPNdoXmit | xdp.XDPXskZeroCopy | xdp.XDPHwOffload | xdp.XDPNdoXmitSG, "ndo-xmit,xsk-zerocopy,hw-offload,ndo-xmit-sg"},
		{1 << 9, "bit9"},
	} {
		if got := c.f.String(); got != c.want {
			t.Errorf("XDPFeatures(%#x).String() = %q, want %q", uint64(c.f), got, c.want)
		}
	}
}

// TestInterfaceInfoLoopback needs no privileges: rtnetlink, the netdev
// family and the ethtool ioctls answer anyone.
func TestInterfaceInfoLoopback(t *testing.T) {
	lo, err := xdp.InterfaceInfo("lo")
	if err != nil {
		t.Fatal(err)
	}
	want, err := net.InterfaceByName("lo")
	if err != nil {
		t.Fatal(err)
	}
	if lo.Name != "lo" || lo.Index != want.Index || lo.MTU != want.MTU || lo.Flags != want.Flags {
		t.Errorf("InterfaceInfo(lo) = %+v; the net package says index %d, MTU %d, flags %v", lo, want.Index, want.MTU, want.Flags)
	}
	if lo.RxQueues < 1 || lo.TxQueues < 1 || lo.QueuesFrom == "" {
		t.Errorf("lo queues: rx %d tx %d from %q", lo.RxQueues, lo.TxQueues, lo.QueuesFrom)
	}
	// Loopback has no driver XDP (no ndo_bpf): the kernel reports no
	// feature at all; generic XDP works on it as on anything.
	if lo.XDPFeaturesKnown {
		if lo.XDPFeatures != 0 || lo.NativeXDP() || lo.ZeroCopy() || lo.MultiBuffer() {
			t.Errorf("lo XDP features %v, want none", lo.XDPFeatures)
		}
	} else if lo.XDPFeaturesWhy == "" {
		t.Error("lo: XDP features unknown without a reason")
	} else {
		t.Logf("XDP features unknown here: %s", lo.XDPFeaturesWhy)
	}
	if !lo.GenericXDP() {
		t.Error("generic XDP not available on lo")
	}

	all, err := xdp.Interfaces()
	if err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(all, func(ii xdp.IfaceInfo) bool { return ii.Name == "lo" })
	if i < 0 {
		t.Fatalf("Interfaces() has no lo: %+v", all)
	}
	if all[i].Index != lo.Index || all[i].XDPFeatures != lo.XDPFeatures {
		t.Errorf("Interfaces() says %+v about lo, InterfaceInfo %+v", all[i], lo)
	}
	netIfs, _ := net.Interfaces()
	if len(all) != len(netIfs) {
		t.Errorf("Interfaces() lists %d interfaces, the net package %d", len(all), len(netIfs))
	}
}

func TestInterfaceInfoErrors(t *testing.T) {
	_, err := xdp.InterfaceInfo("xmxnosuch0")
	if !errors.Is(err, xdp.ErrNoInterface) || !strings.Contains(err.Error(), "xmxnosuch0") {
		t.Errorf("missing interface: %v, want ErrNoInterface naming it", err)
	}
	for _, bad := range []string{"", "a/b", "waytoolonginterfacename"} {
		if _, err := xdp.InterfaceInfo(bad); err == nil || !strings.Contains(err.Error(), "invalid interface name") {
			t.Errorf("InterfaceInfo(%q) = %v, want an invalid-name error", bad, err)
		}
	}
}

// TestInterfaceInfoVeth reads a lab host's veth from inside its namespace
// (netlab's Host.Do), before, while and after AF_XDP links hold the
// steering program.
func TestInterfaceInfoVeth(t *testing.T) {
	lab := netlab.New(t, netlab.Options{Hosts: 2, Queues: 2})
	h1, h2 := lab.Hosts[0], lab.Hosts[1]
	info := func(h *netlab.Host) xdp.IfaceInfo {
		t.Helper()
		var ii xdp.IfaceInfo
		if err := h.Do(func() (err error) {
			ii, err = xdp.InterfaceInfo(h.Interface)
			return err
		}); err != nil {
			t.Fatalf("InterfaceInfo(%s) in %s: %v", h.Interface, h.Namespace, err)
		}
		return ii
	}

	before := info(h1)
	if before.Driver != "veth" || before.Kind != "veth" || before.Index != h1.Ifindex ||
		before.MAC.String() != h1.MAC.String() || before.MTU != 1500 || !before.Up() ||
		before.OperState != "up" || before.RxQueues != 2 || before.TxQueues != 2 || before.QueuesFrom != "ethtool" {
		t.Errorf("veth info %+v; want driver veth, ifindex %d, MAC %s, MTU 1500, up, 2+2 queues from ethtool",
			before, h1.Ifindex, h1.MAC)
	}
	if len(before.XDPProgs) != 0 {
		t.Errorf("XDP programs on a fresh veth: %+v", before.XDPProgs)
	}
	if !before.XDPFeaturesKnown {
		t.Skipf("XDP features unknown on this kernel: %s", before.XDPFeaturesWhy)
	}
	// veth runs XDP in its driver and redirects; it is a redirect target
	// (ndo-xmit) only while its peer has an XDP program (or GRO) to take
	// the frames; it has no zero-copy.
	if !before.NativeXDP() || before.XDPFeatures&xdp.XDPRedirect == 0 || before.ZeroCopy() || before.XDPZeroCopyMaxSegs != 0 {
		t.Errorf("veth XDP features %v (zero-copy max segs %d), want basic and redirect without xsk-zerocopy",
			before.XDPFeatures, before.XDPZeroCopyMaxSegs)
	}

	a := openAFXDP(t, h1, xdp.AFXDPConfig{})
	b := openAFXDP(t, h2, xdp.AFXDPConfig{})
	during := info(h1)
	if len(during.XDPProgs) != 1 || during.XDPProgs[0].Mode != "drv" || during.XDPProgs[0].ID == 0 ||
		!strings.HasPrefix(during.XDPProgs[0].Name, "xmx_steer") {
		t.Errorf("XDP programs while an AF_XDP link is open: %+v, want the xmx_steer program in drv mode", during.XDPProgs)
	}
	want := xdp.XDPBasic | xdp.XDPRedirect | xdp.XDPNdoXmit
	if during.XDPFeatures&want != want {
		t.Errorf("veth XDP features with XDP on its peer: %v, want %v", during.XDPFeatures, want)
	}

	// The namespace holds lo and eth0, nothing of the machine's.
	var all []xdp.IfaceInfo
	if err := h1.Do(func() (err error) { all, err = xdp.Interfaces(); return err }); err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, ii := range all {
		names = append(names, ii.Name)
	}
	if !slices.Equal(names, []string{"lo", "eth0"}) {
		t.Errorf("Interfaces() in %s: %v, want [lo eth0]", h1.Namespace, names)
	}
	if i := slices.IndexFunc(all, func(ii xdp.IfaceInfo) bool { return ii.Name == "eth0" }); i >= 0 &&
		(len(all[i].XDPProgs) != 1 || all[i].XDPProgs[0].ID != during.XDPProgs[0].ID) {
		t.Errorf("Interfaces() eth0 programs %+v, InterfaceInfo %+v", all[i].XDPProgs, during.XDPProgs)
	}

	a.Close()
	b.Close()
	after := info(h1)
	if len(after.XDPProgs) != 0 {
		t.Errorf("XDP programs after the links closed: %+v", after.XDPProgs)
	}
}
