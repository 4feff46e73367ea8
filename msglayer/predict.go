package msglayer

import (
	"encoding/binary"

	"github.com/xmx-stack/xmx/xdp"
)

// Header prediction (Van Jacobson's, for TCP): most frames a busy
// endpoint gets are the next message from the peer it last heard from,
// whole in one eager frame, for a receive that is posted. predictEager
// takes such a frame straight from its bytes, with the checks and the
// effects of the general path (dispatch, handleOne, onReliable, process,
// startEager) for it and nothing else: it decodes no header value, looks
// up no peer, and takes no turn through the frame type switches. Any
// other frame, or one that fails a check, goes the general way.

// predictEager handles frame f if it is an in-order eager message in one
// frame from the endpoint's last peer (lastPeer), for a posted receive,
// and reports whether it did. When it reports false it has changed
// nothing.
//
// +checklocks:g.mu
func (g *engine) predictEager(f []byte, now int64) bool {
	// The frame: ours (dispatch, header.decode, addressedToUs), an eager
	// frame whose payload fits.
	if len(f) < hdrLen+eagerHdrLen || binary.BigEndian.Uint16(f[12:14]) != g.ethType ||
		f[6]&1 != 0 || [6]byte(f[0:6]) != g.mac {
		return false
	}
	b := f[xdp.EthHeaderLen:hdrLen]
	n := int(binary.BigEndian.Uint16(b[22:]))
	if b[0] != wireVersion || frameType(b[1]) != tEager || hdrLen+eagerHdrLen+n > len(f) {
		return false
	}
	// The endpoint, and the peer: the pair as we know it (handleOne),
	// the frame the next in sequence, nothing held out of order or being
	// reassembled, no refused message being converted (onReliable,
	// process).
	e := g.eps[b[2]]
	if e == nil || e.closed {
		return false
	}
	p := e.lastPeer
	if p == nil || p.addr.EP != b[3] || p.addr.MAC != [6]byte(f[6:12]) ||
		!p.connected || p.local != nil ||
		binary.BigEndian.Uint32(b[4:]) != p.localID || binary.BigEndian.Uint32(b[8:]) != p.remoteID ||
		binary.BigEndian.Uint32(b[12:]) != p.expected ||
		p.oooCount != 0 || p.in.active || p.refused {
		return false
	}
	// The message: whole in this frame, and a receive takes it (arrive
	// changes nothing when none does).
	var eh eagerHdr
	if eh.decode(f[hdrLen:hdrLen+eagerHdrLen], n) != nil || eh.msgLen != uint32(n) || eh.offset != 0 {
		return false
	}
	r := e.match.arrive(eh.match)
	if r == nil {
		return false
	}
	e.stats.FramesIn++
	e.stats.Predicted++
	e.stats.BytesIn += uint64(len(f))
	e.heard(p, tEager, b[20], binary.BigEndian.Uint32(b[16:]), now)
	e.startEager(p, r, &eh, f[hdrLen+eagerHdrLen:hdrLen+eagerHdrLen+n])
	p.expected++
	e.consumed(p, false, false, now)
	return true
}
