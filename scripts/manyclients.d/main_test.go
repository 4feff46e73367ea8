package main

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func sweep(rounds ...[]float64) []Summary {
	sum := make([]Summary, len(rounds))
	for i, g := range rounds {
		sum[i].N = 1 << i
		sum[i].Goodputs = g
		sum[i].GoodputMBps = median(append([]float64(nil), g...))
	}
	return sum
}

func TestRatioIntervalSteady(t *testing.T) {
	// Rounds that agree leave nothing to resample: the interval is the ratio.
	sum := sweep([]float64{100, 100, 100}, []float64{200, 200, 200}, []float64{190, 190, 190})
	lo, hi, ok := ratioInterval(sum, 0.9)
	if !ok || lo != 0.95 || hi != 0.95 {
		t.Fatalf("steady rounds: interval %v..%v (ok %v), want 0.95..0.95", lo, hi, ok)
	}
}

func TestRatioIntervalNoisy(t *testing.T) {
	sum := sweep(
		[]float64{275, 260, 290, 281, 270},
		[]float64{385, 330, 420, 371, 402},
		[]float64{362, 340, 351, 398, 330},
	)
	ratio := sum[2].GoodputMBps / sum[1].GoodputMBps
	lo, hi, ok := ratioInterval(sum, 0.9)
	if !ok || !(lo < ratio && ratio < hi) || hi > 1.2 || lo < 0.7 {
		t.Fatalf("interval %v..%v (ok %v) for a ratio of %v", lo, hi, ok, ratio)
	}
	if lo2, hi2, _ := ratioInterval(sum, 0.9); lo2 != lo || hi2 != hi {
		t.Fatalf("same rounds, another interval: %v..%v then %v..%v", lo, hi, lo2, hi2)
	}
	if lo50, hi50, _ := ratioInterval(sum, 0.5); lo50 < lo || hi50 > hi {
		t.Fatalf("50 %% interval %v..%v outside the 90 %% one %v..%v", lo50, hi50, lo, hi)
	}
}

func TestRatioIntervalFewRounds(t *testing.T) {
	if _, _, ok := ratioInterval(sweep([]float64{1, 2, 3}, []float64{1, 2}), 0.9); ok {
		t.Fatal("an interval from two rounds")
	}
}

