package msglayer

import (
	"fmt"

	"github.com/xmx-stack/xmx/regcache"
)

// One-sided operations. A peer may read (Get) or write (Put) memory that an
// endpoint registered, addressed by (region id, key, offset, length); the
// target checks all four against its registry and refuses anything else
// with BadRegion, counted in Counters.RegionRefused. Both use the
// rendezvous machinery: a Get is a pull from the region; a Put sends a
// record, and the target pulls the data into its region and notifies.

// RemoteMem names registered memory at a peer: what a Get or Put needs.
// An endpoint hands it to its peers (in a message) after Register.
type RemoteMem struct {
	Region uint32 // region id
	Key    uint64 // access key
	Offset uint64 // offset of the buffer in the region
	Len    uint64 // length of the buffer
}

// Registration is a buffer registered for remote access.
type Registration struct {
	Mem    RemoteMem
	region *regcache.Region
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
	return Registration{Mem: RemoteMem{Region: r.ID(), Key: r.Key(), Offset: off, Len: uint64(len(buf))}, region: r}, nil
}

// Deregister ends a registration (the cache may keep the region for reuse).
func (e *Endpoint) Deregister(g Registration) {
	if g.region != nil {
		e.cache.Release(g.region)
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
	case kind == kindGet:
		e.stats.Gets++
		if n == 0 {
			e.complete(r, Success)
			break
		}
		e.startPull(r, p, m.Region, uint32(n), now)
	default:
		e.stats.Puts++
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
	mem, reg, err := t.reg.Hold(r.regionID, r.regionKey, r.regionOff, uint64(r.length))
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
