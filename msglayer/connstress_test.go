package msglayer

// A randomized, seeded stress test of connect / restart / disconnect.
//
// Two or three endpoints, each on its own MemLink of one hub, go through a
// schedule of operations drawn from a seed: restarts (Close, then Open
// with the same id and key on the same link: a new session), Connect and
// IConnect from either side (sometimes both at once), Disconnect, small
// and large (rendezvous) sends with their receives posted first, changes
// of the segment's faults (loss, reordering, duplication, delay) and
// partitions. Every request is tracked; whenever one completes its code
// must be one the API documents for it, a successful receive must hold
// the data sent, and a send that succeeded must have its receive succeed.
//
// At checkpoints (K) the network is healed, every pending connect and
// send must end within GiveUp plus some slack, the receives of failed
// sends are cancelled, then every pair connects both ways (one after the
// other, or both at once) and messages go both ways: they must all be
// delivered intact within a bounded time.
//
// Environment:
//
//	XMX_CONNSTRESS_SEEDS   number of seeds (default 10)
//	XMX_CONNSTRESS_SEED0   first seed (default 1)
//	XMX_CONNSTRESS_STEPS   operations per schedule (default 200)
//	XMX_CONNSTRESS_SCHED   replay this schedule (as printed on failure)
//	                       with seed XMX_CONNSTRESS_SEED0, instead of
//	                       drawing schedules
//	XMX_CONNSTRESS_SHRINK  on failure, shrink the schedule (this many
//	                       runs per candidate; 0 or unset: no shrinking)
//	XMX_CONNSTRESS_VERBOSE log every schedule
//	XMX_CONNSTRESS_TRACE   on failure, print the operations and every
//	                       frame sent (the links are then wrapped)
//	XMX_CONNSTRESS_SLACK_MS slack past GiveUp for pending requests
//	                       (default 2000)
//
// Schedule ops: Ra restart a; Ca>b Connect; Ia>b IConnect; Xa-b both
// IConnect at once; Da>b a.Disconnect(b); Sa>b:n send n bytes (Y: Issend)
// with its receive posted first; N:loss,reorder,dup,delay (per mille,
// per mille, per mille, µs); Pa+/Pa- partition a's link; Wn sleep n µs;
// T poll; Kn checkpoint (n seeds its choices).
//
// The TestConnStress* tests after TestConnStress are deterministic
// reproductions of the failures it found in the design before connection
// ids (docs/connstress-2026-11-26.md, where their comments' line numbers
// and mechanisms come from): they stay as regression tests.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/xmx-stack/xmx/xdp"
)

// csOp is one operation of a schedule.
type csOp struct {
	Kind byte // see String
	A, B int  // endpoints
	N    int  // size (S, Y), microseconds (W), 1/0 (P), mode (K), per mille (N)
	M    [4]int
}

func (o csOp) String() string {
	switch o.Kind {
	case 'R':
		return fmt.Sprintf("R%d", o.A)
	case 'C', 'I', 'D':
		return fmt.Sprintf("%c%d>%d", o.Kind, o.A, o.B)
	case 'X':
		return fmt.Sprintf("X%d-%d", o.A, o.B)
	case 'S', 'Y':
		return fmt.Sprintf("%c%d>%d:%d", o.Kind, o.A, o.B, o.N)
	case 'N':
		return fmt.Sprintf("N:%d,%d,%d,%d", o.M[0], o.M[1], o.M[2], o.M[3])
	case 'P':
		return fmt.Sprintf("P%d%c", o.A, "-+"[o.N])
	case 'W':
		return fmt.Sprintf("W%d", o.N)
	case 'T':
		return "T"
	case 'K':
		return fmt.Sprintf("K%d", o.N)
	}
	return "?"
}

func csSchedString(ops []csOp) string {
	s := make([]string, len(ops))
	for i, o := range ops {
		s[i] = o.String()
	}
	return strings.Join(s, " ")
}

// csParse reads a schedule written by csSchedString.
func csParse(s string) ([]csOp, error) {
	var ops []csOp
	for _, w := range strings.Fields(s) {
		var o csOp
		o.Kind = w[0]
		var err error
		switch o.Kind {
		case 'R':
			_, err = fmt.Sscanf(w, "R%d", &o.A)
		case 'C', 'I', 'D':
			_, err = fmt.Sscanf(w[1:], "%d>%d", &o.A, &o.B)
		case 'X':
			_, err = fmt.Sscanf(w, "X%d-%d", &o.A, &o.B)
		case 'S', 'Y':
			_, err = fmt.Sscanf(w[1:], "%d>%d:%d", &o.A, &o.B, &o.N)
		case 'N':
			_, err = fmt.Sscanf(w, "N:%d,%d,%d,%d", &o.M[0], &o.M[1], &o.M[2], &o.M[3])
		case 'P':
			var c byte
			_, err = fmt.Sscanf(w, "P%d%c", &o.A, &c)
			if c == '+' {
				o.N = 1
			}
		case 'W':
			_, err = fmt.Sscanf(w, "W%d", &o.N)
		case 'T':
		case 'K':
			_, err = fmt.Sscanf(w, "K%d", &o.N)
		default:
			err = fmt.Errorf("unknown op")
		}
		if err != nil {
			return nil, fmt.Errorf("op %q: %v", w, err)
		}
		ops = append(ops, o)
	}
	return ops, nil
}

// csParams are the per-seed settings.
type csParams struct {
	n      int // endpoints
	giveUp time.Duration
	window int
}

func csParamsFor(seed uint64) csParams {
	r := rand.New(rand.NewPCG(seed, 0x5eed))
	return csParams{
		n:      2 + r.IntN(2),
		giveUp: []time.Duration{250 * time.Millisecond, 400 * time.Millisecond, 600 * time.Millisecond}[r.IntN(3)],
		window: []int{16, 64, 256}[r.IntN(3)],
	}
}

