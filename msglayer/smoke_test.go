package msglayer

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/xmx-stack/xmx/xdp"
)

func TestSmoke(t *testing.T) {
	la, lb := xdp.NewPair(xdp.MemConfig{})
	a, err := Open(Config{Link: la, OwnLink: true, EndpointID: 1, Key: 7})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := Open(Config{Link: lb, OwnLink: true, EndpointID: 2, Key: 7})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := a.Connect(ctx, b.Addr(), 7); err != nil {
		t.Fatal(err)
	}
	for _, size := range []int{0, 8, 1000, 5000, 40000, 1 << 20} {
		msg := bytes.Repeat([]byte{byte(size)}, size)
		rbuf := make([]byte, size)
		rr, err := b.Irecv(42, ^uint64(0), [][]byte{rbuf}, nil)
		if err != nil {
			t.Fatal(err)
		}
		sr, err := a.Isend(b.Addr(), 42, [][]byte{msg}, nil)
		if err != nil {
			t.Fatal(err)
		}
		st, err := b.Wait(ctx, rr)
		if err != nil {
			t.Fatalf("size %d: recv: %v", size, err)
		}
		if st.XferLen != size || !bytes.Equal(rbuf, msg) || st.Source != a.Addr() {
			t.Fatalf("size %d: status %+v", size, st)
		}
		if _, err := a.Wait(ctx, sr); err != nil {
			t.Fatalf("size %d: send: %v", size, err)
		}
	}
	t.Logf("a: %+v", a.Counters())
	t.Logf("b: %+v", b.Counters())
}
