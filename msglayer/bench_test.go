package msglayer_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/xmx-stack/xmx/internal/linkbench"
	"github.com/xmx-stack/xmx/internal/netlab"
	"github.com/xmx-stack/xmx/msglayer"
	"github.com/xmx-stack/xmx/xdp"
)

// pingPong runs n round trips of size-byte messages from a to b (b echoes
// each) and returns the round-trip times.
func pingPong(tb testing.TB, a, b *msglayer.Endpoint, size, n int, rtts []time.Duration) []time.Duration {
	ctx := context.Background()
	echoed := make(chan error, 1)
	go func() {
		buf := make([]byte, size)
		segs := [][]byte{buf}
		for {
			r, err := b.Irecv(0, 0, segs, nil)
			if err != nil {
				echoed <- err
				return
			}
			st, err := b.Wait(ctx, r)
			xdp.Trace(1, xdp.TraceReturned)
			if err != nil {
				echoed <- err
				return
			}
			if st.Match == 1 { // the end
				echoed <- nil
				return
			}
			xdp.Trace(1, xdp.TraceAnswer)
			s, err := b.Isend(a.Addr(), 2, segs, nil)
			if err != nil {
				echoed <- err
				return
			}
			b.Forget(s)
		}
	}()
	out, in := make([]byte, size), make([]byte, size)
	outSegs, inSegs := [][]byte{out}, [][]byte{in}
	for i := 0; i < n; i++ {
		// The answer's receive is posted before the clock starts, as xmx
		// pingpong does: a round trip is from the send to the answer's
		// completion, like the link floor's from Send to Recv.
		r, err := a.Irecv(2, ^uint64(0), inSegs, nil)
		if err != nil {
			tb.Fatal(err)
		}
		start := time.Now()
		xdp.Trace(0, xdp.TraceStart)
		s, err := a.Isend(b.Addr(), 0, outSegs, nil)
		if err != nil {
			tb.Fatal(err)
		}
		if _, err := a.Wait(ctx, r); err != nil {
			tb.Fatal(err)
		}
		xdp.Trace(0, xdp.TraceReturned)
		if rtts != nil {
			rtts = append(rtts, time.Since(start))
		}
		a.Forget(s)
	}
	end, _ := a.Isend(b.Addr(), 1, nil, nil)
	a.Forget(end)
	if err := <-echoed; err != nil {
		tb.Fatal(err)
	}
	return rtts
}

// measurePingPong warms a and c up, then times b.N round trips of
// 8-byte messages (allocations reported) and returns their times.
func measurePingPong(b *testing.B, a, c *msglayer.Endpoint) []time.Duration {
	pingPong(b, a, c, 8, 1000, nil)
	rtts := make([]time.Duration, 0, b.N)
	b.ReportAllocs()
	b.ResetTimer()
	rtts = pingPong(b, a, c, 8, b.N, rtts)
	b.StopTimer()
	return rtts
}

func reportRTT(b *testing.B, rtts []time.Duration, floorP50 time.Duration) time.Duration {
	slices.Sort(rtts)
	p50, p99 := rtts[len(rtts)/2], rtts[len(rtts)*99/100]
	b.ReportMetric(float64(p50)/2e3, "half-rtt-p50-µs")
	b.ReportMetric(float64(p99)/2e3, "half-rtt-p99-µs")
	if floorP50 > 0 {
		b.ReportMetric(float64(p50)/float64(floorP50), "×floor")
	}
	return p50
}

// BenchmarkPingPongMem measures the engine's own cost over the in-memory
// link (no kernel), with allocations.
func BenchmarkPingPongMem(b *testing.B) {
	for _, m := range progressModes {
		b.Run(m.name, func(b *testing.B) {
			w := memWorld(b, xdp.MemConfig{})
			a, c := w.pair(b, m.cfg, m.cfg)
			reportRTT(b, measurePingPong(b, a, c), 0)
		})
	}
}

// progressModes are the ways of waiting the ping-pong benchmarks measure:
// busy-poll; blocking, sleeping at once as the link floor's blocking
// receive does; and the default blocking mode, which polls before it
// sleeps as long as answers come within tens of microseconds (compared
// with the same floor as blocking, which it need not wake up for).
var progressModes = []struct {
	name string
	busy bool // the floor's receive spins
	cfg  msglayer.Config
}{
	{"busy", true, msglayer.Config{BusyPoll: true}},
	{"blocking", false, msglayer.Config{SpinBeforeSleep: msglayer.NoSpin}},
	{"adaptive", false, msglayer.Config{}},
}

