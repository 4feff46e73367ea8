package msglayer_test

import (
	"bytes"
	"fmt"
	"testing"
	"time"

	"github.com/xmx-stack/xmx/internal/netlab"
	"github.com/xmx-stack/xmx/msglayer"
)

// exchangeAll sends messages of every class both ways and does a Put and
// a Get, checking every byte.
func exchangeAll(t *testing.T, a, b *msglayer.Endpoint) {
	t.Helper()
	ctx := ctxFor(t, 60*time.Second)
	sizes := []int{0, 8, 1400, 3000, 8900, 9000, 20000, 32 << 10, 65000, 100 << 10, 1 << 20}
	for _, dir := range [][2]*msglayer.Endpoint{{a, b}, {b, a}} {
		from, to := dir[0], dir[1]
		for i, n := range sizes {
			buf := make([]byte, n)
			transfer(t, ctx, from, to, uint64(i), message(i, n), buf)
			checkMessage(t, buf, i, n)
		}
	}
	target := make([]byte, 1<<20)
	reg, err := b.Register(target)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Deregister(reg)
	data := message(99, 700000)
	p, _ := a.IPut(b.Addr(), reg.Mem, 1000, [][]byte{data}, nil)
	if _, err := a.Wait(ctx, p); err != nil {
		t.Fatal(err)
	}
	back := make([]byte, len(data))
	g, _ := a.IGet(b.Addr(), reg.Mem, 1000, [][]byte{back}, nil)
	if _, err := a.Wait(ctx, g); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(back, data) {
		t.Fatal("put then get: data differs")
	}
}

// TestMTUs runs every message class and one-sided operations over AF_XDP
// at MTU 1500, at veth's native-XDP limit (3506), with jumbo frames
// (9000, multi-buffer) and at veth's largest MTU (65535: 17 UMEM frames per
// frame, and a 32 KiB medium message in one); and over AF_PACKET, which
// the README recommends for bulk transfers on veth at jumbo MTUs, at 9000
// and 65535.
func TestMTUs(t *testing.T) {
	for _, tc := range []struct {
		kind string
		mtu  int
	}{{"afxdp", 1500}, {"afxdp", 3506}, {"afxdp", 9000}, {"afxdp", 65535}, {"afpacket", 9000}, {"afpacket", 65535}} {
		t.Run(fmt.Sprintf("%s/%d", tc.kind, tc.mtu), func(t *testing.T) {
			w := labWorldOf(t, netlab.New(t, netlab.Options{Hosts: 2, MTU: tc.mtu}), tc.kind)
			a, b := w.pair(t, msglayer.Config{}, msglayer.Config{})
			exchangeAll(t, a, b)
			info, _ := a.LinkInfo()
			if info.Kind != tc.kind {
				t.Errorf("link kind %q, want %q", info.Kind, tc.kind)
			}
			if tc.kind == "afxdp" && tc.mtu > 3506 && !bytes.Contains([]byte(info.Mode), []byte("sg")) {
				t.Errorf("MTU %d link mode %q: want multi-buffer (sg)", tc.mtu, info.Mode)
			}
		})
	}
}

// TestMixedMTU: a jumbo host and a 1500-byte host on one wire negotiate
// 1500-byte frames and still talk.
func TestMixedMTU(t *testing.T) {
	lab := netlab.New(t, netlab.Options{Hosts: 2, MTU: 1500})
	h1 := lab.Hosts[0]
	if out, err := h1.Command("ip", "link", "set", "dev", h1.Interface, "mtu", "9000").CombinedOutput(); err != nil {
		t.Fatalf("set MTU 9000 on %s: %v: %s", h1.Name, err, out)
	}
	w := labWorld2(t, lab)
	a, b := w.pair(t, msglayer.Config{}, msglayer.Config{})
	if a.LinkMTU() != 9000 || b.LinkMTU() != 1500 {
		t.Fatalf("link MTUs %d and %d, want 9000 and 1500", a.LinkMTU(), b.LinkMTU())
	}
	if got := a.PeerMTU(b.Addr()); got != 1500 {
		t.Fatalf("negotiated MTU %d, want 1500", got)
	}
	exchangeAll(t, a, b)
}
