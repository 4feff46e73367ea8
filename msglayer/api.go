package msglayer

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"time"

	"github.com/xmx-stack/xmx/xdp"
)

// Connect connects to the endpoint at a, presenting key, and waits for the
// answer: after it, Isend to a works. A wrong key fails with ErrBadKey, a
// missing endpoint with ErrBadEndpoint, silence with ErrTimeout, and a
// connect that the peer took but then disconnected us before its answer
// arrived with ErrAborted.
func (e *Endpoint) Connect(ctx context.Context, a Addr, key uint32) error {
	r, err := e.iconnect(a, key, 0, nil, true, nil)
	if err != nil {
		return err
	}
	st, err := e.Wait(ctx, r)
	if err != nil {
		if st.Code == Success { // the context ended first
			e.Cancel(r)
			e.Forget(r)
		}
		return fmt.Errorf("msglayer: connect %v to %v: %w", e.addr, a, err)
	}
	return nil
}

// IConnect starts connecting to a and returns the request to wait on. Its
// completion carries match in Status.Match, as MX's mx_iconnect's
// match_info: TestAny and WaitAny find it by that, so a connect can be
// told from the messages a wait for any request is after.
func (e *Endpoint) IConnect(a Addr, key uint32, match uint64, ctx any) (Request, error) {
	return e.iconnect(a, key, match, ctx, false, nil)
}

// iconnect is IConnect; a private request (Connect's, which waits for it)
// is left out of the done queue, where TestAny, WaitAny and Peek of other
// goroutines would find it; one posted into group grp completes there.
func (e *Endpoint) iconnect(a Addr, key uint32, match uint64, ctx any, private bool, grp *Group) (Request, error) {
	if a.MAC[0]&1 != 0 {
		return Request{}, &ArgError{Arg: "address", Err: fmt.Errorf("%v is a group (broadcast or multicast) address", a)}
	}
	g := e.eng
	g.mu.Lock()
	if e.closed {
		g.mu.Unlock()
		return Request{}, ErrClosed
	}
	now := g.readClock()
	r := e.newRequest(kindConnect, ctx)
	r.private, r.group = private, grp
	if grp != nil {
		grp.posted++
	}
	r.status.Source, r.status.Match = a, match
	r.connAddr, r.connKey = a, key
	if a.MAC == g.mac {
		// Same NIC, same process: no frame needed.
		e.connectLocal(r, a, key, now)
	} else {
		r.connID = e.newConnID()
		r.connDeadline = now + int64(e.cfg.GiveUp)
		e.peerFor(a) // the connect comes from its id
		e.connects = append(e.connects, r)
		e.sendConnect(r, now)
	}
	h := Request{r, r.gen}
	g.flushAndUnlock()
	return h, nil
}

// connectLocal connects to an endpoint of this engine.
//
// +checklocks:e.eng.mu
func (e *Endpoint) connectLocal(r *request, a Addr, key uint32, now int64) {
	t := e.eng.eps[a.EP]
	switch {
	case t == nil:
		e.complete(r, BadEndpoint)
	case t.cfg.Key != key:
		e.complete(r, BadKey)
	default:
		p, tp := e.peerFor(a), t.peerFor(e.addr)
		p.setDialed(true) // same-process records are not MaxPeers' either
		tp.setDialed(true)
		p.local, p.connected, p.dead, p.mtu = t, true, false, e.eng.mtu
		tp.local, tp.connected, tp.dead, tp.mtu = e, true, false, e.eng.mtu
		p.remoteID, p.remoteGen = tp.localID, tp.localGen
		tp.remoteID, tp.remoteGen = p.localID, p.localGen
		e.complete(r, Success)
	}
}

// sendConnect sends (or resends) a connect request.
//
// +checklocks:e.eng.mu
func (e *Endpoint) sendConnect(r *request, now int64) {
	g := e.eng
	b := g.scratchBuf()
	// The connect comes from our id, of the generation it says (a reset
	// sends it again from the new one), and names the peer's id we last
	// knew.
	p := e.peers[r.connAddr]
	h := header{typ: tConnect, dstEP: r.connAddr.EP, srcEP: e.id, srcSession: p.localID, dstSession: p.remoteID, seq: p.localGen}
	p.shown = true
	th := putHeader(b, &r.connAddr.MAC, &g.mac, g.ethType, &h)
	putConnect(th, r.connKey, r.connID, g.mtu)
	e.sendFrame(padded(b, tConnect, 0))
	r.connNext = now + int64(e.cfg.ConnectRetry)
	e.armAt(r.connNext)
}

