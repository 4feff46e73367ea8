//go:build xmxtrace

package xdp

func traceClock() int64

func traceClockCPU() (int64, int32)
