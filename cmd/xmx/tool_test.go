package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/xmx-stack/xmx/internal/netlab"
	"github.com/xmx-stack/xmx/msglayer"
)

func TestParseSizes(t *testing.T) {
	got, err := parseSizes("0,8,1k,64K,1M,1G", 0, 0, 2)
	if err != nil || len(got) != 6 || got[2] != 1024 || got[3] != 65536 || got[4] != 1<<20 || got[5] != 1<<30 {
		t.Fatalf("list: %v, %v", got, err)
	}
	var f sizeFlag
	if err := f.Set("16M"); err != nil || f.n != 16<<20 {
		t.Fatalf("sizeFlag 16M: %v, %v", f.n, err)
	}
	if err := f.Set("-1"); err == nil {
		t.Fatal("sizeFlag took -1")
	}
	got, err = parseSizes("", 0, 16, 2)
	if want := []int{0, 1, 2, 4, 8, 16}; err != nil || len(got) != len(want) {
		t.Fatalf("sweep: %v, %v; want %v", got, err, want)
	}
	// Up to the largest size: ends (a step past the largest int used to
	// wrap and loop for ever).
	got, err = parseSizes("", 1, 1<<32-1, 2)
	if err != nil || len(got) != 32 || got[31] != 1<<31 {
		t.Fatalf("sweep to the largest size: %d sizes, last %v, %v", len(got), got[len(got)-1:], err)
	}
	got, err = parseSizes("", 1<<32-2, 1<<32-1, 1e300)
	if err != nil || len(got) != 1 {
		t.Fatalf("sweep with a huge step: %v, %v", got, err)
	}
	// At most maxSizes sizes, a list or a sweep (steps of 1 below 10000).
	if got, err = parseSizes(strings.Repeat("8,", maxSizes-1)+"8", 0, 0, 2); err != nil || len(got) != maxSizes {
		t.Fatalf("a list of %d sizes: %d, %v", maxSizes, len(got), err)
	}
	if got, err = parseSizes("", 0, maxSizes-1, 1.0001); err != nil || len(got) != maxSizes {
		t.Fatalf("a sweep of %d sizes: %d, %v", maxSizes, len(got), err)
	}
	for _, bad := range []struct {
		list       string
		start, end int
		mult       float64
	}{{"8,x", 0, 0, 2}, {"-1", 0, 0, 2}, {"", 10, 5, 2}, {"", 0, 10, 1}, {"", 0, 10, math.NaN()},
		{"", 0, 10, math.Inf(1)}, {"", 1, math.MaxInt, 2}, {"", 0, 1 << 40, 2}, {"8000000k", 0, 0, 2}, {"4G", 0, 0, 2},
		{"", 0, 1<<32 - 1, 1.000001}, {"", 0, maxSizes, 1.0001}, {strings.Repeat("8,", maxSizes) + "8", 0, 0, 2}} {
		if _, err := parseSizes(bad.list, bad.start, bad.end, bad.mult); !errors.Is(err, errUsage) {
			t.Errorf("parseSizes(%+v) = %v, want a usage error", bad, err)
		}
	}
}

// TestUsage checks that the command list names every command, with its
// summary in one column however long the longest name.
func TestUsage(t *testing.T) {
	var b bytes.Buffer
	writeUsage(&b)
	col := -1
	for name, c := range commands {
		var line string
		for l := range strings.Lines(b.String()) {
			if strings.HasPrefix(l, "  "+name+" ") {
				line = l
			}
		}
		if line == "" {
			t.Errorf("usage does not list %q:\n%s", name, b.String())
			continue
		}
		at := strings.Index(line, c.summary)
		if at < len("  "+name+" ") {
			t.Errorf("usage line %q: no summary after the name", line)
			continue
		}
		if col >= 0 && at != col {
			t.Errorf("summary of %q starts at column %d, another at %d:\n%s", name, at, col, b.String())
		}
		col = at
	}
}

