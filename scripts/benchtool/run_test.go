package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
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
size=0; busy=no; once=no; json=no; peer=""
while [ $# -gt 0 ]; do
  case $1 in
  -sizes) size=$2; shift ;;
  -n|-time|-i) shift ;;
  -busy) busy=yes ;;
  -once) once=yes ;;
  -json) json=yes ;;
  -*) echo "unknown flag $1" >&2; exit 2 ;;
  *) peer=$1 ;;
  esac
  shift
done
if [ -z "$peer" ]; then
  [ $once = yes ] || { echo "server without -once" >&2; exit 2; }
  echo "xmx server: endpoint h2:0 on eth0 (afxdp copy), waiting for clients (Ctrl-C ends)" >&2
  sleep 0.2; exit 0
fi
[ "$peer" = h2 ] && [ "$XMX_HOSTNAME" = h1 ] && [ $json = yes ] || { echo "bad client: peer=$peer host=$XMX_HOSTNAME" >&2; exit 2; }
if [ "$sub" = pingpong ]; then
  if [ $busy = yes ]; then p50=2.5; else p50=5.5; fi
  echo "{\"size\":$size,\"iterations\":10,\"p50_us\":$p50,\"p99_us\":9.5,\"mean_us\":3.0,\"min_us\":2.0,\"mbps\":3.2}"
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
	spin := xmxSystem(bin, "xmx-spin", "busy-poll", "-busy")
	s, err := spin.Measure(e, Latency, 1, 64)
	if err != nil {
		t.Fatal(err)
	}
	if s.P50us == nil || *s.P50us != 2.5 || *s.P99us != 9.5 || s.MBps != nil || s.SizeUsed != 64 {
		t.Errorf("pingpong sample: %+v", s)
	}
	s, err = xmxSystem(bin, "xmx-poll", "blocking", "").Measure(e, Latency, 1, 8)
	if err != nil || *s.P50us != 5.5 {
		t.Errorf("blocking pingpong: %+v %v", s, err)
	}
	s, err = spin.Measure(e, Bandwidth, 1, 1<<20)
	if err != nil || s.MBps == nil || *s.MBps != 777.5 {
		t.Errorf("stream sample: %+v %v", s, err)
	}
	if xmxSystems(bin) != nil {
		t.Log("xmxSystems returns rows: xmx pingpong/stream exist now")
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
