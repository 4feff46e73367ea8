// Command manyclients.d combines the JSON reports of one many-clients sweep
// (scripts/manyclients) into a table, results.json and a plot.
//
//	go run ./scripts/manyclients.d -raw DIR/raw -out DIR [-note TEXT]
//
// DIR/raw holds one directory per point, n<N>-r<ROUND>, with server.json
// (xmx manyclients -role server), clients-h<K>.json (one per client
// process) and cpu.txt (the machine's CPU counters around the point). It
// writes DIR/results.json, DIR/table.txt and DIR/plot.png (gnuplot). The
// points must be of one sweep: a point whose configuration (message size,
// window, rendezvous, duration, link, MTU, the server's receives) differs
// from the first one's, or client counts with different rounds, are an
// error.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"
)

// server and clients are the parts of xmx manyclients' reports used here.
type server struct {
	Link        link    `json:"link"`
	Recvs       int     `json:"recvs_posted"`
	RecvSize    int     `json:"recv_size"`
	UnexpBound  int     `json:"unexpected_bound"`
	Messages    uint64  `json:"messages"`
	Bytes       uint64  `json:"bytes"`
	Truncated   uint64  `json:"truncated"` // of Messages, cut to RecvSize
	Failed      uint64  `json:"failed"`
	ActiveS     float64 `json:"active_s"`
	GoodputMBps float64 `json:"goodput_mbps"`
	Sources     int     `json:"sources"`
	Fairness    float64 `json:"fairness"`
	UnexpMax    int     `json:"unexpected_bytes_max"`
	Counters    struct {
		Retransmits, Duplicates, Unexpected, Pulls, PullRequests uint64
		EagerRefused, PeersDead                                  uint64
	}
	LinkStats struct {
		RxFrames, RxBytes, RxDropped, RxRingFull uint64
	}
	Proc proc `json:"proc"`
}

type clients struct {
	Endpoints    int         `json:"endpoints"`
	Link         link        `json:"link"`
	PeerMTU      int         `json:"peer_mtu"`
	Size         int         `json:"size"`
	Window       int         `json:"window"`
	Rndv         bool        `json:"rendezvous"`
	UMEM         bool        `json:"umem"`
	SharedBuffer bool        `json:"shared_buffer"`
	DurationS    float64     `json:"duration_s"`
	StartLateS   float64     `json:"start_late_s"`
	Messages     uint64      `json:"messages"`
	Bytes        uint64      `json:"bytes"`
	Failed       uint64      `json:"failed"`
	Unfinished   uint64      `json:"unfinished"`
	Errors       []string    `json:"errors"`
	MaxUs        float64     `json:"max_us"`
	LatPerOctave int         `json:"lat_buckets_per_octave"`
	LatHist      [][2]uint64 `json:"lat_hist"`
	Counters     struct {
		Retransmits, PullReplies, EagerConverted uint64
	}
	LinkStats struct {
		TxFrames, TxBytes uint64
	}
	PullResent   uint64 `json:"pull_resent_frames"`
	RetransBytes uint64 `json:"retrans_bytes_est"`
	Proc         proc   `json:"proc"`
}

// link is the link a report's endpoints used.
type link struct {
	Kind string `json:"kind"`
	Mode string `json:"mode"`
	MTU  int    `json:"mtu"`
}

// config is the part of a clients report that every report of a sweep
// shares: what the clients were asked to do and the link they did it on.
// The MTU is the one the data went at (the server's, as the clients heard
// it; their link's in reports without it).
func (c *clients) config() map[string]any {
	mtu := c.PeerMTU
	if mtu == 0 {
		mtu = c.Link.MTU
	}
	return map[string]any{
		"message_size": c.Size, "window": c.Window, "rendezvous": c.Rndv, "duration_s": c.DurationS,
		"link": strings.TrimSpace(c.Link.Kind + " " + c.Link.Mode), "mtu": mtu, "umem": c.UMEM, "shared_buffer": c.SharedBuffer,
	}
}