// connectTimers resends connects and times them out.
//
// +checklocks:e.eng.mu
func (e *Endpoint) connectTimers(now int64) int64 {
	next := int64(0)
	kept := e.connects[:0]
	for _, r := range e.connects {
		switch {
		case now >= r.connDeadline:
			e.complete(r, Timeout)
			continue
		case now >= r.connNext:
			e.sendConnect(r, now)
		}
		if next == 0 || r.connNext < next {
			next = r.connNext
		}
		kept = append(kept, r)
	}
	clear(e.connects[len(kept):])
	e.connects = kept
	return next
}

// Disconnect forgets the peer at a: pending operations with it, connects
// under way among them, complete with Aborted, and a new Connect is needed
// to send to it again.
func (e *Endpoint) Disconnect(a Addr) {
	g := e.eng
	g.mu.Lock()
	if e.closed {
		g.mu.Unlock() // Close forgot every peer
		return
	}
	// Before the reset, whose new id would send them again.
	kept := e.connects[:0]
	for _, r := range e.connects {
		if r.connAddr == a {
			e.complete(r, Aborted)
			continue
		}
		kept = append(kept, r)
	}
	if len(kept) < len(e.connects) {
		clear(e.connects[len(kept):])
		e.connects = kept
		g.signal()
	}
	if p := e.peers[a]; p != nil {
		if p.local == nil && p.connected {
			p.sendCtl(tDisconnect, 0, nil)
		}
		if t := p.local; t != nil && p.connected {
			// What a disconnect frame does to a remote peer.
			if tp := t.peers[e.addr]; tp != nil && tp.local == e && tp.connected {
				tp.reset(Aborted)
			}
		}
		// The record stays, with a new id: the peer learns at the next
		// connect that this side forgot.
		p.reset(Aborted)
	}
	g.flushAndUnlock()
}

// Resolve finds the NIC of the host named name on the segment by a
// broadcast query (every xmx process answers for its own host name) and
// returns the address of endpoint ep on it.
func (e *Endpoint) Resolve(ctx context.Context, name string, ep uint8) (Addr, error) {
	if len(name) == 0 || len(name) > maxHostNameLen {
		return Addr{}, &ArgError{Arg: "host name", Err: fmt.Errorf("%q: want 1..%d bytes", name, maxHostNameLen)}
	}
	g := e.eng
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
	}
	g.mu.Lock()
	if e.closed {
		g.mu.Unlock()
		return Addr{}, ErrClosed
	}
	if g.hostnames[name] > 0 {
		g.mu.Unlock()
		return Addr{MAC: g.mac, EP: ep}, nil
	}
	// Resolves of one name at once share the query and its answer.
	q := g.hostReplies[name]
	if q == nil {
		q = &hostQuery{answered: make(chan struct{})}
		g.hostReplies[name] = q
	}
	q.waiters++
	g.mu.Unlock()
	defer func() {
		g.mu.Lock()
		if q.waiters--; q.waiters == 0 {
			delete(g.hostReplies, name)
		}
		g.mu.Unlock()
	}()
	found := func() (Addr, bool) {
		g.mu.Lock()
		defer g.mu.Unlock()
		return Addr{MAC: q.mac, EP: ep}, q.mac != [6]byte{} || e.closed
	}
	for {
		g.mu.Lock()
		if e.closed {
			g.mu.Unlock()
			return Addr{}, ErrClosed
		}
		b := g.scratchBuf()
		h := header{typ: tHostQuery, srcEP: e.id, dstEP: 0xff, payloadLen: len(name)}
		p := putHeader(b, &broadcastMAC, &g.mac, g.ethType, &h)
		copy(p, name)
		e.sendFrame(padded(b, tHostQuery, len(name)))
		g.flushAndUnlock()
		// One query per 100 ms: a wait that ends sooner (the engine
		// closed) ends the loop above.
		qctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
		err := g.waitFor(qctx, func() bool { _, ok := found(); return ok }, q.answered)
		cancel()
		if a, ok := found(); ok && a.MAC != [6]byte{} {
			return a, nil
		}
		if errors.Is(err, ErrClosed) {
			return Addr{}, ErrClosed
		}
		if ctx.Err() != nil {
			return Addr{}, fmt.Errorf("msglayer: resolve host %q: %w", name, ErrTimeout)
		}
		if err != nil && !errors.Is(err, context.DeadlineExceeded) {
			return Addr{}, fmt.Errorf("msglayer: resolve host %q: %w", name, err)
		}
	}
}

