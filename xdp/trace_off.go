//go:build !xmxtrace

package xdp

// Trace records point p for side; without the xmxtrace tag it does nothing.
func Trace(side int, p TracePoint) {}

// nextTraceSide returns the side of a newly opened link.
func nextTraceSide() int { return 0 }
