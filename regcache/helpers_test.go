package regcache

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// skipOrFatal skips the test, or fails it when XMX_REQUIRE_PRIVILEGED=1.
func skipOrFatal(tb testing.TB, format string, args ...any) {
	tb.Helper()
	if os.Getenv("XMX_REQUIRE_PRIVILEGED") == "1" {
		tb.Fatalf(format+" (and XMX_REQUIRE_PRIVILEGED=1)", args...)
	}
	tb.Skipf(format, args...)
}

// needMlock skips (or fails) a test that locks up to n bytes at once when
// the process can lock neither that much under RLIMIT_MEMLOCK nor as root.
func needMlock(tb testing.TB, n int64) {
	tb.Helper()
	if os.Geteuid() == 0 {
		return
	}
	var lim unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_MEMLOCK, &lim); err != nil {
		tb.Fatal(err)
	}
	if lim.Cur != unix.RLIM_INFINITY && lim.Cur < uint64(n)+uint64(lockedBytes())+64<<10 {
		skipOrFatal(tb, "needs root or RLIMIT_MEMLOCK >= %d bytes to mlock (soft limit %d)", n, lim.Cur)
	}
}

// vmLck returns the process's locked memory in bytes, as the kernel counts
// it (VmLck in /proc/self/status).
func vmLck(tb testing.TB) int64 {
	tb.Helper()
	f, err := os.Open("/proc/self/status")
	if err != nil {
		tb.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmLck:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err != nil {
				tb.Fatal(err)
			}
			return kb << 10
		}
	}
	tb.Fatal("no VmLck in /proc/self/status")
	return 0
}

// checkLocked verifies that the kernel's count of locked memory matches
// the package's: every page counted is locked, every page locked counted.
func checkLocked(tb testing.TB) {
	tb.Helper()
	if k, p := vmLck(tb), lockedBytes(); k != p {
		tb.Fatalf("kernel VmLck %d bytes, regcache counts %d", k, p)
	}
}

// checkClean verifies that nothing is left locked.
func checkClean(tb testing.TB) {
	tb.Helper()
	if p := lockedBytes(); p != 0 {
		tb.Fatalf("%d bytes still locked", p)
	}
	checkLocked(tb)
}

func newRegistry(tb testing.TB) *Registry {
	g := NewRegistry()
	tb.Cleanup(func() { g.Close() })
	return g
}

func newCache(tb testing.TB, cfg CacheConfig) (*Registry, *Cache) {
	tb.Helper()
	g := newRegistry(tb)
	c, err := NewCache(g, cfg)
	if err != nil {
		tb.Fatal(err)
	}
	return g, c
}

// alignedBuf returns n bytes of heap memory starting on a page boundary.
func alignedBuf(n int) []byte {
	b := make([]byte, n+int(pageSize))
	off := int(pageUp(addrOf(b)) - addrOf(b))
	return b[off : off+n : off+n]
}

func ptr(b []byte) uintptr { return uintptr(unsafe.Pointer(unsafe.SliceData(b))) }

// checkCache verifies the cache's internal invariants and its limits.
func checkCache(tb testing.TB, c *Cache) {
	tb.Helper()
	if err := c.check(); err != nil {
		tb.Fatal(err)
	}
}

// check is the invariant checker; the cache must be quiescent (no
// Acquire, Release or teardown in flight).
func (c *Cache) check() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.count > c.maxRegions {
		return fmt.Errorf("%d regions > limit %d", c.count, c.maxRegions)
	}
	if c.maxBytes >= 0 && c.bytes > c.maxBytes {
		return fmt.Errorf("%d locked bytes > limit %d", c.bytes, c.maxBytes)
	}
	if c.pendingCount != 0 || c.pendingBytes != 0 {
		return fmt.Errorf("pending %d/%d while quiescent", c.pendingCount, c.pendingBytes)
	}
	var m uintptr
	var bytes int64
	inUse := 0
	for i, r := range c.idx {
		if i > 0 && c.idx[i-1].base > r.base {
			return fmt.Errorf("index not sorted at %d", i)
		}
		m = max(m, r.end)
		if c.maxEnd[i] != m {
			return fmt.Errorf("maxEnd[%d] = %#x, want %#x", i, c.maxEnd[i], m)
		}
		if !r.inIdx || !r.acct || r.state.Load() != stLive || r.cache != c {
			return fmt.Errorf("indexed region %#x: inIdx %v acct %v state %d", r.id, r.inIdx, r.acct, r.state.Load())
		}
		if (r.refs == 0) != r.inLRU {
			return fmt.Errorf("region %#x: refs %d, inLRU %v", r.id, r.refs, r.inLRU)
		}
		if r.refs > 0 {
			inUse++
		}
		bytes += r.span
	}
	n, b := 0, int64(0)
	for r := c.lruHead; r != nil; r = r.next {
		if r.next != nil && r.next.prev != r || r.next == nil && c.lruTail != r {
			return fmt.Errorf("LRU links broken at %#x", r.id)
		}
		n++
		b += r.span
	}
	if n != c.lruCount || b != c.lruBytes {
		return fmt.Errorf("LRU holds %d regions, %d bytes; counted %d, %d", n, b, c.lruCount, c.lruBytes)
	}
	// Empty regions in use are accounted but not indexed.
	if c.count < len(c.idx) || c.bytes != bytes {
		return fmt.Errorf("accounted %d regions, %d bytes; index holds %d, %d", c.count, c.bytes, len(c.idx), bytes)
	}
	if c.inUse < inUse {
		return fmt.Errorf("inUse %d < %d indexed in use", c.inUse, inUse)
	}
	return nil
}
