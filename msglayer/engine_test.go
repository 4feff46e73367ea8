package msglayer

import (
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
		putHeader(f, l0.HardwareAddr(), l1.HardwareAddr(), xdp.DefaultEtherType, &h)
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
