package msglayer

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/xmx-stack/xmx/xdp"
)

// sendAndWait sends one 10-byte message from one endpoint to another with
// match info match and waits, up to d, for both ends.
func sendAndWait(t *testing.T, from, to *Endpoint, match uint64, d time.Duration) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	r, err := to.Irecv(match, ^uint64(0), [][]byte{make([]byte, 10)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	s, err := from.Isend(to.Addr(), match, [][]byte{[]byte("0123456789")}, nil)
	if err != nil {
		to.Cancel(r)
		return err
	}
	if _, err := to.Wait(ctx, r); err != nil {
		to.Cancel(r)
		from.Forget(s)
		return err
	}
	_, err = from.Wait(ctx, s)
	return err
}

// restart closes b and opens it again with the same id and key on its
// link: the same address, a new session.
func restart(t *testing.T, b *Endpoint, lb *xdp.MemLink) *Endpoint {
	t.Helper()
	b.Close()
	b2, err := Open(Config{Link: lb, EndpointID: b.id, Key: b.cfg.Key})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b2.Close() })
	return b2
}

// TestReconnectToRestartedPeer: a peer restarts, and the side that still
// holds the old connection connects again, either at once or after a send
// failed with ErrBadSession. The connect told the new peer where our
// sequence numbers go on; the reply's new session used to move them half
// the space on again, and the new peer dropped every later frame as a
// duplicate.
func TestReconnectToRestartedPeer(t *testing.T) {
	for _, afterNack := range []bool{false, true} {
		name := map[bool]string{false: "at once", true: "after ErrBadSession"}[afterNack]
		t.Run(name, func(t *testing.T) {
			a, b, _, lb := connectedPair(t, Config{}, Config{})
			if err := sendAndWait(t, a, b, 1, 2*time.Second); err != nil {
				t.Fatal(err)
			}
			b2 := restart(t, b, lb)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			if afterNack {
				s, err := a.Isend(b2.Addr(), 9, [][]byte{[]byte("x")}, nil)
				if err != nil {
					t.Fatal(err)
				}
				if _, err := a.Wait(ctx, s); !errors.Is(err, ErrBadSession) {
					t.Fatalf("send to the restarted peer: %v, want ErrBadSession", err)
				}
			}
			if err := a.Connect(ctx, b2.Addr(), 0xb); err != nil {
				t.Fatal(err)
			}
			for i := range uint64(3) {
				if err := sendAndWait(t, a, b2, 2+i, 2*time.Second); err != nil {
					t.Fatalf("message %d after reconnecting: %v\na: %s\nduplicates at the new peer: %d",
						i, err, a.DebugPeer(b2.Addr()), b2.Counters().Duplicates)
				}
			}
			if err := sendAndWait(t, b2, a, 7, 2*time.Second); err != nil {
				t.Fatalf("answer from the restarted peer: %v", err)
			}
		})
	}
}

// TestStaleFrameKeepsNewSession: a peer restarts and connects; a frame we
// had sent to its old self, late, reaches the new one, which refuses it.
// The refusal names the old session: it must not end the new connection.
func TestStaleFrameKeepsNewSession(t *testing.T) {
	a, b, _, lb := connectedPair(t, Config{}, Config{})
	a.eng.mu.Lock()
	oldSeq := a.peers[b.Addr()].nextSeq
	a.eng.mu.Unlock()
	b2 := restart(t, b, lb)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := b2.Connect(ctx, a.Addr(), 0xa); err != nil {
		t.Fatal(err)
	}
	if err := sendAndWait(t, b2, a, 3, 2*time.Second); err != nil {
		t.Fatalf("new peer to a after its connect: %v", err)
	}
	// a's frame to the old b, late: it reaches the new one now.
	eh := make([]byte, eagerHdrLen)
	(&eagerHdr{match: 5, msgLen: 1}).put(eh)
	f := append(forgeFrom(a, b, tEager, oldSeq, eh), 'x')
	f[xdp.EthHeaderLen+23] = 1 // payload length
	g := b2.eng
	g.mu.Lock()
	g.dispatch(f, g.readClock())
	g.flushAndUnlock()
	if b2.Counters().StaleFrames == 0 {
		t.Fatal("the late frame was not refused as stale")
	}
	for _, dir := range [][2]*Endpoint{{b2, a}, {a, b2}} {
		if err := sendAndWait(t, dir[0], dir[1], 4, 2*time.Second); err != nil {
			t.Errorf("%v to %v after the late frame: %v", dir[0].Addr(), dir[1].Addr(), err)
		}
	}
}

// TestRestartWhileStreaming: the same with real traffic. a streams to b
// over a segment with 2 ms of delay; b restarts and its new self connects
// to a while a's frames to the old b are still on their way.
func TestRestartWhileStreaming(t *testing.T) {
	a, b, la, lb := connectedPair(t, Config{}, Config{})
	la.Hub().SetConfig(xdp.MemConfig{Delay: 2 * time.Millisecond})
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for i := uint64(0); ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			if r, err := a.Isend(b.Addr(), i, [][]byte{make([]byte, 100)}, nil); err == nil {
				a.Forget(r)
			}
			time.Sleep(50 * time.Microsecond)
		}
	}()
	time.Sleep(20 * time.Millisecond)
	b2 := restart(t, b, lb)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	err := b2.Connect(ctx, a.Addr(), 0xa)
	close(stop)
	<-done
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(20 * time.Millisecond) // the last late frames are refused
	if b2.Counters().StaleFrames == 0 {
		t.Log("no late frame reached the new peer: the race was not hit this time")
	}
	if err := sendAndWait(t, b2, a, 1<<40, 2*time.Second); err != nil {
		t.Errorf("the new peer to a after it connected: %v", err)
	}
}

// TestConnectFramesCounted: connects, their replies and session refusals
// count in FramesOut as they do in the receiver's FramesIn.
func TestConnectFramesCounted(t *testing.T) {
	hub := xdp.NewHub(xdp.MemConfig{})
	la, lb := hub.Attach(), hub.Attach()
	defer la.Close()
	defer lb.Close()
	a, err := Open(Config{Link: la, EndpointID: 1, Key: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := Open(Config{Link: lb, EndpointID: 2, Key: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := a.Connect(ctx, b.Addr(), 2); err != nil {
		t.Fatal(err)
	}
	ca, cb := a.Counters(), b.Counters()
	if ca.FramesOut != 1 || ca.FramesOut != cb.FramesIn || cb.FramesOut != ca.FramesIn ||
		ca.BytesOut != cb.BytesIn || cb.BytesOut != ca.BytesIn {
		t.Errorf("a: out %d (%d B), in %d (%d B); b: out %d (%d B), in %d (%d B)",
			ca.FramesOut, ca.BytesOut, ca.FramesIn, ca.BytesIn, cb.FramesOut, cb.BytesOut, cb.FramesIn, cb.BytesIn)
	}
}
