package main

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/xmx-stack/xmx/msglayer"
	"github.com/xmx-stack/xmx/xdp"
)

// streamResult is one line of stream output.
type streamResult struct {
	Size     int     `json:"size"`
	Messages int     `json:"messages"`
	Window   int     `json:"window"`
	Seconds  float64 `json:"seconds"`
	MBps     float64 `json:"mbps"`           // bytes the server received per second, 10^6 bytes
	MsgRate  float64 `json:"msg_per_s"`      // messages per second
	Received uint64  `json:"received"`       // messages the server counted
	UMEM     bool    `json:"umem,omitempty"` // sent from a buffer lent from the UMEM (-umem)
	Sync     bool    `json:"sync,omitempty"` // synchronous sends (-sync)
}

func runStream(args []string) error {
	fs := flag.NewFlagSet("stream", flag.ContinueOnError)
	var ef endpointFlags
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), `usage: xmx stream [flags]          (server: same as xmx pingpong without PEER)
       xmx stream [flags] PEER     (client)

Unidirectional bandwidth: the client keeps a window of messages in flight
to the server and reports, per size, the bytes the server received per
second and the message rate.

`)
		fs.PrintDefaults()
	}
	ef.register(fs, 0)
	sizes := fs.String("sizes", "", "comma-separated sizes (e.g. 64k,1M); overrides -start/-end/-mult")
	start, end := &sizeFlag{1 << 10}, &sizeFlag{4 << 20}
	fs.Var(start, "start", "first `size` of the sweep (bytes; k, M, G suffixes)")
	fs.Var(end, "end", "last `size` of the sweep (bytes; k, M, G suffixes)")
	mult := fs.Float64("mult", 4, "size multiplier of the sweep")
	count := fs.Int("n", 0, "messages per size (default: enough for about -time)")
	dur := fs.Duration("time", time.Second, "target duration per size when -n is not given")
	window := fs.Int("window", 16, "messages in flight")
	warmup := fs.Int("warmup", 0, "unmeasured messages streamed before each size's measurement")
	sync := fs.Bool("sync", false, "synchronous sends (Issend): a message completes only once the server matched it")
	asJSON := fs.Bool("json", false, "print one JSON object per size")
	maxSize := &sizeFlag{16 << 20}
	fs.Var(maxSize, "max-size", "server: largest message it takes whole (`size` in bytes; k, M, G suffixes)")
	maxRecvBytes := &sizeFlag{defaultMaxRecvBytes}
	fs.Var(maxRecvBytes, "max-recv-bytes", maxRecvBytesHelp)
	once := fs.Bool("once", false, "server: exit after the first client says goodbye")
	umem := fs.Bool("umem", false, "client: send from a buffer lent from the UMEM (large messages leave without a CPU copy when the socket is in zero-copy mode)")
	umemGather := fs.String("umem-gather", "auto", umemGatherHelp)
	if err := ef.parse(fs, args); err != nil {
		return err
	}
	if *window < 1 || *window > 256 {
		return fmt.Errorf("%w: -window %d: want 1..256", errUsage, *window)
	}
	if *count < 0 || *count > maxIters {
		return fmt.Errorf("%w: -n %d: want 0..%d", errUsage, *count, maxIters)
	}
	if err := checkRunTime("-time", *dur, 0); err != nil {
		return err
	}
	if *warmup < 0 || *warmup > maxIters {
		return fmt.Errorf("%w: -warmup %d: want 0..%d", errUsage, *warmup, maxIters)
	}
	if err := checkServerLimits(maxSize.n, maxRecvBytes.n); err != nil {
		return err
	}
	list, err := parseSizes(*sizes, start.n, end.n, *mult)
	if err != nil {
		return err
	}
	maxMsg := 0
	for _, s := range list {
		maxMsg = max(maxMsg, s)
	}
	gather, err := umemGatherFlag(fs, *umem, *umemGather)
	if err != nil {
		return err
	}
	if *umem && (maxMsg < 1 || maxMsg > xdp.MaxBufferBytes) {
		return fmt.Errorf("%w: -umem: the largest size, %d bytes, must fit the link's buffer area: 1 byte to %d", errUsage, maxMsg, xdp.MaxBufferBytes)
	}
	if *umem && fs.NArg() > 0 {
		ef.umemBytes, ef.umemGather = maxMsg, gather
	}
	e, err := ef.open()
	if err != nil {
		return err
	}
	defer e.Close()
	if fs.NArg() == 0 {
		return serve(e, maxSize.n, maxRecvBytes.n, *once, os.Stderr)
	}
	peer, err := ef.connect(e, fs.Arg(0))
	if err != nil {
		return err
	}
	var buf []byte
	if *umem {
		lent, err := e.AllocBuffer(maxMsg)
		if err != nil {
			return fmt.Errorf("-umem: %w", err)
		}
		defer lent.Free()
		if !lent.ZeroCopy() {
			fmt.Fprintf(os.Stderr, "xmx stream: -umem: the link copies lent buffers into its frames (the socket is not in zero-copy mode, or -umem-gather copy)\n")
		}
		buf = lent.Bytes()
	} else {
		buf = make([]byte, maxMsg)
	}
	if err := hello(e, peer, maxMsg, *window, ef.timeout); err != nil {
		return err
	}
	defer bye(e, peer)
	ctx, watch := watchAnswers(e, peer, ef.timeout)
	defer watch.stop()
	info, _ := e.LinkInfo()
	if !*asJSON {
		from := "ordinary memory"
		if *umem {
			from = "a UMEM buffer"
		}
		var how string
		if *warmup > 0 {
			how += fmt.Sprintf(", %d warm-up messages per size", *warmup)
		}
		if *sync {
			how += ", synchronous sends"
		}
		fmt.Printf("# xmx stream %v -> %v, %s %s on %s, window %d%s, sending from %s\n", e.Addr(), peer, info.Kind, info.Mode, info.Interface, *window, how, from)
		fmt.Printf("# %10s %9s %10s %12s %12s\n", "bytes", "messages", "seconds", "MB/s", "msg/s")
	}
	enc := json.NewEncoder(os.Stdout)
	progress := isTerminal(os.Stderr)
	for k, size := range list {
		if progress {
			fmt.Fprintf(os.Stderr, "\r[%d/%d] %d bytes...", k+1, len(list), size)
		}
		var res streamResult
		var err error
		if *warmup > 0 {
			// Its own exchange with the server, which counts anew after it.
			_, err = streamSize(ctx, watch, e, peer, buf[:size], *window, *warmup, *dur, *sync)
		}
		if err == nil {
			res, err = streamSize(ctx, watch, e, peer, buf[:size], *window, *count, *dur, *sync)
		}
		if progress {
			fmt.Fprintf(os.Stderr, "\r%40s\r", "")
		}
		if err != nil {
			return fmt.Errorf("%d-byte messages: %w", size, err)
		}
		res.UMEM, res.Sync = *umem, *sync
		if *asJSON {
			if err := enc.Encode(res); err != nil {
				return fmt.Errorf("%d-byte messages: write the result: %w", size, err)
			}
			continue
		}
		fmt.Printf("  %10d %9d %10.3f %12.2f %12.0f\n", res.Size, res.Messages, res.Seconds, res.MBps, res.MsgRate)
	}
	return nil
}

