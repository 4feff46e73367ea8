package msglayer

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/xmx-stack/xmx/xdp"
)

// Wire format. Every frame is an Ethernet frame of the stack's EtherType
// carrying a 24-byte common header, then a header of its type, then payload:
//
//	0  u8  version (wireVersion)
//	1  u8  type
//	2  u8  destination endpoint id
//	3  u8  source endpoint id
//	4  u32 destination session: the receiver's connection id as the sender
//	       knows it (0 before connect; see peer.go, newID)
//	8  u32 source session: the sender's connection id
//	12 u32 sequence number (reliable types; in a connect or connect reply,
//	       the generation of the sender's id; in a pull request, its
//	       stamp, which the replies to it echo; 0 otherwise)
//	16 u32 cumulative ack: every reliable frame below it from the receiver has arrived
//	20 u8  receive window: how many reliable frames the sender of this frame
//	       takes in flight from the receiver, beyond the cumulative ack
//	       (0: it asks for no limit; see recvwindow.go)
//	21 u8  flags
//	22 u16 payload length (bytes after the type header)
//
// All integers are big-endian. Reliable types (eager, rendezvous, notify,
// nop) carry a sequence number and are retransmitted until acknowledged;
// the others are answered or re-requested by their own timers.

const (
	wireVersion = 3 // 3: sessions are connection ids; ack entries name both
	commonLen   = 24
	// hdrLen is Ethernet plus common header: where type headers start.
	hdrLen = xdp.EthHeaderLen + commonLen
)

// frameType is the type byte of the common header.
type frameType uint8

const (
	tEager        frameType = 1  // reliable: a message fragment (match, msgLen, offset) + data
	tRndv         frameType = 2  // reliable: rendezvous record of a large or synchronous message
	tNotify       frameType = 3  // reliable: the receiver is done with a rendezvous
	tNop          frameType = 4  // reliable: fills sequence numbers of a message converted to rendezvous
	tAck          frameType = 5  // explicit cumulative ack + selective-ack bitmap
	tNack         frameType = 6  // a frame was refused (reason, sequence number)
	tPullReq      frameType = 7  // receiver asks for frames of a rendezvous block (+ ackEntry list)
	tPullReply    frameType = 8  // one frame of rendezvous data
	tConnect      frameType = 9  // connect request: key, connect id
	tConnectReply frameType = 10 // connect answer: connect id, status
	tHostQuery    frameType = 11 // broadcast: who has this host name?
	tHostReply    frameType = 12 // unicast answer to a host query
	tDisconnect   frameType = 13 // the sender forgets the receiver
	tKeepalive    frameType = 14 // asks for an explicit ack (peer liveness)
	tPut          frameType = 15 // reliable: write into a registered region: the target pulls the data
	tAcks         frameType = 16 // explicit cumulative acks to several endpoints of one host (ackEntry list)
	maxFrameType  frameType = 16
)

// reliable reports whether frames of type t carry a sequence number.
func (t frameType) reliable() bool {
	return t == tEager || t == tRndv || t == tNotify || t == tNop || t == tPut
}

func (t frameType) String() string {
	names := [...]string{"", "eager", "rndv", "notify", "nop", "ack", "nack", "pullreq", "pullreply",
		"connect", "connectreply", "hostquery", "hostreply", "disconnect", "keepalive", "put", "acks"}
	if int(t) < len(names) && t != 0 {
		return names[t]
	}
	return fmt.Sprintf("type(%d)", uint8(t))
}

