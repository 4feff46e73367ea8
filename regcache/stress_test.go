package regcache

import (
	"errors"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Everything at once, under the race detector: Acquire/Release on shared
// and private buffers, remote Lookups and Holds of whatever region ids are
// around (some stale), Invalidate, Map/Unmap of memory in use, direct
// registrations. Invariants are checked once everything is quiet.
func TestConcurrencyStress(t *testing.T) {
	needMlock(t, 4<<20)
	ps := int(pageSize)
	g, c := newCache(t, CacheConfig{MaxRegions: 10, MaxLockedBytes: int64(24 * ps)})
	g2 := newRegistry(t)
	arena := alignedBuf(64 * ps)

	// Regions published for the "remote" side: (registry, id, key, len).
	type pub struct {
		g   *Registry
		id  uint32
		key uint64
		n   int
	}
	var pubMu sync.Mutex
	var pubs []pub
	publish := func(gg *Registry, r *Region) {
		pubMu.Lock()
		if len(pubs) < 256 {
			pubs = append(pubs, pub{gg, r.ID(), r.Key(), r.Len()})
		} else {
			pubs[rand.IntN(len(pubs))] = pub{gg, r.ID(), r.Key(), r.Len()}
		}
		pubMu.Unlock()
	}

	deadline := time.Now().Add(2 * time.Second)
	if testing.Short() {
		deadline = time.Now().Add(300 * time.Millisecond)
	}
	var wg sync.WaitGroup
	var acquired, limited, served, refused, unmaps atomic.Int64
	fail := func(format string, args ...any) {
		t.Errorf(format, args...)
	}
	// Cache users.
	for w := 0; w < 3; w++ {
		wg.Add(1)
		go func(seed uint64) {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(seed, 7))
			var held []*Region
			for time.Now().Before(deadline) {
				if len(held) < 4 && rng.IntN(3) > 0 {
					off := rng.IntN(len(arena))
					n := min(rng.IntN(3*ps)+1, len(arena)-off)
					buf := arena[off : off+n]
					r, err := c.Acquire(buf)
					if errors.Is(err, ErrLimit) {
						limited.Add(1)
						continue
					}
					if err != nil {
						fail("Acquire: %v", err)
						return
					}
					if _, ok := r.Offset(buf); !ok {
						fail("region does not cover the buffer")
					}
					acquired.Add(1)
					publish(g, r)
					held = append(held, r)
				} else if len(held) > 0 {
					i := rng.IntN(len(held))
					c.Release(held[i])
					held = append(held[:i], held[i+1:]...)
				}
			}
			for _, r := range held {
				c.Release(r)
			}
		}(uint64(w))
	}
	// Remote side.
	for w := 0; w < 2; w++ {
		wg.Add(1)
		go func(seed uint64) {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(seed, 9))
			for i := 0; time.Now().Before(deadline); i++ {
				pubMu.Lock()
				if len(pubs) == 0 {
					pubMu.Unlock()
					runtime.Gosched()
					continue
				}
				p := pubs[rng.IntN(len(pubs))]
				pubMu.Unlock()
				off := uint64(rng.IntN(p.n + 1))
				n := uint64(rng.IntN(p.n - int(off) + 1))
				key := p.key
				if rng.IntN(20) == 0 {
					key++
				}
				var err error
				if i%2 == 0 {
					var b []byte
					if b, err = p.g.Lookup(p.id, key, off, n); err == nil && uint64(len(b)) != n {
						fail("Lookup returned %d bytes, want %d", len(b), n)
					}
				} else {
					var b []byte
					var h *Region
					if b, h, err = p.g.Hold(p.id, key, off, n); err == nil {
						// Read it all: it must be mapped. (Remote
						// writers of the same bytes would race.)
						var sum byte
						for _, x := range b {
							sum += x
						}
						_ = sum
						h.Unhold()
					}
				}
				switch {
				case err == nil:
					served.Add(1)
				case err == ErrNoRegion || (err == ErrBadKey && key != p.key):
					refused.Add(1)
				default:
					fail("remote access (key ok %v): %v", key == p.key, err)
				}
			}
		}(uint64(w))
	}
	// The limits hold at every moment, reservations included.
	wg.Add(1)
	go func() {
		defer wg.Done()
		for time.Now().Before(deadline) {
			if s := c.Stats(); s.Regions > s.MaxRegions || s.LockedBytes > s.MaxLockedBytes {
				fail("limits exceeded: %+v", s)
			}
			time.Sleep(50 * time.Microsecond)
		}
	}()
	// Invalidations.
	wg.Add(1)
	go func() {
		defer wg.Done()
		rng := rand.New(rand.NewPCG(3, 3))
		for time.Now().Before(deadline) {
			c.Invalidate(ptr(arena)+uintptr(rng.IntN(len(arena))), rng.IntN(2*ps))
			time.Sleep(200 * time.Microsecond)
		}
	}()
	// Map'd memory registered directly and through the cache, then
	// unmapped while remote accesses run.
	wg.Add(1)
	go func() {
		defer wg.Done()
		for time.Now().Before(deadline) {
			m, err := Map(8 * ps)
			if err != nil {
				fail("Map: %v", err)
				return
			}
			r1, err := g2.Register(m[:3*ps])
			if err != nil {
				fail("Register: %v", err)
				return
			}
			publish(g2, r1)
			r2, err := c.Acquire(m[4*ps:])
			if err == nil {
				publish(g, r2)
			} else if !errors.Is(err, ErrLimit) {
				fail("Acquire of mapped memory: %v", err)
			}
			time.Sleep(time.Millisecond)
			if err := Unmap(m); err != nil {
				fail("Unmap: %v", err)
			}
			unmaps.Add(1)
			if r2 != nil {
				c.Release(r2)
			}
			if err := g2.Deregister(r1); err != nil {
				fail("Deregister after Unmap: %v", err)
			}
		}
	}()
	wg.Wait()
	t.Logf("%d acquired, %d refused by limits, %d remote accesses served, %d refused, %d unmaps; %+v",
		acquired.Load(), limited.Load(), served.Load(), refused.Load(), unmaps.Load(), c.Stats())
	checkCache(t, c)
	if s := c.Stats(); s.InUse != 0 || s.Zombies != 0 || s.Regions != s.Unused {
		t.Fatalf("stats after the stress %+v", s)
	}
	if gs, s := g.Stats(), c.Stats(); gs.Regions != s.Regions || gs.LockedBytes != s.LockedBytes {
		t.Fatalf("registry %+v, cache %+v", gs, s)
	}
	checkLocked(t)
	c.Close()
	g.Close()
	g2.Close()
	checkClean(t)
}
