package regcache

import (
	"sync"
	"weak"

	"golang.org/x/sys/unix"
)

// The mappings made by Map, and who registered memory in them: the
// user-level counterpart of the seed's VMA SPY. Registries subscribe to a
// mapping when they register memory in it (weakly: a registry that became
// garbage is simply skipped), and Unmap invalidates their regions before
// munmap.
var (
	vmaMu sync.RWMutex // guards vmaMaps and mapping.dying
	// vmaMaps is sorted by start; mappings do not overlap.
	vmaMaps []*mapping
)

type mapping struct {
	start, end uintptr
	mem        []byte // as returned by unix.Mmap (unix.Munmap wants it)
	dying      bool   // Unmap has begun: no new registration in it

	usersMu sync.Mutex // leaf lock, taken under vmaMu (read)
	users   map[weak.Pointer[Registry]]struct{}
}

// vmaFind returns the index of the first mapping ending after a.
func vmaFind(a uintptr) int {
	lo, hi := 0, len(vmaMaps)
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if vmaMaps[m].end <= a {
			lo = m + 1
		} else {
			hi = m
		}
	}
	return lo
}

// vmaWatch subscribes g to every mapping overlapping [lo, hi), or fails
// if one of them is being unmapped. Called with vmaMu read-locked.
func vmaWatch(g *Registry, lo, hi uintptr) error {
	for i := vmaFind(lo); i < len(vmaMaps) && vmaMaps[i].start < hi; i++ {
		if vmaMaps[i].dying {
			return ErrUnmapped
		}
	}
	for i := vmaFind(lo); i < len(vmaMaps) && vmaMaps[i].start < hi; i++ {
		m := vmaMaps[i]
		w := weak.Make(g)
		m.usersMu.Lock()
		if m.users == nil {
			m.users = make(map[weak.Pointer[Registry]]struct{})
		}
		m.users[w] = struct{}{}
		m.usersMu.Unlock()
	}
	return nil
}

// Map returns length bytes of fresh anonymous memory (read-write, private,
// page-aligned, zeroed) whose unmapping, through Unmap, invalidates every
// region registered in it first.
func Map(length int) ([]byte, error) {
	if length <= 0 {
		return nil, opErr(unix.EINVAL, "map %d bytes", length)
	}
	n := int(pageUp(uintptr(length)))
	mem, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return nil, opErr(err, "map %d bytes: mmap", length)
	}
	m := &mapping{start: addrOf(mem), mem: mem}
	m.end = m.start + uintptr(n)
	vmaMu.Lock()
	// Lock counts left on this range belong to memory that is gone.
	pages.forget(m.start, m.end)
	i := vmaFind(m.start)
	vmaMaps = append(vmaMaps, nil)
	copy(vmaMaps[i+1:], vmaMaps[i:])
	vmaMaps[i] = m
	vmaMu.Unlock()
	return mem[:length], nil
}

// Unmap unmaps memory returned by Map (b must start where Map's result
// started; the whole mapping goes). Before munmap it invalidates every
// region overlapping the mapping in every Registry (and Cache) that
// registered memory in it and waits for holds on them to drain, so a
// remote access to one of them fails with ErrNoRegion instead of touching
// unmapped memory. Regions in use become invalid; their owners still
// release them. The caller must not touch b afterwards.
func Unmap(b []byte) error {
	a := addrOf(b)
	vmaMu.Lock()
	i := vmaFind(a)
	if i == len(vmaMaps) || vmaMaps[i].start != a {
		vmaMu.Unlock()
		return opErr(ErrNotMapped, "unmap %d bytes at %#x", len(b), a)
	}
	m := vmaMaps[i]
	if m.dying {
		vmaMu.Unlock()
		return opErr(ErrUnmapped, "unmap %d bytes at %#x: already being unmapped", len(b), a)
	}
	m.dying = true
	vmaMu.Unlock()

	// No registration can enter the mapping any more; every one that did
	// is published and its registry is in users.
	m.usersMu.Lock()
	users := make([]weak.Pointer[Registry], 0, len(m.users))
	for w := range m.users {
		users = append(users, w)
	}
	m.usersMu.Unlock()
	for _, w := range users {
		if g := w.Value(); g != nil {
			g.invalidateRange(m.start, m.end)
			g.waitTeardowns(m.start, m.end)
		}
	}

	vmaMu.Lock()
	defer vmaMu.Unlock()
	pages.forget(m.start, m.end)
	err := unix.Munmap(m.mem)
	if err != nil {
		m.dying = false // still mapped: leave it usable
		return opErr(err, "unmap %d bytes at %#x: munmap", len(m.mem), m.start)
	}
	i = vmaFind(m.start)
	copy(vmaMaps[i:], vmaMaps[i+1:])
	vmaMaps[len(vmaMaps)-1] = nil
	vmaMaps = vmaMaps[:len(vmaMaps)-1]
	return nil
}