// csGen draws a schedule of about steps operations.
func csGen(seed uint64, steps int) []csOp {
	pr := csParamsFor(seed)
	r := rand.New(rand.NewPCG(seed, 0xc0ffee))
	pair := func() (int, int) {
		a := r.IntN(pr.n)
		b := (a + 1 + r.IntN(pr.n-1)) % pr.n
		return a, b
	}
	var ops []csOp
	// Start connected, mostly.
	for a := 0; a < pr.n; a++ {
		for b := 0; b < pr.n; b++ {
			if a != b && r.IntN(10) > 0 {
				ops = append(ops, csOp{Kind: 'C', A: a, B: b})
			}
		}
	}
	nextK := 20 + r.IntN(30)
	for i := 0; i < steps; i++ {
		if i == nextK {
			ops = append(ops, csOp{Kind: 'K', N: r.IntN(1 << 16)})
			nextK = i + 20 + r.IntN(30)
			continue
		}
		a, b := pair()
		x := r.IntN(1000)
		switch {
		case x < 40:
			ops = append(ops, csOp{Kind: 'R', A: a})
		case x < 100:
			ops = append(ops, csOp{Kind: 'C', A: a, B: b})
		case x < 170:
			ops = append(ops, csOp{Kind: 'I', A: a, B: b})
		case x < 210:
			ops = append(ops, csOp{Kind: 'X', A: a, B: b})
		case x < 250:
			ops = append(ops, csOp{Kind: 'D', A: a, B: b})
		case x < 520:
			n := r.IntN(2000)
			if r.IntN(4) == 0 {
				n = 1400 + r.IntN(10000) // several frames
			}
			k := byte('S')
			if r.IntN(10) == 0 {
				k = 'Y'
			}
			ops = append(ops, csOp{Kind: k, A: a, B: b, N: n})
		case x < 600:
			ops = append(ops, csOp{Kind: 'S', A: a, B: b, N: 32<<10 + 1 + r.IntN(200<<10)})
		case x < 650:
			o := csOp{Kind: 'N'}
			if r.IntN(4) > 0 {
				o.M = [4]int{r.IntN(101), r.IntN(150), r.IntN(60), r.IntN(201)}
			}
			ops = append(ops, o)
		case x < 700:
			ops = append(ops, csOp{Kind: 'P', A: a, N: r.IntN(2)})
		case x < 710:
			// Long enough for peers to give up on each other.
			ops = append(ops, csOp{Kind: 'W', N: int(pr.giveUp/time.Microsecond) * (8 + r.IntN(8)) / 10})
		case x < 900:
			ops = append(ops, csOp{Kind: 'W', N: r.IntN(3000)})
		default:
			ops = append(ops, csOp{Kind: 'T'})
		}
	}
	ops = append(ops, csOp{Kind: 'K', N: r.IntN(1 << 16)})
	return ops
}

// csEP is one endpoint slot: its link and current incarnation.
type csEP struct {
	idx  int
	link *xdp.MemLink
	e    *Endpoint
	inc  int
	cfg  Config
}

// csReq is a tracked request.
type csReq struct {
	kind     byte // 'c' connect, 's' send, 'r' receive
	e        *Endpoint
	h        Request
	op       int // index of the op that made it
	from, to int
	match    uint64
	data     []byte // sent (s) or expected (r)
	buf      []byte // receive buffer
	pair     *csReq // the send of a receive and the other way round
	noSend   bool   // receive whose Isend was refused
	done     bool
	st       Status
	checked  bool
}

func (q *csReq) String() string {
	switch q.kind {
	case 'c':
		return fmt.Sprintf("connect %d>%d (op %d)", q.from, q.to, q.op)
	case 's':
		return fmt.Sprintf("send %d>%d match %d len %d (op %d)", q.from, q.to, q.match, len(q.data), q.op)
	}
	return fmt.Sprintf("recv at %d from %d match %d len %d (op %d)", q.to, q.from, q.match, len(q.data), q.op)
}

// csFail is a failure of the invariants; kind names the class (for
// shrinking, which keeps candidates failing the same way).
type csFail struct {
	kind string
	op   int
	msg  string
}

func (f *csFail) Error() string { return fmt.Sprintf("[%s] at op %d: %s", f.kind, f.op, f.msg) }

type csRun struct {
	seed  uint64
	pr    csParams
	ops   []csOp
	hub   *xdp.Hub
	eps   []*csEP
	reqs  []*csReq
	match uint64
	cur   int // op being run
	slack time.Duration
	logf  func(string, ...any)
	fail  *csFail
	tr    *csTrace
}

func (r *csRun) failf(kind, format string, args ...any) {
	if r.fail == nil {
		r.fail = &csFail{kind: kind, op: r.cur, msg: fmt.Sprintf(format, args...)}
	}
}

// failPair is failf for a failure between a and b: the kind says how
// their sequence numbers stand (sig).
func (r *csRun) failPair(kind string, a, b int, format string, args ...any) {
	r.failf(kind+"/"+r.sig(a, b), format, args...)
}

// sig classifies the channel a>b and b>a: "sync" (the receiver expects a
// number the sender has in flight or next), "pair" (the two records name
// different connections), "near" (one connection, numbers apart),
// "nopeer", "untimed" (waiting on the peer with no timer armed).
func (r *csRun) sig(a, b int) string {
	type st struct {
		ok                    bool
		next, acked, expected uint32
		untimed               bool
		localID, remoteID     uint32
	}
	get := func(x, y int) st {
		ex, ey := r.eps[x].e, r.eps[y].e
		ex.eng.mu.Lock()
		defer ex.eng.mu.Unlock()
		p := ex.peers[ey.Addr()]
		if p == nil {
			return st{}
		}
		// Waiting for a notify (or pulling) with no timer to send
		// keepalives: nothing will notice the peer went away.
		untimed := (p.rndvs > 0 || p.pulls > 0) && !p.tm.armed()
		return st{true, p.nextSeq, p.acked, p.expected, untimed, p.localID, p.remoteID}
	}
	pa, pb := get(a, b), get(b, a)
	one := func(s, d st) string {
		switch {
		case s.untimed:
			return "untimed"
		case !s.ok || !d.ok:
			return "nopeer"
		case s.localID != d.remoteID || s.remoteID != d.localID:
			return "pair" // the records name different connections
		case d.expected-s.acked <= s.next-s.acked:
			return "sync"
		}
		return "near"
	}
	return one(pa, pb) + "," + one(pb, pa)
}

