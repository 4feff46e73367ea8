//go:build race

package linktest

// The race detector allocates on its own, so allocation counts are only
// checked without it.
const raceEnabled = true
