package regcache

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"
)

// Region ids: generation in the high 16 bits (never 0), slot in the low 16.
const (
	slotBits   = 16
	maxSlots   = 1 << slotBits
	chunkBits  = 8
	chunkSize  = 1 << chunkBits
	numChunks  = maxSlots / chunkSize
	quarantine = 1024 // freed slots wait behind this many others before reuse
)

// Registration states of a Region.
const (
	stLive    uint32 = iota + 1 // registered: Lookup succeeds
	stInvalid                   // torn down by invalidation/eviction; the owner still holds it
	stDead                      // torn down and released by its owner
)

// Region is a registered memory range. Its id, key, address and length are
// fixed at registration; the registration itself ends with Deregister (or
// Cache.Release), eviction or invalidation.
type Region struct {
	id   uint32
	key  uint64
	buf  []byte // keeps heap memory alive while registered; cap == len
	base uintptr
	end  uintptr // base + len(buf)
	span int64   // bytes of the pages locked for it (0 when empty)
	reg  *Registry

	state atomic.Uint32 // stLive, stInvalid, stDead
	holds atomic.Int32  // accesses in flight (Hold .. Unhold)

	// The cache that registered it (nil for Register), fixed before it
	// is published. The fields below are guarded by cache.mu.
	cache      *Cache
	refs       int32   // Acquire references
	prev, next *Region // LRU links, valid when inLRU
	inLRU      bool
	inIdx      bool
	acct       bool // counted in cache.count and cache.bytes
	pending    bool // teardown started by the cache, not settled yet
	zombie     bool // torn down while in use; dropped at the last Release
	uncached   bool // zero-length: never in the index, deregistered at Release
}

// ID is the region id a peer names in a remote access.
func (r *Region) ID() uint32 { return r.id }

// Key is the region's random access key.
func (r *Region) Key() uint64 { return r.key }

// Addr is the region's base address.
func (r *Region) Addr() uintptr { return r.base }

// Len is the region's length in bytes.
func (r *Region) Len() int { return len(r.buf) }

// Bytes is the registered memory. Do not use it after Unmap of the memory.
func (r *Region) Bytes() []byte { return r.buf }

// Valid reports whether the region is still registered (its id resolves).
func (r *Region) Valid() bool { return r.state.Load() == stLive }

// Offset returns the offset of buf in the region, and false when buf does
// not lie inside it. With Cache.Acquire, the region returned may be larger
// than the buffer: the peer needs (ID, Key, Offset(buf), len(buf)).
func (r *Region) Offset(buf []byte) (uint64, bool) {
	a := addrOf(buf)
	if a < r.base || a-r.base > uintptr(len(r.buf)) || uintptr(len(buf)) > r.end-a {
		return 0, false
	}
	return uint64(a - r.base), true
}

// Unhold ends an access started by Registry.Hold.
func (r *Region) Unhold() {
	if r.holds.Add(-1) < 0 {
		panic("regcache: Unhold without Hold")
	}
}

func addrOf(b []byte) uintptr { return uintptr(unsafe.Pointer(unsafe.SliceData(b))) }

type slotChunk [chunkSize]atomic.Pointer[Region]

// Registry registers memory for one endpoint and checks remote accesses.
// It is safe for concurrent use.
//
// The slot table (chunks) is read without lock by Lookup and Hold and
// written under mu; everything else is guarded by mu.
type Registry struct {
	chunks [numChunks]atomic.Pointer[slotChunk]

	mu      sync.Mutex
	gens    []uint16 // generation of each slot, len = slots allocated
	freeq   []uint32 // freed slots, FIFO
	closed  bool
	regions int   // live regions
	locked  int64 // page bytes of live regions
	regs    uint64
	deregs  uint64
	invals  uint64
	// tearing: regions unpublished whose teardown (drain of holds, page
	// unlock) has not ended; Unmap waits for those in its range.
	tearing map[*Region]struct{}

	cache atomic.Pointer[Cache] // the Cache over this registry, if any

	refNoRegion, refBadKey, refBounds atomic.Uint64
}

// NewRegistry returns an empty registry. Close it when done: regions still
// registered keep their pages locked.
func NewRegistry() *Registry {
	return &Registry{}
}