// bound is how long any request may stay pending once the network is
// healed.
func (r *csRun) bound() time.Duration { return r.pr.giveUp + r.slack }

func csData(match uint64, n int) []byte {
	b := make([]byte, n)
	x := uint32(match*2654435761) | 1
	for i := range b {
		x ^= x << 13
		x ^= x >> 17
		x ^= x << 5
		b[i] = byte(x)
	}
	return b
}

func (r *csRun) open(i int) {
	ep := r.eps[i]
	e, err := Open(ep.cfg)
	if err != nil {
		r.failf("open", "open endpoint %d: %v", i, err)
		return
	}
	ep.e = e
	ep.inc++
}

func (r *csRun) setup() {
	r.hub = xdp.NewHub(xdp.MemConfig{Seed: int64(r.seed) + 1})
	for i := 0; i < r.pr.n; i++ {
		l := r.hub.Attach()
		var link xdp.Link = l
		if r.tr != nil {
			link = &csTraceLink{Link: l, tr: r.tr}
		}
		ep := &csEP{idx: i, link: l, cfg: Config{
			Link: link, EndpointID: uint8(1 + i), Key: uint32(0x100 + i),
			GiveUp: r.pr.giveUp, ConnectRetry: 20 * time.Millisecond,
			KeepaliveInterval: 50 * time.Millisecond, MaxRTO: 50 * time.Millisecond,
			Window: r.pr.window,
		}}
		r.eps = append(r.eps, ep)
		r.open(i)
	}
}

func (r *csRun) teardown() {
	for _, ep := range r.eps {
		if ep.e != nil {
			ep.e.Close()
		}
	}
	for _, ep := range r.eps {
		ep.link.Close()
	}
}

var (
	csConnCodes = map[Code]bool{Success: true, Timeout: true, BadEndpoint: true, Closed: true, Aborted: true}
	csSendCodes = map[Code]bool{Success: true, Aborted: true, BadSession: true, Unreachable: true, Closed: true, BadEndpoint: true}
	csRecvCodes = map[Code]bool{Success: true, Aborted: true, BadSession: true, Unreachable: true, Closed: true, BadEndpoint: true, Cancelled: true}
)

// completed records q's status and checks it.
func (r *csRun) completed(q *csReq, st Status) {
	q.done, q.st = true, st
	csTally(fmt.Sprintf("%c:%v", q.kind, st.Code))
	switch q.kind {
	case 'c':
		if !csConnCodes[st.Code] {
			r.failf("code", "%v completed with %v", q, st.Code)
		}
	case 's':
		if !csSendCodes[st.Code] {
			r.failf("code", "%v completed with %v", q, st.Code)
		}
	case 'r':
		if !csRecvCodes[st.Code] {
			r.failf("code", "%v completed with %v", q, st.Code)
		}
		if st.Code == Success {
			want := r.eps[q.from].cfg
			if st.XferLen != len(q.data) || st.MsgLen != len(q.data) || st.Match != q.match ||
				st.Source.EP != want.EndpointID || st.Source.MAC != [6]byte(r.eps[q.from].link.HardwareAddr()) {
				r.failf("corrupt", "%v: status %+v", q, st)
			} else if !bytes.Equal(q.buf, q.data) {
				r.failf("corrupt", "%v: data differs", q)
			}
		}
	}
	r.checkPair(q)
}

// checkPair: a send that succeeded has its receive succeed.
func (r *csRun) checkPair(q *csReq) {
	s, rv := q, q.pair
	if q.kind == 'r' {
		s, rv = q.pair, q
	}
	if s == nil || rv == nil || !s.done || !rv.done || rv.checked {
		return
	}
	rv.checked = true
	if s.st.Code == Success && rv.st.Code != Success {
		r.failf("lost", "%v succeeded, its receive completed with %v", s, rv.st.Code)
	}
}

// poll collects the requests that completed.
func (r *csRun) poll() {
	kept := r.reqs[:0]
	for _, q := range r.reqs {
		if !q.done {
			st, ok, err := q.e.Test(q.h)
			if err != nil {
				r.failf("api", "Test %v: %v", q, err)
				continue
			}
			if ok {
				r.completed(q, st)
			}
		}
		if !q.done {
			kept = append(kept, q)
		}
	}
	clear(r.reqs[len(kept):])
	r.reqs = kept
}

// wait waits up to d for q; false if it did not complete.
func (r *csRun) wait(q *csReq, d time.Duration) bool {
	if q.done {
		return true
	}
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	st, err := q.e.Wait(ctx, q.h)
	if err != nil && errors.Is(err, context.DeadlineExceeded) && st.Code == Success {
		return false
	}
	if errors.Is(err, ErrStaleRequest) {
		r.failf("api", "Wait %v: %v", q, err)
		return false
	}
	r.completed(q, st)
	return true
}

func (r *csRun) track(q *csReq) { r.reqs = append(r.reqs, q) }

func (r *csRun) iconnect(a, b int) *csReq {
	ea, eb := r.eps[a].e, r.eps[b].e
	h, err := ea.IConnect(eb.Addr(), r.eps[b].cfg.Key, 0, nil)
	if err != nil {
		r.failf("api", "IConnect %d>%d: %v", a, b, err)
		return nil
	}
	q := &csReq{kind: 'c', e: ea, h: h, op: r.cur, from: a, to: b}
	r.track(q)
	return q
}

func (r *csRun) send(a, b, n int, sync bool) (snd, rcv *csReq) {
	ea, eb := r.eps[a].e, r.eps[b].e
	r.match++
	m := r.match
	data := csData(m, n)
	rv := &csReq{kind: 'r', e: eb, op: r.cur, from: a, to: b, match: m, data: data, buf: make([]byte, n)}
	h, err := eb.Irecv(m, ^uint64(0), [][]byte{rv.buf}, nil)
	if err != nil {
		r.failf("api", "Irecv: %v", err)
		return nil, nil
	}
	rv.h = h
	r.track(rv)
	isend := ea.Isend
	if sync {
		isend = ea.Issend
	}
	hs, err := isend(eb.Addr(), m, [][]byte{data}, nil)
	if err != nil {
		if !errors.Is(err, ErrNotConnected) {
			r.failf("api", "Isend %d>%d: %v", a, b, err)
		}
		rv.noSend = true
		return nil, rv
	}
	s := &csReq{kind: 's', e: ea, h: hs, op: r.cur, from: a, to: b, match: m, data: data, pair: rv}
	rv.pair = s
	r.track(s)
	return s, rv
}

