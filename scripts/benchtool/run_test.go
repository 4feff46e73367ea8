package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// fakeEnv runs "namespaced" commands directly, without root or a lab.
func fakeEnv(t *testing.T) *Env {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	e := &Env{ctx: ctx, Progress: &bytes.Buffer{}, Iface: "eth0", MTU: 1500, ServerNS: "srv", ClientNS: "cli",
		ServerIP: "198.18.0.2", ClientIP: "198.18.0.1", Quick: true}
	e.wrap = func(ns string, env []string, argv []string) []string {
		out := []string{"env", "BENCH_NS=" + ns}
		out = append(out, env...)
		return append(out, argv...)
	}
	return e
}

func TestRunPair(t *testing.T) {
	e := fakeEnv(t)
	ro, err := e.runPair(pair{Tool: "echo",
		Server: []string{"sh", "-c", `echo ready; sleep 0.2`},
		Client: []string{"sh", "-c", `echo "client in $BENCH_NS with $X"; echo warn >&2`},
		Env:    []string{"X=1"},
		Ready:  Readiness{Line: "ready"}, Limit: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if ro.Stdout != "client in cli with 1\n" || ro.Stderr != "warn\n" || !strings.Contains(ro.Command, "BENCH_NS=cli") {
		t.Errorf("got %+v", ro)
	}

	// A failing client: the error names the tool and command and quotes the output.
	_, err = e.runPair(pair{Tool: "faketool",
		Server: []string{"sh", "-c", `echo ready; echo "server side note" >&2; sleep 5`},
		Client: []string{"sh", "-c", `echo "it broke: no route" >&2; exit 3`},
		Ready:  Readiness{Line: "ready"}, Limit: 5 * time.Second, ServerLives: true})
	var te *toolError
	if !errors.As(err, &te) || te.Tool != "faketool" || !strings.Contains(te.Command, "exit 3") ||
		!strings.Contains(te.Stderr, "it broke: no route") || !strings.Contains(te.Stderr, "[server] server side note") {
		t.Errorf("failing client: got %#v", err)
	}

	// A server that dies before it is ready.
	_, err = e.runPair(pair{Tool: "deadserver", Server: []string{"sh", "-c", `echo "bind: address in use" >&2; exit 1`},
		Client: []string{"true"}, Ready: Readiness{Line: "ready"}, Limit: 5 * time.Second})
	if !errors.As(err, &te) || !strings.Contains(te.Msg, "server exited") || !strings.Contains(te.Stderr, "address in use") {
		t.Errorf("dead server: got %#v", err)
	}

	// A client that hangs is killed at its limit, with its process group.
	start := time.Now()
	_, err = e.runPair(pair{Tool: "hang", Server: []string{"sh", "-c", "echo ready; sleep 30"},
		Client: []string{"sh", "-c", "sleep 30 & sleep 30"}, Ready: Readiness{Line: "ready"}, Limit: 300 * time.Millisecond, ServerLives: true})
	if !errors.As(err, &te) || !strings.Contains(te.Msg, "limit") || time.Since(start) > 5*time.Second {
		t.Errorf("hanging client: got %v after %v", err, time.Since(start))
	}
	e.mu.Lock()
	left := len(e.procs)
	e.mu.Unlock()
	if left != 0 {
		t.Errorf("%d processes still tracked", left)
	}
}

// TestXMXSystemContract runs the xmx row against a fake xmx that follows the
// contract documented at xmxSystems: when the real command lands, only the
// command lines in xmxSystem may need to change.
func TestXMXSystemContract(t *testing.T) {
	dir := t.TempDir()
	fake := filepath.Join(dir, "xmx")
	script := `#!/bin/sh
# A fake xmx following the contract in xmxSystems (systems.go).
sub=$1; shift
size=0; busy=no; once=no; json=no; peer=""; umem=no; gather=auto; link=afxdp
while [ $# -gt 0 ]; do
  case $1 in
  -sizes) size=$2; shift ;;
  -n|-time|-i) shift ;;
  -busy) busy=yes ;;
  -link) link=$2; [ -z "$FAKE_XMX_IGNORE_LINK" ] || link=afxdp; shift ;;
  -umem) [ "$sub" = stream ] || { echo "flag provided but not defined: -umem" >&2; exit 2; }; umem=yes ;;
  -umem-gather) [ $umem = yes ] || { echo "-umem-gather before -umem" >&2; exit 2; }; gather=$2; shift ;;
  -once) once=yes ;;
  -json) json=yes ;;
  -*) echo "unknown flag $1" >&2; exit 2 ;;
  *) peer=$1 ;;
  esac
  shift
done
if [ -z "$peer" ]; then
  [ $once = yes ] || { echo "server without -once" >&2; exit 2; }
  echo "xmx server: endpoint h2:0 on eth0 ($link copy), waiting for clients (Ctrl-C ends)" >&2
  sleep 0.2; exit 0
fi
[ "$peer" = h2 ] && [ "$XMX_HOSTNAME" = h1 ] && [ $json = yes ] || { echo "bad client: peer=$peer host=$XMX_HOSTNAME" >&2; exit 2; }
if [ "$sub" = pingpong ]; then
  if [ $busy = yes ]; then p50=2.5; else p50=5.5; fi
  echo "{\"size\":$size,\"iterations\":10,\"p50_us\":$p50,\"p99_us\":9.5,\"mean_us\":3.0,\"min_us\":2.0,\"mbps\":3.2}"
elif [ $umem = yes ]; then
  [ "$gather" = auto ] && [ -n "$FAKE_XMX_COPY" ] || [ "$gather" = copy ] &&
    echo "xmx stream: -umem: the link copies lent buffers into its frames (the socket is not in zero-copy mode, or -umem-gather copy)" >&2
  echo "{\"size\":$size,\"messages\":400,\"window\":16,\"seconds\":0.5,\"mbps\":888.5,\"umem\":true}"
else
  echo "[{\"size\":$size,\"mbps\":777.5}]"
fi
echo "done" >&2
`
	if err := os.WriteFile(fake, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	e := fakeEnv(t)
	bin := func() (string, error) { return fake, nil }
	spin := xmxSystem(bin, xmxRow{name: "xmx-spin", mode: "busy-poll", flag: "-busy"})
	s, err := spin.Measure(e, Latency, 1, 64)
	if err != nil {
		t.Fatal(err)
	}
	if s.P50us == nil || *s.P50us != 2.5 || *s.P99us != 9.5 || s.MBps != nil || s.SizeUsed != 64 {
		t.Errorf("pingpong sample: %+v", s)
	}
	s, err = xmxSystem(bin, xmxRow{name: "xmx-poll", mode: "blocking"}).Measure(e, Latency, 1, 8)
	if err != nil || *s.P50us != 5.5 {
		t.Errorf("blocking pingpong: %+v %v", s, err)
	}
	s, err = spin.Measure(e, Bandwidth, 1, 1<<20)
	if err != nil || s.MBps == nil || *s.MBps != 777.5 {
		t.Errorf("stream sample: %+v %v", s, err)
	}

	// The UMEM rows: xmx stream -umem, bandwidth only.
	spinUMEM := xmxSystem(bin, xmxRow{name: "xmx-spin-umem", mode: "busy-poll", flag: "-busy", umem: true})
	if got := spinUMEM.Data.Metrics; len(got) != 1 || got[0] != Bandwidth {
		t.Errorf("umem row metrics %v, want bandwidth only", got)
	}
	s, err = spinUMEM.Measure(e, Bandwidth, 1, 1<<20)
	if err != nil || s.MBps == nil || *s.MBps != 888.5 || s.Extra["umem_zero_copy"] != 1 || s.Extra["messages"] != 400 {
		t.Errorf("umem stream sample: %+v %v", s, err)
	}
	t.Setenv("FAKE_XMX_COPY", "1")
	s, err = xmxSystem(bin, xmxRow{name: "xmx-poll-umem", mode: "blocking", umem: true}).Measure(e, Bandwidth, 1, 65536)
	if err != nil || *s.MBps != 888.5 || s.Extra["umem_zero_copy"] != 0 {
		t.Errorf("umem stream with a copy: %+v %v", s, err)
	}
	t.Setenv("FAKE_XMX_COPY", "")
	e.UMEMGather = "copy" // scripts/bench -umem-gather copy
	s, err = spinUMEM.Measure(e, Bandwidth, 1, 65536)
	if err != nil || s.Extra["umem_zero_copy"] != 0 {
		t.Errorf("umem stream, -umem-gather copy: %+v %v", s, err)
	}
	e.UMEMGather = "descriptors"
	s, err = spinUMEM.Measure(e, Bandwidth, 1, 65536)
	if err != nil || s.Extra["umem_zero_copy"] != 1 {
		t.Errorf("umem stream, -umem-gather descriptors: %+v %v", s, err)
	}
	e.UMEMGather = ""
	if _, err := spinUMEM.Measure(e, Latency, 1, 8); err == nil {
		t.Error("umem row measured latency")
	}
	// A non-umem row must not pass -umem (the fake's pingpong rejects it;
	// its plain stream answers without "umem").
	s, err = xmxSystem(bin, xmxRow{name: "xmx-poll", mode: "blocking"}).Measure(e, Bandwidth, 1, 65536)
	if err != nil || *s.MBps != 777.5 {
		t.Errorf("plain stream: %+v %v", s, err)
	}

	// The AF_PACKET row passes -link afpacket to both sides, and fails
	// when the server does not say it opened that link.
	pkt := xmxSystem(bin, xmxRow{name: "xmx-spin-afpacket", mode: "busy-poll", flag: "-busy", link: "afpacket"})
	for _, metric := range []string{Latency, Bandwidth} {
		s, err = pkt.Measure(e, metric, 1, 65536)
		if err != nil || (s.P50us == nil && s.MBps == nil) {
			t.Errorf("afpacket %s: %+v %v", metric, s, err)
		}
	}
	if !strings.Contains(pkt.Data.Label, "AF_PACKET") {
		t.Errorf("afpacket row label %q", pkt.Data.Label)
	}
	t.Setenv("FAKE_XMX_IGNORE_LINK", "1")
	var te *toolError
	if _, err := pkt.Measure(e, Latency, 1, 8); !errors.As(err, &te) || !strings.Contains(te.Msg, "does not say it opened AF_PACKET") {
		t.Errorf("afpacket row, server on AF_XDP: %v", err)
	}
	t.Setenv("FAKE_XMX_IGNORE_LINK", "")

	rows := map[string][]string{}
	for _, x := range xmxSystems(bin) {
		rows[x.Data.Name] = x.Data.Metrics
	}
	for name, want := range map[string]string{"xmx-spin": "latency,bandwidth", "xmx-poll": "latency,bandwidth",
		"xmx-spin-umem": "bandwidth", "xmx-poll-umem": "bandwidth", "xmx-spin-afpacket": "latency,bandwidth"} {
		if got := strings.Join(rows[name], ","); got != want {
			t.Errorf("%s metrics %q, want %q", name, got, want)
		}
	}
}

// A -umem run whose output does not say "umem":true (an xmx without the
// flag would fail on it; one that ignored it must not pass for a UMEM row).
func TestXMXUMEMNotConfirmed(t *testing.T) {
	fake := filepath.Join(t.TempDir(), "xmx")
	script := `#!/bin/sh
case "$*" in
*-once*) echo "waiting for clients" >&2; sleep 0.1 ;;
*) echo '{"size":65536,"mbps":5.5}' ;;
esac
`
	if err := os.WriteFile(fake, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	e := fakeEnv(t)
	_, err := xmxSystem(func() (string, error) { return fake, nil }, xmxRow{name: "xmx-spin-umem", mode: "busy-poll", flag: "-busy", umem: true}).Measure(e, Bandwidth, 1, 65536)
	var te *toolError
	if !errors.As(err, &te) || !strings.Contains(te.Msg, `"umem":true`) {
		t.Errorf("got %v", err)
	}
}

// TestLinkSystemsMTU runs the link floor rows against a fake xmx linkbench
// that checks the frame sizes and lab MTU it is asked for.
func TestLinkSystemsMTU(t *testing.T) {
	for _, tc := range []struct {
		mtu, size, frame int
		fixture          string
	}{
		{1500, 64, 78, "linkbench_rounds1.json"},
		{1500, 1 << 20, 1514, "linkbench_rounds1.json"},
		{3506, 65536, 3520, "linkbench_rounds1.json"},
		{9000, 1 << 20, 9014, "linkbench_mtu9000.json"},
		{9000, 4096, 4110, "linkbench_mtu9000.json"},
	} {
		dir := t.TempDir()
		fake := filepath.Join(dir, "xmx")
		script := `#!/bin/sh
echo "$@" > ` + filepath.Join(dir, "args") + `
cat ` + filepath.Join(mustAbs(t, "testdata"), tc.fixture) + `
`
		if err := os.WriteFile(fake, []byte(script), 0o755); err != nil {
			t.Fatal(err)
		}
		e := fakeEnv(t)
		e.MTU = tc.mtu
		sys := linkSystems(func() (string, error) { return fake, nil }, func(string) bool { return true }, tc.mtu)
		if len(sys) != 2 {
			t.Fatalf("%d link systems", len(sys))
		}
		s, err := sys[0].Measure(e, Bandwidth, 1, tc.size)
		if err != nil {
			t.Fatalf("MTU %d size %d: %v", tc.mtu, tc.size, err)
		}
		args, _ := os.ReadFile(filepath.Join(dir, "args"))
		for _, want := range []string{fmt.Sprintf("-size %d ", tc.frame), fmt.Sprintf("-stream-size %d ", tc.frame), fmt.Sprintf("-mtu %d", tc.mtu)} {
			if !strings.Contains(string(args)+" ", want) {
				t.Errorf("MTU %d size %d: linkbench args %q lack %q", tc.mtu, tc.size, args, want)
			}
		}
		rows, _ := parseLinkbenchJSON([]byte(fixture(t, tc.fixture)))
		payload := tc.frame - ethHeader
		if want := rows[0].FramesPerSec * float64(payload) / 1e6; s.SizeUsed != min(tc.size, payload) || s.Extra["frame"] != float64(tc.frame) ||
			s.MBps == nil || math.Abs(*s.MBps-want) > 1e-6*want {
			t.Errorf("MTU %d size %d: sample %+v, want %d-byte payload at %v frames/s", tc.mtu, tc.size, s, payload, rows[0].FramesPerSec)
		}
		// Latency only for sizes that fit one frame at this MTU.
		if why := sys[0].Limit(Latency, tc.mtu); why != "" {
			t.Errorf("MTU %d: latency at %d refused: %s", tc.mtu, tc.mtu, why)
		}
		if why := sys[1].Limit(Latency, tc.mtu+1); !strings.Contains(why, fmt.Sprint(tc.mtu+ethHeader)) {
			t.Errorf("MTU %d: latency at %d: %q", tc.mtu, tc.mtu+1, why)
		}
		if !strings.Contains(strings.Join(sys[0].Data.Notes, " "), fmt.Sprintf("at most %d", tc.mtu)) {
			t.Errorf("MTU %d: notes %q", tc.mtu, sys[0].Data.Notes)
		}
	}
}

func mustAbs(t *testing.T, p string) string {
	t.Helper()
	a, err := filepath.Abs(p)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// An -xmx-rev that names no commit fails before anything is built, and says so.
func TestXMXRevUnknown(t *testing.T) {
	e := fakeEnv(t)
	e.Repo, e.XMXRev = t.TempDir(), "no-such-rev"
	_, err := xmxBinary(e, t.TempDir())()
	if err == nil || !strings.Contains(err.Error(), "no-such-rev") {
		t.Errorf("got %v", err)
	}
}

func TestUMEMCopied(t *testing.T) {
	for said, want := range map[string]bool{
		"": false,
		"xmx stream: -umem: the link copies lent buffers into its frames (the socket is not in zero-copy mode, or -umem-gather copy)\n": true,
		"note\nxmx stream: -umem: the link sends lent buffers with a copy (not AF_XDP in multi-buffer mode)\n":                          true,
		"xmx server: msglayer: cancelled (peer 00:00:00:00:00:00:0, match 0x0)\n":                                                       false,
	} {
		if got := umemCopied(said); got != want {
			t.Errorf("umemCopied(%q) = %v", said, got)
		}
	}
}

func TestMTUDerived(t *testing.T) {
	for _, tc := range []struct{ size, mtu, frame int }{
		{8, 1500, 60}, {64, 1500, 78}, {1500, 1500, 1514}, {1501, 1500, 1514}, {1 << 20, 1500, 1514},
		{1 << 20, 1280, 1294}, {4096, 3506, 3520}, {4096, 9000, 4110}, {1 << 20, 9000, 9014},
	} {
		if got := frameFor(tc.size, tc.mtu); got != tc.frame {
			t.Errorf("frameFor(%d, %d) = %d, want %d", tc.size, tc.mtu, got, tc.frame)
		}
	}
	if udpPayloadMax(1500) != 1472 || udpPayloadMax(9000) != 8972 {
		t.Errorf("udpPayloadMax: %d %d", udpPayloadMax(1500), udpPayloadMax(9000))
	}
	udp := iperfSystem("udp", 9000)
	if !strings.Contains(udp.Data.Tool, "min(SIZE,8972)") || !strings.Contains(strings.Join(udp.Data.Notes, " "), "16..8972") {
		t.Errorf("iperf3 UDP at MTU 9000: %q %q", udp.Data.Tool, udp.Data.Notes)
	}
}

func TestAggregateAndTables(t *testing.T) {
	res := &Results{Date: "2026-11-21T00:00:00Z", Options: Options{Rounds: 3, Sizes: []int{8, 1 << 20}}, Lab: LabInfo{Name: "b1", MTU: 1500}}
	x := &SystemData{Name: "xmx-spin", Side: SideXMX, Label: "xmx busy-poll", Metrics: []string{Latency, Bandwidth}}
	u := &SystemData{Name: "ucx", Side: SidePeer, Label: "UCX", Metrics: []string{Latency, Bandwidth}}
	f := &SystemData{Name: "libfabric", Side: SidePeer, Label: "libfabric", Metrics: []string{Latency}}
	sp := &SystemData{Name: "sockperf-udp", Side: SidePeer, Label: "sockperf", Metrics: []string{Latency},
		Skipped: []Skip{{Latency, 1 << 20, "too big"}}}
	for r, v := range []float64{3, 1, 2} {
		x.point(Latency, 8).Rounds = append(x.point(Latency, 8).Rounds, Sample{Round: r + 1, SizeUsed: 8, P50us: f64(v), P99us: f64(10 * v)})
		u.point(Latency, 8).Rounds = append(u.point(Latency, 8).Rounds, Sample{Round: r + 1, SizeUsed: 8, P50us: f64(2 * v), P99us: f64(10 * v), MeanUs: f64(3 * v)})
		f.point(Latency, 8).Rounds = append(f.point(Latency, 8).Rounds, Sample{Round: r + 1, SizeUsed: 8, MeanUs: f64(4 * v)})
		sp.point(Latency, 8).Rounds = append(sp.point(Latency, 8).Rounds, Sample{Round: r + 1, SizeUsed: 14, P50us: f64(v), P99us: f64(v)})
		x.point(Bandwidth, 1<<20).Rounds = append(x.point(Bandwidth, 1<<20).Rounds, Sample{Round: r + 1, SizeUsed: 1 << 20, MBps: f64(1000 * v)})
		u.point(Bandwidth, 1<<20).Rounds = append(u.point(Bandwidth, 1<<20).Rounds, Sample{Round: r + 1, SizeUsed: 1 << 20, MBps: f64(500 * v)})
	}
	u.point(Latency, 1<<20).Failed = 3
	res.Systems = []*SystemData{u, f, sp, x}
	for _, s := range res.Systems {
		for _, pts := range s.Results {
			for _, p := range pts {
				p.aggregate()
			}
		}
	}
	if p := x.lookup(Latency, 8); *p.P50us != 2 || *p.P99us != 20 {
		t.Errorf("median: %+v", p)
	}
	if lo, hi, ok := x.lookup(Latency, 8).spread(Latency, "p50"); !ok || lo != 1 || hi != 3 {
		t.Errorf("spread %v %v %v", lo, hi, ok)
	}
	if p := sp.lookup(Latency, 8); p.SizeUsed != 14 {
		t.Errorf("size_used not kept: %+v", p)
	}
	var b bytes.Buffer
	writeTables(&b, res)
	out := b.String()
	for _, want := range []string{
		"One-way latency p50", "xmx-spin ÷ peer, latency p50", "÷ucx", "÷libfabric", "0.50×", // 2 / 4
		"0.25×†", "1.00×*", // over libfabric's mean, over sockperf at 14 B
		"8.00†", // libfabric's mean in the p50 table
		"2.00*", // sockperf ran at 14 B
		"n/a", "FAIL", "Bandwidth", "xmx-spin ÷ peer, bandwidth", "2.00×",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("tables lack %q:\n%s", want, out)
		}
	}
	// xmx-side columns come first.
	for _, line := range strings.Split(out, "\n") {
		if strings.Contains(line, "size") && strings.Contains(line, "ucx") && !strings.Contains(line, "÷") {
			if strings.Index(line, "xmx-spin") > strings.Index(line, "ucx") {
				t.Errorf("xmx column not first: %q", line)
			}
		}
	}
	script, err := plotScript(res, tableSpecs[0], t.TempDir(), "/tmp/x.png")
	if err != nil || !strings.Contains(script, "set logscale x 2") || !strings.Contains(script, "libfabric: libfabric [mean]") ||
		!strings.Contains(script, "xmx-spin: xmx busy-poll") {
		t.Errorf("plot script (%v):\n%s", err, script)
	}
}

// TestTablesLinkFloorAndUMEM: at MTU 9000, the bandwidth table has a
// "÷ link floor" block per xmx row (not for the link rows themselves),
// the UMEM row appears in bandwidth only, and the MTU is in the header and
// in the plot's notes.
func TestTablesLinkFloorAndUMEM(t *testing.T) {
	const mib = 1 << 20
	res := &Results{Date: "2026-11-22T00:00:00Z", Options: Options{Rounds: 1, Sizes: []int{64, mib}}, Lab: LabInfo{Name: "b2", MTU: 9000}}
	link := &SystemData{Name: "link-spin", Side: SideXMX, Label: "raw link", Metrics: []string{Latency, Bandwidth},
		Skipped: []Skip{{Latency, mib, "more than one 9014-byte frame"}}}
	x := &SystemData{Name: "xmx-spin", Side: SideXMX, Label: "xmx busy-poll", Metrics: []string{Latency, Bandwidth}}
	xu := &SystemData{Name: "xmx-spin-umem", Side: SideXMX, Label: "xmx busy-poll, sending from a UMEM buffer", Metrics: []string{Bandwidth}}
	u := &SystemData{Name: "ucx", Side: SidePeer, Label: "UCX", Metrics: []string{Latency, Bandwidth}}
	add := func(s *SystemData, metric string, size int, smp Sample) {
		smp.Round = 1
		s.point(metric, size).Rounds = append(s.point(metric, size).Rounds, smp)
	}
	for _, size := range []int{64, mib} {
		add(link, Bandwidth, size, Sample{SizeUsed: min(size, 9000), MBps: f64(2000)})
		add(x, Bandwidth, size, Sample{SizeUsed: size, MBps: f64(1000)})
		add(xu, Bandwidth, size, Sample{SizeUsed: size, MBps: f64(1900)})
		add(u, Bandwidth, size, Sample{SizeUsed: size, MBps: f64(4000)})
		add(x, Latency, size, Sample{SizeUsed: size, P50us: f64(3)})
		add(u, Latency, size, Sample{SizeUsed: size, P50us: f64(4)})
	}
	add(link, Latency, 64, Sample{SizeUsed: 64, P50us: f64(1)})
	res.Systems = []*SystemData{u, link, x, xu}
	for _, s := range res.Systems {
		for _, pts := range s.Results {
			for _, p := range pts {
				p.aggregate()
			}
		}
	}
	var b bytes.Buffer
	writeTables(&b, res)
	out := b.String()
	bw := out[strings.Index(out, "Bandwidth"):]
	for _, want := range []string{
		"MTU 9000",
		"xmx-spin ÷ link floor, bandwidth", "xmx-spin-umem ÷ link floor, bandwidth", "÷link-spin", "0.50×", "0.95×",
		"xmx-spin-umem ÷ peer, bandwidth", "0.47×", // 1900 / 4000
		"2000*", // the link ran at 9000 B
	} {
		if !strings.Contains(out, want) {
			t.Errorf("tables lack %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "link-spin ÷ link floor") {
		t.Errorf("a link row divided by itself:\n%s", out)
	}
	lat := out[strings.Index(out, "One-way latency p50"):strings.Index(out, "Bandwidth")]
	if strings.Contains(lat, "xmx-spin-umem") || strings.Contains(lat, "÷ link floor") {
		t.Errorf("the UMEM row or a link-floor ratio in the latency tables:\n%s", lat)
	}
	if !strings.Contains(bw, "xmx-spin-umem") {
		t.Errorf("no UMEM column in bandwidth:\n%s", bw)
	}
	script, err := plotScript(res, tableSpecs[3], t.TempDir(), "/tmp/bw.png")
	if err != nil || !strings.Contains(script, "MTU 9000") || !strings.Contains(script, "16..8972 B") ||
		!strings.Contains(script, "at most 9014 B, payload 9000 B") || !strings.Contains(script, "xmx-spin-umem: xmx busy-poll, sending from a UMEM buffer") {
		t.Errorf("bandwidth plot script (%v):\n%s", err, script)
	}
}

// TestFabricSizeColumn: fi_pingpong prints sizes that are not whole KiB with
// one decimal ("1.4k" for 1500, "8.7k" for 9000, "19k" for 20000); such a
// result line is for the size asked, and a line for another size is not.
// The fake fi_pingpong prints the size column given in FAKE_FI_SIZE (what
// libfabric's size_str() prints for the size); a fake ss says the server
// listens.
func TestFabricSizeColumn(t *testing.T) {
	dir := t.TempDir()
	fake := `#!/bin/sh
server=no
while [ $# -gt 0 ]; do
  case $1 in
  -B) server=yes; shift ;;
  -p|-e|-m|-I|-S|-P) shift ;;
  esac
  shift
done
if [ $server = yes ]; then sleep 0.3; exit 0; fi
echo "bytes   #sent   #ack     total       time     MB/sec    usec/xfer   Mxfers/sec"
echo "$FAKE_FI_SIZE       1k      =1k      1m         0.05s    100.00       6.50       0.15"
`
	for name, script := range map[string]string{"fi_pingpong": fake, "ss": "#!/bin/sh\necho LISTEN\n"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(script), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	t.Setenv("PATH", dir+":"+os.Getenv("PATH"))
	fab := fabricSystem()
	for _, c := range []struct {
		size    int
		printed string
		ok      bool
	}{
		{1024, "1k", true}, {1500, "1.4k", true}, {9000, "8.7k", true}, {20000, "19k", true},
		{9000, "9k", false}, {1500, "1k", false}, {1 << 20, "1m", true},
	} {
		t.Setenv("FAKE_FI_SIZE", c.printed)
		s, err := fab.Measure(fakeEnv(t), Latency, 1, c.size)
		switch {
		case c.ok && err != nil:
			t.Errorf("size %d printed %q: %v", c.size, c.printed, err)
		case c.ok && (s.MeanUs == nil || *s.MeanUs != 6.5 || s.SizeUsed != c.size):
			t.Errorf("size %d printed %q: got %+v", c.size, c.printed, s)
		case !c.ok && (err == nil || !strings.Contains(err.Error(), fmt.Sprintf("%q", c.printed))):
			t.Errorf("size %d printed %q: got %v, want an error naming the line's size", c.size, c.printed, err)
		}
	}
}

// TestRatioMarkers: a ratio carries the markers of the cells it divides:
// xmx's p50 over libfabric's mean (†) of a point where 2 of 3 rounds
// failed (!), over sockperf at 14 bytes for an 8-byte row (*); a ratio of
// two clean cells carries none. The block says what the markers mean.
func TestRatioMarkers(t *testing.T) {
	res := &Results{Options: Options{Sizes: []int{8}, Rounds: 3}}
	xmx := &SystemData{Name: "xmx-spin", Side: SideXMX, Metrics: []string{Latency}}
	p := xmx.point(Latency, 8)
	p.Rounds = []Sample{{SizeUsed: 8, P50us: f64(4), MeanUs: f64(4.2)}}
	fab := &SystemData{Name: "libfabric", Side: SidePeer, Metrics: []string{Latency}}
	q := fab.point(Latency, 8)
	q.Rounds = []Sample{{SizeUsed: 8, MeanUs: f64(13)}}
	q.Failed = 2
	sp := &SystemData{Name: "sockperf-udp", Side: SidePeer, Metrics: []string{Latency}}
	r := sp.point(Latency, 8)
	r.Rounds = []Sample{{SizeUsed: 14, P50us: f64(9), P99us: f64(18), MeanUs: f64(9.3)}}
	u := &SystemData{Name: "ucx", Side: SidePeer, Metrics: []string{Latency}}
	v := u.point(Latency, 8)
	v.Rounds = []Sample{{SizeUsed: 8, P50us: f64(2), P99us: f64(4), MeanUs: f64(2.1)}}
	for _, pt := range []*Point{p, q, r, v} {
		pt.aggregate()
	}
	res.Systems = []*SystemData{xmx, fab, sp, u}
	var b bytes.Buffer
	writeTables(&b, res)
	out := b.String()
	i := strings.Index(out, "xmx-spin ÷ peer, latency p50")
	if i < 0 {
		t.Fatalf("no p50 ratio block:\n%s", out)
	}
	rows := func(block string) []string {
		for _, line := range strings.Split(block, "\n") {
			if f := strings.Fields(line); len(f) > 0 && f[0] == "8" {
				return f[1:]
			}
		}
		return nil
	}
	block := out[i:]
	block = block[:strings.Index(block, "\n\n")+1]
	if got, want := rows(block), []string{"0.31×†!", "0.44×*", "2.00×"}; !slices.Equal(got, want) {
		t.Errorf("p50 ratios %q, want %q:\n%s", got, want, block)
	}
	for _, want := range []string{"† one side is a mean", "* one side ran at another size", "! some rounds of one side failed"} {
		if !strings.Contains(block, want) {
			t.Errorf("p50 ratio block lacks %q:\n%s", want, block)
		}
	}
	// The mean table: no † (every cell is a mean), the other markers kept.
	i = strings.Index(out, "xmx-spin ÷ peer, latency mean")
	if i < 0 {
		t.Fatalf("no mean ratio block:\n%s", out)
	}
	block = out[i:]
	if got, want := rows(block), []string{"0.32×!", "0.45×*", "2.00×"}; !slices.Equal(got, want) || strings.Contains(block, "†") {
		t.Errorf("mean ratios %q, want %q and no †:\n%s", got, want, block)
	}
}

// TestNewestSource: bin/xmx is stale when any input of its build is newer:
// a Go or assembly file, go.mod, go.sum, or a file a //go:embed directive
// names (the BPF object); not when only tests, scripts/ or a file the build
// does not read changed.
func TestNewestSource(t *testing.T) {
	repo := t.TempDir()
	old, now := time.Now().Add(-2*time.Hour), time.Now().Add(-time.Hour)
	files := map[string]string{
		"bin/xmx":             "binary",
		"go.mod":              "module x\n",
		"go.sum":              "",
		"bpf/steer_bpfel.go":  "package bpf\n\n// Do not access this directly.\n//\n//go:embed steer_bpfel.o\nvar _SteerBytes []byte\n",
		"bpf/steer_bpfel.o":   "object",
		"bpf/steer.c":         "source of the object (make generate)",
		"xdp/trace_amd64.s":   "TEXT ·f(SB),0,$0\n",
		"xdp/link.go":         "package xdp\n",
		"xdp/link_test.go":    "package xdp\n",
		"scripts/tool/x.go":   "package main\n",
		"web/static/page.txt": "page",
		"web/web.go":          "package web\n\n//go:embed \"static\"\nvar static string\n",
	}
	for f, body := range files {
		p := filepath.Join(repo, f)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	touch := func(f string, tm time.Time) {
		t.Helper()
		if err := os.Chtimes(filepath.Join(repo, f), tm, tm); err != nil {
			t.Fatal(err)
		}
	}
	reset := func() {
		for f := range files {
			touch(f, old)
		}
		touch("bin/xmx", now)
	}
	reset()
	if got := newestSource(repo); got != "" {
		t.Fatalf("every input older than bin/xmx: newestSource = %q", got)
	}
	for _, f := range []string{"bpf/steer_bpfel.o", "go.mod", "go.sum", "xdp/trace_amd64.s", "xdp/link.go", "web/static/page.txt"} {
		reset()
		touch(f, time.Now())
		if got := newestSource(repo); got != f {
			t.Errorf("%s newer than bin/xmx: newestSource = %q", f, got)
		}
	}
	for _, f := range []string{"bpf/steer.c", "xdp/link_test.go", "scripts/tool/x.go"} {
		reset()
		touch(f, time.Now())
		if got := newestSource(repo); got != "" {
			t.Errorf("only %s (not an input of bin/xmx) changed: newestSource = %q", f, got)
		}
	}
}
