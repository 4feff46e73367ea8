package xdp

// QuietRxLevel is the AFXDPConfig.RxLevel for a protocol that recovers
// lost frames (msglayer): how many receive frames the kernel holds while
// the traffic comes in small batches. Measured on veth in copy mode
// (2026-11-28): a raw ping-pong's half round trip was about 0.4 µs
// shorter with 32, 64 or 128 receive frames in turn than with all 2048.
const QuietRxLevel = 128

// rxLevelWindow is how many descriptors a receive side consumes between
// two looks at whether its level may come down, at first (about 1.5 GB
// at MTU 1500, or four seconds of a ping-pong); each time a
// level that came down must go up again, the window grows fourfold, up to
// rxLevelMaxWindow: traffic that comes in bursts now and then (a server
// pulling from many clients) keeps every frame rather than losing the
// first frames of each burst.
const (
	rxLevelWindow    = 1 << 20
	rxLevelMaxWindow = 1 << 26
)

// rxLevel decides how many of an AF_XDP link's receive frames the kernel
// holds (on the fill ring, being filled, or on the RX ring), and keeps the
// others. Quiet traffic gets the low level, whose few frames stay in the
// caches and the TLB; a receive that finds half the level waiting (a
// burst: the level may have been too low to hold it) raises it to every
// frame at once, and a window of receives whose largest batch was at most
// an eighth of the level halves it, down to the low level (see
// rxLevelWindow). Owned by the link's receive side (rxMu).
type rxLevel struct {
	low, high uint32 // the quiet level; every receive frame
	target    uint32 // the level wanted now
	out       uint32 // frames the kernel holds
	// spare holds the receive frames the kernel does not (UMEM
	// addresses): a stack, the last given back on top.
	spare  []uint64
	seen   uint32 // descriptors consumed in this window
	peak   uint32 // the largest batch of this window
	window uint32 // the window's length (rxLevelWindow and up)
	shrunk bool   // the level came down since it last went up
}

// init sets the level up for frames receive frames of frameSize bytes,
// all spare, wanting level of them out (0 or less: all), and never fewer
// than perPacket, the most descriptors one packet takes, twice over.
func (v *rxLevel) init(level, frames int, frameSize uint64, perPacket int) {
	if level <= 0 {
		level = frames
	}
	high := uint32(frames)
	low := min(uint32(max(level, 2*perPacket, 1)), high)
	*v = rxLevel{low: low, high: high, target: low, window: rxLevelWindow, spare: make([]uint64, 0, frames)}
	for i := frames - 1; i >= 0; i-- {
		v.spare = append(v.spare, uint64(i)*frameSize)
	}
}

// take hands out up to n spare frames, the top of the stack first. The
// slice is valid until the next put.
func (v *rxLevel) take(n uint32) []uint64 {
	n = min(n, uint32(len(v.spare)))
	k := len(v.spare) - int(n)
	got := v.spare[k:]
	v.spare = v.spare[:k]
	v.out += n
	return got
}

// put takes frame a back from the kernel's share.
func (v *rxLevel) put(a uint64) {
	v.spare = append(v.spare, a)
	v.out--
}

// note records a receive that found waiting descriptors on the RX ring
// and consumed consumed of them, of which requeued had their frames queued
// for the kernel again (the others named no frame of ours: a corrupted
// ring), and moves the target.
func (v *rxLevel) note(waiting, consumed, requeued uint32) {
	v.out -= min(v.out, consumed-requeued) // a corrupted ring may name more
	if consumed == 0 {
		return
	}
	if 2*waiting >= v.target && v.target < v.high {
		v.target = v.high
		v.seen, v.peak = 0, 0
		if v.shrunk {
			v.window = min(4*v.window, rxLevelMaxWindow)
			v.shrunk = false
		}
		return
	}
	v.peak = max(v.peak, waiting)
	if v.seen += consumed; v.seen >= v.window {
		if 8*v.peak <= v.target && v.target > v.low {
			v.target = max(v.target/2, v.low)
			v.shrunk = true
		}
		v.seen, v.peak = 0, 0
	}
}
