package msglayer

import (
	"math"
	"testing"
	"time"
)

// The tests of this file hold the records of peers that connect to an
// endpoint to MaxPeers: a flood of connects from new addresses (forged,
// with the right key) costs bounded memory, idle records are given to new
// peers, and connections under way are never the ones given up.

// forgeConnect hands b a connect from a new address i (MAC and session
// made of i), with b's key, and returns the reply b sent.
func forgeConnect(n *manNet, b *Endpoint, i int) (code Code, replied bool) {
	l := n.lb
	if b == n.a {
		l = n.la
	}
	g := b.eng
	src := [6]byte{0x02, 0x11, byte(i >> 16), byte(i >> 8), byte(i), 0}
	f := make([]byte, 128)
	h := header{typ: tConnect, dstEP: b.id, srcEP: 1, srcSession: uint32(i)<<8 | 1}
	th := putHeader(f, &g.mac, &src, g.ethType, &h)
	putConnect(th, b.cfg.Key, 1, 1500)
	n.deliver(b, padded(f, tConnect, 0))
	for _, r := range l.take() {
		rh, err := decodeHeader(r)
		if err != nil || rh.typ != tConnectReply || [6]byte(r[0:6]) != src {
			continue
		}
		rt, _ := typeHdr(r, &rh)
		_, code, _ = getConnReply(rt)
		return code, true
	}
	return 0, false
}

func TestPeerRecordsBounded(t *testing.T) {
	const maxPeers = 8
	n := newManNetCfg(t, Config{}, Config{MaxPeers: maxPeers})
	a, b := n.a, n.b
	g := b.eng
	records := func() (peers, hosts int) {
		g.mu.Lock()
		defer g.mu.Unlock()
		return len(b.peers), len(g.hosts)
	}

	// a's record is one; the flood fills the rest and is refused beyond.
	const flood = 200
	for i := range flood {
		code, ok := forgeConnect(n, b, i+1)
		if want := Success; i >= maxPeers-1 {
			want = Aborted
			if !ok || code != want {
				t.Fatalf("connect %d from a new address at MaxPeers: reply %v (%v), want %v", i, code, ok, want)
			}
		} else if !ok || code != want {
			t.Fatalf("connect %d from a new address below MaxPeers: reply %v (%v), want %v", i, code, ok, want)
		}
	}
	if p, h := records(); p != maxPeers || h > maxPeers {
		t.Errorf("after %d connects from new addresses: %d peer records, %d host records; want %d, at most %d", flood, p, h, maxPeers, maxPeers)
	}
	c := b.Counters()
	if c.PeersRefused != flood-(maxPeers-1) || c.PeersEvicted != 0 {
		t.Errorf("PeersRefused %d, PeersEvicted %d; want %d, 0", c.PeersRefused, c.PeersEvicted, flood-(maxPeers-1))
	}
	// a, heard recently, is not given up, and messages go both ways.
	n.exchange(a, b, 1)
	n.exchange(b, a, 2)

	// A disconnected record is given to a new peer at once (after the
	// pause that follows a look that found none).
	n.clock.Advance(2 * time.Millisecond)
	gone := Addr{MAC: [6]byte{0x02, 0x11, 0, 0, 3, 0}, EP: 1}
	b.Disconnect(gone)
	n.lb.take()
	if code, ok := forgeConnect(n, b, 1000); !ok || code != Success {
		t.Fatalf("a connect with a disconnected record to give: reply %v (%v), want success", code, ok)
	}
	g.mu.Lock()
	_, kept := b.peers[gone]
	g.mu.Unlock()
	if kept || b.Counters().PeersEvicted != 1 {
		t.Errorf("the disconnected record kept %v, PeersEvicted %d; want it given up, 1", kept, b.Counters().PeersEvicted)
	}

	// Peers silent for GiveUp are given up too; a, which keeps talking,
	// is not.
	n.clock.Advance(n.giveUp)
	n.exchange(a, b, 3)
	for i := range maxPeers - 1 {
		if code, ok := forgeConnect(n, b, 2000+i); !ok || code != Success {
			t.Fatalf("connect %d with records silent for GiveUp to give: reply %v (%v), want success", i, code, ok)
		}
	}
	if code, _ := forgeConnect(n, b, 3000); code != Aborted {
		t.Errorf("a connect once only fresh records are left: %v, want aborted", code)
	}
	n.exchange(a, b, 4)
	if p, h := records(); p != maxPeers || h > maxPeers {
		t.Errorf("%d peer records, %d host records; want %d, at most %d", p, h, maxPeers, maxPeers)
	}
}

