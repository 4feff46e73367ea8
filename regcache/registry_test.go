package regcache

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func TestRegisterLookup(t *testing.T) {
	needMlock(t, 64<<10)
	g := newRegistry(t)
	buf := make([]byte, 10000)
	for i := range buf {
		buf[i] = byte(i)
	}
	r, err := g.Register(buf)
	if err != nil {
		t.Fatal(err)
	}
	if r.ID() == 0 || r.Key() == 0 || r.Addr() != ptr(buf) || r.Len() != len(buf) || !r.Valid() {
		t.Fatalf("region id %#x key %#x addr %#x len %d valid %v", r.ID(), r.Key(), r.Addr(), r.Len(), r.Valid())
	}
	lo, hi := pageSpan(ptr(buf), len(buf))
	if got := pages.count(lo); got != 1 {
		t.Fatalf("first page count %d, want 1", got)
	}
	if got := pages.count(hi - pageSize); got != 1 {
		t.Fatalf("last page count %d, want 1", got)
	}
	checkLocked(t)
	if s := g.Stats(); s.Regions != 1 || s.LockedBytes != int64(hi-lo) || s.Registrations != 1 {
		t.Fatalf("stats %+v", s)
	}

	b, err := g.Lookup(r.ID(), r.Key(), 100, 50)
	if err != nil || len(b) != 50 || cap(b) != 50 || ptr(b) != ptr(buf)+100 || b[0] != 100 {
		t.Fatalf("Lookup = len %d cap %d, %v", len(b), cap(b), err)
	}
	if b, err := g.Lookup(r.ID(), r.Key(), uint64(len(buf)), 0); err != nil || len(b) != 0 {
		t.Fatalf("empty access at the end: %v", err)
	}
	if _, err := g.Lookup(r.ID(), r.Key()^1, 0, 1); err != ErrBadKey {
		t.Fatalf("wrong key: %v", err)
	}
	for _, id := range []uint32{0, r.ID() + 1, r.ID() ^ 1<<slotBits, r.ID() & (maxSlots - 1), math.MaxUint32} {
		if _, err := g.Lookup(id, r.Key(), 0, 1); err != ErrNoRegion {
			t.Fatalf("id %#x: %v", id, err)
		}
	}
	n := uint64(len(buf))
	const m = math.MaxUint64
	for _, c := range []struct{ off, length uint64 }{
		{0, n + 1}, {n, 1}, {n + 1, 0}, {1, n}, {n - 1, 2},
		{m, 1}, {m, 0}, {1, m}, {m, m}, {n, m}, {0, m}, {m - 10, 20}, {20, m - 10},
		{1 << 63, 1 << 63}, {n / 2, m - n/2 + 1}, // off+length wraps to 0 or 1
	} {
		if _, err := g.Lookup(r.ID(), r.Key(), c.off, c.length); err != ErrOutOfBounds {
			t.Fatalf("Lookup(off %d, len %d): %v, want ErrOutOfBounds", c.off, c.length, err)
		}
	}
	if b, err := g.Lookup(r.ID(), r.Key(), 0, n); err != nil || len(b) != len(buf) {
		t.Fatalf("whole region: %v", err)
	}
	if s := g.Stats(); s.RefusedBadKey != 1 || s.RefusedNoRegion != 5 || s.RefusedOutOfBounds != 15 {
		t.Fatalf("refusal counters %+v", s)
	}

	if err := g.Deregister(r); err != nil {
		t.Fatal(err)
	}
	if r.Valid() {
		t.Fatal("valid after Deregister")
	}
	if _, err := g.Lookup(r.ID(), r.Key(), 0, 1); err != ErrNoRegion {
		t.Fatalf("after Deregister: %v", err)
	}
	if err := g.Deregister(r); !errors.Is(err, ErrNoRegion) {
		t.Fatalf("second Deregister: %v", err)
	}
	if s := g.Stats(); s.Regions != 0 || s.LockedBytes != 0 || s.Deregistrations != 1 {
		t.Fatalf("stats %+v", s)
	}
	checkClean(t)
}