// writePoint writes the reports of point n<n>-r<r> under raw: server.json
// and one clients-h<K>.json per clients report (K from 2).
func writePoint(t *testing.T, raw string, n, r int, srv map[string]any, cls ...map[string]any) {
	t.Helper()
	dir := filepath.Join(raw, fmt.Sprintf("n%d-r%d", n, r))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	put := func(name string, v any) {
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	put("server.json", srv)
	for i, c := range cls {
		put(fmt.Sprintf("clients-h%d.json", i+2), c)
	}
}

// reports are the server's and one clients process's reports of a clean
// point: n clients sending size-byte messages at MTU 1500, 1000 messages
// in 3 s.
func reports(n, size int) (srv, cl map[string]any) {
	const msgs = 1000
	link := map[string]any{"kind": "afxdp", "mode": "copy drv poll", "interface": "eth0", "mtu": 1500}
	srv = map[string]any{"link": link, "recv_size": 65536, "recvs_posted": 64, "messages": msgs, "bytes": msgs * size,
		"active_s": 3.0, "goodput_mbps": float64(msgs*size) / 3 / 1e6, "sources": n}
	cl = map[string]any{"endpoints": n, "link": link, "peer_mtu": 1500, "size": size, "window": 2, "rendezvous": size > 32<<10,
		"duration_s": 3, "messages": msgs, "bytes": msgs * size, "lat_buckets_per_octave": 32, "lat_hist": [][2]uint64{{300, msgs}}}
	return srv, cl
}

// combine runs the combining step over raw into a new directory and
// returns its error (a missing gnuplot is none) and table.txt.
func combine(t *testing.T, raw string) (string, error) {
	t.Helper()
	out := t.TempDir()
	err := run(raw, out, "")
	if err != nil && strings.Contains(err.Error(), "gnuplot not found") {
		err = nil
	}
	table, _ := os.ReadFile(filepath.Join(out, "table.txt"))
	return string(table), err
}

// TestMixedSweepsRefused: reports of an earlier sweep left in raw/ (4 KiB
// messages, 3 rounds) beside this one's (64 KiB, n1-r1 rewritten) are not
// combined: the error names the point and what differs.
func TestMixedSweepsRefused(t *testing.T) {
	raw := t.TempDir()
	for r := 1; r <= 3; r++ {
		srv, cl := reports(1, 4096)
		writePoint(t, raw, 1, r, srv, cl)
	}
	srv, cl := reports(1, 65536)
	writePoint(t, raw, 1, 1, srv, cl)
	table, err := combine(t, raw)
	if err == nil || !strings.Contains(err.Error(), "n1-r2") || !strings.Contains(err.Error(), "message_size 4096 vs 65536") {
		t.Fatalf("mixed sweeps: got %v, want an error naming n1-r2 and its message_size; table:\n%s", err, table)
	}
}

// TestConfigChecked: every point's configuration is checked against the
// first one's, the clients reports of one point against each other, and
// every count must have the same rounds.
func TestConfigChecked(t *testing.T) {
	for _, c := range []struct {
		name   string
		change func(raw string)
		want   []string
	}{
		{"same", func(string) {}, nil},
		{"mtu", func(raw string) {
			srv, cl := reports(2, 65536)
			cl["peer_mtu"] = 9000
			writePoint(t, raw, 2, 1, srv, cl)
		}, []string{"n2-r1", "mtu 9000 vs 1500"}},
		{"window and duration", func(raw string) {
			srv, cl := reports(2, 65536)
			cl["window"], cl["duration_s"] = 4, 10
			writePoint(t, raw, 2, 1, srv, cl)
		}, []string{"n2-r1", "duration_s 10 vs 3", "window 4 vs 2"}},
		{"link", func(raw string) {
			srv, cl := reports(2, 65536)
			cl["link"] = map[string]any{"kind": "afpacket", "mode": "", "mtu": 1500}
			writePoint(t, raw, 2, 1, srv, cl)
		}, []string{"n2-r1", "link afpacket vs afxdp copy drv poll"}},
		{"rendezvous", func(raw string) {
			srv, cl := reports(2, 65536)
			cl["rendezvous"] = false
			writePoint(t, raw, 2, 1, srv, cl)
		}, []string{"n2-r1", "rendezvous false vs true"}},
		{"server receives", func(raw string) {
			srv, cl := reports(2, 65536)
			srv["recvs_posted"] = 8
			writePoint(t, raw, 2, 1, srv, cl)
		}, []string{"n2-r1", "server_recvs_posted 8 vs 64"}},
		{"clients of one point", func(raw string) {
			srv, cl := reports(2, 65536)
			_, other := reports(2, 4096)
			cl["endpoints"], other["endpoints"] = 1, 1
			writePoint(t, raw, 2, 1, srv, cl, other)
		}, []string{"n2-r1", "clients-h3.json", "clients-h2.json", "message_size 4096 vs 65536"}},
		{"rounds", func(raw string) {
			srv, cl := reports(1, 65536)
			writePoint(t, raw, 1, 2, srv, cl)
		}, []string{"N=2 has rounds [1], N=1 has rounds [1 2]"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			raw := t.TempDir()
			for _, n := range []int{1, 2} {
				srv, cl := reports(n, 65536)
				writePoint(t, raw, n, 1, srv, cl)
			}
			c.change(raw)
			table, err := combine(t, raw)
			if c.want == nil {
				if err != nil || !strings.Contains(table, "medians over 1 round(s)") {
					t.Fatalf("one sweep: %v; table:\n%s", err, table)
				}
				return
			}
			if err == nil {
				t.Fatalf("no error; table:\n%s", table)
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
		})
	}
}

// TestTruncatedMessagesReported: 128 KiB messages into the server's 64 KiB
// receives are cut to 64 KiB and counted as delivered; the point says so.
func TestTruncatedMessagesReported(t *testing.T) {
	raw := t.TempDir()
	srv, cl := reports(1, 131072)
	srv["truncated"], srv["bytes"] = 1000, 1000*65536
	writePoint(t, raw, 1, 1, srv, cl)
	out := t.TempDir()
	if err := run(raw, out, ""); err != nil && !strings.Contains(err.Error(), "gnuplot not found") {
		t.Fatal(err)
	}
	var res Results
	if b, err := os.ReadFile(filepath.Join(out, "results.json")); err != nil || json.Unmarshal(b, &res) != nil {
		t.Fatalf("results.json: %v", err)
	}
	const want = "server truncated 1000 of 1000 messages to its 65536-byte receives"
	if len(res.Points) != 1 || !strings.Contains(strings.Join(res.Points[0].Errors, "\n"), want) {
		t.Errorf("points %+v: no error %q", res.Points, want)
	}
	table, _ := os.ReadFile(filepath.Join(out, "table.txt"))
	if !strings.Contains(string(table), want) {
		t.Errorf("table does not say %q:\n%s", want, table)
	}
	for _, tg := range res.Targets {
		if tg.Pass {
			t.Errorf("every message truncated, yet %s passes: %s", tg.Name, tg.Detail)
		}
	}
}

// TestTargetsNeedCompletePoints: at N=128, 28 clients never reached the
// server, 40 sends failed and 12 never finished: no target passes, and
// the completeness target says why. The same sweep without them passes.
func TestTargetsNeedCompletePoints(t *testing.T) {
	sum := func(broken bool) []Summary {
		s := []Summary{
			{Point: Point{N: 32, GoodputMBps: 400}, Rounds: 1, Goodputs: []float64{400}},
			{Point: Point{N: 128, GoodputMBps: 395}, Rounds: 1, Goodputs: []float64{395}},
		}
		if broken {
			s[1].Failed, s[1].Unfinished = 40, 12
			s[1].Errors = []string{"server heard from 100 sources, want 128"}
		}
		return s
	}
	for _, tg := range targets(sum(false)) {
		if !tg.Pass || tg.NotApplicable {
			t.Errorf("complete sweep: %s: pass %v, n/a %v: %s", tg.Name, tg.Pass, tg.NotApplicable, tg.Detail)
		}
	}
	tgs := targets(sum(true))
	for _, tg := range tgs {
		if tg.Pass {
			t.Errorf("28 of 128 clients silent, 40 failed and 12 unfinished sends: %s passes: %s", tg.Name, tg.Detail)
		}
		if !strings.Contains(tg.Detail, "N=128") {
			t.Errorf("%s does not name N=128: %s", tg.Name, tg.Detail)
		}
	}
	for _, want := range []string{"failed sends or receives: 40", "unfinished sends: 12", "server heard from 100 sources, want 128"} {
		if !strings.Contains(tgs[0].Detail, want) {
			t.Errorf("completeness target does not say %q: %s", want, tgs[0].Detail)
		}
	}
}

// TestGoodputTargetOneCount: with one client count the goodput target is
// not applicable, not a pass at 1.00, and the table says "n/a".
func TestGoodputTargetOneCount(t *testing.T) {
	sum := []Summary{{Point: Point{N: 128, GoodputMBps: 395}, Rounds: 1, Goodputs: []float64{395}}}
	var goodput *Target
	tgs := targets(sum)
	for i := range tgs {
		if strings.HasPrefix(tgs[i].Name, "goodput") {
			goodput = &tgs[i]
		}
	}
	if goodput == nil || goodput.Pass || !goodput.NotApplicable || !strings.Contains(goodput.Detail, "not applicable") {
		t.Fatalf("one count: goodput target %+v, want not applicable", goodput)
	}
	var b strings.Builder
	table(&b, &Results{Config: map[string]any{}, Machine: map[string]any{}, Summary: sum, Targets: tgs})
	if !strings.Contains(b.String(), "n/a: not applicable") {
		t.Errorf("table does not say n/a:\n%s", b.String())
	}
}

// TestHeadersPct: 64 KiB pulled at MTU 1500 take 45 frames of 1468 bytes
// of data, each with 46 bytes of headers (Ethernet, common, pull reply),
// and a 60-byte rendezvous record: 2130 of 67666 received bytes, 3.15 %
// (the 96.85 % ceiling of wire%); eagerly, 45 frames of 1460 bytes with 54
// each.
func TestHeadersPct(t *testing.T) {
	for _, c := range []struct {
		size, mtu int
		rndv      bool
		want      float64
	}{
		{65536, 1500, true, 100 * 2130.0 / 67666},
		{65536, 1500, false, 100 * 2430.0 / 67966},
		{65536, 9000, true, 100 * (8*46.0 + 60) / (65536 + 8*46 + 60)},
		{4096, 1500, false, 100 * 3 * 54.0 / (4096 + 3*54)},
	} {
		got, ok := headersPct(c.size, c.mtu, c.rndv)
		if !ok || math.Abs(got-c.want) > 1e-9 {
			t.Errorf("headersPct(%d, %d, %v) = %v, %v; want %v", c.size, c.mtu, c.rndv, got, ok, c.want)
		}
	}
	if _, ok := headersPct(65536, 0, true); ok {
		t.Error("no MTU: ok")
	}
}

// TestPlotLabels: the third panel's series are labelled with what they are
// a share of, and the headers' floor is computed from the run's size and
// MTU (left out when the reports lack the MTU).
func TestPlotLabels(t *testing.T) {
	res := &Results{Date: "2026-11-21T00:00:00Z", Machine: map[string]any{"summary": "test"},
		Config:  map[string]any{"message_size": 65536, "window": 2, "server_recvs_posted": 64, "rendezvous": true, "mtu": 1500},
		Summary: []Summary{{Point: Point{N: 1}, Rounds: 1}, {Point: Point{N: 2}, Rounds: 1}}}
	script := plotScript(res, "s.dat", "p.dat", "plot.png")
	for _, want := range []string{"set ylabel 'percent'", "data sent more than once (% of goodput)",
		"(1 - wire efficiency, % of received bytes; headers alone: 3.15)"} {
		if !strings.Contains(script, want) {
			t.Errorf("plot script lacks %q:\n%s", want, script)
		}
	}
	if strings.Contains(script, "percent of goodput") {
		t.Errorf("plot script calls 1 - wire efficiency a percent of goodput:\n%s", script)
	}
	delete(res.Config, "mtu")
	if script := plotScript(res, "s.dat", "p.dat", "plot.png"); strings.Contains(script, "headers alone") {
		t.Errorf("no MTU, yet a headers' share:\n%s", script)
	}
}
