package main

// The printed tables: one per metric (sizes as rows, systems as columns),
// each followed by one ratio block per xmx-side system ("X ÷ peer"); the
// bandwidth table also has one block per xmx row against the raw link floor
// of the same run ("X ÷ link floor", the link-* columns).

import (
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"text/tabwriter"
)

// tableSpec is one printed table.
type tableSpec struct {
	metric, stat string
	title        string
	ratioNote    string // how to read a ratio
	file         string // plot file name
	ylabel       string
}

var tableSpecs = []tableSpec{
	{Latency, "p50", "One-way latency p50 (µs, half the round trip; lower is better)", "< 1: %s is faster", "latency.png", "one-way latency p50, µs (half the round trip)"},
	{Latency, "p99", "One-way latency p99 (µs, half the round trip; lower is better)", "< 1: %s is faster", "latency_p99.png", "one-way latency p99, µs (half the round trip)"},
	{Latency, "mean", "One-way latency mean (µs, half the round trip; lower is better; the one figure every tool gives)", "< 1: %s is faster", "", ""},
	{Bandwidth, "", "Bandwidth (MB/s of payload, MB = 10^6 bytes; higher is better)", "> 1: %s is faster", "bandwidth.png", "bandwidth, MB/s (10^6 bytes of payload per second)"},
}

// columns returns the systems that have something to show in the table.
func (t tableSpec) columns(res *Results) []*SystemData {
	var cols []*SystemData
	for _, s := range res.Systems {
		if !s.has(t.metric) {
			continue
		}
		if t.stat == "p99" || t.stat == "mean" {
			// Skip systems whose tool does not give this figure, unless failed.
			shows := false
			for _, p := range s.Results[t.metric] {
				if _, _, ok := p.value(t.metric, t.stat); ok || len(p.Rounds) == 0 {
					shows = true
				}
			}
			if !shows && s.Disabled == "" {
				continue
			}
		}
		cols = append(cols, s)
	}
	// xmx side first, in listing order.
	slices.SortStableFunc(cols, func(a, b *SystemData) int { return sideRank(a.Side) - sideRank(b.Side) })
	return cols
}

func sideRank(side string) int {
	if side == SideXMX {
		return 0
	}
	return 1
}

// cell formats one table cell and returns the markers it used.
func cell(s *SystemData, metric, stat string, size int) (string, string) {
	if s.Disabled != "" {
		return "off", ""
	}
	for _, sk := range s.Skipped {
		if sk.Metric == metric && sk.Size == size {
			return "n/a", ""
		}
	}
	p := s.lookup(metric, size)
	if p == nil {
		return "-", ""
	}
	v, mean, ok := p.value(metric, stat)
	if !ok {
		if len(p.Rounds) == 0 && p.Failed > 0 {
			return "FAIL", ""
		}
		return "-", ""
	}
	str, marks := fmtNum(v), ""
	if mean {
		str += "†"
		marks += "†"
	}
	if p.SizeUsed != 0 && p.SizeUsed != size {
		str += "*"
		marks += "*"
	}
	if p.Failed > 0 {
		str += "!"
		marks += "!"
	}
	return str, marks
}

// isLink reports a raw link floor row (xmx linkbench).
func isLink(s *SystemData) bool { return strings.HasPrefix(s.Name, "link-") }

// ratioMarks is the markers a ratio of two cells carries: those of either
// cell (see cell), each once, in the table's order. A ratio is only a clean
// comparison when both cells are: a p50 over a mean (†), sides at
// different sizes (*) or a point whose rounds failed (!) must not read as
// one.
func ratioMarks(xMarks, dMarks string) string {
	var m string
	for _, r := range "†*!" {
		if strings.ContainsRune(xMarks, r) || strings.ContainsRune(dMarks, r) {
			m += string(r)
		}
	}
	return m
}

// ratioBlocks prints, for each column x that is numerator, a block of x's
// value divided by every column that is denominator, size by size; each
// ratio carries the markers of the two cells it divides (ratioMarks),
// explained under the block.
func ratioBlocks(w io.Writer, res *Results, t tableSpec, cols []*SystemData, what, note string, numerator, denominator func(*SystemData) bool) {
	var dens []*SystemData
	for _, c := range cols {
		if denominator(c) {
			dens = append(dens, c)
		}
	}
	if len(dens) == 0 {
		return
	}
	for _, x := range cols {
		if !numerator(x) || x.Disabled != "" {
			continue
		}
		metric := "latency " + t.stat
		if t.metric == Bandwidth {
			metric = "bandwidth"
		}
		fmt.Fprintf(w, "\n  %s ÷ %s, %s (%s)\n", x.Name, what, metric, fmt.Sprintf(note, x.Name))
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprint(tw, "  size\t")
		for _, d := range dens {
			fmt.Fprintf(tw, "÷%s\t", d.Name)
		}
		fmt.Fprintln(tw)
		used := ""
		for _, size := range res.Options.Sizes {
			xv, _, xok := x.lookup(t.metric, size).value(t.metric, t.stat)
			if !xok {
				continue
			}
			_, xMarks := cell(x, t.metric, t.stat, size)
			fmt.Fprintf(tw, "  %s\t", sizeLabel(size))
			for _, d := range dens {
				if dv, _, ok := d.lookup(t.metric, size).value(t.metric, t.stat); ok && dv > 0 {
					_, dMarks := cell(d, t.metric, t.stat, size)
					m := ratioMarks(xMarks, dMarks)
					used += m
					fmt.Fprintf(tw, "%.2f×%s\t", xv/dv, m)
				} else {
					fmt.Fprint(tw, "-\t")
				}
			}
			fmt.Fprintln(tw)
		}
		tw.Flush()
		var legend []string
		if strings.Contains(used, "†") {
			legend = append(legend, "† one side is a mean (no percentile): not a like-for-like ratio")
		}
		if strings.Contains(used, "*") {
			legend = append(legend, "* one side ran at another size than the row's")
		}
		if strings.Contains(used, "!") {
			legend = append(legend, "! some rounds of one side failed")
		}
		if len(legend) > 0 {
			fmt.Fprintf(w, "  %s\n", strings.Join(legend, "; "))
		}
	}
}