func (r *csRun) restart(i int) {
	ep := r.eps[i]
	old := ep.e
	old.Close()
	// Every pending request of the closed endpoint is complete.
	for _, q := range r.reqs {
		if q.e != old || q.done {
			continue
		}
		if st, ok, err := old.Test(q.h); err == nil && ok {
			r.completed(q, st)
			continue
		}
		if !r.wait(q, 200*time.Millisecond) {
			r.failf("hang", "%v still pending after its endpoint closed", q)
		}
	}
	r.poll()
	r.open(i)
}

func (r *csRun) heal() {
	r.hub.SetConfig(xdp.MemConfig{})
	for _, ep := range r.eps {
		ep.link.Partition(false)
	}
}

// peerDump describes the channel between a and b, both ways.
func (r *csRun) peerDump(a, b int) string {
	ea, eb := r.eps[a].e, r.eps[b].e
	ca, cb := ea.Counters(), eb.Counters()
	return fmt.Sprintf("  %d (session %#x) about %d: %s  %d (session %#x) about %d: %s"+
		"  counters %d: dup %d stale %d beyond %d retx %d dead %d; %d: dup %d stale %d beyond %d retx %d dead %d",
		a, ea.session, b, ea.DebugPeer(eb.Addr()), b, eb.session, a, eb.DebugPeer(ea.Addr()),
		a, ca.Duplicates, ca.StaleFrames, ca.BeyondWindow, ca.Retransmits, ca.PeersDead,
		b, cb.Duplicates, cb.StaleFrames, cb.BeyondWindow, cb.Retransmits, cb.PeersDead)
}

// peerState reads the record a holds of b under the lock.
func (r *csRun) peerState(a, b int) string {
	ea, eb := r.eps[a].e, r.eps[b].e
	ea.eng.mu.Lock()
	defer ea.eng.mu.Unlock()
	p := ea.peers[eb.Addr()]
	if p == nil {
		return "none"
	}
	return fmt.Sprintf("connected %v dead %v ids %#x,%#x next %d acked %d expected %d taken %+v",
		p.connected, p.dead, p.localID, p.remoteID, p.nextSeq, p.acked, p.expected, p.taken)
}

// sendOutcome describes how the send of receive q ended.
func (r *csRun) sendOutcome(q *csReq) string {
	switch {
	case q.noSend:
		return "Isend refused"
	case q.pair == nil:
		return "no send"
	case !q.pair.done:
		return "send pending"
	}
	return "send " + q.pair.st.Code.String()
}

// drain ends every pending request with the network healed.
func (r *csRun) drain() {
	r.poll()
	deadline := time.Now().Add(r.bound())
	for _, q := range r.reqs {
		if q.kind == 'r' || q.done {
			continue
		}
		if !r.wait(q, time.Until(deadline)) {
			r.failPair("hang", q.from, q.to, "%v pending %v after the network healed\n%s", q, r.bound(), r.peerDump(q.from, q.to))
			return
		}
	}
	for _, q := range r.reqs {
		if q.kind != 'r' || q.done {
			continue
		}
		if q.noSend || (q.pair != nil && q.pair.st.Code != Success) || q.e != r.eps[q.to].e {
			if ok, _ := q.e.Cancel(q.h); ok {
				r.wait(q, time.Second)
				continue
			}
		}
		if !r.wait(q, time.Until(deadline)+time.Second) {
			r.failPair("hang-recv", q.from, q.to, "%v pending after its send ended (%s)\n%s", q, r.sendOutcome(q), r.peerDump(q.from, q.to))
			return
		}
	}
	r.poll()
	if len(r.reqs) > 0 && r.fail == nil {
		r.failf("hang", "%d requests left after the drain, first %v", len(r.reqs), r.reqs[0])
	}
}

// checkpoint heals the network, drains, connects every pair both ways and
// exchanges messages both ways.
func (r *csRun) checkpoint(mode int) {
	rng := rand.New(rand.NewPCG(uint64(mode), 7))
	r.heal()
	r.drain()
	if r.fail != nil {
		return
	}
	// Connect every pair.
	for a := 0; a < r.pr.n; a++ {
		for b := a + 1; b < r.pr.n; b++ {
			x, y := a, b
			if rng.IntN(2) == 0 {
				x, y = b, a
			}
			var qs []*csReq
			if rng.IntN(3) == 0 {
				qs = append(qs, r.iconnect(x, y), r.iconnect(y, x))
			} else {
				q := r.iconnect(x, y)
				if q != nil && r.wait(q, r.bound()) && q.st.Code == Success {
					qs = append(qs, q, r.iconnect(y, x))
				} else {
					qs = append(qs, q)
				}
			}
			for _, q := range qs {
				if q == nil {
					return
				}
				if !r.wait(q, r.bound()) {
					r.failPair("hang-connect", x, y, "checkpoint %v pending %v on a healed network\n%s", q, r.bound(), r.peerDump(x, y))
					return
				}
				if q.st.Code != Success {
					r.failf("connect", "checkpoint %v: %v on a healed network\n%s", q, q.st.Code, r.peerDump(x, y))
					return
				}
			}
		}
	}
	r.poll()
	csTally("checkpoint-connected")
	// Messages both ways.
	var all []*csReq
	for a := 0; a < r.pr.n; a++ {
		for b := 0; b < r.pr.n; b++ {
			if a == b {
				continue
			}
			for k := 0; k < 3; k++ {
				n := rng.IntN(200)
				switch k {
				case 1:
					n = 1400 + rng.IntN(6000)
				case 2:
					n = 32<<10 + 1 + rng.IntN(100<<10)
				}
				s, rv := r.send(a, b, n, false)
				if s == nil {
					r.failf("connect", "checkpoint: Isend %d>%d refused after both connected\n%s", a, b, r.peerDump(a, b))
					return
				}
				all = append(all, rv, s)
			}
		}
	}
	deadline := time.Now().Add(2*time.Second + r.slack)
	for _, q := range all {
		if !r.wait(q, time.Until(deadline)) {
			r.failPair("desync", q.from, q.to, "checkpoint: %v not done within %v of a healed, connected network\n%s\n  a->b %s\n  b->a %s",
				q, 2*time.Second+r.slack, r.peerDump(q.from, q.to), r.peerState(q.from, q.to), r.peerState(q.to, q.from))
			return
		}
		if q.st.Code != Success {
			r.failPair("desync", q.from, q.to, "checkpoint: %v: %v on a healed, connected network\n%s\n  a->b %s\n  b->a %s",
				q, q.st.Code, r.peerDump(q.from, q.to), r.peerState(q.from, q.to), r.peerState(q.to, q.from))
			return
		}
	}
	r.poll()
}

