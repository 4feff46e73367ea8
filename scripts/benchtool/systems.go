package main

// The systems benchtool measures. Each has a name (a table column, a plot
// line), a side (xmx or peer), the Debian packages and commands it needs, the
// sizes it can run at, and one Measure function that runs its tools once for
// one (metric, size) and returns a Sample.

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// System is one thing being measured.
type System struct {
	Data     *SystemData
	Packages []string // Debian packages providing Binaries
	Binaries []string // commands that must be on PATH
	// Limit returns why the system cannot run metric at size ("" if it can).
	Limit func(metric string, size int) string
	// Measure runs the system once (round is 1-based) and returns a sample.
	Measure func(e *Env, metric string, round, size int) (Sample, error)
	// StartRound, if set, is called at the start of every round.
	StartRound func(round int)
}

const (
	ucxPkg      = "ucx-utils"
	fabricPkg   = "libfabric-bin"
	sockperfPkg = "sockperf"
	iperfPkg    = "iperf3"

	sockperfMinMsg = 14    // sockperf's header: smaller -m is rejected
	sockperfMaxMsg = 65507 // sockperf's largest message, UDP and TCP alike
	iperfUDPMin    = 16    // iperf3's UDP datagram header: smaller -l is rejected
	ipUDPHeaders   = 20 + 8
	ethHeader      = 14
	minFrame       = 60 // smallest Ethernet frame xmx linkbench sends (no FCS)
)

// udpPayloadMax is the largest UDP payload in one IPv4 packet at this MTU
// (1472 at 1500): iperf3 UDP datagrams are capped there so none is fragmented.
func udpPayloadMax(mtu int) int { return mtu - ipUDPHeaders }

// frameFor is the Ethernet frame (header included, no FCS) the link floor
// uses for a message size: the size's own frame, at most one full frame at
// this MTU (MTU+14), at least the 60-byte minimum.
func frameFor(size, mtu int) int { return max(minFrame, min(size, mtu)+ethHeader) }

func clamp(x, lo, hi int) int { return max(lo, min(hi, x)) }

// latIters is the number of ping-pong iterations at a size: 20000 for small
// messages, fewer as they grow so that one run stays around 0.1-0.3 s.
func latIters(size int, quick bool) int {
	n := clamp(250_000_000/max(size, 1), 200, 20000)
	if quick {
		n = max(100, n/2)
	}
	return n
}

// bwIters is the number of messages in one UCX tag_bw run (about 2 GB).
func bwIters(size int, quick bool) int {
	n := clamp(2_000_000_000/max(size, 1), 500, 200000)
	if quick {
		n = max(250, n/2)
	}
	return n
}

// peerSystems are the systems a user would pick instead of xmx.
func peerSystems(mtu int) []*System {
	return []*System{ucxSystem(), fabricSystem(), sockperfSystem("udp"), sockperfSystem("tcp"), iperfSystem("tcp", mtu), iperfSystem("udp", mtu)}
}

// ---- UCX -----------------------------------------------------------------

func ucxSystem() *System {
	s := &System{
		Data: &SystemData{
			Name: "ucx", Label: "UCX tag (ucx_perftest, TCP)", Side: SidePeer,
			Tool:    "UCX_TLS=tcp UCX_NET_DEVICES=eth0 ucx_perftest [SERVER] -p PORT -t tag_lat|tag_bw -s SIZE -n N -w N/10 -R 50|99 -f",
			Metrics: []string{Latency, Bandwidth},
			Notes: []string{
				"latency: tag_lat, one way (ucx_perftest prints half the round trip); p50 and p99 come from two runs (-R 50, -R 99) and cover only the last 2048 iterations of each run (UCX's TIMING_QUEUE_SIZE); mean is the whole -R 50 run",
				"bandwidth: tag_bw, ucx_perftest's MB/s is MiB/s (2^20): converted to 10^6 bytes/s here",
			},
		},
		Packages: []string{ucxPkg}, Binaries: []string{"ucx_perftest"},
		Limit: func(string, int) string { return "" },
	}
	s.Measure = func(e *Env, metric string, round, size int) (Sample, error) {
		run := func(test string, n int, extra ...string) (ucxResult, time.Duration, error) {
			port := e.nextPort()
			args := []string{"ucx_perftest", e.ServerIP, "-p", strconv.Itoa(port), "-t", test, "-s", strconv.Itoa(size),
				"-n", strconv.Itoa(n), "-w", strconv.Itoa(max(10, n/10)), "-f"}
			start := time.Now()
			ro, err := e.runPair(pair{
				Tool:   "ucx_perftest",
				Env:    []string{"UCX_TLS=tcp", "UCX_NET_DEVICES=" + e.Iface},
				Server: []string{"ucx_perftest", "-p", strconv.Itoa(port)},
				Client: append(args, extra...),
				Ready:  Readiness{Proto: "tcp", Port: port},
				Limit:  20 * time.Second,
			})
			if err != nil {
				return ucxResult{}, 0, err
			}
			r, err := parseUCXPerftest(ro.Stdout)
			if err != nil {
				return r, 0, &toolError{Tool: "ucx_perftest", Command: ro.Command, Msg: err.Error(), Stderr: tail(ro.All(), 8)}
			}
			return r, time.Since(start), nil
		}
		if metric == Bandwidth {
			n := bwIters(size, e.Quick)
			r, d, err := run("tag_bw", n)
			if err != nil {
				return Sample{}, err
			}
			return Sample{SizeUsed: size, MBps: f64(r.BWOverallMiBs * (1 << 20) / 1e6), WallSec: d.Seconds(),
				Extra: map[string]float64{"iterations": float64(r.Iterations), "msg_per_s": r.MsgRateOverall}}, nil
		}
		n := latIters(size, e.Quick)
		r50, d1, err := run("tag_lat", n, "-R", "50")
		if err != nil {
			return Sample{}, err
		}
		r99, d2, err := run("tag_lat", n, "-R", "99")
		if err != nil {
			return Sample{}, err
		}
		return Sample{SizeUsed: size, P50us: f64(r50.PercentileUs), P99us: f64(r99.PercentileUs), MeanUs: f64(r50.OverallUs),
			WallSec: (d1 + d2).Seconds(),
			Extra:   map[string]float64{"iterations": float64(r50.Iterations), "mean_us_p99_run": r99.OverallUs}}, nil
	}
	return s
}

