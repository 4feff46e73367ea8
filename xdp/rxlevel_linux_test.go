package xdp_test

import (
	"testing"
	"time"

	"github.com/xmx-stack/xmx/internal/netlab"
	"github.com/xmx-stack/xmx/xdp"
)

// TestAFXDPRxLevel: a link with a low receive level (xdp.QuietRxLevel)
// serves frames one at a time, counts what a burst larger than the level
// loses (nothing vanishes unaccounted), and after that burst holds one as
// large without a loss: the level went up to every receive frame.
func TestAFXDPRxLevel(t *testing.T) {
	lab := netlab.New(t, netlab.Options{Hosts: 2})
	h1, h2 := lab.Hosts[0], lab.Hosts[1]
	a := openAFXDP(t, h1, xdp.AFXDPConfig{})
	b := openAFXDP(t, h2, xdp.AFXDPConfig{RxLevel: xdp.QuietRxLevel})
	frame := func(i int) []byte { return jumboFrame(b.HardwareAddr(), a.HardwareAddr(), 200, byte(i)) }
	for i := range 3 * xdp.QuietRxLevel {
		f := frame(i)
		if _, err := a.Send([][]byte{f}); err != nil {
			t.Fatal(err)
		}
		recvExactly(t, b, [][]byte{f}, 2048)
	}
	const burst = 1024 // half the receive frames of a default link
	drain := func() (got int) {
		bufs, sizes := [][]byte{make([]byte, 2048)}, []int{0}
		for {
			n, err := b.Recv(bufs, sizes, 100*time.Millisecond)
			if err != nil {
				t.Fatal(err)
			}
			if n == 0 {
				return got
			}
			got += n
		}
	}
	send := func() {
		for i := 0; i < burst; i += 32 { // the kernel's batch: nobody receives meanwhile
			fs := make([][]byte, 32)
			for j := range fs {
				fs[j] = frame(i + j)
			}
			if n, err := a.Send(fs); n != len(fs) || err != nil {
				t.Fatalf("send: %d, %v", n, err)
			}
		}
	}
	before := b.Stats()
	send()
	got := drain()
	after := b.Stats()
	if lost := after.Lost() - before.Lost(); uint64(got)+lost != burst {
		t.Fatalf("first burst: received %d, counted lost %d, of %d (stats %+v)", got, lost, burst, after)
	}
	t.Logf("first burst: received %d of %d", got, burst)
	send()
	if got := drain(); got != burst {
		t.Fatalf("second burst: received %d of %d (stats %+v)", got, burst, b.Stats())
	}
}
