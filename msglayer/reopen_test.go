package msglayer_test

import (
	"testing"
	"time"

	"github.com/xmx-stack/xmx/msglayer"
)

// TestReopenAFXDP: on a lab interface, a process closes its only endpoint
// while it opens another on the same interface (from another goroutine),
// five times over. Whichever comes first, the new endpoint opens (it
// shares the engine still running, or waits until the old one has
// stopped and its socket is gone, instead of meeting the queue busy), and
// then exchanges messages with the other host both ways.
func TestReopenAFXDP(t *testing.T) {
	w := labWorld(t, "afxdp")
	b := w.open(t, 1, msglayer.Config{EndpointID: 2, Key: 0xb})
	a := w.open(t, 0, msglayer.Config{EndpointID: 1, Key: 0xa})
	data, buf := message(1, 100), make([]byte, 100)
	for i := range 5 {
		closed := make(chan error, 1)
		go func(old *msglayer.Endpoint) { closed <- old.Close() }(a)
		// Another id: the new endpoint may share the engine while the old
		// one is still registered there.
		id := uint8(1 + 2*((i+1)%2))
		start := time.Now()
		a = w.open(t, 0, msglayer.Config{EndpointID: id, Key: 0xa})
		if err := <-closed; err != nil {
			t.Errorf("round %d: closing the old endpoint: %v", i, err)
		}
		ctx := ctxFor(t, 10*time.Second)
		if err := a.Connect(ctx, b.Addr(), 0xb); err != nil {
			t.Fatalf("round %d: connect from the new endpoint: %v", i, err)
		}
		if err := b.Connect(ctx, a.Addr(), 0xa); err != nil {
			t.Fatalf("round %d: connect to the new endpoint: %v", i, err)
		}
		transfer(t, ctx, a, b, uint64(i), data, buf)
		checkMessage(t, buf, 1, 100)
		transfer(t, ctx, b, a, uint64(i), data, buf)
		checkMessage(t, buf, 1, 100)
		t.Logf("round %d: open, connect and two messages in %v", i, time.Since(start))
	}
}