// ---- libfabric -----------------------------------------------------------

func fabricSystem() *System {
	s := &System{
		Data: &SystemData{
			Name: "libfabric", Label: "libfabric tagged (fi_pingpong, tcp rdm)", Side: SidePeer,
			Tool:    "fi_pingpong -p tcp -e rdm -m tagged -I N -S SIZE -B PORT (server) / ... -P PORT SERVER (client)",
			Metrics: []string{Latency},
			Notes: []string{
				"fi_pingpong reports usec/xfer = run time / transfers in both directions: a MEAN one-way latency, no percentiles (shown in the p50 table, marked)",
				"fi_pingpong has no warm-up: connection setup is inside the mean, so short runs read high (1000 iterations: ~15 us at 8 B; 20000: ~6 us)",
			},
		},
		Packages: []string{fabricPkg}, Binaries: []string{"fi_pingpong"},
		Limit: func(string, int) string { return "" },
	}
	s.Measure = func(e *Env, metric string, round, size int) (Sample, error) {
		port := e.nextPort()
		n := latIters(size, e.Quick)
		common := []string{"fi_pingpong", "-p", "tcp", "-e", "rdm", "-m", "tagged", "-I", strconv.Itoa(n), "-S", strconv.Itoa(size)}
		start := time.Now()
		ro, err := e.runPair(pair{
			Tool:   "fi_pingpong",
			Server: append(append([]string{}, common...), "-B", strconv.Itoa(port)),
			Client: append(append([]string{}, common...), "-P", strconv.Itoa(port), e.ServerIP),
			Ready:  Readiness{Proto: "tcp", Port: port},
			Limit:  20 * time.Second,
		})
		if err != nil {
			return Sample{}, err
		}
		rows, err := parseFiPingpong(ro.Stdout)
		if err == nil {
			if got, want := rows[len(rows)-1].Bytes, fiSizeStr(size); got != want {
				err = fmt.Errorf("fi_pingpong: result line is for size %q, want %q (%d bytes as fi_pingpong prints it)", got, want, size)
			}
		}
		if err != nil {
			return Sample{}, &toolError{Tool: "fi_pingpong", Command: ro.Command, Msg: err.Error(), Stderr: tail(ro.All(), 8)}
		}
		r := rows[len(rows)-1]
		return Sample{SizeUsed: size, MeanUs: f64(r.UsecPerXfer), WallSec: time.Since(start).Seconds(),
			Extra: map[string]float64{"iterations": float64(n), "seconds": r.Seconds}}, nil
	}
	return s
}

// ---- sockperf ------------------------------------------------------------

