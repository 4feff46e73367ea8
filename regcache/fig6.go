package regcache

import (
	"fmt"
	"io"
	"math"
	"slices"
	"time"
)

// Fig6Sizes are the buffer sizes of the seed's Fig. 6 reproduction.
var Fig6Sizes = []int{64, 256, 1 << 10, 4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20}

// Fig6Row is the cost of one size, in nanoseconds per operation.
type Fig6Row struct {
	Size       int
	RegisterNs float64 // Register + Deregister (mlock + munlock, key, slot)
	MemcpyNs   float64 // copy of Size bytes
	CacheHitNs float64 // Acquire + Release of a cached buffer
}

// Fig6Result is the table measured by Fig6.
type Fig6Result struct {
	Rows []Fig6Row
	// Crossover is the smallest size where a memcpy costs more than a
	// registration, 0 when there is none among the sizes measured.
	Crossover int
}

// Fig6 reproduces the seed's Fig. 6 (memory registration against memory
// copy) and adds the cost of a pin-down cache hit: for each size it times
// Register+Deregister of a dedicated buffer (from Map, so no other region
// shares its pages and every registration really calls mlock and munlock),
// a copy of that many bytes between two heap buffers, and Acquire+Release
// of a heap buffer already in a Cache. Each cost is timed for at least
// minTime in total (three rounds, the fastest is kept: the machine may be
// shared). The rows come in increasing size, whatever the order of sizes
// (each size once), so that the crossover is the smallest. It prints the
// table to w (if not nil) and returns it.
//
// Registration needs mlock: an unprivileged process needs RLIMIT_MEMLOCK
// above the largest size (plus a page).
func Fig6(w io.Writer, sizes []int, minTime time.Duration) (Fig6Result, error) {
	if len(sizes) == 0 {
		sizes = Fig6Sizes
	}
	sizes = slices.Compact(slices.Sorted(slices.Values(sizes)))
	if minTime <= 0 {
		minTime = 300 * time.Millisecond
	}
	var res Fig6Result
	for _, size := range sizes {
		row := Fig6Row{Size: size}
		var err error
		if row.RegisterNs, err = fig6Measure(minTime, size, fig6Register); err != nil {
			return res, err
		}
		if row.MemcpyNs, err = fig6Measure(minTime, size, fig6Memcpy); err != nil {
			return res, err
		}
		if row.CacheHitNs, err = fig6Measure(minTime, size, fig6CacheHit); err != nil {
			return res, err
		}
		res.Rows = append(res.Rows, row)
	}
	res.Crossover = fig6Crossover(res.Rows)
	if w != nil {
		res.Print(w)
	}
	return res, nil
}

// fig6Crossover returns the size of the first of rows, sorted by size,
// where a memcpy costs more than a registration, or 0 if there is none.
func fig6Crossover(rows []Fig6Row) int {
	for _, r := range rows {
		if r.MemcpyNs > r.RegisterNs {
			return r.Size
		}
	}
	return 0
}

// Print writes the table.
func (res Fig6Result) Print(w io.Writer) {
	fmt.Fprintf(w, "%8s | %12s | %12s | %12s\n", "size", "register ns", "memcpy ns", "cache hit ns")
	for _, r := range res.Rows {
		fmt.Fprintf(w, "%8s | %12.1f | %12.1f | %12.1f\n", SizeString(r.Size), r.RegisterNs, r.MemcpyNs, r.CacheHitNs)
	}
	if res.Crossover > 0 {
		fmt.Fprintf(w, "crossover: %s (the smallest size where a memcpy costs more than a registration)\n", SizeString(res.Crossover))
	} else {
		fmt.Fprintln(w, "crossover: none (a memcpy is cheaper than a registration at every size measured)")
	}
}

// SizeString formats a size as in the benchmark names: 64B, 4KiB, 1MiB.
func SizeString(n int) string {
	switch {
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%dMiB", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%dKiB", n>>10)
	}
	return fmt.Sprintf("%dB", n)
}

// fig6Op is one timed operation and its cleanup.
type fig6Op struct {
	run     func() error
	cleanup func()
}

// fig6Register: Register + Deregister of a size-byte buffer from Map.
func fig6Register(size int) (fig6Op, error) {
	buf, err := Map(size)
	if err != nil {
		return fig6Op{}, err
	}
	for i := range buf {
		buf[i] = byte(i)
	}
	g := NewRegistry()
	return fig6Op{
		run: func() error {
			r, err := g.Register(buf)
			if err != nil {
				return err
			}
			return g.Deregister(r)
		},
		cleanup: func() {
			_ = g.Close()
			_ = Unmap(buf)
		},
	}, nil
}

// fig6Memcpy: a copy of size bytes between two heap buffers.
func fig6Memcpy(size int) (fig6Op, error) {
	src := make([]byte, size)
	dst := make([]byte, size)
	for i := range src {
		src[i] = byte(i)
	}
	return fig6Op{
		run: func() error {
			copy(dst, src)
			return nil
		},
		cleanup: func() {},
	}, nil
}

// fig6CacheHit: Acquire + Release of a heap buffer already cached.
func fig6CacheHit(size int) (fig6Op, error) {
	buf := make([]byte, size)
	g := NewRegistry()
	c, err := NewCache(g, CacheConfig{MaxLockedBytes: -1})
	if err != nil {
		return fig6Op{}, err
	}
	r, err := c.Acquire(buf)
	if err != nil {
		_ = g.Close()
		return fig6Op{}, err
	}
	c.Release(r)
	return fig6Op{
		run: func() error {
			r, err := c.Acquire(buf)
			if err != nil {
				return err
			}
			c.Release(r)
			return nil
		},
		cleanup: func() { _ = g.Close() },
	}, nil
}

func fig6Measure(minTime time.Duration, size int, setup func(int) (fig6Op, error)) (float64, error) {
	op, err := setup(size)
	if err != nil {
		return 0, err
	}
	defer op.cleanup()
	return measure(minTime, op.run)
}

// measure times op for at least d in total: it grows the iteration count
// until one round lasts d/3, then runs two more rounds of that count, and
// returns the fastest round's time per operation.
func measure(d time.Duration, op func() error) (float64, error) {
	if err := op(); err != nil { // warm up
		return 0, err
	}
	round := d / 3
	timeN := func(n int) (time.Duration, error) {
		start := time.Now()
		for i := 0; i < n; i++ {
			if err := op(); err != nil {
				return 0, err
			}
		}
		return time.Since(start), nil
	}
	n := 1
	var el time.Duration
	for {
		var err error
		if el, err = timeN(n); err != nil {
			return 0, err
		}
		if el >= round || n >= 1e9 {
			break
		}
		next := n * 100
		if el > 0 {
			next = int(1.2 * float64(n) * float64(round) / float64(el))
		}
		n = min(max(next, n+1), n*100, 1e9)
	}
	best := float64(el) / float64(n)
	for i := 0; i < 2; i++ {
		e, err := timeN(n)
		if err != nil {
			return 0, err
		}
		best = math.Min(best, float64(e)/float64(n))
	}
	return best, nil
}
