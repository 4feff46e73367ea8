//go:build race

package xdp_test

// The race detector allocates on its own, so allocation counts are only
// checked without it.
const raceEnabled = true
