//go:build !race

package xdp_test

const raceEnabled = false
