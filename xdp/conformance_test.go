package xdp_test

import (
	"testing"

	"github.com/xmx-stack/xmx/internal/netlab"
	"github.com/xmx-stack/xmx/xdp"
	"github.com/xmx-stack/xmx/xdp/linktest"
)

// The in-memory links run the same conformance suite as the kernel links.

func memPair(cfg xdp.MemConfig) linktest.MakePair {
	return func(tb testing.TB) linktest.Pair {
		a, b := xdp.NewPair(cfg)
		tb.Cleanup(func() { a.Close(); b.Close() })
		return linktest.Pair{A: a, B: b}
	}
}

func TestMemConformance(t *testing.T) {
	// A queue as long as the burst: nothing may be lost.
	linktest.Run(t, memPair(xdp.MemConfig{QueueLen: 1 << 15}), linktest.Options{Lossless: true})
}

func TestMemConformanceFaults(t *testing.T) {
	cfg := xdp.MemConfig{Loss: 0.05, Reorder: 0.05, Duplicate: 0.01, Seed: 7}
	linktest.Run(t, memPair(cfg), linktest.Options{Faults: true})
}

func TestMemConformanceJumbo(t *testing.T) {
	linktest.Run(t, memPair(xdp.MemConfig{MTU: 9000}), linktest.Options{Frames: 5000})
}

func TestAFPacketConformance(t *testing.T) {
	lab := netlab.New(t, netlab.Options{Hosts: 2})
	h1, h2 := lab.Hosts[0], lab.Hosts[1]
	open := func(tb testing.TB, h *netlab.Host, spin bool) xdp.Link {
		var l *xdp.AFPacketLink
		err := h.Do(func() (err error) {
			l, err = xdp.OpenAFPacket(xdp.AFPacketConfig{Interface: h.Interface, Spin: spin})
			return err
		})
		if err != nil {
			tb.Fatalf("open AF_PACKET on %s: %v", h.Name, err)
		}
		tb.Cleanup(func() { l.Close() })
		return l
	}
	for _, spin := range []bool{false, true} {
		t.Run(map[bool]string{false: "poll", true: "spin"}[spin], func(t *testing.T) {
			linktest.Run(t, func(tb testing.TB) linktest.Pair {
				return linktest.Pair{A: open(tb, h1, spin), B: open(tb, h2, spin), KernelDrops: kernelDrops(tb, lab)}
			}, linktest.Options{})
		})
	}
}
