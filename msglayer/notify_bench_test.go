package msglayer_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/xmx-stack/xmx/internal/netlab"
	"github.com/xmx-stack/xmx/msglayer"
	"github.com/xmx-stack/xmx/xdp"
)

// notifyDepth is how many receives the strategies of BenchmarkNotify keep
// posted.
const notifyDepth = 32

// notifyStrategies are the ways to learn that a receive completed that
// BenchmarkNotify compares: the three strategies of the seeds (§3.4) and
// the baseline they argue against, a dispatcher goroutine that waits on
// any completion and hands each to its consumer through a channel (the
// extra thread hop). Each keeps notifyDepth receives for match info m
// posted on e and completes n of them one by one (the receives left
// posted at the end take no later run's messages: it uses another m).
// ctx bounds the waits, so that a sender that fails ends them.
var notifyStrategies = []struct {
	name string
	run  func(ctx context.Context, b *testing.B, e *msglayer.Endpoint, n int, m uint64)
}{
	{"wait-one", func(ctx context.Context, b *testing.B, e *msglayer.Endpoint, n int, m uint64) {
		var ring [notifyDepth]msglayer.Request
		buf := [][]byte{make([]byte, 8)}
		for i := range ring {
			ring[i], _ = e.Irecv(m, ^uint64(0), buf, nil)
		}
		for i := 0; i < n; i++ {
			if _, err := e.Wait(ctx, ring[i%notifyDepth]); err != nil {
				b.Fatal(err)
			}
			ring[i%notifyDepth], _ = e.Irecv(m, ^uint64(0), buf, nil)
		}
		drain(e, ring[:])
	}},
	{"wait-any", func(ctx context.Context, b *testing.B, e *msglayer.Endpoint, n int, m uint64) {
		buf := [][]byte{make([]byte, 8)}
		for i := 0; i < notifyDepth; i++ {
			e.Irecv(m, ^uint64(0), buf, nil)
		}
		for i := 0; i < n; i++ {
			if _, err := e.WaitAny(ctx, m, ^uint64(0)); err != nil {
				b.Fatal(err)
			}
			e.Irecv(m, ^uint64(0), buf, nil)
		}
	}},
	{"group", func(ctx context.Context, b *testing.B, e *msglayer.Endpoint, n int, m uint64) {
		g := e.NewGroup()
		buf := [][]byte{make([]byte, 8)}
		for i := 0; i < notifyDepth; i++ {
			g.Irecv(m, ^uint64(0), buf, nil)
		}
		for i := 0; i < n; i++ {
			if _, err := g.Wait(ctx); err != nil {
				b.Fatal(err)
			}
			g.Irecv(m, ^uint64(0), buf, nil)
		}
	}},
	{"dispatcher-goroutine", func(ctx context.Context, b *testing.B, e *msglayer.Endpoint, n int, m uint64) {
		buf := [][]byte{make([]byte, 8)}
		for i := 0; i < notifyDepth; i++ {
			e.Irecv(m, ^uint64(0), buf, nil)
		}
		ch := make(chan msglayer.Status, notifyDepth)
		go func() {
			for i := 0; i < n; i++ {
				st, err := e.WaitAny(ctx, m, ^uint64(0))
				if err != nil {
					close(ch)
					return
				}
				ch <- st
			}
			close(ch)
		}()
		for i := 0; i < n; i++ {
			if _, ok := <-ch; !ok {
				b.Fatal("dispatcher stopped")
			}
			e.Irecv(m, ^uint64(0), buf, nil)
		}
	}},
}

