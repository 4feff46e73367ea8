package msglayer

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"
)

// TestTimerHeapModel drives the timer heap with random schedules, removals
// and runs, against a naive model: a map of armed timers to due times.
func TestTimerHeapModel(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for round := range 200 {
		var h timerHeap
		timers := make([]*timer, 1+rng.IntN(40))
		for i := range timers {
			timers[i] = &timer{slot: -1}
		}
		model := map[*timer]int64{}
		now := int64(0)
		for step := range 400 {
			tm := timers[rng.IntN(len(timers))]
			switch op := rng.IntN(10); {
			case op < 5:
				at := now + 1 + rng.Int64N(100) // 0 means no timer
				h.schedule(tm, at)
				if old, ok := model[tm]; !ok || at < old {
					model[tm] = at
				}
			case op < 7:
				h.remove(tm)
				delete(model, tm)
			default:
				now += rng.Int64N(30)
				var popped []*timer
				for p := h.popDue(now); p != nil; p = h.popDue(now) {
					popped = append(popped, p)
				}
				last := int64(-1)
				for _, p := range popped {
					at, ok := model[p]
					if !ok || at > now || p.at != at || p.armed() {
						t.Fatalf("round %d step %d: popped a timer due at %d (model %d, %v) at %d", round, step, p.at, at, ok, now)
					}
					if p.at < last {
						t.Fatalf("round %d step %d: popped out of order: %d after %d", round, step, p.at, last)
					}
					last = p.at
					delete(model, p)
				}
				for m, at := range model {
					if at <= now {
						t.Fatalf("round %d step %d: a timer due at %d was not popped at %d", round, step, at, now)
					}
					if !m.armed() {
						t.Fatalf("round %d step %d: an armed timer is not in the heap", round, step)
					}
				}
			}
			if len(h) != len(model) {
				t.Fatalf("round %d step %d: heap holds %d timers, model %d", round, step, len(h), len(model))
			}
			for i, m := range h {
				if m.slot != i {
					t.Fatalf("round %d step %d: timer at %d says slot %d", round, step, i, m.slot)
				}
				if i > 0 && h[(i-1)/2].at > m.at {
					t.Fatalf("round %d step %d: heap order broken at %d", round, step, i)
				}
			}
			next := int64(0)
			for _, at := range model {
				if next == 0 || at < next {
					next = at
				}
			}
			if len(model) > 0 && h.next() != next {
				t.Fatalf("round %d step %d: next %d, model %d", round, step, h.next(), next)
			}
		}
	}
}

// TestSendStampedByNextDriver checks that an API send reads no clock: its
// frame leaves unstamped, the next driver round stamps it with the time
// it reads (its timeout counts from there), and a frame acknowledged
// before any stamp gives no round-trip sample.
func TestSendStampedByNextDriver(t *testing.T) {
	fp := newFuzzPair(t, 0, false, false)
	if !fp.connect() {
		t.Fatal("connect failed")
	}
	a, g := fp.a, fp.a.eng
	p := a.peers[fp.b.addr]
	slot := func() *txSlot { return &p.win[(p.nextSeq-1)%uint32(len(p.win))] }

	// Acknowledged before a stamp: no round-trip sample.
	srtt := p.srtt
	if _, err := a.Isend(fp.b.addr, 1, [][]byte{make([]byte, 8)}, nil); err != nil {
		t.Fatal(err)
	}
	g.mu.Lock()
	if s := slot(); !s.stamp || len(g.unstamped) != 1 {
		t.Errorf("after Isend: stamp %v, %d unstamped; want true, 1", s.stamp, len(g.unstamped))
	}
	g.mu.Unlock()
	fp.clock.Advance(time.Millisecond)
	fp.drive(fp.b.eng) // B receives and acks at once (AckEvery 1)
	fp.drive(g)        // A handles the ack, then stamps
	g.mu.Lock()
	if s := slot(); s.used || len(g.unstamped) != 0 || p.srtt != srtt {
		t.Errorf("after the ack: used %v, %d unstamped, srtt %d; want false, 0, %d", s.used, len(g.unstamped), p.srtt, srtt)
	}
	g.mu.Unlock()

	// Lost: the stamp is the next driver round's time, and the
	// retransmission comes one timeout after it.
	if _, err := a.Isend(fp.b.addr, 2, [][]byte{make([]byte, 8)}, nil); err != nil {
		t.Fatal(err)
	}
	fp.clock.Advance(time.Millisecond)
	stampAt := fp.clock.Now()
	fp.drive(g)
	g.mu.Lock()
	s := slot()
	if s.stamp || s.sentAt != stampAt || g.nextTimer == 0 || g.nextTimer > stampAt+p.rto {
		t.Errorf("after a driver round: stamp %v, sentAt %d, next timer %d; want false, %d, at most %d", s.stamp, s.sentAt, g.nextTimer, stampAt, stampAt+p.rto)
	}
	rto := p.rto
	g.mu.Unlock()
	fp.clock.Advance(time.Duration(rto) - 1)
	fp.drive(g)
	if n := a.stats.Retransmits; n != 0 {
		t.Errorf("%d retransmissions before the timeout", n)
	}
	fp.clock.Advance(1)
	fp.drive(g)
	if n := a.stats.Retransmits; n != 1 {
		t.Errorf("%d retransmissions at the timeout, want 1", n)
	}
}