// Isend sends the concatenation of segs to dst with match info match. The
// request completes once the receiver has the message (eager) or has
// pulled it (rendezvous); the buffers must not change before Ibuffered or
// completion says so.
func (e *Endpoint) Isend(dst Addr, match uint64, segs [][]byte, ctx any) (Request, error) {
	return e.isend(dst, match, segs, ctx, false, nil)
}

// Issend is a synchronous send: it completes only once a receive matched
// the message.
func (e *Endpoint) Issend(dst Addr, match uint64, segs [][]byte, ctx any) (Request, error) {
	return e.isend(dst, match, segs, ctx, true, nil)
}

func (e *Endpoint) isend(dst Addr, match uint64, segs [][]byte, ctx any, sync bool, grp *Group) (Request, error) {
	xdp.Trace(e.eng.traceSide, xdp.TraceSendCall)
	n, err := checkSegs(segs)
	if err != nil {
		return Request{}, err
	}
	p, err := e.lockPeer(dst, "send to")
	if err != nil {
		return Request{}, err
	}
	g := e.eng
	r := e.newRequest(kindSend, ctx)
	r.peer, r.match, r.segs, r.length, r.sync, r.group = p, match, segs, n, sync, grp
	if grp != nil {
		grp.posted++
	}
	r.status.Source, r.status.Match, r.status.MsgLen = dst, match, n
	e.stats.Sends++
	h := Request{r, r.gen}
	switch {
	case p.dead:
		e.complete(r, Unreachable)
	case p.local != nil:
		e.sendLocal(p, r)
	default:
		r.rndv = sync || n > e.cfg.RendezvousThreshold
		if r.rndv {
			e.offerRndv(p, r)
		}
		if p.sendHead != nil || !e.frameMessage(p, r, atSend) {
			p.pushSend(r)
		}
	}
	xdp.Trace(g.traceSide, xdp.TraceFramed)
	g.flushAndUnlock()
	return h, nil
}

// offerRndv makes r a rendezvous p may pull (a large or synchronous send,
// or a Put): it gets an id, and its data is pulled from the lent buffer it
// lies in, if any, without a copy.
//
// +checklocks:e.eng.mu
func (e *Endpoint) offerRndv(p *peer, r *request) {
	if g := e.eng; len(g.bufs) > 0 && len(r.segs) == 1 {
		r.zbuf, r.zoff = g.spanOf(r.segs[0])
	}
	r.rndvID = freeID(e, e.rndvs)
	e.rndvs[r.rndvID] = r
	p.rndvs++
}

// lockPeer takes the engine lock and returns the connected (or dead) peer
// at a; on error the lock is not held. op names the operation for the
// error.
func (e *Endpoint) lockPeer(a Addr, op string) (*peer, error) {
	e.eng.mu.Lock()
	if e.closed {
		e.eng.mu.Unlock()
		return nil, ErrClosed
	}
	p := e.peerAt(a)
	if p == nil || (!p.connected && !p.dead) {
		e.eng.mu.Unlock()
		return nil, fmt.Errorf("msglayer: %s %v: %w", op, a, ErrNotConnected)
	}
	return p, nil
}

// newConnID returns a fresh connect id.
//
// +checklocks:e.eng.mu
func (e *Endpoint) newConnID() uint32 {
	e.nextConnID++
	return e.nextConnID
}

// newID returns a fresh id for rendezvous, pulls and registrations.
//
// +checklocks:e.eng.mu
func (e *Endpoint) newID() uint32 {
	e.nextID++
	if e.nextID == 0 {
		e.nextID++
	}
	return e.nextID
}

// freeID returns a fresh id (newID) that live does not hold: the 32-bit
// counter may have come round to one still in use.
//
// +checklocks:e.eng.mu
func freeID[V any](e *Endpoint, live map[uint32]*V) uint32 {
	for {
		if id := e.newID(); live[id] == nil {
			return id
		}
	}
}

// Irecv posts a receive for a message whose match info m satisfies
// m&mask == info. info must have no bit outside mask.
func (e *Endpoint) Irecv(info, mask uint64, segs [][]byte, ctx any) (Request, error) {
	return e.irecv(info, mask, segs, ctx, nil)
}

// checkMatch refuses a pair that no match info can satisfy: info with a
// bit outside mask.
func checkMatch(info, mask uint64) error {
	if info&^mask != 0 {
		return badMatch(info, mask) // out of line: checkMatch inlines
	}
	return nil
}