// configDiff lists the keys whose values differ between two
// configurations, as "key A vs B", in key order; empty when they agree.
func configDiff(a, b map[string]any) []string {
	keys := make([]string, 0, len(a)+len(b))
	for k := range a {
		keys = append(keys, k)
	}
	for k := range b {
		if _, ok := a[k]; !ok {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	var diff []string
	for _, k := range keys {
		if va, vb := fmt.Sprint(a[k]), fmt.Sprint(b[k]); va != vb {
			diff = append(diff, fmt.Sprintf("%s %s vs %s", k, va, vb))
		}
	}
	return diff
}

type proc struct {
	MaxRSSKiB    int64   `json:"max_rss_kib"`
	CPUs         float64 `json:"cpu_s"`
	VolCtxSw     int64   `json:"voluntary_ctx_switches"` // 0 in reports of xmx before they had it
	GoHeapMaxKiB uint64  `json:"go_heap_max_kib"`
}

// Point is one run: one client count, one round.
type Point struct {
	N           int     `json:"n"`
	Round       int     `json:"round"`
	ClientProcs int     `json:"client_processes"`
	GoodputMBps float64 `json:"goodput_mbps"` // payload delivered at the server / first-to-last delivery, 10^6 B/s
	ActiveS     float64 `json:"active_s"`
	Messages    uint64  `json:"messages"` // delivered at the server
	Bytes       uint64  `json:"bytes"`
	// Bytes the server's link delivered to the socket (all frames of the
	// stack's EtherType, headers included) and their share of goodput.
	WireRxBytes   uint64  `json:"wire_rx_bytes"`
	WireEff       float64 `json:"wire_efficiency"`
	ClientTxBytes uint64  `json:"client_tx_bytes"` // the clients' links
	RxDropped     uint64  `json:"server_rx_dropped_frames"`
	// Data sent more than once (the clients' estimate, see xmx manyclients -h).
	RetransBytes  uint64  `json:"retrans_bytes"`
	RetransPct    float64 `json:"retrans_pct_of_goodput"`
	PullResent    uint64  `json:"pull_resent_frames"`
	Retransmits   uint64  `json:"client_retransmits"`
	ServerRetx    uint64  `json:"server_retransmits"`
	PullRequests  uint64  `json:"server_pull_requests"`
	ServerDups    uint64  `json:"server_duplicates"`
	EagerRefused  uint64  `json:"eager_refused"`
	EagerConv     uint64  `json:"eager_converted"`
	Unexpected    uint64  `json:"unexpected_messages"`
	UnexpMax      int     `json:"unexpected_bytes_max"`
	UnexpBound    int     `json:"unexpected_bound"`
	P50us         float64 `json:"p50_us"`
	P99us         float64 `json:"p99_us"`
	MaxUs         float64 `json:"max_us"`
	Fairness      float64 `json:"fairness"`
	ServerRSSKiB  int64   `json:"server_max_rss_kib"`
	ServerHeapKiB uint64  `json:"server_go_heap_max_kib"`
	ServerCPUs    float64 `json:"server_cpu_s"`
	ClientsCPUs   float64 `json:"clients_cpu_s"`
	// Sleeps per message delivered: the voluntary context switches of the
	// server and of all client processes (each one a process that slept
	// and was woken), 0 when the reports do not have them.
	ServerSleepsPerMsg  float64 `json:"server_sleeps_per_msg"`
	ClientsSleepsPerMsg float64 `json:"clients_sleeps_per_msg"`
	// MBperCPUs is the payload delivered per CPU-second of the
	// experiment's processes (server and clients, user + system; softirq
	// time is not charged to them): goodput with the machine's other load
	// taken out.
	MBperCPUs float64 `json:"mb_per_cpu_s"`
	// OtherCPU is the share of the machine's CPU time during the point
	// used by anything but this experiment's processes (approximate: the
	// kernel's softirq work for the lab counts as other).
	OtherCPU   float64  `json:"other_cpu_frac"`
	Load1      float64  `json:"loadavg1"`
	Failed     uint64   `json:"failed"`
	Unfinished uint64   `json:"unfinished"`
	PeersDead  uint64   `json:"server_peers_dead"`
	StartLateS float64  `json:"start_late_s"`
	Errors     []string `json:"errors,omitempty"`
}

// Summary is one client count: the median of every value over the
// rounds, goodput's and p99's range beside.
type Summary struct {
	Point
	Rounds     int     `json:"rounds"`
	GoodputMin float64 `json:"goodput_min_mbps"`
	GoodputMax float64 `json:"goodput_max_mbps"`
	P99Min     float64 `json:"p99_min_us"`
	P99Max     float64 `json:"p99_max_us"`
	// Goodputs is each round's goodput, in round order.
	Goodputs []float64 `json:"goodputs_mbps"`
}

// Target is one acceptance check.
type Target struct {
	Name  string  `json:"name"`
	Value float64 `json:"value"`
	Limit float64 `json:"limit"`
	Pass  bool    `json:"pass"`
	// NotApplicable: the sweep cannot tell (Pass is false, Detail says why).
	NotApplicable bool   `json:"not_applicable,omitempty"`
	Detail        string `json:"detail"`
}

// Results is results.json.
type Results struct {
	Schema  string         `json:"schema"`
	Date    string         `json:"date"`
	Machine map[string]any `json:"machine"`
	Config  map[string]any `json:"config"`
	Note    string         `json:"note,omitempty"`
	Summary []Summary      `json:"summary"`
	Targets []Target       `json:"targets"`
	Points  []Point        `json:"points"`
}

func main() {
	raw := flag.String("raw", "", "directory of the per-point reports (n<N>-r<ROUND>/)")
	out := flag.String("out", "", "directory for results.json, table.txt and plot.png")
	note := flag.String("note", "", "a line describing the run (flags given to the script)")
	other := flag.String("other", "", "print the other load of one point's directory (n<N>-r<ROUND>), in percent, and exit")
	flag.Parse()
	if *other != "" && flag.NArg() == 0 {
		pct, err := otherPct(*other)
		if err != nil {
			fmt.Fprintln(os.Stderr, "manyclients.d:", err)
			os.Exit(1)
		}
		fmt.Printf("%.1f\n", pct)
		return
	}
	if *raw == "" || *out == "" || flag.NArg() > 0 {
		fmt.Fprintln(os.Stderr, "usage: manyclients.d -raw DIR -out DIR [-note TEXT] | -other DIR")
		os.Exit(2)
	}
	if err := run(*raw, *out, *note); err != nil {
		fmt.Fprintln(os.Stderr, "manyclients.d:", err)
		os.Exit(1)
	}
}

// otherPct is the share of the machine's CPU, in percent, that other
// processes (and the hypervisor, as steal time) took during the point
// measured in dir.
func otherPct(dir string) (float64, error) {
	p, _, err := point(dir, 0, 0)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", dir, err)
	}
	return 100 * p.OtherCPU, nil
}

func run(rawDir, outDir, note string) error {
	res := Results{Schema: "xmx-manyclients/1", Machine: machine(), Note: note}
	dirs, err := filepath.Glob(filepath.Join(rawDir, "n*-r*"))
	if err != nil {
		return err
	}
	re := regexp.MustCompile(`^n(\d+)-r(\d+)$`)
	var cfg map[string]any
	cfgDir := ""
	for _, d := range dirs {
		m := re.FindStringSubmatch(filepath.Base(d))
		if m == nil {
			continue
		}
		n, _ := strconv.Atoi(m[1])
		r, _ := strconv.Atoi(m[2])
		p, c, err := point(d, n, r)
		if err != nil {
			return fmt.Errorf("%s: %w", d, err)
		}
		res.Points = append(res.Points, p)
		// The table and the plot describe the sweep by one configuration:
		// a directory that mixes sweeps (an earlier run's reports left in
		// raw/) must not be combined into one.
		if cfg == nil {
			cfg, cfgDir = c, filepath.Base(d)
		} else if diff := configDiff(c, cfg); len(diff) > 0 {
			return fmt.Errorf("%s: not the configuration of %s (%s): reports of different sweeps in %s? (each sweep needs a raw directory of its own)",
				d, cfgDir, strings.Join(diff, ", "), rawDir)
		}
	}
	if len(res.Points) == 0 {
		return fmt.Errorf("no reports under %s", rawDir)
	}
	if err := checkRounds(res.Points); err != nil {
		return fmt.Errorf("%s: %w", rawDir, err)
	}
	res.Config = cfg
	// The date of the measurement: the newest report.
	var newest time.Time
	for _, d := range dirs {
		if fi, err := os.Stat(filepath.Join(d, "server.json")); err == nil && fi.ModTime().After(newest) {
			newest = fi.ModTime()
		}
	}
	res.Date = newest.UTC().Format(time.RFC3339)
	slices.SortFunc(res.Points, func(a, b Point) int { return cmpInts(a.N, b.N, a.Round, b.Round) })
	res.Summary = summarize(res.Points)
	res.Targets = targets(res.Summary)

	if err := os.MkdirAll(outDir, 0o755); err != nil {
		return err
	}
	b, err := json.MarshalIndent(res, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(outDir, "results.json"), append(b, '\n'), 0o644); err != nil {
		return err
	}
	var tb strings.Builder
	table(&tb, &res)
	os.Stdout.WriteString(tb.String())
	if err := os.WriteFile(filepath.Join(outDir, "table.txt"), []byte(tb.String()), 0o644); err != nil {
		return err
	}
	return plot(&res, outDir)
}

// checkRounds checks that every client count has the same rounds: the
// table says "medians over R round(s)" for all of them, and rounds left
// over from another sweep would be medians of other runs.
func checkRounds(points []Point) error {
	rounds := map[int][]int{}
	var counts []int
	for _, p := range points {
		if _, ok := rounds[p.N]; !ok {
			counts = append(counts, p.N)
		}
		rounds[p.N] = append(rounds[p.N], p.Round)
	}
	slices.Sort(counts)
	for _, n := range counts {
		slices.Sort(rounds[n])
	}
	first := counts[0]
	for _, n := range counts[1:] {
		if !slices.Equal(rounds[n], rounds[first]) {
			return fmt.Errorf("N=%d has rounds %v, N=%d has rounds %v: every client count needs the same rounds (reports of different sweeps, or an unfinished one?)",
				n, rounds[n], first, rounds[first])
		}
	}
	return nil
}

func cmpInts(a1, b1, a2, b2 int) int {
	if a1 != b1 {
		return a1 - b1
	}
	return a2 - b2
}

// point reads the reports of one run.
func point(dir string, n, round int) (Point, map[string]any, error) {
	var s server
	if err := readJSON(filepath.Join(dir, "server.json"), &s); err != nil {
		return Point{}, nil, err
	}
	files, _ := filepath.Glob(filepath.Join(dir, "clients-h*.json"))
	if len(files) == 0 {
		return Point{}, nil, errors.New("no clients-h*.json")
	}
	p := Point{N: n, Round: round, ClientProcs: len(files),
		GoodputMBps: s.GoodputMBps, ActiveS: s.ActiveS, Messages: s.Messages, Bytes: s.Bytes,
		WireRxBytes: s.LinkStats.RxBytes, RxDropped: s.LinkStats.RxDropped + s.LinkStats.RxRingFull,
		ServerRetx: s.Counters.Retransmits, PullRequests: s.Counters.PullRequests, ServerDups: s.Counters.Duplicates,
		EagerRefused: s.Counters.EagerRefused, Unexpected: s.Counters.Unexpected, UnexpMax: s.UnexpMax,
		UnexpBound: s.UnexpBound, Fairness: s.Fairness, ServerRSSKiB: s.Proc.MaxRSSKiB,
		ServerHeapKiB: s.Proc.GoHeapMaxKiB, ServerCPUs: s.Proc.CPUs, Failed: s.Failed, PeersDead: s.Counters.PeersDead}
	if s.Sources != n {
		p.Errors = append(p.Errors, fmt.Sprintf("server heard from %d sources, want %d", s.Sources, n))
	}
	var clientSleeps int64
	hist := map[uint64]uint64{}
	perOct := 0
	var cfg map[string]any
	endpoints := 0
	for _, f := range files {
		var c clients
		if err := readJSON(f, &c); err != nil {
			return Point{}, nil, err
		}
		if cfg == nil {
			cfg = c.config()
		} else if diff := configDiff(c.config(), cfg); len(diff) > 0 {
			return Point{}, nil, fmt.Errorf("%s: not the configuration of %s (%s)", filepath.Base(f), filepath.Base(files[0]), strings.Join(diff, ", "))
		}
		endpoints += c.Endpoints
		p.ClientTxBytes += c.LinkStats.TxBytes
		p.RetransBytes += c.RetransBytes
		p.PullResent += c.PullResent
		p.Retransmits += c.Counters.Retransmits
		p.EagerConv += c.Counters.EagerConverted
		p.MaxUs = max(p.MaxUs, c.MaxUs)
		p.ClientsCPUs += c.Proc.CPUs
		clientSleeps += c.Proc.VolCtxSw
		p.Failed += c.Failed
		p.Unfinished += c.Unfinished
		p.StartLateS = max(p.StartLateS, c.StartLateS)
		for _, e := range c.Errors {
			p.Errors = append(p.Errors, filepath.Base(f)+": "+e)
		}
		perOct = c.LatPerOctave
		for _, h := range c.LatHist {
			hist[h[0]] += h[1]
		}
	}
	// A message longer than the server's receives is cut to them and still
	// counted (its delivered bytes as goodput): a sweep of messages above
	// the server's -max-size measures another experiment than it says.
	if size, _ := cfg["message_size"].(int); s.Truncated > 0 || (s.RecvSize > 0 && size > s.RecvSize) {
		p.Errors = append(p.Errors, fmt.Sprintf("server truncated %d of %d messages to its %d-byte receives (the messages are %d bytes: its -max-size is below the clients' -size)",
			s.Truncated, s.Messages, s.RecvSize, size))
	}
	if endpoints != n {
		p.Errors = append(p.Errors, fmt.Sprintf("%d client endpoints reported, want %d", endpoints, n))
	}
	p.P50us = percentile(hist, perOct, 0.50)
	p.P99us = percentile(hist, perOct, 0.99)
	if p.WireRxBytes > 0 {
		p.WireEff = float64(p.Bytes) / float64(p.WireRxBytes)
	}
	if p.Bytes > 0 {
		p.RetransPct = 100 * float64(p.RetransBytes) / float64(p.Bytes)
	}
	if cpu := p.ServerCPUs + p.ClientsCPUs; cpu > 0 {
		p.MBperCPUs = float64(p.Bytes) / 1e6 / cpu
	}
	if p.Messages > 0 {
		p.ServerSleepsPerMsg = float64(s.Proc.VolCtxSw) / float64(p.Messages)
		p.ClientsSleepsPerMsg = float64(clientSleeps) / float64(p.Messages)
	}
	p.OtherCPU, p.Load1 = cpuOther(filepath.Join(dir, "cpu.txt"), p.ServerCPUs+p.ClientsCPUs)
	cfg["server_recvs_posted"] = s.Recvs
	cfg["server_recv_size"] = s.RecvSize
	cfg["unexpected_bound"] = s.UnexpBound
	cfg["server_link"] = strings.TrimSpace(s.Link.Kind + " " + s.Link.Mode)
	cfg["server_mtu"] = s.Link.MTU
	return p, cfg, nil
}

func readJSON(file string, v any) error {
	b, err := os.ReadFile(file)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("%s: %v", file, err)
	}
	return nil
}

