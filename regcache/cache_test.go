package regcache

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func TestCacheHitMiss(t *testing.T) {
	needMlock(t, 1<<20)
	g, c := newCache(t, CacheConfig{})
	buf := make([]byte, 64<<10)
	r, err := c.Acquire(buf)
	if err != nil {
		t.Fatal(err)
	}
	if off, ok := r.Offset(buf); !ok || off != 0 {
		t.Fatalf("Offset = %d, %v", off, ok)
	}
	c.Release(r)
	r2, err := c.Acquire(buf)
	if err != nil || r2 != r {
		t.Fatalf("second Acquire: %v, same region %v", err, r2 == r)
	}
	// A sub-range of a cached region is a hit, even while it is in use.
	sub := buf[1000:3000]
	r3, err := c.Acquire(sub)
	if err != nil || r3 != r {
		t.Fatalf("sub-range Acquire: %v, same region %v", err, r3 == r)
	}
	if off, ok := r.Offset(sub); !ok || off != 1000 {
		t.Fatalf("Offset(sub) = %d, %v", off, ok)
	}
	if b, err := g.Lookup(r.ID(), r.Key(), 1000, 2000); err != nil || ptr(b) != ptr(sub) {
		t.Fatalf("Lookup of the sub-range: %v", err)
	}
	c.Release(r2)
	c.Release(r3)
	if s := c.Stats(); s.Hits != 2 || s.Misses != 1 || s.Registrations != 1 || s.InUse != 0 || s.Unused != 1 {
		t.Fatalf("stats %+v", s)
	}
	// The end of the region is a hit too; one byte beyond is a miss.
	if r4, err := c.Acquire(buf[len(buf)-1:]); err != nil || r4 != r {
		t.Fatalf("last byte: %v", err)
	} else {
		c.Release(r4)
	}
	big := make([]byte, 128<<10)
	copyInto := big[:64<<10]
	r5, err := c.Acquire(copyInto)
	if err != nil || r5 == r {
		t.Fatalf("other buffer: %v", err)
	}
	r6, err := c.Acquire(big[1:]) // overlaps r5 but goes beyond it
	if err != nil || r6 == r5 {
		t.Fatalf("overlapping larger buffer: %v, same %v", err, r6 == r5)
	}
	r7, err := c.Acquire(big[100:200]) // covered by both r5 and r6
	if err != nil || (r7 != r5 && r7 != r6) {
		t.Fatalf("buffer covered twice: %v", err)
	}
	for _, x := range []*Region{r5, r6, r7} {
		c.Release(x)
	}
	if s := c.Stats(); s.Hits != 4 || s.Misses != 3 || s.Regions != 3 {
		t.Fatalf("stats %+v", s)
	}
	if _, ok := r.Offset(big); ok {
		t.Fatal("Offset of a foreign buffer")
	}
	checkCache(t, c)
	checkLocked(t)
}

func TestCacheLRU(t *testing.T) {
	needMlock(t, 1<<20)
	g, c := newCache(t, CacheConfig{MaxRegions: 3})
	bufs := make([][]byte, 6)
	regs := make([]*Region, 6)
	for i := range bufs {
		bufs[i] = alignedBuf(int(pageSize))
	}
	use := func(i int) *Region {
		t.Helper()
		r, err := c.Acquire(bufs[i])
		if err != nil {
			t.Fatal(err)
		}
		c.Release(r)
		regs[i] = r
		checkCache(t, c)
		return r
	}
	valid := func(want ...int) {
		t.Helper()
		for i, r := range regs {
			if r == nil {
				continue
			}
			_, err := g.Lookup(r.ID(), r.Key(), 0, 1)
			isWanted := false
			for _, w := range want {
				isWanted = isWanted || w == i
			}
			if isWanted != (err == nil) {
				t.Fatalf("region %d: Lookup %v, want valid %v", i, err, isWanted)
			}
		}
	}
	use(0)
	use(1)
	use(2)
	use(0) // hit: 0 becomes the most recently used; 1 is the oldest
	valid(0, 1, 2)
	use(3)
	valid(0, 2, 3)
	use(4)
	valid(0, 3, 4)
	use(3) // hit
	use(5) // evicts 0
	valid(3, 4, 5)
	s := c.Stats()
	if s.Evictions != 3 || s.Hits != 2 || s.Misses != 6 || s.Regions != 3 || s.Deregistrations != 3 {
		t.Fatalf("stats %+v", s)
	}
	checkLocked(t)
}