// TestArgErrors checks that bad command lines fail with a usage error that
// names the flag, before anything needs root or a network.
func TestArgErrors(t *testing.T) {
	cases := []struct {
		run  func([]string) error
		args []string
		want string
	}{
		{runPingPong, []string{"-n", "0"}, "-n"},
		{runPingPong, []string{"-n", "1000000000000000000"}, "-n"},
		{runPingPong, []string{"-warmup", "9223372036854775807"}, "-warmup"},
		{runPingPong, []string{"-timeout", "0s"}, "-timeout"},
		{runPingPong, []string{"-timeout", "2ns"}, "-timeout"}, // the watch's ticker would be 0
		{runPingPong, []string{"-mult", "NaN"}, "-mult"},
		{runPingPong, []string{"-start", "0", "-end", "4095M", "-mult", "1.000001"}, "-mult"},
		{runStream, []string{"-sizes", strings.Repeat("1k,", 1000) + "1k"}, "-sizes"},
		{runLinkBench, []string{"-mtu", "0"}, "-mtu"},
		{runLinkBench, []string{"-stream-time", "0s"}, "-stream-time"},
		{runPingPong, []string{"-e", "300"}, "-e"},
		{runPingPong, []string{"-link", "bogus"}, "-link"},
		{runPingPong, []string{"-sizes", "1x"}, "-sizes"},
		{runPingPong, []string{"a", "b"}, "PEER"},
		{runPingPong, []string{"-spin", "soon"}, "-spin"},
		{runPingPong, []string{"-spin", "2s"}, "-spin"},
		{runStream, []string{"-spin", "-1us"}, "-spin"},
		{runStream, []string{"-window", "0"}, "-window"},
		{runStream, []string{"-time", "0s"}, "-time"},
		{runStream, []string{"-umem-gather", "copy"}, "only with -umem"},
		{runStream, []string{"-umem", "-umem-gather", "some"}, `-umem-gather "some"`},
		{runLinkBench, []string{"-rounds", "0"}, "-rounds"},
		{runLinkBench, []string{"-n", "4611686018427387904"}, "-n"},
		{runLinkBench, []string{"-warmup", "9223372036854775807", "-n", "1"}, "-warmup"},
		{runLinkBench, []string{"-warmup", "-1"}, "-warmup"},
		{runLinkBench, []string{"-rounds", "1000000"}, "-rounds"},
		{runLinkBench, []string{"-rounds", "1000", "-n", "1000000"}, "-rounds 1000 -n 1000000"},
		{runLinkBench, []string{"-stream-time", "1000h"}, "-stream-time"},
		{runLinkBench, []string{"-systems", "nope"}, "nope"},
		{runRegBench, []string{"-time", "0s"}, "-time"},
		{runRegBench, []string{"-time", "1000h"}, "-time"},
		{runStream, []string{"-time", "1000h"}, "-time"},
		{runStream, []string{"-n", "1000000000000"}, "-n"},
		{runPingPong, []string{"-timeout", "1000h"}, "-timeout"},
		{runRegBench, []string{"-sizes", "0,64"}, "-sizes"},
		{runPingPong, []string{"-max-size", "-1"}, "-max-size"},
		{runStream, []string{"-max-size", "5G"}, "-max-size"},
		{runStream, []string{"-max-recv-bytes", "64k"}, "-max-recv-bytes 65536"},
		{runPingPong, []string{"-max-recv-bytes", "5G"}, "-max-recv-bytes"},
		{runPingPong, []string{"-max-size", "1G"}, "-max-size 1073741824 -max-recv-bytes 536870912"},
		{runStream, []string{"-max-size", "1M", "-max-recv-bytes", "1M"}, "-max-size 1048576 -max-recv-bytes 1048576"},
		{runStream, []string{"-umem", "-sizes", "2G", "02:78:6d:00:00:02"}, "-umem"},
		{runPingPong, []string{"-peer-ep", "5", "02:78:6d:00:00:02"}, "-peer-ep"},
		{runPingPong, []string{"-peer-ep", "5", "02:78:6d:00:00:02:4"}, "-peer-ep"},
		{runPingPong, []string{"02:78:6d:00:00:zz"}, "02:78:6d:00:00:zz"},
		{runPingPong, []string{"-bogus"}, "-bogus"},
		{runPingPong, []string{"-start", "2M", "-end", "1M"}, "-start 2097152 -end 1048576"},
		{runStream, []string{"-end", "1x"}, "-end"},
		{runStream, []string{"-warmup", "-1"}, "-warmup"},
		{runInfo, []string{"-bogus"}, "-bogus"},
		{runRegBench, []string{"-time", "soon"}, "-time"},
		// A stray argument is refused first (with -time 0s, lest the
		// benchmark run where it is not).
		{runRegBench, []string{"-time", "0s", "extra"}, `unexpected argument "extra"`},
		{runLinkBench, []string{"-n", "0", "extra"}, `unexpected argument "extra"`},
	}
	for _, c := range cases {
		err := c.run(c.args)
		if !errors.Is(err, errUsage) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: %v; want a usage error naming %q", c.args, err, c.want)
		}
	}
}

