package main

// Parsers for the output of every tool benchtool runs. Each is tested
// against real captured output in testdata/ (parse_test.go). They are strict
// about what they need and lenient about everything else: a parser that
// cannot find its numbers returns an error quoting what the tool said.

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

// ---- UCX ucx_perftest ----------------------------------------------------

// ucxResult is the final line of one ucx_perftest run (client side).
//
// For latency tests (tag_lat) the time columns are one-way latency in µs
// (ucx_perftest prints half the round trip); for bandwidth tests (tag_bw)
// they are the per-message "overhead" in µs. Bandwidth is in MiB/s:
// ucx_perftest's "MB/s" is 2^20 bytes per second.
type ucxResult struct {
	Iterations     int
	PercentileRank float64 // the -R rank the percentile column shows (50 by default)
	PercentileUs   float64 // that percentile, over the last 2048 iterations only (UCX's TIMING_QUEUE_SIZE)
	AverageUs      float64 // over the last report interval
	OverallUs      float64 // over the whole run
	BWAverageMiBs  float64
	BWOverallMiBs  float64
	MsgRateOverall float64
}

var (
	ucxRankRE    = regexp.MustCompile(`([0-9]+(?:\.[0-9]+)?)%ile`)
	ucxCSVRankRE = regexp.MustCompile(`^([0-9]+(?:\.[0-9]+)?)_percentile`)
)

// parseUCXPerftest reads ucx_perftest's table (default or -f) or CSV (-v)
// output and returns the last data line (the "Final:" line when the run
// printed intermediate report lines).
func parseUCXPerftest(out string) (ucxResult, error) {
	var res ucxResult
	rank := 0.0
	found := false
	for _, line := range strings.Split(out, "\n") {
		line = strings.TrimSpace(line)
		if m := ucxRankRE.FindStringSubmatch(line); m != nil && strings.HasPrefix(line, "|") {
			rank, _ = strconv.ParseFloat(m[1], 64)
			continue
		}
		if strings.HasPrefix(line, "iterations,") { // CSV header (-v)
			cols := strings.Split(line, ",")
			if len(cols) > 1 {
				if m := ucxCSVRankRE.FindStringSubmatch(cols[1]); m != nil {
					rank, _ = strconv.ParseFloat(m[1], 64)
				}
			}
			continue
		}
		var fields []string
		if strings.Count(line, ",") == 7 {
			fields = strings.Split(line, ",")
		} else {
			fields = strings.Fields(line)
			// Drop a leading label: "Final:" or "[thread 0]".
			for len(fields) > 8 {
				fields = fields[1:]
			}
		}
		if len(fields) != 8 {
			continue
		}
		var v [8]float64
		ok := true
		for i, f := range fields {
			x, err := strconv.ParseFloat(strings.TrimSpace(f), 64)
			if err != nil {
				ok = false
				break
			}
			v[i] = x
		}
		if !ok {
			continue
		}
		res = ucxResult{
			Iterations: int(v[0]), PercentileRank: rank, PercentileUs: v[1],
			AverageUs: v[2], OverallUs: v[3], BWAverageMiBs: v[4], BWOverallMiBs: v[5],
			MsgRateOverall: v[7],
		}
		found = true
	}
	if !found {
		return res, fmt.Errorf("ucx_perftest: no result line in output%s", quoteErrors(out, "ERROR", "error"))
	}
	if rank == 0 {
		return res, fmt.Errorf("ucx_perftest: result line without a percentile header")
	}
	if res.Iterations <= 0 {
		return res, fmt.Errorf("ucx_perftest: result line reports %d iterations", res.Iterations)
	}
	return res, nil
}

// ---- libfabric fi_pingpong -----------------------------------------------

// fiResult is one line of fi_pingpong's table. UsecPerXfer is total time
// divided by the number of transfers in both directions, i.e. the MEAN
// one-way latency; fi_pingpong gives no percentile and has no warm-up, so
// connection setup is inside the mean (short runs are skewed upwards).
type fiResult struct {
	Bytes       string // as printed: "8", "64k", "1m"
	Iterations  string // "#sent" as printed: "20k"
	Seconds     float64
	MBps        float64 // fi_pingpong's MB/sec (10^6 bytes/s, both directions)
	UsecPerXfer float64
}

