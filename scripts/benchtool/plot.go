package main

// PNG plots through gnuplot (Debian gnuplot-nox, pngcairo terminal): one
// line per system, message size on a log2 axis, values on a log10 axis, bars
// from the smallest to the largest per-round value.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// systemColors keeps a system's colour the same across plots and runs.
var systemColors = map[string]string{
	"link-spin": "#000000", "link-poll": "#7f7f7f",
	"xmx-spin": "#d62728", "xmx-poll": "#ff7f0e",
	"xmx-spin-umem": "#8b0000", "xmx-poll-umem": "#b8860b", "xmx-spin-afpacket": "#e377c2",
	"ucx": "#1f77b4", "libfabric": "#2ca02c",
	"sockperf-udp": "#9467bd", "sockperf-tcp": "#8c564b",
	"iperf3-tcp": "#17becf", "iperf3-udp": "#bcbd22",
}

var spareColors = []string{"#aec7e8", "#98df8a", "#ff9896", "#c5b0d5"}

// gpString quotes s for gnuplot (double quotes: \n is a newline).
func gpString(s string) string {
	s = strings.ReplaceAll(s, `\`, `\\`)
	s = strings.ReplaceAll(s, `"`, `\"`)
	s = strings.ReplaceAll(s, "\n", `\n`)
	return `"` + s + `"`
}

// plotScript writes the data files for one plot into dir and returns the
// gnuplot script that draws it to out, or "" when there is nothing to plot.
func plotScript(res *Results, t tableSpec, dir, out string) (string, error) {
	var plots []string
	spare := 0
	top := 0.0 // largest value drawn, bars included
	for i, s := range t.columns(res) {
		var data bytes.Buffer
		n := 0
		anyMean, anyOther := false, false
		for _, size := range res.Options.Sizes {
			p := s.lookup(t.metric, size)
			v, mean, ok := p.value(t.metric, t.stat)
			if !ok {
				continue
			}
			lo, hi, _ := p.spread(t.metric, t.stat)
			fmt.Fprintf(&data, "%d %g %g %g\n", size, v, lo, hi)
			top = max(top, v, hi)
			n++
			anyMean = anyMean || mean
			anyOther = anyOther || (p.SizeUsed != 0 && p.SizeUsed != size)
		}
		if n == 0 {
			continue
		}
		file := filepath.Join(dir, fmt.Sprintf("%s-%d.dat", strings.TrimSuffix(t.file, ".png"), i))
		if err := os.WriteFile(file, data.Bytes(), 0o644); err != nil {
			return "", err
		}
		color, ok := systemColors[s.Name]
		if !ok {
			color = spareColors[spare%len(spareColors)]
			spare++
		}
		title := s.Name + ": " + s.Label
		if anyMean {
			title += " [mean]"
		}
		if anyOther {
			title += " [*]"
		}
		style := "lw 2 pt 7 ps 1.1"
		switch {
		case strings.HasPrefix(s.Name, "link-"):
			style = "lw 2 dt 2 pt 6 ps 1.3"
		case s.Side == SideXMX && strings.HasSuffix(s.Name, "-umem"):
			style = "lw 3.5 dt 4 pt 13 ps 1.6"
		case s.Side == SideXMX:
			style = "lw 3.5 pt 5 ps 1.4"
		}
		plots = append(plots, fmt.Sprintf("%s using 1:2:3:4 with yerrorlines %s lc rgb %s title %s",
			gpString(file), style, gpString(color), gpString(title)))
	}
	if len(plots) == 0 {
		return "", nil
	}
	var tics []string
	for _, size := range res.Options.Sizes {
		tics = append(tics, fmt.Sprintf("%s %d", gpString(sizeLabel(size)), size))
	}
	m := res.Machine
	date := res.Date
	if d, err := time.Parse(time.RFC3339, res.Date); err == nil {
		date = d.Format("2006-01-02 15:04 UTC")
	}
	mtu := res.Lab.MTU
	if mtu == 0 {
		mtu = defaultMTU
	}
	title := fmt.Sprintf("%s vs message size\n%s; %d x %s, Linux %s; veth lab, MTU %d, %d round(s): median, bars min..max",
		strings.SplitN(t.title, " (", 2)[0], date, m.Nproc, m.CPUModel, m.Kernel, mtu, res.Options.Rounds)
	var b strings.Builder
	fmt.Fprintf(&b, "set terminal pngcairo size 1400,900 font %s noenhanced\n", gpString("DejaVu Sans,12"))
	fmt.Fprintf(&b, "set encoding utf8\nset output %s\n", gpString(out))
	fmt.Fprintf(&b, "set title %s font %s\n", gpString(title), gpString("DejaVu Sans,13"))
	fmt.Fprintf(&b, "set xlabel %s\nset ylabel %s\n", gpString("message size (bytes, log scale)"), gpString(t.ylabel+", log scale"))
	fmt.Fprintf(&b, "set logscale x 2\nset logscale y 10\nset xtics (%s)\n", strings.Join(tics, ", "))
	fmt.Fprintf(&b, "set xrange [%g:%g]\n", float64(res.Options.Sizes[0])/1.5, float64(res.Options.Sizes[len(res.Options.Sizes)-1])*1.5)
	// Room above the data for the key (top left).
	fmt.Fprintf(&b, "set yrange [*:%g]\n", top*math.Pow(10, 1.2))
	b.WriteString("set format y '%g'\nset grid xtics ytics mytics lc rgb '#d0d0d0'\nset mytics 10\n")
	b.WriteString("set key inside left top Left reverse box opaque spacing 1.2 width 1 font 'DejaVu Sans,11'\n")
	b.WriteString("set bmargin 6\n")
	b.WriteString("set bars 0.5\nset border lw 1.2\n")
	if t.metric == Bandwidth {
		fmt.Fprintf(&b, "set label 1 '[*] some points ran at a capped size (sockperf: at least 14 B; iperf3 UDP datagrams: %d..%d B; link frames: at most %d B, payload %d B)' at screen 0.01, screen 0.02 font 'DejaVu Sans,10'\n",
			iperfUDPMin, udpPayloadMax(mtu), mtu+ethHeader, mtu)
	} else {
		b.WriteString("set label 1 '[*] some points ran at a capped size (sockperf: at least 14 B)   [mean]: the tool gives only a mean' at screen 0.01, screen 0.02 font 'DejaVu Sans,10'\n")
	}
	fmt.Fprintf(&b, "plot %s\n", strings.Join(plots, ", \\\n     "))
	return b.String(), nil
}

// writePlots draws latency.png, latency_p99.png and bandwidth.png into outDir.
func writePlots(res *Results, outDir, tmp string) error {
	gp, err := exec.LookPath("gnuplot")
	if err != nil {
		return errors.New("gnuplot not found (Debian package gnuplot-nox): no plots")
	}
	dir, err := os.MkdirTemp(tmp, "plot-")
	if err != nil {
		return err
	}
	var errs []error
	for _, t := range tableSpecs {
		if t.file == "" {
			continue
		}
		out := filepath.Join(outDir, t.file)
		script, err := plotScript(res, t, dir, out)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if script == "" {
			_ = os.Remove(out)
			continue
		}
		sf := filepath.Join(dir, strings.TrimSuffix(t.file, ".png")+".gp")
		if err := os.WriteFile(sf, []byte(script), 0o644); err != nil {
			errs = append(errs, err)
			continue
		}
		// Not e.runLocal: plots are drawn after an interrupt too.
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		said, err := exec.CommandContext(ctx, gp, sf).CombinedOutput()
		cancel()
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: gnuplot %s: %v: %s", t.file, sf, err, tail(string(said), 5)))
		}
	}
	return errors.Join(errs...)
}

// replot re-draws tables.txt and the plots of dir from its results.json
// (no lab, no root): for a changed plot style or a lost PNG.
func replot(dir string) error {
	b, err := os.ReadFile(filepath.Join(dir, "results.json"))
	if err != nil {
		return err
	}
	var res Results
	if err := json.Unmarshal(b, &res); err != nil {
		return fmt.Errorf("%s/results.json: %v", dir, err)
	}
	if res.Schema != schemaVersion {
		return fmt.Errorf("%s/results.json: schema %q, want %q", dir, res.Schema, schemaVersion)
	}
	var tables bytes.Buffer
	writeTables(&tables, &res)
	os.Stdout.Write(tables.Bytes())
	if err := os.WriteFile(filepath.Join(dir, "tables.txt"), tables.Bytes(), 0o644); err != nil {
		return err
	}
	tmp, err := os.MkdirTemp("", "xmx-bench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	return writePlots(&res, dir, tmp)
}