// streamSize streams messages of one size (count of them, or for dur when
// count is 0; synchronous sends if sync) and asks the server what it got.
func streamSize(ctx context.Context, watch *answerWatch, e *msglayer.Endpoint, peer msglayer.Addr, buf []byte, window, count int, dur time.Duration, sync bool) (streamResult, error) {
	size := len(buf)
	segs := [][]byte{buf}
	watch.tick()
	grp := e.NewGroup()
	send := grp.Isend
	if sync {
		send = grp.Issend
	}
	start := time.Now()
	sent, inFlight := 0, 0
	deadline := start.Add(dur)
	for count == 0 && time.Now().Before(deadline) || count > 0 && sent < count {
		for inFlight < window && (count == 0 || sent < count) {
			if _, err := send(peer, match(kindStream, uint64(sent)), segs, nil); err != nil {
				return streamResult{}, err
			}
			sent++
			inFlight++
		}
		if _, err := grp.Wait(ctx); err != nil {
			return streamResult{}, why(ctx, err)
		}
		watch.tick()
		inFlight--
	}
	for ; inFlight > 0; inFlight-- {
		if _, err := grp.Wait(ctx); err != nil {
			return streamResult{}, why(ctx, err)
		}
		watch.tick()
	}
	reply := make([]byte, 16)
	r, err := e.Irecv(match(kindStreamAck, 0), ^uint64(0), [][]byte{reply}, nil)
	if err != nil {
		return streamResult{}, err
	}
	if err := sendWait(ctx, e, peer, match(kindStreamEnd, 0), nil); err != nil {
		e.Cancel(r)
		return streamResult{}, why(ctx, err)
	}
	if _, err := e.Wait(ctx, r); err != nil {
		e.Cancel(r)
		return streamResult{}, why(ctx, err)
	}
	el := time.Since(start).Seconds()
	msgs, bytes := binary.BigEndian.Uint64(reply[0:]), binary.BigEndian.Uint64(reply[8:])
	if msgs != uint64(sent) {
		return streamResult{}, fmt.Errorf("server counted %d messages of the %d sent", msgs, sent)
	}
	return streamResult{
		Size: size, Messages: sent, Window: window, Seconds: el,
		MBps: float64(bytes) / el / 1e6, MsgRate: float64(msgs) / el, Received: msgs,
	}, nil
}

// umemGatherHelp documents -umem-gather.
const umemGatherHelp = "with -umem: how the data leaves: auto (UMEM descriptors in zero-copy mode, else copied into the frames), descriptors (always UMEM descriptors, multi-buffer socket) or copy"

// umemGatherFlag reads -umem-gather (value), a flag of fs that only goes
// with -umem.
func umemGatherFlag(fs *flag.FlagSet, umem bool, value string) (xdp.GatherMode, error) {
	given := false
	fs.Visit(func(f *flag.Flag) { given = given || f.Name == "umem-gather" })
	if given && !umem {
		return 0, fmt.Errorf("%w: -umem-gather: only with -umem", errUsage)
	}
	switch value {
	case "auto":
		return xdp.GatherAuto, nil
	case "descriptors":
		return xdp.GatherDescriptors, nil
	case "copy":
		return xdp.GatherCopy, nil
	}
	return 0, fmt.Errorf("%w: -umem-gather %q: want auto, descriptors or copy", errUsage, value)
}