func sockperfSystem(proto string) *System {
	s := &System{
		Data: &SystemData{
			Name: "sockperf-" + proto, Label: "sockperf ping-pong " + strings.ToUpper(proto), Side: SidePeer,
			Tool:    "sockperf sr -i SERVER -p PORT" + map[string]string{"tcp": " --tcp", "udp": ""}[proto] + " / sockperf pp -i SERVER -p PORT -m SIZE -t 1 --mps=max",
			Metrics: []string{Latency},
			Notes: []string{
				"one-way latency (sockperf halves the round trip); kernel sockets, blocking recvfrom",
				"sockperf messages are 14..65507 bytes: 8-byte points ran at 14 bytes (marked *), larger sizes are skipped",
				"sockperf -t is whole seconds and the first 400 ms are warm-up: each point is ~0.55 s of samples",
			},
		},
		Packages: []string{sockperfPkg}, Binaries: []string{"sockperf"},
		Limit: func(metric string, size int) string {
			if size > sockperfMaxMsg {
				return fmt.Sprintf("sockperf messages are at most %d bytes", sockperfMaxMsg)
			}
			return ""
		},
	}
	s.Measure = func(e *Env, metric string, round, size int) (Sample, error) {
		port := e.nextPort()
		used := max(size, sockperfMinMsg)
		srv := []string{"sockperf", "sr", "-i", e.ServerIP, "-p", strconv.Itoa(port)}
		cli := []string{"sockperf", "pp", "-i", e.ServerIP, "-p", strconv.Itoa(port), "-m", strconv.Itoa(used), "-t", "1", "--mps=max"}
		if proto == "tcp" {
			srv = append(srv, "--tcp")
			cli = append(cli, "--tcp")
		}
		start := time.Now()
		ro, err := e.runPair(pair{Tool: "sockperf", Server: srv, Client: cli,
			Ready: Readiness{Proto: proto, Port: port}, Limit: 20 * time.Second, ServerLives: true})
		if err != nil {
			return Sample{}, err
		}
		r, err := parseSockperf(ro.All())
		if err != nil {
			return Sample{}, &toolError{Tool: "sockperf", Command: ro.Command, Msg: err.Error(), Stderr: tail(ro.All(), 8)}
		}
		return Sample{SizeUsed: used, P50us: f64(r.P50Us), P99us: f64(r.P99Us), MeanUs: f64(r.MeanUs), MinUs: f64(r.MinUs),
			WallSec: time.Since(start).Seconds(),
			Extra:   map[string]float64{"observations": float64(r.Observations), "dropped": float64(r.Dropped), "max_us": r.MaxUs}}, nil
	}
	return s
}

// ---- iperf3 --------------------------------------------------------------

func iperfSystem(proto string, mtu int) *System {
	udpMax := udpPayloadMax(mtu)
	d := &SystemData{Name: "iperf3-" + proto, Side: SidePeer, Metrics: []string{Bandwidth}}
	if proto == "tcp" {
		d.Label = "iperf3 TCP, 1 stream"
		d.Tool = "iperf3 -s -1 -B SERVER -p PORT / iperf3 -c SERVER -p PORT -t 1 -J -l SIZE"
		d.Notes = []string{"receiver goodput of one TCP stream for 1 s; SIZE is the write() size (-l), TCP coalesces small writes"}
	} else {
		d.Label = "iperf3 UDP, -b 0"
		d.Tool = fmt.Sprintf("iperf3 -s -1 -B SERVER -p PORT / iperf3 -c SERVER -p PORT -t 1 -J -u -b 0 -l min(SIZE,%d)", udpMax)
		d.Notes = []string{
			"receiver goodput (what arrived, loss excluded) of unpaced UDP for 1 s; the loss is in extra.loss_pct",
			fmt.Sprintf("datagrams are %d..%d bytes (iperf3's minimum; one %d-byte IP packet at MTU %d): 8 B ran at %d B, sizes above %d ran at %d (marked *), measured once per round and shared by those sizes",
				iperfUDPMin, udpMax, mtu, mtu, iperfUDPMin, udpMax, udpMax),
		}
	}
	cache := map[int]Sample{} // per round: the capped UDP measurement
	s := &System{
		Data: d, Packages: []string{iperfPkg}, Binaries: []string{"iperf3"},
		Limit: func(metric string, size int) string {
			if size > 1<<20 {
				return "iperf3 -l is at most 1 MiB"
			}
			return ""
		},
		StartRound: func(int) { clear(cache) },
	}
	s.Measure = func(e *Env, metric string, round, size int) (Sample, error) {
		used := size
		if proto == "udp" {
			used = clamp(size, iperfUDPMin, udpMax)
			if c, ok := cache[used]; ok && used != size {
				return c, nil
			}
		}
		port := e.nextPort()
		cli := []string{"iperf3", "-c", e.ServerIP, "-p", strconv.Itoa(port), "-t", "1", "-J", "-l", strconv.Itoa(used)}
		if proto == "udp" {
			cli = append(cli, "-u", "-b", "0")
		}
		start := time.Now()
		ro, err := e.runPair(pair{Tool: "iperf3",
			Server: []string{"iperf3", "-s", "-1", "-B", e.ServerIP, "-p", strconv.Itoa(port)},
			Client: cli, Ready: Readiness{Proto: "tcp", Port: port}, Limit: 15 * time.Second})
		if err != nil {
			// iperf3 -J reports its own errors inside the JSON on stdout.
			if te, ok := err.(*toolError); ok {
				if _, perr := parseIperf3JSON([]byte(ro.Stdout)); perr != nil {
					te.Msg += " (" + perr.Error() + ")"
				}
			}
			return Sample{}, err
		}
		r, err := parseIperf3JSON([]byte(ro.Stdout))
		if err != nil {
			return Sample{}, &toolError{Tool: "iperf3", Command: ro.Command, Msg: err.Error(), Stderr: tail(ro.All(), 8)}
		}
		smp := Sample{SizeUsed: used, MBps: f64(r.ReceiverMBps), WallSec: time.Since(start).Seconds(),
			Extra: map[string]float64{"sender_mbps": r.SenderMBps, "seconds": r.Seconds}}
		if proto == "udp" {
			smp.Extra["loss_pct"] = r.LostPercent
			cache[used] = smp
		} else {
			smp.Extra["retransmits"] = r.Retransmits
		}
		return smp, nil
	}
	return s
}

