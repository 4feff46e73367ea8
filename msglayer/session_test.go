package msglayer

import (
	"bytes"
	"context"
	"errors"
	"fmt"
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
	b2 := openT(t, Config{Link: lb, EndpointID: b.id, Key: b.cfg.Key})
	return b2
}

// crash is restart without the old self's goodbye: b's link is cut off
// while b closes, as if its process died, so its peers still hold the old
// connection.
func crash(t *testing.T, b *Endpoint, lb *xdp.MemLink) *Endpoint {
	t.Helper()
	lb.Partition(true)
	b.Close()
	lb.Partition(false)
	return openT(t, Config{Link: lb, EndpointID: b.id, Key: b.cfg.Key})
}

// TestReconnectToRestartedPeer: a peer restarts, and the side that still
// holds the old connection connects again, either at once or after a send
// failed (ErrBadSession, or ErrBadEndpoint after the old self's goodbye). The connect told the new peer where our
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
				// ErrBadSession from the new self, or ErrBadEndpoint
				// when the old self's goodbye (its Close's nack) came
				// first, or ErrNotConnected at once when a took that
				// goodbye before the send: each says to connect again.
				s, err := a.Isend(b2.Addr(), 9, [][]byte{[]byte("x")}, nil)
				if err == nil {
					_, err = a.Wait(ctx, s)
					if !errors.Is(err, ErrBadSession) && !errors.Is(err, ErrBadEndpoint) {
						t.Fatalf("send to the restarted peer: %v, want ErrBadSession or ErrBadEndpoint", err)
					}
				} else if !errors.Is(err, ErrNotConnected) {
					t.Fatalf("send to the restarted peer: %v, want it refused with ErrNotConnected or completed with an error", err)
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
	a := openT(t, Config{Link: la, EndpointID: 1, Key: 1})
	b := openT(t, Config{Link: lb, EndpointID: 2, Key: 2})
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

// TestResolveEnds: Resolve on a closed endpoint returns ErrClosed at once
// (it used to broadcast queries without pause until its deadline), and
// two Resolves of one name at once share the answer (the first to end
// used to drop the other's).
func TestResolveEnds(t *testing.T) {
	hub := xdp.NewHub(xdp.MemConfig{})
	la, lg := hub.Attach(), hub.Attach()
	defer la.Close()
	defer lg.Close()
	a := openT(t, Config{Link: la, EndpointID: 1, Hostname: "alpha"})

	short, c1 := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer c1()
	long, c2 := context.WithTimeout(context.Background(), 5*time.Second)
	defer c2()
	errs := make(chan error, 2)
	go func() { _, err := a.Resolve(short, "gamma", 0); errs <- err }()
	go func() { _, err := a.Resolve(long, "gamma", 0); errs <- err }()
	time.Sleep(400 * time.Millisecond) // the short one has given up
	openT(t, Config{Link: lg, EndpointID: 0, Hostname: "gamma"})
	if e1, e2 := <-errs, <-errs; !errors.Is(e1, ErrTimeout) || e2 != nil {
		t.Errorf("resolves of one name: %v (want a timeout), %v (want the answer)", e1, e2)
	}

	a.Close()
	before := la.Stats().TxFrames
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if _, err := a.Resolve(ctx, "gamma", 0); !errors.Is(err, ErrClosed) || time.Since(start) > 500*time.Millisecond {
		t.Errorf("Resolve after Close: %v after %v, want ErrClosed at once", err, time.Since(start))
	}
	if n := la.Stats().TxFrames - before; n > 0 {
		t.Errorf("Resolve after Close sent %d frames", n)
	}
}

// TestEveryHostnameAnswers: two endpoints of one link with host names of
// their own both answer host queries.
func TestEveryHostnameAnswers(t *testing.T) {
	hub := xdp.NewHub(xdp.MemConfig{})
	la, lb := hub.Attach(), hub.Attach()
	defer la.Close()
	defer lb.Close()
	for i, name := range []string{"alpha", "alpha-2"} {
		openT(t, Config{Link: la, EndpointID: uint8(1 + i), Hostname: name})
	}
	b := openT(t, Config{Link: lb, EndpointID: 1, Hostname: "beta"})
	for _, name := range []string{"alpha", "alpha-2"} {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		a, err := b.Resolve(ctx, name, 2)
		cancel()
		if err != nil || a.MAC != [6]byte(la.HardwareAddr()) {
			t.Errorf("resolve %s: %v, %v", name, a, err)
		}
	}
}

// TestGroupAddressedFrames: a frame to the broadcast address other than a
// host query, or from a group address, is dropped and counted, not
// answered by every engine on the segment; Connect refuses a group
// address.
func TestGroupAddressedFrames(t *testing.T) {
	hub := xdp.NewHub(xdp.MemConfig{})
	raw := hub.Attach()
	defer raw.Close()
	var es []*Endpoint
	for i := range 4 {
		l := hub.Attach()
		defer l.Close()
		e := openT(t, Config{Link: l, EndpointID: uint8(i % 2), Key: 7})
		es = append(es, e)
	}
	var src [6]byte
	copy(src[:], raw.HardwareAddr())
	group := src
	group[0] |= 1
	for _, addrs := range [][2][6]byte{{broadcastMAC, src}, {[6]byte(es[0].eng.mac), group}} {
		f := make([]byte, frameLen(tConnect, 0))
		h := header{typ: tConnect, dstEP: 0, srcEP: 3, srcSession: 1}
		putConnect(putHeader(f, &addrs[0], &addrs[1], xdp.DefaultEtherType, &h), 7, 1, 1500)
		if _, err := raw.Send([][]byte{f}); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(100 * time.Millisecond)
	bufs, sizes := [][]byte{make([]byte, 1600)}, []int{0}
	if n, _ := raw.Recv(bufs, sizes, 0); n != 0 {
		t.Errorf("group-addressed connects were answered")
	}
	if c := es[0].Counters().BadFrames; c == 0 {
		t.Errorf("group-addressed frames not counted as bad")
	}
	if _, err := es[0].IConnect(Addr{MAC: broadcastMAC, EP: 1}, 7, 0, nil); err == nil {
		t.Errorf("IConnect to the broadcast address accepted")
	}
}

// TestLocalDisconnect: Disconnect between two endpoints of one process
// disconnects both sides, as the disconnect frame does between hosts.
func TestLocalDisconnect(t *testing.T) {
	hub := xdp.NewHub(xdp.MemConfig{})
	l := hub.Attach()
	defer l.Close()
	a := openT(t, Config{Link: l, EndpointID: 1, Key: 1})
	b := openT(t, Config{Link: l, EndpointID: 2, Key: 2})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := a.Connect(ctx, b.Addr(), 2); err != nil {
		t.Fatal(err)
	}
	a.Disconnect(b.Addr())
	if _, err := b.Isend(a.Addr(), 1, nil, nil); !errors.Is(err, ErrNotConnected) {
		t.Errorf("b sends to a after a disconnected it: %v, want ErrNotConnected", err)
	}
}

// TestConfigRefusals: negative durations, MinRTO above MaxRTO (MaxRTO
// named when MinRTO is its default), and an
// endpoint whose progress settings differ from those of the endpoints
// already on its link are refused, naming the setting.
func TestConfigRefusals(t *testing.T) {
	hub := xdp.NewHub(xdp.MemConfig{})
	l := hub.Attach()
	defer l.Close()
	for _, c := range []struct {
		arg string
		cfg Config
	}{
		{"GiveUp", Config{GiveUp: -1}},
		{"ConnectRetry", Config{ConnectRetry: -1}},
		{"AckDelay", Config{AckDelay: -1}},
		{"KeepaliveInterval", Config{KeepaliveInterval: -1}},
		{"MinRTO", Config{MinRTO: time.Second, MaxRTO: time.Millisecond}},
		{"MaxRTO", Config{MaxRTO: time.Millisecond}}, // below MinRTO's default
	} {
		c.cfg.Link = l
		e, err := Open(c.cfg)
		var ae *ArgError
		if !errors.As(err, &ae) || ae.Arg != c.arg {
			t.Errorf("Open with a bad %s: %v", c.arg, err)
		}
		if err == nil {
			e.Close()
		}
	}
	openT(t, Config{Link: l, EndpointID: 1, BusyPoll: true})
	for _, c := range []struct {
		arg string
		cfg Config
	}{
		{"BusyPoll", Config{}},
		{"SpinBeforeSleep", Config{BusyPoll: true, SpinBeforeSleep: NoSpin}},
		{"EtherType", Config{BusyPoll: true, EtherType: 0x88b6}},
	} {
		c.cfg.Link, c.cfg.EndpointID = l, 2
		e, err := Open(c.cfg)
		var ae *ArgError
		if !errors.As(err, &ae) || ae.Arg != c.arg {
			t.Errorf("second endpoint with another %s: %v", c.arg, err)
		}
		if err == nil {
			e.Close()
		}
	}
}

// TestIbufferedForeignHandle: Ibuffered, like Test and Wait, refuses
// another endpoint's handle (it read it under the wrong engine's lock).
func TestIbufferedForeignHandle(t *testing.T) {
	a, b, _, _ := connectedPair(t, Config{}, Config{})
	r, err := b.Irecv(1, ^uint64(0), [][]byte{make([]byte, 10)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Cancel(r)
	if _, err := a.Ibuffered(r); !errors.Is(err, ErrForeignRequest) {
		t.Errorf("Ibuffered of another endpoint's handle: %v, want ErrForeignRequest", err)
	}
}

// TestCrossConnectAfterRestart: a peer restarts, and both sides connect
// to each other at once, the connects crossing on the wire. The side that
// kept its record resets it when the new peer's connect comes, after its
// own connect said its old sequence number; a reply to that connect used
// to take it back there, while the new peer had taken the new one.
func TestCrossConnectAfterRestart(t *testing.T) {
	for _, delay := range []time.Duration{0, 100 * time.Microsecond} {
		t.Run(delay.String(), func(t *testing.T) {
			for range 10 {
				a, b, la, lb := connectedPair(t, Config{}, Config{})
				if err := sendAndWait(t, a, b, 1, 2*time.Second); err != nil {
					t.Fatal(err)
				}
				b2 := restart(t, b, lb)
				la.Hub().SetConfig(xdp.MemConfig{Delay: delay})
				connectBoth(t, a, b2)
				for i, dir := range [][2]*Endpoint{{a, b2}, {b2, a}} {
					if err := sendAndWait(t, dir[0], dir[1], uint64(2+i), time.Second); err != nil {
						t.Fatalf("%v to %v: %v\n%s\n%s", dir[0].Addr(), dir[1].Addr(), err,
							dir[0].DebugPeer(dir[1].Addr()), dir[1].DebugPeer(dir[0].Addr()))
					}
				}
			}
		})
	}
}

// TestLateConnectAfterRestart: a connect sent while the peer was down
// reaches the peer's new self after that one connected to us and offered
// a message: it must neither abort the offer nor desynchronise either
// direction.
func TestLateConnectAfterRestart(t *testing.T) {
	a, b, _, lb := connectedPair(t, Config{ConnectRetry: 200 * time.Millisecond}, Config{})
	if err := sendAndWait(t, a, b, 1, 2*time.Second); err != nil {
		t.Fatal(err)
	}
	bAddr := b.Addr()
	b.Close()
	lb.Partition(true) // b's host is down: a's first connect is lost
	ra, err := a.IConnect(bAddr, 0xb, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	b2 := openT(t, Config{Link: lb, EndpointID: bAddr.EP, Key: 0xb})
	lb.Partition(false)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	if err := b2.Connect(ctx, a.Addr(), 0xa); err != nil {
		t.Fatal(err)
	}
	big := make([]byte, 1<<20) // a rendezvous a takes later
	s, err := b2.Isend(a.Addr(), 42, [][]byte{big}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Wait(ctx, ra); err != nil { // a's connect, sent again, reaches b2 now
		t.Fatalf("a's connect: %v", err)
	}
	r, err := a.Irecv(42, ^uint64(0), [][]byte{make([]byte, 1<<20)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b2.Wait(ctx, s); err != nil {
		t.Errorf("the new peer's send, offered after it connected: %v", err)
	}
	a.Cancel(r)
	for i, dir := range [][2]*Endpoint{{a, b2}, {b2, a}} {
		if err := sendAndWait(t, dir[0], dir[1], uint64(100+i), time.Second); err != nil {
			t.Errorf("%v to %v afterwards: %v\n%s", dir[0].Addr(), dir[1].Addr(), err, dir[0].DebugPeer(dir[1].Addr()))
		}
	}
}

// openT opens an endpoint with cfg, closed when the test ends.
func openT(t *testing.T, cfg Config) *Endpoint {
	t.Helper()
	e, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

// connectBoth connects a (key 0xa) and b (key 0xb) to each other at once,
// the two connects crossing, and waits for both.
func connectBoth(t *testing.T, a, b *Endpoint) {
	t.Helper()
	ra, err := a.IConnect(b.Addr(), 0xb, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	rb, err := b.IConnect(a.Addr(), 0xa, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if _, err := a.Wait(ctx, ra); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Wait(ctx, rb); err != nil {
		t.Fatal(err)
	}
}

// TestConnectCopyAfterDisconnect: b takes a's connect, but its reply is
// lost, and b then disconnects a (that frame is lost too). The copy of the
// connect a sends again must not connect b once more: a's Connect fails
// with ErrAborted and b stays disconnected.
func TestConnectCopyAfterDisconnect(t *testing.T) {
	hub := xdp.NewHub(xdp.MemConfig{})
	la, lb := hub.Attach(), hub.Attach()
	defer la.Close()
	defer lb.Close()
	a := openT(t, Config{Link: la, EndpointID: 1, Key: 1, ConnectRetry: 20 * time.Millisecond})
	b := openT(t, Config{Link: lb, EndpointID: 2, Key: 2})
	// The connect is on its way (queued at b) when a is cut off: b's
	// answers are lost.
	hub.SetConfig(xdp.MemConfig{Delay: 20 * time.Millisecond})
	r, err := a.IConnect(b.Addr(), 2, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	la.Partition(true)
	bConnected := func() bool {
		b.eng.mu.Lock()
		defer b.eng.mu.Unlock()
		p := b.peers[a.Addr()]
		return p != nil && p.connected
	}
	for deadline := time.Now().Add(2 * time.Second); !bConnected(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("b never took a's connect")
		}
	}
	// b marks the peer connected before its answer leaves; wait until the
	// answer is on the wire (and lost), or it may leave after the partition
	// ends and connect a legitimately.
	for deadline := time.Now().Add(2 * time.Second); lb.Stats().InjectedLoss == 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("b's answer to a's connect never left")
		}
	}
	b.Disconnect(a.Addr())
	hub.SetConfig(xdp.MemConfig{})
	la.Partition(false)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if st, err := a.Wait(ctx, r); st.Code != Aborted || !errors.Is(err, ErrAborted) {
		t.Errorf("a's connect after b disconnected: %v (%v), want Aborted", st.Code, err)
	}
	if bConnected() {
		t.Error("a copy of a connect b took before it disconnected connected b again")
	}
	// A new connect works.
	if err := a.Connect(ctx, b.Addr(), 2); err != nil {
		t.Fatal(err)
	}
	if err := sendAndWait(t, b, a, 7, time.Second); err != nil {
		t.Errorf("b to a after a new connect: %v", err)
	}
}

// checkDelivered sends one 10-byte message from one endpoint to another
// and fails the test, showing both records, when it does not arrive (a
// connection whose two sides number differently acks it unseen).
func checkDelivered(t *testing.T, from, to *Endpoint, match uint64) {
	t.Helper()
	if err := sendAndWait(t, from, to, match, 2*time.Second); err != nil {
		t.Errorf("%v to %v: %v\n%v: %s%v: %s", from.Addr(), to.Addr(), err,
			from.Addr(), from.DebugPeer(to.Addr()), to.Addr(), to.DebugPeer(from.Addr()))
	}
}

// TestLateConnectOfOldSelf: a connect b sent just before it restarted
// reaches a after b's new self connected and a began a rendezvous with
// it. a must not leave the live new self for the dead old one: it asks
// the new self whether it lives (a challenge, answered with an ack), and
// the rendezvous completes once b2 takes it. (a once left the new self,
// failing the send with BadSession, and before that kept its id through
// the change, so that the new self took a's next connect as a copy and a's
// next message was acked as a duplicate and never delivered.)
func TestLateConnectOfOldSelf(t *testing.T) {
	a, b, la, lb := connectedPair(t, Config{GiveUp: time.Second}, Config{GiveUp: time.Second})
	if err := sendAndWait(t, a, b, 1, 2*time.Second); err != nil {
		t.Fatal(err)
	}
	hub := la.Hub()
	hub.SetConfig(xdp.MemConfig{Delay: 150 * time.Millisecond})
	if _, err := b.IConnect(a.Addr(), 0xa, 0, nil); err != nil { // on the wire for 150 ms
		t.Fatal(err)
	}
	b2 := restart(t, b, lb)
	hub.SetConfig(xdp.MemConfig{})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	if err := b2.Connect(ctx, a.Addr(), 0xa); err != nil {
		t.Fatal(err)
	}
	// A rendezvous b2 takes only after the old self's connect arrived.
	big := make([]byte, 1<<20)
	for i := range big {
		big[i] = byte(i * 7)
	}
	s, err := a.Isend(b2.Addr(), 42, [][]byte{big}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for a.Counters().Challenges == 0 {
		if ctx.Err() != nil {
			t.Fatalf("the old self's connect never reached a: no challenge\n%s", a.DebugPeer(b2.Addr()))
		}
		time.Sleep(time.Millisecond)
	}
	time.Sleep(20 * time.Millisecond) // the challenge's answer
	if st, ok, _ := a.Test(s); ok {
		t.Fatalf("a's rendezvous to the live new self ended with %v when the old self's connect came", st.Code)
	}
	got := make([]byte, len(big))
	r, err := b2.Irecv(42, ^uint64(0), [][]byte{got}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if st, err := b2.Wait(ctx, r); err != nil || !bytes.Equal(got, big) {
		t.Fatalf("b2's receive: %v %v (data equal %v)", st.Code, err, bytes.Equal(got, big))
	}
	if st, err := a.Wait(ctx, s); err != nil {
		t.Fatalf("a's send: %v %v", st.Code, err)
	}
	checkDelivered(t, a, b2, 7)
	checkDelivered(t, b2, a, 8)
}

// TestManyResetsThenConnect: a forgets b many times while cut off (b
// never hears of it), then connects. With an 8-bit generation, 128 resets
// made a's new id look older than the one b knew (the connect was
// dropped), and 256 brought back the very id b knew (taken as a copy, b's
// sequence numbers kept: a's message acked and lost).
func TestManyResetsThenConnect(t *testing.T) {
	for _, n := range []int{128, 256} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			a, b, la, _ := connectedPair(t, Config{GiveUp: 300 * time.Millisecond}, Config{GiveUp: 300 * time.Millisecond})
			if err := sendAndWait(t, a, b, 1, 2*time.Second); err != nil {
				t.Fatal(err)
			}
			la.Partition(true)
			for range n {
				a.Disconnect(b.Addr())
			}
			la.Partition(false)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			if err := a.Connect(ctx, b.Addr(), 0xb); err != nil {
				t.Fatalf("connect after %d resets: %v", n, err)
			}
			checkDelivered(t, a, b, 7)
			checkDelivered(t, b, a, 8)
		})
	}
}

// TestReopenWhileStopping: an endpoint opened on a link whose last
// endpoint is still closing waits until the old engine has stopped, so
// that no frame meant for it is taken by the old engine's driver (or, on
// an interface, no bind meets the old socket's queue), and then works.
func TestReopenWhileStopping(t *testing.T) {
	hub := xdp.NewHub(xdp.MemConfig{})
	la, lb := hub.Attach(), hub.Attach()
	defer la.Close()
	defer lb.Close()
	b := openT(t, Config{Link: lb, EndpointID: 2, Key: 2})
	cfg := Config{Link: la, EndpointID: 1, Key: 1}
	old, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	oldEng := old.eng
	stopping, release := make(chan struct{}), make(chan struct{})
	testHookEngineStop = func(g *engine) {
		if g == oldEng {
			close(stopping)
			<-release
		}
	}
	defer func() { testHookEngineStop = nil }()
	closed := make(chan error, 1)
	go func() { closed <- old.Close() }()
	<-stopping
	type opened struct {
		e   *Endpoint
		err error
	}
	reopened := make(chan opened, 1)
	go func() {
		e, err := Open(cfg)
		reopened <- opened{e, err}
	}()
	select {
	case o := <-reopened:
		if o.e != nil {
			o.e.Close()
		}
		close(release)
		t.Fatalf("Open returned (%v) while the old engine of its link was still running", o.err)
	case <-time.After(50 * time.Millisecond):
	}
	close(release)
	var o opened
	select {
	case o = <-reopened:
	case <-time.After(5 * time.Second):
		t.Fatal("Open still waits 5 s after the old engine stopped")
	}
	if o.err != nil {
		t.Fatal(o.err)
	}
	e := o.e
	defer e.Close()
	if err := <-closed; err != nil {
		t.Errorf("closing the old endpoint: %v", err)
	}
	if e.eng == oldEng {
		t.Fatal("the new endpoint shares the stopped engine")
	}
	select {
	case <-oldEng.bgDone:
	default:
		t.Error("the old engine's background goroutine still runs")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := e.Connect(ctx, b.Addr(), 2); err != nil {
		t.Fatal(err)
	}
	if err := sendAndWait(t, e, b, 9, 2*time.Second); err != nil {
		t.Errorf("a message from the reopened endpoint: %v", err)
	}
}

// TestLateOlderConnectAfterDisconnect: a connect from an older id of the
// peer's self (here delayed while the peer disconnected and connected
// again from its next id) arriving after this side disconnected must not
// connect it again: ids only move forward and a new id sends its pending
// connects as new ones, so it is a stale copy. The record's knowledge of
// the newer id used to count only while connected, and the copy paired b
// with an id a had left.
func TestLateOlderConnectAfterDisconnect(t *testing.T) {
	n := newManNet(t, time.Hour)
	a, b := n.a, n.b
	ra, err := a.IConnect(b.Addr(), 0xb, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	late := n.la.take() // the connect from a's first id, held in the network
	if len(late) != 1 {
		t.Fatalf("%d frames for one connect", len(late))
	}
	a.Disconnect(b.Addr()) // a moves on to its next id
	mustComplete(t, a, ra, Aborted, "a's connect pending at its Disconnect")
	ra, err = a.IConnect(b.Addr(), 0xb, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	n.lockstep()
	mustComplete(t, a, ra, Success, "a's connect from its next id")
	b.Disconnect(a.Addr())
	n.lockstep()
	staleBefore := b.Counters().StaleFrames
	n.deliver(b, late[0])
	n.lockstep()
	if _, gen, conn := n.ids(b, a); conn {
		al, _, _ := n.ids(a, b)
		t.Errorf("a late connect from a's id of generation %d (a is at %d) connected b again after its Disconnect", gen, al)
	}
	if b.Counters().StaleFrames == staleBefore {
		t.Error("the late connect was not counted stale")
	}
	if _, err := b.Isend(a.Addr(), 1, [][]byte{[]byte("x")}, nil); !errors.Is(err, ErrNotConnected) {
		t.Errorf("b's send after its Disconnect: %v, want ErrNotConnected", err)
	}
}