// Type header lengths.
const (
	eagerHdrLen      = 16 // match u64, msgLen u32, offset u32
	rndvHdrLen       = 16 // match u64, msgLen u32, rndvID u32
	notifyHdrLen     = 12 // rndvID u32, xferLen u32, code u8, pad[3]
	ackHdrLen        = 0  // payload: selective-ack bitmap, bit i = frame ack+1+i arrived
	sackBytes        = 64 // longest bitmap sent (512 frames)
	acksHdrLen       = 0  // payload: ackEntry list, the acks after the one the common header carries
	ackEntryLen      = 13 // dstEP u8, dstSession u32, srcSession u32, ack u32
	maxAckEntries    = 64 // most ackEntries one tAcks frame carries
	nackHdrLen       = 12 // seq u32, reason u8, pad[3], session u32 (the one the refused frame was for)
	pullReqHdrLen    = 40 // rndvID u32, pullID u32, offset u32, length u32, mask u32, frameBytes u32, key u64, base u64
	putHdrLen        = 32 // region u32, putID u32, key u64, offset u64, length u32, pad u32
	pullReplyHdrLen  = 8  // pullID u32, offset u32
	connectHdrLen    = 12 // key u32, connectID u32, mtu u16, pad u16
	connReplyHdrLen  = 12 // connectID u32, code u8, pad[3], mtu u16, pad u16
	hostHdrLen       = 0  // payload: the host name
	maxHostNameLen   = 64
	pullBlockFrames  = 32 // frames per pull block (one bit each in the request mask)
	flagSync         = 1 << 0
	flagWantAck      = 1 << 1
	flagRegion       = 1 << 2 // pull request: rndvID names a registered region (key, base)
	nackEagerRefused = 1      // the receiver had no room: resend as rendezvous
	nackBadSession   = 2      // the receiver does not know this session: reconnect
	nackBadEndpoint  = 3      // no such endpoint
	nackBadRndv      = 4      // the rendezvous to pull from is unknown or gone
	nackBadRegion    = 5      // a registered-region access was refused (id, key or bounds)
)

// typeHdrLen is the type header length of each frame type.
var typeHdrLen = [maxFrameType + 1]int{
	tEager: eagerHdrLen, tRndv: rndvHdrLen, tNotify: notifyHdrLen, tNop: 0,
	tAck: ackHdrLen, tNack: nackHdrLen, tPullReq: pullReqHdrLen, tPullReply: pullReplyHdrLen,
	tConnect: connectHdrLen, tConnectReply: connReplyHdrLen, tHostQuery: hostHdrLen,
	tHostReply: hostHdrLen, tDisconnect: 0, tKeepalive: 0, tPut: putHdrLen, tAcks: acksHdrLen,
}

// header is the decoded common header of a frame.
type header struct {
	typ        frameType
	dstEP      uint8
	srcEP      uint8
	dstSession uint32
	srcSession uint32
	seq        uint32
	ack        uint32
	window     uint8 // receive window (0: no limit)
	flags      uint8
	payloadLen int
}

var (
	errShortFrame  = errors.New("frame shorter than its headers")
	errBadVersion  = errors.New("unknown protocol version")
	errBadType     = errors.New("unknown frame type")
	errBadLength   = errors.New("payload length does not match the frame")
	errBadTypeHdr  = errors.New("inconsistent type header")
	errHostNameLen = errors.New("host name too long")
)

// decodeHeader parses the common header of frame f (Ethernet header
// included) and checks that the payload fits. It never panics.
func decodeHeader(f []byte) (h header, err error) {
	err = h.decode(f)
	return h, err
}

// decode is decodeHeader writing into h. The frame path uses it: a
// header returned by value is stored field by field and then copied
// whole, and the copy's wide loads cannot be forwarded from the narrow
// stores (a stall on every frame).
func (h *header) decode(f []byte) error {
	if len(f) < hdrLen {
		return errShortFrame
	}
	b := f[xdp.EthHeaderLen:]
	if b[0] != wireVersion {
		return errBadVersion
	}
	h.typ = frameType(b[1])
	if h.typ == 0 || h.typ > maxFrameType {
		return errBadType
	}
	h.dstEP = b[2]
	h.srcEP = b[3]
	h.dstSession = binary.BigEndian.Uint32(b[4:])
	h.srcSession = binary.BigEndian.Uint32(b[8:])
	h.seq = binary.BigEndian.Uint32(b[12:])
	h.ack = binary.BigEndian.Uint32(b[16:])
	h.window = b[20]
	h.flags = b[21]
	h.payloadLen = int(binary.BigEndian.Uint16(b[22:]))
	// Frames may be padded to the Ethernet minimum: the payload must fit,
	// it need not fill the frame.
	if hdrLen+typeHdrLen[h.typ]+h.payloadLen > len(f) {
		return errBadLength
	}
	return nil
}

