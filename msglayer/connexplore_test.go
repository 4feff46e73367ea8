package msglayer

import (
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"testing"
	"time"
)

// A randomized exploration of connects, disconnects, restarts and sends
// over a network whose every frame the test moves (mannet_test.go).

type inFlight struct {
	to *Endpoint
	f  []byte
}

type xmsg struct {
	dead     bool
	from, to *Endpoint
	s, r     Request
	match    uint64
}

type explorer struct {
	*manNet
	rng      *rand.Rand
	flight   []inFlight
	msgs     []*xmsg
	match    uint64
	log      []string
	restarts bool
	// replays: besides the frames in flight, any frame sent before may
	// arrive again, however late (history), and after the heal every
	// connect and reply ever sent does.
	replays bool
	history []inFlight
}

func (x *explorer) collect() {
	n := len(x.flight)
	for _, f := range x.la.take() {
		x.flight = append(x.flight, inFlight{x.b, f})
	}
	for _, f := range x.lb.take() {
		x.flight = append(x.flight, inFlight{x.a, f})
	}
	if x.replays {
		x.history = append(x.history, x.flight[n:]...)
	}
}

// replay delivers again a frame sent at any time before, to the
// endpoint that holds its destination address now.
func (x *explorer) replay(f inFlight) {
	to := x.a
	if f.to.Addr() == x.b.Addr() {
		to = x.b
	}
	x.logf("replay to %s: %s", x.name(to), frameDesc(f.f))
	x.deliver(to, f.f)
}

func (x *explorer) name(e *Endpoint) string {
	if e == x.a {
		return "A"
	}
	return "B"
}

func (x *explorer) other(e *Endpoint) *Endpoint {
	if e == x.a {
		return x.b
	}
	return x.a
}

func (x *explorer) logf(format string, args ...any) {
	x.log = append(x.log, fmt.Sprintf(format, args...))
}

func frameDesc(f []byte) string {
	h, err := decodeHeader(f)
	if err != nil {
		return "bad"
	}
	s := fmt.Sprintf("%v %x->%x seq %d", h.typ, h.srcSession, h.dstSession, h.seq)
	if h.typ == tConnect || h.typ == tConnectReply {
		th, _ := typeHdr(f, &h)
		if h.typ == tConnect {
			_, id, _ := getConnect(th)
			s += fmt.Sprintf(" conn %x", id)
		} else {
			id, code, _ := getConnReply(th)
			s += fmt.Sprintf(" conn %x %v", id, code)
		}
	}
	return s
}

func (x *explorer) step() {
	x.collect()
	e := x.a
	if x.rng.IntN(2) == 1 {
		e = x.b
	}
	if x.replays && len(x.history) > 0 && x.rng.IntN(8) == 0 {
		x.replay(x.history[x.rng.IntN(len(x.history))])
		return
	}
	switch k := x.rng.IntN(20); {
	case k < 8 && len(x.flight) > 0: // deliver one, out of order
		i := x.rng.IntN(len(x.flight))
		if x.rng.IntN(3) > 0 {
			i = 0
		}
		fl := x.flight[i]
		x.flight = append(x.flight[:i], x.flight[i+1:]...)
		x.logf("deliver to %s: %s", x.name(fl.to), frameDesc(fl.f))
		x.deliver(fl.to, fl.f)
	case k < 9 && len(x.flight) > 0: // lose one
		i := x.rng.IntN(len(x.flight))
		x.logf("lose to %s: %s", x.name(x.flight[i].to), frameDesc(x.flight[i].f))
		x.flight = append(x.flight[:i], x.flight[i+1:]...)
	case k < 10 && len(x.flight) > 0: // duplicate one
		i := x.rng.IntN(len(x.flight))
		x.logf("dup to %s: %s", x.name(x.flight[i].to), frameDesc(x.flight[i].f))
		x.deliver(x.flight[i].to, x.flight[i].f)
	case k < 12:
		x.logf("%s connect", x.name(e))
		r, _ := e.IConnect(x.other(e).Addr(), x.other(e).cfg.Key, 0, nil)
		e.Forget(r)
	case k < 13:
		if x.restarts && x.rng.IntN(4) == 0 {
			x.logf("%s restart", x.name(e))
			old := e
			e2 := x.restart(e)
			for i := range x.flight {
				if x.flight[i].to == old {
					x.flight[i].to = e2
				}
			}
			for _, m := range x.msgs {
				if m.to == old {
					m.to = e2
					m.dead = true
				}
				if m.from == old {
					m.from = e2
					m.dead = true
				}
			}
			break
		}
		x.logf("%s disconnect", x.name(e))
		e.Disconnect(x.other(e).Addr())
	case k < 16:
		x.clock.Advance(time.Duration(1+x.rng.IntN(60)) * time.Millisecond)
		x.logf("tick")
		x.timers(x.a)
		x.timers(x.b)
	default:
		x.send(e)
	}
}