// TestUsageMessage: main prints a usage error without its mark, also
// when a wrapper put the mark inside (a review found "endpoint 1: usage:
// -i eth9: ..." from xmx manyclients).
func TestUsageMessage(t *testing.T) {
	for _, c := range []struct {
		err  error
		want string
	}{
		{fmt.Errorf("%w: -n 0: want 1..255", errUsage), "-n 0: want 1..255"},
		{fmt.Errorf("endpoint 1: %w", fmt.Errorf("%w: -i eth9: no such interface", errUsage)), "endpoint 1: -i eth9: no such interface"},
	} {
		if got := usageMessage(c.err); got != c.want {
			t.Errorf("usageMessage(%q) = %q, want %q", c.err, got, c.want)
		}
	}
}

// TestParseFlags checks that a bad flag is a usage error naming it, with
// nothing printed (main prints it once), and that only -h prints the
// command's usage.
func TestParseFlags(t *testing.T) {
	newSet := func(out *bytes.Buffer) *flag.FlagSet {
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		fs.SetOutput(out)
		fs.Usage = func() { fmt.Fprintln(fs.Output(), "usage: t [flags]") }
		fs.Int("n", 1, "a number")
		return fs
	}
	for _, args := range [][]string{{"-n", "x"}, {"-m", "1"}, {"-n"}} {
		var out bytes.Buffer
		err := parseFlags(newSet(&out), args)
		if !errors.Is(err, errUsage) || !strings.Contains(err.Error(), strings.TrimPrefix(args[0], "-")) {
			t.Errorf("%q: %v; want a usage error naming the flag", args, err)
		}
		if out.Len() != 0 {
			t.Errorf("%q printed %q; want nothing", args, out.String())
		}
	}
	var out bytes.Buffer
	if err := parseFlags(newSet(&out), []string{"-h"}); !errors.Is(err, flag.ErrHelp) || out.String() != "usage: t [flags]\n" {
		t.Errorf("-h: %v, printed %q; want flag.ErrHelp and the usage", err, out.String())
	}
	out.Reset()
	fs := newSet(&out)
	if err := parseFlags(fs, []string{"-n", "7", "rest"}); err != nil || fs.NArg() != 1 || out.Len() != 0 {
		t.Errorf("good flags: %v, %d args, printed %q", err, fs.NArg(), out.String())
	}
	if fs.Output() != &out {
		t.Error("parseFlags did not give the flag set its output back")
	}
}