// parseFiPingpong returns every data line under fi_pingpong's header.
func parseFiPingpong(out string) ([]fiResult, error) {
	var header []string
	var rows []fiResult
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		if f[0] == "bytes" {
			header = f
			continue
		}
		if header == nil || len(f) != len(header) {
			continue
		}
		var r fiResult
		var err error
		for i, h := range header {
			switch h {
			case "bytes":
				r.Bytes = f[i]
			case "#sent":
				r.Iterations = f[i]
			case "time":
				r.Seconds, err = strconv.ParseFloat(strings.TrimSuffix(f[i], "s"), 64)
			case "MB/sec":
				r.MBps, err = strconv.ParseFloat(f[i], 64)
			case "usec/xfer":
				r.UsecPerXfer, err = strconv.ParseFloat(f[i], 64)
			}
			if err != nil {
				break
			}
		}
		if err != nil {
			continue
		}
		rows = append(rows, r)
	}
	if header == nil {
		return nil, fmt.Errorf("fi_pingpong: no result table in output%s", quoteErrors(out, "error", "ERROR"))
	}
	if !strings.Contains(strings.Join(header, " "), "usec/xfer") {
		return nil, fmt.Errorf("fi_pingpong: header has no usec/xfer column: %q", strings.Join(header, " "))
	}
	if len(rows) == 0 {
		return nil, fmt.Errorf("fi_pingpong: header but no result line%s", quoteErrors(out, "error", "ERROR"))
	}
	return rows, nil
}

// fiSizeStr is how fi_pingpong prints a size (size_str() in libfabric's
// util/pingpong.c): in the largest unit of 1024 (k, m, g) it reaches, with
// one decimal, truncated, below 10 units and none from 10 on, the decimal
// left out when it is 0 ("8", "1000", "1.4k" for 1500, "8.7k" for 9000,
// "19k" for 20000, "64k", "1m"). The result line is matched against it:
// parsing the column back cannot recover sizes that are not whole units.
func fiSizeStr(size int) string {
	base, mag := 1, ""
	switch {
	case size >= 1<<30:
		base, mag = 1<<30, "g"
	case size >= 1<<20:
		base, mag = 1<<20, "m"
	case size >= 1<<10:
		base, mag = 1<<10, "k"
	}
	whole, frac := size/base, 0
	if whole < 10 {
		frac = size % base * 10 / base
	}
	if frac != 0 {
		return fmt.Sprintf("%d.%d%s", whole, frac, mag)
	}
	return fmt.Sprintf("%d%s", whole, mag)
}

// ---- sockperf ------------------------------------------------------------

// sockperfResult is the client summary of "sockperf ping-pong". Latencies
// are one way (sockperf halves the round trip unless --full-rtt), in µs.
type sockperfResult struct {
	MeanUs       float64
	P50Us        float64
	P99Us        float64
	MinUs        float64
	MaxUs        float64
	Observations int
	Dropped      int
}

var (
	ansiRE          = regexp.MustCompile("\x1b\\[[0-9;]*[A-Za-z]")
	spSummaryRE     = regexp.MustCompile(`Summary: Latency is\s+([0-9.]+)\s+usec`)
	spPercentileRE  = regexp.MustCompile(`percentile\s+([0-9.]+)\s*=\s*([0-9.]+)`)
	spMinRE         = regexp.MustCompile(`<MIN> observation\s*=\s*([0-9.]+)`)
	spMaxRE         = regexp.MustCompile(`<MAX> observation\s*=\s*([0-9.]+)`)
	spObservationRE = regexp.MustCompile(`Total\s+([0-9]+)\s+observations`)
	spDroppedRE     = regexp.MustCompile(`# dropped messages = ([0-9]+)`)
)

