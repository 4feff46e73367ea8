package regcache

import (
	"errors"
	"slices"
	"sync"

	"golang.org/x/sys/unix"
)

// CacheConfig bounds a Cache. Zero fields take the defaults of
// DefaultCacheConfig; a negative field means no limit.
type CacheConfig struct {
	// MaxRegions bounds the regions the cache holds registered, in use or
	// not (default 1024; never more than a Registry's 65536 slots).
	MaxRegions int
	// MaxLockedBytes bounds the bytes of the pages locked for the cache's
	// regions, counted per region in whole pages (default: half the
	// RLIMIT_MEMLOCK soft limit, or 64 MiB when it is unlimited).
	MaxLockedBytes int64
}

// DefaultCacheConfig returns the default limits, derived from the
// RLIMIT_MEMLOCK soft limit of the process. The soft limit applies to an
// unprivileged process; as root (CAP_IPC_LOCK) the kernel does not enforce
// it, but the default is derived from it all the same.
func DefaultCacheConfig() CacheConfig {
	cfg := CacheConfig{MaxRegions: 1024, MaxLockedBytes: 64 << 20}
	var lim unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_MEMLOCK, &lim); err == nil && lim.Cur != unix.RLIM_INFINITY {
		cfg.MaxLockedBytes = int64(lim.Cur / 2)
	}
	return cfg
}

// Cache is a pin-down cache over a Registry: registrations outlive the
// requests that use them and are reused by later requests on the same
// memory. It is safe for concurrent use.
//
// mu guards the index, the LRU list, the accounting and the cache fields
// of the regions. The accounting (count, bytes) covers every region the
// cache holds registered, those being registered (reservations) and those
// being torn down (until settled), so it never exceeds the limits.
type Cache struct {
	reg        *Registry
	maxRegions int
	maxBytes   int64

	mu   sync.Mutex
	cond sync.Cond // signalled when a teardown settles or a registration ends

	// idx: regions (length > 0, live) sorted by base; maxEnd[i] is the
	// largest end among idx[:i+1], which bounds the backward scans.
	idx    []*Region
	maxEnd []uintptr

	lruHead, lruTail *Region // unused regions, most recently released first
	lruCount         int
	lruBytes         int64

	count        int   // regions accounted
	bytes        int64 // page bytes accounted
	pendingCount int   // accounted regions whose teardown is in flight
	pendingBytes int64
	inUse        int
	zombies      int
	closed       bool
	// registering: the regions reserved and being registered, without
	// the lock (not yet in idx); a miss that one of them covers waits.
	registering    []*Region
	hits, misses   uint64
	evictions      uint64
	invalidations  uint64
	registrations  uint64
	deregistration uint64
	refusals       uint64
}

// CacheStats is a snapshot of a cache's counters.
type CacheStats struct {
	Hits, Misses    uint64
	Evictions       uint64 // unused regions deregistered to make room
	Invalidations   uint64 // regions torn down by Invalidate or Unmap
	Registrations   uint64
	Deregistrations uint64 // evictions, invalidations, Close, empty regions released
	LimitRefusals   uint64 // Acquire failed with ErrLimit
	Regions         int    // registered (or being registered) and accounted now
	LockedBytes     int64  // page bytes accounted now (<= MaxLockedBytes)
	InUse           int    // regions with references
	Unused          int    // regions on the LRU list
	Zombies         int    // torn down while in use, not yet released
	MaxRegions      int    // the limits in force (-1: none)
	MaxLockedBytes  int64
}