// TestErrorsSayWhatToDo runs the tool on command lines that fail before
// any socket opens: each exits with its status and one line on standard
// error that says what to do.
func TestErrorsSayWhatToDo(t *testing.T) {
	bin := buildTool(t)
	// run runs the tool with args, behind the command in as if any.
	run := func(as []string, args ...string) (int, string) {
		t.Helper()
		argv := append(append(as[:len(as):len(as)], bin), args...)
		cmd := exec.Command(argv[0], argv[1:]...)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		err := cmd.Run()
		return exitCode(err), stderr.String()
	}
	for _, c := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"pingpong", "-start", "4x"}, 2, `xmx pingpong: invalid value "4x" for flag -start`},
		{[]string{"stream", "-bogus"}, 2, "flag provided but not defined: -bogus (xmx stream -h lists the flags)"},
		{[]string{"nosuchcommand"}, 2, `unknown command "nosuchcommand"`},
	} {
		code, stderr := run(nil, c.args...)
		if code != c.code || !strings.Contains(stderr, c.want) {
			t.Errorf("xmx %q: exit %d, %q; want exit %d and %q", c.args, code, stderr, c.code, c.want)
		}
		if c.args[0] != "nosuchcommand" && strings.Count(stderr, "\n") != 1 {
			t.Errorf("xmx %q printed %d lines, want one:\n%s", c.args, strings.Count(stderr, "\n"), stderr)
		}
	}
	netlab.RequirePrivileged(t) // the rest: an interface check, and a run as another user
	// A name that names no interface is a bad flag (exit 2), like any.
	if code, stderr := run(nil, "pingpong", "-i", "nosuch0"); code != 2 || !strings.Contains(stderr, "-i nosuch0: no such interface (see ip link)") {
		t.Errorf("an unknown interface: exit %d, %q", code, stderr)
	}
	setpriv, err := exec.LookPath("setpriv")
	if err != nil {
		t.Skip("no setpriv (util-linux) to run the tool as another user")
	}
	nobody := []string{setpriv, "--reuid=65534", "--regid=65534", "--clear-groups"}
	// Where another user may run it: t.TempDir is the test user's alone.
	shared, err := os.MkdirTemp("", "xmx-nobody")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(shared) })
	if data, err := os.ReadFile(bin); err != nil || os.Chmod(shared, 0o755) != nil || os.WriteFile(filepath.Join(shared, "xmx"), data, 0o755) != nil {
		t.Fatalf("copy the tool for another user: %v", err)
	}
	bin = filepath.Join(shared, "xmx")
	for _, cmd := range []string{"pingpong", "stream"} {
		if code, stderr := run(nobody, cmd, "-i", "lo"); code != 1 || !strings.Contains(stderr, "needs root (AF_XDP, BPF and network namespaces): run it with sudo") {
			t.Errorf("%s without root: exit %d, %q", cmd, code, stderr)
		}
	}
}

// TestDemo runs the README's demo (scripts/demo, what make demo runs
// after building) with a fresh build of the tool: it must end well, print
// the ping-pong, stream and link tables, and leave no lab behind.
func TestDemo(t *testing.T) {
	netlab.RequirePrivileged(t)
	bin := buildTool(t)
	cmd := exec.Command("../../scripts/demo")
	cmd.Env = append(os.Environ(), "XMX="+bin)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	// The demo and its server (which inherits the output pipe) are a
	// process group of their own: a demo that overstays its 5 minutes is
	// asked to stop (its cleanup takes the lab down), then the group is
	// killed, and Wait does not wait for a pipe some child still holds.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.WaitDelay = 10 * time.Second
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// The demo's lab is named after its PID; gone already unless the demo
	// was killed.
	pid := cmd.Process.Pid
	name := fmt.Sprintf("d%d", pid%10000000)
	t.Cleanup(func() { exec.Command("../../scripts/lab", "down", "--name", name).Run() })
	timer := time.AfterFunc(5*time.Minute, func() {
		syscall.Kill(-pid, syscall.SIGTERM)
		time.AfterFunc(20*time.Second, func() { syscall.Kill(-pid, syscall.SIGKILL) })
	})
	err := cmd.Wait()
	timer.Stop()
	if err != nil {
		t.Fatalf("scripts/demo: %v\n%s", err, out.String())
	}
	for _, want := range []string{"# xmx pingpong", "busy-poll", "# xmx stream", "link benchmark: veth lab"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("the demo's output has no %q:\n%s", want, out.String())
		}
	}
	if list, _ := exec.Command("ip", "netns", "list").Output(); strings.Contains(string(list), name+"-") {
		t.Errorf("the demo left its lab %s behind:\n%s", name, list)
	}
}

