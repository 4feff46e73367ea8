package regcache

import (
	"math"
	"math/bits"
	"sync"
	"testing"
)

func FuzzLookup(f *testing.F) {
	const m = math.MaxUint64
	for _, s := range []struct {
		size                uint16
		off, length, keyXor uint64
		idDelta             uint32
	}{
		{100, 0, 100, 0, 0}, {100, 100, 0, 0, 0}, {100, 1, 100, 0, 0}, {100, m, 1, 0, 0},
		{100, 1, m, 0, 0}, {100, m, m, 0, 0}, {0, 0, 0, 0, 0}, {0, 0, 1, 0, 0},
		{4096, 4000, 96, 1, 0}, {4096, 10, 10, 0, 1}, {4096, 10, 10, 0, 1 << 16},
		{100, 1 << 63, 1 << 63, 0, 0}, {100, 50, m - 49, 0, 0},
	} {
		f.Add(s.size, s.off, s.length, s.keyXor, s.idDelta)
	}
	needMlock(f, 1<<16+int64(pageSize))
	g := NewRegistry()
	defer g.Close()
	backing := make([]byte, 1<<16)
	regs := make(map[uint16]*Region)
	f.Fuzz(func(t *testing.T, size uint16, off, length, keyXor uint64, idDelta uint32) {
		r := regs[size]
		if r == nil {
			var err error
			if r, err = g.Register(backing[:size]); err != nil {
				t.Fatal(err)
			}
			regs[size] = r
		}
		b, err := g.Lookup(r.ID()+idDelta, r.Key()^keyXor, off, length)
		end, carry := bits.Add64(off, length, 0)
		var want error
		switch {
		case idDelta != 0:
			// Another region may live there (ids of other sizes): it
			// has another key, almost surely.
			if err == nil {
				t.Fatalf("id %#x+%d accepted", r.ID(), idDelta)
			}
			return
		case keyXor != 0:
			want = ErrBadKey
		case carry != 0 || end > uint64(size):
			want = ErrOutOfBounds
		}
		if err != want {
			t.Fatalf("Lookup(size %d, off %d, len %d, keyXor %#x) = %v, want %v", size, off, length, keyXor, err, want)
		}
		if err == nil {
			if uint64(len(b)) != length || uint64(cap(b)) != length {
				t.Fatalf("len %d cap %d, want %d", len(b), cap(b), length)
			}
			if length > 0 && ptr(b) != ptr(backing)+uintptr(off) {
				t.Fatalf("slice at %#x, want %#x", ptr(b), ptr(backing)+uintptr(off))
			}
		} else if b != nil {
			t.Fatal("non-nil slice with an error")
		}
	})
}

// Lookup, Hold/Unhold and a cache hit do not allocate.
func TestNoAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	needMlock(t, 1<<20)
	g, c := newCache(t, CacheConfig{})
	buf := make([]byte, 8192)
	r, err := c.Acquire(buf)
	if err != nil {
		t.Fatal(err)
	}
	c.Release(r)
	id, key := r.ID(), r.Key()
	var sink []byte
	for name, fn := range map[string]func(){
		"Lookup":        func() { sink, _ = g.Lookup(id, key, 10, 100) },
		"Lookup/refuse": func() { sink, _ = g.Lookup(id, key, 10, math.MaxUint64) },
		"Lookup/stale":  func() { sink, _ = g.Lookup(id+1, key, 10, 100) },
		"Hold":          func() { b, h, _ := g.Hold(id, key, 0, 8192); sink = b; h.Unhold() },
		"Acquire/hit":   func() { r, _ := c.Acquire(buf[100:200]); c.Release(r) },
	} {
		if n := testing.AllocsPerRun(1000, fn); n != 0 {
			t.Errorf("%s: %v allocations per run", name, n)
		}
	}
	_ = sink
}

// The Lookup table against the alternative the brief mentions: a map
// guarded by a sync.RWMutex. Parallel lookups on all CPUs.
func BenchmarkLookup(b *testing.B) {
	g := NewRegistry()
	defer g.Close()
	var rs []*Region
	for i := 0; i < 256; i++ {
		r, err := g.Register(nil)
		if err != nil {
			b.Fatal(err)
		}
		rs = append(rs, r)
	}
	b.Run("slots", func(b *testing.B) {
		b.RunParallel(func(pb *testing.PB) {
			i := 0
			for pb.Next() {
				r := rs[i&255]
				if _, err := g.Lookup(r.id, r.key, 0, 0); err != nil {
					b.Fatal(err)
				}
				i++
			}
		})
	})
	b.Run("rwmutex-map", func(b *testing.B) {
		var mu sync.RWMutex
		m := make(map[uint32]*Region)
		for _, r := range rs {
			m[r.id] = r
		}
		lookup := func(id uint32, key, off, length uint64) ([]byte, error) {
			mu.RLock()
			r := m[id]
			mu.RUnlock()
			if r == nil {
				return nil, ErrNoRegion
			}
			if r.key != key {
				return nil, ErrBadKey
			}
			n := uint64(len(r.buf))
			if off > n || length > n-off {
				return nil, ErrOutOfBounds
			}
			return r.buf[off : off+length : off+length], nil
		}
		b.RunParallel(func(pb *testing.PB) {
			i := 0
			for pb.Next() {
				r := rs[i&255]
				if _, err := lookup(r.id, r.key, 0, 0); err != nil {
					b.Fatal(err)
				}
				i++
			}
		})
	})
	b.Run("hold", func(b *testing.B) {
		b.RunParallel(func(pb *testing.PB) {
			i := 0
			for pb.Next() {
				r := rs[i&255]
				_, h, err := g.Hold(r.id, r.key, 0, 0)
				if err != nil {
					b.Fatal(err)
				}
				h.Unhold()
				i++
			}
		})
	})
}