// NewCache returns a cache over g. A registry has at most one cache.
func NewCache(g *Registry, cfg CacheConfig) (*Cache, error) {
	def := DefaultCacheConfig()
	if cfg.MaxRegions == 0 {
		cfg.MaxRegions = def.MaxRegions
	}
	if cfg.MaxLockedBytes == 0 {
		cfg.MaxLockedBytes = def.MaxLockedBytes
	}
	if cfg.MaxRegions < 0 || cfg.MaxRegions > maxSlots {
		cfg.MaxRegions = maxSlots
	}
	if cfg.MaxLockedBytes < 0 {
		cfg.MaxLockedBytes = -1
	}
	c := &Cache{reg: g, maxRegions: cfg.MaxRegions, maxBytes: cfg.MaxLockedBytes}
	c.cond.L = &c.mu
	g.mu.Lock()
	closed := g.closed
	g.mu.Unlock()
	if closed {
		return nil, opErr(ErrClosed, "new cache")
	}
	if !g.cache.CompareAndSwap(nil, c) {
		return nil, opErr(errors.New("registry already has a cache"), "new cache")
	}
	return c, nil
}

// Stats returns a snapshot of the counters.
func (c *Cache) Stats() CacheStats {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := CacheStats{
		Hits: c.hits, Misses: c.misses,
		Evictions: c.evictions, Invalidations: c.invalidations,
		Registrations: c.registrations, Deregistrations: c.deregistration,
		LimitRefusals: c.refusals,
		Regions:       c.count, LockedBytes: c.bytes,
		InUse: c.inUse, Unused: c.lruCount, Zombies: c.zombies,
		MaxRegions: c.maxRegions, MaxLockedBytes: c.maxBytes,
	}
	if s.MaxLockedBytes < 0 {
		s.MaxLockedBytes = -1
	}
	return s
}

// Registry returns the registry the cache registers in.
func (c *Cache) Registry() *Registry { return c.reg }

// find returns a live cached region containing [lo, hi), or nil.
func (c *Cache) find(lo, hi uintptr) *Region {
	// Last region with base <= lo.
	l, h := 0, len(c.idx)
	for l < h {
		m := int(uint(l+h) >> 1)
		if c.idx[m].base <= lo {
			l = m + 1
		} else {
			h = m
		}
	}
	for i := l - 1; i >= 0 && c.maxEnd[i] >= hi; i-- {
		if r := c.idx[i]; r.end >= hi && r.state.Load() == stLive {
			return r
		}
	}
	return nil
}

func (c *Cache) idxInsert(r *Region) {
	l, h := 0, len(c.idx)
	for l < h {
		m := int(uint(l+h) >> 1)
		if c.idx[m].base <= r.base {
			l = m + 1
		} else {
			h = m
		}
	}
	c.idx = append(c.idx, nil)
	copy(c.idx[l+1:], c.idx[l:])
	c.idx[l] = r
	c.maxEnd = append(c.maxEnd, 0)
	c.fixMaxEnd(l)
	r.inIdx = true
}

func (c *Cache) idxRemove(r *Region) {
	if !r.inIdx {
		return
	}
	r.inIdx = false
	// Regions with equal bases sit together: find r among them.
	l, h := 0, len(c.idx)
	for l < h {
		m := int(uint(l+h) >> 1)
		if c.idx[m].base < r.base {
			l = m + 1
		} else {
			h = m
		}
	}
	for ; l < len(c.idx) && c.idx[l] != r; l++ {
	}
	copy(c.idx[l:], c.idx[l+1:])
	c.idx[len(c.idx)-1] = nil
	c.idx = c.idx[:len(c.idx)-1]
	c.maxEnd = c.maxEnd[:len(c.maxEnd)-1]
	c.fixMaxEnd(l)
}

func (c *Cache) fixMaxEnd(from int) {
	var m uintptr
	if from > 0 {
		m = c.maxEnd[from-1]
	}
	for i := from; i < len(c.idx); i++ {
		if e := c.idx[i].end; e > m {
			m = e
		}
		c.maxEnd[i] = m
	}
}

func (c *Cache) lruPush(r *Region) {
	r.prev, r.next = nil, c.lruHead
	if c.lruHead != nil {
		c.lruHead.prev = r
	} else {
		c.lruTail = r
	}
	c.lruHead = r
	r.inLRU = true
	c.lruCount++
	c.lruBytes += r.span
}