// BenchmarkNotify measures what it costs to learn that a request completed,
// per message, with each of notifyStrategies. The 8-byte messages have
// all arrived (unexpected) before the timer starts: the timed part is
// only posting receives and learning of their completion, with no wait.
// BenchmarkNotifyFlow has them arrive during the waits.
func BenchmarkNotify(b *testing.B) {
	const depth = notifyDepth
	for _, s := range notifyStrategies {
		b.Run(s.name, func(b *testing.B) {
			w := memWorld(b, xdp.MemConfig{QueueLen: 1 << 16})
			tx, rx := w.pair(b, msglayer.Config{}, msglayer.Config{UnexpectedBytes: 1 << 30})
			// The messages arrive first: the timed part is only posting
			// receives and learning of their completion.
			ctx := ctxFor(b, 5*time.Minute)
			msg := [][]byte{make([]byte, 8)}
			grp := tx.NewGroup()
			n := b.N + depth
			for i := 0; i < n; i++ {
				if _, err := grp.Isend(rx.Addr(), 0, msg, nil); err != nil {
					b.Fatal(err)
				}
			}
			for i := 0; i < n; i++ {
				if _, err := grp.Wait(ctx); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportAllocs()
			b.ResetTimer()
			s.run(ctx, b, rx, b.N, 0)
			b.StopTimer()
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/1e3, "µs/msg")
		})
	}
}

// BenchmarkNotifyFlow is BenchmarkNotify with the messages arriving while
// the receiver waits: a sender goroutine keeps notifyDepth 8-byte sends in
// flight (a completion group), so that each strategy's waits sleep and
// wake as in a stream, and the dispatcher's hop is paid on the critical
// path. Over the in-memory link and, as root, over AF_XDP in a two-host
// veth lab (the default progress mode: adaptive poll, then sleep).
func BenchmarkNotifyFlow(b *testing.B) {
	b.Run("mem", func(b *testing.B) {
		notifyFlow(b, func(b *testing.B) world { return memWorld(b, xdp.MemConfig{QueueLen: 1 << 12}) })
	})
	b.Run("afxdp", func(b *testing.B) {
		lab := netlab.New(b, netlab.Options{Hosts: 2})
		notifyFlow(b, func(b *testing.B) world { return labWorld2(b, lab) })
	})
}

func notifyFlow(b *testing.B, mkWorld func(*testing.B) world) {
	for _, s := range notifyStrategies {
		b.Run(s.name, func(b *testing.B) {
			tx, rx := mkWorld(b).pair(b, msglayer.Config{}, msglayer.Config{})
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			sent := make(chan error, 1)
			// Unmeasured: a round through the strategy, to warm up.
			go func() { sent <- sendFlow(ctx, tx, rx.Addr(), notifyDepth, 1) }()
			s.run(ctx, b, rx, notifyDepth, 1)
			if err := <-sent; err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			b.ResetTimer()
			go func() { sent <- sendFlow(ctx, tx, rx.Addr(), b.N, 2) }()
			s.run(ctx, b, rx, b.N, 2)
			b.StopTimer()
			if err := <-sent; err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/1e3, "µs/msg")
		})
	}
}

// sendFlow sends n 8-byte messages with match info m from tx to dst,
// notifyDepth of them in flight at most.
func sendFlow(ctx context.Context, tx *msglayer.Endpoint, dst msglayer.Addr, n int, m uint64) error {
	grp := tx.NewGroup()
	msg := [][]byte{make([]byte, 8)}
	for i := range n {
		if i >= notifyDepth {
			if _, err := grp.Wait(ctx); err != nil {
				return fmt.Errorf("send %d: %w", i-notifyDepth, err)
			}
		}
		if _, err := grp.Isend(dst, m, msg, nil); err != nil {
			return fmt.Errorf("send %d: %w", i, err)
		}
	}
	for i := max(0, n-notifyDepth); i < n; i++ {
		if _, err := grp.Wait(ctx); err != nil {
			return fmt.Errorf("send %d: %w", i, err)
		}
	}
	return nil
}

// drain cancels posted receives.
func drain(e *msglayer.Endpoint, reqs []msglayer.Request) {
	for _, r := range reqs {
		e.Cancel(r)
	}
}