// percentile reads quantile q from a merged latency histogram (bucket b >
// 0 holds [2^((b-1)/per), 2^(b/per)) µs; its geometric middle is
// returned).
func percentile(hist map[uint64]uint64, per int, q float64) float64 {
	var total uint64
	keys := make([]uint64, 0, len(hist))
	for k, c := range hist {
		keys = append(keys, k)
		total += c
	}
	if total == 0 || per == 0 {
		return 0
	}
	slices.Sort(keys)
	rank := uint64(math.Ceil(q * float64(total)))
	var cum uint64
	for _, k := range keys {
		cum += hist[k]
		if cum >= rank {
			if k == 0 {
				return 0.5
			}
			return math.Exp2((float64(k) - 0.5) / float64(per))
		}
	}
	return 0
}

// cpuOther reads cpu.txt ("before|after EPOCH cpu USER NICE SYSTEM IDLE
// IOWAIT IRQ SOFTIRQ STEAL ...", "clk_tck N", "loadavg L1 ...") and
// returns the share of the machine's CPU time not used by ours (CPU
// seconds) and the 1-minute load average before the point.
func cpuOther(file string, ours float64) (float64, float64) {
	f, err := os.Open(file)
	if err != nil {
		return 0, 0
	}
	defer f.Close()
	type snap struct {
		t          float64
		busy, idle float64
	}
	var before, after snap
	tck, load := 100.0, 0.0
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		w := strings.Fields(sc.Text())
		switch {
		case len(w) >= 8 && (w[0] == "before" || w[0] == "after") && w[2] == "cpu":
			var s snap
			s.t, _ = strconv.ParseFloat(w[1], 64)
			for i, v := range w[3:] {
				x, _ := strconv.ParseFloat(v, 64)
				switch {
				case i == 3 || i == 4: // idle, iowait
					s.idle += x
				case i < 8: // user nice system irq softirq steal (not guest: counted in user)
					s.busy += x
				}
			}
			if w[0] == "before" {
				before = s
			} else {
				after = s
			}
		case len(w) == 2 && w[0] == "clk_tck":
			tck, _ = strconv.ParseFloat(w[1], 64)
		case len(w) >= 2 && w[0] == "loadavg":
			load, _ = strconv.ParseFloat(w[1], 64)
		}
	}
	wall := after.t - before.t
	total := (after.busy + after.idle - before.busy - before.idle) / tck
	if wall <= 0 || total <= 0 {
		return 0, load
	}
	busy := (after.busy - before.busy) / tck
	return max(0, busy-ours) / total, load
}

