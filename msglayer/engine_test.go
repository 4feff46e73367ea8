package msglayer

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/xmx-stack/xmx/xdp"
)

// TestEngineStartsWithFramesQueued opens endpoints on links that hold
// frames already, as a link does when an earlier engine's peer still
// retransmits to it. The background goroutine answers them (a nack: no
// such endpoint) the moment it starts, while Open is still setting up:
// under -race this catches a field the opener writes after the goroutine
// started.
func TestEngineStartsWithFramesQueued(t *testing.T) {
	const rounds, frames = 30, 4
	for round := 0; round < rounds; round++ {
		hub := xdp.NewHub(xdp.MemConfig{})
		l0, l1 := hub.Attach(), hub.Attach()
		f := make([]byte, max(frameLen(tNop, 0), xdp.MinFrameLen))
		h := header{typ: tNop, dstEP: 9, srcEP: 2, srcSession: 7, seq: 1}
		putHeader(f, (*[6]byte)(l0.HardwareAddr()), (*[6]byte)(l1.HardwareAddr()), xdp.DefaultEtherType, &h)
		batch := make([][]byte, frames)
		for i := range batch {
			batch[i] = f
		}
		if n, err := l1.Send(batch); n != frames || err != nil {
			t.Fatalf("queue stale frames: sent %d of %d: %v", n, frames, err)
		}
		e, err := Open(Config{Link: l0, EndpointID: 1})
		if err != nil {
			t.Fatal(err)
		}
		bufs := [][]byte{make([]byte, xdp.MaxFrameLen(l1))}
		sizes := []int{0}
		for got := 0; got < frames; {
			n, err := l1.Recv(bufs, sizes, 5*time.Second)
			if err != nil || n == 0 {
				t.Fatalf("round %d: %d of %d nacks, then %d frames, %v", round, got, frames, n, err)
			}
			rh, err := decodeHeader(bufs[0][:sizes[0]])
			if err != nil || rh.typ != tNack || rh.dstSession != h.srcSession {
				t.Fatalf("round %d: answer %+v (%v), want a nack to session %d", round, rh, err, h.srcSession)
			}
			got++
		}
		if c := e.Counters(); c.BadFrames != frames {
			t.Errorf("round %d: BadFrames = %d, want %d", round, c.BadFrames, frames)
		}
		e.Close()
		l0.Close()
		l1.Close()
	}
}

// fixedMeter is a WaitMeter that reports a fixed wait.
type fixedMeter struct {
	d  time.Duration
	ok bool
}

func (m fixedMeter) Waited() (time.Duration, bool) { return m.d, m.ok }

// TestDriverNowAfterSleep checks the time a driver handles frames at after
// a receive that may have slept: the clock read before it plus the wait,
// never earlier than a clock reading taken meanwhile, once only; and the
// clock when the link cannot tell.
func TestDriverNowAfterSleep(t *testing.T) {
	g := &engine{clock: NewRealClock(), meter: fixedMeter{d: 30 * time.Microsecond, ok: true}}
	g.mu.Lock()
	defer g.mu.Unlock()
	from := g.readClock()
	g.sleptFrom = from
	if now := g.driverNow(); now != from+int64(30*time.Microsecond) {
		t.Errorf("driverNow after a 30 µs wait = %d, want %d", now, from+int64(30*time.Microsecond))
	}
	if g.sleptFrom != 0 {
		t.Error("sleptFrom still set after driverNow used it")
	}
	// A reading taken after the one before the sleep (a flush, an API
	// call) is a floor: no stamp may come out later than the time.
	g.sleptFrom = from
	g.lastRead = from + int64(time.Millisecond)
	if now := g.driverNow(); now != g.lastRead {
		t.Errorf("driverNow with a later reading in between = %d, want lastRead %d", now, g.lastRead)
	}
	// A link that cannot tell: the clock.
	g.meter = fixedMeter{}
	g.sleptFrom = from
	before := g.clock.Now()
	if now := g.driverNow(); now < before {
		t.Errorf("driverNow without a wait measure = %d, before the clock read just before it (%d)", now, before)
	}
}

// boundedCounter is a mem link that counts the receives that may wait
// (a driver about to sleep) and the polls.
type boundedCounter struct {
	*xdp.MemLink
	bounded, polls atomic.Int64
}

func (l *boundedCounter) RecvVisit(max int, timeout time.Duration, v xdp.Visitor) (int, error) {
	if timeout != 0 {
		l.bounded.Add(1)
	} else {
		l.polls.Add(1)
	}
	return l.MemLink.RecvVisit(max, timeout, v)
}

// countingClock counts its readings.
type countingClock struct {
	Clock
	reads atomic.Int64
}

func (c *countingClock) Now() int64 { c.reads.Add(1); return c.Clock.Now() }