func (c *Cache) lruRemove(r *Region) {
	if !r.inLRU {
		return
	}
	if r.prev != nil {
		r.prev.next = r.next
	} else {
		c.lruHead = r.next
	}
	if r.next != nil {
		r.next.prev = r.prev
	} else {
		c.lruTail = r.prev
	}
	r.prev, r.next, r.inLRU = nil, nil, false
	c.lruCount--
	c.lruBytes -= r.span
}

func (c *Cache) fits(n int, need int64) bool {
	return c.count+n <= c.maxRegions && (c.maxBytes < 0 || c.bytes+need <= c.maxBytes)
}

// Acquire returns a registered region containing buf, with one reference
// taken: a cached one (a hit: no allocation, no system call) or a new
// registration (a miss), evicting least recently released unused regions
// when the limits require it. When the limits cannot be met because the
// regions are in use (or buf alone is larger than MaxLockedBytes), it
// fails with ErrLimit. The region may be larger than buf: see
// Region.Offset. Release it when the request is done.
func (c *Cache) Acquire(buf []byte) (*Region, error) {
	n := len(buf)
	lo := addrOf(buf)
	hi := lo + uintptr(n)
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil, opErr(ErrClosed, "acquire %d bytes at %#x", n, lo)
	}
	if n > 0 {
		if r := c.find(lo, hi); r != nil {
			c.hitLocked(r)
			c.mu.Unlock()
			return r, nil
		}
	}
	return c.miss(buf)
}

func (c *Cache) hitLocked(r *Region) {
	if r.refs == 0 {
		c.lruRemove(r)
		c.inUse++
	}
	r.refs++
	c.hits++
}

// miss registers buf, c.mu held on entry, released on return.
func (c *Cache) miss(buf []byte) (*Region, error) {
	c.misses++
	for {
		r, hit, err := c.reserve(buf)
		if hit || err != nil {
			return r, err
		}
		// Register without the lock; others wanting memory r covers
		// wait for it (registering).
		err = c.reg.register(r)

		c.mu.Lock()
		c.registering = slices.DeleteFunc(c.registering, func(x *Region) bool { return x == r })
		c.cond.Broadcast() // after the insertion below: waiters relock after us
		if err != nil {
			r.acct = false
			c.count--
			c.bytes -= r.span
			c.mu.Unlock()
			return nil, err
		}
		c.registrations++
		if r.state.Load() != stLive || c.closed {
			// Unmap, Invalidate or Close tore it down while we
			// registered: settle does the accounting, now or when its
			// teardown ends.
			if c.closed {
				c.mu.Unlock()
				c.invalidateOne(r)
				return nil, opErr(ErrClosed, "acquire %d bytes at %#x", len(buf), r.base)
			}
			// As if the teardown had come before this Acquire: register
			// again. Memory that Unmap is taking away is refused then
			// (ErrUnmapped), or fails to lock once it is gone.
			continue
		}
		r.refs = 1
		c.inUse++
		if !r.uncached {
			c.idxInsert(r)
		}
		c.mu.Unlock()
		return r, nil
	}
}