// summarize takes the median over rounds per client count.
func summarize(points []Point) []Summary {
	var out []Summary
	for i := 0; i < len(points); {
		j := i
		for j < len(points) && points[j].N == points[i].N {
			j++
		}
		group := points[i:j]
		s := Summary{Rounds: len(group)}
		s.Point = medianPoint(group)
		s.Round = 0
		s.GoodputMin, s.GoodputMax = math.Inf(1), 0
		s.P99Min, s.P99Max = math.Inf(1), 0
		for _, p := range group {
			s.GoodputMin, s.GoodputMax = min(s.GoodputMin, p.GoodputMBps), max(s.GoodputMax, p.GoodputMBps)
			s.P99Min, s.P99Max = min(s.P99Min, p.P99us), max(s.P99Max, p.P99us)
			s.Goodputs = append(s.Goodputs, p.GoodputMBps)
			s.Errors = append(s.Errors, p.Errors...)
		}
		out = append(out, s)
		i = j
	}
	return out
}

// medianPoint is the median of every numeric field (failures and maxima:
// the largest) of the points.
func medianPoint(ps []Point) Point {
	m := ps[0]
	m.Errors = nil
	med := func(get func(Point) float64) float64 {
		v := make([]float64, len(ps))
		for i, p := range ps {
			v[i] = get(p)
		}
		return median(v)
	}
	mx := func(get func(Point) float64) float64 {
		r := 0.0
		for _, p := range ps {
			r = max(r, get(p))
		}
		return r
	}
	u := func(x float64) uint64 { return uint64(math.Round(x)) }
	m.GoodputMBps = med(func(p Point) float64 { return p.GoodputMBps })
	m.ActiveS = med(func(p Point) float64 { return p.ActiveS })
	m.Messages = u(med(func(p Point) float64 { return float64(p.Messages) }))
	m.Bytes = u(med(func(p Point) float64 { return float64(p.Bytes) }))
	m.WireRxBytes = u(med(func(p Point) float64 { return float64(p.WireRxBytes) }))
	m.WireEff = med(func(p Point) float64 { return p.WireEff })
	m.ClientTxBytes = u(med(func(p Point) float64 { return float64(p.ClientTxBytes) }))
	m.RxDropped = u(med(func(p Point) float64 { return float64(p.RxDropped) }))
	m.RetransBytes = u(med(func(p Point) float64 { return float64(p.RetransBytes) }))
	m.RetransPct = med(func(p Point) float64 { return p.RetransPct })
	m.PullResent = u(med(func(p Point) float64 { return float64(p.PullResent) }))
	m.Retransmits = u(med(func(p Point) float64 { return float64(p.Retransmits) }))
	m.ServerRetx = u(med(func(p Point) float64 { return float64(p.ServerRetx) }))
	m.PullRequests = u(med(func(p Point) float64 { return float64(p.PullRequests) }))
	m.ServerDups = u(med(func(p Point) float64 { return float64(p.ServerDups) }))
	m.EagerRefused = u(med(func(p Point) float64 { return float64(p.EagerRefused) }))
	m.EagerConv = u(med(func(p Point) float64 { return float64(p.EagerConv) }))
	m.Unexpected = u(med(func(p Point) float64 { return float64(p.Unexpected) }))
	m.P50us = med(func(p Point) float64 { return p.P50us })
	m.P99us = med(func(p Point) float64 { return p.P99us })
	m.Fairness = med(func(p Point) float64 { return p.Fairness })
	m.ServerCPUs = med(func(p Point) float64 { return p.ServerCPUs })
	m.ClientsCPUs = med(func(p Point) float64 { return p.ClientsCPUs })
	m.OtherCPU = med(func(p Point) float64 { return p.OtherCPU })
	m.MBperCPUs = med(func(p Point) float64 { return p.MBperCPUs })
	m.ServerSleepsPerMsg = med(func(p Point) float64 { return p.ServerSleepsPerMsg })
	m.ClientsSleepsPerMsg = med(func(p Point) float64 { return p.ClientsSleepsPerMsg })
	m.Load1 = med(func(p Point) float64 { return p.Load1 })
	m.UnexpMax = int(mx(func(p Point) float64 { return float64(p.UnexpMax) }))
	m.MaxUs = mx(func(p Point) float64 { return p.MaxUs })
	m.ServerRSSKiB = int64(mx(func(p Point) float64 { return float64(p.ServerRSSKiB) }))
	m.ServerHeapKiB = u(mx(func(p Point) float64 { return float64(p.ServerHeapKiB) }))
	m.Failed = u(mx(func(p Point) float64 { return float64(p.Failed) }))
	m.Unfinished = u(mx(func(p Point) float64 { return float64(p.Unfinished) }))
	m.PeersDead = u(mx(func(p Point) float64 { return float64(p.PeersDead) }))
	m.StartLateS = mx(func(p Point) float64 { return p.StartLateS })
	return m
}

