package regcache

import (
	"fmt"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"
)

var pageSize = uintptr(unix.Getpagesize())

func pageDown(a uintptr) uintptr { return a &^ (pageSize - 1) }

func pageUp(a uintptr) uintptr { return (a + pageSize - 1) &^ (pageSize - 1) }

// pageSpan is the page-aligned range covering [base, base+n), n > 0.
func pageSpan(base uintptr, n int) (lo, hi uintptr) {
	return pageDown(base), pageUp(base + uintptr(n))
}

// The system calls, replaceable by tests.
var (
	sysMlock = func(addr, n uintptr) error {
		_, _, e := unix.Syscall(unix.SYS_MLOCK, addr, n, 0)
		if e != 0 {
			return e
		}
		return nil
	}
	sysMunlock = func(addr, n uintptr) error {
		_, _, e := unix.Syscall(unix.SYS_MUNLOCK, addr, n, 0)
		if e != 0 {
			return e
		}
		return nil
	}
)

// pageLocker reference-counts locked pages for the whole process: mlock
// state belongs to the address space, so a page shared by two regions (of
// any registries) is locked once and unlocked when the last of them goes.
//
// The counts are a step function over addresses: seg is sorted by addr,
// seg[i].n is the count on [seg[i].addr, seg[i+1].addr), the count is 0
// before seg[0] and the last entry has n == 0. Adjacent entries never have
// the same count, so len(seg) is at most twice the number of maximal locked
// ranges. mlock and munlock run under mu: registrations serialize on it.
type pageLocker struct {
	mu     sync.Mutex
	seg    []pageSeg
	locked int64 // bytes with a count > 0
}

type pageSeg struct {
	addr uintptr
	n    int32
}

var pages pageLocker

// search returns the first index whose addr is >= x.
func (p *pageLocker) search(x uintptr) int {
	lo, hi := 0, len(p.seg)
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if p.seg[m].addr < x {
			lo = m + 1
		} else {
			hi = m
		}
	}
	return lo
}

// split makes x a breakpoint and returns its index.
func (p *pageLocker) split(x uintptr) int {
	i := p.search(x)
	if i < len(p.seg) && p.seg[i].addr == x {
		return i
	}
	var n int32
	if i > 0 {
		n = p.seg[i-1].n
	}
	p.seg = append(p.seg, pageSeg{})
	copy(p.seg[i+1:], p.seg[i:])
	p.seg[i] = pageSeg{addr: x, n: n}
	return i
}

// normalize drops redundant breakpoints.
func (p *pageLocker) normalize() {
	out := p.seg[:0]
	var prev int32
	for _, s := range p.seg {
		if s.n == prev {
			continue
		}
		out = append(out, s)
		prev = s.n
	}
	clear(p.seg[len(out):])
	p.seg = out
}

// lock adds one reference to every page of [lo, hi) (page-aligned, lo <
// hi) and mlocks the pages that had none. On error nothing changes.
func (p *pageLocker) lock(lo, hi uintptr) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	i := p.split(lo)
	j := p.split(hi)
	var err error
	done := i // segments [i, done) are locked
	for k := i; k < j; k++ {
		if p.seg[k].n != 0 {
			continue
		}
		// Coalesce adjacent uncounted segments (normally there are none).
		e := k + 1
		for e < j && p.seg[e].n == 0 {
			e++
		}
		if err = sysMlock(p.seg[k].addr, p.seg[e].addr-p.seg[k].addr); err != nil {
			done = k
			break
		}
		k = e - 1
	}
	if err != nil {
		for k := i; k < done; k++ {
			if p.seg[k].n == 0 {
				_ = sysMunlock(p.seg[k].addr, p.seg[k+1].addr-p.seg[k].addr)
			}
		}
		p.normalize()
		return err
	}
	for k := i; k < j; k++ {
		if p.seg[k].n == 0 {
			p.locked += int64(p.seg[k+1].addr - p.seg[k].addr)
		}
		p.seg[k].n++
	}
	p.normalize()
	return nil
}

// unlock drops one reference from every page of [lo, hi) and munlocks the
// pages left with none. munlock errors (the memory was unmapped behind our
// back) are returned but the counts are dropped anyway.
func (p *pageLocker) unlock(lo, hi uintptr) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	i := p.split(lo)
	j := p.split(hi)
	var first error
	for k := i; k < j; k++ {
		switch p.seg[k].n {
		case 0:
			// Forgotten by forget (the mapping went away): nothing to do.
			continue
		case 1:
			n := p.seg[k+1].addr - p.seg[k].addr
			if err := sysMunlock(p.seg[k].addr, n); err != nil && first == nil {
				first = err
			}
			p.locked -= int64(n)
		}
		p.seg[k].n--
	}
	p.normalize()
	return first
}

// forget drops every count on [lo, hi) without munlock: the range was (or
// is about to be) unmapped, which unlocks it, or was freshly mapped.
func (p *pageLocker) forget(lo, hi uintptr) {
	p.mu.Lock()
	defer p.mu.Unlock()
	i := p.split(lo)
	j := p.split(hi)
	for k := i; k < j; k++ {
		if p.seg[k].n != 0 {
			p.locked -= int64(p.seg[k+1].addr - p.seg[k].addr)
			p.seg[k].n = 0
		}
	}
	p.normalize()
}

// count returns the reference count of the page at a (for tests).
func (p *pageLocker) count(a uintptr) int32 {
	p.mu.Lock()
	defer p.mu.Unlock()
	i := p.search(a + 1)
	if i == 0 {
		return 0
	}
	return p.seg[i-1].n
}

// mapped reports whether all of [lo, hi) (page-aligned) is mapped.
func mapped(lo, hi uintptr) bool {
	vec := make([]byte, (hi-lo)/pageSize)
	_, _, e := unix.Syscall(unix.SYS_MINCORE, lo, hi-lo, uintptr(unsafe.Pointer(unsafe.SliceData(vec))))
	return e != unix.ENOMEM
}

// mlockHint explains an mlock failure on [lo, hi).
func mlockHint(err error, lo, hi uintptr) string {
	if err == unix.ENOMEM && !mapped(lo, hi) {
		return "the memory is not mapped"
	}
	var lim unix.Rlimit
	_ = unix.Getrlimit(unix.RLIMIT_MEMLOCK, &lim)
	soft := "unlimited"
	if lim.Cur != unix.RLIM_INFINITY {
		soft = fmt.Sprintf("%d bytes", lim.Cur)
	}
	switch err {
	case unix.EPERM:
		return fmt.Sprintf("RLIMIT_MEMLOCK soft limit is %s and the process lacks CAP_IPC_LOCK: raise the limit with ulimit -l or LimitMEMLOCK=, or run as root", soft)
	case unix.ENOMEM:
		return fmt.Sprintf("RLIMIT_MEMLOCK soft limit is %s, %d bytes locked through regcache: raise the limit with ulimit -l or LimitMEMLOCK=, grant CAP_IPC_LOCK, or lower CacheConfig.MaxLockedBytes; ENOMEM also means vm.max_map_count was reached", soft, lockedBytes())
	}
	return ""
}

func lockedBytes() int64 {
	pages.mu.Lock()
	defer pages.mu.Unlock()
	return pages.locked
}