// parseSockperf reads the client output of "sockperf pp". sockperf exits 0
// when it rejects its arguments or finds no server, so the absence of the
// summary is the failure signal.
func parseSockperf(out string) (sockperfResult, error) {
	var r sockperfResult
	out = ansiRE.ReplaceAllString(out, "")
	for _, bad := range []string{"Invalid message size", "No messages were received", "ERROR"} {
		if i := strings.Index(out, bad); i >= 0 {
			return r, fmt.Errorf("sockperf: %s", firstLineAt(out, i))
		}
	}
	m := spSummaryRE.FindStringSubmatch(out)
	if m == nil {
		return r, fmt.Errorf("sockperf: no \"Summary: Latency is\" line in output%s", quoteErrors(out, "sockperf:"))
	}
	r.MeanUs, _ = strconv.ParseFloat(m[1], 64)
	got50, got99 := false, false
	for _, m := range spPercentileRE.FindAllStringSubmatch(out, -1) {
		v, err := strconv.ParseFloat(m[2], 64)
		if err != nil {
			continue
		}
		switch m[1] {
		case "50.000", "50.00", "50":
			r.P50Us, got50 = v, true
		case "99.000", "99.00", "99":
			r.P99Us, got99 = v, true
		}
	}
	if !got50 || !got99 {
		return r, fmt.Errorf("sockperf: summary without the 50th and 99th percentile lines")
	}
	if m := spMinRE.FindStringSubmatch(out); m != nil {
		r.MinUs, _ = strconv.ParseFloat(m[1], 64)
	}
	if m := spMaxRE.FindStringSubmatch(out); m != nil {
		r.MaxUs, _ = strconv.ParseFloat(m[1], 64)
	}
	if m := spObservationRE.FindStringSubmatch(out); m != nil {
		r.Observations, _ = strconv.Atoi(m[1])
	}
	if m := spDroppedRE.FindStringSubmatch(out); m != nil {
		r.Dropped, _ = strconv.Atoi(m[1])
	}
	return r, nil
}

// ---- iperf3 -J -----------------------------------------------------------

type iperfSum struct {
	Seconds       float64  `json:"seconds"`
	Bytes         float64  `json:"bytes"`
	BitsPerSecond float64  `json:"bits_per_second"`
	LostPercent   *float64 `json:"lost_percent"`
	Packets       *float64 `json:"packets"`
	Retransmits   *float64 `json:"retransmits"`
}

// iperfResult is what an iperf3 client run measured. MB/s are 10^6 bytes of
// payload per second.
type iperfResult struct {
	ReceiverMBps float64 // what the server received: the figure reported
	SenderMBps   float64
	LostPercent  float64 // UDP only
	Retransmits  float64 // TCP only
	Seconds      float64
}

// parseIperf3JSON reads "iperf3 -c ... -J" output (TCP or UDP). iperf3 3.12
// puts the receiver's figures in end.sum_received for both protocols (UDP
// also has end.sum, the sender's view with the receiver's loss count).
func parseIperf3JSON(out []byte) (iperfResult, error) {
	var r iperfResult
	var doc struct {
		Error string `json:"error"`
		End   struct {
			Sum         *iperfSum `json:"sum"`
			SumSent     *iperfSum `json:"sum_sent"`
			SumReceived *iperfSum `json:"sum_received"`
		} `json:"end"`
	}
	// iperf3 prints warnings on stderr, but be tolerant of text before the JSON.
	if i := bytes.IndexByte(out, '{'); i > 0 {
		out = out[i:]
	}
	if err := json.Unmarshal(out, &doc); err != nil {
		return r, fmt.Errorf("iperf3: output is not JSON: %v", err)
	}
	if doc.Error != "" {
		return r, fmt.Errorf("iperf3: %s", doc.Error)
	}
	recv := doc.End.SumReceived
	if recv == nil {
		recv = doc.End.Sum
	}
	if recv == nil || recv.BitsPerSecond <= 0 {
		return r, errors.New("iperf3: no end.sum_received (or end.sum) with a positive rate")
	}
	r.ReceiverMBps = recv.BitsPerSecond / 8 / 1e6
	r.Seconds = recv.Seconds
	if doc.End.SumSent != nil {
		r.SenderMBps = doc.End.SumSent.BitsPerSecond / 8 / 1e6
		if doc.End.SumSent.Retransmits != nil {
			r.Retransmits = *doc.End.SumSent.Retransmits
		}
	}
	if recv.LostPercent != nil {
		r.LostPercent = *recv.LostPercent
	} else if doc.End.Sum != nil && doc.End.Sum.LostPercent != nil {
		r.LostPercent = *doc.End.Sum.LostPercent
	}
	return r, nil
}

// ---- xmx linkbench -json -------------------------------------------------