// RegistryStats is a snapshot of a registry's counters.
type RegistryStats struct {
	Regions         int    // registered now
	LockedBytes     int64  // bytes of the pages of registered regions (a page shared by two regions counts twice)
	Registrations   uint64 // total
	Deregistrations uint64 // total, whatever the cause
	Invalidations   uint64 // deregistrations by invalidation (Invalidate, Unmap)
	// Remote accesses refused by Lookup/Hold, by reason.
	RefusedNoRegion, RefusedBadKey, RefusedOutOfBounds uint64
}

// Stats returns a snapshot of the counters.
func (g *Registry) Stats() RegistryStats {
	g.mu.Lock()
	s := RegistryStats{
		Regions:         g.regions,
		LockedBytes:     g.locked,
		Registrations:   g.regs,
		Deregistrations: g.deregs,
		Invalidations:   g.invals,
	}
	g.mu.Unlock()
	s.RefusedNoRegion = g.refNoRegion.Load()
	s.RefusedBadKey = g.refBadKey.Load()
	s.RefusedOutOfBounds = g.refBounds.Load()
	return s
}

// Register registers buf: it locks its pages and gives it an id and a key.
// An empty buf gives a region of length 0 with nothing locked. The region
// keeps a reference to buf.
func (g *Registry) Register(buf []byte) (*Region, error) {
	r := newRegion(g, buf)
	if err := g.register(r); err != nil {
		return nil, err
	}
	return r, nil
}

func newRegion(g *Registry, buf []byte) *Region {
	buf = buf[:len(buf):len(buf)]
	r := &Region{buf: buf, base: addrOf(buf), reg: g}
	r.end = r.base + uintptr(len(buf))
	if len(buf) > 0 {
		lo, hi := pageSpan(r.base, len(buf))
		r.span = int64(hi - lo)
	}
	return r
}

func newKey() uint64 {
	var b [8]byte
	for {
		_, _ = rand.Read(b[:]) // never fails (Go ≥ 1.24)
		if k := binary.LittleEndian.Uint64(b[:]); k != 0 {
			return k
		}
	}
}

// register locks r's pages and publishes it under a fresh id.
func (g *Registry) register(r *Region) error {
	n := len(r.buf)
	r.key = newKey()

	// Refuse memory that Unmap is tearing down; subscribe to the unmap of
	// any mapping made by Map that r lies in. The read lock is held until
	// r is published so that Unmap either sees r or makes us fail.
	vmaMu.RLock()
	defer vmaMu.RUnlock()
	if n > 0 {
		if err := vmaWatch(g, r.base, r.end); err != nil {
			return opErr(err, "register %d bytes at %#x", n, r.base)
		}
		lo, hi := pageSpan(r.base, n)
		if err := pages.lock(lo, hi); err != nil {
			return &opError{op: fmt.Sprintf("register %d bytes at %#x: mlock", n, r.base), err: err, hint: mlockHint(err, lo, hi)}
		}
	}

	g.mu.Lock()
	if g.closed {
		g.mu.Unlock()
		g.unlockPages(r)
		return opErr(ErrClosed, "register %d bytes at %#x", n, r.base)
	}
	var slot uint32
	switch {
	case len(g.freeq) > quarantine || (len(g.gens) == maxSlots && len(g.freeq) > 0):
		slot = g.freeq[0]
		g.freeq[0] = 0
		g.freeq = g.freeq[1:]
	case len(g.gens) < maxSlots:
		slot = uint32(len(g.gens))
		g.gens = append(g.gens, 1)
		if slot%chunkSize == 0 {
			g.chunks[slot/chunkSize].Store(new(slotChunk))
		}
	default:
		g.mu.Unlock()
		g.unlockPages(r)
		return opErr(ErrLimit, "register %d bytes at %#x: %d regions registered", n, r.base, maxSlots)
	}
	r.id = uint32(g.gens[slot])<<slotBits | slot
	r.state.Store(stLive)
	g.chunks[slot/chunkSize].Load()[slot%chunkSize].Store(r)
	g.regions++
	g.locked += r.span
	g.regs++
	g.mu.Unlock()
	if testHookPublished != nil {
		testHookPublished(r)
	}
	return nil
}

