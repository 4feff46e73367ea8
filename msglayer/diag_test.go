package msglayer_test

import (
	"testing"

	"github.com/xmx-stack/xmx/internal/netlab"
	"github.com/xmx-stack/xmx/msglayer"
)

func TestDiagBlocking(t *testing.T) {
	lab := netlab.New(t, netlab.Options{Hosts: 2})
	w := labWorld2(t, lab)
	a, c := w.pair(t, msglayer.Config{}, msglayer.Config{})
	pingPong(t, a, c, 8, 1000, nil)
	la0, lc0 := a.LinkStats(), c.LinkStats()
	ca0, cc0 := a.Counters(), c.Counters()
	const n = 5000
	pingPong(t, a, c, 8, n, nil)
	la, lc := a.LinkStats(), c.LinkStats()
	ca, cc := a.Counters(), c.Counters()
	t.Logf("client per message: wakeups %.2f rx %.2f tx %.2f acks out %.2f", float64(la.Wakeups-la0.Wakeups)/n, float64(la.RxFrames-la0.RxFrames)/n, float64(la.TxFrames-la0.TxFrames)/n, float64(ca.AcksOut-ca0.AcksOut)/n)
	t.Logf("server per message: wakeups %.2f rx %.2f tx %.2f acks out %.2f", float64(lc.Wakeups-lc0.Wakeups)/n, float64(lc.RxFrames-lc0.RxFrames)/n, float64(lc.TxFrames-lc0.TxFrames)/n, float64(cc.AcksOut-cc0.AcksOut)/n)
}
