package msglayer_test

import (
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/xmx-stack/xmx/msglayer"
	"github.com/xmx-stack/xmx/xdp"
)

// cutAtLink is an in-memory link that stops hearing its peer at the first
// data frame (pull reply or eager fragment) at or past offset cutAt:
// that frame and every one after it are dropped, so the peer is found
// dead with the message half delivered.
type cutAtLink struct {
	*xdp.MemLink
	cutAt  uint32
	cut    atomic.Bool
	cutOff atomic.Uint32 // offset of the frame it was cut at
}

type cutAtVisitor struct {
	l *cutAtLink
	v xdp.Visitor
}

func (c cutAtVisitor) Visit(f []byte) {
	if !c.l.cut.Load() {
		off, ok := msglayer.PullReplyFrame(f)
		if !ok {
			_, _, off, _, _, ok = msglayer.EagerFrame(f)
		}
		if !ok || off < c.l.cutAt {
			c.v.Visit(f)
			return
		}
		c.l.cutOff.Store(off)
		c.l.cut.Store(true)
	}
}

func (l *cutAtLink) RecvVisit(max int, timeout time.Duration, v xdp.Visitor) (int, error) {
	return l.MemLink.RecvVisit(max, timeout, cutAtVisitor{l, v})
}

// cutPair returns endpoints a and b (config cfg) connected over an
// in-memory hub, b hearing a through a cutAtLink cut at offset cutAt.
func cutPair(t *testing.T, cfg msglayer.Config, cutAt uint32) (a, b *msglayer.Endpoint, rx *cutAtLink) {
	t.Helper()
	hub := xdp.NewHub(xdp.MemConfig{})
	la, lb := hub.Attach(), hub.Attach()
	t.Cleanup(func() { la.Close(); lb.Close() })
	rx = &cutAtLink{MemLink: lb, cutAt: cutAt}
	ca, cb := cfg, cfg
	ca.Link, ca.EndpointID, ca.Key = la, 1, 1
	cb.Link, cb.EndpointID, cb.Key = rx, 2, 2
	a, b = openEP(t, ca), openEP(t, cb)
	if err := a.Connect(ctxFor(t, 10*time.Second), b.Addr(), 2); err != nil {
		t.Fatalf("connect over the cut link: %v", err)
	}
	return a, b, rx
}

// TestFailedReceiveXferLen: a receive whose sender dies while the data
// comes reports, with ErrUnreachable, the prefix of the message that
// arrived, and its buffer holds those bytes; for a rendezvous message
// (pulled in blocks: up to the block in flight) and a medium eager one
// (its fragments come in order: all of them before the cut). Before, both
// reported 0.
func TestFailedReceiveXferLen(t *testing.T) {
	cases := []struct {
		name      string
		size      int
		cutAt     uint32
		exact     bool // the prefix ends at the frame cut
		threshold int
	}{
		{"rendezvous", 4 << 20, 1 << 20, false, 0},
		{"medium eager", 30000, 12000, true, 32 << 10},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := msglayer.Config{GiveUp: 300 * time.Millisecond, KeepaliveInterval: 50 * time.Millisecond, RendezvousThreshold: tc.threshold}
			a, b, rx := cutPair(t, cfg, tc.cutAt)
			ctx := ctxFor(t, 10*time.Second)
			buf := make([]byte, tc.size)
			r, err := b.Irecv(1, ^uint64(0), [][]byte{buf}, nil)
			if err != nil {
				t.Fatal(err)
			}
			s, err := a.Isend(b.Addr(), 1, [][]byte{message(1, tc.size)}, nil)
			if err != nil {
				t.Fatal(err)
			}
			st, err := b.Wait(ctx, r)
			if !errors.Is(err, msglayer.ErrUnreachable) {
				t.Fatalf("receive cut at %d: %+v, %v; want ErrUnreachable", tc.cutAt, st, err)
			}
			a.Cancel(s)
			off := int(rx.cutOff.Load())
			if st.XferLen <= 0 || st.XferLen > off || (tc.exact && st.XferLen != off) {
				t.Fatalf("receive cut at byte %d of %d: XferLen %d", off, tc.size, st.XferLen)
			}
			want := message(1, tc.size)[:st.XferLen]
			if string(buf[:st.XferLen]) != string(want) {
				t.Fatalf("the %d bytes XferLen reports differ from the message's", st.XferLen)
			}
			t.Logf("cut at %d of %d bytes: XferLen %d", off, tc.size, st.XferLen)
		})
	}
}

// TestProbeSeesMessageStillArriving: Probe reports an eager message from
// its first fragment on (XferLen 0: nothing received), and a receive
// posted on that report takes it; when the sender is given up before the
// message is whole, that receive completes with ErrUnreachable, holding
// the prefix that came, and the message is no longer probed.
func TestProbeSeesMessageStillArriving(t *testing.T) {
	cfg := msglayer.Config{GiveUp: 300 * time.Millisecond, KeepaliveInterval: 50 * time.Millisecond}
	a, b, rx := cutPair(t, cfg, 1) // only the first fragment comes
	ctx := ctxFor(t, 10*time.Second)
	const size = 20000
	if _, err := a.Isend(b.Addr(), 7, [][]byte{message(1, size)}, nil); err != nil {
		t.Fatal(err)
	}
	st, err := b.Probe(ctx, 0, 0)
	if err != nil || st.Match != 7 || st.MsgLen != size || st.XferLen != 0 || st.Code != msglayer.Success {
		t.Fatalf("Probe: %+v, %v; want match 7, MsgLen %d, XferLen 0", st, err, size)
	}
	buf := make([]byte, size)
	r, err := b.Irecv(7, ^uint64(0), [][]byte{buf}, nil)
	if err != nil {
		t.Fatal(err)
	}
	st, err = b.Wait(ctx, r)
	if !errors.Is(err, msglayer.ErrUnreachable) {
		t.Fatalf("receive of a message cut at byte %d: %+v, %v; want ErrUnreachable", rx.cutOff.Load(), st, err)
	}
	if off := int(rx.cutOff.Load()); st.XferLen != off || string(buf[:off]) != string(message(1, size)[:off]) {
		t.Fatalf("receive cut at byte %d: XferLen %d, or its bytes differ from the message's", off, st.XferLen)
	}
	if st, ok := b.Iprobe(0, 0); ok {
		t.Fatalf("Iprobe after the give-up still reports %+v", st)
	}
}
