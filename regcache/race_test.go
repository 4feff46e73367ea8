//go:build race

package regcache

// The race detector allocates on its own, so allocation counts are only
// checked without it.
const raceEnabled = true