func TestCacheInUseNeverEvicted(t *testing.T) {
	needMlock(t, 1<<20)
	g, c := newCache(t, CacheConfig{MaxRegions: 2})
	a, b, d := alignedBuf(100), alignedBuf(100), alignedBuf(100)
	ra, _ := c.Acquire(a)
	rb, err := c.Acquire(b)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Acquire(d); !errors.Is(err, ErrLimit) {
		t.Fatalf("Acquire with everything in use: %v", err)
	} else {
		t.Log(err)
	}
	for _, r := range []*Region{ra, rb} {
		if _, err := g.Lookup(r.ID(), r.Key(), 0, 100); err != nil {
			t.Fatal(err)
		}
	}
	c.Release(rb)
	rd, err := c.Acquire(d)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := g.Lookup(rb.ID(), rb.Key(), 0, 1); err != ErrNoRegion {
		t.Fatalf("released region not evicted: %v", err)
	}
	if _, err := g.Lookup(ra.ID(), ra.Key(), 0, 1); err != nil {
		t.Fatalf("region in use evicted: %v", err)
	}
	c.Release(ra)
	c.Release(rd)
	if s := c.Stats(); s.LimitRefusals != 1 || s.Evictions != 1 || s.Regions != 2 {
		t.Fatalf("stats %+v", s)
	}
	checkCache(t, c)
}

func TestCacheBytesLimit(t *testing.T) {
	needMlock(t, 1<<20)
	ps := int(pageSize)
	_, c := newCache(t, CacheConfig{MaxLockedBytes: int64(3 * ps)})
	arena := alignedBuf(16 * ps)
	// Two pages each (an unaligned 100-byte buffer across a boundary).
	x := arena[ps-50 : ps+50]
	rx, err := c.Acquire(x)
	if err != nil {
		t.Fatal(err)
	}
	if s := c.Stats(); s.LockedBytes != int64(2*ps) {
		t.Fatalf("locked %d, want 2 pages", s.LockedBytes)
	}
	// Two more pages do not fit while x is in use.
	y := arena[5*ps-50 : 5*ps+50]
	if _, err := c.Acquire(y); !errors.Is(err, ErrLimit) {
		t.Fatalf("Acquire beyond the byte limit: %v", err)
	}
	z := arena[8*ps : 9*ps]
	rz, err := c.Acquire(z)
	if err != nil {
		t.Fatal(err)
	}
	c.Release(rz)
	c.Release(rx)
	// Larger than the limit: refused without evicting anything.
	if _, err := c.Acquire(arena[10*ps : 14*ps]); !errors.Is(err, ErrLimit) {
		t.Fatalf("Acquire larger than the limit: %v", err)
	}
	if s := c.Stats(); s.Regions != 2 || s.Evictions != 0 || s.LimitRefusals != 2 {
		t.Fatalf("stats %+v", s)
	}
	// y fits after evicting the least recently released (z).
	ry, err := c.Acquire(y)
	if err != nil {
		t.Fatal(err)
	}
	if s := c.Stats(); s.Evictions != 2 || s.Regions != 1 || s.LockedBytes != int64(2*ps) {
		// x (2 pages) and z (1 page) both go: z first, then x, since
		// x + y would be 4 pages.
		t.Fatalf("stats %+v", s)
	}
	c.Release(ry)
	checkCache(t, c)
	checkLocked(t)
}

func TestCacheInvalidate(t *testing.T) {
	needMlock(t, 1<<20)
	ps := int(pageSize)
	g, c := newCache(t, CacheConfig{})
	arena := alignedBuf(10 * ps)
	a := arena[0:ps]            // unused when invalidated
	b := arena[2*ps : 3*ps+100] // in use
	d := arena[6*ps : 7*ps]     // outside the range
	ra, _ := c.Acquire(a)
	c.Release(ra)
	rb, err := c.Acquire(b)
	if err != nil {
		t.Fatal(err)
	}
	rd, _ := c.Acquire(d)
	c.Release(rd)
	if n := c.Invalidate(ptr(arena)+100, 3*ps); n != 2 {
		t.Fatalf("Invalidate tore down %d regions, want 2", n)
	}
	for _, r := range []*Region{ra, rb} {
		if r.Valid() {
			t.Fatal("invalidated region still valid")
		}
		if _, err := g.Lookup(r.ID(), r.Key(), 0, 1); err != ErrNoRegion {
			t.Fatalf("Lookup after Invalidate: %v", err)
		}
	}
	if _, err := g.Lookup(rd.ID(), rd.Key(), 0, 1); err != nil {
		t.Fatalf("region outside the range: %v", err)
	}
	s := c.Stats()
	if s.Invalidations != 2 || s.Zombies != 1 || s.InUse != 1 || s.Regions != 1 || s.LockedBytes != int64(ps) {
		t.Fatalf("stats %+v", s)
	}
	checkLocked(t)
	// The next Acquire of b registers it again.
	rb2, err := c.Acquire(b)
	if err != nil || rb2 == rb {
		t.Fatalf("re-Acquire: %v", err)
	}
	c.Release(rb)
	c.Release(rb2)
	if s := c.Stats(); s.Zombies != 0 || s.InUse != 0 || s.Regions != 2 {
		t.Fatalf("stats %+v", s)
	}
	if n := c.Invalidate(0, -1); n != 0 {
		t.Fatal("negative length invalidated something")
	}
	if n := c.Invalidate(^uintptr(0)-10, 1<<30); n != 0 { // wraps: clamped
		t.Fatal("invalidated something at the top of the address space")
	}
	if n := g.Invalidate(0, int(^uint(0)>>1)); n != 2 {
		t.Fatalf("invalidate everything through the registry: %d", n)
	}
	checkCache(t, c)
	checkClean(t)
}

