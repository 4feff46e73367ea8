package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/xmx-stack/xmx/msglayer"
)

// pingResult is one line of pingpong output; latency is half the round
// trip, as omx_perf and ucx_perftest report it.
type pingResult struct {
	Size       int     `json:"size"`
	Iterations int     `json:"iterations"`
	P50us      float64 `json:"p50_us"`
	P99us      float64 `json:"p99_us"`
	MeanUs     float64 `json:"mean_us"`
	MinUs      float64 `json:"min_us"`
	MBps       float64 `json:"mbps"` // size / mean half round trip, in 10^6 bytes per second
	// Histogram counts half round trips per bucket (-hist); bucket i
	// holds those below HistogramUpperUs[i] µs and at or above the bound
	// before (bucket 0: below 1 µs).
	Histogram        []int     `json:"histogram,omitempty"`
	HistogramUpperUs []float64 `json:"histogram_upper_us,omitempty"`
}

func runPingPong(args []string) error {
	fs := flag.NewFlagSet("pingpong", flag.ContinueOnError)
	var ef endpointFlags
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), `usage: xmx pingpong [flags]          (server)
       xmx pingpong [flags] PEER     (client)

The latency tool. Without PEER it serves pingpong and stream clients.
With PEER (a host name such as h2, or MAC[:endpoint]) it measures the
round trip of messages of each size and prints, per size, half the round
trip (p50, p99, mean, min, in µs) and the bandwidth it implies.

`)
		fs.PrintDefaults()
	}
	ef.register(fs, 0)
	sizes := fs.String("sizes", "", "comma-separated sizes (e.g. 0,8,64,1k,1M); overrides -start/-end/-mult")
	start, end := &sizeFlag{0}, &sizeFlag{4 << 20}
	fs.Var(start, "start", "first `size` of the sweep (bytes; k, M, G suffixes)")
	fs.Var(end, "end", "last `size` of the sweep (bytes; k, M, G suffixes)")
	mult := fs.Float64("mult", 2, "size multiplier of the sweep (0 is followed by 1)")
	iters := fs.Int("n", 1000, "measured round trips per size")
	warmup := fs.Int("warmup", 100, "unmeasured round trips per size")
	sync := fs.Bool("sync", false, "synchronous sends (Issend): complete only once matched")
	asJSON := fs.Bool("json", false, "print one JSON object per size")
	hist := fs.Bool("hist", false, "print a histogram of half round trips per size")
	maxSize := &sizeFlag{16 << 20}
	fs.Var(maxSize, "max-size", "server: largest message it takes whole (`size` in bytes; k, M, G suffixes)")
	maxRecvBytes := &sizeFlag{defaultMaxRecvBytes}
	fs.Var(maxRecvBytes, "max-recv-bytes", maxRecvBytesHelp)
	once := fs.Bool("once", false, "server: exit after the first client says goodbye")
	if err := ef.parse(fs, args); err != nil {
		return err
	}
	if *iters <= 0 || *iters > maxIters || *warmup < 0 || *warmup > maxIters {
		return fmt.Errorf("%w: -n %d -warmup %d: want 1 <= n <= %d and 0 <= warmup <= %d", errUsage, *iters, *warmup, maxIters, maxIters)
	}
	if err := checkServerLimits(maxSize.n, maxRecvBytes.n); err != nil {
		return err
	}
	list, err := parseSizes(*sizes, start.n, end.n, *mult)
	if err != nil {
		return err
	}
	if fs.NArg() == 0 {
		e, err := ef.open()
		if err != nil {
			return err
		}
		defer e.Close()
		return serve(e, maxSize.n, maxRecvBytes.n, *once, os.Stderr)
	}
	e, err := ef.open()
	if err != nil {
		return err
	}
	defer e.Close()
	peer, err := ef.connect(e, fs.Arg(0))
	if err != nil {
		return err
	}
	if err := hello(e, peer, slices.Max(list), 1, ef.timeout); err != nil {
		return err
	}
	defer bye(e, peer)
	ctx, watch := watchAnswers(e, peer, ef.timeout)
	defer watch.stop()

	info, _ := e.LinkInfo()
	mode := ef.spin.mode()
	if ef.busy {
		mode = "busy-poll"
	}
	out := os.Stdout
	if !*asJSON {
		fmt.Fprintf(out, "# xmx pingpong %v -> %v, %s %s on %s, %s, %d round trips per size (+%d warm-up), half round trip\n",
			e.Addr(), peer, info.Kind, info.Mode, info.Interface, mode, *iters, *warmup)
		fmt.Fprintf(out, "# %10s %9s %9s %9s %9s %11s\n", "bytes", "p50 µs", "p99 µs", "mean µs", "min µs", "MB/s")
	}
	progress := isTerminal(os.Stderr)
	enc := json.NewEncoder(out)
	for k, size := range list {
		if progress {
			fmt.Fprintf(os.Stderr, "\r[%d/%d] %d bytes...", k+1, len(list), size)
		}
		res, err := pingSize(ctx, watch, e, peer, size, *warmup, *iters, *sync, *hist)
		if progress {
			fmt.Fprintf(os.Stderr, "\r%40s\r", "")
		}
		if err != nil {
			return fmt.Errorf("%d-byte messages: %w", size, err)
		}
		if *asJSON {
			if err := enc.Encode(res); err != nil {
				return fmt.Errorf("%d-byte messages: write the result: %w", size, err)
			}
			continue
		}
		fmt.Fprintf(out, "  %10d %9.2f %9.2f %9.2f %9.2f %11.2f\n", res.Size, res.P50us, res.P99us, res.MeanUs, res.MinUs, res.MBps)
		if *hist {
			printHistogram(out, res.Histogram)
		}
	}
	return nil
}

