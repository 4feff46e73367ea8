package msglayer

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/xmx-stack/xmx/xdp"
)

// Fuzz tests of the wire decoders and of endpoints fed arbitrary frames.
//
//	go test -run XXX -fuzz FuzzDecodeHeader ./msglayer
//	go test -run XXX -fuzz FuzzTypeHeaders ./msglayer
//	go test -run XXX -fuzz FuzzEndpointFrames -fuzzminimizetime 10s ./msglayer
//
// FuzzEndpointFrames runs two endpoints per input (a few hundred µs);
// every input that finds new coverage is minimised for -fuzzminimizetime
// (default 60 s), during which the exec counter stands still: a shorter
// minimisation time keeps the fuzzer fuzzing.

// exact returns a copy of b whose capacity is its length, so that reading
// past the frame panics instead of reading stale buffer bytes.
func exact(b []byte) []byte {
	c := make([]byte, len(b))
	copy(c, b)
	return c
}

// maxTypeHdrLen is the longest type header.
var maxTypeHdrLen = slices.Max(typeHdrLen[:])

// TestPeerPutHeader checks that peer.putHeader, which writes a frame's
// headers from the peer's fields, writes what putHeader writes from the
// header value of the same fields, and that it decodes back to them: the
// two writers of the common header stay in step.
func TestPeerPutHeader(t *testing.T) {
	fp := newFuzzPair(t, 0, false, false)
	a, b := fp.a, fp.b
	g := a.eng
	g.mu.Lock()
	defer g.mu.Unlock()
	p := a.peers[b.addr]
	p.expected = 0x01020304
	win := g.recvWindow
	g.recvWindow = 0x42
	defer func() { g.recvWindow = win }()
	for _, c := range []struct {
		t       frameType
		seq     uint32
		flags   uint8
		payload int
	}{{tEager, 7, 0, 100}, {tAck, 0, flagWantAck, 8}, {tPullReply, 0, 0, 1400}, {tRndv, 0xfffffffe, flagSync, 0}} {
		got, want := make([]byte, hdrLen), make([]byte, hdrLen)
		p.putHeader(got, c.t, c.seq, c.flags, c.payload)
		h := header{typ: c.t, dstEP: p.addr.EP, srcEP: a.id, dstSession: p.remoteID, srcSession: p.localID,
			seq: c.seq, ack: p.expected, window: g.recvWindow, flags: c.flags, payloadLen: c.payload}
		putHeader(want, &p.addr.MAC, &g.mac, g.ethType, &h)
		if !bytes.Equal(got, want) {
			t.Fatalf("%v: peer.putHeader wrote\n% x\nputHeader\n% x", c.t, got, want)
		}
		var d header
		if err := d.decode(append(got, make([]byte, typeHdrLen[c.t]+c.payload)...)); err != nil || d != h {
			t.Fatalf("%v: decoded %+v (%v), want %+v", c.t, d, err, h)
		}
		if p.saidWin != g.recvWindow {
			t.Fatalf("%v: saidWin %d, want %d", c.t, p.saidWin, g.recvWindow)
		}
	}
}

func FuzzDecodeHeader(f *testing.F) {
	for _, fr := range seedFrames(f) {
		f.Add(fr)
	}
	f.Add([]byte{})
	f.Add(make([]byte, hdrLen))
	f.Fuzz(func(t *testing.T, data []byte) {
		data = exact(data)
		h, err := decodeHeader(data)

		// The expected verdict, computed independently.
		var want error
		switch {
		case len(data) < hdrLen:
			want = errShortFrame
		case data[xdp.EthHeaderLen] != wireVersion:
			want = errBadVersion
		case data[xdp.EthHeaderLen+1] == 0 || data[xdp.EthHeaderLen+1] > byte(maxFrameType):
			want = errBadType
		default:
			pl := int(binary.BigEndian.Uint16(data[xdp.EthHeaderLen+22:]))
			if hdrLen+typeHdrLen[data[xdp.EthHeaderLen+1]]+pl > len(data) {
				want = errBadLength
			}
		}
		if err != want {
			t.Fatalf("decodeHeader(% x) = %v, want %v", data, err, want)
		}
		if err != nil {
			return
		}
		b := data[xdp.EthHeaderLen:]
		wantH := header{
			typ:        frameType(b[1]),
			dstEP:      b[2],
			srcEP:      b[3],
			dstSession: binary.BigEndian.Uint32(b[4:]),
			srcSession: binary.BigEndian.Uint32(b[8:]),
			seq:        binary.BigEndian.Uint32(b[12:]),
			ack:        binary.BigEndian.Uint32(b[16:]),
			window:     b[20],
			flags:      b[21],
			payloadLen: int(binary.BigEndian.Uint16(b[22:])),
		}
		if h != wantH {
			t.Fatalf("decoded %+v, want %+v", h, wantH)
		}
		_ = h.typ.String()
		_ = h.typ.reliable()

		// The type header and payload are within the frame.
		th, payload := typeHdr(data, &h)
		n := typeHdrLen[h.typ]
		if len(th) != n || len(payload) != h.payloadLen {
			t.Fatalf("typeHdr: %d+%d bytes, want %d+%d", len(th), len(payload), n, h.payloadLen)
		}
		if !bytes.Equal(th, data[hdrLen:hdrLen+n]) || !bytes.Equal(payload, data[hdrLen+n:hdrLen+n+h.payloadLen]) {
			t.Fatal("typeHdr returned bytes from outside the frame")
		}
		if l := frameLen(h.typ, h.payloadLen); l < hdrLen+n+h.payloadLen || l < xdp.MinFrameLen {
			t.Fatalf("frameLen(%v, %d) = %d", h.typ, h.payloadLen, l)
		}

		// Re-encoding gives the same bytes, which decode to the same header.
		out := make([]byte, len(data))
		rest := putHeader(out, (*[6]byte)(data[0:6]), (*[6]byte)(data[6:12]), binary.BigEndian.Uint16(data[12:14]), &h)
		if len(rest) != len(data)-hdrLen {
			t.Fatalf("putHeader returned %d bytes, want %d", len(rest), len(data)-hdrLen)
		}
		copy(rest, data[hdrLen:])
		if !bytes.Equal(out, data) {
			t.Fatalf("re-encoded\n% x\nwant\n% x", out, data)
		}
		h2, err := decodeHeader(out)
		if err != nil || h2 != h {
			t.Fatalf("round trip: %+v, %v; want %+v", h2, err, h)
		}
		// setAck changes the ack and nothing else.
		setAck(out, ^h.ack)
		h3, err := decodeHeader(out)
		h.ack = ^h.ack
		if err != nil || h3 != h || !bytes.Equal(out[hdrLen:], data[hdrLen:]) {
			t.Fatalf("setAck: %+v, %v; want %+v", h3, err, h)
		}
	})
}

