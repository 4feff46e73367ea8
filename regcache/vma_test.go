package regcache

import (
	"errors"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func TestMapUnmapInvalidates(t *testing.T) {
	needMlock(t, 1<<20)
	ps := int(pageSize)
	g1 := newRegistry(t)
	g2, c := newCache(t, CacheConfig{})
	g3 := newRegistry(t) // registers nothing in the mapping
	m, err := Map(16*ps - 100)
	if err != nil {
		t.Fatal(err)
	}
	if len(m) != 16*ps-100 || ptr(m)%pageSize != 0 {
		t.Fatalf("Map: len %d at %#x", len(m), ptr(m))
	}
	for i := range m {
		m[i] = 0xAB
	}
	heap := make([]byte, 1000)
	rh, err := g3.Register(heap)
	if err != nil {
		t.Fatal(err)
	}
	direct, err := g1.Register(m[:ps])
	if err != nil {
		t.Fatal(err)
	}
	unused, err := c.Acquire(m[2*ps : 4*ps])
	if err != nil {
		t.Fatal(err)
	}
	c.Release(unused)
	inUse, err := c.Acquire(m[8*ps:])
	if err != nil {
		t.Fatal(err)
	}
	checkLocked(t)
	if err := Unmap(m); err != nil {
		t.Fatal(err)
	}
	for _, x := range []struct {
		g *Registry
		r *Region
	}{{g1, direct}, {g2, unused}, {g2, inUse}} {
		if _, err := x.g.Lookup(x.r.ID(), x.r.Key(), 0, 1); err != ErrNoRegion {
			t.Fatalf("Lookup after Unmap: %v", err)
		}
		if x.r.Valid() {
			t.Fatal("region valid after Unmap")
		}
	}
	if _, err := g3.Lookup(rh.ID(), rh.Key(), 0, 1000); err != nil {
		t.Fatalf("heap region of another registry: %v", err)
	}
	if s := c.Stats(); s.Invalidations != 2 || s.Zombies != 1 || s.Regions != 0 || s.LockedBytes != 0 {
		t.Fatalf("cache stats %+v", s)
	}
	if s := g1.Stats(); s.Invalidations != 1 || s.Regions != 0 {
		t.Fatalf("registry stats %+v", s)
	}
	c.Release(inUse)
	if err := g1.Deregister(direct); err != nil {
		t.Fatalf("Deregister of a region invalidated by Unmap: %v", err)
	}
	g3.Deregister(rh)
	checkClean(t)

	if err := Unmap(m); !errors.Is(err, ErrNotMapped) {
		t.Fatalf("second Unmap: %v", err)
	}
	if err := Unmap(heap); !errors.Is(err, ErrNotMapped) {
		t.Fatalf("Unmap of heap memory: %v", err)
	}
	if _, err := Map(0); err == nil {
		t.Fatal("Map(0) succeeded")
	}
	// Memory mapped again (possibly at the same address) registers anew.
	m2, err := Map(4 * ps)
	if err != nil {
		t.Fatal(err)
	}
	r, err := c.Acquire(m2)
	if err != nil {
		t.Fatal(err)
	}
	checkLocked(t)
	c.Release(r)
	if err := Unmap(m2); err != nil {
		t.Fatal(err)
	}
	checkClean(t)
}

// Remote accesses race with Unmap: every access either completes on
// mapped memory or is refused; nothing crashes.
func TestUnmapRacesHolds(t *testing.T) {
	needMlock(t, 1<<20)
	ps := int(pageSize)
	g, c := newCache(t, CacheConfig{})
	for round := 0; round < 200; round++ {
		m, err := Map(8 * ps)
		if err != nil {
			t.Fatal(err)
		}
		r, err := c.Acquire(m[ps:])
		if err != nil {
			t.Fatal(err)
		}
		c.Release(r)
		id, key := r.ID(), r.Key()
		var wg sync.WaitGroup
		var served, refused atomic.Int64
		stop := make(chan struct{})
		for w := 0; w < 2; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					b, h, err := g.Hold(id, key, uint64(w*ps), uint64(ps))
					if err != nil {
						if err != ErrNoRegion {
							t.Errorf("Hold: %v", err)
						}
						refused.Add(1)
						select {
						case <-stop:
							return
						default:
						}
						runtime.Gosched()
						continue
					}
					b[0]++ // write and read the memory: must be mapped
					_ = b[len(b)-1]
					h.Unhold()
					if served.Add(1)%64 == 0 {
						runtime.Gosched() // let Unmap run
					}
				}
			}()
		}
		for served.Load() < 10 {
			runtime.Gosched()
		}
		if err := Unmap(m); err != nil {
			t.Fatal(err)
		}
		close(stop)
		wg.Wait()
		if _, _, err := g.Hold(id, key, 0, 1); err != ErrNoRegion {
			t.Fatalf("Hold after Unmap: %v", err)
		}
	}
	checkCache(t, c)
	checkClean(t)
}