func badMatch(info, mask uint64) error {
	return &ArgError{Arg: fmt.Sprintf("match info %#x (mask %#x)", info, mask), Err: ErrBadMatchMask}
}

func (e *Endpoint) irecv(info, mask uint64, segs [][]byte, ctx any, grp *Group) (Request, error) {
	if err := checkMatch(info, mask); err != nil {
		return Request{}, err
	}
	if c := e.match.ctxBits(); mask&c != c {
		return Request{}, &ArgError{Arg: fmt.Sprintf("mask %#x (context id bits %#x)", mask, c), Err: ErrBadMatchMask}
	}
	n, err := checkSegs(segs)
	if err != nil {
		return Request{}, err
	}
	g := e.eng
	g.mu.Lock()
	if e.closed {
		g.mu.Unlock()
		return Request{}, ErrClosed
	}
	r := e.newRequest(kindRecv, ctx)
	r.info, r.mask, r.segs, r.length, r.group = info, mask, segs, n, grp
	// A message's match info replaces it; a receive that ends without
	// one (Cancel, Close) keeps its own, for TestAny and WaitAny to tell
	// it from others.
	r.status.Match = info
	if grp != nil {
		grp.posted++
	}
	e.stats.Recvs++
	h := Request{r, r.gen}
	if u := e.match.post(info, mask); u != nil {
		e.takeUnexp(r, u, g.readClock())
	} else {
		e.match.pushRecv(r)
	}
	e.heldRoom() // a record taken, or a receive a held message may match
	g.flushAndUnlock()
	return h, nil
}

// Test reports whether the request completed; if so it returns its status
// and spends the handle. If not, and no other goroutine drives the link,
// it makes progress (polls the link once, without waiting) and looks again,
// as the other calls that look without waiting do (TestAny, IPeek, Iprobe,
// Ibuffered, Group.Test): a loop of them drives the link by itself.
func (e *Endpoint) Test(h Request) (Status, bool, error) {
	if st, ok, err := e.test(h); ok || err != nil || !e.eng.progress() {
		return st, ok, err
	}
	return e.test(h)
}

func (e *Endpoint) test(h Request) (Status, bool, error) {
	g := e.eng
	g.mu.Lock()
	defer g.flushAndUnlock() // what a settle of acks framed goes out
	if err := h.checkOn(e); err != nil {
		return Status{}, false, err
	}
	r := h.r
	if !r.done {
		g.settleAcks() // an ack the driver left may complete it
	}
	if !r.done {
		return Status{}, false, nil
	}
	return e.collect(r), true, nil
}

// collect takes a completed request out of its done queue and releases
// it, returning its status.
//
// +checklocks:e.eng.mu
func (e *Endpoint) collect(r *request) Status {
	st := r.status
	e.collectTo(r, nil)
	return st
}

// collectTo is collect copying the status to st (unless nil) rather than
// returning it: a status returned by value is stored field by field and
// then copied whole into the caller's variable, which costs a failed
// store-to-load forwarding (the driver collects its Wait's request so).
//
// +checklocks:e.eng.mu
func (e *Endpoint) collectTo(r *request, st *Status) {
	if gr := r.group; gr != nil {
		gr.remove(r)
	} else {
		e.done.remove(r)
	}
	if st != nil {
		*st = r.status
	}
	e.release(r)
}

// Wait waits for the request to complete and returns its status; the
// error is the status as an error (nil on success) or the context's. A
// handle is collected once: of two Waits on it at the same time, or a
// Wait and a Test, TestAny, WaitAny, Forget or group wait that collects or
// forgets the request meanwhile, one gets the status and the others
// ErrStaleRequest.
func (e *Endpoint) Wait(ctx context.Context, h Request) (Status, error) {
	r := h.r
	if r == nil || r.liveGen.Load() != h.gen {
		// Spent (by Test, Forget or another Wait), or recycled: waiting
		// on it could last for ever.
		return Status{}, ErrStaleRequest
	}
	if r.ep != e {
		return Status{}, ErrForeignRequest
	}
	// Completion signals r.wake only while someone may sleep on it (the
	// goroutine driving the link sees the completion by itself, and
	// collects the request while it holds the engine lock). The wait
	// also ends when the handle is spent meanwhile (another goroutine
	// collected or forgot it), which release and Forget signal.
	done := func() bool { return r.doneFlag.Load() || r.liveGen.Load() != h.gen }
	st, reaped, err := e.eng.waitForSleeping(ctx, done, r.wake, &r.waiters, reaping{h, e})
	if err != nil {
		return Status{}, err
	}
	if reaped {
		return st, st.Err()
	}
	st, ok, err := e.Test(h)
	if errors.Is(err, ErrStaleRequest) {
		// The wake that ended the wait may have been meant for the
		// request's next use, or for another goroutine asleep on the
		// spent handle: pass it on (one too many only wakes a waiter
		// to look again).
		r.poke()
	}
	if err != nil {
		return st, err
	}
	if !ok {
		return st, ErrStaleRequest
	}
	return st, st.Err()
}