// TestFirstHostReplyWins: the Resolves sharing a host query all get its
// first answer; a later one (a second host of the name, a spoofer) does
// not change it under them.
func TestFirstHostReplyWins(t *testing.T) {
	n := newManNet(t, time.Hour)
	g := n.b.eng
	q := &hostQuery{answered: make(chan struct{})}
	g.mu.Lock()
	g.hostReplies["hosta"] = q
	g.mu.Unlock()
	for _, src := range [][6]byte{{0x02, 0, 0, 0, 0, 0xa1}, {0x02, 0, 0, 0, 0, 0xa2}} {
		f := make([]byte, 128)
		h := header{typ: tHostReply, dstEP: n.b.id, payloadLen: len("hosta")}
		p := putHeader(f, &g.mac, &src, g.ethType, &h)
		copy(p, "hosta")
		n.deliver(n.b, padded(f, tHostReply, len("hosta")))
	}
	g.mu.Lock()
	got := q.mac
	delete(g.hostReplies, "hosta")
	g.mu.Unlock()
	select {
	case <-q.answered:
	default:
		t.Fatal("the query was not answered")
	}
	if want := [6]byte{0x02, 0, 0, 0, 0, 0xa1}; got != want {
		t.Errorf("the query's answer is %x, want the first reply's %x", got, want)
	}
}

// TestRetransmitSaysWindowNow: a retransmitted frame carries the receive
// window of now, not of its first send: the peer takes the window of
// every frame it hears, and a stale one lifted a limit said since.
func TestRetransmitSaysWindowNow(t *testing.T) {
	n := newManNet(t, time.Hour)
	a, b := n.a, n.b
	ra, _ := a.IConnect(b.Addr(), 0xb, 0, nil)
	n.lockstep()
	mustComplete(t, a, ra, Success, "connect")
	if _, err := a.Isend(b.Addr(), 1, [][]byte{make([]byte, 100)}, nil); err != nil {
		t.Fatal(err)
	}
	n.la.take() // the eager frame is lost
	n.timers(a) // stamps it
	a.eng.mu.Lock()
	first := a.eng.recvWindow
	a.eng.recv.budget = 100
	a.eng.setDivisor(10) // a crowd came: a's window shrinks
	now := a.eng.recvWindow
	a.eng.mu.Unlock()
	if now == first {
		t.Fatalf("the window did not change (%d): the test sets up nothing", now)
	}
	n.la.take() // the acks saying so are lost too
	n.clock.Advance(50 * time.Millisecond)
	n.timers(a)
	for _, f := range n.la.take() {
		if h, _ := decodeHeader(f); h.typ == tEager {
			n.deliver(b, f)
			b.eng.mu.Lock()
			got := b.peers[a.Addr()].rwnd
			b.eng.mu.Unlock()
			if got != now {
				t.Fatalf("after a retransmission b holds a's window as %d; a's window is %d (it was %d at the first send)", got, now, first)
			}
			return
		}
	}
	t.Fatal("no retransmission")
}

