//go:build xmxtrace

package xdp

import (
	"sync/atomic"
	"time"
)

const traceCap = 1 << 22 // events per side

// traceOn gates recording; traceLogs[s][:traceN[s].n] is side s's log,
// written only by the goroutine driving side s. The logs (64 MiB each)
// are made by the first StartTrace, not by every xmxtrace binary. Each
// side's count has a cache line of its own: the two sides write theirs at
// every point, from two CPUs.
var (
	traceOn    atomic.Bool
	traceLogs  [2][]TraceEvent
	traceN     [2]traceCount
	traceSides atomic.Int32
)

type traceCount struct {
	_ [64]byte
	n int
	_ [56]byte
}

// nextTraceSide returns the side of a newly opened link: links opened one
// after the other alternate between 0 and 1.
func nextTraceSide() int { return int(traceSides.Add(1)-1) & 1 }

// Trace records point p for side (0 or 1) while tracing is started.
func Trace(side int, p TracePoint) {
	if !traceOn.Load() {
		return
	}
	t, cpu := traceClockCPU()
	if n := traceN[side].n; n < traceCap {
		traceLogs[side][n] = TraceEvent{Point: p, Side: int32(side), TSC: t, CPU: cpu}
		traceN[side].n = n + 1
	}
}

// StartTrace empties the logs and starts recording.
func StartTrace() {
	for s := range traceLogs {
		if traceLogs[s] == nil {
			traceLogs[s] = make([]TraceEvent, traceCap)
		}
	}
	traceN = [2]traceCount{}
	traceOn.Store(true)
}

// StopTrace stops recording and returns both sides' events, unsorted,
// with the length of a clock tick in nanoseconds.
func StopTrace() (events []TraceEvent, nsPerTick float64) {
	traceOn.Store(false)
	for s := range traceLogs {
		events = append(events, traceLogs[s][:traceN[s].n]...)
	}
	t0, w0 := traceClock(), time.Now()
	time.Sleep(20 * time.Millisecond)
	t1, w1 := traceClock(), time.Now()
	return events, float64(w1.Sub(w0).Nanoseconds()) / float64(t1-t0)
}

// ResetTraceSides makes the next link opened side 0.
func ResetTraceSides() { traceSides.Store(0) }