// Randomized: limits are never exceeded, the accounting matches the
// kernel's, regions in use stay valid unless invalidated.
func TestCacheRandomized(t *testing.T) {
	needMlock(t, 1<<20)
	ps := int(pageSize)
	for _, cfg := range []CacheConfig{
		{MaxRegions: 8, MaxLockedBytes: int64(24 * ps)},
		{MaxRegions: 3, MaxLockedBytes: -1},
		{MaxRegions: 64, MaxLockedBytes: int64(6 * ps)},
	} {
		g, c := newCache(t, cfg)
		rng := rand.New(rand.NewPCG(1, uint64(cfg.MaxRegions)))
		arena := alignedBuf(64 * ps)
		type held struct {
			r   *Region
			buf []byte
		}
		var hs []held
		invalidated := make(map[*Region]bool)
		var ok, refused int
		for op := 0; op < 4000; op++ {
			switch k := rng.IntN(10); {
			case k < 5:
				off := rng.IntN(len(arena))
				n := rng.IntN(min(len(arena)-off, 8*ps) + 1)
				if rng.IntN(4) == 0 {
					n = rng.IntN(300)
					n = min(n, len(arena)-off)
				}
				buf := arena[off : off+n]
				r, err := c.Acquire(buf)
				if errors.Is(err, ErrLimit) {
					refused++
					break
				}
				if err != nil {
					t.Fatal(err)
				}
				ok++
				if o, in := r.Offset(buf); !in || !r.Valid() {
					t.Fatalf("Acquire returned a region not covering the buffer (%d, %v) or invalid", o, in)
				}
				hs = append(hs, held{r, buf})
			case k < 9:
				if len(hs) > 0 {
					i := rng.IntN(len(hs))
					c.Release(hs[i].r)
					hs[i] = hs[len(hs)-1]
					hs = hs[:len(hs)-1]
				}
			default:
				lo := rng.IntN(len(arena))
				n := rng.IntN(4 * ps)
				c.Invalidate(ptr(arena)+uintptr(lo), n)
				for _, h := range hs {
					if h.r.end > ptr(arena)+uintptr(lo) && h.r.base < ptr(arena)+uintptr(lo+n) {
						invalidated[h.r] = true
					}
				}
			}
			checkCache(t, c)
			checkLocked(t)
			s := c.Stats()
			if s.Regions > cfg.MaxRegions || (cfg.MaxLockedBytes >= 0 && s.LockedBytes > cfg.MaxLockedBytes) {
				t.Fatalf("op %d: limits exceeded: %+v", op, s)
			}
			if gs := g.Stats(); gs.Regions != s.Regions || gs.LockedBytes != s.LockedBytes {
				t.Fatalf("op %d: registry %d regions %d bytes, cache %d, %d", op, gs.Regions, gs.LockedBytes, s.Regions, s.LockedBytes)
			}
			for _, h := range hs {
				off, _ := h.r.Offset(h.buf)
				_, err := g.Lookup(h.r.ID(), h.r.Key(), off, uint64(len(h.buf)))
				if invalidated[h.r] != (err != nil) {
					t.Fatalf("op %d: held region (invalidated %v): Lookup %v", op, invalidated[h.r], err)
				}
			}
		}
		for _, h := range hs {
			c.Release(h.r)
		}
		s := c.Stats()
		t.Logf("%+v: %d acquired, %d refused; %+v", cfg, ok, refused, s)
		if s.Hits == 0 || s.Evictions == 0 || s.Invalidations == 0 {
			t.Fatalf("randomized test did not exercise hits, evictions and invalidations: %+v", s)
		}
		c.Close()
		checkCache(t, c)
		g.Close()
		checkClean(t)
	}
}

