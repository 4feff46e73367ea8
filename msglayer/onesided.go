package msglayer

import (
	"errors"
	"fmt"

	"github.com/xmx-stack/xmx/regcache"
)

// One-sided operations. A peer may read (Get) or write (Put) memory that an
// endpoint registered, addressed by (registration id, key, offset,
// length); the target checks all four against the registration and its
// region's registry and refuses anything else with BadRegion, counted in
// Counters.RegionRefused. A registration reaches its buffer only, not the
// rest of the cache region (pages) it lies in, and ends at Deregister. Both use the
// rendezvous machinery: a Get is a pull from the region; a Put sends a
// record, and the target pulls the data into its region and notifies.

// RemoteMem names registered memory at a peer: what a Get or Put needs.
// An endpoint hands it to its peers (in a message) after Register.
type RemoteMem struct {
	Region uint32 // registration id
	Key    uint64 // access key
	Offset uint64 // offset of the buffer in the registration (0 from Register)
	Len    uint64 // length of the buffer
}

// Registration is a buffer registered for remote access.
type Registration struct {
	Mem    RemoteMem
	region *regcache.Region
}

// window is one registration: bytes [off, off+n) of a cache region
// (registry id and key), reached by peers as (id, key) of its own.
type window struct {
	region *regcache.Region
	regID  uint32
	regKey uint64
	off, n uint64
	key    uint64
}

var errNoWindow = errors.New("no such registration, wrong key, or out of its bounds")

// windowOf translates a peer's access (registration id, key, offset,
// length) to the region's, or fails.
//
// +checklocks:e.eng.mu
func (e *Endpoint) windowOf(id uint32, key, off, n uint64) (regID uint32, regKey, regOff uint64, err error) {
	w := e.windows[id]
	if w == nil || w.key != key || off > w.n || n > w.n-off {
		return 0, 0, 0, errNoWindow
	}
	return w.regID, w.regKey, w.off + off, nil
}

// regLookup checks a peer's access to a registration.
//
// +checklocks:e.eng.mu
func (e *Endpoint) regLookup(id uint32, key, off, n uint64) error {
	regID, regKey, regOff, err := e.windowOf(id, key, off, n)
	if err == nil {
		_, err = e.reg.Lookup(regID, regKey, regOff, n)
	}
	return err
}

// regHold is regLookup holding the region for the copy (regcache Hold).
//
// +checklocks:e.eng.mu
func (e *Endpoint) regHold(id uint32, key, off, n uint64) ([]byte, *regcache.Region, error) {
	regID, regKey, regOff, err := e.windowOf(id, key, off, n)
	if err != nil {
		return nil, nil, err
	}
	return e.reg.Hold(regID, regKey, regOff, n)
}

// Register makes buf accessible to connected peers through r.Mem, through
// the endpoint's pin-down cache: registering a buffer again (or a part of
// a registered one) is a cache hit. The memory stays locked and
// accessible until Deregister; a region invalidated meanwhile (its memory
// unmapped through regcache.Unmap, or Invalidate) refuses remote accesses.
func (e *Endpoint) Register(buf []byte) (Registration, error) {
	r, err := e.cache.Acquire(buf)
	if err != nil {
		return Registration{}, fmt.Errorf("msglayer: register %d bytes: %w", len(buf), err)
	}
	off, _ := r.Offset(buf)
	w := &window{region: r, regID: r.ID(), regKey: r.Key(), off: off, n: uint64(len(buf))}
	g := e.eng
	g.mu.Lock()
	w.key = g.randKey() | 1
	id := freeID(e, e.windows)
	e.windows[id] = w
	g.mu.Unlock()
	return Registration{Mem: RemoteMem{Region: id, Key: w.key, Len: w.n}, region: r}, nil
}

// Deregister ends a registration: peers reach it no more (the cache may
// keep the region for reuse).
func (e *Endpoint) Deregister(reg Registration) {
	if reg.region == nil {
		return
	}
	g := e.eng
	g.mu.Lock()
	w := e.windows[reg.Mem.Region]
	live := w != nil && w.key == reg.Mem.Key
	if live {
		delete(e.windows, reg.Mem.Region)
	}
	g.mu.Unlock()
	// A second Deregister of reg finds nothing and releases nothing: its
	// region may be another live registration's too.
	if live {
		e.cache.Release(reg.region)
	}
}