// An ack that rides on the frame completing the driver's Wait is
// processed after that Wait returns: by the next driver round, or by a
// call that looks for completions (Test), which must see the send it
// completes. So in a driver that polls before sleeping too: there, the
// acks a Test settled were once taken for the last round's, left over,
// and the next batch's settled with them before its Wait returned.
func TestAckAfterWait(t *testing.T) {
	t.Run("sleeping", func(t *testing.T) { testAckAfterWait(t, 0) })
	t.Run("polling", func(t *testing.T) { testAckAfterWait(t, time.Second) })
}

func testAckAfterWait(t *testing.T, poll time.Duration) {
	fp := newFuzzPair(t, 0, false, false)
	a, b := fp.a, fp.b
	a.eng.spinAuto = false
	a.eng.spinFirst.Store(int64(poll))
	b.eng.mu.Lock()
	b.cfg.AckEvery = 64 // no explicit ack: it rides on b's answer
	b.eng.mu.Unlock()
	p := a.peers[b.addr]
	ctx := context.Background()
	msg := func() [][]byte { return [][]byte{make([]byte, 8)} }
	exchange := func() Request {
		t.Helper()
		rb, _ := b.Irecv(0, 0, msg(), nil)
		ra, _ := a.Irecv(0, 0, msg(), nil)
		s, err := a.Isend(b.addr, 1, msg(), nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := b.Wait(ctx, rb); err != nil {
			t.Fatal(err)
		}
		sb, _ := b.Isend(a.addr, 2, msg(), nil) // carries the ack of s
		b.Forget(sb)
		if _, err := a.Wait(ctx, ra); err != nil {
			t.Fatal(err)
		}
		a.eng.mu.Lock()
		defer a.eng.mu.Unlock()
		if !p.ackQueued || s.r.done {
			t.Errorf("after the Wait: ack queued %v, send done %v; want true, false", p.ackQueued, s.r.done)
		}
		return s
	}

	s := exchange()
	if _, ok, err := a.Test(s); !ok || err != nil {
		t.Errorf("Test of the acked send: %v, %v; want done", ok, err)
	}

	s = exchange()
	wctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if _, err := a.Wait(wctx, s); err != nil {
		t.Errorf("Wait of the acked send: %v", err)
	}
	a.eng.mu.Lock()
	if p.ackQueued || p.inFlight() != 0 {
		t.Errorf("after the next round: ack queued %v, %d in flight; want false, 0", p.ackQueued, p.inFlight())
	}
	a.eng.mu.Unlock()
}