// maxIters bounds -n and -warmup: the round-trip times of a size are
// kept (8 bytes each).
const maxIters = 1 << 26

// pingSize measures round trips of one size.
func pingSize(ctx context.Context, watch *answerWatch, e *msglayer.Endpoint, peer msglayer.Addr, size, warmup, n int, sync, hist bool) (pingResult, error) {
	watch.hold() // the time spent making the buffers is no silence
	out, in := make([]byte, size), make([]byte, size)
	for i := range out {
		out[i] = byte(i)
	}
	outSegs, inSegs := [][]byte{out}, [][]byte{in}
	rtts := make([]time.Duration, 0, n)
	watch.tick() // ends the hold: the exchange starts
	send := e.Isend
	if sync {
		send = e.Issend
	}
	for i := 0; i < warmup+n; i++ {
		seq := uint64(i)
		r, err := e.Irecv(match(kindPong, seq), ^uint64(0), inSegs, nil)
		if err != nil {
			return pingResult{}, err
		}
		t0 := time.Now()
		s, err := send(peer, match(kindPing, seq), outSegs, nil)
		if err != nil {
			return pingResult{}, err
		}
		st, err := e.Wait(ctx, r)
		if err != nil {
			e.Cancel(r)
			return pingResult{}, why(ctx, err)
		}
		rtt := time.Since(t0)
		watch.tick()
		if st.XferLen != size {
			return pingResult{}, fmt.Errorf("answer of %d bytes, want %d", st.XferLen, size)
		}
		if _, err := e.Wait(ctx, s); err != nil {
			return pingResult{}, why(ctx, err)
		}
		if i >= warmup {
			rtts = append(rtts, rtt)
		}
	}
	slices.Sort(rtts)
	var sum time.Duration
	for _, d := range rtts {
		sum += d
	}
	half := func(d time.Duration) float64 { return float64(d) / 2e3 }
	res := pingResult{
		Size:       size,
		Iterations: n,
		P50us:      half(rank(rtts, 50)),
		P99us:      half(rank(rtts, 99)),
		MeanUs:     half(sum / time.Duration(len(rtts))),
		MinUs:      half(rtts[0]),
	}
	if res.MeanUs > 0 {
		res.MBps = float64(size) / res.MeanUs
	}
	if hist {
		res.Histogram = histogram(rtts)
		for i := range res.Histogram {
			res.HistogramUpperUs = append(res.HistogramUpperUs, math.Exp2(float64(i)))
		}
	}
	return res, nil
}

// rank is the p-th percentile of sorted, which is not empty: the element
// at index ⌊(n−1)·p/100⌋, the rule of manyclients and linkbench too (the
// median of two is the lower, p99 of up to 100 samples is not the maximum
// unless all are).
func rank(sorted []time.Duration, p int) time.Duration {
	return sorted[(len(sorted)-1)*p/100]
}

// histogram counts half round trips in power-of-two microsecond buckets:
// bucket i holds [2^(i-1), 2^i) µs, bucket 0 below 1 µs.
func histogram(rtts []time.Duration) []int {
	var h []int
	for _, d := range rtts {
		us := float64(d) / 2e3
		i := 0
		if us >= 1 {
			i = int(math.Log2(us)) + 1
		}
		for len(h) <= i {
			h = append(h, 0)
		}
		h[i]++
	}
	return h
}

func printHistogram(w io.Writer, h []int) {
	total := 0
	for _, c := range h {
		total += c
	}
	for i, c := range h {
		if c == 0 {
			continue
		}
		lo, hi := 0.0, 1.0
		if i > 0 {
			lo, hi = math.Exp2(float64(i-1)), math.Exp2(float64(i))
		}
		bar := strings.Repeat("#", max(1, c*50/total))
		fmt.Fprintf(w, "    %7.0f-%-7.0f µs %7d %s\n", lo, hi, c, bar)
	}
}

// isTerminal reports whether f is a terminal (for progress lines).
func isTerminal(f *os.File) bool {
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