func (r *csRun) step(o csOp) {
	if r.tr != nil {
		s := ""
		for _, ep := range r.eps {
			s += fmt.Sprintf(" %d=%#x", ep.idx, ep.e.session)
		}
		r.tr.add("op %d %v (sessions%s)", r.cur, o, s)
	}
	csTally("op" + string(o.Kind))
	if o.A >= r.pr.n || o.B >= r.pr.n || (o.A == o.B && strings.IndexByte("CIXDSY", o.Kind) >= 0) {
		return // a replayed schedule for more endpoints
	}
	switch o.Kind {
	case 'R':
		r.restart(o.A)
	case 'C':
		ea, eb := r.eps[o.A].e, r.eps[o.B].e
		ctx, cancel := context.WithTimeout(context.Background(), r.bound())
		err := ea.Connect(ctx, eb.Addr(), r.eps[o.B].cfg.Key)
		cancel()
		switch {
		case err == nil, errors.Is(err, ErrTimeout), errors.Is(err, ErrBadEndpoint), errors.Is(err, ErrAborted):
		case errors.Is(err, context.DeadlineExceeded):
			r.failf("hang", "Connect %d>%d pending for %v", o.A, o.B, r.bound())
		default:
			r.failf("code", "Connect %d>%d: %v", o.A, o.B, err)
		}
		csTally(fmt.Sprintf("Connect:%v", err == nil))
	case 'I':
		r.iconnect(o.A, o.B)
	case 'X':
		r.iconnect(o.A, o.B)
		r.iconnect(o.B, o.A)
	case 'D':
		r.eps[o.A].e.Disconnect(r.eps[o.B].e.Addr())
	case 'S', 'Y':
		r.send(o.A, o.B, o.N, o.Kind == 'Y')
	case 'N':
		r.hub.SetConfig(xdp.MemConfig{
			Loss: float64(o.M[0]) / 1000, Reorder: float64(o.M[1]) / 1000,
			Duplicate: float64(o.M[2]) / 1000, Delay: time.Duration(o.M[3]) * time.Microsecond,
		})
	case 'P':
		r.eps[o.A].link.Partition(o.N == 1)
	case 'W':
		time.Sleep(time.Duration(o.N) * time.Microsecond)
	case 'T':
	case 'K':
		r.checkpoint(o.N)
	}
	r.poll()
}

// csExec runs a schedule; nil if every invariant held.
func csExec(seed uint64, ops []csOp, logf func(string, ...any)) *csFail {
	r := &csRun{seed: seed, pr: csParamsFor(seed), ops: ops, logf: logf, slack: time.Duration(csEnvInt("XMX_CONNSTRESS_SLACK_MS", 2000)) * time.Millisecond}
	if os.Getenv("XMX_CONNSTRESS_TRACE") != "" {
		r.tr = &csTrace{start: time.Now()}
	}
	r.setup()
	defer r.teardown()
	for i, o := range ops {
		if r.fail != nil {
			break
		}
		r.cur = i
		r.step(o)
	}
	if r.fail == nil {
		r.cur = len(ops)
		r.checkpoint(1)
	}
	if r.fail != nil && r.tr != nil {
		r.fail.msg += "\ntrace:\n" + r.tr.dump()
	}
	return r.fail
}

// csTallies counts outcomes over all runs, to show what the schedules
// covered.
var (
	csTallyMu sync.Mutex
	csTallies = map[string]int{}
)

func csTally(k string) {
	csTallyMu.Lock()
	csTallies[k]++
	csTallyMu.Unlock()
}

func csTallyString() string {
	csTallyMu.Lock()
	defer csTallyMu.Unlock()
	keys := make([]string, 0, len(csTallies))
	for k := range csTallies {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&b, " %s=%d", k, csTallies[k])
	}
	return b.String()
}

func csEnvInt(name string, def int) int {
	if v := os.Getenv(name); v != "" {
		if n, err := strconv.Atoi(v); err == nil {
			return n
		}
	}
	return def
}

// csShrink removes operations from a failing schedule while it keeps
// failing the same way (in at least one of tries runs).
func csShrink(t *testing.T, seed uint64, ops []csOp, f *csFail, tries int) ([]csOp, *csFail) {
	if f.op < len(ops) {
		ops = ops[:f.op+1]
	}
	fails := func(c []csOp) *csFail {
		for range tries {
			if g := csExec(seed, c, nil); g != nil && g.kind == f.kind {
				return g
			}
		}
		return nil
	}
	for chunk := len(ops) / 2; chunk >= 1; chunk /= 2 {
		for i := 0; i+chunk <= len(ops); {
			c := append(append([]csOp{}, ops[:i]...), ops[i+chunk:]...)
			if g := fails(c); g != nil {
				ops, f = c, g
				if f.op < len(ops) {
					ops = ops[:f.op+1]
				}
				t.Logf("shrunk to %d ops: %s", len(ops), csSchedString(ops))
			} else {
				i += chunk
			}
		}
	}
	return ops, f
}