// targets checks the acceptance targets on the medians. The medians only
// stand for N clients when every point had them all: a count where sends
// failed or never finished, the server lost a peer or a point has an error
// (a client the server never heard from, truncated messages) fails the
// completeness target, and every other target with it, since goodput,
// retransmissions and memory measured over fewer clients or less data can
// only look better. With one client count the goodput target has nothing
// to compare with and is not applicable.
func targets(sum []Summary) []Target {
	best, bestN := 0.0, 0
	worstPct, worstN := 0.0, 0
	unexpOver := 0
	var incomplete, incompleteN []string
	for _, s := range sum {
		if s.GoodputMBps > best {
			best, bestN = s.GoodputMBps, s.N
		}
		if s.RetransPct >= worstPct {
			worstPct, worstN = s.RetransPct, s.N
		}
		if s.UnexpBound > 0 && s.UnexpMax > s.UnexpBound {
			unexpOver++
		}
		if why := incompleteWhy(s); why != "" {
			incomplete = append(incomplete, fmt.Sprintf("N=%d: %s", s.N, why))
			incompleteN = append(incompleteN, fmt.Sprintf("N=%d", s.N))
		}
	}
	complete := len(incomplete) == 0
	// notMet is what a target's detail adds when the sweep is incomplete.
	notMet := ""
	if !complete {
		notMet = fmt.Sprintf("; FAILS: incomplete client counts (%s; see the first target)", strings.Join(incompleteN, ", "))
	}
	first, last := sum[0], sum[len(sum)-1]
	ratio := 0.0
	if best > 0 {
		ratio = last.GoodputMBps / best
	}
	spread := ""
	if lo, hi, ok := ratioInterval(sum, 0.9); ok {
		spread = fmt.Sprintf("; %.2f..%.2f with 90 %% confidence (bootstrap over rounds)", lo, hi)
	}
	growth := float64(last.ServerRSSKiB-first.ServerRSSKiB) / 1024
	bound := float64(last.UnexpBound) / (1 << 20)
	completeness := Target{Name: "every client sent and was heard at every N", Value: float64(len(incomplete)), Limit: 0, Pass: complete,
		Detail: fmt.Sprintf("all %d client count(s) complete: no failed or unfinished sends, lost peers or point errors", len(sum))}
	if !complete {
		completeness.Detail = fmt.Sprintf("%d of %d client count(s) incomplete: %s", len(incomplete), len(sum), strings.Join(incomplete, "; "))
	}
	goodput := Target{Name: fmt.Sprintf("goodput at N=%d >= 0.95 x best", last.N), Value: ratio, Limit: 0.95, Pass: complete && ratio >= 0.95,
		Detail: fmt.Sprintf("%.2f: %.0f MB/s at N=%d; best %.0f MB/s at N=%d (medians over rounds)%s%s", ratio, last.GoodputMBps, last.N, best, bestN, spread, notMet)}
	if len(sum) == 1 {
		goodput = Target{Name: goodput.Name, Limit: 0.95, NotApplicable: true,
			Detail: fmt.Sprintf("not applicable: N=%d is the only client count, so it is its own best (%.0f MB/s); sweep several counts (--counts) to compare", last.N, last.GoodputMBps)}
	}
	return []Target{
		completeness,
		goodput,
		{Name: "retransmitted bytes <= 1 % of goodput at every N", Value: worstPct, Limit: 1, Pass: complete && worstPct <= 1,
			Detail: fmt.Sprintf("worst %.2f %% at N=%d%s", worstPct, worstN, notMet)},
		{Name: "server memory bounded", Value: growth, Limit: bound, Pass: complete && unexpOver == 0 && growth <= bound,
			Detail: fmt.Sprintf("unexpected bytes above the %.0f MiB bound at %d of %d client counts; peak RSS %.1f MiB at N=%d, %.1f MiB at N=%d (growth %.1f MiB, limit: the unexpected bound); Go heap peak %.1f MiB at N=%d%s",
				bound, unexpOver, len(sum), float64(first.ServerRSSKiB)/1024, first.N, float64(last.ServerRSSKiB)/1024, last.N, growth,
				float64(last.ServerHeapKiB)/1024, last.N, notMet)},
	}
}

