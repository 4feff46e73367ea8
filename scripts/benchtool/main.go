// Command benchtool is the side-by-side benchmark behind scripts/bench.
//
// It brings up a fresh two-host veth lab (scripts/lab), and in the same run,
// interleaved (for each round, for each size, every system), measures the
// raw link floor (xmx linkbench), the xmx rows (xmxSystems: xmx pingpong
// and xmx stream, busy-poll and blocking, and xmx stream -umem) and the peers a user would pick instead: UCX ucx_perftest tag_lat/tag_bw over
// TCP, libfabric fi_pingpong (tcp, rdm, tagged), sockperf ping-pong over UDP
// and TCP, and iperf3 TCP and UDP. It prints one table per metric with the
// ratio of every xmx-side row to every peer, writes results.json and draws
// latency.png, latency_p99.png and bandwidth.png (gnuplot).
//
// Run it as root through scripts/bench; "scripts/bench -h" lists the flags.
package main

import (
	"bytes"
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
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

var (
	defaultSizes = []int{8, 64, 256, 1 << 10, 4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20}
	quickSizes   = []int{8, 1 << 10, 64 << 10, 1 << 20}
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return
		}
		fmt.Fprintf(os.Stderr, "bench: %v\n", err)
		if errors.Is(err, errUsage) {
			os.Exit(2)
		}
		os.Exit(1)
	}
}

var errUsage = errors.New("usage")

// usageOut receives -h and flag errors (tests silence it).
var usageOut io.Writer = os.Stderr

type config struct {
	quick     bool
	out       string
	rounds    int
	sizes     []int
	only      []string
	keepLab   bool
	noInstall bool
	noPin     bool
	replot    string
	mtu       int
	gather    string // -umem-gather for the *-umem rows ("": xmx's default)
	xmxRev    string // build ./cmd/xmx of this commit for the xmx-side rows
}

// Lab MTUs -mtu accepts: IPv6's minimum link MTU up to veth's largest,
// 65535 (veth's single-buffer native XDP stops at 3506; above it the
// AF_XDP links go multi-buffer by themselves, up to 17 UMEM frames each).
const (
	minMTU     = 1280
	maxMTU     = 65535
	defaultMTU = 1500
)

