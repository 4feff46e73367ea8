package main

// The results model: what results.json holds. A system is one column of the
// tables and one line of the plots; xmx rows (see xmxSystems) are systems
// like any other, with Side "xmx".

import (
	"fmt"
	"math"
	"slices"
	"sort"
)

const schemaVersion = "xmx-bench/1"

// Metric names (keys in results.json and table titles).
const (
	Latency   = "latency"   // one-way latency in µs (half the round trip)
	Bandwidth = "bandwidth" // payload MB/s, MB = 10^6 bytes
)

// Sides of the comparison: ratio columns are "xmx-side ÷ peer".
const (
	SideXMX  = "xmx"  // xmx itself and its raw link floor
	SidePeer = "peer" // what a user would pick instead
)

// Results is results.json.
type Results struct {
	Schema      string        `json:"schema"`
	Date        string        `json:"date"` // RFC 3339, UTC, start of the run
	DurationSec float64       `json:"duration_s"`
	Command     string        `json:"command"`
	Options     Options       `json:"options"`
	Machine     Machine       `json:"machine"`
	Lab         LabInfo       `json:"lab"`
	Units       Units         `json:"units"`
	Interrupted bool          `json:"interrupted,omitempty"`
	Systems     []*SystemData `json:"systems"`
	Failures    []Failure     `json:"failures"`
	Notes       []string      `json:"notes,omitempty"`
}

// Options are the knobs of the run.
type Options struct {
	Quick   bool     `json:"quick"`
	Rounds  int      `json:"rounds"`
	Sizes   []int    `json:"sizes"`
	Only    []string `json:"only,omitempty"`
	Pinning string   `json:"pinning"`
}

// Machine describes where the run happened.
type Machine struct {
	Hostname string `json:"hostname"`
	Nproc    int    `json:"nproc"`
	Kernel   string `json:"kernel"`
	CPUModel string `json:"cpu_model"`
	OS       string `json:"os"`
	MemTotal string `json:"mem_total,omitempty"`
	// /proc/loadavg (1, 5, 15 min) when the run started and ended: the
	// machine is shared, and busy-polling peers suffer most from other load.
	LoadStart string `json:"loadavg_start"`
	LoadEnd   string `json:"loadavg_end"`
	Go        string `json:"go"`
}

// LabInfo describes the lab the peers ran in.
type LabInfo struct {
	Name      string `json:"name"`
	Topology  string `json:"topology"`
	MTU       int    `json:"mtu"`
	Server    string `json:"server"` // namespace and IP of the server side
	Client    string `json:"client"`
	LinkFloor string `json:"link_floor,omitempty"` // how the link floor was measured
}

// Units spells out the units of every number in the file.
type Units struct {
	Latency   string `json:"latency"`
	Bandwidth string `json:"bandwidth"`
}

// SystemData is one system: its description and its measured points.
type SystemData struct {
	Name     string   `json:"name"`  // short id: "ucx", "sockperf-udp", "link-spin", "xmx-spin"
	Label    string   `json:"label"` // legend text
	Side     string   `json:"side"`  // "xmx" or "peer"
	Tool     string   `json:"tool"`  // command line shape
	Version  string   `json:"version,omitempty"`
	Metrics  []string `json:"metrics"`
	Notes    []string `json:"notes,omitempty"`
	Disabled string   `json:"disabled,omitempty"` // why it was not run at all

	// Results[metric] holds one point per requested size (sizes the system
	// cannot do are absent and listed in Skipped).
	Results map[string][]*Point `json:"results"`
	Skipped []Skip              `json:"skipped,omitempty"`
}

// Skip records a size a system cannot run at.
type Skip struct {
	Metric string `json:"metric"`
	Size   int    `json:"size"`
	Reason string `json:"reason"`
}

// Point is one (system, metric, size): the median over rounds of each
// per-round value, plus the per-round values themselves.
type Point struct {
	Size     int      `json:"size"`                // requested message size, bytes
	SizeUsed int      `json:"size_used,omitempty"` // set when the tool ran at another size (sockperf's 14-byte minimum, datagram caps)
	P50us    *float64 `json:"p50_us,omitempty"`
	P99us    *float64 `json:"p99_us,omitempty"`
	MeanUs   *float64 `json:"mean_us,omitempty"`
	MinUs    *float64 `json:"min_us,omitempty"`
	MBps     *float64 `json:"mbps,omitempty"`
	Failed   int      `json:"failed_rounds,omitempty"`
	Rounds   []Sample `json:"rounds"`
}