// incompleteWhy says why a client count's medians do not stand for N
// clients (failed or unfinished sends, peers the server declared dead,
// the points' errors, each error once), or "" when nothing went wrong.
// The counts are the worst round's (Summary keeps the largest).
func incompleteWhy(s Summary) string {
	var why []string
	worst := ""
	if s.Rounds > 1 {
		worst = " in the worst round"
	}
	if s.Failed > 0 {
		why = append(why, fmt.Sprintf("failed sends or receives: %d%s", s.Failed, worst))
	}
	if s.Unfinished > 0 {
		why = append(why, fmt.Sprintf("unfinished sends: %d%s", s.Unfinished, worst))
	}
	if s.PeersDead > 0 {
		why = append(why, fmt.Sprintf("peers dead at the server: %d%s", s.PeersDead, worst))
	}
	var seen []string
	for _, e := range s.Errors {
		if !slices.Contains(seen, e) {
			seen = append(seen, e)
			why = append(why, e)
		}
	}
	return strings.Join(why, ", ")
}

// ratioInterval is the two-sided confidence interval (conf, e.g. 0.9) of
// the goodput target's ratio, the last count's median over the best
// median, by the percentile bootstrap: each draw resamples every count's
// rounds with replacement and takes the ratio of the medians again, best
// count included (the largest of several noisy medians is biased upwards,
// and so is each draw's). The draws are seeded: the same rounds give the
// same interval. ok is false below three rounds per count.
func ratioInterval(sum []Summary, conf float64) (lo, hi float64, ok bool) {
	const draws = 4000
	for _, s := range sum {
		if len(s.Goodputs) < 3 {
			return 0, 0, false
		}
	}
	rng := rand.New(rand.NewPCG(1, 2))
	ratios := make([]float64, 0, draws)
	var sample []float64
	for range draws {
		best, last := 0.0, 0.0
		for _, s := range sum {
			sample = sample[:0]
			for range s.Goodputs {
				sample = append(sample, s.Goodputs[rng.IntN(len(s.Goodputs))])
			}
			last = median(sample)
			best = max(best, last)
		}
		if best > 0 {
			ratios = append(ratios, last/best)
		}
	}
	if len(ratios) == 0 {
		return 0, 0, false
	}
	slices.Sort(ratios)
	tail := (1 - conf) / 2
	at := func(q float64) float64 { return ratios[min(len(ratios)-1, int(q*float64(len(ratios))))] }
	return at(tail), at(1 - tail), true
}