func parseFlags(args []string) (config, error) {
	var c config
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(usageOut)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), `usage: scripts/bench [flags]

Side-by-side benchmark, as root: a fresh two-host veth lab at MTU -mtu,
then, for each round, for each size, every system (interleaved): the raw
AF_XDP link floor (xmx linkbench, frames of at most MTU+14 bytes), xmx
(pingpong and stream, busy-poll and blocking; stream -umem for the *-umem
rows, bandwidth only), UCX tag_lat/tag_bw over TCP, libfabric fi_pingpong
(tcp rdm tagged), sockperf ping-pong UDP and TCP, iperf3 TCP and UDP. Missing
tools are installed from Debian. Prints one table per metric (with "xmx ÷
peer" ratios, and "xmx ÷ link floor" for bandwidth), writes results.json,
tables.txt, latency.png, latency_p99.png and bandwidth.png to the out dir, and
removes the lab (also on Ctrl-C or failure).

Systems: %s

Flags (one or two dashes):
`, strings.Join(allSystemNames(), ", "))
		fs.PrintDefaults()
	}
	fs.BoolVar(&c.quick, "quick", false, "few sizes ("+sizesString(quickSizes)+"), 1 round, shorter runs: a smoke test (< 2 min)")
	fs.StringVar(&c.out, "out", "", "output directory (default docs/bench/YYYY-MM-DD in the repository)")
	fs.IntVar(&c.rounds, "rounds", 0, "interleaved rounds; each figure is the median over rounds (default 3, 1 with -quick)")
	sizes := fs.String("sizes", "", "comma-separated message sizes in bytes, K/M suffixes = KiB/MiB (default "+sizesString(defaultSizes)+")")
	only := fs.String("only", "", "comma-separated systems to run (a prefix before '-' selects a family: sockperf = sockperf-udp,sockperf-tcp)")
	fs.BoolVar(&c.keepLab, "keep-lab", false, "leave the lab up at the end (remove it with scripts/lab down --name NAME)")
	fs.BoolVar(&c.noPin, "no-pin", false, "do not pin the peers' server to CPU 1 and client to CPU 0 (taskset); linkbench is never pinned")
	fs.StringVar(&c.replot, "replot", "", "measure nothing: redraw tables.txt and the PNGs of `DIR` from its results.json")
	fs.BoolVar(&c.noInstall, "no-install", false, "do not apt-get install missing tools (systems without their tool are skipped)")
	fs.StringVar(&c.gather, "umem-gather", "", "pass \"-umem-gather `MODE`\" (auto, descriptors or copy) to xmx stream -umem in the *-umem rows (default: not passed, xmx's own default)")
	fs.StringVar(&c.xmxRev, "xmx-rev", "", "measure ./cmd/xmx of git commit `REV` (git archive, built for the run) instead of bin/xmx or HEAD: runs that should compare the same xmx while the tree moves")
	fs.IntVar(&c.mtu, "mtu", defaultMTU, fmt.Sprintf("lab MTU, %d..%d (scripts/lab up --mtu N; the link floor streams N+14-byte frames)", minMTU, maxMTU))
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return c, err
		}
		return c, fmt.Errorf("%w: %v", errUsage, err)
	}
	if fs.NArg() > 0 {
		return c, fmt.Errorf("%w: unexpected argument %q (flags only; see -h)", errUsage, fs.Arg(0))
	}
	if c.rounds < 0 || c.rounds > 50 {
		return c, fmt.Errorf("%w: --rounds %d: want 1..50", errUsage, c.rounds)
	}
	if c.mtu < minMTU || c.mtu > maxMTU {
		return c, fmt.Errorf("%w: --mtu %d: want %d..%d", errUsage, c.mtu, minMTU, maxMTU)
	}
	switch c.gather {
	case "", "auto", "descriptors", "copy":
	default:
		return c, fmt.Errorf("%w: --umem-gather %q: want auto, descriptors or copy", errUsage, c.gather)
	}
	if c.rounds == 0 {
		c.rounds = 3
		if c.quick {
			c.rounds = 1
		}
	}
	c.sizes = defaultSizes
	if c.quick {
		c.sizes = quickSizes
	}
	if *sizes != "" {
		s, err := parseSizes(*sizes)
		if err != nil {
			return c, fmt.Errorf("%w: --sizes: %v", errUsage, err)
		}
		c.sizes = s
	}
	if *only != "" {
		known := allSystemNames()
		for _, o := range strings.Split(*only, ",") {
			o = strings.TrimSpace(o)
			if o == "" {
				continue
			}
			if !slices.ContainsFunc(known, func(k string) bool { return matchOnly(o, k) }) {
				return c, fmt.Errorf("%w: --only: unknown system %q (known: %s)", errUsage, o, strings.Join(known, ","))
			}
			c.only = append(c.only, o)
		}
	}
	return c, nil
}

// matchOnly: "sockperf" selects sockperf-udp and sockperf-tcp; "ucx" selects
// ucx; "xmx" selects every xmx-* row. A pattern that is itself a system's
// name selects that system only ("xmx-spin" is not also "xmx-spin-umem").
func matchOnly(pattern, name string) bool {
	if pattern == name {
		return true
	}
	if slices.Contains(allSystemNames(), pattern) {
		return false
	}
	return strings.HasPrefix(name, pattern+"-")
}

func allSystemNames() []string {
	var names []string
	all := append(linkSystems(nil, func(string) bool { return true }, defaultMTU), peerSystems(defaultMTU)...)
	all = append(all, xmxSystems(nil)...)
	for _, s := range all {
		names = append(names, s.Data.Name)
	}
	return names
}