// TestAny completes the oldest finished request (not in a group) whose
// match info m satisfies m&mask == info. With a bit of info outside mask
// nothing fits: false (WaitAny refuses such a pair). It makes progress as
// Test does.
func (e *Endpoint) TestAny(info, mask uint64) (Status, bool) {
	if st, ok := e.testAny(info, mask); ok || !e.eng.progress() {
		return st, ok
	}
	return e.testAny(info, mask)
}

func (e *Endpoint) testAny(info, mask uint64) (Status, bool) {
	g := e.eng
	g.mu.Lock()
	defer g.flushAndUnlock() // what a settle of acks framed goes out
	r := e.done.find(info, mask)
	if r == nil && g.settleAcks() {
		r = e.done.find(info, mask)
	}
	if r != nil {
		return e.collect(r), true
	}
	return Status{}, false
}

// testHookWaitAny, when set by a test, runs in WaitAny between its look at
// the done queue and its wait.
var testHookWaitAny func()

// WaitAny waits for a request (not in a group) whose match info fits
// (info, mask) to complete, and completes it. A pair with a bit of info
// outside mask, which nothing fits, is refused (ErrBadMatchMask).
func (e *Endpoint) WaitAny(ctx context.Context, info, mask uint64) (Status, error) {
	if err := checkMatch(info, mask); err != nil {
		return Status{}, err
	}
	g := e.eng
	for {
		// Look, register as a waiter and note the completion count under
		// one hold of the lock (completions happen under it): a completion
		// right after the look would otherwise be counted in seen and
		// signal nobody, and the wait would miss it.
		g.mu.Lock()
		if r := e.done.find(info, mask); r != nil {
			st := e.collect(r)
			g.mu.Unlock()
			return st, st.Err()
		}
		if e.closed {
			g.mu.Unlock()
			return Status{}, ErrClosed
		}
		w := e.addAnyWaiter()
		seen := g.completion.Load()
		g.mu.Unlock()
		if testHookWaitAny != nil {
			testHookWaitAny()
		}
		err := g.waitFor(ctx, func() bool {
			if c := g.completion.Load(); c != seen {
				seen = c
				g.mu.Lock()
				found := e.closed || e.done.find(info, mask) != nil
				g.mu.Unlock()
				return found
			}
			return false
		}, w.wake)
		g.mu.Lock()
		e.removeAnyWaiter(w)
		g.mu.Unlock()
		if err != nil {
			return Status{}, err
		}
	}
}

// IPeek returns the oldest completed request (not in a group) without
// completing it. It makes progress as Test does.
func (e *Endpoint) IPeek() (Request, bool) {
	if h, ok := e.ipeek(); ok || !e.eng.progress() {
		return h, ok
	}
	return e.ipeek()
}

func (e *Endpoint) ipeek() (Request, bool) {
	g := e.eng
	g.mu.Lock()
	defer g.flushAndUnlock() // what a settle of acks framed goes out
	if e.done.head == nil {
		g.settleAcks()
	}
	if r := e.done.head; r != nil {
		return Request{r, r.gen}, true
	}
	return Request{}, false
}

// Peek waits until a request (not in a group) completes and returns it
// without completing it.
func (e *Endpoint) Peek(ctx context.Context) (Request, error) {
	g := e.eng
	for {
		// As in WaitAny: look and note the count under one hold of the lock.
		g.mu.Lock()
		if r := e.done.head; r != nil {
			// The handle is made under the lock: once it is released,
			// another goroutine may collect r and recycle it.
			h := Request{r, r.gen}
			g.mu.Unlock()
			return h, nil
		}
		if e.closed {
			g.mu.Unlock()
			return Request{}, ErrClosed
		}
		w := e.addAnyWaiter()
		seen := g.completion.Load()
		g.mu.Unlock()
		err := g.waitFor(ctx, func() bool { return g.completion.Load() != seen }, w.wake)
		g.mu.Lock()
		e.removeAnyWaiter(w)
		g.mu.Unlock()
		if err != nil {
			return Request{}, err
		}
	}
}