// TestSpinFlag checks -spin's values and what they ask msglayer for.
func TestSpinFlag(t *testing.T) {
	for _, c := range []struct {
		arg  string
		want time.Duration
		mode string
	}{
		{"", 0, "blocking, adaptive poll"},
		{"auto", 0, "blocking, adaptive poll"},
		{"0", msglayer.NoSpin, "blocking"},
		{"50us", 50 * time.Microsecond, "blocking after 50µs of polling"},
	} {
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		var f endpointFlags
		f.register(fs, 0)
		args := []string{}
		if c.arg != "" {
			args = append(args, "-spin", c.arg)
		}
		if err := fs.Parse(args); err != nil {
			t.Fatalf("-spin %q: %v", c.arg, err)
		}
		if got := f.spin.config(); got != c.want || f.spin.mode() != c.mode {
			t.Errorf("-spin %q: SpinBeforeSleep %v, mode %q; want %v, %q", c.arg, got, f.spin.mode(), c.want, c.mode)
		}
	}
}

// buildTool builds the xmx binary for end-to-end tests.
func buildTool(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "xmx")
	out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// startServer runs bin with args on h (with env) until stop, which the
// test's cleanup also calls: an interrupt, then a kill after 5 s. log
// collects the server's standard error.
func startServer(t *testing.T, h *netlab.Host, bin string, env []string, args ...string) (log *bytes.Buffer, stop func()) {
	t.Helper()
	server := h.Command(bin, args...)
	server.Env = env
	log = &bytes.Buffer{}
	server.Stderr = log
	if err := server.Start(); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	stop = func() {
		once.Do(func() {
			server.Process.Signal(os.Interrupt)
			done := make(chan struct{})
			go func() { server.Wait(); close(done) }()
			select {
			case <-done:
			case <-time.After(5 * time.Second):
				server.Process.Kill()
				<-done
			}
		})
	}
	t.Cleanup(stop)
	return log, stop
}

// runClient runs bin with args on h (as host h1) and returns its standard
// output, retrying briefly while the server may still be opening its
// endpoint; a failure ends the test with its stderr and serverLog.
func runClient(t *testing.T, h *netlab.Host, bin string, serverLog *bytes.Buffer, args ...string) []byte {
	t.Helper()
	var out []byte
	var err error
	for try := 0; try < 20; try++ {
		cmd := h.Command(bin, args...)
		cmd.Env = append(os.Environ(), "XMX_HOSTNAME=h1")
		if out, err = cmd.Output(); err == nil {
			return out
		}
		time.Sleep(100 * time.Millisecond)
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		t.Fatalf("xmx %v: %v\n%s\nserver: %s", args, err, ee.Stderr, serverLog.String())
	}
	t.Fatalf("xmx %v: %v", args, err)
	return nil
}