// parseSizes reads "8,64,1K,1M" (K = 1024, M = 1048576), sorted and deduplicated.
func parseSizes(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		mult := 1
		switch {
		case strings.HasSuffix(f, "K") || strings.HasSuffix(f, "k"):
			mult, f = 1<<10, f[:len(f)-1]
		case strings.HasSuffix(f, "M") || strings.HasSuffix(f, "m"):
			mult, f = 1<<20, f[:len(f)-1]
		}
		n, err := strconv.Atoi(f)
		if err != nil || n <= 0 {
			return nil, fmt.Errorf("bad size %q", f)
		}
		n *= mult
		if n > 16<<20 {
			return nil, fmt.Errorf("size %d: at most 16M", n)
		}
		out = append(out, n)
	}
	if len(out) == 0 {
		return nil, errors.New("no sizes")
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}

func sizesString(s []int) string {
	l := make([]string, len(s))
	for i, n := range s {
		l[i] = sizeLabel(n)
	}
	return strings.Join(l, ",")
}

func run(args []string) error {
	cfg, err := parseFlags(args)
	if err != nil {
		return err
	}
	if cfg.replot != "" {
		return replot(cfg.replot)
	}
	if os.Geteuid() != 0 {
		return errors.New("must run as root (network namespaces, AF_XDP): sudo scripts/bench")
	}
	repo, err := findRepo()
	if err != nil {
		return err
	}
	started := time.Now()
	if cfg.out == "" {
		cfg.out = filepath.Join(repo, "docs", "bench", started.Format("2006-01-02"))
	}
	if err := os.MkdirAll(cfg.out, 0o755); err != nil {
		return err
	}
	tmp, err := os.MkdirTemp("", "xmx-bench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
	defer stop()
	e := &Env{ctx: ctx, Repo: repo, Quick: cfg.quick, Progress: os.Stderr, Iface: "eth0", MTU: cfg.mtu, UMEMGather: cfg.gather, XMXRev: cfg.xmxRev}

	only := func(name string) bool {
		return len(cfg.only) == 0 || slices.ContainsFunc(cfg.only, func(o string) bool { return matchOnly(o, name) })
	}
	xmxBin := xmxBinary(e, tmp)
	var systems []*System
	systems = append(systems, linkSystems(xmxBin, only, cfg.mtu)...)
	for _, s := range xmxSystems(xmxBin) {
		if cfg.gather != "" && strings.HasSuffix(s.Data.Name, "-umem") {
			s.Data.Label += " (-umem-gather " + cfg.gather + ")"
			s.Data.Tool = strings.Replace(s.Data.Tool, " -umem ", " -umem -umem-gather "+cfg.gather+" ", 1)
		}
		if only(s.Data.Name) {
			systems = append(systems, s)
		}
	}
	for _, s := range peerSystems(cfg.mtu) {
		if only(s.Data.Name) {
			systems = append(systems, s)
		}
	}

	res := &Results{
		Schema:  schemaVersion,
		Date:    started.UTC().Format(time.RFC3339),
		Command: "scripts/bench " + strings.Join(args, " "),
		Options: Options{Quick: cfg.quick, Rounds: cfg.rounds, Sizes: cfg.sizes, Only: cfg.only},
		Machine: describeMachine(),
		Units: Units{
			Latency:   "microseconds, one way (half the round trip)",
			Bandwidth: "MB/s of message payload, MB = 10^6 bytes",
		},
		Failures: []Failure{},
	}
	for _, s := range systems {
		res.Systems = append(res.Systems, s.Data)
	}

	// Tools: install what is missing, skip what still is.
	ensureTools(e, systems, cfg.noInstall)
	for _, s := range systems {
		for _, b := range s.Binaries {
			if _, err := exec.LookPath(b); err != nil && s.Data.Disabled == "" {
				s.Data.Disabled = fmt.Sprintf("%s not found (Debian package %s)", b, strings.Join(s.Packages, " "))
				res.Failures = append(res.Failures, Failure{System: s.Data.Name, Tool: b, Command: "command -v " + b, Error: s.Data.Disabled})
				fmt.Fprintf(os.Stderr, "bench: skipping %s: %s\n", s.Data.Name, s.Data.Disabled)
			}
		}
		if len(s.Packages) > 0 {
			s.Data.Version = packageVersions(s.Packages)
		}
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	// The xmx binary, before the lab (a build takes a while); an explicit
	// -xmx-rev that cannot be built is a setup error, otherwise the rows
	// fail one by one and say why.
	if slices.ContainsFunc(systems, func(s *System) bool { return s.Data.Side == SideXMX }) {
		if _, err := xmxBin(); err != nil && cfg.xmxRev != "" {
			return fmt.Errorf("--xmx-rev %s: %v", cfg.xmxRev, err)
		}
	}

	// The lab.
	lab, err := labUp(ctx, repo, cfg.mtu)
	if err != nil {
		return err
	}
	labDown := func() {
		if cfg.keepLab {
			fmt.Fprintf(os.Stderr, "bench: lab %s left up (--keep-lab); remove it with: scripts/lab down --name %s\n", lab, lab)
			return
		}
		if err := runQuiet(repo, "scripts/lab", "down", "--name", lab); err != nil {
			fmt.Fprintf(os.Stderr, "bench: scripts/lab down --name %s: %v\n", lab, err)
		}
	}
	defer labDown()
	e.Lab, e.ServerNS, e.ClientNS = lab, lab+"-h2", lab+"-h1"
	e.ServerIP, e.ClientIP = "198.18.0.2", "198.18.0.1"
	res.Options.Pinning = "none (--no-pin)"
	if n := runtime.NumCPU(); !cfg.noPin && n >= 2 {
		e.Pin = map[string]string{e.ServerNS: "1", e.ClientNS: "0"}
		res.Options.Pinning = "server (h2) on CPU 1, client (h1) on CPU 0, with taskset; xmx linkbench (both ends in one process) unpinned"
	} else if !cfg.noPin {
		res.Options.Pinning = "none (fewer than 2 CPUs)"
	}
	res.Lab = LabInfo{
		Name: lab, Topology: fmt.Sprintf("two network namespaces joined by a veth pair (scripts/lab up --name %s --mtu %d)", lab, e.MTU), MTU: e.MTU,
		Server: e.ServerNS + " eth0 " + e.ServerIP, Client: e.ClientNS + " eth0 " + e.ClientIP,
		LinkFloor: fmt.Sprintf("xmx linkbench -mtu %d brings up its own two-host veth lab of the same shape for every invocation", e.MTU),
	}
	if bin, err := xmxBin(); err == nil {
		for _, s := range systems {
			if s.Data.Side == SideXMX {
				s.Data.Version = xmxVersion(repo, bin, e.XMXFrom, e.XMXTree)
			}
		}
	}

	// Measure: for each round, for each size, every system (order rotated
	// every round so no system always runs first).
	fmt.Fprintf(os.Stderr, "bench: lab %s up (MTU %d); %d rounds x %d sizes x %d systems\n", lab, e.MTU, cfg.rounds, len(cfg.sizes), len(systems))
	if l := loadAvg(); busy(l) {
		fmt.Fprintf(os.Stderr, "bench: warning: load average %s: something else is running; busy-polling systems suffer most, expect noise\n", l)
	}
	skipped := map[string]bool{}
	var active []*System
	for _, s := range systems {
		if s.Data.Disabled == "" {
			active = append(active, s)
		}
	}
measure:
	for r := 1; r <= cfg.rounds; r++ {
		for _, s := range active {
			if s.StartRound != nil {
				s.StartRound(r)
			}
		}
		order := slices.Clone(active)
		if len(order) > 0 {
			k := (r - 1) % len(order)
			order = append(order[k:], order[:k]...)
		}
		for _, size := range cfg.sizes {
			for _, s := range order {
				for _, m := range s.Data.Metrics {
					if ctx.Err() != nil {
						res.Interrupted = true
						break measure
					}
					if why := s.Limit(m, size); why != "" {
						k := fmt.Sprint(s.Data.Name, m, size)
						if !skipped[k] {
							skipped[k] = true
							s.Data.Skipped = append(s.Data.Skipped, Skip{Metric: m, Size: size, Reason: why})
						}
						continue
					}
					smp, err := s.Measure(e, m, r, size)
					if err == nil {
						err = checkSample(m, smp)
					}
					pt := s.Data.point(m, size)
					if err != nil {
						if ctx.Err() != nil {
							res.Interrupted = true
							break measure
						}
						pt.Failed++
						res.Failures = append(res.Failures, failureOf(s, m, size, r, err))
						fmt.Fprintf(os.Stderr, "FAIL round %d/%d %6s %-13s %-9s %v\n", r, cfg.rounds, sizeLabel(size), s.Data.Name, m, err)
						continue
					}
					smp.Round = r
					pt.Rounds = append(pt.Rounds, smp)
					fmt.Fprintf(os.Stderr, "round %d/%d %6s %-13s %-9s %s\n", r, cfg.rounds, sizeLabel(size), s.Data.Name, m, describeSample(m, size, smp))
				}
			}
		}
	}
	e.killAll()
	for _, s := range systems {
		for _, pts := range s.Data.Results {
			for _, p := range pts {
				p.aggregate()
			}
		}
	}
	res.DurationSec = math.Round(time.Since(started).Seconds()*10) / 10
	res.Machine.LoadEnd = loadAvg()
	res.Notes = runNotes()
	if busy(res.Machine.LoadStart) || busy(res.Machine.LoadEnd) {
		res.Notes = append(res.Notes, fmt.Sprintf("the machine was busy with other work (load average %s at the start, %s at the end): busy-polling systems suffer most", res.Machine.LoadStart, res.Machine.LoadEnd))
	}

	// Outputs.
	var tables bytes.Buffer
	writeTables(&tables, res)
	os.Stdout.Write(tables.Bytes())
	var errs []error
	if err := os.WriteFile(filepath.Join(cfg.out, "tables.txt"), tables.Bytes(), 0o644); err != nil {
		errs = append(errs, err)
	}
	if err := writePlots(res, cfg.out, tmp); err != nil {
		res.Failures = append(res.Failures, Failure{System: "plots", Tool: "gnuplot", Command: "gnuplot", Error: err.Error()})
		fmt.Fprintf(os.Stderr, "bench: plots: %v\n", err)
	}
	js, err := json.MarshalIndent(res, "", "  ")
	if err != nil {
		errs = append(errs, err)
	} else if err := os.WriteFile(filepath.Join(cfg.out, "results.json"), append(js, '\n'), 0o644); err != nil {
		errs = append(errs, err)
	}
	var wrote []string
	for _, f := range []string{"results.json", "tables.txt", "latency.png", "latency_p99.png", "bandwidth.png"} {
		if fi, err := os.Stat(filepath.Join(cfg.out, f)); err == nil && !fi.ModTime().Before(started) {
			wrote = append(wrote, f)
		}
	}
	fmt.Fprintf(os.Stderr, "bench: wrote %s/{%s} in %.0fs\n", cfg.out, strings.Join(wrote, ","), time.Since(started).Seconds())
	if res.Interrupted {
		errs = append(errs, errors.New("interrupted: results are partial"))
	}
	if n := len(res.Failures); n > 0 {
		errs = append(errs, fmt.Errorf("%d measurement(s) failed: see \"failures\" in %s/results.json", n, cfg.out))
	}
	return errors.Join(errs...)
}

// checkSample rejects values a tool should never produce (and JSON cannot hold).
func checkSample(metric string, s Sample) error {
	vals := []*float64{s.P50us, s.P99us, s.MeanUs, s.MinUs, s.MBps}
	have := false
	for _, v := range vals {
		if v == nil {
			continue
		}
		if math.IsNaN(*v) || math.IsInf(*v, 0) || *v <= 0 {
			return fmt.Errorf("implausible value %v in %+v", *v, s)
		}
		have = true
	}
	for k, v := range s.Extra {
		if math.IsNaN(v) || math.IsInf(v, 0) {
			delete(s.Extra, k)
		}
	}
	if !have {
		return fmt.Errorf("no %s value in the sample", metric)
	}
	return nil
}

func failureOf(s *System, metric string, size, round int, err error) Failure {
	f := Failure{System: s.Data.Name, Metric: metric, Size: size, Round: round, Error: err.Error()}
	var te *toolError
	if errors.As(err, &te) {
		f.Tool, f.Command, f.Error, f.Stderr = te.Tool, te.Command, te.message(), te.Stderr
	}
	return f
}

func describeSample(metric string, size int, s Sample) string {
	var parts []string
	add := func(name string, v *float64, unit string) {
		if v != nil {
			parts = append(parts, fmt.Sprintf("%s %s %s", name, fmtNum(*v), unit))
		}
	}
	if metric == Latency {
		add("p50", s.P50us, "µs")
		add("p99", s.P99us, "µs")
		add("mean", s.MeanUs, "µs")
	} else {
		add("", s.MBps, "MB/s")
	}
	str := strings.TrimSpace(strings.Join(parts, "  "))
	if s.SizeUsed != 0 && s.SizeUsed != size {
		str += fmt.Sprintf("  (ran at %d B)", s.SizeUsed)
	}
	return str + fmt.Sprintf("  [%.1fs]", s.WallSec)
}

// ---- setup ---------------------------------------------------------------

// findRepo walks up from the working directory to the xmx module root.
func findRepo() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if b, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil && bytes.Contains(b, []byte("module github.com/xmx-stack/xmx")) {
			if !fileExists(filepath.Join(dir, "scripts", "lab")) {
				return "", fmt.Errorf("%s has no scripts/lab", dir)
			}
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("not inside the xmx repository (no go.mod of github.com/xmx-stack/xmx above the working directory)")
		}
		dir = parent
	}
}

