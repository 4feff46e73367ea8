//go:build !race

package linktest

const raceEnabled = false
