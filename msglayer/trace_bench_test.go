//go:build xmxtrace

package msglayer_test

import (
	"fmt"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/xmx-stack/xmx/internal/linkbench"
	"github.com/xmx-stack/xmx/internal/netlab"
	"github.com/xmx-stack/xmx/msglayer"
	"github.com/xmx-stack/xmx/xdp"
)

// BenchmarkTraceAFXDP is BenchmarkPingPongAFXDP's ping-pong (the raw
// link floor, then msglayer; busy-poll, then blocking), traced: it
// prints, for each subbenchmark, the median time from the start of a
// round trip to the first time each point is passed in each half of it,
// and the step from the point before. With XMX_TRACE_DUMP set it also
// prints ten whole round trips, point by point, with the CPU of each
// (medians of first passes hide the order of events in blocking mode,
// where a side may sleep or not, and where the kernel often runs both
// sides on one CPU, the woken side preempting the other in its sendto).
// Run it with the tag that turns the points on:
//
//	go test -tags xmxtrace -run XXX -bench TraceAFXDP -benchtime 100000x ./msglayer
//
// Side a sends the ping and receives the answer; side b answers.
func BenchmarkTraceAFXDP(b *testing.B) {
	lab := netlab.New(b, netlab.Options{Hosts: 2})
	for _, busy := range []bool{true, false} {
		traceModes(b, lab, busy)
	}
}

// traceModes runs BenchmarkTraceAFXDP's two subbenchmarks in busy-poll
// or blocking mode.
func traceModes(b *testing.B, lab *netlab.Lab, busy bool) {
	mode := map[bool]string{true: "busy", false: "blocking"}[busy]
	b.Run("link-floor-"+mode, func(b *testing.B) {
		xdp.ResetTraceSides()
		la, lb := floorLinks(b, lab, busy)
		defer la.Close()
		defer lb.Close()
		linkbench.PingPong(la, lb, 64, 1000, 1000)
		xdp.StartTrace()
		res, err := linkbench.PingPong(la, lb, 64, 0, b.N)
		events, tick := xdp.StopTrace()
		if err != nil {
			b.Fatal(err)
		}
		reportRTT(b, res.RTTs, 0)
		printTrace(b, events, tick)
	})
	b.Run("msglayer-"+mode, func(b *testing.B) {
		xdp.ResetTraceSides()
		w := labWorld2(b, lab)
		cfg := msglayer.Config{BusyPoll: busy, SpinBeforeSleep: msglayer.NoSpin}
		a, c := w.pair(b, cfg, cfg)
		tracePingPong(b, a, c)
	})
}

// tracePingPong warms a and c up, then traces b.N round trips between
// them and prints the breakdown.
func tracePingPong(b *testing.B, a, c *msglayer.Endpoint) {
	pingPong(b, a, c, 8, 1000, nil)
	xdp.StartTrace()
	rtts := pingPong(b, a, c, 8, b.N, make([]time.Duration, 0, b.N))
	events, tick := xdp.StopTrace()
	reportRTT(b, rtts, 0)
	printTrace(b, events, tick)
}

// printTrace splits the merged events at side a's start points and prints
// the median offset of each (half, point, side) seen in most round trips.
func printTrace(b *testing.B, events []xdp.TraceEvent, nsPerTick float64) {
	if b.N < 1000 {
		return // the calibration run
	}
	slices.SortStableFunc(events, func(x, y xdp.TraceEvent) int { return int(x.TSC - y.TSC) })
	type key struct {
		half  int // 0: the ping, 1: the answer (from side b's answer point on)
		point xdp.TracePoint
		side  int32
	}
	offsets := map[key][]int64{}
	var perRound []map[key]int64 // each round trip's offsets, for the steps
	rounds, oneCPU := 0, 0
	isStart := func(e xdp.TraceEvent) bool { return e.Point == xdp.TraceStart && e.Side == 0 }
	for i := 0; i < len(events); {
		if !isStart(events[i]) {
			i++
			continue
		}
		j := i + 1
		for j < len(events) && !isStart(events[j]) {
			j++
		}
		round, seen, half := events[i:j], map[key]int64{}, 0
		i = j
		rounds++
		if rounds > b.N/2 && rounds <= b.N/2+10 && os.Getenv("XMX_TRACE_DUMP") != "" {
			for _, e := range round {
				fmt.Printf("    %c %-11s %7.0f cpu %d\n", "ab"[e.Side], e.Point, float64(e.TSC-round[0].TSC)*nsPerTick, e.CPU)
			}
			fmt.Println()
		}
		same := true
		for _, e := range round {
			same = same && e.CPU == round[0].CPU
		}
		if same {
			oneCPU++
		}
		for _, e := range round {
			if e.Point == xdp.TraceAnswer && e.Side == 1 {
				half = 1
			}
			k := key{half, e.Point, e.Side}
			if _, ok := seen[k]; !ok {
				seen[k] = e.TSC - round[0].TSC
				offsets[k] = append(offsets[k], e.TSC-round[0].TSC)
			}
		}
		perRound = append(perRound, seen)
	}
	type row struct {
		k      key
		median float64
	}
	var rows []row
	for k, d := range offsets {
		if len(d) < rounds/2 {
			continue // a point of some round trips only (a retransmission, an ack)
		}
		slices.Sort(d)
		rows = append(rows, row{k, float64(d[len(d)/2]) * nsPerTick})
	}
	slices.SortFunc(rows, func(x, y row) int { return int(x.median - y.median) })
	fmt.Printf("%s: %d round trips, %.0f %% of them with both sides on one CPU; median ns from the start to each point, and of each round trip's step from the point before\n",
		b.Name(), rounds, 100*float64(oneCPU)/float64(max(rounds, 1)))
	var steps []int64
	for i, r := range rows {
		step := r.median
		if i > 0 {
			steps = steps[:0]
			for _, m := range perRound {
				t, ok := m[r.k]
				t0, ok0 := m[rows[i-1].k]
				if ok && ok0 {
					steps = append(steps, t-t0)
				}
			}
			slices.Sort(steps)
			step = float64(steps[len(steps)/2]) * nsPerTick
		}
		fmt.Printf("  %s %-11s side %c %7.0f   step %6.0f\n", [2]string{"ping  ", "answer"}[r.k.half], r.k.point, "ab"[r.k.side], r.median, step)
	}
}

// BenchmarkTraceLean is BenchmarkTraceAFXDP's msglayer ping-pong in
// busy-poll mode over lean links (BenchmarkPingPongLean): the engine's
// own steps, without the kernel's noise between them; warm, then over
// links that make a system call per frame (newKickingPair), where the
// steps after each call show what it left cold.
func BenchmarkTraceLean(b *testing.B) {
	for _, v := range leanPairs {
		b.Run(v.name, func(b *testing.B) {
			xdp.ResetTraceSides()
			a, c := leanWorldOn(v.pair()).pair(b, msglayer.Config{BusyPoll: true}, msglayer.Config{BusyPoll: true})
			tracePingPong(b, a, c)
		})
	}
}