// Iprobe reports whether an unexpected message fitting (info, mask) has
// arrived, without receiving it. Status.Code is Success, MsgLen its length
// and XferLen 0, as nothing was received. With a bit of info outside mask
// nothing fits: false (Probe refuses such a pair). It makes progress as
// Test does.
//
// A message is reported from its first frame on, while the rest may still
// be arriving: it is the message the next receive fitting (info, mask)
// takes, in the order receives match. If its sender is given up before the
// message is whole, the message is dropped, and a receive that took it
// completes with Unreachable.
func (e *Endpoint) Iprobe(info, mask uint64) (Status, bool) {
	if st, ok := e.iprobe(info, mask); ok || !e.eng.progress() {
		return st, ok
	}
	return e.iprobe(info, mask)
}

func (e *Endpoint) iprobe(info, mask uint64) (Status, bool) {
	g := e.eng
	g.mu.Lock()
	defer g.mu.Unlock()
	u := e.match.probe(info, mask)
	if u == nil {
		return Status{}, false
	}
	return Status{Source: u.src.addr, Match: u.match, MsgLen: int(u.msgLen)}, true
}

// Probe waits for an unexpected message fitting (info, mask) and reports
// it as Iprobe does. A pair with a bit of info outside mask, which nothing
// fits, is refused (ErrBadMatchMask).
func (e *Endpoint) Probe(ctx context.Context, info, mask uint64) (Status, error) {
	if err := checkMatch(info, mask); err != nil {
		return Status{}, err
	}
	g := e.eng
	var st Status
	var ok bool
	var closed bool
	seen := ^uint64(0)
	// Registered as an any-waiter, so that an unexpected arrival wakes
	// this goroutine even while another one drives the link.
	g.mu.Lock()
	if e.closed {
		g.mu.Unlock()
		return Status{}, ErrClosed
	}
	w := e.addAnyWaiter()
	g.mu.Unlock()
	err := g.waitFor(ctx, func() bool {
		// Unexpected arrivals count as completions for waking purposes.
		if c := g.completion.Load(); c != seen {
			seen = c
			if st, ok = e.Iprobe(info, mask); !ok {
				g.mu.Lock()
				closed = e.closed
				g.mu.Unlock()
			}
		}
		return ok || closed
	}, w.wake)
	g.mu.Lock()
	e.removeAnyWaiter(w)
	g.mu.Unlock()
	if err == nil && !ok {
		err = ErrClosed
	}
	return st, err
}

// Cancel takes back an unmatched receive or a pending connect: it then
// completes with Cancelled and Cancel returns true. A receive that already
// matched cannot be cancelled (false), nor a Get, which is under way from
// the start; sends are refused (ErrNotCancelled).
func (e *Endpoint) Cancel(h Request) (bool, error) {
	g := e.eng
	g.mu.Lock()
	defer g.mu.Unlock()
	if err := h.checkOn(e); err != nil {
		return false, err
	}
	r := h.r
	switch r.kind {
	case kindSend:
		return false, ErrNotCancelled
	default: // a Get: its pull runs
		return false, nil
	case kindRecv:
		if !r.queued {
			return false, nil
		}
		e.match.removeRecv(r)
	case kindConnect:
		i := -1
		for j, c := range e.connects {
			if c == r {
				i = j
			}
		}
		if i < 0 {
			return false, nil
		}
		e.connects = append(e.connects[:i], e.connects[i+1:]...)
	}
	e.complete(r, Cancelled)
	g.signal()
	return true, nil
}

// Forget says no completion of the request will be asked for: its
// resources are freed once it completes (at once if it has).
func (e *Endpoint) Forget(h Request) error {
	g := e.eng
	g.mu.Lock()
	defer g.mu.Unlock()
	if err := h.checkOn(e); err != nil {
		return err
	}
	r := h.r
	if r.done {
		e.collect(r)
		return nil
	}
	// The handle is spent now, as after a completion reported: the
	// request runs on under a generation no handle names, and release
	// frees it when it completes.
	r.forgotten = true
	r.gen++
	r.liveGen.Store(r.gen)
	if r.waiters.Load() > 0 {
		r.poke() // a Wait asleep on the handle: it is spent
	}
	return nil
}