// ---- the raw link floor: xmx linkbench -----------------------------------

// linkSystems measure the raw AF_XDP link (no messaging layer) with
// "xmx linkbench -json", which brings up its own two-host lab. They are
// xmx-side rows: what xmx pingpong/stream can at best approach.
//
// At MTU M, a size above M streams full M+14-byte frames (-stream-size
// M+14) and its bandwidth is frames/s x M; veth's native XDP stops at MTU
// 3506, above it the AF_XDP sockets run in multi-buffer mode by themselves.
func linkSystems(xmxBin func() (string, error), only func(string) bool, mtu int) []*System {
	type key struct{ round, frame int }
	cache := map[key]map[string]linkRow{}
	failed := map[key]error{} // one linkbench run per (round, frame), failed or not
	names := map[string]string{"link-spin": "afxdp-spin", "link-poll": "afxdp-poll"}
	var wanted []string
	for _, n := range []string{"link-spin", "link-poll"} {
		if only(n) {
			wanted = append(wanted, names[n])
		}
	}
	// runLinkbench runs one linkbench for one frame size (both systems).
	runLinkbench := func(e *Env, frame int) (map[string]linkRow, error) {
		bin, err := xmxBin()
		if err != nil {
			return nil, &toolError{Tool: "xmx linkbench", Command: "go build ./cmd/xmx", Msg: err.Error()}
		}
		n, stream := "20000", "500ms"
		if e.Quick {
			n, stream = "5000", "300ms"
		}
		argv := []string{bin, "linkbench", "-json", "-rounds", "1", "-n", n, "-warmup", "1000",
			"-size", strconv.Itoa(frame), "-stream-size", strconv.Itoa(frame), "-stream-time", stream,
			"-systems", strings.Join(wanted, ","), "-mtu", strconv.Itoa(mtu)}
		out, err := e.runLocal("xmx linkbench", argv, time.Minute)
		if err != nil {
			return nil, err
		}
		rows, err := parseLinkbenchJSON([]byte(out))
		if err != nil {
			return nil, &toolError{Tool: "xmx linkbench", Command: shellQuote(argv), Msg: err.Error(), Stderr: tail(out, 8)}
		}
		m := map[string]linkRow{}
		for _, r := range rows {
			m[r.System] = r
		}
		return m, nil
	}
	measure := func(e *Env, round, frame int) (map[string]linkRow, error) {
		if rows, ok := cache[key{round, frame}]; ok {
			return rows, nil
		}
		if err, ok := failed[key{round, frame}]; ok {
			return nil, err
		}
		rows, err := runLinkbench(e, frame)
		if err != nil {
			failed[key{round, frame}] = err
			return nil, err
		}
		cache[key{round, frame}] = rows
		return rows, nil
	}
	var out []*System
	for _, name := range []string{"link-spin", "link-poll"} {
		mode := map[string]string{"link-spin": "busy-poll", "link-poll": "blocking"}[name]
		s := &System{
			Data: &SystemData{
				Name: name, Side: SideXMX,
				Label:   "raw AF_XDP link, " + mode + " (xmx linkbench " + names[name] + ")",
				Tool:    fmt.Sprintf("xmx linkbench -json -rounds 1 -mtu %d -size FRAME -stream-size FRAME -systems afxdp-spin,afxdp-poll (its own veth lab)", mtu),
				Metrics: []string{Latency, Bandwidth},
				Notes: []string{
					fmt.Sprintf("the floor under xmx: raw Ethernet frames through xmx's AF_XDP link, no messaging layer; frame = max(60, min(SIZE, %d)+14), the lab at MTU %d", mtu, mtu),
					fmt.Sprintf("latency: round trip p50/p99 of single frames, halved; only sizes that fit one frame (<= %d)", mtu),
					fmt.Sprintf("bandwidth: frames/s received x payload bytes (SIZE, at most %d: larger sizes stream full %d-byte frames, marked *, one linkbench run per round shared by those sizes)", mtu, mtu+ethHeader),
				},
			},
			Binaries: nil,
			Limit: func(metric string, size int) string {
				if metric == Latency && size > mtu {
					return fmt.Sprintf("more than one %d-byte frame: the raw link has no single-frame latency for it", mtu+ethHeader)
				}
				return ""
			},
		}
		sysName := names[name]
		s.Measure = func(e *Env, metric string, round, size int) (Sample, error) {
			frame := frameFor(size, mtu)
			start := time.Now()
			rows, err := measure(e, round, frame)
			if err != nil {
				return Sample{}, err
			}
			r, ok := rows[sysName]
			if !ok {
				return Sample{}, &toolError{Tool: "xmx linkbench", Command: "xmx linkbench -systems " + strings.Join(wanted, ","), Msg: "no row for " + sysName}
			}
			payload := frame - ethHeader
			smp := Sample{SizeUsed: size, WallSec: time.Since(start).Seconds(),
				Extra: map[string]float64{"frame": float64(frame), "frames_per_s": r.FramesPerSec, "rtt_p50_us": r.RTTP50us,
					"rtt_p99_us": r.RTTP99us, "round_trips": float64(r.RoundTrips), "lost": float64(r.Lost),
					"stream_loss_pct": lossPct(r.StreamSent, r.StreamRecvd)}}
			if metric == Latency {
				smp.P50us, smp.P99us = f64(r.RTTP50us/2), f64(r.RTTP99us/2)
			} else {
				used := min(size, payload)
				smp.SizeUsed = used
				smp.MBps = f64(r.FramesPerSec * float64(used) / 1e6)
			}
			return smp, nil
		}
		if only(name) {
			out = append(out, s)
		}
	}
	return out
}

