//go:build xmxtrace && !amd64

package xdp

import "time"

var traceBase = time.Now()

func traceClock() int64 { return int64(time.Since(traceBase)) }

func traceClockCPU() (int64, int32) { return traceClock(), -1 }