// testHookPublished, when set by a test, runs right after a region is
// published: it opens the window in which Unmap or Close races with a
// cache registration.
var testHookPublished func(*Region)

func (g *Registry) unlockPages(r *Region) {
	if len(r.buf) > 0 {
		lo, hi := pageSpan(r.base, len(r.buf))
		_ = pages.unlock(lo, hi)
	}
}

// load returns the region published under id's slot, or nil.
func (g *Registry) load(id uint32) *Region {
	slot := id & (maxSlots - 1)
	c := g.chunks[slot/chunkSize].Load()
	if c == nil {
		return nil
	}
	return c[slot%chunkSize].Load()
}

// Lookup checks a remote access to (id, key, off, length) and returns the
// bytes it names. It takes no lock, does not allocate, and returns exactly
// ErrNoRegion, ErrBadKey or ErrOutOfBounds on refusal. The slice is capped
// at its length. See the package documentation about racing with Unmap.
func (g *Registry) Lookup(id uint32, key, off, length uint64) ([]byte, error) {
	r, err := g.check(id, key, off, length)
	if err != nil {
		return nil, err
	}
	return r.buf[off : off+length : off+length], nil
}

// Hold is Lookup that also holds the region: until Unhold, teardown of the
// region (Deregister, eviction, invalidation, Unmap) waits. Keep holds
// short (one copy), and do not call anything that may tear down a region
// while holding one.
func (g *Registry) Hold(id uint32, key, off, length uint64) ([]byte, *Region, error) {
	r, err := g.check(id, key, off, length)
	if err != nil {
		return nil, nil, err
	}
	r.holds.Add(1)
	// Teardown stores the state, then waits for holds == 0: either it
	// sees this hold, or this load sees its state.
	if r.state.Load() != stLive {
		r.holds.Add(-1)
		g.refNoRegion.Add(1)
		return nil, nil, ErrNoRegion
	}
	return r.buf[off : off+length : off+length], r, nil
}

func (g *Registry) check(id uint32, key, off, length uint64) (*Region, error) {
	r := g.load(id)
	if r == nil || r.id != id || r.state.Load() != stLive {
		g.refNoRegion.Add(1)
		return nil, ErrNoRegion
	}
	if r.key != key {
		g.refBadKey.Add(1)
		return nil, ErrBadKey
	}
	n := uint64(len(r.buf))
	if off > n || length > n-off {
		g.refBounds.Add(1)
		return nil, ErrOutOfBounds
	}
	return r, nil
}

// Deregister ends a registration made by Register: the id stops resolving,
// in-flight holds drain, the pages are unlocked. Deregistering a region
// already torn down by invalidation or Unmap is not an error; twice is.
// Regions of a Cache are released with Cache.Release instead.
func (g *Registry) Deregister(r *Region) error {
	if r == nil || r.reg != g {
		return opErr(ErrNoRegion, "deregister: region of another registry")
	}
	if r.cache != nil {
		return opErr(errors.New("region belongs to a Cache: use Cache.Release"), "deregister region %#x", r.id)
	}
	if r.state.CompareAndSwap(stLive, stDead) {
		g.teardown(r, false)
		return nil
	}
	if r.state.CompareAndSwap(stInvalid, stDead) {
		return nil
	}
	return opErr(ErrNoRegion, "deregister region %#x: already deregistered", r.id)
}

// testHookTeardown, when set by a test, runs at the start of teardown.
var testHookTeardown func(*Region)

// teardown unpublishes r (whose state its caller moved off stLive), frees
// its slot, waits for holds to drain and unlocks its pages.
func (g *Registry) teardown(r *Region, invalidation bool) {
	if testHookTeardown != nil {
		testHookTeardown(r)
	}
	slot := r.id & (maxSlots - 1)
	g.mu.Lock()
	if c := g.chunks[slot/chunkSize].Load(); c != nil && c[slot%chunkSize].Load() == r {
		c[slot%chunkSize].Store(nil)
		gen := g.gens[slot] + 1
		if gen == 0 {
			gen = 1
		}
		g.gens[slot] = gen
		g.freeq = append(g.freeq, slot)
	}
	g.regions--
	g.locked -= r.span
	g.deregs++
	if invalidation {
		g.invals++
	}
	if g.tearing == nil {
		g.tearing = map[*Region]struct{}{}
	}
	g.tearing[r] = struct{}{}
	g.mu.Unlock()
	drainHolds(r)
	g.unlockPages(r)
	g.mu.Lock()
	delete(g.tearing, r)
	g.mu.Unlock()
}

