package regcache

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

// The seed's Fig. 6: registration against memory copy, plus the cache hit
// that a pin-down cache turns the registration into. Run with
//
//	go test -run XXX -bench 'Register|Memcpy|CacheHit' ./regcache
//
// Fig6 (fig6.go) measures the same three operations for the xmx tool.

func benchFig6(b *testing.B, setup func(int) (fig6Op, error)) {
	for _, size := range Fig6Sizes {
		b.Run(SizeString(size), func(b *testing.B) {
			needMlock(b, int64(size)+2*int64(pageSize))
			op, err := setup(size)
			if err != nil {
				b.Fatal(err)
			}
			defer op.cleanup()
			b.SetBytes(int64(size))
			for b.Loop() {
				if err := op.run(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// Register + Deregister (mlock + munlock, key, id slot).
func BenchmarkRegister(b *testing.B) { benchFig6(b, fig6Register) }

// copy of the same size.
func BenchmarkMemcpy(b *testing.B) { benchFig6(b, fig6Memcpy) }

// Acquire + Release of a cached buffer.
func BenchmarkCacheHit(b *testing.B) { benchFig6(b, fig6CacheHit) }

// A hit with a few hundred other regions cached (binary search depth).
func BenchmarkCacheHitMany(b *testing.B) {
	needMlock(b, 4<<20)
	_, c := newCache(b, CacheConfig{MaxLockedBytes: -1})
	arena := alignedBuf(512 * int(pageSize))
	for i := 0; i < 512; i++ {
		r, err := c.Acquire(arena[i*int(pageSize) : i*int(pageSize)+100])
		if err != nil {
			b.Fatal(err)
		}
		c.Release(r)
	}
	buf := arena[300*int(pageSize)+10 : 300*int(pageSize)+60]
	for b.Loop() {
		r, err := c.Acquire(buf)
		if err != nil {
			b.Fatal(err)
		}
		c.Release(r)
	}
}

// TestFig6Crossover: the crossover is the smallest size where a copy
// costs more than a registration, also when a larger size is cheaper
// again (noise), and 0 when a copy is cheaper everywhere.
func TestFig6Crossover(t *testing.T) {
	row := func(size int, reg, cp float64) Fig6Row { return Fig6Row{Size: size, RegisterNs: reg, MemcpyNs: cp} }
	for _, c := range []struct {
		rows []Fig6Row
		want int
	}{
		{nil, 0},
		{[]Fig6Row{row(64, 900, 10), row(4096, 1000, 200)}, 0},
		{[]Fig6Row{row(64, 900, 10), row(4096, 1000, 1000)}, 0}, // equal: not more
		{[]Fig6Row{row(64, 900, 10), row(64<<10, 1100, 3000), row(1<<20, 1500, 40000)}, 64 << 10},
		{[]Fig6Row{row(64, 900, 10), row(4096, 800, 900), row(64<<10, 5000, 3000), row(1<<20, 1500, 40000)}, 4096},
	} {
		if got := fig6Crossover(c.rows); got != c.want {
			t.Errorf("fig6Crossover(%+v) = %d, want %d", c.rows, got, c.want)
		}
	}
}

func TestFig6(t *testing.T) {
	needMlock(t, 64<<10)
	var out bytes.Buffer
	// Given out of order and twice, measured once each in increasing
	// order: the crossover is the smallest size where a copy costs more.
	res, err := Fig6(&out, []int{64 << 10, 64, 4096, 64}, 6*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("\n%s", out.String())
	if len(res.Rows) != 3 || res.Rows[0].Size != 64 || res.Rows[1].Size != 4096 || res.Rows[2].Size != 64<<10 {
		t.Fatalf("rows %+v, want 64 B, 4 KiB, 64 KiB", res.Rows)
	}
	if want := fig6Crossover(res.Rows); res.Crossover != want {
		t.Fatalf("crossover %d, want %d (rows %+v)", res.Crossover, want, res.Rows)
	}
	for _, r := range res.Rows {
		if r.RegisterNs <= 0 || r.MemcpyNs <= 0 || r.CacheHitNs <= 0 {
			t.Fatalf("row %+v", r)
		}
		// A hit is a lookup; a registration is two system calls.
		if r.CacheHitNs >= r.RegisterNs {
			t.Fatalf("a cache hit (%.0f ns) costs as much as a registration (%.0f ns)", r.CacheHitNs, r.RegisterNs)
		}
	}
	if !strings.HasPrefix(out.String(), "    size |  register ns |    memcpy ns | cache hit ns\n") ||
		!strings.Contains(out.String(), "crossover: ") {
		t.Fatalf("table:\n%s", out.String())
	}
	checkClean(t)
}