// TestUnexpectedEmptyMessagesBounded: unexpected eager messages count
// their records against UnexpectedBytes, so empty ones, which hold no
// data, are bounded too: past the bound they are refused (and come again
// as rendezvous records, under MaxUnexpectedRndv), every one delivered in
// the end. They used to queue without limit.
func TestUnexpectedEmptyMessagesBounded(t *testing.T) {
	const bound, rndvs = 64 * 100, 100
	n := newManNetCfg(t, Config{}, Config{UnexpectedBytes: bound, MaxUnexpectedRndv: rndvs})
	a, b := n.a, n.b
	const N = 2000
	for i := range N {
		if _, err := a.Isend(b.Addr(), uint64(i), nil, nil); err != nil {
			t.Fatal(err)
		}
		if i%64 == 63 {
			n.settle(1, time.Millisecond)
		}
	}
	n.settle(5, time.Millisecond)
	g := b.eng
	g.mu.Lock()
	held, queued := b.unexpBytes, b.match.nUnexp
	g.mu.Unlock()
	if held > bound || queued > bound/64+rndvs { // a record is more than 64 bytes
		t.Fatalf("%d empty unexpected messages sent: %d queued, %d bytes counted; bound %d", N, queued, held, bound)
	}
	if b.Counters().EagerRefused == 0 {
		t.Error("none refused at the bound")
	}
	for i := range N { // each arrives, in order, refused ones as rendezvous
		r, err := b.Irecv(uint64(i), ^uint64(0), nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		st, ok, _ := b.Test(r)
		for k := 0; k < 100 && !ok; k++ {
			n.settle(1, 10*time.Millisecond)
			st, ok, _ = b.Test(r)
		}
		if !ok || st.Code != Success {
			t.Fatalf("receive %d: done %v, %v", i, ok, st.Code)
		}
	}
}

// TestOwnConnectionNotEvicted: the record of a peer this endpoint
// connected to is not given to strangers at MaxPeers, however long it
// was idle: a's send to b works after two connects from new addresses.
func TestOwnConnectionNotEvicted(t *testing.T) {
	n := newManNetCfg(t, Config{MaxPeers: 1}, Config{}) // a connects to b
	a, b := n.a, n.b
	n.clock.Advance(n.giveUp)
	forgeConnect(n, a, 1) // takes the one record MaxPeers allows
	if code, _ := forgeConnect(n, a, 2); code != Aborted {
		t.Errorf("a connect from a new address with no record to give: %v, want aborted", code)
	}
	if _, err := a.Isend(b.Addr(), 1, [][]byte{make([]byte, 10)}, nil); err != nil {
		t.Fatalf("a's send to the peer it connected to: %v", err)
	}
	if c := a.Counters(); c.PeersEvicted != 0 {
		t.Errorf("PeersEvicted %d, want 0", c.PeersEvicted)
	}
}

func TestBackoffSaturates(t *testing.T) {
	for _, c := range []struct {
		d       int64
		retries int
		want    int64
	}{
		{5, 0, 5}, {5, 3, 40}, {5, 50, 5 << 10},
		{int64(forever), 1, math.MaxInt64}, {1 << 53, 10, math.MaxInt64}, {1<<53 - 1, 10, (1<<53 - 1) << 10},
	} {
		if got := backoff(c.d, c.retries); got != c.want {
			t.Errorf("backoff(%d, %d) = %d, want %d", c.d, c.retries, got, c.want)
		}
	}
}

// TestDialedRecordsNotCounted: records of peers this endpoint connected
// to do not count against MaxPeers, and one whose connect failed, or that
// we disconnected from, is like any other: given to a stranger once idle.
func TestDialedRecordsNotCounted(t *testing.T) {
	n := newManNetCfg(t, Config{MaxPeers: 1}, Config{}) // a connects to b
	a := n.a
	if code, _ := forgeConnect(n, a, 1); code != Success {
		t.Fatalf("a stranger's connect beside a's own connection, MaxPeers 1: %v, want success", code)
	}
	if code, _ := forgeConnect(n, a, 2); code != Aborted {
		t.Fatalf("a second stranger's, MaxPeers 1: %v, want aborted", code)
	}

	ghost := Addr{MAC: [6]byte{0x02, 0x77, 0, 0, 0, 1}, EP: 3}
	r, err := a.IConnect(ghost, 1, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	n.la.take()
	n.clock.Advance(n.giveUp * 2)
	n.timers(a)
	n.la.take()
	mustComplete(t, a, r, Timeout, "a connect nobody answers")
	a.Disconnect(n.b.Addr())
	n.la.take()
	n.clock.Advance(n.giveUp * 2)
	// The stranger's record (silent for GiveUp), the ghost's and b's
	// (disconnected) all go now: the records are within the bound again.
	if code, _ := forgeConnect(n, a, 10); code != Success {
		t.Fatalf("a stranger with idle records to give: %v, want success", code)
	}
	a.eng.mu.Lock()
	left := len(a.peers)
	a.eng.mu.Unlock()
	if left != 1 {
		t.Errorf("%d records left, want the new stranger's alone", left)
	}
}

// TestLocalDisconnectedRecordGiven: the record of a same-process peer
// that disconnected is like any idle one: given to a stranger at
// MaxPeers (it used to hold its place for good).
func TestLocalDisconnectedRecordGiven(t *testing.T) {
	n := newManNetCfg(t, Config{MaxPeers: 1}, Config{})
	a := n.a
	c := n.openCfg(n.la, 3, 3, Config{})
	r, _ := c.IConnect(a.Addr(), 0xa, 0, nil)
	mustComplete(t, c, r, Success, "same-process connect")
	c.Disconnect(a.Addr())
	n.clock.Advance(n.giveUp * 2)
	if code, _ := forgeConnect(n, a, 1); code != Success {
		t.Errorf("a stranger's connect after the same-process peer left, MaxPeers 1: %v, want success", code)
	}
}

// TestRecordsBackWithinBound: records counted again past MaxPeers (peers
// we connected to, disconnected) are given up together at the next
// stranger's connect, until the records are within the bound again.
func TestRecordsBackWithinBound(t *testing.T) {
	n := newManNetCfg(t, Config{MaxPeers: 1}, Config{}) // a connects to b
	a := n.a
	forgeConnect(n, a, 1) // the one counted record
	a.Disconnect(n.b.Addr())
	n.la.take()
	n.clock.Advance(n.giveUp * 2) // both records idle: 2 counted, bound 1
	if code, _ := forgeConnect(n, a, 2); code != Success {
		t.Fatalf("a stranger's connect with idle records: %v, want success", code)
	}
	a.eng.mu.Lock()
	counted := len(a.peers) - a.dialed
	a.eng.mu.Unlock()
	if counted != 1 {
		t.Errorf("%d records counted after the stranger's connect, MaxPeers 1", counted)
	}
}