// putHeader writes the Ethernet and common headers into f and returns the
// type header slice. The addresses are arrays, so that they are stored
// by two moves each rather than by calls to memmove.
func putHeader(f []byte, dst, src *[6]byte, etherType uint16, h *header) []byte {
	*(*[6]byte)(f[0:6]) = *dst
	*(*[6]byte)(f[6:12]) = *src
	binary.BigEndian.PutUint16(f[12:14], etherType)
	b := f[xdp.EthHeaderLen:hdrLen]
	b[0] = wireVersion
	b[1] = byte(h.typ)
	b[2] = h.dstEP
	b[3] = h.srcEP
	binary.BigEndian.PutUint32(b[4:], h.dstSession)
	binary.BigEndian.PutUint32(b[8:], h.srcSession)
	binary.BigEndian.PutUint32(b[12:], h.seq)
	binary.BigEndian.PutUint32(b[16:], h.ack)
	b[20] = h.window
	b[21] = h.flags
	binary.BigEndian.PutUint16(b[22:], uint16(h.payloadLen))
	return f[hdrLen:]
}

// setPayloadLen rewrites the payload length of an encoded frame.
func setPayloadLen(f []byte, n int) {
	binary.BigEndian.PutUint16(f[xdp.EthHeaderLen+22:], uint16(n))
}

// setAck rewrites the ack field of an encoded frame (piggybacking the
// newest ack on a retransmission).
func setAck(f []byte, ack uint32) {
	binary.BigEndian.PutUint32(f[xdp.EthHeaderLen+16:], ack)
}

// setWindow rewrites the receive window of a frame built before.
func setWindow(f []byte, window uint8) { f[xdp.EthHeaderLen+20] = window }

// frameLen is the length of a frame of type t with n payload bytes,
// padded to the Ethernet minimum.
func frameLen(t frameType, n int) int {
	return max(hdrLen+typeHdrLen[t]+n, xdp.MinFrameLen)
}

// padded returns the frame of type t with n payload bytes written in b,
// padded to the Ethernet minimum (frameLen) with zeros: b is reused, and
// what an earlier frame left in it must not go out again.
func padded(b []byte, t frameType, n int) []byte {
	end := hdrLen + typeHdrLen[t] + n
	if end >= xdp.MinFrameLen {
		return b[:end]
	}
	clear(b[end:xdp.MinFrameLen])
	return b[:xdp.MinFrameLen]
}

// typeHdr returns the type header and the payload of a decoded frame.
func typeHdr(f []byte, h *header) (th, payload []byte) {
	n := typeHdrLen[h.typ]
	return f[hdrLen : hdrLen+n], f[hdrLen+n : hdrLen+n+h.payloadLen]
}

// Type headers.

type eagerHdr struct {
	match  uint64
	msgLen uint32
	offset uint32
}

func (e *eagerHdr) put(b []byte) {
	binary.BigEndian.PutUint64(b[0:], e.match)
	binary.BigEndian.PutUint32(b[8:], e.msgLen)
	binary.BigEndian.PutUint32(b[12:], e.offset)
}

func (e *eagerHdr) decode(b []byte, payloadLen int) error {
	e.match = binary.BigEndian.Uint64(b[0:])
	e.msgLen = binary.BigEndian.Uint32(b[8:])
	e.offset = binary.BigEndian.Uint32(b[12:])
	if uint64(e.offset)+uint64(payloadLen) > uint64(e.msgLen) {
		return errBadTypeHdr
	}
	return nil
}

type rndvHdr struct {
	match  uint64
	msgLen uint32
	rndvID uint32
}