// ensureTools installs the Debian packages of the systems (and gnuplot for
// the plots) whose commands are missing: apt-get update once, then install.
func ensureTools(e *Env, systems []*System, noInstall bool) {
	var pkgs []string
	want := func(bin string, pkg ...string) {
		if _, err := exec.LookPath(bin); err != nil {
			for _, p := range pkg {
				if !slices.Contains(pkgs, p) {
					pkgs = append(pkgs, p)
				}
			}
		}
	}
	for _, s := range systems {
		for _, b := range s.Binaries {
			want(b, s.Packages...)
		}
	}
	want("gnuplot", "gnuplot-nox")
	if len(pkgs) == 0 {
		return
	}
	if noInstall {
		fmt.Fprintf(os.Stderr, "bench: missing packages (not installing, --no-install): %s\n", strings.Join(pkgs, " "))
		return
	}
	fmt.Fprintf(os.Stderr, "bench: installing %s\n", strings.Join(pkgs, " "))
	// scripts/debdeps (the tool runs from the repository root) waits for
	// the locks of an apt already at work (a fresh VM's unattended
	// upgrades), apt-get update's own included, rather than fail.
	ctx, cancel := context.WithTimeout(e.ctx, 25*time.Minute)
	defer cancel()
	argv := append([]string{"scripts/debdeps"}, pkgs...)
	out, err := exec.CommandContext(ctx, argv[0], argv[1:]...).CombinedOutput()
	if err != nil {
		fmt.Fprintf(os.Stderr, "bench: %s: %v\n%s\n", strings.Join(argv, " "), err, tail(string(out), 10))
	}
}

