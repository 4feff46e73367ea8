package msglayer_test

import (
	"context"
	"errors"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/xmx-stack/xmx/internal/netlab"
	"github.com/xmx-stack/xmx/msglayer"
	"github.com/xmx-stack/xmx/xdp"
)

// TestFallbackToAFPacket: with LinkKind auto, an interface on which
// AF_XDP cannot open gets an AF_PACKET link, LinkInfo says why, and
// messages flow as on any link.
func TestFallbackToAFPacket(t *testing.T) {
	lab := netlab.New(t, netlab.Options{Hosts: 2})
	defer msglayer.FailAFXDP(errors.New("refused by the test"))()
	a, b := labWorldOf(t, lab, "auto").pair(t, msglayer.Config{}, msglayer.Config{})
	for _, e := range []*msglayer.Endpoint{a, b} {
		if info, why := e.LinkInfo(); info.Kind != "afpacket" || !strings.Contains(why, "AF_PACKET, because AF_XDP failed") || !strings.Contains(why, "refused by the test") {
			t.Errorf("%v: a %s link, chosen because %q", e.Addr(), info.Kind, why)
		}
	}
	pingPong(t, a, b, 1000, 20, nil)
}

// TestInterfaceGoneEndsWait deletes the interface under an endpoint whose
// Wait sleeps in the link: the Wait ends with the link's ErrInterfaceGone
// (within the link's look, about a second) instead of waiting for good.
func TestInterfaceGoneEndsWait(t *testing.T) {
	for _, kind := range []string{"afxdp", "afpacket"} {
		t.Run(kind, func(t *testing.T) {
			lab := netlab.New(t, netlab.Options{Hosts: 2})
			a, _ := labWorldOf(t, lab, kind).pair(t, msglayer.Config{}, msglayer.Config{})
			r, err := a.Irecv(0, 0, [][]byte{make([]byte, 64)}, nil)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			ended := make(chan error, 1)
			go func() {
				_, err := a.Wait(ctx, r)
				ended <- err
			}()
			time.Sleep(50 * time.Millisecond)
			h := lab.Hosts[0]
			if out, err := h.Command("ip", "link", "del", h.Interface).CombinedOutput(); err != nil {
				t.Fatalf("ip link del %s: %v: %s", h.Interface, err, out)
			}
			for i := 0; ; i++ {
				err := <-ended
				if i < 3 && errors.Is(err, syscall.ENETDOWN) && !errors.Is(err, xdp.ErrInterfaceGone) {
					// AF_PACKET says the interface went down on its way out.
					go func() {
						_, err := a.Wait(ctx, r)
						ended <- err
					}()
					continue
				}
				if !errors.Is(err, xdp.ErrInterfaceGone) {
					t.Fatalf("Wait after the interface was deleted = %v; want xdp.ErrInterfaceGone", err)
				}
				t.Logf("Wait ended: %v", err)
				break
			}
		})
	}
}