// waitTeardowns waits until no teardown of a region overlapping [lo, hi)
// is under way: Unmap calls it after invalidating the range, so that a
// teardown another goroutine started (Deregister, an eviction) has let
// its last hold go and unlocked its pages before the memory goes. A
// teardown is under way from the moment its region leaves stLive: before
// teardown takes g.mu, the region is still published but not live (and
// invalidateRange passes it by), then it is in tearing.
func (g *Registry) waitTeardowns(lo, hi uintptr) {
	in := func(r *Region) bool { return r.base < hi && r.end > lo && len(r.buf) > 0 }
	for i := 0; ; i++ {
		busy := false
		g.mu.Lock()
		for r := range g.tearing {
			if in(r) {
				busy = true
				break
			}
		}
		for s := 0; s < len(g.gens) && !busy; s++ {
			if c := g.chunks[s/chunkSize].Load(); c != nil {
				r := c[s%chunkSize].Load()
				busy = r != nil && r.state.Load() != stLive && in(r)
			}
		}
		g.mu.Unlock()
		if !busy {
			return
		}
		if i < 100 {
			runtime.Gosched()
		} else {
			time.Sleep(10 * time.Microsecond)
		}
	}
}

func drainHolds(r *Region) {
	for i := 0; r.holds.Load() != 0; i++ {
		if i < 100 {
			runtime.Gosched()
		} else {
			time.Sleep(10 * time.Microsecond)
		}
	}
}

// live calls fn for each live region (a snapshot: fn may tear regions down).
func (g *Registry) live(fn func(*Region)) {
	g.mu.Lock()
	n := len(g.gens)
	g.mu.Unlock()
	for s := 0; s < n; s++ {
		c := g.chunks[s/chunkSize].Load()
		if c == nil {
			continue
		}
		if r := c[s%chunkSize].Load(); r != nil && r.state.Load() == stLive {
			fn(r)
		}
	}
}

// invalidateRange tears down every region overlapping [lo, hi): the
// cache's first (through the cache, which keeps its accounting), then any
// other, including cache regions still being registered. Returns the count.
func (g *Registry) invalidateRange(lo, hi uintptr) int {
	n := 0
	if c := g.cache.Load(); c != nil {
		n += c.invalidate(lo, hi)
	}
	g.live(func(r *Region) {
		if r.base >= hi || r.end <= lo || len(r.buf) == 0 {
			return
		}
		if r.cache != nil {
			if r.cache.invalidateOne(r) {
				n++
			}
			return
		}
		if r.state.CompareAndSwap(stLive, stInvalid) {
			g.teardown(r, true)
			n++
		}
	})
	return n
}

// Invalidate tears down every region of this registry (cache regions
// included) overlapping [addr, addr+length). Their owners still Deregister
// or Release them. Returns the number of regions torn down.
func (g *Registry) Invalidate(addr uintptr, length int) int {
	if length <= 0 {
		return 0
	}
	hi := addr + uintptr(length)
	if hi < addr {
		hi = ^uintptr(0)
	}
	return g.invalidateRange(addr, hi)
}

// Close tears down every region (closing the Cache over the registry
// first, if any); later registrations fail with ErrClosed. Lookups of the
// old ids fail with ErrNoRegion.
func (g *Registry) Close() error {
	if c := g.cache.Load(); c != nil {
		_ = c.Close()
	}
	g.mu.Lock()
	g.closed = true
	g.mu.Unlock()
	g.live(func(r *Region) {
		if r.cache != nil {
			r.cache.invalidateOne(r)
			return
		}
		if r.state.CompareAndSwap(stLive, stInvalid) {
			g.teardown(r, false)
		}
	})
	return nil
}
