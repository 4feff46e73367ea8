//go:build xmxtrace

package xdp

func traceClock() int64