// Invalidate makes every registration overlapping buf unreachable by
// peers at once: call it before reusing registered Go memory for
// something else.
func (e *Endpoint) Invalidate(buf []byte) int {
	if len(buf) == 0 {
		return 0
	}
	return e.cache.Invalidate(uintptrOf(buf), len(buf))
}

// RegCache returns the endpoint's pin-down cache (for its statistics).
func (e *Endpoint) RegCache() *regcache.Cache { return e.cache }

// IGet reads len(dst) bytes of the peer's registered memory m, starting at
// off within m, into dst.
func (e *Endpoint) IGet(peer Addr, m RemoteMem, off uint64, dst [][]byte, ctx any) (Request, error) {
	return e.oneSided(peer, m, off, dst, ctx, kindGet)
}

// IPut writes the concatenation of src into the peer's registered memory
// m, starting at off within m.
func (e *Endpoint) IPut(peer Addr, m RemoteMem, off uint64, src [][]byte, ctx any) (Request, error) {
	return e.oneSided(peer, m, off, src, ctx, kindSend)
}

func (e *Endpoint) oneSided(peer Addr, m RemoteMem, off uint64, segs [][]byte, ctx any, kind reqKind) (Request, error) {
	n, err := checkSegs(segs)
	if err != nil {
		return Request{}, err
	}
	if off+uint64(n) < off || off+uint64(n) > m.Len {
		return Request{}, &ArgError{Arg: fmt.Sprintf("offset %d + length %d", off, n), Err: fmt.Errorf("outside the remote buffer of %d bytes", m.Len)}
	}
	// The block's place in the region: one that wraps past 2^64 would
	// land at the region's start, which the target cannot tell apart.
	if at := m.Offset + off; at < m.Offset || at+uint64(n) < at {
		return Request{}, &ArgError{Arg: fmt.Sprintf("remote offset %d + offset %d + length %d", m.Offset, off, n), Err: errors.New("past 2^64")}
	}
	p, err := e.lockPeer(peer, "one-sided operation with")
	if err != nil {
		return Request{}, err
	}
	g := e.eng
	now := g.readClock()
	r := e.newRequest(kind, ctx)
	r.peer, r.segs, r.length = p, segs, n
	r.regionID, r.regionKey, r.regionOff = m.Region, m.Key, m.Offset+off
	r.status.Source, r.status.MsgLen = peer, n
	h := Request{r, r.gen}
	switch {
	case p.dead:
		e.complete(r, Unreachable)
	case p.local != nil:
		e.oneSidedLocal(p.local, r)
	case kind == kindGet && n > 0:
		e.stats.Gets++
		e.startPull(r, p, m.Region, uint32(n), now)
	default:
		if kind == kindGet {
			// Nothing to pull, but the target must still check the
			// region: a zero-length Put asks it to (and it counts the
			// check among its PutsIn).
			e.stats.Gets++
		} else {
			e.stats.Puts++
		}
		r.put, r.rndv = true, true
		e.offerRndv(p, r)
		if p.sendHead != nil || !e.frameMessage(p, r, now) {
			p.pushSend(r)
		}
	}
	g.flushAndUnlock()
	return h, nil
}

// oneSidedLocal performs a Get or Put on an endpoint of the same engine:
// a checked copy.
//
// +checklocks:e.eng.mu
func (e *Endpoint) oneSidedLocal(t *Endpoint, r *request) {
	if r.kind == kindGet {
		e.stats.Gets++
	} else {
		e.stats.Puts++
	}
	if code, gone := localGone(t, e); gone {
		e.complete(r, code) // as a send (arriveLocal)
		return
	}
	if r.kind != kindGet {
		t.stats.PutsIn++ // refused or not, as onPut counts them
	}
	mem, reg, err := t.regHold(r.regionID, r.regionKey, r.regionOff, uint64(r.length))
	if err != nil {
		t.stats.RegionRefused++
		e.complete(r, BadRegion)
		return
	}
	if r.kind == kindGet {
		copyToSegs(r.segs, 0, mem)
	} else {
		copyFromSegs(mem, r.segs, 0)
	}
	reg.Unhold()
	r.status.XferLen = r.length
	e.complete(r, Success)
}