// BenchmarkPingPongAFXDP measures 8-byte ping-pong through msglayer over
// AF_XDP next to the raw link floor (linkbench), in busy-poll and blocking
// mode (and in the default blocking mode, with its adaptive poll, next to
// the blocking floor). The two run on two fresh labs of two hosts each, in alternating
// blocks of round trips, so that both see the same spells of a noisy
// host: ns/op and allocs/op are msglayer's (the timer stops during the
// floor's blocks); floor-half-rtt-p50-µs is the floor's.
func BenchmarkPingPongAFXDP(b *testing.B) {
	floorLab := netlab.New(b, netlab.Options{Hosts: 2})
	lab := netlab.New(b, netlab.Options{Hosts: 2})
	for _, m := range progressModes {
		b.Run(m.name, func(b *testing.B) {
			la, lb := floorLinks(b, floorLab, m.busy)
			defer la.Close()
			defer lb.Close()
			w := labWorld2(b, lab)
			a, c := w.pair(b, m.cfg, m.cfg)
			floor, rtts := interleave(b, la, lb, a, c)
			slices.Sort(floor)
			floorP50 := floor[len(floor)/2]
			b.ReportMetric(float64(floorP50)/2e3, "floor-half-rtt-p50-µs")
			b.ReportMetric(float64(floor[len(floor)*99/100])/2e3, "floor-half-rtt-p99-µs")
			reportRTT(b, rtts, floorP50)
		})
	}
}

// pingPongBlocks is how many blocks BenchmarkPingPongAFXDP's round trips
// are cut into, and blockWarmup how many untimed round trips start each.
const (
	pingPongBlocks = 10
	blockWarmup    = 200
)

// interleave times b.N 8-byte round trips through msglayer (a to c) and as
// many over the raw links (la to lb), in alternating blocks, and returns
// both sets of round-trip times. The benchmark timer runs during
// msglayer's blocks only.
func interleave(b *testing.B, la, lb xdp.Link, a, c *msglayer.Endpoint) (floor, rtts []time.Duration) {
	b.StopTimer()
	linkbench.PingPong(la, lb, 64, 1000, 0)
	pingPong(b, a, c, 8, 1000, nil)
	floor, rtts = make([]time.Duration, 0, b.N), make([]time.Duration, 0, b.N)
	b.ReportAllocs()
	b.ResetTimer()
	b.StopTimer()
	for i := range pingPongBlocks {
		n := b.N/pingPongBlocks + min(1, max(0, b.N%pingPongBlocks-i))
		res, err := linkbench.PingPong(la, lb, 64, blockWarmup, n)
		if err != nil {
			b.Fatal(err)
		}
		floor = append(floor, res.RTTs...)
		pingPong(b, a, c, 8, blockWarmup, nil)
		b.StartTimer()
		rtts = pingPong(b, a, c, 8, n, rtts)
		b.StopTimer()
	}
	return floor, rtts
}

// floorLinks opens the raw AF_XDP links of a link floor on the lab's
// first two hosts (spinning in Recv if spin); the caller closes them.
func floorLinks(b *testing.B, lab *netlab.Lab, spin bool) (la, lb xdp.Link) {
	var links [2]*xdp.AFXDPLink
	for i := range links {
		h := lab.Hosts[i]
		if err := h.Do(func() (err error) {
			links[i], err = xdp.OpenAFXDP(xdp.AFXDPConfig{Interface: h.Interface, Spin: spin, RxLevel: xdp.QuietRxLevel})
			return
		}); err != nil {
			if i > 0 {
				links[0].Close()
			}
			b.Fatalf("open the floor's link on %s: %v", h.Name, err)
		}
	}
	return links[0], links[1]
}

// labWorld2 is labWorld on an existing lab, over AF_XDP.
func labWorld2(tb testing.TB, lab *netlab.Lab) world { return labWorldOf(tb, lab, "afxdp") }

// labWorldOf is labWorld on an existing lab, over links of kind.
func labWorldOf(tb testing.TB, lab *netlab.Lab, kind string) world {
	return world{
		name: kind + " lab " + lab.Name,
		open: func(t testing.TB, host int, cfg msglayer.Config) *msglayer.Endpoint {
			cfg.Interface = lab.Hosts[host].Interface
			cfg.LinkKind = kind
			var e *msglayer.Endpoint
			if err := lab.Hosts[host].Do(func() (err error) { e, err = msglayer.Open(cfg); return }); err != nil {
				skipNoMultiBuffer(t, err)
				t.Fatalf("open endpoint on %s: %v", lab.Hosts[host].Name, err)
			}
			t.Cleanup(func() { e.Close() })
			return e
		},
	}
}