func TestConnStress(t *testing.T) {
	seeds := csEnvInt("XMX_CONNSTRESS_SEEDS", 10)
	seed0 := csEnvInt("XMX_CONNSTRESS_SEED0", 1)
	steps := csEnvInt("XMX_CONNSTRESS_STEPS", 200)
	shrink := csEnvInt("XMX_CONNSTRESS_SHRINK", 0)
	verbose := os.Getenv("XMX_CONNSTRESS_VERBOSE") != ""
	if testing.Short() {
		seeds = min(seeds, 2)
	}
	sched := os.Getenv("XMX_CONNSTRESS_SCHED")
	if sched != "" {
		seeds = 1
	}
	failed := 0
	for s := seed0; s < seed0+seeds; s++ {
		seed := uint64(s)
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			ops := csGen(seed, steps)
			if sched != "" {
				var err error
				if ops, err = csParse(sched); err != nil {
					t.Fatal(err)
				}
			}
			pr := csParamsFor(seed)
			if verbose {
				t.Logf("%+v: %s", pr, csSchedString(ops))
			}
			start := time.Now()
			f := csExec(seed, ops, t.Logf)
			if f == nil {
				if verbose {
					t.Logf("ok in %v", time.Since(start))
				}
				return
			}
			failed++
			upto := ops
			if f.op < len(ops) {
				upto = ops[:f.op+1]
			}
			t.Errorf("seed %d (%+v) failed after %v: %v\nschedule: %s", seed, pr, time.Since(start), f, csSchedString(upto))
			if shrink > 0 {
				small, g := csShrink(t, seed, ops, f, shrink)
				t.Errorf("seed %d shrunk to %d ops: %s\nfailure: %v", seed, len(small), csSchedString(small), g)
			}
		})
	}
	t.Logf("%d seeds from %d, %d steps each: %d failed\ncoverage:%s", seeds, seed0, steps, failed, csTallyString())
}

// csTrace records, when XMX_CONNSTRESS_TRACE is set, the API operations
// and every frame sent (decoded), for failure reports. The links are then
// wrapped (csTraceLink), which hides their optional interfaces from the
// engine but keeps their behaviour on the wire.
type csTrace struct {
	mu    sync.Mutex
	start time.Time
	lines []string
}

func (tr *csTrace) add(format string, args ...any) {
	if tr == nil {
		return
	}
	tr.mu.Lock()
	tr.lines = append(tr.lines, fmt.Sprintf("%9.3fms ", float64(time.Since(tr.start))/1e6)+fmt.Sprintf(format, args...))
	tr.mu.Unlock()
}

func (tr *csTrace) dump() string {
	if tr == nil {
		return ""
	}
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return strings.Join(tr.lines, "\n")
}

// csFrame describes a frame of the protocol in one line.
func csFrame(f []byte) string {
	h, err := decodeHeader(f)
	if err != nil {
		return "undecodable"
	}
	th, _ := typeHdr(f, &h)
	s := fmt.Sprintf("%-12v %d>%d ep%d>ep%d src %#x dst %#x seq %d ack %d", h.typ, f[11], f[5], h.srcEP, h.dstEP, h.srcSession, h.dstSession, h.seq, h.ack)
	switch h.typ {
	case tConnect:
		_, id, _ := getConnect(th)
		s += fmt.Sprintf(" id %d", id)
	case tConnectReply:
		id, code, _ := getConnReply(th)
		s += fmt.Sprintf(" id %d %v", id, code)
	case tNack:
		seq, reason, sess := getNack(th)
		s += fmt.Sprintf(" nseq %d reason %d refused %#x", seq, reason, sess)
	case tRndv:
		var rh rndvHdr
		rh.decode(th)
		s += fmt.Sprintf(" match %d id %d", rh.match, rh.rndvID)
	case tEager:
		var eh eagerHdr
		if eh.decode(th, h.payloadLen) == nil {
			s += fmt.Sprintf(" match %d off %d", eh.match, eh.offset)
		}
	case tNotify:
		var n notifyHdr
		n.decode(th)
		s += fmt.Sprintf(" id %d code %v", n.rndvID, n.code)
	case tPullReq:
		var p pullReqHdr
		p.decode(th)
		s += fmt.Sprintf(" rndv %d off %d", p.rndvID, p.offset)
	case tPullReply:
		return ""
	}
	return s
}

type csTraceLink struct {
	xdp.Link
	tr *csTrace
}

func (l *csTraceLink) Send(frames [][]byte) (int, error) {
	for _, f := range frames {
		if s := csFrame(f); s != "" {
			l.tr.add("  tx %s", s)
		}
	}
	return l.Link.Send(frames)
}

func (l *csTraceLink) Wake() {
	if w, ok := l.Link.(xdp.Waker); ok {
		w.Wake()
	}
}

