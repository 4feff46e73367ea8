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
