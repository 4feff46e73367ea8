package asavielink

import (
	"testing"

	"github.com/xmx-stack/xmx/internal/netlab"
	"github.com/xmx-stack/xmx/xdp"
)

// TestOpenRightAfterClose: linkbench opens its systems one after the
// other on the same queue; the kernel releases a closed AF_XDP socket's
// hold on the queue in the background, and a bind right after it failed
// with EBUSY (the demo's link floor, on the kernel of 2026-11-28).
func TestOpenRightAfterClose(t *testing.T) {
	lab := netlab.New(t, netlab.Options{Hosts: 2})
	h := lab.Hosts[0]
	for i := range 3 {
		if err := h.Do(func() error {
			l, err := xdp.OpenAFXDP(xdp.AFXDPConfig{Interface: h.Interface})
			if err != nil {
				return err
			}
			l.Close()
			a, err := Open(h.Interface, false)
			if err != nil {
				return err
			}
			return a.Close()
		}); err != nil {
			t.Fatalf("round %d: %v", i, err)
		}
	}
}