// linkRow is one row of "xmx linkbench -json" (cmd/xmx/linkbench.go).
type linkRow struct {
	System       string  `json:"system"`
	Mode         string  `json:"mode"`
	RTTP50us     float64 `json:"rtt_p50_us"`
	RTTP99us     float64 `json:"rtt_p99_us"`
	RoundTrips   int     `json:"round_trips"`
	Lost         int     `json:"lost"`
	FramesPerSec float64 `json:"frames_per_s"`
	StreamSent   uint64  `json:"stream_sent"`
	StreamRecvd  uint64  `json:"stream_received"`
}

func parseLinkbenchJSON(out []byte) ([]linkRow, error) {
	var rows []linkRow
	if i := bytes.IndexByte(out, '['); i > 0 {
		out = out[i:]
	}
	if err := json.Unmarshal(out, &rows); err != nil {
		return nil, fmt.Errorf("xmx linkbench -json: %v", err)
	}
	if len(rows) == 0 {
		return nil, errors.New("xmx linkbench -json: no rows")
	}
	for _, r := range rows {
		if r.System == "" || r.RTTP50us <= 0 || r.FramesPerSec <= 0 {
			return nil, fmt.Errorf("xmx linkbench -json: incomplete row %+v", r)
		}
	}
	return rows, nil
}

// ---- xmx pingpong -json / xmx stream -json (contract, see xmxSystems) ----

// xmxPoint is one object of "xmx pingpong -json" or "xmx stream -json".
// Latencies are one way (half the round trip) in µs; MBps ("mbps") is
// payload megabytes (10^6 bytes) per second, not megabits.
type xmxPoint struct {
	Size   int      `json:"size"`
	P50us  *float64 `json:"p50_us"`
	P99us  *float64 `json:"p99_us"`
	MeanUs *float64 `json:"mean_us"`
	MinUs  *float64 `json:"min_us"`
	MBps   *float64 `json:"mbps"`
	// xmx stream only.
	Messages int     `json:"messages"`
	Window   int     `json:"window"`
	Seconds  float64 `json:"seconds"`
	UMEM     bool    `json:"umem"` // sent from a buffer lent from the UMEM (-umem)
}

// parseXMXJSON accepts one JSON object, a JSON array of objects, or one
// object per line (JSON lines), and returns the points in order.
func parseXMXJSON(out []byte) ([]xmxPoint, error) {
	dec := json.NewDecoder(bytes.NewReader(bytes.TrimSpace(out)))
	var pts []xmxPoint
	for dec.More() {
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return nil, fmt.Errorf("xmx -json: %v", err)
		}
		raw = bytes.TrimSpace(raw)
		if len(raw) > 0 && raw[0] == '[' {
			var arr []xmxPoint
			if err := json.Unmarshal(raw, &arr); err != nil {
				return nil, fmt.Errorf("xmx -json: %v", err)
			}
			pts = append(pts, arr...)
			continue
		}
		var p xmxPoint
		if err := json.Unmarshal(raw, &p); err != nil {
			return nil, fmt.Errorf("xmx -json: %v", err)
		}
		pts = append(pts, p)
	}
	if len(pts) == 0 {
		return nil, errors.New("xmx -json: no result objects")
	}
	for _, p := range pts {
		if p.Size <= 0 {
			return nil, fmt.Errorf("xmx -json: object without a positive size: %+v", p)
		}
		if p.P50us == nil && p.MeanUs == nil && p.MBps == nil {
			return nil, fmt.Errorf("xmx -json: size %d has none of p50_us, mean_us, mbps", p.Size)
		}
	}
	return pts, nil
}

// ---- helpers -------------------------------------------------------------

// quoteErrors returns ": " and the lines of out containing any of the
// markers (at most 3), or "" when there are none.
func quoteErrors(out string, markers ...string) string {
	var got []string
	for _, line := range strings.Split(ansiRE.ReplaceAllString(out, ""), "\n") {
		for _, m := range markers {
			if strings.Contains(line, m) {
				got = append(got, strings.TrimSpace(line))
				break
			}
		}
		if len(got) == 3 {
			break
		}
	}
	if len(got) == 0 {
		return ""
	}
	return ": " + strings.Join(got, " | ")
}

func firstLineAt(s string, i int) string {
	start := strings.LastIndexByte(s[:i], '\n') + 1
	end := strings.IndexByte(s[i:], '\n')
	if end < 0 {
		return strings.TrimSpace(s[start:])
	}
	return strings.TrimSpace(s[start : i+end])
}
