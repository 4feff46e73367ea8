package xdp

import (
	"fmt"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The four AF_XDP rings are single-producer, single-consumer queues in memory
// shared with the kernel. Each side keeps cached copies of both indices and
// touches the shared ones only to publish (store-release of its own index) or
// to refresh (load-acquire of the other side's). sync/atomic operations are
// sequentially consistent, which is at least acquire/release on every
// architecture Go supports.
//
// A ring value is owned by exactly one goroutine at a time: the fill and RX
// rings by the receive side (AFXDPLink.rxMu), the TX and completion rings by
// the send side (AFXDPLink.txMu). The one exception is AFXDPLink.RxIdle,
// which loads the RX ring's indices and the fill ring's flags without the
// lock (see retire).

// ring is the part common to descriptor and address rings.
type ring struct {
	producer *uint32
	consumer *uint32
	flags    *uint32
	mask     uint32
	size     uint32

	cachedProd uint32 // producer side: next slot to fill; consumer side: last producer seen
	cachedCons uint32 // producer side: consumer + size; consumer side: next slot to read

	mem []byte // the mapping, for munmap
}

// mapRing maps one ring of fd at the page offset off and points r at its
// shared indices. entrySize is the size of one ring entry.
func (r *ring) mapRing(fd int, off int64, ro unix.XDPRingOffset, size uint32, entrySize uintptr) (unsafe.Pointer, error) {
	length := int(ro.Desc) + int(size)*int(entrySize)
	mem, err := unix.Mmap(fd, off, length, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
	if err != nil {
		return nil, err
	}
	base := unsafe.Pointer(&mem[0])
	r.mem = mem
	r.producer = (*uint32)(unsafe.Add(base, ro.Producer))
	r.consumer = (*uint32)(unsafe.Add(base, ro.Consumer))
	r.flags = (*uint32)(unsafe.Add(base, ro.Flags))
	r.size = size
	r.mask = size - 1
	return unsafe.Add(base, ro.Desc), nil
}

func (r *ring) unmap() error {
	if r.mem == nil {
		return nil
	}
	err := unix.Munmap(r.mem)
	*r = ring{}
	return err
}

// retire replaces the ring's mapping with a private anonymous one of the
// same size and forgets it, as unmap does: the kernel's pages are released
// as by munmap, and a reader still looking at the ring's indices without
// its owner's lock (AFXDPLink.RxIdle) reads zeros, an empty ring that asks
// for no wake-up, instead of faulting. It returns the placeholder, which
// the caller unmaps (unix.Munmap) once no such reader can look. If the
// placeholder cannot be put in place (the kernel is out of memory for the
// mapping), the ring stays mapped, and with it the socket: its queue stays
// bound until the process exits, and Close reports the error. Unmapping
// the ring instead could crash a reader.
func (r *ring) retire() ([]byte, error) {
	if r.mem == nil {
		return nil, nil
	}
	mem := r.mem
	if _, err := unix.MmapPtr(-1, 0, unsafe.Pointer(&mem[0]), uintptr(len(mem)),
		unix.PROT_READ, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_FIXED); err != nil {
		return nil, err
	}
	*r = ring{}
	return mem, nil
}

// needWakeup reports whether the kernel asked to be woken (XDP_USE_NEED_WAKEUP).
func (r *ring) needWakeup() bool { return needWakeup(r.flags) }

// needWakeup reports whether a ring's flags ask for a wake-up.
func needWakeup(flags *uint32) bool {
	return atomic.LoadUint32(flags)&unix.XDP_RING_NEED_WAKEUP != 0
}

// Producer side.

// free returns how many entries may be produced, refreshing the cached
// consumer index only when the cached view has less than want.
func (r *ring) free(want uint32) uint32 {
	n := r.cachedCons - r.cachedProd
	if n >= want {
		return n
	}
	r.cachedCons = atomic.LoadUint32(r.consumer) + r.size
	return r.cachedCons - r.cachedProd
}

// submit publishes the produced entries to the kernel.
func (r *ring) submit() { atomic.StoreUint32(r.producer, r.cachedProd) }

// Consumer side.

// avail returns how many entries may be consumed, refreshing the cached
// producer index when the cached view is empty or smaller than want.
func (r *ring) avail(want uint32) uint32 {
	n := r.cachedProd - r.cachedCons
	if n >= want {
		return n
	}
	r.cachedProd = atomic.LoadUint32(r.producer)
	return r.cachedProd - r.cachedCons
}

// release hands consumed entries back to the kernel.
func (r *ring) release() { atomic.StoreUint32(r.consumer, r.cachedCons) }

// descRing is the RX or TX ring: descriptors pointing into the UMEM.
type descRing struct {
	ring
	descs []unix.XDPDesc
}

func (r *descRing) mmap(fd int, off int64, ro unix.XDPRingOffset, size uint32) error {
	p, err := r.mapRing(fd, off, ro, size, unsafe.Sizeof(unix.XDPDesc{}))
	if err != nil {
		return err
	}
	r.descs = unsafe.Slice((*unix.XDPDesc)(p), size)
	return nil
}

// addrRing is the fill or completion ring: UMEM frame addresses.
type addrRing struct {
	ring
	addrs []uint64
}

func (r *addrRing) mmap(fd int, off int64, ro unix.XDPRingOffset, size uint32) error {
	p, err := r.mapRing(fd, off, ro, size, unsafe.Sizeof(uint64(0)))
	if err != nil {
		return err
	}
	r.addrs = unsafe.Slice((*uint64)(p), size)
	return nil
}

// checkRingSize validates a ring size: a power of two the kernel accepts.
func checkRingSize(name string, n int) error {
	if n < 2 || n > 1<<20 || n&(n-1) != 0 {
		return fmt.Errorf("%s %d: must be a power of two between 2 and 1048576", name, n)
	}
	return nil
}
