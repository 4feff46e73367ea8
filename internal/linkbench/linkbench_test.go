package linkbench

import (
	"math"
	"strings"
	"testing"
	"time"

	"github.com/xmx-stack/xmx/xdp"
)

// memPair attaches two in-memory links to a fresh hub.
func memPair(t *testing.T) (a, b xdp.Link) {
	t.Helper()
	hub := xdp.NewHub(xdp.MemConfig{})
	a, b = hub.Attach(), hub.Attach()
	t.Cleanup(func() { a.Close(); b.Close() })
	return a, b
}

// TestPingPongCounts checks that counts out of range are refused before
// anything is sent: a huge n used to panic making the slice of round trips,
// and warmup+n to overflow, so that nothing was measured and no error said
// so.
func TestPingPongCounts(t *testing.T) {
	a, b := memPair(t)
	for _, c := range []struct{ warmup, n int }{
		{0, -1}, {-1, 1}, {0, 1 << 62}, {math.MaxInt, 1}, {MaxRoundTrips + 1, 1}, {0, MaxRoundTrips + 1},
	} {
		res, err := PingPong(a, b, 64, c.warmup, c.n)
		if err == nil || !strings.Contains(err.Error(), "round trips") {
			t.Errorf("PingPong(warmup %d, n %d) = %d round trips, %v; want an error", c.warmup, c.n, len(res.RTTs), err)
		}
	}
	if res, err := PingPong(a, b, 64, 3, 0); err != nil || len(res.RTTs) != 0 {
		t.Errorf("PingPong(warmup 3, n 0) = %d round trips, %v; want a warm-up alone", len(res.RTTs), err)
	}
	res, err := PingPong(a, b, 64, 2, 5)
	if err != nil || len(res.RTTs)+res.Lost != 5 {
		t.Errorf("PingPong(warmup 2, n 5) = %d round trips, %d lost, %v; want 5 in all", len(res.RTTs), res.Lost, err)
	}
}

// TestStreamCounts checks that a stream of no frames, or of a negative
// count (which sliced the send batch below 0), is refused.
func TestStreamCounts(t *testing.T) {
	a, b := memPair(t)
	for _, c := range []struct {
		max int
		dur time.Duration
	}{{0, time.Second}, {-5, time.Second}, {10, 0}} {
		if _, err := Stream(a, b, 64, c.dur, c.max); err == nil {
			t.Errorf("Stream(%v, %d frames): no error", c.dur, c.max)
		}
	}
}