func packageVersions(pkgs []string) string {
	var vs []string
	for _, p := range pkgs {
		out, err := exec.Command("dpkg-query", "-W", "-f=${Version}", p).Output()
		if err == nil && len(out) > 0 {
			vs = append(vs, p+" "+string(out))
		}
	}
	return strings.Join(vs, ", ")
}

func xmxVersion(repo, bin, from string, tree bool) string {
	v := "xmx " + from
	if from == "" {
		v = "xmx " + strings.TrimPrefix(bin, repo+"/")
	}
	var about []string
	if fi, err := os.Stat(bin); err == nil {
		about = append(about, "built "+fi.ModTime().UTC().Format("2006-01-02 15:04 UTC"))
	}
	if out, err := exec.Command("git", "-C", repo, "rev-parse", "--short", "HEAD").Output(); err == nil {
		about = append(about, "repository at "+strings.TrimSpace(string(out)))
	}
	// The tree is shared: say when a binary built from the working tree
	// (bin/xmx) may carry uncommitted changes outside scripts/ to its
	// inputs (newestSource's: Go and assembly files, go.mod, go.sum, and
	// the BPF object bpf/steer_bpfel.go embeds).
	if tree {
		if out, err := exec.Command("git", "-C", repo, "status", "--porcelain", "--", "*.go", "*.s", "*.o", "go.mod", "go.sum", ":!scripts").Output(); err == nil {
			var files []string
			for _, l := range strings.Split(strings.TrimRight(string(out), "\n"), "\n") {
				if len(l) > 3 {
					files = append(files, l[3:])
				}
			}
			if len(files) > 0 {
				about = append(about, "working tree with uncommitted changes to "+strings.Join(files, " "))
			}
		}
	}
	if len(about) > 0 {
		v += " (" + strings.Join(about, ", ") + ")"
	}
	return v
}