// TestConnStressNackedConnectTakenAsStale is the shrunk failure of seed 2
// made deterministic: a crashes and restarts (no goodbye reaches b); b,
// which still knows a's old self, sends it a message and at once
// connects. a's new self refuses the message (session nack) and takes
// the connect (b's next sequence number, 1). The nack makes b reset its
// record (its numbers jump by 2^31) and send the connect again with a new
// id, still addressed to a's old session; a's new self answers that copy
// as "stale" without taking its sequence number, and b, on the reply,
// believes a took it. b's frames are then duplicates at a for ever.
func TestConnStressNackedConnectTakenAsStale(t *testing.T) {
	a, b, la, _ := connectedPair(t, Config{GiveUp: time.Second}, Config{GiveUp: time.Second})
	if err := sendAndWait(t, a, b, 1, 2*time.Second); err != nil {
		t.Fatal(err)
	}
	a2 := crash(t, a, la)
	s, err := b.Isend(a2.Addr(), 2, [][]byte{[]byte("to the old a")}, nil)
	if err != nil {
		t.Fatal(err)
	}
	b.Forget(s)
	c, err := b.IConnect(a2.Addr(), 0xa, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if _, err := b.Wait(ctx, c); err != nil {
		t.Fatal(err)
	}
	if err := sendAndWait(t, b, a2, 3, 2*time.Second); err != nil {
		t.Fatalf("b to the new a after b's connect: %v\nb: %sa: %sduplicates at a: %d",
			err, b.DebugPeer(a2.Addr()), a2.DebugPeer(b.Addr()), a2.Counters().Duplicates)
	}
}

// TestConnStressNackedConnectLosesMessage: the same start; then a's new
// self connects to b too, which makes a jump its expected sequence number
// to b's next one, past the frame b is retransmitting: b's send completes
// with success (the frame is acknowledged as a duplicate) and a never
// receives the message.
func TestConnStressNackedConnectLosesMessage(t *testing.T) {
	a, b, la, _ := connectedPair(t, Config{GiveUp: time.Second}, Config{GiveUp: time.Second})
	if err := sendAndWait(t, a, b, 1, 2*time.Second); err != nil {
		t.Fatal(err)
	}
	a2 := crash(t, a, la)
	s, err := b.Isend(a2.Addr(), 2, [][]byte{[]byte("to the old a")}, nil)
	if err != nil {
		t.Fatal(err)
	}
	b.Forget(s)
	c, err := b.IConnect(a2.Addr(), 0xa, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	if _, err := b.Wait(ctx, c); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 10)
	r, err := a2.Irecv(3, ^uint64(0), [][]byte{buf}, nil)
	if err != nil {
		t.Fatal(err)
	}
	s3, err := b.Isend(a2.Addr(), 3, [][]byte{[]byte("0123456789")}, nil)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(20 * time.Millisecond)
	if err := a2.Connect(ctx, b.Addr(), 0xb); err != nil {
		t.Fatal(err)
	}
	sst, serr := b.Wait(ctx, s3)
	rctx, rcancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer rcancel()
	rst, rerr := a2.Wait(rctx, r)
	if serr == nil && rerr != nil {
		t.Errorf("b's send completed with %v but a's receive did not complete (%v): the message was acknowledged unseen\nb: %sa: %s",
			sst.Code, rerr, b.DebugPeer(a2.Addr()), a2.DebugPeer(b.Addr()))
	} else if serr != nil || rst.Code != Success || string(buf) != "0123456789" {
		t.Errorf("send %v, receive %v %q", serr, rerr, buf)
	}
}

// TestConnStressDoubleResetWraps: two resets of a record with no connect
// between them (here two Disconnects, the first one's frame lost; in the
// stress runs also a give-up followed by a Disconnect) move the sequence
// numbers by 2 * 2^31 = 2^32: back where they were. The frames the
// resets discarded are never sent again, and the peer, which never heard
// of the resets, sees at the next connect a sequence number near the one
// it expects, takes it for the same exchange, and waits for the
// discarded frames for ever.
func TestConnStressDoubleResetWraps(t *testing.T) {
	a, b, la, _ := connectedPair(t, Config{GiveUp: time.Second}, Config{GiveUp: time.Second})
	if err := sendAndWait(t, b, a, 1, 2*time.Second); err != nil {
		t.Fatal(err)
	}
	la.Partition(true) // what b sends a is lost
	s, err := b.Isend(a.Addr(), 2, [][]byte{[]byte("lost")}, nil)
	if err != nil {
		t.Fatal(err)
	}
	b.Disconnect(a.Addr()) // its frame is lost too
	b.Disconnect(a.Addr())
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	if st, _ := b.Wait(ctx, s); st.Code != Aborted {
		t.Fatalf("send before the disconnects: %v, want %v", st.Code, Aborted)
	}
	la.Partition(false)
	if err := b.Connect(ctx, a.Addr(), 0xa); err != nil {
		t.Fatal(err)
	}
	if err := sendAndWait(t, b, a, 3, 2*time.Second); err != nil {
		t.Fatalf("b to a after b reconnected: %v\nb: %sa: %s", err, b.DebugPeer(a.Addr()), a.DebugPeer(b.Addr()))
	}
}

// TestConnStressResyncKeepsDiscardedNumbers: a resync (the peer's
// sequence numbers jumped) empties the window but keeps our next sequence
// number; the peer, which had learned an older one from a connect of
// ours, is told the new one by our reply but ignores it (it is not far
// from what it expects) and waits for the discarded frames for ever.
func TestConnStressResyncKeepsDiscardedNumbers(t *testing.T) {
	a, b, la, _ := connectedPair(t, Config{GiveUp: 2 * time.Second}, Config{GiveUp: 2 * time.Second})
	if err := sendAndWait(t, a, b, 1, 2*time.Second); err != nil {
		t.Fatal(err)
	}
	hub := la.Hub()
	hub.SetConfig(xdp.MemConfig{Delay: 30 * time.Millisecond})
	c, err := a.IConnect(b.Addr(), 0xb, 0, nil) // arrives in 30 ms, saying a's next number n
	if err != nil {
		t.Fatal(err)
	}
	hub.SetConfig(xdp.MemConfig{Loss: 1})
	s, err := a.Isend(b.Addr(), 2, [][]byte{[]byte("lost")}, nil) // frame n, lost
	if err != nil {
		t.Fatal(err)
	}
	b.Disconnect(a.Addr())            // b forgets a; its disconnect frame is lost
	time.Sleep(50 * time.Millisecond) // b takes a's connect: it expects n again
	hub.SetConfig(xdp.MemConfig{})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	// b's connect says its number, half the space on: a resyncs, which
	// drops frame n and keeps n+1 as its next number.
	if err := b.Connect(ctx, a.Addr(), 0xa); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Wait(ctx, c); err != nil {
		t.Fatal(err)
	}
	st, _ := a.Wait(ctx, s)
	t.Logf("the send of the lost frame: %v", st.Code)
	if err := sendAndWait(t, a, b, 3, 2*time.Second); err != nil {
		t.Fatalf("a to b after both connected: %v\na: %sb: %s", err, a.DebugPeer(b.Addr()), b.DebugPeer(a.Addr()))
	}
}

// TestConnStressRndvAckedBeforeStampNeverTimed: the record of a
// rendezvous send whose ack the sender's driver handles before it stamps
// the frame (the ack is in the first batch after an API call flushed the
// record, which is how an idle driver sees it) never arms the peer's
// timer: stampSent skips a slot acknowledged on its way out. Nothing then
// sends keepalives while the send waits for the notify, and if the
// receiver goes away (here: a partition; in the stress runs: a restart
// of the receiver after it acknowledged the record) the send never ends.
// The ack is forged so that the order is certain.
func TestConnStressRndvAckedBeforeStampNeverTimed(t *testing.T) {
	a, b, la, _ := connectedPair(t, Config{GiveUp: 300 * time.Millisecond}, Config{})
	time.Sleep(20 * time.Millisecond) // the connects' timers have run
	la.Partition(true)                // nothing reaches b from now on
	g := a.eng
	// a's driver is ours: nothing is stamped behind our back.
	g.wantDrive.Add(1) // the background goroutine leaves the token
	defer g.wantDrive.Add(-1)
	for deadline := time.Now().Add(5 * time.Second); !g.drive.tryTake(); {
		if time.Now().After(deadline) {
			t.Fatal("could not take a's drive token")
		}
		if g.waker != nil {
			g.waker.Wake()
		}
		time.Sleep(10 * time.Microsecond)
	}
	s, err := a.Isend(b.Addr(), 1, [][]byte{make([]byte, 100<<10)}, nil)
	if err != nil {
		g.drive.release()
		t.Fatal(err)
	}
	g.mu.Lock()
	p := a.peers[b.Addr()]
	armedBefore := p.tm.armed()
	f := make([]byte, hdrLen)
	h := header{typ: tAck, dstEP: a.id, srcEP: b.id, dstSession: a.session, srcSession: b.session, ack: p.nextSeq}
	putHeader(f, &a.eng.mac, &b.eng.mac, b.eng.ethType, &h)
	now := g.readClock()
	g.dispatch(f, now) // b's ack of the record, as the driver's batch would bring it
	g.runTimers(now)   // what the driver does after the batch: stamps, runs timers
	armed, rndvs, inFlight := p.tm.armed(), p.rndvs, p.inFlight()
	g.mu.Unlock()
	g.drive.release()
	t.Logf("timer armed before the send %v, after the ack %v; rendezvous awaiting notify %d, in flight %d",
		armedBefore, armed, rndvs, inFlight)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond+2*time.Second)
	defer cancel()
	if st, err := a.Wait(ctx, s); st.Code == Success && err != nil {
		t.Fatalf("the send to a peer cut off is still pending %v after GiveUp (300ms): %v\na: %s", 2*time.Second, err, a.DebugPeer(b.Addr()))
	} else {
		t.Logf("send: %v", st.Code)
	}
}