// Ibuffered reports whether a send's buffers may be reused already. It
// makes progress as Test does.
func (e *Endpoint) Ibuffered(h Request) (bool, error) {
	if ok, err := e.ibuffered(h); ok || err != nil || !e.eng.progress() {
		return ok, err
	}
	return e.ibuffered(h)
}

func (e *Endpoint) ibuffered(h Request) (bool, error) {
	g := e.eng
	g.mu.Lock()
	defer g.mu.Unlock()
	if err := h.checkOn(e); err != nil {
		return false, err
	}
	// Pull replies still to be built from the data pin it (txRefs), even
	// once the notify said the receiver has it all.
	return (h.r.buffered && h.r.txRefs == 0) || h.r.done, nil
}

// Group is a completion group: requests posted through it complete into
// the group's own queue, which one goroutine waits on (the seeds'
// "events spread over several queues, each owned by a thread"). A group
// may span several endpoints of one link in a process (On): one
// goroutine then waits for all of their completions, with no goroutine
// per endpoint to wake.
type Group struct {
	e *Endpoint // the endpoint Isend, Issend and Irecv post on
	*groupQueue
}

// groupQueue is what the views of one group (On) share.
type groupQueue struct {
	eng  *engine
	q    doneQueue    // guarded by the engine lock
	n    atomic.Int64 // requests in q: a waiter peeks at it without the lock
	wake chan struct{}
	// views are the endpoints the group's views post on, and waiting
	// counts the goroutines in Wait: while there are some, the group is
	// in each open view's groupWaiting, so that its Close wakes them.
	// +checklocks:eng.mu
	views []*Endpoint
	// +checklocks:eng.mu
	waiting int
	// posted counts the requests posted into the group and not completed
	// yet: after the views closed, some may still complete (a send whose
	// pull replies were being sent completes once they are out).
	// +checklocks:eng.mu
	posted int
	// shut is set (under the engine lock) once every view closed and
	// every request posted completed (noteOver), and cleared when an open
	// endpoint joins (On): a waiter looks at it without the lock.
	shut atomic.Bool
}

// over reports whether the group's Waits are over: every view closed,
// every request posted into it completed and taken.
//
// +checklocks:gr.eng.mu
func (gr *groupQueue) over() bool {
	return gr.q.head == nil && gr.posted == 0 && gr.viewsClosed()
}

// noteOver marks the group shut once every view closed and every
// request posted into it completed (Close, complete), and wakes a
// waiter: each that leaves with ErrClosed wakes the next (Wait).
//
// +checklocks:gr.eng.mu
func (gr *groupQueue) noteOver() {
	if gr.posted == 0 && gr.viewsClosed() {
		gr.shut.Store(true)
		gr.poke()
	}
}

// poke signals the group's wake without blocking.
func (gr *groupQueue) poke() {
	select {
	case gr.wake <- struct{}{}:
	default:
	}
}

// viewsClosed reports whether every endpoint of the group is closed: no
// request can be posted into it any more.
//
// +checklocks:gr.eng.mu
func (gr *groupQueue) viewsClosed() bool {
	for _, e := range gr.views {
		if !e.closed {
			return false
		}
	}
	return true
}

// watch counts a goroutine in Wait; the first one puts the group in its
// open views' groupWaiting.
//
// +checklocks:gr.eng.mu
func (gr *groupQueue) watch() {
	if gr.waiting++; gr.waiting == 1 {
		for _, e := range gr.views {
			if !e.closed {
				e.groupWaiting = append(e.groupWaiting, gr)
			}
		}
	}
}

// unwatch ends a goroutine's Wait; the last one takes the group out of
// its views' groupWaiting.
//
// +checklocks:gr.eng.mu
func (gr *groupQueue) unwatch() {
	if gr.waiting--; gr.waiting == 0 {
		for _, e := range gr.views {
			if i := slices.Index(e.groupWaiting, gr); i >= 0 {
				e.groupWaiting = slices.Delete(e.groupWaiting, i, i+1)
			}
		}
	}
}

// push queues the completed request r. The caller holds the engine lock.
func (gr *groupQueue) push(r *request) {
	gr.q.push(r)
	gr.n.Add(1)
}

// remove takes r out of the queue, if it is in it. The caller holds the
// engine lock.
func (gr *groupQueue) remove(r *request) {
	if r.inDoneQ {
		gr.q.remove(r)
		gr.n.Add(-1)
	}
}

// NewGroup makes a completion group on the endpoint.
func (e *Endpoint) NewGroup() *Group {
	gq := &groupQueue{eng: e.eng, wake: make(chan struct{}, 1)}
	e.eng.mu.Lock()
	gq.views = []*Endpoint{e}
	e.eng.mu.Unlock()
	return &Group{e: e, groupQueue: gq}
}