// reserve makes room for a registration of buf and accounts for it, c.mu
// held on entry, released on return. It returns the region to register,
// in c.registering; or a hit (a region of someone else's registration,
// made meanwhile) or an error.
func (c *Cache) reserve(buf []byte) (_ *Region, hit bool, _ error) {
	r := newRegion(c.reg, buf)
	r.cache = c
	r.uncached = len(buf) == 0
	if (c.maxBytes >= 0 && r.span > c.maxBytes) || c.maxRegions < 1 {
		c.refusals++
		c.mu.Unlock()
		return nil, false, opErr(ErrLimit, "acquire %d bytes at %#x: needs %d locked bytes, more than MaxLockedBytes %d (default: half the RLIMIT_MEMLOCK soft limit)",
			len(buf), r.base, r.span, c.maxBytes)
	}
	for {
		if c.closed {
			c.mu.Unlock()
			return nil, false, opErr(ErrClosed, "acquire %d bytes at %#x", len(buf), r.base)
		}
		if len(buf) > 0 {
			if h := c.find(r.base, r.end); h != nil {
				// Registered by someone else meanwhile.
				c.hitLocked(h)
				c.mu.Unlock()
				return h, true, nil
			}
			if c.covered(r) {
				// Someone is registering memory that contains buf:
				// take theirs rather than lock the pages twice, or be
				// refused for the room their registration holds.
				c.cond.Wait()
				continue
			}
		}
		if c.fits(1, r.span) {
			break
		}
		// Could evicting every unused region and waiting for every
		// teardown in flight make room?
		freeN := c.lruCount + c.pendingCount
		freeB := c.lruBytes + c.pendingBytes
		if c.count-freeN+1 > c.maxRegions || (c.maxBytes >= 0 && c.bytes-freeB+r.span > c.maxBytes) {
			c.refusals++
			err := opErr(ErrLimit, "acquire %d bytes at %#x: %d regions and %d locked bytes in use, limits %d regions and %d bytes",
				len(buf), r.base, c.count-freeN, c.bytes-freeB, c.maxRegions, c.maxBytes)
			c.mu.Unlock()
			return nil, false, err
		}
		settled := c.count-c.pendingCount+1 <= c.maxRegions &&
			(c.maxBytes < 0 || c.bytes-c.pendingBytes+r.span <= c.maxBytes)
		if settled || c.lruTail == nil {
			c.cond.Wait() // teardowns in flight will make room
		} else {
			c.evictLocked(r.span)
		}
	}
	r.acct = true
	c.count++
	c.bytes += r.span
	if !r.uncached {
		c.registering = append(c.registering, r)
	}
	c.mu.Unlock()
	return r, false, nil
}

// covered reports whether a registration under way covers r's memory.
func (c *Cache) covered(r *Region) bool {
	for _, x := range c.registering {
		if x.base <= r.base && x.end >= r.end {
			return true
		}
	}
	return false
}

// evictLocked tears down unused regions, least recently released first,
// until a registration of need bytes fits (or the LRU list is empty). It
// unlocks c.mu during the teardowns and relocks it.
func (c *Cache) evictLocked(need int64) {
	var victims []*Region
	n, b := c.count-c.pendingCount, c.bytes-c.pendingBytes
	for r := c.lruTail; r != nil && !(n+1 <= c.maxRegions && (c.maxBytes < 0 || b+need <= c.maxBytes)); {
		prev := r.prev
		c.lruRemove(r)
		c.idxRemove(r)
		if r.state.CompareAndSwap(stLive, stInvalid) {
			c.startTeardownLocked(r)
			victims = append(victims, r)
			n--
			b -= r.span
		}
		r = prev
	}
	c.mu.Unlock()
	for _, r := range victims {
		c.reg.teardown(r, false)
		c.settle(r, &c.evictions)
	}
	c.mu.Lock()
}

func (c *Cache) startTeardownLocked(r *Region) {
	r.pending = true
	c.pendingCount++
	c.pendingBytes += r.span
}

// settle ends the cache's side of a teardown (after Registry.teardown).
// stat is the counter to bump (evictions, invalidations or nil).
func (c *Cache) settle(r *Region, stat *uint64) {
	c.mu.Lock()
	c.lruRemove(r)
	c.idxRemove(r)
	if r.pending {
		r.pending = false
		c.pendingCount--
		c.pendingBytes -= r.span
	}
	if r.acct {
		r.acct = false
		c.count--
		c.bytes -= r.span
	}
	c.deregistration++
	if stat != nil {
		*stat++
	}
	if r.refs > 0 {
		r.zombie = true
		c.zombies++
	} else {
		r.state.CompareAndSwap(stInvalid, stDead)
	}
	c.cond.Broadcast()
	c.mu.Unlock()
}