func TestZeroLength(t *testing.T) {
	g, c := newCache(t, CacheConfig{MaxRegions: 2})
	for _, buf := range [][]byte{nil, make([]byte, 0), make([]byte, 10)[10:]} {
		r, err := g.Register(buf)
		if err != nil {
			t.Fatal(err)
		}
		if r.Len() != 0 || r.ID() == 0 {
			t.Fatalf("len %d id %#x", r.Len(), r.ID())
		}
		if b, err := g.Lookup(r.ID(), r.Key(), 0, 0); err != nil || len(b) != 0 {
			t.Fatalf("Lookup(0, 0): %v", err)
		}
		if _, err := g.Lookup(r.ID(), r.Key(), 0, 1); err != ErrOutOfBounds {
			t.Fatalf("Lookup(0, 1): %v", err)
		}
		if _, err := g.Lookup(r.ID(), r.Key(), 1, 0); err != ErrOutOfBounds {
			t.Fatalf("Lookup(1, 0): %v", err)
		}
		if err := g.Deregister(r); err != nil {
			t.Fatal(err)
		}
	}
	checkClean(t)

	r1, err := c.Acquire(nil)
	if err != nil {
		t.Fatal(err)
	}
	r2, err := c.Acquire([]byte{})
	if err != nil {
		t.Fatal(err)
	}
	if r1 == r2 {
		t.Fatal("empty regions shared")
	}
	if _, err := c.Acquire(nil); !errors.Is(err, ErrLimit) {
		t.Fatalf("third empty region with MaxRegions 2: %v", err)
	}
	checkCache(t, c)
	c.Release(r1)
	c.Release(r2)
	if _, err := g.Lookup(r1.ID(), r1.Key(), 0, 0); err != ErrNoRegion {
		t.Fatalf("empty region after Release: %v", err)
	}
	s := c.Stats()
	if s.Regions != 0 || s.Hits != 0 || s.Misses != 3 || s.Registrations != 2 || s.Deregistrations != 2 || s.LimitRefusals != 1 {
		t.Fatalf("stats %+v", s)
	}
	checkCache(t, c)
	checkClean(t)
}

// Two regions on one page: the page stays locked until both are gone.
func TestSharedPage(t *testing.T) {
	needMlock(t, 64<<10)
	g1 := newRegistry(t)
	g2 := newRegistry(t)
	buf := alignedBuf(3 * int(pageSize))
	before := vmLck(t)
	a, err := g1.Register(buf[100:200])
	if err != nil {
		t.Fatal(err)
	}
	// b spans the first two pages.
	b, err := g2.Register(buf[300 : int(pageSize)+10])
	if err != nil {
		t.Fatal(err)
	}
	if got := vmLck(t) - before; got != 2*int64(pageSize) {
		t.Fatalf("locked %d bytes, want 2 pages", got)
	}
	if err := g1.Deregister(a); err != nil {
		t.Fatal(err)
	}
	if got := vmLck(t) - before; got != 2*int64(pageSize) {
		t.Fatalf("after first deregister: locked %d bytes, want 2 pages", got)
	}
	c, err := g1.Register(buf)
	if err != nil {
		t.Fatal(err)
	}
	if got := vmLck(t) - before; got != 3*int64(pageSize) {
		t.Fatalf("locked %d bytes, want 3 pages", got)
	}
	g2.Deregister(b)
	if got := vmLck(t) - before; got != 3*int64(pageSize) {
		t.Fatalf("locked %d bytes, want 3 pages", got)
	}
	g1.Deregister(c)
	checkClean(t)
}

// Ids are never 0 and are not reused soon.
func TestIDsNotReused(t *testing.T) {
	g := newRegistry(t)
	seen := make(map[uint32]bool)
	var keep []*Region
	for i := 0; i < 20000; i++ {
		r, err := g.Register(nil)
		if err != nil {
			t.Fatal(err)
		}
		if r.ID() == 0 || seen[r.ID()] {
			t.Fatalf("registration %d: id %#x reused", i, r.ID())
		}
		seen[r.ID()] = true
		if i%7 == 0 {
			keep = append(keep, r)
		} else if err := g.Deregister(r); err != nil {
			t.Fatal(err)
		}
	}
	for _, r := range keep {
		if _, err := g.Lookup(r.ID(), r.Key(), 0, 0); err != nil {
			t.Fatalf("kept region %#x: %v", r.ID(), err)
		}
	}
	// Slots recycled FIFO behind the quarantine: few slots in use.
	if n := len(g.gens); n > len(keep)+quarantine+1 {
		t.Fatalf("%d slots for %d live regions", n, len(keep))
	}
}