func (r *rndvHdr) put(b []byte) {
	binary.BigEndian.PutUint64(b[0:], r.match)
	binary.BigEndian.PutUint32(b[8:], r.msgLen)
	binary.BigEndian.PutUint32(b[12:], r.rndvID)
}

func (r *rndvHdr) decode(b []byte) {
	r.match = binary.BigEndian.Uint64(b[0:])
	r.msgLen = binary.BigEndian.Uint32(b[8:])
	r.rndvID = binary.BigEndian.Uint32(b[12:])
}

type notifyHdr struct {
	rndvID  uint32
	xferLen uint32
	code    Code
}

func (n *notifyHdr) put(b []byte) {
	binary.BigEndian.PutUint32(b[0:], n.rndvID)
	binary.BigEndian.PutUint32(b[4:], n.xferLen)
	b[8] = byte(n.code)
	b[9], b[10], b[11] = 0, 0, 0
}

func (n *notifyHdr) decode(b []byte) {
	n.rndvID = binary.BigEndian.Uint32(b[0:])
	n.xferLen = binary.BigEndian.Uint32(b[4:])
	n.code = Code(b[8])
}

type pullReqHdr struct {
	rndvID, pullID uint32
	offset, length uint32 // the block
	mask           uint32 // bit i: frame i of the block is wanted
	frameBytes     uint32 // data per reply frame: frame i starts at offset+i*frameBytes
	key, base      uint64 // with flagRegion: the region's key and the offset of byte 0
}

func (p *pullReqHdr) put(b []byte) {
	binary.BigEndian.PutUint32(b[0:], p.rndvID)
	binary.BigEndian.PutUint32(b[4:], p.pullID)
	binary.BigEndian.PutUint32(b[8:], p.offset)
	binary.BigEndian.PutUint32(b[12:], p.length)
	binary.BigEndian.PutUint32(b[16:], p.mask)
	binary.BigEndian.PutUint32(b[20:], p.frameBytes)
	binary.BigEndian.PutUint64(b[24:], p.key)
	binary.BigEndian.PutUint64(b[32:], p.base)
}

func (p *pullReqHdr) decode(b []byte) {
	p.rndvID = binary.BigEndian.Uint32(b[0:])
	p.pullID = binary.BigEndian.Uint32(b[4:])
	p.offset = binary.BigEndian.Uint32(b[8:])
	p.length = binary.BigEndian.Uint32(b[12:])
	p.mask = binary.BigEndian.Uint32(b[16:])
	p.frameBytes = binary.BigEndian.Uint32(b[20:])
	p.key = binary.BigEndian.Uint64(b[24:])
	p.base = binary.BigEndian.Uint64(b[32:])
}

// putHdr asks the target to pull length bytes of rendezvous putID into
// its region at offset.
type putHdr struct {
	region, putID uint32
	key, offset   uint64
	length        uint32
}

func (p *putHdr) put(b []byte) {
	binary.BigEndian.PutUint32(b[0:], p.region)
	binary.BigEndian.PutUint32(b[4:], p.putID)
	binary.BigEndian.PutUint64(b[8:], p.key)
	binary.BigEndian.PutUint64(b[16:], p.offset)
	binary.BigEndian.PutUint32(b[24:], p.length)
	binary.BigEndian.PutUint32(b[28:], 0)
}

func (p *putHdr) decode(b []byte) {
	p.region = binary.BigEndian.Uint32(b[0:])
	p.putID = binary.BigEndian.Uint32(b[4:])
	p.key = binary.BigEndian.Uint64(b[8:])
	p.offset = binary.BigEndian.Uint64(b[16:])
	p.length = binary.BigEndian.Uint32(b[24:])
}

type pullReplyHdr struct {
	pullID, offset uint32
}

func (p *pullReplyHdr) put(b []byte) {
	binary.BigEndian.PutUint32(b[0:], p.pullID)
	binary.BigEndian.PutUint32(b[4:], p.offset)
}