// TestPeekBeforeSleep checks that a blocking driver handles a frame
// already waiting without a receive that may sleep (the look before it
// prepares to sleep); that a look at an idle link reads no clock and does
// not poll it; and that on a link that cannot tell it is idle without a
// syscall (no xdp.IdleProber: AF_PACKET) the driver does not look.
func TestPeekBeforeSleep(t *testing.T) {
	hub := xdp.NewHub(xdp.MemConfig{})
	la, lc := hub.Attach(), hub.Attach()
	defer la.Close()
	defer lc.Close()
	wc := &boundedCounter{MemLink: lc}
	clk := &countingClock{Clock: NewRealClock()}
	a, err := Open(Config{Link: la, EndpointID: 1, Key: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	c, err := Open(Config{Link: wc, EndpointID: 2, Key: 2, Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := a.Connect(ctx, c.Addr(), 2); err != nil {
		t.Fatal(err)
	}
	if err := c.Connect(ctx, a.Addr(), 1); err != nil {
		t.Fatal(err)
	}

	// Drive c by hand: take its token from the background goroutine.
	g := c.eng
	g.wantDrive.Add(1)
	for !g.drive.tryTake() {
		g.signal()
		time.Sleep(time.Millisecond)
	}
	g.wantDrive.Add(-1)
	defer g.drive.release()

	// exchange posts a receive at c and sends it 8 bytes from a, and
	// waits until the frame is on c's link: Isend may leave it to a's
	// driver when that is flushing (an acknowledgement) at the time.
	in := make([]byte, 8)
	exchange := func() Request {
		t.Helper()
		r, err := c.Irecv(0, 0, [][]byte{in}, nil)
		if err != nil {
			t.Fatal(err)
		}
		s, err := a.Isend(c.Addr(), 0, [][]byte{[]byte("8 bytes!")}, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { a.Forget(s) })
		for lc.RxIdle() {
			if ctx.Err() != nil {
				t.Fatal("the 8 bytes never reached c's link")
			}
			time.Sleep(100 * time.Microsecond)
		}
		return r
	}
	r := exchange()
	bounded := wc.bounded.Load()
	if err := g.driveUntil(ctx, r.r.doneFlag.Load); err != nil {
		t.Fatal(err)
	}
	if n := wc.bounded.Load() - bounded; n != 0 {
		t.Errorf("%d receives that may sleep for a frame already there, want 0", n)
	}
	if st, ok, err := c.Test(r); !ok || err != nil || string(in) != "8 bytes!" {
		t.Fatalf("receive: %+v %v %v, %q", st, ok, err, in)
	}
	reads, polls := clk.reads.Load(), wc.polls.Load()
	if got, err := g.peek(); got || err != nil {
		t.Fatalf("peek at an idle link = %v, %v", got, err)
	}
	if n := clk.reads.Load() - reads; n != 0 {
		t.Errorf("peek at an idle link read the clock %d times", n)
	}
	if n := wc.polls.Load() - polls; n != 0 {
		t.Errorf("peek at an idle link polled it %d times", n)
	}

	// Without the prober, no look even with a frame there.
	exchange()
	g.prober = nil
	polls = wc.polls.Load()
	if got, err := g.peek(); got || err != nil || wc.polls.Load() != polls {
		t.Errorf("peek without a prober = %v, %v after %d polls; want no look", got, err, wc.polls.Load()-polls)
	}
}

// TestOwnMACFramesDropped: a frame from the wire that claims the engine's
// own MAC as its source is counted and dropped. None is genuine (a peer
// with our MAC is of the same process and never uses the NIC), and a
// forged session nack or connect naming a same-process pair used to reset
// or re-pair it: the nack needs no key, only ids a host that connects to
// both endpoints is told.
func TestOwnMACFramesDropped(t *testing.T) {
	for _, connect := range []bool{false, true} {
		fp := newFuzzPair(t, 0, false, false)
		b := fp.b
		c, err := Open(Config{Link: fp.lb, EndpointID: 3, Key: 0xc, Clock: fp.clock, Window: 256})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		cr, err := b.IConnect(c.addr, 0xc, 0, nil)
		if err != nil {
			t.Fatal(err)
		}
		if st, done, _ := b.Test(cr); !done || st.Code != Success {
			t.Fatalf("local connect: %v %+v", done, st)
		}
		g := b.eng
		g.mu.Lock()
		p := b.peers[c.addr]
		localID, remoteID := p.localID, p.remoteID
		bad := g.badFrames
		g.mu.Unlock()
		f := make([]byte, 60)
		if connect {
			h := header{typ: tConnect, dstEP: b.id, srcEP: c.id, srcSession: c.session + 1, seq: 1}
			putConnect(f[hdrLen:], fuzzKeyB, 0x4242, 1500)
			putHeader(f, &g.mac, &g.mac, g.ethType, &h)
		} else {
			h := header{typ: tNack, dstEP: b.id, srcEP: c.id, dstSession: localID, srcSession: 0x1234}
			putNack(f[hdrLen:], 0, nackBadSession, remoteID)
			putHeader(f, &g.mac, &g.mac, g.ethType, &h)
		}
		g.mu.Lock()
		g.dispatch(exact(f), g.clock.Now())
		connected, local, counted := p.connected, p.local != nil, g.badFrames-bad
		g.flushAndUnlock()
		if !connected || !local || counted != 1 {
			t.Errorf("forged %s from our own MAC: the same-process peer connected %v, local %v; %d bad frames counted, want 1",
				map[bool]string{false: "nack", true: "connect"}[connect], connected, local, counted)
		}
	}
}