func lossPct(sent, recvd uint64) float64 {
	if sent == 0 {
		return 0
	}
	return 100 * float64(sent-min(sent, recvd)) / float64(sent)
}

// xmxBinary returns a function that finds the xmx binary, once:
//   - bin/xmx when no Go source of the module is newer ("make build" first
//     measures the working tree as it is);
//   - else ./cmd/xmx of the repository's HEAD commit (git archive), built
//     into dir: the tree is shared, and a result that says "repository at
//     X" must not carry someone's half-done edits; bin/xmx is left alone;
//   - else (no git) ./cmd/xmx of the working tree; and if that build
//     fails too, a stale bin/xmx, with a warning.
//
// With e.XMXRev (-xmx-rev REV), ./cmd/xmx of that commit, or nothing.
// e.XMXFrom says which (it goes into the rows' "version").
func xmxBinary(e *Env, dir string) func() (string, error) {
	var bin string
	var berr error
	done := false
	return func() (string, error) {
		if done {
			return bin, berr
		}
		done = true
		goBin := "go"
		if p := "/usr/local/go/bin/go"; fileExists(p) {
			goBin = p
		}
		out := filepath.Join(dir, "xmx")
		if e.XMXRev != "" {
			rev, err := exportRev(e, e.XMXRev, filepath.Join(dir, "rev"))
			if err == nil {
				fmt.Fprintf(e.Progress, "bench: building ./cmd/xmx of %s (-xmx-rev %s)\n", rev, e.XMXRev)
				_, err = e.runLocal("go build", []string{goBin, "build", "-C", filepath.Join(dir, "rev"), "-o", out, "./cmd/xmx"}, 5*time.Minute)
			}
			if err != nil {
				berr = err
				return "", err
			}
			bin, e.XMXFrom = out, "./cmd/xmx of "+rev+" (-xmx-rev), built for this run"
			return bin, nil
		}
		p := filepath.Join(e.Repo, "bin", "xmx")
		have := fileExists(p)
		newer := ""
		if have {
			if newer = newestSource(e.Repo); newer == "" {
				bin, e.XMXFrom, e.XMXTree = p, "bin/xmx", true
				return bin, nil
			}
		}
		var errs []error
		if head, err := exportRev(e, "HEAD", filepath.Join(dir, "head")); err == nil {
			if have {
				fmt.Fprintf(e.Progress, "bench: bin/xmx is older than %s: measuring ./cmd/xmx of HEAD (%s), built for this run (\"make build\" first to measure the working tree)\n", newer, head)
			} else {
				fmt.Fprintf(e.Progress, "bench: no bin/xmx: building ./cmd/xmx of HEAD (%s)\n", head)
			}
			if _, err := e.runLocal("go build", []string{goBin, "build", "-C", filepath.Join(dir, "head"), "-o", out, "./cmd/xmx"}, 5*time.Minute); err == nil {
				bin, e.XMXFrom = out, "./cmd/xmx of HEAD "+head+", built for this run"
				return bin, nil
			} else {
				errs = append(errs, err)
			}
		} else {
			errs = append(errs, err)
			fmt.Fprintf(e.Progress, "bench: cannot export HEAD (%v): building ./cmd/xmx of the working tree\n", err)
			if _, err := e.runLocal("go build", []string{goBin, "build", "-C", e.Repo, "-o", out, "./cmd/xmx"}, 5*time.Minute); err == nil {
				bin, e.XMXFrom, e.XMXTree = out, "./cmd/xmx of the working tree, built for this run", true
				return bin, nil
			} else {
				errs = append(errs, err)
			}
		}
		if have {
			fmt.Fprintf(e.Progress, "bench: warning: could not build xmx (%v): measuring bin/xmx, which is older than %s\n", errors.Join(errs...), newer)
			bin, e.XMXFrom, e.XMXTree = p, "bin/xmx, older than "+newer, true
			return bin, nil
		}
		berr = errors.Join(errs...)
		return "", berr
	}
}

