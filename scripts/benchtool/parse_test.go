package main

import (
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func fixture(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func near(a, b float64) bool { return math.Abs(a-b) < 1e-6*math.Max(1, math.Abs(b)) }

func TestParseUCXPerftest(t *testing.T) {
	for _, tc := range []struct {
		file               string
		iters              int
		rank, pct, overall float64
		bwMiBs             float64
	}{
		{"ucx_tag_lat_8_p50.txt", 20000, 50, 4.768, 4.866, 1.57},
		{"ucx_tag_lat_8_p99.txt", 20000, 99, 11.257, 4.686, 1.63},
		// Intermediate "[thread 0]" lines, then "Final:": the final line wins.
		{"ucx_tag_lat_8_intervals.txt", 400000, 50, 4.700, 4.386, 1.74},
		{"ucx_tag_lat_65536_full.txt", 3000, 50, 41.024, 42.313, 1477.08},
		{"ucx_tag_lat_8_csv.txt", 5000, 50, 4.567, 4.796, 1.59},
		// tag_bw: "overhead (usec)" header; MB/s is MiB/s.
		{"ucx_tag_bw_1m.txt", 1000, 50, 4.011, 205.316, 4870.54},
		{"ucx_tag_bw_8.txt", 200000, 50, 3.790, 4.081, 1.87},
	} {
		t.Run(tc.file, func(t *testing.T) {
			r, err := parseUCXPerftest(fixture(t, tc.file))
			if err != nil {
				t.Fatal(err)
			}
			if r.Iterations != tc.iters || !near(r.PercentileRank, tc.rank) || !near(r.PercentileUs, tc.pct) ||
				!near(r.OverallUs, tc.overall) || !near(r.BWOverallMiBs, tc.bwMiBs) {
				t.Errorf("got %+v, want iters %d rank %v pct %v overall %v bw %v", r, tc.iters, tc.rank, tc.pct, tc.overall, tc.bwMiBs)
			}
		})
	}
	// 1 MiB in 205.316 µs is 5107 MB/s (10^6): the MiB/s figure converts.
	r, _ := parseUCXPerftest(fixture(t, "ucx_tag_bw_1m.txt"))
	if mb := r.BWOverallMiBs * (1 << 20) / 1e6; math.Abs(mb-float64(1<<20)/205.316) > 2 {
		t.Errorf("tag_bw 1 MiB: %v MB/s does not match the per-message overhead", mb)
	}
	_, err := parseUCXPerftest(fixture(t, "ucx_noserver.txt"))
	if err == nil || !strings.Contains(err.Error(), "Connection refused") {
		t.Errorf("no server: got error %v, want one quoting UCX's connect error", err)
	}
	if _, err := parseUCXPerftest(""); err == nil {
		t.Error("empty output: no error")
	}
}

func TestParseFiPingpong(t *testing.T) {
	rows, err := parseFiPingpong(fixture(t, "fi_pingpong_8.txt"))
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 1 || rows[0].Bytes != "8" || rows[0].Iterations != "20k" || !near(rows[0].UsecPerXfer, 6.62) || !near(rows[0].Seconds, 0.26) {
		t.Errorf("8 B: got %+v", rows)
	}
	rows, err = parseFiPingpong(fixture(t, "fi_pingpong_1m.txt"))
	if err != nil {
		t.Fatal(err)
	}
	if rows[0].Bytes != fiSizeStr(1<<20) || !near(rows[0].UsecPerXfer, 412.90) || !near(rows[0].MBps, 2539.56) {
		t.Errorf("1 MiB: got %+v", rows)
	}
	_, err = parseFiPingpong(fixture(t, "fi_pingpong_noserver.txt"))
	if err == nil || !strings.Contains(err.Error(), "failed to connect") {
		t.Errorf("no server: got %v", err)
	}
}

// TestFiSizeStr: fi_pingpong's size column as libfabric's size_str()
// prints it (util/pingpong.c): base 1024, one truncated decimal below 10
// units, none from 10 on or when it is 0.
func TestFiSizeStr(t *testing.T) {
	for size, want := range map[int]string{
		8: "8", 1000: "1000", 1023: "1023", 1024: "1k", 1500: "1.4k", 1536: "1.5k", 2047: "1.9k",
		9000: "8.7k", 10*1024 + 1023: "10k", 20000: "19k", 65536: "64k", 1 << 20: "1m",
		1<<20 + 1<<19: "1.5m", 4000000: "3.8m", 1 << 30: "1g", 3 << 29: "1.5g",
	} {
		if got := fiSizeStr(size); got != want {
			t.Errorf("fiSizeStr(%d) = %q, want %q", size, got, want)
		}
	}
}

func TestParseSockperf(t *testing.T) {
	for _, tc := range []struct {
		file                 string
		mean, p50, p99, minv float64
		obs                  int
	}{
		{"sockperf_udp_14.txt", 9.344, 8.980, 18.000, 2.855, 29263},
		{"sockperf_tcp_14.txt", 11.188, 9.753, 20.823, 2.344, 24514},
		{"sockperf_udp_65507.txt", 81.223, 78.931, 134.813, 36.154, 3385},
		{"sockperf_tcp_65507.txt", 19.882, 19.353, 27.620, 16.963, 13817},
	} {
		t.Run(tc.file, func(t *testing.T) {
			r, err := parseSockperf(fixture(t, tc.file))
			if err != nil {
				t.Fatal(err)
			}
			if !near(r.MeanUs, tc.mean) || !near(r.P50Us, tc.p50) || !near(r.P99Us, tc.p99) || !near(r.MinUs, tc.minv) || r.Observations != tc.obs {
				t.Errorf("got %+v", r)
			}
		})
	}
	// sockperf exits 0 in all of these: the parser is the failure detector.
	for file, want := range map[string]string{
		"sockperf_invalid_size.txt": "Invalid message size: 8 (min: 14)",
		"sockperf_udp_noserver.txt": "No messages were received",
		"sockperf_tcp_noserver.txt": "Connection refused",
		"ucx_tag_lat_8_p50.txt":     "no \"Summary",
		"iperf3_tcp_131072.json":    "no \"Summary",
		"fi_pingpong_noserver.txt":  "no \"Summary",
		"xmx_pingpong_lines.json":   "no \"Summary",
		"linkbench_rounds1.json":    "no \"Summary",
	} {
		_, err := parseSockperf(fixture(t, file))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: got error %v, want one containing %q", file, err, want)
		}
	}
}

func TestParseIperf3JSON(t *testing.T) {
	r, err := parseIperf3JSON([]byte(fixture(t, "iperf3_tcp_131072.json")))
	if err != nil {
		t.Fatal(err)
	}
	if !near(r.ReceiverMBps, 33824660497.219357/8e6) || r.Retransmits != 1457 || r.LostPercent != 0 {
		t.Errorf("tcp: got %+v", r)
	}
	r, err = parseIperf3JSON([]byte(fixture(t, "iperf3_udp_1472.json")))
	if err != nil {
		t.Fatal(err)
	}
	// UDP: the receiver's rate, not the sender's.
	if !near(r.ReceiverMBps, 6021032742.922165/8e6) || !near(r.SenderMBps, 6970012269.64418/8e6) || !near(r.LostPercent, 13.609562426085487) {
		t.Errorf("udp: got %+v", r)
	}
	// A warning line before the JSON is tolerated.
	if _, err := parseIperf3JSON([]byte("warning: UDP block size 1472 exceeds TCP MSS 1448\n" + fixture(t, "iperf3_udp_64.json"))); err != nil {
		t.Errorf("udp with a warning first: %v", err)
	}
	_, err = parseIperf3JSON([]byte(fixture(t, "iperf3_noserver.json")))
	if err == nil || !strings.Contains(err.Error(), "unable to connect to server") {
		t.Errorf("no server: got %v", err)
	}
	if _, err := parseIperf3JSON([]byte("iperf3: parameter error - block size invalid")); err == nil {
		t.Error("not JSON: no error")
	}
}

func TestParseLinkbenchJSON(t *testing.T) {
	rows, err := parseLinkbenchJSON([]byte(fixture(t, "linkbench_rounds1.json")))
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 2 || rows[0].System != "afxdp-spin" || !near(rows[0].RTTP50us, 3.023) || !near(rows[1].FramesPerSec, 571569.5189937991) {
		t.Errorf("got %+v", rows)
	}
	if _, err := parseLinkbenchJSON([]byte("[]")); err == nil {
		t.Error("no rows: no error")
	}
	if _, err := parseLinkbenchJSON([]byte(`[{"system":"afxdp-spin"}]`)); err == nil {
		t.Error("row without figures: no error")
	}
}

func TestParseXMXJSON(t *testing.T) {
	pts, err := parseXMXJSON([]byte(fixture(t, "xmx_pingpong_lines.json")))
	if err != nil {
		t.Fatal(err)
	}
	if len(pts) != 2 || pts[0].Size != 8 || *pts[0].P50us != 3.1 || *pts[1].MinUs != 2.8 || pts[0].MBps != nil {
		t.Errorf("lines: got %+v", pts)
	}
	pts, err = parseXMXJSON([]byte(fixture(t, "xmx_stream_array.json")))
	if err != nil {
		t.Fatal(err)
	}
	if len(pts) != 2 || pts[1].Size != 1<<20 || *pts[1].MBps != 1234.5 || pts[0].P50us != nil {
		t.Errorf("array: got %+v", pts)
	}
	// Captured from the draft commands: extra fields are ignored.
	pts, err = parseXMXJSON([]byte(fixture(t, "xmx_pingpong_draft.json")))
	if err != nil || len(pts) != 1 || pts[0].Size != 8 || *pts[0].P50us != 2.1635 || *pts[0].P99us != 1294.5145 {
		t.Errorf("pingpong draft: %+v %v", pts, err)
	}
	pts, err = parseXMXJSON([]byte(fixture(t, "xmx_stream_draft.json")))
	if err != nil || len(pts) != 1 || pts[0].Size != 65536 || *pts[0].MBps != 1.29314697636954 || pts[0].P50us != nil {
		t.Errorf("stream draft: %+v %v", pts, err)
	}
	// Captured from xmx stream -umem (MTU 9000): says "umem":true.
	pts, err = parseXMXJSON([]byte(fixture(t, "xmx_stream_umem.json")))
	if err != nil || len(pts) != 1 || pts[0].Size != 1<<20 || !pts[0].UMEM || *pts[0].MBps != 1381.228342487137 ||
		pts[0].Messages != 662 || pts[0].Window != 16 || pts[0].Seconds != 0.50256521 {
		t.Errorf("stream -umem: %+v %v", pts, err)
	}
	if pts, err := parseXMXJSON([]byte(`{"size":8,"mean_us":2}`)); err != nil || len(pts) != 1 || pts[0].UMEM {
		t.Errorf("one object: %v %v", pts, err)
	}
	for _, bad := range []string{"", "not json", `{"p50_us":1}`, `{"size":8}`, `[{"size":8,"p50_us":1},]`} {
		if _, err := parseXMXJSON([]byte(bad)); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}

func TestParseSizes(t *testing.T) {
	got, err := parseSizes("1M, 8,64,1K,8,4k")
	if err != nil {
		t.Fatal(err)
	}
	want := []int{8, 64, 1024, 4096, 1 << 20}
	if len(got) != len(want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("got %v, want %v", got, want)
		}
	}
	for _, bad := range []string{"", "0", "-8", "abc", "32M", ","} {
		if _, err := parseSizes(bad); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
	for n, want := range map[int]string{8: "8", 1000: "1000", 1024: "1K", 65536: "64K", 1 << 20: "1M", 1500: "1500"} {
		if got := sizeLabel(n); got != want {
			t.Errorf("sizeLabel(%d) = %q, want %q", n, got, want)
		}
	}
}

func TestFlags(t *testing.T) {
	usageOut = io.Discard
	defer func() { usageOut = os.Stderr }()
	c, err := parseFlags([]string{"--quick"})
	if err != nil || c.rounds != 1 || len(c.sizes) != len(quickSizes) {
		t.Errorf("--quick: %+v %v", c, err)
	}
	if c.mtu != 1500 {
		t.Errorf("default MTU %d", c.mtu)
	}
	c, err = parseFlags([]string{"--rounds", "2", "--sizes", "8,1M", "--only", "ucx,sockperf", "--keep-lab", "--out", "/x"})
	if err != nil || c.rounds != 2 || len(c.sizes) != 2 || len(c.only) != 2 || !c.keepLab || c.out != "/x" {
		t.Errorf("flags: %+v %v", c, err)
	}
	for _, mtu := range []string{"1280", "3506", "9000", "65535"} {
		c, err = parseFlags([]string{"-mtu", mtu, "-sizes", "64K,256K,1M", "-only", "link,xmx,ucx", "-rounds", "3"})
		if err != nil || fmt.Sprint(c.mtu) != mtu || len(c.only) != 3 {
			t.Errorf("-mtu %s: %+v %v", mtu, c, err)
		}
	}
	if c, err := parseFlags([]string{"-xmx-rev", "abc1234"}); err != nil || c.xmxRev != "abc1234" {
		t.Errorf("-xmx-rev: %+v %v", c, err)
	}
	if c, err := parseFlags([]string{"-umem-gather", "descriptors"}); err != nil || c.gather != "descriptors" {
		t.Errorf("-umem-gather: %+v %v", c, err)
	}
	if !matchOnly("sockperf", "sockperf-udp") || matchOnly("sock", "sockperf-udp") || !matchOnly("ucx", "ucx") {
		t.Error("matchOnly")
	}
	// "xmx" is the family (the *-umem rows included); an exact name is that system only.
	for _, tc := range []struct {
		pattern, name string
		want          bool
	}{
		{"xmx", "xmx-spin", true}, {"xmx", "xmx-poll-umem", true}, {"xmx", "xmx-spin-umem", true},
		{"xmx-spin", "xmx-spin", true}, {"xmx-spin", "xmx-spin-umem", false}, {"xmx-spin-umem", "xmx-spin-umem", true},
		{"link", "link-poll", true}, {"xmx", "link-spin", false}, {"link", "xmx-spin", false},
	} {
		if got := matchOnly(tc.pattern, tc.name); got != tc.want {
			t.Errorf("matchOnly(%q, %q) = %v", tc.pattern, tc.name, got)
		}
	}
	for _, name := range []string{"xmx-spin-umem", "xmx-poll-umem"} {
		if !slices.Contains(allSystemNames(), name) {
			t.Errorf("%s not a system", name)
		}
	}
	for _, bad := range [][]string{{"--only", "nosuch"}, {"--rounds", "-1"}, {"--sizes", "x"}, {"extra"}, {"--many-clients"},
		{"-mtu", "1279"}, {"-mtu", "65536"}, {"-mtu", "0"}, {"-mtu", "jumbo"}, {"-umem-gather", "sometimes"}} {
		if _, err := parseFlags(bad); err == nil {
			t.Errorf("%v: no error", bad)
		}
	}
}