func (x *explorer) send(e *Endpoint) *xmsg {
	o := x.other(e)
	x.match++
	m := &xmsg{from: e, to: o, match: x.match}
	var err error
	size := 10
	if x.rng.IntN(3) == 0 {
		size = 40000
	}
	if m.r, err = o.Irecv(m.match, ^uint64(0), [][]byte{make([]byte, size)}, nil); err != nil {
		x.t.Fatal(err)
	}
	if m.s, err = e.Isend(o.Addr(), m.match, [][]byte{make([]byte, size)}, nil); err != nil {
		o.Cancel(m.r)
		return nil
	}
	x.logf("%s send %d", x.name(e), m.match)
	x.msgs = append(x.msgs, m)
	return m
}

// checkSafety: a send that completed Success was delivered.
func (x *explorer) checkSafety() error {
	for _, m := range x.msgs {
		if m.dead {
			continue
		}
		st, ok, _ := m.from.Test(m.s)
		if !ok {
			continue
		}
		m.s = Request{}
		if st.Code != Success {
			m.to.Cancel(m.r)
			continue
		}
		rt, rok, _ := m.to.Test(m.r)
		if !rok || rt.Code != Success {
			return fmt.Errorf("message %d %s->%s acked, not delivered (%v %v)", m.match, x.name(m.from), x.name(m.to), rok, rt.Code)
		}
	}
	kept := x.msgs[:0]
	for _, m := range x.msgs {
		if m.s.r != nil && !m.dead {
			kept = append(kept, m)
		}
	}
	x.msgs = kept
	return nil
}

// heal: the network becomes perfect (symmetric, lockstep); both sides
// call Connect at once until both succeed, then exchange a message each
// way, which must arrive, and every send must end.
func (x *explorer) heal(rounds int) error {
	for _, e := range []*Endpoint{x.a, x.b} {
		e.eng.mu.Lock()
		for _, r := range e.connects {
			e.complete(r, Cancelled)
		}
		e.connects = nil
		e.eng.mu.Unlock()
	}
	x.flight = nil
	x.collect()
	x.flight = nil
	for round := range rounds {
		ra, _ := x.a.IConnect(x.b.Addr(), 0xb, 0, nil)
		rb, _ := x.b.IConnect(x.a.Addr(), 0xa, 0, nil)
		var sa, sb Status
		var oka, okb bool
		for range 40 {
			x.lockstepLog()
			if !oka {
				sa, oka, _ = x.a.Test(ra)
			}
			if !okb {
				sb, okb, _ = x.b.Test(rb)
			}
			if oka && okb {
				break
			}
			x.clock.Advance(50 * time.Millisecond)
			x.timers(x.a)
			x.timers(x.b)
		}
		x.logf("heal round %d: %v %v", round, sa.Code, sb.Code)
		if sa.Code == Success && sb.Code == Success {
			if x.replays {
				// Every connect and reply ever sent comes again: none
				// may take either side away from the connection.
				for _, f := range x.history {
					if h, err := decodeHeader(f.f); err == nil && (h.typ == tConnect || h.typ == tConnectReply) {
						x.replay(f)
					}
				}
				x.lockstepLog()
			}
			// On a healed network, with both sides connected, a message
			// each way must arrive.
			var healed []*xmsg
			for _, e := range []*Endpoint{x.a, x.b} {
				m := x.send(e)
				if m == nil {
					return fmt.Errorf("%s's Isend refused after both connected", x.name(e))
				}
				healed = append(healed, m)
			}
			x.settle(20, 5*time.Millisecond)
			x.settle(200, 10*time.Millisecond) // past the backoff of earlier retransmissions
			for _, m := range healed {
				st, ok, _ := m.from.Test(m.s)
				rt, rok, _ := m.to.Test(m.r)
				if !ok || st.Code != Success || !rok || rt.Code != Success {
					return fmt.Errorf("message %d %s->%s on the healed network: send %v %v, receive %v %v\n%s%s", m.match, x.name(m.from), x.name(m.to),
						ok, st.Code, rok, rt.Code, x.a.DebugPeer(x.b.Addr()), x.b.DebugPeer(x.a.Addr()))
				}
				m.s = Request{}
			}
			if err := x.checkSafety(); err != nil {
				return err
			}
			for _, m := range x.msgs {
				if !m.dead {
					return fmt.Errorf("send %d %s->%s still pending 2 s after heal:\n%s%s", m.match, x.name(m.from), x.name(m.to), x.a.DebugPeer(x.b.Addr()), x.b.DebugPeer(x.a.Addr()))
				}
			}
			return nil
		}
	}
	return fmt.Errorf("no connect in %d rounds of simultaneous connects", rounds)
}