// exportRev writes the tree of commit rev into dir (git archive) and
// returns the commit's short hash.
func exportRev(e *Env, rev, dir string) (string, error) {
	out, err := exec.Command("git", "-C", e.Repo, "rev-parse", "--verify", "--short", rev+"^{commit}").Output()
	if err != nil {
		return "", fmt.Errorf("git rev-parse %s: not a commit of %s (%v)", rev, e.Repo, err)
	}
	head := strings.TrimSpace(string(out))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	archive := filepath.Join(filepath.Dir(dir), "head.tar")
	if _, err := e.runLocal("git archive", []string{"git", "-C", e.Repo, "archive", "--format=tar", "-o", archive, head}, time.Minute); err != nil {
		return "", err
	}
	if _, err := e.runLocal("tar", []string{"tar", "-x", "-f", archive, "-C", dir}, time.Minute); err != nil {
		return "", err
	}
	_ = os.Remove(archive)
	return head, nil
}

// ---- xmx itself ----------------------------------------------------------

// xmxSystems returns the xmx rows: msglayer in busy-poll and in blocking
// mode (its default, which polls before sleeping while answers come within
// tens of microseconds: -spin auto), measured with xmx pingpong (latency) and xmx stream (bandwidth),
// and the same two modes streaming from a buffer lent from the UMEM
// (xmx stream -umem: bandwidth only, the *-umem rows). They get table
// columns, ratio blocks ("xmx-spin ÷ ucx" ..., and "÷ link floor" for
// bandwidth), plot lines and results.json entries like any system.
//
// Contract (as drafted in cmd/xmx/pingpong.go and stream.go; the parser,
// parseXMXJSON, is tested on testdata/xmx_*.json and TestXMXSystemContract
// runs xmxSystem against a fake xmx):
//
//	server, in h2 (XMX_HOSTNAME=h2, as scripts/lab exec sets it), serves one
//	client, pingpong or stream, then exits; it prints "waiting for clients"
//	(stderr) once its endpoint is open (raw Ethernet: no port to poll):
//	    xmx pingpong -i eth0 [-busy] -once
//	client, in h1 (XMX_HOSTNAME=h1), PEER = the server's host name "h2":
//	    xmx pingpong -i eth0 [-busy] -sizes SIZE -n N -json h2
//	    xmx stream   -i eth0 [-busy] -sizes SIZE -time 500ms -json h2
//	    xmx stream   -i eth0 [-busy] -umem -sizes SIZE -time 500ms -json h2
//	client stdout: one JSON object per size (JSON lines, or one array):
//	    {"size":8,"p50_us":3.1,"p99_us":7.9,"mean_us":3.4,"min_us":2.6}
//	    {"size":1048576,"mbps":1234.5}
//	size is the message size in bytes; *_us are ONE-WAY latencies (half
//	the round trip) in µs; mbps is payload MEGABYTES (10^6 bytes) per second
//	at the receiver, not megabits (pingpong's mbps, implied by the round
//	trip, is ignored: bandwidth comes from stream). Fields a command does
//	not measure are omitted. A non-zero exit status means failure, and
//	stderr says why. With -umem, each object says "umem":true, and stderr
//	says "with a copy" when the link cannot send the lent buffer in place.
//
// The xmx-spin-afpacket row is xmx busy-poll over its AF_PACKET link
// (-link afpacket on both sides) instead of AF_XDP: on veth, where AF_XDP
// runs in copy mode, that link moves large frames with fewer copies; the
// row shows what a user gains or loses by choosing it.
func xmxSystems(xmxBin func() (string, error)) []*System {
	return []*System{
		xmxSystem(xmxBin, xmxRow{name: "xmx-spin", mode: "busy-poll", flag: "-busy"}),
		xmxSystem(xmxBin, xmxRow{name: "xmx-poll", mode: "blocking (adaptive poll)"}),
		xmxSystem(xmxBin, xmxRow{name: "xmx-spin-umem", mode: "busy-poll", flag: "-busy", umem: true}),
		xmxSystem(xmxBin, xmxRow{name: "xmx-poll-umem", mode: "blocking (adaptive poll)", umem: true}),
		xmxSystem(xmxBin, xmxRow{name: "xmx-spin-afpacket", mode: "busy-poll", flag: "-busy", link: "afpacket"}),
	}
}

// xmxRow describes one xmx row: its name, its progress mode ("busy-poll"
// with flag "-busy", or blocking with no flag), whether it streams from a
// buffer lent from the UMEM, and the link kind it asks for ("": xmx's
// default, AF_XDP; "afpacket": -link afpacket on both sides).
type xmxRow struct {
	name, mode, flag string
	umem             bool
	link             string
}