// TestEndToEnd runs a server on h2 and pingpong and stream clients on h1 of
// a fresh lab, with -json output parsed back.
func TestEndToEnd(t *testing.T) {
	lab := netlab.New(t, netlab.Options{Hosts: 2})
	bin := buildTool(t)
	h1, h2 := lab.Hosts[0], lab.Hosts[1]
	serverLog, _ := startServer(t, h2, bin, append(os.Environ(), "XMX_HOSTNAME=h2"), "pingpong", "-i", "eth0")
	client := func(args ...string) []byte {
		t.Helper()
		return runClient(t, h1, bin, serverLog, args...)
	}

	sizes := []int{0, 8, 1024, 65536, 1 << 20}
	out := client("pingpong", "-i", "eth0", "-e", "1", "-json", "-hist", "-sizes", "0,8,1k,64k,1M", "-n", "200", "-warmup", "20", "h2")
	got := jsonLines[pingResult](t, "pingpong", out)
	if len(got) != len(sizes) {
		t.Fatalf("pingpong printed %d results, want %d:\n%s", len(got), len(sizes), out)
	}
	for i, r := range got {
		if r.Size != sizes[i] || r.Iterations != 200 || r.MinUs <= 0 || r.MinUs > r.P50us || r.P50us > r.P99us || r.MeanUs < r.MinUs {
			t.Errorf("pingpong result %+v is inconsistent", r)
		}
		total := 0
		for _, c := range r.Histogram {
			total += c
		}
		if total != r.Iterations || len(r.HistogramUpperUs) != len(r.Histogram) || r.HistogramUpperUs[len(r.HistogramUpperUs)-1] < r.P99us {
			t.Errorf("pingpong -hist: %v below %v µs for %d round trips (p99 %v µs)", r.Histogram, r.HistogramUpperUs, r.Iterations, r.P99us)
		}
	}

	// A client asking for larger messages than any before: the server
	// must take back the receives it posted with smaller buffers.
	big := client("pingpong", "-i", "eth0", "-e", "4", "-json", "-sizes", "4M", "-n", "5", "-warmup", "1", "h2")
	var r4 pingResult
	if err := json.Unmarshal(bytes.TrimSpace(big), &r4); err != nil || r4.Size != 4<<20 {
		t.Fatalf("4 MiB pingpong after smaller ones: %v\n%s", err, big)
	}

	// The table form has a header and one line per size.
	table := client("pingpong", "-i", "eth0", "-e", "2", "-sizes", "8,64", "-n", "100", "-busy", "h2")
	lines := strings.Split(strings.TrimSpace(string(table)), "\n")
	if len(lines) != 4 || !strings.HasPrefix(lines[0], "# xmx pingpong") || !strings.Contains(lines[0], "busy-poll") {
		t.Errorf("pingpong table:\n%s", table)
	}

	out = client("stream", "-i", "eth0", "-e", "3", "-json", "-sizes", "4k,1M", "-n", "200", "-window", "8", "h2")
	streams := jsonLines[streamResult](t, "stream", out)
	if len(streams) != 2 || streams[0].Size != 4096 || streams[1].Size != 1<<20 {
		t.Fatalf("stream results: %+v", streams)
	}
	for _, r := range streams {
		if r.Messages != 200 || r.Received != 200 || r.MBps <= 0 || r.Window != 8 {
			t.Errorf("stream result %+v", r)
		}
	}

	// Synchronous sends after a warm-up: the server counts only the
	// measured messages.
	out = client("stream", "-i", "eth0", "-e", "6", "-json", "-sync", "-warmup", "30", "-sizes", "8,64k", "-n", "100", "-window", "4", "h2")
	streams = jsonLines[streamResult](t, "stream -sync", out)
	if len(streams) != 2 {
		t.Fatalf("stream -sync -warmup results: %+v", streams)
	}
	for _, r := range streams {
		if r.Messages != 100 || r.Received != 100 || !r.Sync || r.MBps <= 0 {
			t.Errorf("stream -sync -warmup result %+v", r)
		}
	}
	table = client("stream", "-i", "eth0", "-e", "6", "-sync", "-warmup", "5", "-sizes", "1k", "-n", "20", "h2")
	if !strings.Contains(string(table), "5 warm-up messages per size, synchronous sends") {
		t.Errorf("stream -sync -warmup table:\n%s", table)
	}

	// Sizes above the server's -max-size are refused before they are
	// sent, with a usage error that names the server's flag and does not
	// point at the client's own -h.
	tooBig := h1.Command(bin, "pingpong", "-i", "eth0", "-e", "5", "-sizes", "8,32M", "-n", "5", "h2")
	tooBig.Env = append(os.Environ(), "XMX_HOSTNAME=h1")
	if msg, err := tooBig.CombinedOutput(); exitCode(err) != 2 || !strings.Contains(string(msg), "restart it with -max-size 33554432 or more") ||
		strings.Contains(string(msg), "-h lists") || strings.Contains(string(msg), "usage") {
		t.Errorf("pingpong above the server's -max-size: %v\n%s", err, msg)
	}

	// From a buffer lent from the client's UMEM.
	for _, g := range []string{"auto", "descriptors", "copy"} {
		out = client("stream", "-i", "eth0", "-e", "4", "-umem", "-umem-gather", g, "-sizes", "1M", "-n", "50", "h2")
		if !strings.Contains(string(out), "sending from a UMEM buffer") {
			t.Errorf("stream -umem -umem-gather %s:\n%s", g, out)
		}
	}
}