// Registrations race with Unmap: each either fails or is invalidated, and
// nothing stays locked.
func TestUnmapRacesRegister(t *testing.T) {
	needMlock(t, 1<<20)
	ps := int(pageSize)
	g, c := newCache(t, CacheConfig{})
	g2 := newRegistry(t)
	var failed, invalid, ok int
	for round := 0; round < 300; round++ {
		m, err := Map(4 * ps)
		if err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		var results [2]*Region
		var errs [2]error
		wg.Add(2)
		go func() {
			defer wg.Done()
			results[0], errs[0] = c.Acquire(m[:2*ps])
		}()
		go func() {
			defer wg.Done()
			results[1], errs[1] = g2.Register(m[2*ps:])
		}()
		if round%2 == 0 {
			runtime.Gosched()
		}
		if err := Unmap(m); err != nil {
			t.Fatal(err)
		}
		wg.Wait()
		for i, r := range results {
			switch {
			case errs[i] != nil:
				// Refused while Unmap runs, or mlock of a range
				// already unmapped (ENOMEM).
				if !errors.Is(errs[i], ErrUnmapped) && !errors.Is(errs[i], unix.ENOMEM) {
					t.Fatalf("registration racing Unmap: %v", errs[i])
				}
				if errors.Is(errs[i], unix.ENOMEM) && !strings.Contains(errs[i].Error(), "not mapped") {
					t.Fatalf("mlock of unmapped memory: hint missing: %v", errs[i])
				}
				failed++
			case r.Valid():
				t.Fatalf("round %d: region %d valid after Unmap", round, i)
			default:
				invalid++
				if i == 0 {
					c.Release(r)
				} else if err := g2.Deregister(r); err != nil {
					t.Fatal(err)
				}
			}
		}
		ok++
	}
	t.Logf("%d rounds: %d registrations refused, %d invalidated by Unmap", ok, failed, invalid)
	checkCache(t, c)
	if s := g.Stats(); s.Regions != 0 {
		t.Fatalf("registry stats %+v", s)
	}
	checkClean(t)
}

// TestUnmapWaitsForTeardowns: Unmap while a Deregister of a region in the
// mapping waits for a hold to drain does not munmap before that hold ends,
// and the teardown's page unlock, done before the memory goes, does not
// unlock the pages of a mapping made later at the same address.
func TestUnmapWaitsForTeardowns(t *testing.T) {
	g := NewRegistry()
	defer g.Close()
	mem, err := Map(int(pageSize))
	if err != nil {
		t.Fatal(err)
	}
	r, err := g.Register(mem)
	if err != nil {
		t.Skip("cannot lock pages here:", err)
	}
	_, h, err := g.Hold(r.ID(), r.Key(), 0, 8)
	if err != nil {
		t.Fatal(err)
	}
	deregistered := make(chan struct{})
	go func() { g.Deregister(r); close(deregistered) }()
	time.Sleep(20 * time.Millisecond) // Deregister drains the hold now
	var released atomic.Bool
	go func() {
		time.Sleep(50 * time.Millisecond)
		released.Store(true)
		h.Unhold()
	}()
	if err := Unmap(mem); err != nil {
		t.Fatal(err)
	}
	if !released.Load() {
		t.Fatal("Unmap returned while a hold on the memory was still held")
	}
	<-deregistered
	mem2, err := Map(int(pageSize))
	if err != nil {
		t.Fatal(err)
	}
	defer Unmap(mem2)
	g2 := NewRegistry()
	defer g2.Close()
	r2, err := g2.Register(mem2)
	if err != nil {
		t.Fatal(err)
	}
	if n := pages.count(r2.base); n != 1 {
		t.Fatalf("the new mapping's page is locked %d times, want 1", n)
	}
}