// TestExploreConnects plays random schedules of two endpoints on a
// manual network (frames delivered one by one, out of order, lost or
// duplicated; connects, disconnects, restarts, give-ups, small and
// rendezvous sends), checking after every step that no send completed
// with success without its receive, then heals the network and requires
// both sides to connect and exchange messages. In the variant "replays"
// any frame sent before may come again at any step, and once both sides
// are connected after the heal every connect and reply ever sent does,
// which must not cost a message. XMX_EXPLORE_SEEDS and XMX_EXPLORE_STEPS
// set the size (default 100 seeds of 150 steps for each of four
// variants).
func TestExploreConnects(t *testing.T) {
	seeds, steps := 100, 150
	if s := os.Getenv("XMX_EXPLORE_STEPS"); s != "" {
		steps, _ = strconv.Atoi(s)
	}
	if s := os.Getenv("XMX_EXPLORE_SEEDS"); s != "" {
		seeds, _ = strconv.Atoi(s)
	}
	if testing.Short() {
		seeds = min(seeds, 10)
	}
	for _, v := range []struct {
		name     string
		restarts bool
		giveUp   time.Duration
		replays  bool
	}{{"plain", false, time.Hour, false}, {"restarts", true, time.Hour, false}, {"giveup", true, 150 * time.Millisecond, false},
		{"replays", true, time.Hour, true}} {
		t.Run(v.name, func(t *testing.T) {
			fails := 0
			for seed := range seeds {
				ok := t.Run(fmt.Sprint(seed), func(t *testing.T) {
					x := &explorer{manNet: newManNet(t, v.giveUp), rng: rand.New(rand.NewPCG(uint64(seed), 7)), restarts: v.restarts, replays: v.replays}
					x.connectFirst()
					for range steps {
						x.step()
						if err := x.checkSafety(); err != nil {
							t.Fatalf("%v\n%s", err, x.dump())
						}
					}
					if err := x.heal(6); err != nil {
						t.Fatalf("%v\n%s", err, x.dump())
					}
				})
				if !ok {
					if fails++; fails > 3 {
						return
					}
				}
			}
		})
	}
}

func (x *explorer) connectFirst() {
	ra, _ := x.a.IConnect(x.b.Addr(), 0xb, 0, nil)
	rb, _ := x.b.IConnect(x.a.Addr(), 0xa, 0, nil)
	x.lockstep()
	x.a.Forget(ra)
	x.b.Forget(rb)
}

func (x *explorer) dump() string {
	s := ""
	from := max(0, len(x.log)-60)
	for _, l := range x.log[from:] {
		s += l + "\n"
	}
	s += "A: " + x.a.DebugPeer(x.b.Addr()) + "B: " + x.b.DebugPeer(x.a.Addr())
	la, lr, lc := x.ids(x.a, x.b)
	bl, br, bc := x.ids(x.b, x.a)
	s += fmt.Sprintf("a gen %d paired with b gen %d (%v), b gen %d paired with a gen %d (%v)\n", la, lr, lc, bl, br, bc)
	return s
}

// lockstepLog is lockstep with every frame it moves in the log.
func (x *explorer) lockstepLog() {
	x.trace = func(to *Endpoint, f []byte) { x.logf("  ls to %s: %s", x.name(to), frameDesc(f)) }
	defer func() { x.trace = nil }()
	x.lockstep()
}
