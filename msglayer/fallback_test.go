package msglayer_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/xmx-stack/xmx/internal/netlab"
	"github.com/xmx-stack/xmx/msglayer"
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
