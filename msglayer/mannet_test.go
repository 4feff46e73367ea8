package msglayer

import (
	"bytes"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/xmx-stack/xmx/xdp"
)

// capLink captures the frames an engine sends instead of sending them:
// the test delivers them itself, in the order it chooses.
type capLink struct {
	xdp.Link
	mu  sync.Mutex
	out [][]byte
}

func (l *capLink) Send(frames [][]byte) (int, error) {
	l.mu.Lock()
	for _, f := range frames {
		l.out = append(l.out, bytes.Clone(f))
	}
	l.mu.Unlock()
	return len(frames), nil
}

func (l *capLink) Wake() {
	if w, ok := l.Link.(xdp.Waker); ok {
		w.Wake()
	}
}

// lastOut returns the frames sent and not taken yet, leaving them.
func (l *capLink) lastOut() [][]byte {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.out
}

func (l *capLink) take() [][]byte {
	l.mu.Lock()
	defer l.mu.Unlock()
	o := l.out
	l.out = nil
	return o
}

// manNet is two endpoints whose frames move only when the test says, on
// a manual clock: a connect/restart schedule plays the same every time.
type manNet struct {
	t      *testing.T
	clock  *ManualClock
	la, lb *capLink
	a, b   *Endpoint
	giveUp time.Duration
	// trace, if set, sees each frame lockstep delivers, before e does.
	trace func(to *Endpoint, f []byte)
}

// newManNet opens endpoints a (id 1, key 0xa) and b (id 2, key 0xb);
// they give up on each other after giveUp of silence.
func newManNet(t *testing.T, giveUp time.Duration) *manNet {
	n := &manNet{t: t, clock: &ManualClock{}, giveUp: giveUp}
	n.clock.Advance(time.Millisecond)
	ma, mb := xdp.NewPair(xdp.MemConfig{})
	n.la, n.lb = &capLink{Link: ma}, &capLink{Link: mb}
	n.a, n.b = n.open(n.la, 1, 0xa), n.open(n.lb, 2, 0xb)
	t.Cleanup(func() { n.la.Link.Close(); n.lb.Link.Close() })
	return n
}

func (n *manNet) open(l *capLink, id uint8, key uint32) *Endpoint {
	return n.openCfg(l, id, key, Config{GiveUp: n.giveUp})
}

// openCfg is open with a configuration of its own (link, id, key and
// clock set here).
func (n *manNet) openCfg(l *capLink, id uint8, key uint32, c Config) *Endpoint {
	c.Link, c.EndpointID, c.Key, c.Clock = l, id, key, n.clock
	c.ConnectRetry = 50 * time.Millisecond
	e, err := Open(c)
	if err != nil {
		n.t.Fatal(err)
	}
	n.t.Cleanup(func() { e.Close() })
	e.eng.wantDrive.Add(1) // the background driver stays away
	l.Wake()
	return e
}

// restart closes e and opens it again: same address, new self.
func (n *manNet) restart(e *Endpoint) *Endpoint {
	l, key := n.la, e.cfg.Key
	if e == n.b {
		l = n.lb
	}
	e.eng.wantDrive.Add(-1)
	e.Close()
	l.take()
	e2 := n.open(l, e.id, key)
	if e == n.a {
		n.a = e2
	} else {
		n.b = e2
	}
	return e2
}

// deliver hands frame f to e's engine as its driver would.
func (n *manNet) deliver(e *Endpoint, f []byte) { n.deliverFrame(e, f, true) }

// deliverFrame is deliver, the acks f carries processed at once (settle)
// or left for later, as after a driver's batch that completed its Wait's
// request.
func (n *manNet) deliverFrame(e *Endpoint, f []byte, settle bool) {
	g := e.eng
	g.mu.Lock()
	g.dispatch(f, g.clock.Now())
	if settle {
		g.settleAcks()
	}
	g.flushAndUnlock()
}

// timers runs e's due timers.
func (n *manNet) timers(e *Endpoint) {
	g := e.eng
	g.mu.Lock()
	g.runTimers(g.clock.Now())
	g.flushAndUnlock()
}

// lockstep moves frames both ways at once, round after round (what each
// side sent in a round reaches the other in the next: a symmetric delay),
// until nothing moves; it reports the frames moved.
func (n *manNet) lockstep() int {
	moved := 0
	for range 1000 {
		fa, fb := n.la.take(), n.lb.take()
		if len(fa)+len(fb) == 0 {
			return moved
		}
		moved += len(fa) + len(fb)
		for _, f := range fa {
			n.traceDeliver(n.b, f)
		}
		for _, f := range fb {
			n.traceDeliver(n.a, f)
		}
	}
	n.t.Fatal("frames keep moving")
	return moved
}

func (n *manNet) traceDeliver(e *Endpoint, f []byte) {
	if n.trace != nil {
		n.trace(e, f)
	}
	n.deliver(e, f)
}

// settle runs rounds of lockstep, each followed by step of the clock and
// both endpoints' timers.
func (n *manNet) settle(rounds int, step time.Duration) {
	for range rounds {
		n.lockstep()
		n.clock.Advance(step)
		n.timers(n.a)
		n.timers(n.b)
	}
}

// ids returns the generations of e's id and of the id it knows of o, and
// whether e is connected to o.
func (n *manNet) ids(e, o *Endpoint) (l, r uint32, conn bool) {
	e.eng.mu.Lock()
	defer e.eng.mu.Unlock()
	p := e.peers[o.Addr()]
	if p == nil {
		return
	}
	return p.localGen, p.remoteGen, p.connected
}

// exchange sends a 40000-byte message (a rendezvous) from one endpoint of
// n to the other, its receive posted first, and fails the test unless
// both ends complete with success within a few rounds.
func (n *manNet) exchange(from, to *Endpoint, match uint64) {
	n.t.Helper()
	r, _ := to.Irecv(match, ^uint64(0), [][]byte{make([]byte, 40000)}, nil)
	s, err := from.Isend(to.Addr(), match, [][]byte{make([]byte, 40000)}, nil)
	if err != nil {
		n.t.Fatalf("send %d: %v", match, err)
	}
	n.settle(5, time.Millisecond)
	mustComplete(n.t, from, s, Success, fmt.Sprintf("send %d", match))
	mustComplete(n.t, to, r, Success, fmt.Sprintf("receive %d", match))
}

// mustComplete fails the test unless request r of e completed with want.
func mustComplete(t *testing.T, e *Endpoint, r Request, want Code, what string) {
	t.Helper()
	st, ok, err := e.Test(r)
	if !ok || st.Code != want {
		t.Fatalf("%s: done %v, %v (%v), want %v", what, ok, st.Code, err, want)
	}
}
