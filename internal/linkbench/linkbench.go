// Package linkbench measures links: round-trip latency of small frames and
// one-direction frame rate of full-size frames. The same code measures every
// link kind, xmx's and the reference, so their figures compare.
package linkbench

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/xmx-stack/xmx/xdp"
)

// header writes an Ethernet header from src to dst with the stack's EtherType.
func header(b []byte, dst, src []byte) {
	copy(b[0:6], dst)
	copy(b[6:12], src)
	binary.BigEndian.PutUint16(b[12:14], xdp.DefaultEtherType)
}

const seqOff = xdp.EthHeaderLen // where the sequence number sits

// PingPongResult holds the round trips of one ping-pong run.
type PingPongResult struct {
	RTTs []time.Duration // one per answered round trip, in order
	Lost int             // round trips that timed out
}

// MaxRoundTrips bounds PingPong's n and warmup: the round trips measured
// are kept (8 bytes each), and warmup+n does not overflow.
const MaxRoundTrips = 1 << 26

// PingPong sends n size-byte frames from a to b one at a time (after warmup
// unmeasured ones); b echoes each back. It returns the round trips (none
// for n 0: a warm-up, as the benchmarks' first round of b.N 1 needs).
func PingPong(a, b xdp.Link, size, warmup, n int) (PingPongResult, error) {
	if size < xdp.MinFrameLen || size > xdp.MaxFrameLen(a) {
		return PingPongResult{}, fmt.Errorf("linkbench: ping-pong frame size %d out of [%d, %d]", size, xdp.MinFrameLen, xdp.MaxFrameLen(a))
	}
	if n < 0 || n > MaxRoundTrips || warmup < 0 || warmup > MaxRoundTrips {
		return PingPongResult{}, fmt.Errorf("linkbench: ping-pong of %d round trips after %d warm-up ones: want 0..%d of each", n, warmup, MaxRoundTrips)
	}
	var stop atomic.Bool
	echoErr := make(chan error, 1)
	go func() { echoErr <- echo(b, &stop) }()

	res := PingPongResult{RTTs: make([]time.Duration, 0, n)}
	out := make([]byte, size)
	header(out, b.HardwareAddr(), a.HardwareAddr())
	in, sizes := [][]byte{make([]byte, xdp.MaxFrameLen(a))}, []int{0}
	frames := [][]byte{out}
	var err error
	for i := 0; i < warmup+n && err == nil; i++ {
		seq := uint64(i)
		binary.BigEndian.PutUint64(out[seqOff:], seq)
		start := time.Now()
		xdp.Trace(0, xdp.TraceStart)
		if _, err = a.Send(frames); err != nil {
			break
		}
		for {
			var k int
			k, err = a.Recv(in, sizes, 200*time.Millisecond)
			if err != nil {
				break
			}
			if k == 0 {
				res.Lost++
				break
			}
			if sizes[0] >= seqOff+8 && binary.BigEndian.Uint64(in[0][seqOff:]) == seq {
				xdp.Trace(0, xdp.TraceReturned)
				if i >= warmup {
					res.RTTs = append(res.RTTs, time.Since(start))
				}
				break
			}
			// A late answer to an earlier, timed-out ping: keep waiting.
		}
	}
	stop.Store(true)
	if eerr := <-echoErr; err == nil {
		err = eerr
	}
	return res, err
}

// echo answers every frame l receives by sending it back to its source
// until stop is set.
func echo(l xdp.Link, stop *atomic.Bool) error {
	const batch = 32
	bufs, sizes := make([][]byte, batch), make([]int, batch)
	for i := range bufs {
		bufs[i] = make([]byte, xdp.MaxFrameLen(l))
	}
	out := make([][]byte, batch)
	for !stop.Load() {
		k, err := l.Recv(bufs, sizes, 20*time.Millisecond)
		if err != nil {
			return err
		}
		if k > 0 {
			xdp.Trace(1, xdp.TraceReturned)
		}
		for i := 0; i < k; i++ {
			f := bufs[i][:sizes[i]]
			var mac [6]byte
			copy(mac[:], f[0:6])
			copy(f[0:6], f[6:12])
			copy(f[6:12], mac[:])
			out[i] = f
		}
		if k > 0 {
			xdp.Trace(1, xdp.TraceAnswer)
			if _, err := l.Send(out[:k]); err != nil {
				return err
			}
		}
	}
	return nil
}

// StreamResult is the outcome of one stream run.
type StreamResult struct {
	Sent, Received uint64
	Elapsed        time.Duration // from the first to the last frame received
}

// FramesPerSec is the receive rate.
func (r StreamResult) FramesPerSec() float64 {
	if r.Elapsed <= 0 {
		return 0
	}
	return float64(r.Received) / r.Elapsed.Seconds()
}

// Stream sends size-byte frames from a to b as fast as a takes them, for dur
// or maxFrames frames, whichever comes first, and counts what b receives.
func Stream(a, b xdp.Link, size int, dur time.Duration, maxFrames int) (StreamResult, error) {
	if size < xdp.MinFrameLen || size > xdp.MaxFrameLen(a) {
		return StreamResult{}, fmt.Errorf("linkbench: stream frame size %d out of [%d, %d]", size, xdp.MinFrameLen, xdp.MaxFrameLen(a))
	}
	if maxFrames < 1 || dur <= 0 {
		// A negative count would slice the send batch below 0.
		return StreamResult{}, fmt.Errorf("linkbench: stream of at most %d frames for %v: want a positive count and duration", maxFrames, dur)
	}
	const batch = 64
	var res StreamResult
	var sendErr error
	var sending atomic.Bool
	sending.Store(true)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer sending.Store(false)
		frames := make([][]byte, batch)
		for i := range frames {
			frames[i] = make([]byte, size)
			header(frames[i], b.HardwareAddr(), a.HardwareAddr())
		}
		deadline := time.Now().Add(dur)
		for res.Sent < uint64(maxFrames) && time.Now().Before(deadline) {
			k := min(batch, maxFrames-int(res.Sent))
			n, err := a.Send(frames[:k])
			res.Sent += uint64(n)
			if err != nil {
				sendErr = err
				return
			}
		}
	}()

	bufs, sizes := make([][]byte, batch), make([]int, batch)
	for i := range bufs {
		bufs[i] = make([]byte, xdp.MaxFrameLen(b))
	}
	var first, last time.Time
	var idle time.Time
	var err error
	for {
		var k int
		k, err = b.Recv(bufs, sizes, 20*time.Millisecond)
		if err != nil {
			break
		}
		now := time.Now()
		if k > 0 {
			if first.IsZero() {
				first = now
			}
			last = now
			res.Received += uint64(k)
			idle = time.Time{}
			continue
		}
		if !sending.Load() {
			if idle.IsZero() {
				idle = now
			} else if now.Sub(idle) > 200*time.Millisecond {
				break
			}
		}
	}
	wg.Wait()
	res.Elapsed = last.Sub(first)
	return res, errors.Join(sendErr, err)
}

// Percentile returns the p-th percentile (0..100) of d, which it sorts.
func Percentile(d []time.Duration, p float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	slices.Sort(d)
	i := int(p / 100 * float64(len(d)-1))
	return d[i]
}