// Sample is one measurement: one tool run (or one linkbench row).
type Sample struct {
	Round    int                `json:"round"`
	SizeUsed int                `json:"size_used"`
	P50us    *float64           `json:"p50_us,omitempty"`
	P99us    *float64           `json:"p99_us,omitempty"`
	MeanUs   *float64           `json:"mean_us,omitempty"`
	MinUs    *float64           `json:"min_us,omitempty"`
	MBps     *float64           `json:"mbps,omitempty"`
	Extra    map[string]float64 `json:"extra,omitempty"` // tool-specific: loss_pct, iterations, observations...
	WallSec  float64            `json:"wall_s"`
}

// Failure is one measurement that did not produce a number.
type Failure struct {
	System  string `json:"system"`
	Metric  string `json:"metric,omitempty"`
	Size    int    `json:"size,omitempty"`
	Round   int    `json:"round,omitempty"`
	Tool    string `json:"tool"`
	Command string `json:"command"`
	Error   string `json:"error"`
	Stderr  string `json:"stderr_tail,omitempty"`
}

func f64(v float64) *float64 { return &v }

// point returns the point of (metric, size), creating it.
func (s *SystemData) point(metric string, size int) *Point {
	if s.Results == nil {
		s.Results = map[string][]*Point{}
	}
	for _, p := range s.Results[metric] {
		if p.Size == size {
			return p
		}
	}
	p := &Point{Size: size}
	s.Results[metric] = append(s.Results[metric], p)
	sort.Slice(s.Results[metric], func(i, j int) bool { return s.Results[metric][i].Size < s.Results[metric][j].Size })
	return p
}

// lookup returns the point of (metric, size) or nil.
func (s *SystemData) lookup(metric string, size int) *Point {
	for _, p := range s.Results[metric] {
		if p.Size == size {
			return p
		}
	}
	return nil
}

func (s *SystemData) has(metric string) bool { return slices.Contains(s.Metrics, metric) }

// aggregate sets the point's summary fields: the median of each per-round
// value over the rounds that produced it.
func (p *Point) aggregate() {
	pick := func(get func(Sample) *float64) *float64 {
		var xs []float64
		for _, s := range p.Rounds {
			if v := get(s); v != nil && !math.IsNaN(*v) {
				xs = append(xs, *v)
			}
		}
		if len(xs) == 0 {
			return nil
		}
		return f64(median(xs))
	}
	p.P50us = pick(func(s Sample) *float64 { return s.P50us })
	p.P99us = pick(func(s Sample) *float64 { return s.P99us })
	p.MeanUs = pick(func(s Sample) *float64 { return s.MeanUs })
	p.MinUs = pick(func(s Sample) *float64 { return s.MinUs })
	p.MBps = pick(func(s Sample) *float64 { return s.MBps })
	p.SizeUsed = 0
	for _, s := range p.Rounds {
		if s.SizeUsed != 0 && s.SizeUsed != p.Size {
			p.SizeUsed = s.SizeUsed
		}
	}
}

// value returns the figure a table or plot shows for (metric, stat) and
// whether it is a stand-in (a mean shown in a p50 table).
func (p *Point) value(metric, stat string) (v float64, mean, ok bool) {
	if p == nil {
		return 0, false, false
	}
	switch {
	case metric == Bandwidth:
		if p.MBps != nil {
			return *p.MBps, false, true
		}
	case stat == "p99":
		if p.P99us != nil {
			return *p.P99us, false, true
		}
	case stat == "mean":
		if p.MeanUs != nil {
			return *p.MeanUs, false, true
		}
	default:
		if p.P50us != nil {
			return *p.P50us, false, true
		}
		if p.MeanUs != nil {
			return *p.MeanUs, true, true
		}
	}
	return 0, false, false
}

// spread returns the smallest and largest per-round value behind value().
func (p *Point) spread(metric, stat string) (lo, hi float64, ok bool) {
	first := true
	for _, s := range p.Rounds {
		var v *float64
		switch {
		case metric == Bandwidth:
			v = s.MBps
		case stat == "p99":
			v = s.P99us
		case stat == "mean":
			v = s.MeanUs
		default:
			v = s.P50us
			if p.P50us == nil {
				v = s.MeanUs
			}
		}
		if v == nil {
			continue
		}
		if first {
			lo, hi, first = *v, *v, false
		}
		lo, hi = min(lo, *v), max(hi, *v)
	}
	return lo, hi, !first
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

// sizeLabel prints a byte count as 8, 64, 1K, 64K, 1M (powers of 1024 when exact).
func sizeLabel(n int) string {
	switch {
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%dM", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%dK", n>>10)
	}
	return fmt.Sprint(n)
}