// On returns a view of the group through which requests of endpoint e
// complete into the group's queue: Test and Wait on any view take the
// completions of every endpoint the group was used on. e must be on the
// same link of this process as the group's endpoint.
func (gr *Group) On(e *Endpoint) (*Group, error) {
	if e.eng != gr.eng {
		return nil, &ArgError{Arg: fmt.Sprintf("endpoint %v for a group of %v", e.Addr(), gr.e.Addr()), Err: ErrOtherLink}
	}
	g := gr.eng
	g.mu.Lock()
	if !slices.Contains(gr.views, e) {
		gr.views = append(gr.views, e)
		if !e.closed {
			gr.shut.Store(false)
			if gr.waiting > 0 {
				e.groupWaiting = append(e.groupWaiting, gr.groupQueue)
			}
		}
	}
	g.mu.Unlock()
	return &Group{e: e, groupQueue: gr.groupQueue}, nil
}

// Isend is Endpoint.Isend with completion into the group.
func (gr *Group) Isend(dst Addr, match uint64, segs [][]byte, ctx any) (Request, error) {
	return gr.e.isend(dst, match, segs, ctx, false, gr)
}

// Issend is Endpoint.Issend with completion into the group.
func (gr *Group) Issend(dst Addr, match uint64, segs [][]byte, ctx any) (Request, error) {
	return gr.e.isend(dst, match, segs, ctx, true, gr)
}

// IConnect is Endpoint.IConnect with completion into the group.
func (gr *Group) IConnect(a Addr, key uint32, match uint64, ctx any) (Request, error) {
	return gr.e.iconnect(a, key, match, ctx, false, gr)
}

// Irecv is Endpoint.Irecv with completion into the group.
func (gr *Group) Irecv(info, mask uint64, segs [][]byte, ctx any) (Request, error) {
	return gr.e.irecv(info, mask, segs, ctx, gr)
}

// Test completes the oldest finished request of the group (of any of
// the endpoints it spans). It makes progress as Endpoint.Test does.
func (gr *Group) Test() (Status, bool) {
	if st, ok := gr.test(); ok || !gr.eng.progress() {
		return st, ok
	}
	return gr.test()
}

func (gr *Group) test() (Status, bool) {
	g := gr.eng
	g.mu.Lock()
	defer g.flushAndUnlock() // what a settle of acks framed goes out
	if gr.q.head == nil {
		g.settleAcks()
	}
	if r := gr.q.head; r != nil {
		return r.ep.collect(r), true
	}
	return Status{}, false
}

// Wait waits for a request of the group to complete and completes it.
// Once every endpoint of the group is closed and every request posted
// into it has completed and been taken, it returns ErrClosed with a zero
// Status. A request that completed with Closed (its endpoint closed
// under it) comes with an error that is ErrClosed too, and its Status
// (Code Closed): a loop taking every completion ends at ErrClosed with
// a Code other than Closed, not at the first ErrClosed.
func (gr *Group) Wait(ctx context.Context) (Status, error) {
	g := gr.eng
	for {
		if st, ok := gr.Test(); ok {
			if gr.n.Load() > 0 || gr.shut.Load() {
				// More are queued, or the group is over: another waiter
				// may have missed its wake (wake holds one signal).
				gr.poke()
			}
			return st, st.Err()
		}
		g.mu.Lock()
		if gr.over() {
			g.mu.Unlock()
			gr.poke() // pass the wake on to the next waiter, if any
			return Status{}, ErrClosed
		}
		gr.watch()
		g.mu.Unlock()
		err := g.waitFor(ctx, func() bool {
			// The queue head is read without the lock only as a hint; Test
			// above rechecks under it.
			return gr.n.Load() > 0 || gr.shut.Load()
		}, gr.wake)
		g.mu.Lock()
		gr.unwatch()
		late := errors.Is(err, ErrClosed) && gr.q.head == nil && !gr.over()
		resolved := errors.Is(err, ErrClosed) && !late
		g.mu.Unlock()
		if resolved {
			continue // a completion to take, or the group is over
		}
		if late {
			// The engine stopped with requests of the group still to
			// complete, which the flush under way completes: wait for
			// them without driving.
			select {
			case <-gr.wake:
				continue
			case <-ctx.Done():
				return Status{}, ctx.Err()
			}
		}
		if err != nil {
			return Status{}, err
		}
	}
}
