// Package regcache is xmx's memory registration and pin-down cache.
//
// # Registration
//
// A [Registry] (one per endpoint) registers memory: [Registry.Register]
// returns a [Region] with an id, a random 64-bit access key, a base address
// and a length, and the region's pages locked with mlock(2) while it is
// registered. A remote peer reaches a region only through (id, key, offset,
// length), checked by the target with [Registry.Lookup] (or [Registry.Hold]),
// which is O(1), lock-free and allocation-free.
//
// Region ids are (generation << 16 | slot). A slot is reused only after at
// least 1024 other slots have been freed since (FIFO free list behind a
// quarantine) and the 16-bit generation of a slot grows at every reuse and
// never takes the value 0, so an id comes back only after tens of millions
// of registrations, and id 0 is never issued. Even then a stale (id, key)
// pair fails: the key of the new region is a fresh random number.
//
// Page locking is reference-counted per page for the whole process (mlock
// state belongs to the address space, not to a registry): two regions that
// share a page lock it once, and deregistering one of them leaves it locked
// for the other.
//
// # Pin-down cache
//
// A [Cache] sits on a Registry. [Cache.Acquire] returns a registered region
// that covers the buffer's address range (any cached region whose range
// contains it) or registers a new one; [Cache.Release] drops the reference.
// Unused regions (reference count 0) stay registered, on an LRU list, and
// are deregistered (evicted) least recently released first when a new
// registration would exceed [CacheConfig] limits (region count, locked
// bytes). A region in use is never evicted: when the limits cannot be met
// by evicting unused regions, Acquire fails with [ErrLimit] (counted in
// [CacheStats].LimitRefusals); the cache never overcommits, and its locked
// bytes (counted in whole pages, reservations of registrations in flight
// included) never exceed MaxLockedBytes.
//
// # Invalidation
//
// [Cache.Invalidate] tears down every cached region overlapping a range:
// its id stops resolving at once (Lookup returns [ErrNoRegion]), its slot
// is freed and its pages unlocked after in-flight holds drain. A region in
// use at that moment stays valid as a Go object for its holder (who must
// still Release it), but is no longer registered: the teardown happens at
// invalidation, not at the last Release. [Registry.Invalidate] does the
// same for every region of a registry, those made by Register included
// (their owners still Deregister them; that is then not an error).
//
// Memory obtained from [Map] is watched (the seed's "VMA SPY"): [Unmap]
// invalidates every region overlapping the mapping in every Registry (and
// its Cache) that registered memory in it, waits for holds on those regions
// to drain, and only then calls munmap, so a peer's Get on the old region
// is refused, never a crash.
//
// Memory not obtained from Map (Go heap slices, other mmaps) is the caller's
// responsibility: call Invalidate before reusing it for something else (for
// unrelated data a peer must not see) or before unmapping it by other means.
// Go heap memory itself is never freed while referenced, and a Region keeps
// a reference to its slice, so regions on heap memory stay safe to access
// for as long as they are registered.
//
// Lookup returns a sub-slice of the region; for heap memory it stays safe
// forever (the GC keeps it alive). For Map memory a concurrent Unmap can
// unmap it under the caller: code that may race with Unmap must use
// [Registry.Hold] and [Region.Unhold] around its access instead (Unmap waits
// for holds to drain).
//
// # Zero-length buffers
//
// Register and Acquire accept empty buffers: the result is a region of
// length 0, with an id and a key, and nothing locked. Lookup accepts only
// (off 0, length 0) on it. The cache never reuses such a region: each
// Acquire of an empty buffer registers one (it counts against MaxRegions)
// and its Release deregisters it.
//
// # Ownership and lock ordering
//
// A Registry owns its slot table, ids and counters; a Cache owns the cache
// fields of the regions it registered (reference counts, LRU links, index
// membership) and its limit accounting. A region's registration state is
// an atomic word (live, invalid, dead): whoever moves it off live performs
// the teardown exactly once (unpublish and free the slot, drain holds,
// unlock pages) and, for a cache region, then settles the cache's
// accounting; for cache regions that move is always made under Cache.mu.
// Package state: the page lock counts (pages.mu) and the table of mappings
// made by Map (vmaMu, and per mapping its subscriber set, usersMu).
//
// Lock nesting, the only one there is:
//
//	vmaMu (read in Register; write in Map and Unmap bookkeeping)
//	  → pages.mu, Registry.mu, mapping.usersMu
//
// Cache.mu, Registry.mu and pages.mu are never held together: Cache.mu is
// released before any registration, teardown or eviction (the budget is
// reserved in advance, the region moved off live under it), so no lock is
// held across mlock/munlock except pages.mu (and vmaMu read), and none
// while teardown waits for holds to drain. Lookup, Hold and Unhold take no
// lock. A goroutine holding a region (Hold) must not call Deregister,
// Acquire, Release, Invalidate, Unmap or Close before Unhold: a teardown
// they trigger may wait for that very hold.

package regcache