// jsonLines parses out, the -json output of the tool's command cmd: one
// T a line.
func jsonLines[T any](t *testing.T, cmd string, out []byte) []T {
	t.Helper()
	var got []T
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		var r T
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatalf("%s -json line %q: %v", cmd, sc.Text(), err)
		}
		got = append(got, r)
	}
	return got
}

// exitCode is the exit status of a finished command (-1 if it did not
// exit, 0 without an error).
func exitCode(err error) int {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode()
	}
	if err != nil {
		return -1
	}
	return 0
}

// TestServerGone checks that a client whose server dies in the middle of
// a run ends within about -timeout, saying so, instead of waiting for an
// answer for ever (a receive names no peer).
func TestServerGone(t *testing.T) {
	lab := netlab.New(t, netlab.Options{Hosts: 2})
	bin := buildTool(t)
	h1, h2 := lab.Hosts[0], lab.Hosts[1]
	for _, args := range [][]string{
		{"pingpong", "-i", "eth0", "-timeout", "2s", "-sizes", "8,64k", "-n", "50000000", "h2"},
		{"stream", "-i", "eth0", "-timeout", "2s", "-sizes", "64k", "-time", "60s", "h2"},
	} {
		server := h2.Command(bin, args[0], "-i", "eth0")
		server.Env = append(os.Environ(), "XMX_HOSTNAME=h2")
		if err := server.Start(); err != nil {
			t.Fatal(err)
		}
		var out bytes.Buffer
		var client *exec.Cmd
		done := make(chan error, 1)
		for try := 0; ; try++ { // the server may still be opening its endpoint
			out.Reset()
			client = h1.Command(bin, args...)
			client.Env = append(os.Environ(), "XMX_HOSTNAME=h1")
			client.Stdout, client.Stderr = &out, &out
			if err := client.Start(); err != nil {
				t.Fatal(err)
			}
			go func() { done <- client.Wait() }()
			select {
			case err := <-done:
				if try < 20 {
					time.Sleep(100 * time.Millisecond)
					continue
				}
				t.Fatalf("%s: %v\n%s", args[0], err, out.String())
			case <-time.After(1500 * time.Millisecond): // measuring
			}
			break
		}
		server.Process.Kill()
		server.Wait()
		select {
		case err := <-done:
			if msg := out.String(); exitCode(err) != 1 || !strings.Contains(msg, "stopped answering") && !strings.Contains(msg, "no answer from") {
				t.Errorf("%s whose server died: %v\n%s", args[0], err, msg)
			}
		case <-time.After(15 * time.Second):
			client.Process.Kill()
			<-done
			t.Errorf("%s still waiting 15 s after its server died:\n%s", args[0], out.String())
		}
	}
}

// rank takes the lower of the middle two for p50 and, below 101 samples,
// not the maximum for p99 (pingpong used to report the maximum for both at
// -n 2, and for p99 at every -n up to 100).
func TestRank(t *testing.T) {
	us := func(v ...int) []time.Duration {
		d := make([]time.Duration, len(v))
		for i, x := range v {
			d[i] = time.Duration(x) * time.Microsecond
		}
		return d
	}
	hundred := make([]int, 100)
	for i := range hundred {
		hundred[i] = i + 1
	}
	thousand := make([]int, 1000)
	for i := range thousand {
		thousand[i] = i + 1
	}
	for _, c := range []struct {
		name   string
		sorted []time.Duration
		p      int
		want   time.Duration
	}{
		{"one p50", us(7), 50, 7 * time.Microsecond},
		{"one p99", us(7), 99, 7 * time.Microsecond},
		{"two p50", us(44, 95), 50, 44 * time.Microsecond},
		{"two p99", us(44, 95), 99, 44 * time.Microsecond},
		{"three p50", us(1, 2, 3), 50, 2 * time.Microsecond},
		{"hundred p99", us(hundred...), 99, 99 * time.Microsecond},
		{"thousand p99", us(thousand...), 99, 990 * time.Microsecond},
		{"thousand p50", us(thousand...), 50, 500 * time.Microsecond},
	} {
		if got := rank(c.sorted, c.p); got != c.want {
			t.Errorf("%s: rank = %v, want %v", c.name, got, c.want)
		}
	}
}