// median returns the median of v, which it sorts.
func median(v []float64) float64 {
	slices.Sort(v)
	if len(v)%2 == 1 {
		return v[len(v)/2]
	}
	return (v[len(v)/2-1] + v[len(v)/2]) / 2
}

// table writes the sweep as table.txt shows it.
func table(w io.Writer, res *Results) {
	fmt.Fprintf(w, "# xmx manyclients, %s; %v\n", res.Date, res.Machine["summary"])
	fmt.Fprintf(w, "# %v-byte messages, window %v per client, %v s per point, server: %v receives posted, unexpected bound %v B, rendezvous %v\n",
		res.Config["message_size"], res.Config["window"], res.Config["duration_s"], res.Config["server_recvs_posted"],
		res.Config["unexpected_bound"], res.Config["rendezvous"])
	if res.Note != "" {
		fmt.Fprintf(w, "# %s\n", res.Note)
	}
	fmt.Fprintf(w, "# medians over %d round(s); goodput range min..max; retrans = data sent more than once (clients' estimate)\n", res.Summary[0].Rounds)
	fmt.Fprintf(w, "%4s %8s %15s %6s %9s %7s %7s %8s %8s %9s %9s %8s %8s %6s %7s %7s\n",
		"N", "MB/s", "range", "wire%", "retransMB", "retr%", "refused", "p50 ms", "p99 ms", "unexpKiB", "drops", "RSS MiB", "heapMiB", "other", "MB/cpus", "slp/msg")
	for _, s := range res.Summary {
		fmt.Fprintf(w, "%4d %8.1f %7.0f..%-7.0f %6.2f %9.1f %7.2f %7d %8.2f %8.2f %9d %9d %8.1f %8.1f %5.0f%% %7.0f %7.2f\n",
			s.N, s.GoodputMBps, s.GoodputMin, s.GoodputMax, 100*s.WireEff, float64(s.RetransBytes)/1e6, s.RetransPct,
			s.EagerRefused, s.P50us/1e3, s.P99us/1e3, s.UnexpMax/1024, s.RxDropped,
			float64(s.ServerRSSKiB)/1024, float64(s.ServerHeapKiB)/1024, 100*s.OtherCPU, s.MBperCPUs,
			s.ServerSleepsPerMsg+s.ClientsSleepsPerMsg)
	}
	fmt.Fprintln(w, "# wire% = goodput / bytes the server's link received; drops = frames the server's socket lost (fill ring empty);")
	fmt.Fprintln(w, "# other = share of the machine's CPU used by other processes during the point;")
	fmt.Fprintln(w, "# MB/cpus = payload delivered per CPU-second of this experiment's processes (goodput with the other load taken out);")
	fmt.Fprintln(w, "# slp/msg = times the server and client processes slept (voluntary context switches) per message delivered")
	for _, t := range res.Targets {
		verdict := "FAIL"
		switch {
		case t.NotApplicable:
			verdict = "n/a"
		case t.Pass:
			verdict = "pass"
		}
		fmt.Fprintf(w, "target %-50s %s: %s\n", t.Name, verdict, t.Detail)
	}
	for _, s := range res.Summary {
		if s.Failed > 0 || s.Unfinished > 0 || s.PeersDead > 0 || len(s.Errors) > 0 {
			fmt.Fprintf(w, "N=%d: failed %d, unfinished %d, server peers dead %d %v\n", s.N, s.Failed, s.Unfinished, s.PeersDead, s.Errors)
		}
	}
}

// machine describes the machine the sweep ran on.
func machine() map[string]any {
	m := map[string]any{"nproc": runtime.NumCPU()}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m["kernel"] = strings.TrimSpace(string(b))
	}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(l, "model name"); ok {
				m["cpu"] = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(v), ":"))
				break
			}
		}
	}
	m["summary"] = fmt.Sprintf("%d x %v, Linux %v", m["nproc"], m["cpu"], m["kernel"])
	return m
}