// labUp brings up a fresh lab with a name no namespace uses yet.
func labUp(ctx context.Context, repo string, mtu int) (string, error) {
	var name string
	for range 20 {
		n := fmt.Sprintf("b%07d", rand.IntN(10_000_000))
		if !fileExists("/run/netns/"+n+"-h1") && !fileExists("/run/netns/"+n+"-h2") && !fileExists("/run/netns/"+n+"-br") {
			name = n
			break
		}
	}
	if name == "" {
		return "", errors.New("could not pick an unused lab name")
	}
	cmd := exec.CommandContext(ctx, filepath.Join(repo, "scripts", "lab"), "up", "--name", name, "--mtu", strconv.Itoa(mtu))
	cmd.Dir = repo
	out, err := cmd.CombinedOutput()
	if err != nil {
		_ = runQuiet(repo, "scripts/lab", "down", "--name", name)
		return "", fmt.Errorf("scripts/lab up --name %s --mtu %d: %v\n%s", name, mtu, err, tail(string(out), 10))
	}
	return name, nil
}

func runQuiet(repo string, argv ...string) error {
	cmd := exec.Command(filepath.Join(repo, argv[0]), argv[1:]...)
	cmd.Dir = repo
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("%v: %s", err, tail(string(out), 5))
	}
	return nil
}