// umemCopied reports whether xmx stream -umem said (stderr) that the link
// copies the lent buffer into its frames after all: "the link copies lent
// buffers into its frames (the socket is not in zero-copy mode, or
// -umem-gather copy)"; before -umem-gather: "the link sends lent buffers
// with a copy (not AF_XDP in multi-buffer mode)".
func umemCopied(stderr string) bool {
	for _, line := range strings.Split(stderr, "\n") {
		if strings.Contains(line, "-umem: the link") &&
			(strings.Contains(line, "copies lent buffers") || strings.Contains(line, "sends lent buffers with a copy")) {
			return true
		}
	}
	return false
}

// xmxSystem is one xmx row following the contract above. A umem row runs
// only the bandwidth metric, with xmx stream -umem (the client sends from a
// buffer lent from its UMEM); xmx pingpong has no such mode, so it has no
// latency. A row with a link kind checks that the server says it opened
// that kind: xmx would not fall back from an explicit choice, but a row
// must not report AF_XDP's figures under another name.
func xmxSystem(xmxBin func() (string, error), row xmxRow) *System {
	name, mode, flag, umem := row.name, row.mode, row.flag, row.umem
	if row.link != "" {
		flag = strings.TrimSpace(flag + " -link " + row.link)
	}
	d := &SystemData{
		Name: name, Side: SideXMX, Label: "xmx " + mode,
		Tool: "xmx pingpong -i eth0 " + flag + " -once (server) / xmx pingpong|stream -i eth0 " + flag +
			" -sizes SIZE -n N|-time T -json h2 (client)",
		Metrics: []string{Latency, Bandwidth},
		Notes:   []string{"latency from xmx pingpong (one way, half the round trip), bandwidth from xmx stream (receiver payload MB/s)"},
	}
	if umem {
		d.Label = "xmx " + mode + ", sending from a UMEM buffer"
		d.Tool = "xmx pingpong -i eth0 " + flag + " -once (server) / xmx stream -i eth0 " + flag + " -umem -sizes SIZE -time T -json h2 (client)"
		d.Metrics = []string{Bandwidth}
		d.Notes = []string{
			"bandwidth only: xmx stream -umem, the client sends from a buffer lent from its UMEM (a rendezvous message's pull replies can leave as UMEM descriptors, without a CPU copy); receiver payload MB/s",
			"how the data leaves is xmx stream's -umem-gather (auto unless scripts/bench -umem-gather says otherwise: UMEM descriptors on a zero-copy socket, else copied into the frames; descriptors: always UMEM descriptors, multi-buffer socket)",
			"extra.umem_zero_copy is 1 when the link sent the lent buffer where it lies, 0 when xmx stream said it copies it into its frames",
		}
	}
	if row.link != "" {
		d.Label = "xmx " + mode + " over its " + linkLabel(row.link) + " link"
		d.Notes = append(d.Notes, "-link "+row.link+" on both sides: xmx's "+linkLabel(row.link)+" link instead of AF_XDP (the server's stderr must name it)")
	}
	s := &System{Data: d, Limit: func(string, int) string { return "" }}
	s.Measure = func(e *Env, metric string, round, size int) (Sample, error) {
		bin, err := xmxBin()
		if err != nil {
			return Sample{}, &toolError{Tool: "xmx", Command: "go build ./cmd/xmx", Msg: err.Error()}
		}
		common := append([]string{"-i", e.Iface}, strings.Fields(flag)...)
		sub, n := "pingpong", latIters(size, e.Quick)
		client := append([]string{bin, sub}, common...)
		client = append(client, "-sizes", strconv.Itoa(size), "-n", strconv.Itoa(n))
		if metric == Bandwidth {
			sub, n = "stream", 0
			dur := "500ms"
			if e.Quick {
				dur = "300ms"
			}
			client = append([]string{bin, sub}, common...)
			if umem {
				client = append(client, "-umem")
				if e.UMEMGather != "" {
					client = append(client, "-umem-gather", e.UMEMGather)
				}
			}
			client = append(client, "-sizes", strconv.Itoa(size), "-time", dur)
		} else if umem {
			return Sample{}, fmt.Errorf("%s measures bandwidth only (xmx pingpong has no -umem)", name)
		}
		client = append(client, "-json", "h2")
		start := time.Now()
		ro, err := e.runPair(pair{Tool: "xmx " + sub,
			Server:    append(append([]string{bin, "pingpong"}, common...), "-once"),
			ServerEnv: []string{"XMX_HOSTNAME=h2"},
			Client:    client,
			ClientEnv: []string{"XMX_HOSTNAME=h1"},
			Ready:     Readiness{Line: "waiting for clients"}, Limit: 30 * time.Second})
		if err != nil {
			return Sample{}, err
		}
		if row.link != "" && !strings.Contains(ro.Server, "("+row.link+" ") {
			return Sample{}, &toolError{Tool: "xmx " + sub, Command: ro.Command,
				Msg: fmt.Sprintf("-link %s given but the server does not say it opened %s", row.link, linkLabel(row.link)), Stderr: "[server] " + tail(ro.Server, 4)}
		}
		pts, err := parseXMXJSON([]byte(ro.Stdout))
		if err != nil {
			return Sample{}, &toolError{Tool: "xmx " + sub, Command: ro.Command, Msg: err.Error(), Stderr: tail(ro.All(), 8)}
		}
		for _, p := range pts {
			if p.Size != size {
				continue
			}
			smp := Sample{SizeUsed: size, WallSec: time.Since(start).Seconds(), Extra: map[string]float64{}}
			if n > 0 {
				smp.Extra["iterations"] = float64(n)
			}
			if metric == Latency {
				smp.P50us, smp.P99us, smp.MeanUs, smp.MinUs = p.P50us, p.P99us, p.MeanUs, p.MinUs
			} else {
				smp.MBps = p.MBps
				if p.Messages > 0 {
					smp.Extra["messages"] = float64(p.Messages)
				}
				if p.Window > 0 {
					smp.Extra["window"] = float64(p.Window)
				}
				if p.Seconds > 0 {
					smp.Extra["seconds"] = p.Seconds
				}
			}
			if umem {
				if !p.UMEM {
					return Sample{}, &toolError{Tool: "xmx " + sub, Command: ro.Command,
						Msg: `-umem given but the result does not say "umem":true (an xmx without -umem?)`, Stderr: tail(ro.All(), 8)}
				}
				smp.Extra["umem_zero_copy"] = 1
				if umemCopied(ro.Stderr) {
					smp.Extra["umem_zero_copy"] = 0
				}
			}
			if smp.P50us == nil && smp.MeanUs == nil && smp.MBps == nil {
				break
			}
			return smp, nil
		}
		return Sample{}, &toolError{Tool: "xmx " + sub, Command: ro.Command, Msg: fmt.Sprintf("no %s result for size %d", metric, size), Stderr: tail(ro.All(), 8)}
	}
	return s
}