// TestConnStressLateReplySkipsFrames (shrunk from seed 198: "I1>0 P1+
// W1207 S0>1:4474"): b connects to a; a takes the connect (it is now
// connected to b) but its reply is lost; a sends b a message, also lost.
// b's connect goes again (same id, same number: a does not take it
// again) and a's reply to that copy says a's next sequence number as it
// is now, past the message's frames. b learns its expected number from
// that reply, so a's retransmissions of the message are duplicates at b,
// which acknowledges them: a's send completes with success and b never
// gets the message.
func TestConnStressLateReplySkipsFrames(t *testing.T) {
	hub := xdp.NewHub(xdp.MemConfig{})
	la, lb := hub.Attach(), hub.Attach()
	t.Cleanup(func() { la.Close(); lb.Close() })
	a := openT(t, Config{Link: la, EndpointID: 1, Key: 0xa})
	b := openT(t, Config{Link: lb, EndpointID: 2, Key: 0xb})
	c, err := b.IConnect(a.Addr(), 0xa, 0, nil) // its first copy is on its way to a
	if err != nil {
		t.Fatal(err)
	}
	lb.Partition(true) // a's reply, and whatever a sends b, is lost
	for deadline := time.Now().Add(2 * time.Second); ; time.Sleep(time.Millisecond) {
		a.eng.mu.Lock()
		p := a.peers[b.Addr()]
		ok := p != nil && p.connected
		a.eng.mu.Unlock()
		if ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("a did not take b's connect")
		}
	}
	buf := make([]byte, 4474)
	r, err := b.Irecv(1, ^uint64(0), [][]byte{buf}, nil)
	if err != nil {
		t.Fatal(err)
	}
	msg := csData(1, len(buf))
	s, err := a.Isend(b.Addr(), 1, [][]byte{msg}, nil) // a is connected to b: it may send
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(5 * time.Millisecond)
	lb.Partition(false)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	if _, err := b.Wait(ctx, c); err != nil {
		t.Fatalf("b's connect: %v", err)
	}
	sst, serr := a.Wait(ctx, s)
	rctx, rcancel := context.WithTimeout(context.Background(), time.Second)
	defer rcancel()
	rst, rerr := b.Wait(rctx, r)
	if serr == nil && (rerr != nil || rst.Code != Success || !bytes.Equal(buf, msg)) {
		t.Fatalf("a's send completed with %v, b's receive: %v %v (data intact %v): acknowledged unseen\na: %sb: %s",
			sst.Code, rst.Code, rerr, bytes.Equal(buf, msg), a.DebugPeer(b.Addr()), b.DebugPeer(a.Addr()))
	}
	t.Logf("send %v %v, receive %v %v", sst.Code, serr, rst.Code, rerr)
}

// TestConnStressLateDisconnect (shrunk from seed 246: "C1>0
// N:94,87,55,150 W651 D1>0" and the checkpoint's simultaneous connects):
// b disconnects a; the disconnect frame is late (here delayed, in the
// stress run held back by reordering) and reaches a after both sides
// connected again. A disconnect frame says nothing of which exchange it
// ends: a forgets the new one, and a's next send is refused although
// both Connects succeeded after the Disconnect.
func TestConnStressLateDisconnect(t *testing.T) {
	a, b, la, _ := connectedPair(t, Config{}, Config{})
	hub := la.Hub()
	hub.SetConfig(xdp.MemConfig{Delay: 30 * time.Millisecond})
	b.Disconnect(a.Addr()) // its frame reaches a in 30 ms
	hub.SetConfig(xdp.MemConfig{})
	connectBoth(t, a, b)
	time.Sleep(50 * time.Millisecond) // the late disconnect arrives
	for i, dir := range [][2]*Endpoint{{a, b}, {b, a}} {
		if err := sendAndWait(t, dir[0], dir[1], uint64(10+i), time.Second); err != nil {
			t.Errorf("%v to %v after both connected: %v", dir[0].Addr(), dir[1].Addr(), err)
		}
	}
}