func FuzzTypeHeaders(f *testing.F) {
	for _, fr := range seedFrames(f) {
		if h, err := decodeHeader(fr); err == nil {
			th, _ := typeHdr(fr, &h)
			f.Add(uint8(h.typ), exact(th), uint16(h.payloadLen))
		}
	}
	f.Add(uint8(tEager), make([]byte, 16), uint16(1))
	f.Add(uint8(tEager), []byte{0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, uint16(1))
	f.Add(uint8(tPut), bytes.Repeat([]byte{0xff}, 32), uint16(0))
	f.Fuzz(func(t *testing.T, typ uint8, in []byte, payloadLen uint16) {
		b := make([]byte, maxTypeHdrLen)
		copy(b, in)
		be := binary.BigEndian
		out := make([]byte, maxTypeHdrLen)

		// Eager: the fragment must lie within the message.
		var e eagerHdr
		err := e.decode(b[:eagerHdrLen], int(payloadLen))
		if e.match != be.Uint64(b) || e.msgLen != be.Uint32(b[8:]) || e.offset != be.Uint32(b[12:]) {
			t.Fatalf("eager decode: %+v", e)
		}
		if bad := uint64(e.offset)+uint64(payloadLen) > uint64(e.msgLen); bad != (err != nil) {
			t.Fatalf("eager offset %d + payload %d, msgLen %d: err %v", e.offset, payloadLen, e.msgLen, err)
		}
		e.put(out)
		var e2 eagerHdr
		e2.decode(out[:eagerHdrLen], 0)
		if !bytes.Equal(out[:eagerHdrLen], b[:eagerHdrLen]) || e2 != e {
			t.Fatalf("eager round trip: %+v -> % x -> %+v", e, out[:eagerHdrLen], e2)
		}

		var r, r2 rndvHdr
		r.decode(b[:rndvHdrLen])
		clear(out)
		r.put(out)
		r2.decode(out[:rndvHdrLen])
		if r.match != be.Uint64(b) || r.msgLen != be.Uint32(b[8:]) || r.rndvID != be.Uint32(b[12:]) ||
			!bytes.Equal(out[:rndvHdrLen], b[:rndvHdrLen]) || r2 != r {
			t.Fatalf("rndv round trip: %+v -> % x -> %+v", r, out[:rndvHdrLen], r2)
		}

		var n, n2 notifyHdr
		n.decode(b[:notifyHdrLen])
		clear(out)
		n.put(out)
		n2.decode(out[:notifyHdrLen])
		if n.rndvID != be.Uint32(b) || n.xferLen != be.Uint32(b[4:]) || n.code != Code(b[8]) ||
			!bytes.Equal(out[:9], b[:9]) || !bytes.Equal(out[9:notifyHdrLen], make([]byte, notifyHdrLen-9)) || n2 != n {
			t.Fatalf("notify round trip: %+v -> % x -> %+v", n, out[:notifyHdrLen], n2)
		}
		_ = n.code.String()
		_ = n.code.Err()

		var p, p2 pullReqHdr
		p.decode(b[:pullReqHdrLen])
		clear(out)
		p.put(out)
		p2.decode(out[:pullReqHdrLen])
		if p.rndvID != be.Uint32(b) || p.pullID != be.Uint32(b[4:]) || p.offset != be.Uint32(b[8:]) ||
			p.length != be.Uint32(b[12:]) || p.mask != be.Uint32(b[16:]) || p.frameBytes != be.Uint32(b[20:]) ||
			!bytes.Equal(out[:pullReqHdrLen], b[:pullReqHdrLen]) || p2 != p {
			t.Fatalf("pull request round trip: %+v -> % x -> %+v", p, out[:pullReqHdrLen], p2)
		}

		var u, u2 putHdr
		u.decode(b[:putHdrLen])
		clear(out)
		u.put(out)
		u2.decode(out[:putHdrLen])
		if u.region != be.Uint32(b) || u.putID != be.Uint32(b[4:]) || u.key != be.Uint64(b[8:]) ||
			u.offset != be.Uint64(b[16:]) || u.length != be.Uint32(b[24:]) ||
			!bytes.Equal(out[:28], b[:28]) || !bytes.Equal(out[28:putHdrLen], make([]byte, putHdrLen-28)) || u2 != u {
			t.Fatalf("put round trip: %+v -> % x -> %+v", u, out[:putHdrLen], u2)
		}

		var q, q2 pullReplyHdr
		q.decode(b[:pullReplyHdrLen])
		clear(out)
		q.put(out)
		q2.decode(out[:pullReplyHdrLen])
		if q.pullID != be.Uint32(b) || q.offset != be.Uint32(b[4:]) || !bytes.Equal(out[:pullReplyHdrLen], b[:pullReplyHdrLen]) || q2 != q {
			t.Fatalf("pull reply round trip: %+v -> % x -> %+v", q, out[:pullReplyHdrLen], q2)
		}

		var a, a2 ackEntry
		a.decode(b[:ackEntryLen])
		clear(out)
		a.put(out)
		a2.decode(out[:ackEntryLen])
		if a.dstEP != b[0] || a.dstSession != be.Uint32(b[1:]) || a.srcSession != be.Uint32(b[5:]) || a.ack != be.Uint32(b[9:]) ||
			!bytes.Equal(out[:ackEntryLen], b[:ackEntryLen]) || a2 != a {
			t.Fatalf("ack entry round trip: %+v -> % x -> %+v", a, out[:ackEntryLen], a2)
		}

		v, c := getU32U8(b[:8])
		clear(out)
		putU32U8(out, v, c)
		if v != be.Uint32(b) || c != b[4] || !bytes.Equal(out[:5], b[:5]) || !bytes.Equal(out[5:8], []byte{0, 0, 0}) {
			t.Fatalf("u32u8 round trip: %d %d -> % x", v, c, out[:8])
		}
		x, y := getU32U32(b[:8])
		clear(out)
		putU32U32(out, x, y)
		if x != be.Uint32(b) || y != be.Uint32(b[4:]) || !bytes.Equal(out[:8], b[:8]) {
			t.Fatalf("u32u32 round trip: %d %d -> % x", x, y, out[:8])
		}

		key, connID, mtu := getConnect(b[:connectHdrLen])
		clear(out)
		putConnect(out, key, connID, mtu)
		if key != be.Uint32(b) || connID != be.Uint32(b[4:]) || mtu != int(be.Uint16(b[8:])) ||
			!bytes.Equal(out[:10], b[:10]) || !bytes.Equal(out[10:connectHdrLen], []byte{0, 0}) {
			t.Fatalf("connect round trip: %d %d %d -> % x", key, connID, mtu, out[:connectHdrLen])
		}
		connID, code, mtu := getConnReply(b[:connReplyHdrLen])
		clear(out)
		putConnReply(out, connID, code, mtu)
		if connID != be.Uint32(b) || code != Code(b[4]) || mtu != int(be.Uint16(b[8:])) ||
			!bytes.Equal(out[:5], b[:5]) || !bytes.Equal(out[5:8], []byte{0, 0, 0}) ||
			!bytes.Equal(out[8:10], b[8:10]) || !bytes.Equal(out[10:connReplyHdrLen], []byte{0, 0}) {
			t.Fatalf("connect reply round trip: %d %d %d -> % x", connID, code, mtu, out[:connReplyHdrLen])
		}
		// MTUs beyond 16 bits are clamped, not wrapped.
		putConnect(out, 1, 2, 70000)
		if _, _, m := getConnect(out); m != 0xffff {
			t.Fatalf("connect with MTU 70000 carries %d", m)
		}
		if m := negotiateMTU(1500, mtu); m > 1500 || (mtu >= 576 && m != min(1500, mtu)) {
			t.Fatalf("negotiateMTU(1500, %d) = %d", mtu, m)
		}

		// A whole frame of type typ: decodeHeader and typeHdr give the
		// type's decoder a header long enough for what it reads.
		ft := frameType(typ)
		if ft == 0 || ft > maxFrameType {
			return
		}
		pl := int(payloadLen) % 1400
		fr := make([]byte, hdrLen+typeHdrLen[ft]+pl)
		h := header{typ: ft, payloadLen: pl}
		copy(putHeader(fr, &[6]byte{}, &[6]byte{}, xdp.DefaultEtherType, &h), b)
		dh, err := decodeHeader(fr)
		if err != nil || dh != h {
			t.Fatalf("frame of type %v: %+v, %v", ft, dh, err)
		}
		th, payload := typeHdr(fr, &dh)
		th = th[:len(th):len(th)]
		if len(payload) != pl {
			t.Fatalf("frame of type %v: payload %d bytes, want %d", ft, len(payload), pl)
		}
		switch ft {
		case tEager:
			var e eagerHdr
			e.decode(th, len(payload))
		case tRndv:
			var r rndvHdr
			r.decode(th)
		case tNotify:
			var n notifyHdr
			n.decode(th)
		case tPullReq:
			var p pullReqHdr
			p.decode(th)
		case tPullReply:
			var p pullReplyHdr
			p.decode(th)
		case tPut:
			var p putHdr
			p.decode(th)
		case tNack:
			getU32U8(th)
		case tConnect:
			getConnect(th)
		case tConnectReply:
			getConnReply(th)
		}
		if ft == tAcks || ft == tPullReq { // their payload: ack entries
			var a ackEntry
			for e := payload; len(e) >= ackEntryLen; e = e[ackEntryLen:] {
				a.decode(e)
			}
		}
	})
}

// ---------------------------------------------------------------------
// Endpoints fed arbitrary frames.
//
// Two endpoints (A: id 1 on link 0, B: id 2 on link 1) on an in-memory
// pair are made deterministic: fixed sessions and id counters, a manual
// clock, and no background driving (the test drives both engines itself).
// The fuzz input is a script of operations: frames injected straight into
// an engine's dispatch (forged with the right addresses and sessions from
// structured fields, or raw bytes), API calls (sends, receives, cancels,
// disconnects, registrations, one-sided operations), losses, clock ticks
// and pumps (both engines process what they received until the link is
// quiet). Afterwards the endpoints must still exchange a message both
// ways; they are first reconnected only if the input legitimately broke
// their session (a forged frame the endpoint accepted, a disconnect, a
// clock jump beyond GiveUp). Closing them must complete every request.

const (
	fuzzSessA, fuzzSessB = 0xa1a1a1a1, 0xb2b2b2b3
	fuzzKeyA, fuzzKeyB   = 0xa, 0xb
)

// recLink is a link that records the frames sent through it and can drop
// some.
type recLink struct {
	xdp.Link
	mu     sync.Mutex
	record bool
	sent   []recFrame
	n      int          // frames sent so far
	drop   map[int]bool // numbers of frames to drop
	order  *atomic.Int64
	dirty  int // frames sent whose padding was not all zeros
}

// recFrame is a frame recorded with its position in the capture.
type recFrame struct {
	n     int64
	frame []byte
}

// lose drops the frame sent after skip more frames.
func (l *recLink) lose(skip int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.drop == nil {
		l.drop = map[int]bool{}
	}
	l.drop[l.n+skip] = true
}

func (l *recLink) Send(frames [][]byte) (int, error) {
	l.mu.Lock()
	for _, f := range frames {
		if h, err := decodeHeader(f); err == nil {
			if end := hdrLen + typeHdrLen[h.typ] + h.payloadLen; slices.ContainsFunc(f[end:], func(b byte) bool { return b != 0 }) {
				l.dirty++
			}
		}
	}
	out := frames
	if l.record || len(l.drop) > 0 {
		out = make([][]byte, 0, len(frames))
		for i, f := range frames {
			if l.record {
				l.sent = append(l.sent, recFrame{l.order.Add(1), bytes.Clone(f)})
			}
			if l.drop[l.n+i] {
				delete(l.drop, l.n+i)
				continue
			}
			out = append(out, f)
		}
	}
	l.n += len(frames)
	l.mu.Unlock()
	if n, err := l.Link.Send(out); err != nil {
		return n, err
	}
	return len(frames), nil
}

func (l *recLink) Wake() {
	if w, ok := l.Link.(xdp.Waker); ok {
		w.Wake()
	}
}

// Operations of the script. Each takes one argument byte, except the
// frame operations (see forge, and a u16 length then the bytes for raw).
const (
	fopForgeB     = iota // forge a frame from A to B from structured fields
	fopForgeA            // forge a frame from B to A
	fopRawB              // raw bytes to B's engine
	fopRawA              // raw bytes to A's engine
	fopPump              // process everything in flight
	fopTick              // advance the clock, run timers, pump
	fopSendAB            // A sends to B
	fopSendBA            // B sends to A
	fopRecvB             // B posts a receive
	fopRecvA             // A posts a receive
	fopDisconnect        // one side disconnects
	fopLoss              // one of the next 8 frames one side sends is lost
	fopCancel            // cancel the oldest receive of one side
	fopRegister          // one side registers a buffer for remote access
	fopOneSided          // a Get or Put into the other side's registered buffer
	fopStep              // one side alone processes what it received
	fopN
)

var (
	fuzzMatches  = [...]uint64{1, 2, 0x101, 0xf0f0, 0, ^uint64(0), 0x42, 0x100000001}
	fuzzMasks    = [...]uint64{^uint64(0), 0, 0xff, 0xf0f0}
	fuzzSizes    = [...]int{0, 100, 3000, 40000}
	fuzzBufSizes = [...]int{64, 0, 3000, 40000}
	fuzzRegSizes = [...]int{4096, 100, 48000, 1}
	fuzzTicks    = [...]time.Duration{100 * time.Microsecond, 2 * time.Millisecond, 20 * time.Millisecond,
		300 * time.Millisecond, 2 * time.Second, 6 * time.Second}
)

// fuzzTrace logs the operations of the script (XMX_FUZZ_TRACE=1).
var fuzzTrace = os.Getenv("XMX_FUZZ_TRACE") != ""

// fuzzReader reads the script; past its end it reads zeros.
type fuzzReader struct{ b []byte }

func (r *fuzzReader) empty() bool { return len(r.b) == 0 }

func (r *fuzzReader) u8() byte {
	if len(r.b) == 0 {
		return 0
	}
	c := r.b[0]
	r.b = r.b[1:]
	return c
}

func (r *fuzzReader) u16() uint16 { return uint16(r.u8())<<8 | uint16(r.u8()) }

// take returns the next n bytes, or fewer at the end of the script.
func (r *fuzzReader) take(n int) []byte {
	n = min(n, len(r.b))
	c := r.b[:n]
	r.b = r.b[n:]
	return c
}

// opReq is a request an API operation of the script started.
type opReq struct {
	e    *Endpoint
	h    Request
	recv bool
	buf  []byte
}

type fuzzPair struct {
	t          testing.TB
	clock      *ManualClock
	la, lb     *recLink
	a, b       *Endpoint
	order      atomic.Int64
	reqs       []opReq
	regs       map[*Endpoint][]Registration
	allowReset bool   // the input may legitimately have broken the session
	why        string // why, for failure messages
}

// newFuzzPair opens and connects A and B. cfgSel picks configuration
// variants; record keeps the frames sent; noPredict sends every frame
// received down the general path (engine.predictEager off).
func newFuzzPair(t testing.TB, cfgSel byte, record, noPredict bool) *fuzzPair {
	fp := &fuzzPair{t: t, clock: &ManualClock{}, regs: map[*Endpoint][]Registration{}}
	fp.clock.Advance(time.Millisecond)
	ma, mb := xdp.NewPair(xdp.MemConfig{})
	fp.la = &recLink{Link: ma, record: record, order: &fp.order}
	fp.lb = &recLink{Link: mb, record: record, order: &fp.order}
	cfg := Config{OwnLink: true, Clock: fp.clock, AckEvery: 1, Window: 256, PullBlocks: 4, UnexpectedBytes: 1 << 20}
	if cfgSel&1 != 0 {
		cfg.Window = 8
	}
	if cfgSel&2 != 0 {
		cfg.PullBlocks = 1
	}
	if cfgSel&4 != 0 {
		cfg.UnexpectedBytes = 4096
	}
	if cfgSel&8 != 0 {
		cfg.RendezvousThreshold = 2000
	}
	open := func(l *recLink, id uint8, key uint32, host string, sess, nextID uint32) *Endpoint {
		c := cfg
		c.Link, c.EndpointID, c.Key, c.Hostname = l, id, key, host
		e, err := Open(c)
		if err != nil {
			t.Fatalf("open endpoint %d: %v", id, err)
		}
		t.Cleanup(func() { e.Close() })
		g := e.eng
		// The background goroutine drives only while nobody wants to: it
		// never will again. (If it drives already, it stops after its
		// current Recv, which the wake-up ends.)
		g.wantDrive.Add(1)
		l.Wake()
		// Nor may it drive the round under way: a frame it handled would
		// be handled before the script's turn, and a script would not run
		// the same every time.
		for g.bgDriving.Load() {
			time.Sleep(100 * time.Microsecond)
		}
		g.mu.Lock()
		e.session, e.nextID, e.nextConnID = sess, nextID, nextID
		g.noPredict = noPredict
		// The random draws are the same in every run of a script.
		rng := rand.New(rand.NewPCG(uint64(id), uint64(key)))
		g.randN, g.randKey = rng.IntN, rng.Uint64
		g.mu.Unlock()
		return e
	}
	// The runs that replay the recorded conversation number their
	// connects (and rendezvous) after it, as an endpoint's connect ids
	// start at random: a replayed connect is then an older one of the
	// peer, not the very connect a run is about to send.
	var ids uint32
	if !record {
		ids = 0x100000
	}
	fp.a = open(fp.la, 1, fuzzKeyA, "fuzz-a", fuzzSessA, ids+0x1000)
	fp.b = open(fp.lb, 2, fuzzKeyB, "fuzz-b", fuzzSessB, ids+0x2000)
	if !fp.connect() {
		t.Fatalf("connect failed")
	}
	return fp
}

// connect connects A and B to each other.
func (fp *fuzzPair) connect() bool {
	ra, err := fp.a.IConnect(fp.b.addr, fuzzKeyB, 0, nil)
	if err != nil {
		fp.t.Fatal(err)
	}
	rb, err := fp.b.IConnect(fp.a.addr, fuzzKeyA, 0, nil)
	if err != nil {
		fp.t.Fatal(err)
	}
	fp.pump()
	var sa, sb Status
	var oka, okb bool
	for i := 0; ; i++ {
		if !oka {
			sa, oka, _ = fp.a.Test(ra)
		}
		if !okb {
			sb, okb, _ = fp.b.Test(rb)
		}
		if oka && okb || i == 5 {
			break
		}
		fp.clock.Advance(fp.a.cfg.ConnectRetry) // connects are retried
		fp.pump()
	}
	if !oka || !okb || sa.Code != Success || sb.Code != Success {
		fp.t.Logf("connect: A %v %+v, B %v %+v", oka, sa, okb, sb)
		return false
	}
	return true
}

// drive runs one round of g's progress engine, as its driver does:
// receive what is queued, dispatch it, process the acks it carried, run
// the timers that are due (and stamp the frames sent since the last
// round), flush.
// It returns how many frames it received.
func (fp *fuzzPair) drive(g *engine) int {
	for !g.drive.tryTake() { // the drive token: g.rxBufs are ours
		runtime.Gosched()
	}
	defer g.drive.release()
	n, err := g.link.Recv(g.rxBufs, g.rxSizes, 0)
	if err != nil {
		fp.t.Fatalf("recv: %v", err)
	}
	func() {
		g.mu.Lock()
		defer g.mu.Unlock() // also when the engine panics: the test must report it
		now := g.clock.Now()
		for i := range n {
			g.dispatch(g.rxBufs[i][:g.rxSizes[i]], now)
		}
		g.settleAcks()
		g.runTimers(now)
	}()
	g.mu.Lock()
	g.flushAndUnlock()
	return n
}

// pump drives both engines until neither receives anything.
func (fp *fuzzPair) pump() {
	for range 20000 {
		if fp.drive(fp.a.eng)+fp.drive(fp.b.eng) == 0 {
			return
		}
	}
	fp.t.Fatalf("the endpoints keep sending to each other:\nA %s\nB %s", fp.a.DebugPeer(fp.b.addr), fp.b.DebugPeer(fp.a.addr))
}

func (fp *fuzzPair) tick(d time.Duration) {
	if d > fp.a.cfg.GiveUp {
		fp.legit("clock jump beyond GiveUp")
	}
	fp.clock.Advance(d)
	fp.pump()
}

func (fp *fuzzPair) legit(why string) {
	if !fp.allowReset {
		fp.allowReset, fp.why = true, why
	}
}

// other returns the endpoint that is not e.
func (fp *fuzzPair) other(e *Endpoint) *Endpoint {
	if e == fp.a {
		return fp.b
	}
	return fp.a
}

// inject hands frame f to to's engine as if the link had received it, and
// checks the counters of bad and stale frames.
func (fp *fuzzPair) inject(to *Endpoint, f []byte) {
	t := fp.t
	f = exact(f)
	g := to.eng
	from := fp.other(to)
	fromID, _ := fp.ids(from)
	g.mu.Lock()
	// What dispatch must make of the frame.
	h, err := decodeHeader(f)
	bad := len(f) < xdp.EthHeaderLen || binary.BigEndian.Uint16(f[12:14]) != g.ethType || err != nil
	// From one station other than us, to our MAC (a host query: or to all).
	toAll := err == nil && h.typ == tHostQuery && string(f[0:6]) == "\xff\xff\xff\xff\xff\xff"
	if !bad {
		bad = f[6]&1 != 0 || string(f[6:12]) == string(g.mac[:]) || (string(f[0:6]) != string(g.mac[:]) && !toAll)
	}
	host := !bad && (h.typ == tHostQuery || h.typ == tHostReply)
	// The frames dispatch hands to endpoints: f, or each ack of a bundle
	// as a tAck of its own.
	// A pull request is handed over itself, then the acks riding with it.
	hs := []header{h}
	if !bad && (h.typ == tAcks || h.typ == tPullReq) {
		_, ents := typeHdr(f, &h)
		if len(ents)%ackEntryLen != 0 || len(ents) > maxAckEntries*ackEntryLen {
			bad, hs = true, nil
		} else {
			one := h
			one.typ, one.flags, one.seq, one.payloadLen = tAck, 0, 0, 0
			if h.typ == tAcks {
				hs = []header{one}
			}
			for ; len(ents) > 0; ents = ents[ackEntryLen:] {
				var a ackEntry
				a.decode(ents)
				one.dstEP, one.dstSession, one.srcSession, one.ack = a.dstEP, a.dstSession, a.srcSession, a.ack
				hs = append(hs, one)
			}
		}
	}
	var wantBad, wantStale uint64
	var badEager bool
	if bad {
		wantBad = 1
	}
	for _, h := range hs {
		if bad || host {
			break
		}
		noEP := g.eps[h.dstEP] == nil
		stale := false
		if noEP {
			wantBad++
		} else if g.eps[h.dstEP] == to && !to.closed {
			var src Addr
			copy(src.MAC[:], f[6:12])
			src.EP = h.srcEP
			sessionNack := false
			if h.typ == tNack {
				th, _ := typeHdr(f, &h)
				_, reason := getU32U8(th)
				sessionNack = reason == nackBadSession || reason == nackBadEndpoint
			}
			if h.typ == tConnect {
				// A connect from an older id of the peer than the one
				// paired with pairs nothing and is answered by nobody.
				th, _ := typeHdr(f, &h)
				key, _, _ := getConnect(th)
				p := to.peers[src]
				stale = key == to.cfg.Key && p != nil && p.connected && h.srcSession != p.remoteID && p.older(h.srcSession, h.seq)
			}
			if h.typ != tConnect && h.typ != tConnectReply && !sessionNack {
				p := to.peers[src]
				stale = p == nil || !p.connected || p.local != nil || h.srcSession != p.remoteID || h.dstSession != p.localID
				if !stale && h.typ == tEager && h.seq == p.expected {
					th, payload := typeHdr(f, &h)
					var eh eagerHdr
					badEager = eh.decode(th, len(payload)) != nil
				}
			}
			if stale {
				wantStale++
			}
		}
		// May the frame legitimately break the session between A and B?
		// An unauthenticated protocol takes a forged frame for its peer's;
		// a frame may act on connections; a frame answered with a nack to
		// the real peer makes it reset.
		switch {
		case noEP || (stale && (h.typ.reliable() || h.typ == tPullReq || h.typ == tKeepalive)):
			if claimsToBe(f, &h, from, fromID) {
				fp.legit(fmt.Sprintf("forged %v frame answered with a nack", h.typ))
			}
		case !stale:
			fp.legit(fmt.Sprintf("accepted forged %v frame", h.typ))
		}
	}
	badBefore, st := g.badFrames, to.stats
	func() {
		// Unlock also when the engine panics: the test must report it.
		defer func() {
			if e := recover(); e != nil {
				g.mu.Unlock()
				panic(e)
			}
		}()
		g.dispatch(f, g.clock.Now())
	}()
	dBad, dStale, dEager := g.badFrames-badBefore, to.stats.StaleFrames-st.StaleFrames, to.stats.BadFrames-st.BadFrames
	g.mu.Unlock()
	if dBad != wantBad {
		t.Fatalf("frame % x: engine bad-frame count went up by %d, want %d", f, dBad, wantBad)
	}
	if dStale != wantStale {
		t.Fatalf("frame % x: stale-frame count went up by %d, want %d", f, dStale, wantStale)
	}
	if badEager && dEager == 0 { // (more: frames held out of order behind it may be bad too)
		t.Fatalf("frame % x: inconsistent eager header, bad-frame count went up by %d", f, dEager)
	}
	g.mu.Lock()
	g.flushAndUnlock()
}

func b2u(b bool) uint64 {
	if b {
		return 1
	}
	return 0
}

// claimsToBe reports whether an answer to the source of f reaches e with
// the id e's record of the other side has (id): a nack to it would make
// it reset.
func claimsToBe(f []byte, h *header, e *Endpoint, id uint32) bool {
	toE := bytes.Equal(f[6:12], e.addr.MAC[:]) || f[6]&1 != 0
	return toE && h.srcEP == e.id && h.srcSession == id
}

// ids returns the connection ids of e's record of the other endpoint of
// the pair: its own and the other's (e's session and 0 without a record).
func (fp *fuzzPair) ids(e *Endpoint) (local, remote uint32) {
	g := e.eng
	g.mu.Lock()
	defer g.mu.Unlock()
	if p := e.peers[fp.other(e).addr]; p != nil {
		return p.localID, p.remoteID
	}
	return e.session, 0
}

// sortedKeys returns the keys of m in order.
func sortedKeys[V any](m map[uint32]V) []uint32 {
	k := make([]uint32, 0, len(m))
	for id := range m {
		k = append(k, id)
	}
	slices.Sort(k)
	return k
}

// forge builds a frame from from to to out of structured fields read
// from the script: the addresses and sessions are right unless the script
// corrupts them, sequence numbers and acks are near what to expects, and
// ids of rendezvous, pulls, regions and connects can be taken from the
// live ones.
//
// Encoding: type, corruptions, seq offset, ack offset, fixups, payload
// length, then the type header and the payload.
func (fp *fuzzPair) forge(to, from *Endpoint, r *fuzzReader) []byte {
	typ := frameType(r.u8() % (uint8(maxFrameType) + 2))
	c := r.u8()
	seqOff, ackOff := int8(r.u8()), int8(r.u8())
	fix := r.u8()
	npay := int(r.u8())
	if npay >= 0xf0 {
		npay = (npay - 0xef) * 100
	}
	thl := 0
	if typ != 0 && typ <= maxFrameType {
		thl = typeHdrLen[typ]
	}
	th := make([]byte, thl)
	copy(th, r.take(thl))
	payload := bytes.Clone(r.take(min(npay, to.eng.maxFrame()-hdrLen-thl)))

	dstID, _ := fp.ids(to)
	srcID, _ := fp.ids(from)
	h := header{typ: typ, dstEP: to.id, srcEP: from.id, dstSession: dstID, srcSession: srcID}
	if c&0x10 != 0 {
		h.flags |= flagSync | flagRegion
	}
	if c&0x20 != 0 {
		h.flags |= flagWantAck
	}
	be := binary.BigEndian
	idx := int(fix >> 4)
	mode := fix >> 1 & 7

	// What to knows, to aim at live state.
	tg := to.eng
	tg.mu.Lock()
	p := to.peers[from.addr]
	var in inMsg
	if p != nil {
		h.seq = p.expected + uint32(int32(seqOff))
		h.ack = p.acked + uint32(int32(ackOff))
		in = p.in
	}
	toRndvs := sortedKeys(to.rndvs)
	toPulls := sortedKeys(to.pulls)
	var pl *pull
	if len(toPulls) > 0 {
		pl = to.pulls[toPulls[idx%len(toPulls)]]
	}
	var rndvLen int
	if len(toRndvs) > 0 {
		rndvLen = to.rndvs[toRndvs[idx%len(toRndvs)]].length
	}
	var connIDs []uint32
	for _, cr := range to.connects {
		connIDs = append(connIDs, cr.connID)
	}
	pullPay := to.maxPullPayload()
	if p != nil {
		pullPay = p.pullPayload()
	}
	if fix&1 != 0 && pl != nil && typ == tPullReply {
		// A frame the pull is waiting for.
		var blocks []*pullBlock
		for i := range pl.blocks {
			if pl.blocks[i].active {
				blocks = append(blocks, &pl.blocks[i])
			}
		}
		be.PutUint32(th, pl.id)
		if len(blocks) > 0 {
			b := blocks[int(mode)%len(blocks)]
			frames := (b.length + pl.frameBytes - 1) / pl.frameBytes
			off := b.offset + uint32(uint8(seqOff))%frames*pl.frameBytes
			be.PutUint32(th[4:], off)
			if fix&0x08 == 0 {
				n := int(min(pl.frameBytes, b.offset+b.length-off))
				payload = append(payload, make([]byte, max(0, n-len(payload)))...)[:n]
			}
		}
	}
	tg.mu.Unlock()
	fg := from.eng
	fg.mu.Lock()
	fromRndvs := sortedKeys(from.rndvs)
	fg.mu.Unlock()
	var toRegs []RemoteMem
	for _, rg := range fp.regs[to] {
		toRegs = append(toRegs, rg.Mem)
	}

	if fix&1 != 0 {
		switch typ {
		case tEager:
			be.PutUint64(th, fuzzMatches[mode])
			switch idx & 3 {
			case 1: // a whole message in one frame
				be.PutUint32(th[8:], uint32(len(payload)))
				be.PutUint32(th[12:], 0)
			case 2: // the first frame of a longer message
				be.PutUint32(th[8:], uint32(len(payload))*3+uint32(idx))
				be.PutUint32(th[12:], 0)
			case 3: // the next fragment of the message being received
				if in.active {
					be.PutUint64(th, in.match)
					be.PutUint32(th[8:], in.msgLen)
					be.PutUint32(th[12:], in.received)
					if rem := int(in.msgLen - in.received); fix&0x08 == 0 && rem < len(payload) {
						payload = payload[:rem]
					}
				}
			}
		case tRndv:
			be.PutUint64(th, fuzzMatches[mode])
			if idx&1 != 0 {
				be.PutUint32(th[8:], uint32(fuzzSizes[idx>>1&3]))
			}
			if len(fromRndvs) > 0 && idx&8 != 0 {
				be.PutUint32(th[12:], fromRndvs[int(mode)%len(fromRndvs)])
			}
		case tNotify:
			if len(toRndvs) > 0 {
				be.PutUint32(th, toRndvs[idx%len(toRndvs)])
			}
		case tPullReq:
			if h.flags&flagRegion != 0 && len(toRegs) > 0 {
				m := toRegs[idx%len(toRegs)]
				be.PutUint32(th, m.Region)
				be.PutUint64(th[24:], m.Key)
				if fix&0x08 == 0 {
					be.PutUint32(th[8:], 0)
					be.PutUint32(th[12:], uint32(min(m.Len, uint64(pullPay)*pullBlockFrames)))
					be.PutUint32(th[20:], uint32(pullPay))
					be.PutUint64(th[32:], m.Offset)
				}
			} else if len(toRndvs) > 0 {
				be.PutUint32(th, toRndvs[idx%len(toRndvs)])
				if fix&0x08 == 0 {
					block := uint32(pullPay) * pullBlockFrames
					off := uint32(mode) * block
					be.PutUint32(th[8:], off)
					be.PutUint32(th[12:], uint32(max(0, min(int(block), rndvLen-int(off)))))
					be.PutUint32(th[20:], uint32(pullPay))
				}
			}
		case tPut:
			if len(toRegs) > 0 {
				m := toRegs[idx%len(toRegs)]
				be.PutUint32(th, m.Region)
				be.PutUint64(th[8:], m.Key)
				if fix&0x08 == 0 {
					be.PutUint64(th[16:], m.Offset)
					be.PutUint32(th[24:], uint32(min(m.Len, uint64(fuzzSizes[mode&3]))))
				}
			}
			if len(fromRndvs) > 0 && mode&4 != 0 {
				be.PutUint32(th[4:], fromRndvs[idx%len(fromRndvs)])
			}
		case tNack:
			reason := mode % 6
			th[4] = reason
			switch {
			case reason == nackEagerRefused && p != nil:
				be.PutUint32(th, h.ack) // a frame of ours near the window start
			case reason == nackBadRndv && pl != nil:
				be.PutUint32(th, pl.rndvID)
			case reason == nackBadRegion && pl != nil:
				be.PutUint32(th, pl.id)
			}
		case tConnect:
			_, connID, mtu := getConnect(th)
			if idx&1 != 0 {
				mtu = 576 + idx*64 // a smaller peer MTU
			}
			putConnect(th, to.cfg.Key, connID, mtu)
		case tConnectReply:
			connID, _, mtu := getConnReply(th)
			if len(connIDs) > 0 {
				connID = connIDs[idx%len(connIDs)]
			}
			putConnReply(th, connID, Code(mode&1)*BadKey, mtu)
		case tHostQuery:
			payload = []byte(to.cfg.Hostname)
		}
	}

	// Corruptions.
	switch c & 3 {
	case 1:
		h.dstSession ^= uint32(fix) | 0x100
	case 2:
		h.srcSession ^= uint32(fix) | 0x100
	case 3:
		h.dstSession, h.srcSession = 0, 0
	}
	if c&4 != 0 {
		h.srcEP = 7
	}
	if c&8 != 0 {
		h.dstEP = 9
	}
	h.payloadLen = len(payload)
	if c&0x40 != 0 {
		h.payloadLen += int(fix&3) + 1 // claims more payload than the frame has, sometimes
	}
	buf := make([]byte, max(hdrLen+thl+len(payload), xdp.MinFrameLen))
	ethType := uint16(xdp.DefaultEtherType)
	if c&0x80 != 0 {
		ethType = 0x0800
	}
	putHeader(buf, &to.addr.MAC, &from.addr.MAC, ethType, &h)
	copy(buf[hdrLen:], th)
	copy(buf[hdrLen+thl:], payload)
	return buf
}

// fill returns n bytes of a pattern depending on seed.
func fill(seed, n int) []byte {
	fillOnce.Do(func() {
		fillPattern = make([]byte, 64<<10+251)
		x := uint32(2654435761)
		for i := range fillPattern {
			x ^= x << 13
			x ^= x >> 17
			x ^= x << 5
			fillPattern[i] = byte(x)
		}
	})
	off := seed * 7919 % 251
	return bytes.Clone(fillPattern[off : off+n])
}

var (
	fillOnce    sync.Once
	fillPattern []byte
)

// side returns A or B after bit 0 of x.
func (fp *fuzzPair) side(x byte) *Endpoint {
	if x&1 != 0 {
		return fp.b
	}
	return fp.a
}

// run interprets a script.
func (fp *fuzzPair) run(r *fuzzReader) {
	t := fp.t
	for ops := 0; ops < 256 && !r.empty(); ops++ {
		op := r.u8() % fopN
		if fuzzTrace {
			t.Logf("op %d: %d, next % x", ops, op, r.b[:min(len(r.b), 8)])
		}
		switch op {
		case fopForgeB, fopForgeA:
			to := fp.b
			if op == fopForgeA {
				to = fp.a
			}
			fp.inject(to, fp.forge(to, fp.other(to), r))
		case fopRawB, fopRawA:
			to := fp.b
			if op == fopRawA {
				to = fp.a
			}
			n := int(r.u16()) % (to.eng.maxFrame() + 1)
			fp.inject(to, r.take(n))
		case fopPump:
			r.u8()
			fp.pump()
		case fopTick:
			fp.tick(fuzzTicks[int(r.u8())%len(fuzzTicks)])
		case fopSendAB, fopSendBA:
			from := fp.a
			if op == fopSendBA {
				from = fp.b
			}
			x := r.u8()
			match := fuzzMatches[x&7]
			data := fill(len(fp.reqs), fuzzSizes[x>>3&3])
			send := from.Isend
			if x&0x20 != 0 {
				send = from.Issend
			}
			if h, err := send(fp.other(from).addr, match, [][]byte{data}, nil); err == nil {
				fp.reqs = append(fp.reqs, opReq{e: from, h: h, buf: data})
			}
		case fopRecvB, fopRecvA:
			e := fp.b
			if op == fopRecvA {
				e = fp.a
			}
			x := r.u8()
			mask := fuzzMasks[x>>3&3]
			info := fuzzMatches[x&7] & mask
			buf := make([]byte, fuzzBufSizes[x>>5&3])
			h, err := e.Irecv(info, mask, [][]byte{buf}, nil)
			if err != nil {
				t.Fatalf("Irecv(%#x, %#x): %v", info, mask, err)
			}
			fp.reqs = append(fp.reqs, opReq{e: e, h: h, recv: true, buf: buf})
		case fopDisconnect:
			e := fp.side(r.u8())
			fp.legit("disconnect")
			e.Disconnect(fp.other(e).addr)
		case fopLoss:
			x := r.u8()
			l := fp.la
			if x&1 != 0 {
				l = fp.lb
			}
			l.lose(int(x >> 1 & 7))
		case fopCancel:
			e := fp.side(r.u8())
			for _, q := range fp.reqs {
				if q.e == e && q.recv {
					if ok, _ := e.Cancel(q.h); ok {
						break
					}
				}
			}
		case fopRegister:
			x := r.u8()
			e := fp.side(x)
			if len(fp.regs[e]) >= 4 {
				break
			}
			buf := fill(int(x), fuzzRegSizes[x>>1&3])
			rg, err := e.Register(buf)
			if err != nil {
				t.Fatalf("register %d bytes: %v", len(buf), err)
			}
			fp.regs[e] = append(fp.regs[e], rg)
		case fopStep:
			fp.drive(fp.side(r.u8()).eng)
		case fopOneSided:
			// bit 0: initiator; bit 1: Put; bits 2-3: region; bits 4-5:
			// size; bit 6: offset 50; bit 7: offset past the end.
			x := r.u8()
			e := fp.side(x)
			regs := fp.regs[fp.other(e)]
			if len(regs) == 0 {
				break
			}
			m := regs[int(x>>2&3)%len(regs)].Mem
			n := min(fuzzSizes[x>>4&3], int(m.Len))
			off := uint64(0)
			if x&0x40 != 0 {
				off = min(50, m.Len-uint64(n))
			}
			if x&0x80 != 0 {
				m.Len += 10 // a buffer the peer did not register: refused there
				off = m.Len - uint64(n)
			}
			var h Request
			var err error
			buf := make([]byte, n)
			if x&2 != 0 {
				buf = fill(int(x)+len(fp.reqs), n)
				h, err = e.IPut(fp.other(e).addr, m, off, [][]byte{buf}, nil)
			} else {
				h, err = e.IGet(fp.other(e).addr, m, off, [][]byte{buf}, nil)
			}
			if err == nil {
				fp.reqs = append(fp.reqs, opReq{e: e, h: h, buf: buf})
			}
		}
		fp.invariants(fmt.Sprintf("operation %d (%d)", ops, op))
	}
}

// invariants checks the endpoints' bookkeeping against what it counts:
// the unexpected queue against the bounds' counters, the matcher's
// lengths, each peer's out-of-order count, window, rendezvous and pulls.
func (fp *fuzzPair) invariants(after string) {
	for _, e := range []*Endpoint{fp.a, fp.b} {
		if msg := endpointInvariants(e); msg != "" {
			fp.t.Fatalf("after %s: endpoint %v: %s", after, e.addr, msg)
		}
	}
}

func endpointInvariants(e *Endpoint) string {
	g := e.eng
	g.mu.Lock()
	defer g.mu.Unlock()
	bytes, rndv, n := 0, 0, 0
	ofPeer := map[*peer]int{}
	for c := range e.match.queues {
		// Bounded: a corrupted (cyclic) list is reported, not walked forever.
		for u := e.match.queues[c].unexpHead; u != nil && n <= e.match.nUnexp; u = u.next {
			n++
			ofPeer[u.src]++
			if u.rndv {
				rndv++
				continue
			}
			bytes += unexpCost(int(u.msgLen))
			if u.received > u.msgLen || len(u.data) != int(u.msgLen) {
				return fmt.Sprintf("unexpected message of %d bytes holds %d, received %d", u.msgLen, len(u.data), u.received)
			}
		}
	}
	if n != e.match.nUnexp {
		return fmt.Sprintf("%d unexpected messages queued, nUnexp %d", n, e.match.nUnexp)
	}
	if bytes != e.unexpBytes || rndv != e.unexpRndv {
		return fmt.Sprintf("unexpected queue holds %d eager bytes and %d rendezvous, counted %d and %d", bytes, rndv, e.unexpBytes, e.unexpRndv)
	}
	if bytes > e.cfg.UnexpectedBytes {
		return fmt.Sprintf("%d unexpected bytes held, bound %d", bytes, e.cfg.UnexpectedBytes)
	}
	n = 0
	for c := range e.match.queues {
		for r := e.match.queues[c].recvHead; r != nil && n <= e.match.nRecvs; r = r.rnext {
			n++
		}
	}
	if n != e.match.nRecvs {
		return fmt.Sprintf("%d receives queued, nRecvs %d", n, e.match.nRecvs)
	}
	held, dialed := 0, 0
	for _, p := range e.peers {
		if p.dialed {
			dialed++
		}
	}
	if dialed != e.dialed {
		return fmt.Sprintf("%d records of peers we connected to, counted %d", dialed, e.dialed)
	}
	for a, p := range e.peers {
		full := 0
		for i := range p.ooo {
			if p.ooo[i].full {
				full++
			}
		}
		if full != p.oooCount {
			return fmt.Sprintf("peer %v: %d frames held out of order, oooCount %d", a, full, p.oooCount)
		}
		held += full
		if p.inFlight() > uint32(len(p.win)) {
			return fmt.Sprintf("peer %v: %d frames in flight, window %d", a, p.inFlight(), len(p.win))
		}
		rndvs, pulls := 0, 0
		for _, r := range e.rndvs {
			if r.peer == p {
				rndvs++
			}
		}
		for _, pl := range e.pulls {
			if pl.peer == p {
				pulls++
			}
		}
		if ofPeer[p] != p.unexps {
			return fmt.Sprintf("peer %v: %d unexpected messages queued, counted %d", a, ofPeer[p], p.unexps)
		}
		if rndvs != p.rndvs || pulls != p.pulls {
			return fmt.Sprintf("peer %v: %d rendezvous and %d pulls, counted %d and %d", a, rndvs, pulls, p.rndvs, p.pulls)
		}
	}
	if held != e.oooHeld {
		return fmt.Sprintf("%d frames held out of order, oooHeld %d", held, e.oooHeld)
	}
	if held > 1 && held*e.eng.maxFrame() > e.cfg.OutOfOrderBytes {
		return fmt.Sprintf("%d frames held out of order, past the bound of %d bytes", held, e.cfg.OutOfOrderBytes)
	}
	return ""
}

// peerState is what consistency needs of one side's record of the other.
type peerState struct {
	ok                       bool
	connected, dead, isLocal bool
	localID, remoteID        uint32
	nextSeq, acked, expected uint32
	ooo                      int
	sendQ                    bool
}

func (fp *fuzzPair) peerState(e *Endpoint) peerState {
	g := e.eng
	g.mu.Lock()
	defer g.mu.Unlock()
	p := e.peers[fp.other(e).addr]
	if p == nil {
		return peerState{}
	}
	return peerState{true, p.connected, p.dead, p.local != nil, p.localID, p.remoteID,
		p.nextSeq, p.acked, p.expected, p.oooCount, p.sendHead != nil}
}

// consistent reports whether A and B agree on their session and sequence
// numbers with nothing in flight: a state from which a message must go
// through without reconnecting.
func (fp *fuzzPair) consistent() (bool, string) {
	sa, sb := fp.peerState(fp.a), fp.peerState(fp.b)
	desc := fmt.Sprintf("A's peer %+v, B's peer %+v", sa, sb)
	ok := sa.ok && sb.ok && sa.connected && sb.connected && !sa.dead && !sb.dead && !sa.isLocal && !sb.isLocal &&
		sa.remoteID == sb.localID && sb.remoteID == sa.localID &&
		sa.nextSeq == sb.expected && sb.nextSeq == sa.expected &&
		sa.acked == sa.nextSeq && sb.acked == sb.nextSeq &&
		sa.ooo == 0 && sb.ooo == 0 && !sa.sendQ && !sb.sendQ
	return ok, desc
}

// resync forgets and reconnects both sides.
func (fp *fuzzPair) resync() {
	fp.a.Disconnect(fp.b.addr)
	fp.b.Disconnect(fp.a.addr)
	fp.pump()
	if !fp.connect() {
		fp.t.Fatalf("reconnect after %s failed", fp.why)
	}
	if ok, desc := fp.consistent(); !ok {
		fp.t.Fatalf("inconsistent right after reconnecting: %s", desc)
	}
}

// freshMatch returns a match value no queued unexpected message of e has.
func freshMatch(e *Endpoint, seed uint64) uint64 {
	g := e.eng
	g.mu.Lock()
	defer g.mu.Unlock()
	for m := 0x5eed000000000000 + seed; ; m++ {
		used := false
		e.match.eachUnexp(func(u *unexp) { used = used || u.match == m })
		if !used {
			return m
		}
	}
}

// exchange sends 100 bytes from src to dst and checks what arrives.
func (fp *fuzzPair) exchange(src, dst *Endpoint, seq int) {
	t := fp.t
	m := freshMatch(dst, uint64(seq))
	msg := fill(1000+seq, 100)
	buf := make([]byte, 100)
	rr, err := dst.Irecv(m, ^uint64(0), [][]byte{buf}, nil)
	if err != nil {
		t.Fatal(err)
	}
	sr, err := src.Isend(dst.addr, m, [][]byte{msg}, nil)
	if err != nil {
		t.Fatalf("send %v -> %v (legit reset: %q): %v", src.addr, dst.addr, fp.why, err)
	}
	fp.pump()
	var rst, sst Status
	var rdone, sdone bool
	for i := 0; ; i++ {
		if !rdone {
			rst, rdone, err = dst.Test(rr)
			if err != nil {
				t.Fatal(err)
			}
		}
		if !sdone {
			sst, sdone, err = src.Test(sr)
			if err != nil {
				t.Fatal(err)
			}
		}
		if rdone && sdone {
			break
		}
		if i == 40 {
			t.Fatalf("message %v -> %v (legit reset: %q) did not complete: recv %v send %v\nsrc %s\ndst %s",
				src.addr, dst.addr, fp.why, rdone, sdone, src.DebugPeer(dst.addr), dst.DebugPeer(src.addr))
		}
		fp.clock.Advance(10 * time.Millisecond)
		fp.pump()
	}
	if rst.Code != Success || rst.XferLen != 100 || rst.MsgLen != 100 || rst.Match != m || rst.Source != src.addr || !bytes.Equal(buf, msg) {
		t.Fatalf("message %v -> %v: receive status %+v, data ok %v", src.addr, dst.addr, rst, bytes.Equal(buf, msg))
	}
	if sst.Code != Success || sst.XferLen != 100 {
		t.Fatalf("message %v -> %v: send status %+v", src.addr, dst.addr, sst)
	}
}

// check is the end of every run: the endpoints still work, and closing
// them completes every request.
func (fp *fuzzPair) check() {
	t := fp.t
	for _, l := range []*recLink{fp.la, fp.lb} {
		l.mu.Lock()
		clear(l.drop) // losses the script asked for and did not use
		l.mu.Unlock()
	}
	fp.pump()
	for _, q := range fp.reqs {
		if q.recv {
			q.e.Cancel(q.h)
		}
	}
	fp.pump()
	ok, desc := fp.consistent()
	if !ok && !fp.allowReset {
		// Losses heal with time.
		for i := 0; i < 100 && !ok; i++ {
			fp.clock.Advance(25 * time.Millisecond)
			fp.pump()
			ok, desc = fp.consistent()
		}
		if !ok {
			t.Fatalf("endpoints out of step without any forged frame: %s\nA %s\nB %s", desc,
				fp.a.DebugPeer(fp.b.addr), fp.b.DebugPeer(fp.a.addr))
		}
	}
	if !ok {
		fp.resync()
	}
	fp.exchange(fp.a, fp.b, 1)
	fp.exchange(fp.b, fp.a, 2)
	fp.invariants("the final exchange")
	for _, l := range []*recLink{fp.la, fp.lb} {
		if l.dirty > 0 {
			t.Fatalf("%d frames sent padded with what their buffer held before, not zeros", l.dirty)
		}
	}

	fp.a.Close()
	fp.b.Close()
	for i, q := range fp.reqs {
		st, done, err := q.e.Test(q.h)
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		if !done {
			t.Fatalf("request %d (receive %v) still pending after Close", i, q.recv)
		}
		if q.recv && (st.Code == Success || st.Code == Truncated) {
			if st.XferLen > len(q.buf) || st.XferLen > st.MsgLen || (st.Code == Success) != (st.XferLen == st.MsgLen) {
				t.Fatalf("request %d: receive status %+v with a %d-byte buffer", i, st, len(q.buf))
			}
		}
	}
}

// runScript runs data against a fresh pair (newFuzzPair).
func runScript(t testing.TB, data []byte, record, noPredict bool) *fuzzPair {
	r := &fuzzReader{b: data}
	fp := newFuzzPair(t, r.u8(), record, noPredict)
	fp.run(r)
	fp.check()
	return fp
}

// A normal conversation between A and B, as a script: every kind of frame
// goes by (connects, eager in one and several frames, rendezvous with
// pulls and notifies, a synchronous send, an unexpected message, a refused
// eager message converted to rendezvous, losses healed by retransmission
// and selective acks, keepalives, one-sided Get and Put, a host query,
// disconnect).
var seedScript = []byte{
	0x04,           // configuration: unexpected bound 4096
	fopRecvB, 0x00, // B: receive match 1, 64-byte buffer
	fopRecvB, 0x01 | 0x40, // B: receive match 2, 3000 bytes
	fopSendAB, 0x00 | 0x08, // A: 100 bytes match 1 (truncated to 64)
	fopSendAB, 0x01 | 0x10, // A: 3000 bytes match 2 (three eager frames)
	fopPump, 0,
	fopSendAB, 0x02 | 0x08, // A: 100 bytes match 0x101: unexpected
	fopPump, 0,
	fopRecvB, 0x02 | 0x40, // B: takes it
	fopRecvA, 0x03 | 0x60, // A: receive 0xf0f0, 40000 bytes
	fopSendBA, 0x03 | 0x18, // B: 40000 bytes: rendezvous, pulls, notify
	fopPump, 0,
	fopSendBA, 0x06 | 0x18, // B: 40000 bytes match 0x42: unexpected rendezvous
	fopPump, 0, // (13 operations: B has a rendezvous waiting)
	fopTick, 3, // keepalive
	fopRecvA, 0x06 | 0x60,
	fopPump, 0,
	fopSendAB, 0x07 | 0x28, // synchronous 100 bytes
	fopRecvB, 0x07 | 0x40,
	fopPump, 0,
	fopSendAB, 0x04 | 0x10, // 3000 bytes match 0: unexpected
	fopSendAB, 0x05 | 0x10, // 3000 bytes match ^0: over the bound, refused, converted
	fopPump, 0,
	fopRecvB, 0x04 | 0x40,
	fopRecvB, 0x05 | 0x40,
	fopPump, 0,
	fopLoss, 0, // the first frame of the next message is lost
	fopSendAB, 0x00 | 0x10,
	fopRecvB, 0x00 | 0x40,
	fopPump, 0, // selective acks
	fopTick, 2, // retransmission
	fopTick, 2,
	fopRecvA, 0x00,
	fopSendBA, 0x00 | 0x08,
	fopTick, 1,
	fopRegister, 0x01 | 0x04, // B registers 48000 bytes
	fopOneSided, 0x00 | 0x30, // A gets 40000 bytes of it
	fopOneSided, 0x02 | 0x20, // A puts 3000 bytes into it
	fopOneSided, 0x00 | 0x90, // A gets 100 bytes past its end: refused
	fopPump, 0,
	fopHostQuery, 0, // a host query for A's host
	fopDisconnect, 1,
	fopPump, 0,
}

// fopHostQuery marks where capture splices a raw host query into A.
const fopHostQuery = 0xff

var (
	seedOnce    sync.Once
	seedA       []recFrame // frames A sent in the seed conversation
	seedB       []recFrame // frames B sent
	seedScript2 []byte     // seedScript with the host query spliced in
)

// hostQueryFrame returns a host query from B for name.
func hostQueryFrame(name string) []byte {
	f := make([]byte, frameLen(tHostQuery, len(name)))
	h := header{typ: tHostQuery, srcEP: 2, dstEP: 0xff, payloadLen: len(name)}
	src := []byte{2, 0, 0, 0, 0, 2}
	copy(putHeader(f, &[6]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, (*[6]byte)(src), xdp.DefaultEtherType, &h), name)
	return f
}

// capture runs the seed conversation once, recording every frame.
func capture(t testing.TB) {
	seedOnce.Do(func() {
		s := []byte{seedScript[0]}
		for i := 1; i+1 < len(seedScript); i += 2 {
			op, arg := seedScript[i], seedScript[i+1]
			if op == fopHostQuery {
				s = append(s, rawOp(false, hostQueryFrame("fuzz-a"))...)
				continue
			}
			s = append(s, op, arg)
		}
		fp := runScript(t, s, true, false)
		seedA, seedB = fp.la.sent, fp.lb.sent
		seedScript2 = s
	})
	if seedScript2 == nil {
		t.Fatal("capture of the seed conversation failed")
	}
}

// seedFrames returns the frames of the seed conversation.
func seedFrames(t testing.TB) [][]byte {
	capture(t)
	var out [][]byte
	for _, rf := range slices.Concat(seedA, seedB) {
		out = append(out, rf.frame)
	}
	return out
}

// maxScript bounds the scripts FuzzEndpointFrames runs: long inputs make
// the fuzzer's minimisation of every new interesting input crawl.
const maxScript = 8 << 10

// rawOp encodes the injection of frame f into A's or B's engine.
func rawOp(toB bool, f []byte) []byte {
	op := byte(fopRawA)
	if toB {
		op = fopRawB
	}
	return append([]byte{op, byte(len(f) >> 8), byte(len(f))}, f...)
}

func FuzzEndpointFrames(f *testing.F) {
	capture(f)
	cfg := seedScript2[0]
	f.Add([]byte{cfg})
	f.Add(seedScript2)
	// The conversation replayed as forged frames into fresh endpoints
	// (what A sent injected into B, what B sent into A, in their order),
	// in pieces: inputs stay small, so that the fuzzer minimises quickly.
	all := slices.Concat(seedA, seedB)
	slices.SortFunc(all, func(x, y recFrame) int { return int(x.n - y.n) })
	isA := map[int64]bool{}
	for _, rf := range seedA {
		isA[rf.n] = true
	}
	piece := []byte{cfg}
	for i, rf := range all {
		piece = append(piece, rawOp(isA[rf.n], rf.frame)...)
		if len(piece) > 1500 || i == len(all)-1 {
			f.Add(piece)
			// The same after the conversation: duplicates and replays.
			f.Add(slices.Concat(seedScript2, piece[1:]))
			piece = []byte{cfg}
		}
	}
	// A few frames of each type alone.
	perType := map[[2]int]int{}
	for _, rf := range all {
		h, err := decodeHeader(rf.frame)
		if err != nil {
			continue
		}
		k := [2]int{int(h.typ), int(b2u(isA[rf.n]))}
		if perType[k] < 2 {
			perType[k]++
			f.Add(append([]byte{cfg}, rawOp(isA[rf.n], rf.frame)...))
		}
	}
	// Forged frames of each type aimed at live state: after 13 operations
	// of the conversation B has a rendezvous waiting for A; then B
	// registers a buffer.
	prefix := slices.Concat(seedScript2[1:1+2*13], []byte{fopRegister, 0x01})
	for typ := range maxFrameType + 2 {
		thl := 0
		if typ > 0 && typ <= maxFrameType {
			thl = typeHdrLen[typ]
		}
		f.Add(slices.Concat([]byte{cfg}, prefix,
			[]byte{fopForgeB, byte(typ), 0x10, 0, 1, 0x01, 40}, make([]byte, thl+40),
			[]byte{fopForgeA, byte(typ), 0, 0, 1, 0x13, 40}, make([]byte, thl+40)))
	}
	for _, s := range handSeeds() {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) > maxScript {
			t.Skip("script too long")
		}
		// A hang is a failure too: crash with every goroutine's stack, so
		// that the fuzzer keeps the input.
		watchdog := time.AfterFunc(20*time.Second, func() {
			buf := make([]byte, 1<<20)
			panic(fmt.Sprintf("FuzzEndpointFrames: input still running after 20 s:\n%s", buf[:runtime.Stack(buf, true)]))
		})
		defer watchdog.Stop()
		runScript(t, data, false, false)
	})
}

