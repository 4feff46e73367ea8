package msglayer

import (
	"encoding/binary"
	"testing"
	"time"
)

// TestImpossibleNotify: a notify that says the receiver took more than
// the send had, or that ends the send with a code there is none of, is
// counted as a bad frame and fails the send (Aborted, nothing taken);
// the send no longer completes with what the frame claimed.
func TestImpossibleNotify(t *testing.T) {
	for _, c := range []struct {
		name  string
		spoil func(th []byte) // the notify's type header
	}{
		{"length", func(th []byte) { binary.BigEndian.PutUint32(th[4:], 1<<30) }},
		{"code", func(th []byte) { th[8] = 200 }},
	} {
		t.Run(c.name, func(t *testing.T) {
			n := newManNet(t, time.Hour)
			a, b := n.a, n.b
			ra, _ := a.IConnect(b.Addr(), 0xb, nil)
			rb, _ := b.IConnect(a.Addr(), 0xa, nil)
			n.lockstep()
			mustComplete(t, a, ra, Success, "a's connect")
			mustComplete(t, b, rb, Success, "b's connect")
			spoiled := 0
			n.trace = func(to *Endpoint, f []byte) {
				var h header
				if to == a && h.decode(f) == nil && h.typ == tNotify {
					c.spoil(f[hdrLen:])
					spoiled++
				}
			}
			r, _ := b.Irecv(7, ^uint64(0), [][]byte{make([]byte, 40000)}, nil)
			s, err := a.Isend(b.Addr(), 7, [][]byte{make([]byte, 40000)}, nil)
			if err != nil {
				t.Fatal(err)
			}
			before := a.Counters().BadFrames
			n.settle(5, time.Millisecond)
			mustComplete(t, b, r, Success, "the receive")
			if spoiled == 0 {
				t.Fatal("no notify went to a")
			}
			st, ok, _ := a.Test(s)
			if !ok || st.Code != Aborted || st.XferLen != 0 {
				t.Fatalf("the send: done %v, %v, %d bytes taken; want Aborted, 0", ok, st.Code, st.XferLen)
			}
			if got := a.Counters().BadFrames - before; got != uint64(spoiled) {
				t.Fatalf("%d bad frames counted, want %d", got, spoiled)
			}
		})
	}
}
