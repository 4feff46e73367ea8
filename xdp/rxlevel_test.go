package xdp

import "testing"

func TestRxLevel(t *testing.T) {
	var v rxLevel
	v.init(QuietRxLevel, 2048, 4096, 1)
	if v.target != QuietRxLevel || v.out != 0 || len(v.spare) != 2048 {
		t.Fatalf("after init: target %d out %d spare %d", v.target, v.out, len(v.spare))
	}
	got := v.take(v.target)
	if len(got) != QuietRxLevel || v.out != QuietRxLevel || got[len(got)-1] != 0 {
		t.Fatalf("take: %d frames (last %#x), out %d", len(got), got[len(got)-1], v.out)
	}
	// Small batches keep the low level, for ever.
	for range 4 * rxLevelWindow {
		v.note(1, 1, 1)
	}
	if v.target != QuietRxLevel {
		t.Fatalf("after small batches: target %d", v.target)
	}
	// A batch of half the level raises it to every frame.
	v.note(QuietRxLevel/2, QuietRxLevel/2, QuietRxLevel/2)
	if v.target != 2048 {
		t.Fatalf("after a burst: target %d", v.target)
	}
	// Batches of an eighth of the level or less halve it once a window,
	// down to the low level; larger ones keep it.
	for range rxLevelWindow / 256 {
		v.note(256, 256, 256)
	}
	if v.target != 1024 {
		t.Fatalf("after a window of batches of 256: target %d", v.target)
	}
	for range rxLevelWindow / 200 * 2 {
		v.note(200, 200, 200)
	}
	if v.target != 1024 {
		t.Fatalf("after two windows of batches of 200: target %d", v.target)
	}
	for range 10 * rxLevelWindow {
		v.note(1, 1, 1)
	}
	if v.target != QuietRxLevel {
		t.Fatalf("after quiet windows: target %d", v.target)
	}
	// A level that came down and must go up again waits four times as
	// long before it comes down next.
	v.note(QuietRxLevel/2, QuietRxLevel/2, QuietRxLevel/2)
	if v.target != 2048 || v.window != 4*rxLevelWindow {
		t.Fatalf("after a burst at a lowered level: target %d, window %d", v.target, v.window)
	}
	for range 4*rxLevelWindow - 1 {
		v.note(1, 1, 1)
	}
	if v.target != 2048 {
		t.Fatalf("came down before its longer window: target %d", v.target)
	}
	v.note(1, 1, 1)
	if v.target != 1024 {
		t.Fatalf("after the longer window: target %d", v.target)
	}
	for range 20 {
		v.note(2048, 2048, 2048)
		for v.target == 2048 { // until it comes down, a window later
			v.note(1, 1, 1)
		}
	}
	if v.window != rxLevelMaxWindow {
		t.Fatalf("window %d after many bursts, want %d", v.window, rxLevelMaxWindow)
	}
	// Frames of a corrupted ring are lost to the kernel's share.
	v.note(3, 3, 1)
	if v.out != QuietRxLevel-2 {
		t.Fatalf("after 2 bad descriptors: out %d", v.out)
	}
	v.put(got[0])
	if v.out != QuietRxLevel-3 || v.spare[len(v.spare)-1] != got[0] {
		t.Fatalf("put: out %d, top %#x", v.out, v.spare[len(v.spare)-1])
	}
}

func TestRxLevelBounds(t *testing.T) {
	for _, c := range []struct{ level, frames, perPacket, want int }{
		{0, 2048, 1, 2048},
		{-1, 2048, 1, 2048},
		{QuietRxLevel, 2048, 1, QuietRxLevel},
		{4096, 2048, 1, 2048},
		{16, 2048, 17, 34}, // two packets of 17 descriptors (MTU 65535)
		{QuietRxLevel, 64, 1, 64},
		{1, 8, 1, 2},
	} {
		var v rxLevel
		v.init(c.level, c.frames, 4096, c.perPacket)
		if int(v.target) != c.want || int(v.low) != c.want {
			t.Errorf("init(%d, %d, perPacket %d): level %d, want %d", c.level, c.frames, c.perPacket, v.target, c.want)
		}
	}
}