func TestRegistryClose(t *testing.T) {
	needMlock(t, 64<<10)
	g := NewRegistry()
	c, err := NewCache(g, CacheConfig{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := NewCache(g, CacheConfig{}); err == nil {
		t.Fatal("second cache on one registry")
	}
	a := make([]byte, 5000)
	ra, _ := g.Register(a)
	rb, err := c.Acquire(make([]byte, 3000))
	if err != nil {
		t.Fatal(err)
	}
	re, _ := c.Acquire(nil)
	g.Close()
	for _, r := range []*Region{ra, rb, re} {
		if _, err := g.Lookup(r.ID(), r.Key(), 0, 0); err != ErrNoRegion {
			t.Fatalf("after Close: %v", err)
		}
	}
	c.Release(rb)
	c.Release(re)
	if err := g.Deregister(ra); err != nil {
		t.Fatalf("Deregister after Close: %v", err)
	}
	if _, err := g.Register(a); !errors.Is(err, ErrClosed) {
		t.Fatalf("Register after Close: %v", err)
	}
	if _, err := c.Acquire(a); !errors.Is(err, ErrClosed) {
		t.Fatalf("Acquire after Close: %v", err)
	}
	if s := c.Stats(); s.Regions != 0 || s.LockedBytes != 0 || s.InUse != 0 || s.Zombies != 0 {
		t.Fatalf("cache stats after Close %+v", s)
	}
	checkClean(t)
}

// A failed mlock names the operation, the size, the address and the cause.
func TestRegisterErrorMessage(t *testing.T) {
	old := sysMlock
	sysMlock = func(addr, n uintptr) error { return unix.ENOMEM }
	defer func() { sysMlock = old }()
	g := newRegistry(t)
	buf := make([]byte, 4096)
	_, err := g.Register(buf)
	if !errors.Is(err, unix.ENOMEM) {
		t.Fatalf("error %v does not wrap ENOMEM", err)
	}
	want := "regcache: register 4096 bytes at 0x"
	if msg := err.Error(); !strings.HasPrefix(msg, want) || !strings.Contains(msg, ": mlock: cannot allocate memory (RLIMIT_MEMLOCK soft limit is ") {
		t.Fatalf("error %q", msg)
	}
	t.Log(err)
	if s := g.Stats(); s.Regions != 0 || s.Registrations != 0 {
		t.Fatalf("stats %+v", s)
	}
	if lockedBytes() != 0 {
		t.Fatal("counts left after a failed mlock")
	}
}

// TestUnmapWaitsForStartedTeardown: Unmap of memory whose region another
// goroutine has begun to deregister (its state left stLive, teardown not
// yet under way) waits for that teardown, and so for a Hold still on the
// region. It used to see the region neither live nor tearing, and to
// unmap the memory under the holder's copy.
func TestUnmapWaitsForStartedTeardown(t *testing.T) {
	needMlock(t, 64<<10)
	mem, err := Map(4096)
	if err != nil {
		t.Fatal(err)
	}
	g := newRegistry(t)
	r, err := g.Register(mem)
	if err != nil {
		t.Fatal(err)
	}
	_, held, err := g.Hold(r.ID(), r.Key(), 0, 16)
	if err != nil {
		t.Fatal(err)
	}
	entered, release := make(chan struct{}), make(chan struct{})
	testHookTeardown = func(*Region) { close(entered); <-release }
	defer func() { testHookTeardown = nil }()
	deregistered := make(chan error, 1)
	go func() { deregistered <- g.Deregister(r) }()
	<-entered
	testHookTeardown = nil
	unmapped := make(chan error, 1)
	go func() { unmapped <- Unmap(mem) }()
	select {
	case err := <-unmapped:
		t.Fatalf("Unmap returned (%v) while a Hold on a region in the memory was out", err)
	case <-time.After(100 * time.Millisecond):
	}
	close(release)
	select {
	case err := <-unmapped:
		t.Fatalf("Unmap returned (%v) before the Hold ended", err)
	case <-time.After(50 * time.Millisecond):
	}
	held.Unhold()
	for name, c := range map[string]chan error{"Deregister": deregistered, "Unmap": unmapped} {
		select {
		case err := <-c:
			if err != nil {
				t.Errorf("%s: %v", name, err)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("%s did not return after the Hold ended", name)
		}
	}
}