// plot draws plot.png: goodput, completion times and waste against N.
func plot(res *Results, outDir string) error {
	gp, err := exec.LookPath("gnuplot")
	if err != nil {
		return errors.New("gnuplot not found (Debian package gnuplot-nox): no plot")
	}
	tmp, err := os.MkdirTemp("", "manyclients-plot-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	data := filepath.Join(tmp, "summary.dat")
	pts := filepath.Join(tmp, "points.dat")
	var d, pd strings.Builder
	for _, s := range res.Summary {
		fmt.Fprintf(&d, "%d %g %g %g %g %g %g %g %g %g %g\n", s.N, s.GoodputMBps, s.GoodputMin, s.GoodputMax,
			s.P50us/1e3, s.P99us/1e3, s.P99Min/1e3, s.P99Max/1e3, s.RetransPct, 100*(1-s.WireEff), s.MBperCPUs)
	}
	for _, p := range res.Points {
		fmt.Fprintf(&pd, "%d %g %g\n", p.N, p.GoodputMBps, p.P99us/1e3)
	}
	if err := os.WriteFile(data, []byte(d.String()), 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(pts, []byte(pd.String()), 0o644); err != nil {
		return err
	}
	script := filepath.Join(tmp, "plot.gp")
	if err := os.WriteFile(script, []byte(plotScript(res, data, pts, filepath.Join(outDir, "plot.png"))), 0o644); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if said, err := exec.CommandContext(ctx, gp, script).CombinedOutput(); err != nil {
		return fmt.Errorf("gnuplot: %v: %s", err, said)
	}
	return nil
}

// plotScript is the gnuplot script plot runs: data is the summary (one
// line per count), pts every point, png the image to write.
func plotScript(res *Results, data, pts, png string) string {
	q := func(s string) string { return strconv.Quote(s) }
	var tics []string
	for _, s := range res.Summary {
		tics = append(tics, fmt.Sprintf("%q %d", strconv.Itoa(s.N), s.N))
	}
	maxN := res.Summary[len(res.Summary)-1].N
	title := fmt.Sprintf("xmx: N clients write %v-byte messages to one server (window %v each, %v receives posted)\\n%s; %s; median of %d round(s), bars min..max",
		res.Config["message_size"], res.Config["window"], res.Config["server_recvs_posted"], res.Date[:10], res.Machine["summary"], res.Summary[0].Rounds)
	var b strings.Builder
	fmt.Fprintf(&b, "set terminal pngcairo size 1200,1300 font %s noenhanced\nset encoding utf8\nset output %s\n",
		q("DejaVu Sans,12"), q(png))
	fmt.Fprintf(&b, "set multiplot layout 3,1 title \"%s\" font \"DejaVu Sans,13\"\n", title)
	fmt.Fprintf(&b, "set logscale x 2\nset xrange [0.8:%g]\nset xtics (%s)\nset grid xtics ytics lc rgb '#d0d0d0'\nset key top right box opaque\nset offsets graph 0, graph 0, graph 0.3, graph 0\n",
		float64(maxN)*1.25, strings.Join(tics, ", "))
	fmt.Fprintf(&b, "set ylabel 'goodput at the server (MB/s)'\nset yrange [0:*]\nset y2label 'MB per CPU-second of the experiment'\nset y2range [0:*]\nset y2tics\nset ytics nomirror\nset key bottom right box opaque\n")
	fmt.Fprintf(&b, "plot %s using 1:2:3:4 with yerrorlines lw 3 pt 7 lc rgb '#d62728' title 'goodput (median, min..max)', %s using 1:2 with points pt 6 ps 1.2 lc rgb '#7f7f7f' title 'each round', %s using 1:11 axes x1y2 with linespoints lw 2 dt 2 pt 4 lc rgb '#8c564b' title 'MB per CPU-second (right axis; other load taken out)'\n",
		q(data), q(pts), q(data))
	b.WriteString("unset y2label\nunset y2tics\nset ytics mirror\n")
	fmt.Fprintf(&b, "set ylabel 'completion time, Isend to done (ms, log)'\nset logscale y 10\nset yrange [*:*]\nset offsets graph 0, graph 0, 0, 0\nset key top left box opaque\n")
	fmt.Fprintf(&b, "plot %s using 1:6:7:8 with yerrorlines lw 3 pt 5 lc rgb '#1f77b4' title 'p99', %s using 1:5 with linespoints lw 2 pt 7 lc rgb '#2ca02c' title 'p50'\n",
		q(data), q(data))
	// The two series are shares of different wholes: the data sent more
	// than once of goodput, the rest of what the link received of all it
	// received (1 - wire efficiency).
	fmt.Fprintf(&b, "unset logscale y\nset ylabel 'percent'\nset xlabel 'clients (N)'\nset yrange [0:*]\nset offsets graph 0, graph 0, graph 0.45, graph 0\nset key top left box opaque\n")
	wire := "received bytes not goodput (1 - wire efficiency, % of received bytes"
	if pct, ok := headersPct(cfgInt(res.Config, "message_size"), cfgInt(res.Config, "mtu"), res.Config["rendezvous"] == true); ok {
		wire += fmt.Sprintf("; headers alone: %.2f", pct)
	}
	wire += ")"
	fmt.Fprintf(&b, "plot %s using 1:9 with linespoints lw 3 pt 7 lc rgb '#ff7f0e' title 'data sent more than once (%% of goodput)', %s using 1:10 with linespoints lw 2 pt 5 lc rgb '#9467bd' title %s, 1 with lines dt 2 lc rgb '#000000' title '1 %% target (data sent more than once)'\n",
		q(data), q(data), q(wire))
	b.WriteString("unset multiplot\n")
	return b.String()
}

// Headers of the frames the server receives for a message
// (msglayer/wire.go): the Ethernet header (the link's RxBytes count whole
// frames) and the 24-byte common header on every frame, the pull reply's
// 8-byte or the eager fragment's 16-byte header on each data frame, and,
// by rendezvous, one record frame without data (a 16-byte header, padded
// to the 60-byte minimum frame).
const (
	ethHeaderLen     = 14
	pullFrameHeaders = ethHeaderLen + 24 + 8
	eagerFrameHeader = ethHeaderLen + 24 + 16
	rndvRecordFrame  = max(ethHeaderLen+24+16, 60)
)

// headersPct is the share of the bytes the server's link receives, in
// percent, that the headers of one size-byte message take at mtu (its data
// frames: pull replies if rndv, with the rendezvous record, eager
// fragments otherwise): the floor of 1 - wire efficiency, with acks and
// retransmissions left out. ok is false without a size or a usable MTU.
func headersPct(size, mtu int, rndv bool) (float64, bool) {
	hdr, once := eagerFrameHeader, 0
	if rndv {
		hdr, once = pullFrameHeaders, rndvRecordFrame
	}
	payload := mtu + ethHeaderLen - hdr
	if size <= 0 || payload <= 0 {
		return 0, false
	}
	frames := (size + payload - 1) / payload
	headers := frames*hdr + once
	return 100 * float64(headers) / float64(size+headers), true
}

// cfgInt reads an integer of the configuration: an int when run() made it,
// a float64 when it came from JSON; 0 when absent.
func cfgInt(cfg map[string]any, key string) int {
	switch v := cfg[key].(type) {
	case int:
		return v
	case float64:
		return int(v)
	}
	return 0
}