func describeMachine() Machine {
	m := Machine{Nproc: runtime.NumCPU(), Go: runtime.Version()}
	m.Hostname, _ = os.Hostname()
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = strings.TrimSpace(string(b))
	}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPUModel = strings.TrimSpace(v)
				break
			}
		}
	}
	if b, err := os.ReadFile("/etc/os-release"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "PRETTY_NAME="); ok {
				m.OS = strings.Trim(v, `"`)
			}
		}
	}
	m.LoadStart = loadAvg()
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "MemTotal:"); ok {
				m.MemTotal = strings.TrimSpace(v)
			}
		}
	}
	return m
}

// busy reports a 1-minute load average of 1 or more (on top of this tool).
func busy(loadavg string) bool {
	f := strings.Fields(loadavg)
	if len(f) == 0 {
		return false
	}
	v, err := strconv.ParseFloat(f[0], 64)
	return err == nil && v >= 1
}

// loadAvg is the first three fields of /proc/loadavg.
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	return strings.Join(f[:min(3, len(f))], " ")
}

func runNotes() []string {
	return []string{
		"figures are medians over rounds; rounds[] holds every per-round value",
		"all peers run in one veth lab (server in h2, client in h1) through the kernel TCP/UDP stack; the link floor runs in linkbench's own lab of the same shape",
		"the machine is small and shared: compare ratios within one run, not absolute figures across runs",
	}
}