// Release drops a reference taken by Acquire. An unused region stays
// registered (most recently used end of the LRU list), except an empty
// region, and a region invalidated while in use, which go. Releasing a
// region not acquired from c panics.
func (c *Cache) Release(r *Region) {
	c.mu.Lock()
	if r == nil || r.cache != c || r.refs <= 0 {
		c.mu.Unlock()
		panic("regcache: Release of a region not acquired from this cache")
	}
	r.refs--
	if r.refs > 0 {
		c.mu.Unlock()
		return
	}
	c.inUse--
	switch {
	case r.zombie:
		r.zombie = false
		c.zombies--
		r.state.Store(stDead)
	case r.state.Load() != stLive:
		// Teardown in flight: settle will drop it.
	case r.uncached:
		if r.state.CompareAndSwap(stLive, stInvalid) {
			c.startTeardownLocked(r)
			c.mu.Unlock()
			c.reg.teardown(r, false)
			c.settle(r, nil)
			return
		}
	default:
		c.lruPush(r)
	}
	c.mu.Unlock()
}

// Invalidate tears down every cached region overlapping [addr,
// addr+length): its id stops resolving at once, its pages are unlocked
// once holds on it drain. Regions in use stay with their holders (who
// still Release them) but are no longer registered. Call it before reusing
// memory that was not obtained from Map for something a peer must not
// reach (Unmap does it for Map memory). Returns the number of regions
// torn down.
func (c *Cache) Invalidate(addr uintptr, length int) int {
	if length <= 0 {
		return 0
	}
	hi := addr + uintptr(length)
	if hi < addr {
		hi = ^uintptr(0)
	}
	return c.invalidate(addr, hi)
}

func (c *Cache) invalidate(lo, hi uintptr) int {
	var victims []*Region
	c.mu.Lock()
	// Last region with base < hi, then backwards while some region may
	// still reach past lo.
	l, h := 0, len(c.idx)
	for l < h {
		m := int(uint(l+h) >> 1)
		if c.idx[m].base < hi {
			l = m + 1
		} else {
			h = m
		}
	}
	for i := l - 1; i >= 0 && c.maxEnd[i] > lo; i-- {
		if r := c.idx[i]; r.end > lo && r.state.CompareAndSwap(stLive, stInvalid) {
			c.startTeardownLocked(r)
			victims = append(victims, r)
		}
	}
	for _, r := range victims {
		c.lruRemove(r)
		c.idxRemove(r)
	}
	c.mu.Unlock()
	for _, r := range victims {
		c.reg.teardown(r, true)
		c.settle(r, &c.invalidations)
	}
	return len(victims)
}

// invalidateOne tears r down if it is still live; reports whether it did.
func (c *Cache) invalidateOne(r *Region) bool {
	c.mu.Lock()
	if !r.state.CompareAndSwap(stLive, stInvalid) {
		c.mu.Unlock()
		return false
	}
	c.startTeardownLocked(r)
	c.lruRemove(r)
	c.idxRemove(r)
	c.mu.Unlock()
	c.reg.teardown(r, true)
	c.settle(r, &c.invalidations)
	return true
}

// Close tears down every cached region (regions in use become invalid and
// are still released by their holders) and detaches the cache from its
// registry. Later Acquires fail with ErrClosed.
func (c *Cache) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	var victims []*Region
	for _, r := range c.idx {
		if r.state.CompareAndSwap(stLive, stInvalid) {
			c.startTeardownLocked(r)
			victims = append(victims, r)
		}
	}
	for _, r := range victims {
		c.lruRemove(r)
		c.idxRemove(r)
	}
	c.cond.Broadcast()
	c.mu.Unlock()
	for _, r := range victims {
		c.reg.teardown(r, false)
		c.settle(r, nil)
	}
	// Empty regions in use are not indexed: find them in the registry.
	c.reg.live(func(r *Region) {
		if r.cache == c {
			c.invalidateOne(r)
		}
	})
	c.reg.cache.CompareAndSwap(c, nil)
	return nil
}