// linkLabel names a link kind as the tables say it.
func linkLabel(kind string) string {
	if kind == "afpacket" {
		return "AF_PACKET"
	}
	return kind
}

// newestSource returns an input of bin/xmx's build newer than bin/xmx, or
// "": go.mod or go.sum, a non-test Go or assembly file of the module
// outside scripts/, or a file that a //go:embed directive of such a Go file
// names (bpf/steer_bpfel.go embeds the BPF object "make generate" rewrites:
// a new object with an old binary is a stale binary too).
func newestSource(repo string) string {
	bi, err := os.Stat(filepath.Join(repo, "bin", "xmx"))
	if err != nil {
		return ""
	}
	built := bi.ModTime()
	newer := func(path string) bool {
		fi, err := os.Stat(path)
		return err == nil && fi.ModTime().After(built)
	}
	for _, f := range []string{"go.mod", "go.sum", "go.work", "go.work.sum"} {
		if newer(filepath.Join(repo, f)) {
			return f
		}
	}
	found := ""
	_ = filepath.WalkDir(repo, func(path string, d fs.DirEntry, err error) error {
		if found != "" {
			return filepath.SkipAll
		}
		if err != nil {
			if d != nil && d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		name := d.Name()
		if d.IsDir() {
			if path != repo && (strings.HasPrefix(name, ".") || name == "scripts" || name == "docs" || name == "bin" || name == "testdata") {
				return filepath.SkipDir
			}
			return nil
		}
		if strings.HasSuffix(name, "_test.go") {
			return nil
		}
		switch filepath.Ext(name) {
		case ".go":
			if newer(path) {
				found = path
			} else {
				found = newerEmbedded(path, newer)
			}
		case ".s":
			if newer(path) {
				found = path
			}
		}
		return nil
	})
	if found == "" {
		return ""
	}
	if rel, err := filepath.Rel(repo, found); err == nil {
		return rel
	}
	return found
}

// newerEmbedded returns a file that a //go:embed directive of the Go file
// goFile names (directly, through a pattern or inside a named directory)
// and that newer says is newer than the binary, or "". Patterns are
// split at spaces; quotes around one are dropped.
func newerEmbedded(goFile string, newer func(string) bool) string {
	b, err := os.ReadFile(goFile)
	if err != nil || !bytes.Contains(b, []byte("//go:embed")) {
		return ""
	}
	dir := filepath.Dir(goFile)
	for _, line := range strings.Split(string(b), "\n") {
		rest, ok := strings.CutPrefix(strings.TrimSpace(line), "//go:embed")
		if !ok || (rest != "" && rest[0] != ' ' && rest[0] != '\t') {
			continue
		}
		for _, pat := range strings.Fields(rest) {
			pat = strings.TrimPrefix(strings.Trim(pat, "\"`"), "all:")
			matches, _ := filepath.Glob(filepath.Join(dir, filepath.FromSlash(pat)))
			for _, m := range matches {
				found := ""
				_ = filepath.WalkDir(m, func(path string, d fs.DirEntry, err error) error {
					if found != "" {
						return filepath.SkipAll
					}
					if err == nil && !d.IsDir() && newer(path) {
						found = path
					}
					return nil
				})
				if found != "" {
					return found
				}
			}
		}
	}
	return ""
}
