package msglayer_test

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/xmx-stack/xmx/internal/linkbench"
	"github.com/xmx-stack/xmx/internal/netlab"
	"github.com/xmx-stack/xmx/msglayer"
	"github.com/xmx-stack/xmx/xdp"
)

// stream is the memory of a one-way stream of size-byte messages from a
// to b with window in flight: the receive buffers and the message,
// allocated once and reused by every run, as a streaming application
// does (fresh buffers would put page faults and garbage collection in
// every run).
type stream struct {
	a, b *msglayer.Endpoint
	bufs [][]byte
	msg  [][]byte
}

// newStream allocates a stream's buffers. With lend, the message is in a
// buffer a lends (AllocBuffer: the UMEM's buffer area on AF_XDP), from
// which pull replies leave without a copy.
func newStream(tb testing.TB, a, b *msglayer.Endpoint, size, window int, lend bool) *stream {
	s := &stream{a: a, b: b, bufs: make([][]byte, window), msg: [][]byte{make([]byte, size)}}
	for i := range s.bufs {
		s.bufs[i] = make([]byte, size)
	}
	if lend {
		buf, err := a.AllocBuffer(size)
		if err != nil {
			tb.Fatal(err)
		}
		tb.Cleanup(buf.Free)
		s.msg[0] = buf.Bytes()
	}
	return s
}

// run streams messages for about d and returns the bytes b received and
// the time they took.
func (s *stream) run(tb testing.TB, d time.Duration) (int64, time.Duration) {
	ctx := context.Background()
	a, b, bufs, msg := s.a, s.b, s.bufs, s.msg
	window := len(bufs)
	rgrp, sgrp := b.NewGroup(), a.NewGroup()
	for i := range bufs {
		if _, err := rgrp.Irecv(0, 0, [][]byte{bufs[i]}, i); err != nil {
			tb.Fatal(err)
		}
	}
	var received int64
	recvDone := make(chan error, 1)
	go func() {
		for {
			st, err := rgrp.Wait(ctx)
			if err != nil {
				recvDone <- err
				return
			}
			if st.Match == 1 {
				recvDone <- nil
				return
			}
			received += int64(st.XferLen)
			i := st.Context.(int)
			if _, err := rgrp.Irecv(0, 0, [][]byte{bufs[i]}, i); err != nil {
				recvDone <- err
				return
			}
		}
	}()
	start := time.Now()
	inFlight := 0
	for time.Since(start) < d {
		for inFlight < window {
			if _, err := sgrp.Isend(b.Addr(), 0, msg, nil); err != nil {
				tb.Fatal(err)
			}
			inFlight++
		}
		if _, err := sgrp.Wait(ctx); err != nil {
			tb.Fatal(err)
		}
		inFlight--
	}
	for ; inFlight > 0; inFlight-- {
		sgrp.Wait(ctx)
	}
	elapsed := time.Since(start)
	end, _ := a.Isend(b.Addr(), 1, nil, nil)
	a.Wait(ctx, end)
	if err := <-recvDone; err != nil {
		tb.Fatal(err)
	}
	return received, elapsed
}

// BenchmarkStreamAFXDP streams 1 MiB messages one way over AF_XDP at MTU
// 1500, 3506 and 9000 and reports MB/s next to the raw link's rate with
// full-size frames (frames/s × frame bytes). The two run on two fresh labs
// in alternating blocks (streamBlocks of b.N×25 ms each), so that both
// see the same spells of a noisy host; the benchmark timer runs during
// msglayer's blocks only.
func BenchmarkStreamAFXDP(b *testing.B) {
	for _, mtu := range []int{1500, 3506, 9000} {
		b.Run(fmt.Sprint("mtu", mtu), func(b *testing.B) {
			floorLab := netlab.New(b, netlab.Options{Hosts: 2, MTU: mtu})
			lab := netlab.New(b, netlab.Options{Hosts: 2, MTU: mtu})
			la, lb := floorLinks(b, floorLab, true)
			defer la.Close()
			defer lb.Close()
			w := labWorld2(b, lab)
			// Blocking mode, sleeping at once, by default: with both ends in
			// one process on two cores, two spinning drivers starve the
			// kernel's copy work (XMX_BENCH_BUSY=1 measures busy-poll
			// anyway).
			busy := os.Getenv("XMX_BENCH_BUSY") != ""
			// XMX_BENCH_UMEM=1 sends from a buffer in the sender's UMEM.
			lend := os.Getenv("XMX_BENCH_UMEM") != ""
			ca := msglayer.Config{BusyPoll: busy, SpinBeforeSleep: msglayer.NoSpin}
			cc := ca
			if lend {
				ca.UMEMBufferBytes = 2 << 20
			}
			a, c := w.pair(b, ca, cc)
			frame := mtu + xdp.EthHeaderLen
			st := newStream(b, a, c, 1<<20, 16, lend)
			st.run(b, 50*time.Millisecond) // the buffers' pages, the first pulls
			d := time.Duration(b.N) * 100 * time.Millisecond / streamBlocks
			var rawFrames uint64
			var rawTime, xmxTime time.Duration
			var xmxBytes int64
			sa0, sc0 := a.LinkStats(), c.LinkStats()
			b.ResetTimer()
			b.StopTimer()
			for range streamBlocks {
				res, err := linkbench.Stream(la, lb, frame, d, 1<<30)
				if err != nil {
					b.Fatal(err)
				}
				rawFrames += res.Received
				rawTime += res.Elapsed
				b.StartTimer()
				n, el := st.run(b, d)
				b.StopTimer()
				xmxBytes += n
				xmxTime += el
			}
			sa, sc := a.LinkStats(), c.LinkStats()
			// The sender's frames per syscall (a copy-mode sendto takes at
			// most 32) and the receiver's frames (pull requests, acks) per
			// frame it received.
			sent := float64(sa.TxFrames - sa0.TxFrames)
			b.ReportMetric(sent/float64(max(sa.Wakeups-sa0.Wakeups, 1)), "tx-frames/syscall")
			b.ReportMetric(float64(sc.TxFrames-sc0.TxFrames)/max(sent, 1), "back-frames/frame")
			rate := float64(xmxBytes) / xmxTime.Seconds()
			raw := float64(rawFrames) * float64(frame) / rawTime.Seconds()
			b.ReportMetric(rate/1e6, "MB/s")
			b.ReportMetric(raw/1e6, "link-MB/s")
			b.ReportMetric(rate/raw, "×link")
		})
	}
}

// streamBlocks is how many alternating blocks BenchmarkStreamAFXDP cuts
// each side's time into.
const streamBlocks = 4