// putPullReplyOffset rewrites the offset of an encoded pull-reply header
// (b starts at the type header).
func putPullReplyOffset(b []byte, off uint32) {
	binary.BigEndian.PutUint32(b[4:], off)
}

func (p *pullReplyHdr) decode(b []byte) {
	p.pullID = binary.BigEndian.Uint32(b[0:])
	p.offset = binary.BigEndian.Uint32(b[4:])
}

// Small fixed headers: a u32 and a u8 (nack: seq+reason; connect reply:
// connect id+code), two u32 (connect: key+connect id).

func putU32U8(b []byte, v uint32, c uint8) {
	binary.BigEndian.PutUint32(b[0:], v)
	b[4], b[5], b[6], b[7] = c, 0, 0, 0
}

func getU32U8(b []byte) (uint32, uint8) { return binary.BigEndian.Uint32(b[0:]), b[4] }

// putNack writes a nack's type header: the refused frame's sequence number
// (or the id the reason names), the reason, and the session the refused
// frame was addressed to.
func putNack(b []byte, seq uint32, reason uint8, session uint32) {
	putU32U8(b, seq, reason)
	binary.BigEndian.PutUint32(b[8:], session)
}

func getNack(b []byte) (seq uint32, reason uint8, session uint32) {
	seq, reason = getU32U8(b)
	return seq, reason, binary.BigEndian.Uint32(b[8:])
}

// Connect and its reply carry the sender's MTU: frames to a peer are sized
// for the smaller of the two, so a jumbo host and a 1500-byte host talk.

func putConnect(b []byte, key, connID uint32, mtu int) {
	putU32U32(b, key, connID)
	binary.BigEndian.PutUint16(b[8:], uint16(min(mtu, 0xffff)))
	b[10], b[11] = 0, 0
}

func getConnect(b []byte) (key, connID uint32, mtu int) {
	key, connID = getU32U32(b)
	return key, connID, int(binary.BigEndian.Uint16(b[8:]))
}

func putConnReply(b []byte, connID uint32, code Code, mtu int) {
	putU32U8(b, connID, uint8(code))
	binary.BigEndian.PutUint16(b[8:], uint16(min(mtu, 0xffff)))
	b[10], b[11] = 0, 0
}

func getConnReply(b []byte) (connID uint32, code Code, mtu int) {
	connID, c := getU32U8(b)
	return connID, Code(c), int(binary.BigEndian.Uint16(b[8:]))
}

func putU32U32(b []byte, x, y uint32) {
	binary.BigEndian.PutUint32(b[0:], x)
	binary.BigEndian.PutUint32(b[4:], y)
}

func getU32U32(b []byte) (uint32, uint32) {
	return binary.BigEndian.Uint32(b[0:]), binary.BigEndian.Uint32(b[4:])
}

// An ack bundle (tAcks) carries, after the ack of its common header, the
// cumulative acks of other endpoints of the destination host that the
// sending endpoint owes one: one frame, and one wake-up of that host's
// driver, for all of them. A pull request carries the same list as its
// payload (often empty): the acks ride with it.

// ackEntry is one ack of a bundle: to endpoint dstEP, on the connection
// the sender's endpoint knows as (dstSession, srcSession), every frame
// below ack arrived.
type ackEntry struct {
	dstEP      uint8
	dstSession uint32
	srcSession uint32
	ack        uint32
}

func (a *ackEntry) put(b []byte) {
	b[0] = a.dstEP
	binary.BigEndian.PutUint32(b[1:], a.dstSession)
	binary.BigEndian.PutUint32(b[5:], a.srcSession)
	binary.BigEndian.PutUint32(b[9:], a.ack)
}

func (a *ackEntry) decode(b []byte) {
	a.dstEP = b[0]
	a.dstSession = binary.BigEndian.Uint32(b[1:])
	a.srcSession = binary.BigEndian.Uint32(b[5:])
	a.ack = binary.BigEndian.Uint32(b[9:])
}