func TestDefaultCacheConfig(t *testing.T) {
	cfg := DefaultCacheConfig()
	var lim unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_MEMLOCK, &lim); err != nil {
		t.Fatal(err)
	}
	want := int64(64 << 20)
	if lim.Cur != unix.RLIM_INFINITY {
		want = int64(lim.Cur / 2)
	}
	if cfg.MaxRegions != 1024 || cfg.MaxLockedBytes != want {
		t.Fatalf("%+v, want MaxLockedBytes %d", cfg, want)
	}
	_, c := newCache(t, CacheConfig{})
	if s := c.Stats(); s.MaxRegions != cfg.MaxRegions || s.MaxLockedBytes != cfg.MaxLockedBytes {
		t.Fatalf("stats %+v, defaults %+v", s, cfg)
	}
	t.Logf("defaults %+v", cfg)
}

func TestReleaseMisuse(t *testing.T) {
	g, c := newCache(t, CacheConfig{})
	r, _ := g.Register(nil)
	defer func() {
		if recover() == nil {
			t.Fatal("Release of a foreign region did not panic")
		}
	}()
	c.Release(r)
}

// Invalidate or Close between a cache registration and its insertion in
// the index: nothing leaks; after Close, Acquire fails with ErrClosed;
// after a registry's Invalidate, which may come before the Acquire as
// well as after, Acquire registers the memory afresh (it used to fail
// with ErrUnmapped, "being unmapped", of ordinary memory).
func TestCacheRegistrationRaces(t *testing.T) {
	needMlock(t, 1<<20)
	defer func() { testHookPublished = nil }()
	for _, what := range []string{"registry-invalidate", "cache-close"} {
		t.Run(what, func(t *testing.T) {
			g, c := newCache(t, CacheConfig{})
			buf := alignedBuf(3 * int(pageSize))
			var first *Region
			testHookPublished = func(r *Region) {
				testHookPublished = nil
				first = r
				switch what {
				case "registry-invalidate":
					if n := g.Invalidate(r.base, r.Len()); n != 1 {
						t.Errorf("invalidated %d regions", n)
					}
				case "cache-close":
					c.Close()
				}
			}
			r, err := c.Acquire(buf)
			if what == "cache-close" {
				if !errors.Is(err, ErrClosed) {
					t.Fatalf("Acquire: %v, want ErrClosed", err)
				}
			} else {
				if err != nil {
					t.Fatalf("Acquire: %v, want a fresh registration", err)
				}
				if r == first || !r.Valid() || first.Valid() {
					t.Fatalf("Acquire returned region %p (valid %v), the invalidated one %p (valid %v)", r, r.Valid(), first, first.Valid())
				}
				if s := c.Stats(); s.Regions != 1 || s.InUse != 1 || s.Registrations != 2 || s.Invalidations != 1 {
					t.Fatalf("stats %+v", s)
				}
				c.Release(r)
			}
			checkCache(t, c)
			if what == "cache-close" {
				if s := c.Stats(); s.Regions != 0 || s.LockedBytes != 0 || s.InUse != 0 || s.Zombies != 0 {
					t.Fatalf("stats %+v", s)
				}
				if s := g.Stats(); s.Regions != 0 {
					t.Fatalf("registry stats %+v", s)
				}
			}
			c.Close()
			checkClean(t)
		})
	}
}

// TestConcurrentAcquireOfSameMemory: an Acquire of memory that another
// Acquire is registering (reserved, not yet in the index) waits for that
// registration and takes it, as it would one after the other. At the
// region limit it was refused with ErrLimit; with room it locked the
// pages a second time.
func TestConcurrentAcquireOfSameMemory(t *testing.T) {
	needMlock(t, 1<<20)
	defer func() { testHookPublished = nil }()
	for _, max := range []int{1, 8} {
		t.Run(fmt.Sprintf("MaxRegions=%d", max), func(t *testing.T) {
			_, c := newCache(t, CacheConfig{MaxRegions: max})
			buf := alignedBuf(2 * int(pageSize))
			type result struct {
				r   *Region
				err error
			}
			second := make(chan result, 1)
			testHookPublished = func(*Region) {
				testHookPublished = nil
				// The first is published, not yet indexed: the second
				// Acquire (of part of the same memory) comes now, and
				// must wait for the first to finish.
				go func() {
					r, err := c.Acquire(buf[100:200])
					second <- result{r, err}
				}()
				select {
				case res := <-second:
					second <- res // finished without waiting: checked below
				case <-time.After(50 * time.Millisecond):
				}
			}
			r1, err := c.Acquire(buf)
			if err != nil {
				t.Fatal(err)
			}
			res := <-second
			if res.err != nil {
				t.Fatalf("Acquire of the same memory during its registration: %v", res.err)
			}
			if res.r != r1 {
				t.Errorf("Acquire during the registration got another region: %d registrations", c.Stats().Registrations)
			}
			if s := c.Stats(); s.Registrations != 1 || s.Hits != 1 {
				t.Errorf("stats %+v, want 1 registration and 1 hit", s)
			}
			c.Release(res.r)
			c.Release(r1)
			checkCache(t, c)
			c.Close()
			checkClean(t)
		})
	}
}
