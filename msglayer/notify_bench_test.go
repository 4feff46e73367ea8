package msglayer_test

import (
	"context"
	"testing"

	"github.com/xmx-stack/xmx/msglayer"
	"github.com/xmx-stack/xmx/xdp"
)

// BenchmarkNotify measures what it costs to learn that a request completed,
// per message, with the three strategies of the seeds (§3.4) and the
// baseline they argue against: a dispatcher goroutine that waits on any
// completion and hands each to its consumer through a channel (the extra
// thread hop). The 8-byte messages have all arrived (unexpected) before
// the timer starts; the receiver keeps `depth` receives posted and
// completes them one by one.
func BenchmarkNotify(b *testing.B) {
	const depth = 32
	strategies := []struct {
		name string
		run  func(b *testing.B, e *msglayer.Endpoint, n int)
	}{
		{"wait-one", func(b *testing.B, e *msglayer.Endpoint, n int) {
			ctx := context.Background()
			var ring [depth]msglayer.Request
			buf := [][]byte{make([]byte, 8)}
			for i := range ring {
				ring[i], _ = e.Irecv(0, 0, buf, nil)
			}
			for i := 0; i < n; i++ {
				if _, err := e.Wait(ctx, ring[i%depth]); err != nil {
					b.Fatal(err)
				}
				ring[i%depth], _ = e.Irecv(0, 0, buf, nil)
			}
			drain(e, ring[:])
		}},
		{"wait-any", func(b *testing.B, e *msglayer.Endpoint, n int) {
			ctx := context.Background()
			buf := [][]byte{make([]byte, 8)}
			for i := 0; i < depth; i++ {
				e.Irecv(0, 0, buf, nil)
			}
			for i := 0; i < n; i++ {
				if _, err := e.WaitAny(ctx, 0, 0); err != nil {
					b.Fatal(err)
				}
				e.Irecv(0, 0, buf, nil)
			}
		}},
		{"group", func(b *testing.B, e *msglayer.Endpoint, n int) {
			ctx := context.Background()
			g := e.NewGroup()
			buf := [][]byte{make([]byte, 8)}
			for i := 0; i < depth; i++ {
				g.Irecv(0, 0, buf, nil)
			}
			for i := 0; i < n; i++ {
				if _, err := g.Wait(ctx); err != nil {
					b.Fatal(err)
				}
				g.Irecv(0, 0, buf, nil)
			}
		}},
		{"dispatcher-goroutine", func(b *testing.B, e *msglayer.Endpoint, n int) {
			ctx := context.Background()
			buf := [][]byte{make([]byte, 8)}
			for i := 0; i < depth; i++ {
				e.Irecv(0, 0, buf, nil)
			}
			ch := make(chan msglayer.Status, depth)
			go func() {
				for i := 0; i < n; i++ {
					st, err := e.WaitAny(ctx, 0, 0)
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
				e.Irecv(0, 0, buf, nil)
			}
		}},
	}
	for _, s := range strategies {
		b.Run(s.name, func(b *testing.B) {
			w := memWorld(b, xdp.MemConfig{QueueLen: 1 << 16})
			tx, rx := w.pair(b, msglayer.Config{}, msglayer.Config{UnexpectedBytes: 1 << 30})
			// The messages arrive first: the timed part is only posting
			// receives and learning of their completion.
			ctx := context.Background()
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
			s.run(b, rx, b.N)
			b.StopTimer()
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/1e3, "µs/msg")
		})
	}
}

// drain cancels posted receives.
func drain(e *msglayer.Endpoint, reqs []msglayer.Request) {
	for _, r := range reqs {
		e.Cancel(r)
	}
}