// forgeOp encodes a forged frame: type, corruptions, seq and ack offsets,
// fixups (bit 0: aim at live state; bits 1-3: mode; bits 4-7: index), then
// the type header (zeros) and n payload bytes.
func forgeOp(toB bool, typ frameType, c byte, seqOff int8, fix byte, n int) []byte {
	op := byte(fopForgeA)
	if toB {
		op = fopForgeB
	}
	thl := 0
	if typ > 0 && typ <= maxFrameType {
		thl = typeHdrLen[typ]
	}
	b := []byte{op, byte(typ), c, byte(seqOff), 0, fix, byte(n)}
	b = append(b, make([]byte, thl)...)
	return append(b, bytes.Repeat([]byte{0x5a}, n)...)
}

// handSeeds are scripts aimed at corners: eager reassembly of forged
// fragments and its abandonment, frames beyond the window, pull replies
// to a pull in progress (duplicated, misaligned, short), nacks of it.
func handSeeds() [][]byte {
	var out [][]byte
	add := func(parts ...[]byte) { out = append(out, slices.Concat(parts...)) }
	const (
		first = 1 | 2<<4 // eager: first fragment of a longer message, match 1
		cont  = 1 | 3<<4 // eager: the next fragment of the message in progress
		whole = 1 | 1<<1 | 1<<4
	)
	// A forged message in three fragments, unexpected, then received.
	add([]byte{0}, forgeOp(true, tEager, 0, 0, first, 100), forgeOp(true, tEager, 0, 0, cont, 100),
		forgeOp(true, tEager, 0, 0, cont, 200), []byte{fopRecvB, 0x40, fopPump, 0})
	// The same received into a posted receive.
	add([]byte{0}, []byte{fopRecvB, 0x40}, forgeOp(true, tEager, 0, 0, first, 100),
		forgeOp(true, tEager, 0, 0, cont, 100), forgeOp(true, tEager, 0, 0, cont, 200))
	// Abandoned by a new message, then received.
	add([]byte{0}, forgeOp(true, tEager, 0, 0, first, 100), forgeOp(true, tEager, 0, 0, whole, 10),
		[]byte{fopRecvB, 0x40, fopPump, 0})
	// Fragments out of order and beyond the window (window 8).
	add([]byte{1}, forgeOp(true, tEager, 0, 1, cont, 100), forgeOp(true, tEager, 0, 9, whole, 10),
		forgeOp(true, tEager, 0, 0, first, 100), []byte{fopRecvB, 0x40})
	// A pull in progress at A (B's rendezvous, A's receive; A alone runs):
	// forged replies to it, in place, duplicated, misaligned, short, then
	// a nack of it.
	pull := []byte{0x00, fopRecvA, 0x03 | 0x60, fopSendBA, 0x03 | 0x18, fopStep, 0}
	reply := forgeOp(false, tPullReply, 0, 0, 1, 0)
	add(pull, reply, reply, []byte{fopPump, 0})
	add(pull, forgeOp(false, tPullReply, 0, 1, 1|0x08, 7), forgeOp(false, tPullReply, 0, 2, 1, 0), []byte{fopPump, 0})
	add(pull, forgeOp(false, tPullReply, 0, 0, 0, 0), forgeOp(false, tNack, 0, 0, 1|4<<1, 0), []byte{fopPump, 0})
	// A Put and a Get in progress, and forged frames at B's region.
	reg := []byte{0x00, fopRegister, 0x01, fopOneSided, 0x02 | 0x20, fopStep, 1}
	add(reg, forgeOp(true, tPut, 0, 0, 1|2<<1, 0), forgeOp(true, tPullReq, 0x10, 0, 1, 0), []byte{fopPump, 0})
	add(reg, forgeOp(true, tPullReq, 0x10, 0, 1|0x08, 0), forgeOp(true, tPut, 0, 0, 1|4<<1|0x08, 0), []byte{fopPump, 0})
	return out
}
