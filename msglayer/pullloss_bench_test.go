package msglayer_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/xmx-stack/xmx/msglayer"
	"github.com/xmx-stack/xmx/xdp"
)

// BenchmarkPullLossMem times 1 MiB rendezvous messages pulled over the
// in-memory link with frames lost at random (reordering 5 %, duplication
// 1 %), or delayed by a jitter that reorders many (a 50 µs delay plus up
// to 200 µs), with one pull block in flight and with the default 16. The
// floor is the same messages, same pair, with nothing lost or delayed,
// measured first in the same run; the ratio is how much the faults cost.
// Late replies are frames that came twice: asked for again needlessly.
func BenchmarkPullLossMem(b *testing.B) {
	faults := []struct {
		name string
		mc   xdp.MemConfig
	}{
		{"loss=5%", xdp.MemConfig{Loss: 0.05, Reorder: 0.05, Duplicate: 0.01}},
		{"loss=20%", xdp.MemConfig{Loss: 0.2, Reorder: 0.05, Duplicate: 0.01}},
		{"jitter=200µs", xdp.MemConfig{Delay: 50 * time.Microsecond, Jitter: 200 * time.Microsecond}},
		{"jitter=200µs+loss=5%", xdp.MemConfig{Loss: 0.05, Delay: 50 * time.Microsecond, Jitter: 200 * time.Microsecond}},
	}
	for _, blocks := range []int{1, 16} {
		for _, f := range faults {
			b.Run(fmt.Sprintf("blocks=%d/%s", blocks, f.name), func(b *testing.B) {
				benchPullLoss(b, blocks, f.mc)
			})
		}
	}
}

func benchPullLoss(b *testing.B, blocks int, faults xdp.MemConfig) {
	const size = 1 << 20
	hub := xdp.NewHub(xdp.MemConfig{Seed: 1})
	la, lb := hub.Attach(), hub.Attach()
	b.Cleanup(func() { la.Close(); lb.Close() })
	cfg := msglayer.Config{PullBlocks: blocks, GiveUp: time.Minute}
	ca, cb := cfg, cfg
	ca.Link, ca.EndpointID, ca.Key = la, 1, 1
	cb.Link, cb.EndpointID, cb.Key = lb, 2, 2
	x, y := openEP(b, ca), openEP(b, cb)
	ctx := ctxFor(b, 10*time.Minute)
	if err := x.Connect(ctx, y.Addr(), 2); err != nil {
		b.Fatal(err)
	}
	msg, got := [][]byte{message(1, size)}, [][]byte{make([]byte, size)}
	one := func() time.Duration {
		start := time.Now()
		r, err := y.Irecv(1, ^uint64(0), got, nil)
		if err != nil {
			b.Fatal(err)
		}
		s, err := x.Isend(y.Addr(), 1, msg, nil)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := y.Wait(ctx, r); err != nil {
			b.Fatalf("receive: %v", err)
		}
		took := time.Since(start)
		if _, err := x.Wait(ctx, s); err != nil {
			b.Fatalf("send: %v", err)
		}
		return took
	}
	const floorRuns = 20
	var floor time.Duration
	for range floorRuns {
		floor += one()
	}
	floor /= floorRuns
	hub.SetConfig(faults)
	before := y.Counters()
	b.ResetTimer()
	var lossy time.Duration
	for range b.N {
		lossy += one()
	}
	b.StopTimer()
	checkMessage(b, got[0], 1, size)
	after := y.Counters()
	n := float64(b.N)
	b.ReportMetric(float64(floor.Microseconds())/1000, "lossless-ms/msg")
	b.ReportMetric(float64(lossy.Microseconds())/1000/n, "ms/msg")
	b.ReportMetric(float64(lossy)/n/float64(floor), "×lossless")
	b.ReportMetric(float64(after.PullProbes-before.PullProbes)/n, "probes/msg")
	b.ReportMetric(float64(after.PullReRequests-before.PullReRequests)/n, "re-requests/msg")
	b.ReportMetric(float64(after.PullRepliesLate-before.PullRepliesLate)/n, "late-replies/msg")
}
