//go:build !race

package regcache

const raceEnabled = false