// fmtNum prints about three significant digits.
func fmtNum(v float64) string {
	switch a := math.Abs(v); {
	case a >= 100:
		return fmt.Sprintf("%.0f", v)
	case a >= 10:
		return fmt.Sprintf("%.1f", v)
	default:
		return fmt.Sprintf("%.2f", v)
	}
}

func writeTables(w io.Writer, res *Results) {
	m := res.Machine
	fmt.Fprintf(w, "xmx side-by-side benchmark, %s (%s)\n", res.Date, strings.TrimSpace(res.Command))
	fmt.Fprintf(w, "machine: %d x %s, Linux %s, %s; load average %s at the start, %s at the end\n",
		m.Nproc, m.CPUModel, m.Kernel, m.OS, m.LoadStart, m.LoadEnd)
	fmt.Fprintf(w, "lab: %s, veth pair, MTU %d; %d interleaved round(s); every figure is the median over rounds\n",
		res.Lab.Name, res.Lab.MTU, res.Options.Rounds)
	if res.Options.Pinning != "" {
		fmt.Fprintf(w, "pinning: %s\n", res.Options.Pinning)
	}
	if res.Interrupted {
		fmt.Fprintf(w, "INTERRUPTED: partial results\n")
	}
	fmt.Fprintf(w, "\nsystems:\n")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, s := range res.Systems {
		v := s.Version
		if s.Disabled != "" {
			v = "OFF: " + s.Disabled
		}
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\n", s.Name, s.Side, s.Label, v)
	}
	tw.Flush()

	for _, t := range tableSpecs {
		cols := t.columns(res)
		if len(cols) == 0 {
			continue
		}
		fmt.Fprintf(w, "\n%s\n", t.title)
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprint(tw, "size\t")
		for _, c := range cols {
			fmt.Fprintf(tw, "%s\t", c.Name)
		}
		fmt.Fprintln(tw)
		used := ""
		for _, size := range res.Options.Sizes {
			fmt.Fprintf(tw, "%s\t", sizeLabel(size))
			for _, c := range cols {
				str, marks := cell(c, t.metric, t.stat, size)
				used += marks
				fmt.Fprintf(tw, "%s\t", str)
			}
			fmt.Fprintln(tw)
		}
		tw.Flush()
		var legend []string
		if strings.Contains(used, "†") {
			legend = append(legend, "† mean (the tool reports no percentile)")
		}
		if strings.Contains(used, "*") {
			legend = append(legend, "* ran at another size (size_used in results.json)")
		}
		if strings.Contains(used, "!") {
			legend = append(legend, "! some rounds failed (see failures)")
		}
		legend = append(legend, "n/a: the system cannot run this size (skipped in results.json)")
		fmt.Fprintf(w, "  %s\n", strings.Join(legend, "; "))

		// Ratio blocks: each xmx-side column against every peer column.
		ratioBlocks(w, res, t, cols, "peer", t.ratioNote,
			func(c *SystemData) bool { return c.Side == SideXMX },
			func(c *SystemData) bool { return c.Side == SidePeer })
		if t.metric == Bandwidth {
			ratioBlocks(w, res, t, cols, "link floor", "> 1: %s is faster than the raw link",
				func(c *SystemData) bool { return c.Side == SideXMX && !isLink(c) }, isLink)
		}
	}

	// Why cells are n/a.
	var reasons []string
	for _, s := range res.Systems {
		seen := map[string]bool{}
		for _, sk := range s.Skipped {
			if !seen[sk.Reason] {
				seen[sk.Reason] = true
				reasons = append(reasons, fmt.Sprintf("  %s %s: %s", s.Name, sk.Metric, sk.Reason))
			}
		}
	}
	if len(reasons) > 0 {
		fmt.Fprintf(w, "\nnot applicable:\n%s\n", strings.Join(reasons, "\n"))
	}
	if len(res.Failures) > 0 {
		fmt.Fprintf(w, "\nfailures (%d; details and output tails in results.json):\n", len(res.Failures))
		for _, f := range res.Failures {
			msg := f.Error
			if i := strings.IndexByte(msg, '\n'); i >= 0 {
				msg = msg[:i]
			}
			where := f.System
			if f.Size != 0 {
				where += fmt.Sprintf(" %s %s round %d", f.Metric, sizeLabel(f.Size), f.Round)
			}
			fmt.Fprintf(w, "  %s: %s: %s\n    command: %s\n", where, f.Tool, msg, f.Command)
		}
	}
}
