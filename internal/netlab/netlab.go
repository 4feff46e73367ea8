//go:build linux

package netlab

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// Defaults applied by [Up] to zero-valued [Options] fields (the same as
// scripts/lab's).
const (
	DefaultHosts  = 2
	DefaultMTU    = 1500
	DefaultQueues = 1
)

// Interface is the name of every host's lab interface.
const Interface = "eth0"

// netnsDir is where "ip netns" keeps its namespace handles.
const netnsDir = "/var/run/netns"

// Options describe a lab. Zero values select the defaults.
type Options struct {
	Hosts  int    // number of hosts, 2..250 (default 2)
	MTU    int    // MTU of every veth end and the bridge, 68..65535 (default 1500)
	Netem  string // netem spec for every bridge-side port, e.g. "loss 5% delay 1ms"; forces the bridge topology
	Queues int    // numtxqueues/numrxqueues of every veth, 1..64 (default 1)
	Name   string // lab name, [a-z0-9]{1,8}; "" picks a unique "t" + 6 random [a-z0-9]
}

// Lab is a running lab.
type Lab struct {
	Name  string
	Hosts []*Host

	// BridgeNamespace is "P-br" when the hosts hang off a bridge (3+ hosts or
	// netem), "" for a direct veth pair.
	BridgeNamespace string
	MTU             int
	Netem           string

	reap bool // the reaper removes the lab should this process die first
}

// Host is one namespace of a lab.
type Host struct {
	Name      string // "h1", "h2", ...
	Namespace string // "P-h1", ...
	Interface string // always "eth0"
	MAC       net.HardwareAddr
	IP        netip.Addr
	Ifindex   int // index of Interface inside Namespace
	MTU       int
}

var nameRE = regexp.MustCompile(`^[a-z0-9]{1,8}$`)

// script locates scripts/lab: $XMX_LAB_SCRIPT, else relative to this source
// file, else <module root>/scripts/lab found by walking up from the working
// directory to go.mod.
var script = sync.OnceValues(func() (string, error) {
	if p := os.Getenv("XMX_LAB_SCRIPT"); p != "" {
		return p, nil
	}
	if _, file, _, ok := runtime.Caller(0); ok && filepath.IsAbs(file) {
		p := filepath.Join(filepath.Dir(file), "..", "..", "scripts", "lab")
		if isFile(p) {
			return filepath.Clean(p), nil
		}
	}
	dir, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("netlab: locating scripts/lab: %w", err)
	}
	for {
		if isFile(filepath.Join(dir, "go.mod")) && isFile(filepath.Join(dir, "scripts", "lab")) {
			return filepath.Join(dir, "scripts", "lab"), nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("netlab: scripts/lab not found (set XMX_LAB_SCRIPT)")
		}
		dir = parent
	}
})

func isFile(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.Mode().IsRegular()
}

// Script returns the path of scripts/lab.
func Script() (string, error) { return script() }

// runScript runs scripts/lab with args and returns its combined output. A
// failure is reported with the command line and output, wrapping the
// *exec.ExitError (so callers can check the exit code: 2 means bad arguments).
func runScript(args ...string) ([]byte, error) {
	return runScriptLocked(nil, args...)
}

// runScriptLocked is runScript handing the script lock, the lab's lock
// file already locked (lockLab), as its descriptor 3: the script holds the
// lock from its first instruction, and this process closes its own copy
// once the script started.
func runScriptLocked(lock *os.File, args ...string) ([]byte, error) {
	p, err := script()
	if err != nil {
		if lock != nil {
			lock.Close()
		}
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, p, args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if lock != nil {
		cmd.ExtraFiles = []*os.File{lock}
		cmd.Env = append(os.Environ(), "XMX_LAB_LOCK_FD=3")
	}
	err = cmd.Start()
	if lock != nil {
		lock.Close()
	}
	if err == nil {
		err = cmd.Wait()
	}
	if err != nil {
		return out.Bytes(), fmt.Errorf("netlab: %s %s: %w\n%s", p, strings.Join(args, " "), err, bytes.TrimSpace(out.Bytes()))
	}
	return out.Bytes(), nil
}

// lockDir holds the labs' lock files (scripts/lab's lock_lab).
const lockDir = "/run/xmx-lab"

// lockLab takes lab name's lock, as scripts/lab's up and down do: an up
// this process starts holds it from before it starts, so that, should
// this process die while the up runs, the reaper's down waits for the up
// to end and then removes the whole lab.
func lockLab(name string) (*os.File, error) {
	if err := os.MkdirAll(lockDir, 0o755); err != nil {
		return nil, fmt.Errorf("netlab: lock lab %s: %w", name, err)
	}
	path := filepath.Join(lockDir, name+".lock")
	for range 100 {
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE, 0o644)
		if err != nil {
			return nil, fmt.Errorf("netlab: lock lab %s: %w", name, err)
		}
		for {
			err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX)
			if err != syscall.EINTR {
				break
			}
		}
		if err != nil {
			f.Close()
			return nil, fmt.Errorf("netlab: lock lab %s: flock: %w", name, err)
		}
		// A down removes the file, holding its lock: ours must be the
		// file the path names now.
		held, err1 := f.Stat()
		now, err2 := os.Stat(path)
		if err1 == nil && err2 == nil && os.SameFile(held, now) {
			return f, nil
		}
		f.Close()
	}
	return nil, fmt.Errorf("netlab: lock lab %s: %s keeps being removed", name, path)
}

// uniqueName returns "t" + 6 random [a-z0-9] not used by any namespace.
func uniqueName() string {
	const alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
	for {
		b := make([]byte, 7)
		rand.Read(b) // never fails (crypto/rand panics instead)
		b[0] = 't'
		for i := 1; i < len(b); i++ {
			b[i] = alphabet[int(b[i])%len(alphabet)]
		}
		name := string(b)
		if !exists(filepath.Join(netnsDir, name+"-h1")) && !exists(filepath.Join(netnsDir, name+"-br")) {
			return name
		}
	}
}

func exists(p string) bool {
	_, err := os.Lstat(p)
	return err == nil
}

// upNames records the name of every lab this process brought up (for the
// package's own leak check).
var upNames sync.Map

// Up runs "scripts/lab up" (which keeps an existing lab of the same name and
// shape, and recreates one of another shape) and reads every host back. A
// lab whose name Up made up (Options.Name empty) belongs to this process:
// should the process die before [Lab.Down] removed it, a reaper process
// removes it then.
func Up(opts Options) (*Lab, error) {
	if opts.Hosts == 0 {
		opts.Hosts = DefaultHosts
	}
	if opts.MTU == 0 {
		opts.MTU = DefaultMTU
	}
	if opts.Queues == 0 {
		opts.Queues = DefaultQueues
	}
	ours := opts.Name == ""
	if ours {
		opts.Name = uniqueName()
		// Listed before it exists: a lab half made when this process dies
		// goes too.
		if err := reapLater(opts.Name); err != nil {
			return nil, err
		}
	} else if !nameRE.MatchString(opts.Name) {
		return nil, fmt.Errorf("netlab: invalid Name %q: must be 1-8 characters from [a-z0-9]", opts.Name)
	}
	args := []string{"up", "--name", opts.Name,
		"--hosts", strconv.Itoa(opts.Hosts),
		"--mtu", strconv.Itoa(opts.MTU),
		"--queues", strconv.Itoa(opts.Queues)}
	if opts.Netem != "" {
		args = append(args, "--netem", opts.Netem)
	}
	lock, err := lockLab(opts.Name)
	if err != nil {
		return nil, err
	}
	if _, err := runScriptLocked(lock, args...); err != nil {
		return nil, err
	}
	upNames.Store(opts.Name, true)
	l := &Lab{Name: opts.Name, MTU: opts.MTU, Netem: opts.Netem, reap: ours}
	if opts.Hosts > 2 || opts.Netem != "" {
		l.BridgeNamespace = opts.Name + "-br"
	}
	for i := 1; i <= opts.Hosts; i++ {
		h, err := readHost(opts.Name, i)
		if err != nil {
			return nil, errors.Join(err, l.Down())
		}
		l.Hosts = append(l.Hosts, h)
	}
	return l, nil
}

// readHost reads host i of lab name with "ip -j -n NS addr show dev eth0"
// (which reports the link too: ifindex, MAC, MTU).
func readHost(name string, i int) (*Host, error) {
	ns := fmt.Sprintf("%s-h%d", name, i)
	out, err := exec.Command("ip", "-j", "-n", ns, "addr", "show", "dev", Interface).Output()
	if err != nil {
		return nil, fmt.Errorf("netlab: ip -j -n %s addr show dev %s: %w%s", ns, Interface, err, stderrOf(err))
	}
	var links []struct {
		Ifindex  int    `json:"ifindex"`
		Ifname   string `json:"ifname"`
		MTU      int    `json:"mtu"`
		Address  string `json:"address"`
		AddrInfo []struct {
			Family    string `json:"family"`
			Local     string `json:"local"`
			Prefixlen int    `json:"prefixlen"`
		} `json:"addr_info"`
	}
	if err := json.Unmarshal(out, &links); err != nil || len(links) != 1 {
		return nil, fmt.Errorf("netlab: %s: unexpected ip -j output %q (%v)", ns, out, err)
	}
	lk := links[0]
	mac, err := net.ParseMAC(lk.Address)
	if err != nil {
		return nil, fmt.Errorf("netlab: %s: %s MAC: %w", ns, Interface, err)
	}
	h := &Host{
		Name:      fmt.Sprintf("h%d", i),
		Namespace: ns,
		Interface: lk.Ifname,
		MAC:       mac,
		Ifindex:   lk.Ifindex,
		MTU:       lk.MTU,
	}
	for _, a := range lk.AddrInfo {
		if a.Family == "inet" {
			if ip, err := netip.ParseAddr(a.Local); err == nil {
				h.IP = ip
				break
			}
		}
	}
	if !h.IP.IsValid() {
		return nil, fmt.Errorf("netlab: %s: %s has no IPv4 address", ns, Interface)
	}
	return h, nil
}

func stderrOf(err error) string {
	var ee *exec.ExitError
	if errors.As(err, &ee) && len(ee.Stderr) > 0 {
		return ": " + string(bytes.TrimSpace(ee.Stderr))
	}
	return ""
}

// Down removes every namespace of the lab (and with them its veths and
// bridge). It is idempotent.
func (l *Lab) Down() error {
	if l == nil {
		return nil
	}
	_, err := runScript("down", "--name", l.Name)
	if err == nil && l.reap {
		reaped(l.Name)
	}
	return err
}

// Host returns the host with the given name ("h1") or namespace ("P-h1"), or
// nil.
func (l *Lab) Host(name string) *Host {
	for _, h := range l.Hosts {
		if h.Name == name || h.Namespace == name {
			return h
		}
	}
	return nil
}

// New brings a lab up for a test and removes it in tb.Cleanup, so it goes away
// when the test fails or panics; when the test binary dies before the
// cleanup runs (a panic in a subtest ends it before its parents' cleanups,
// a -timeout, a kill), the reaper removes it (see [Up]). It calls
// [RequirePrivileged] first.
func New(tb testing.TB, opts Options) *Lab {
	tb.Helper()
	RequirePrivileged(tb)
	l, err := Up(opts)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := l.Down(); err != nil {
			tb.Errorf("netlab: removing lab %s: %v", l.Name, err)
		}
	})
	return l
}

// Namespace makes an empty network namespace (its loopback up) for a test
// that builds its own topology, and removes it in tb.Cleanup or, should
// the process die first, by the reaper, as [New] does a lab's. It is a
// one-host lab without interfaces: its name is "P-h1", its loopback
// carries the lab mark (scripts/lab down --all), and P names it.
func Namespace(tb testing.TB) string {
	tb.Helper()
	RequirePrivileged(tb)
	name := uniqueName()
	if err := reapLater(name); err != nil {
		tb.Fatal(err)
	}
	l := &Lab{Name: name, reap: true}
	tb.Cleanup(func() {
		if err := l.Down(); err != nil {
			tb.Errorf("netlab: removing namespace %s-h1: %v", name, err)
		}
	})
	ns := name + "-h1"
	for _, args := range [][]string{
		{"netns", "add", ns},
		{"-n", ns, "link", "set", "lo", "alias", labMark + " namespace"},
		{"-n", ns, "link", "set", "lo", "up"},
	} {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			tb.Fatalf("netlab: ip %s: %v\n%s", strings.Join(args, " "), err, bytes.TrimSpace(out))
		}
	}
	return ns
}

// labMark begins the alias scripts/lab gives a lab's interfaces (its MARK).
const labMark = "xmx-lab v1"

// privilegeProblem says why labs cannot be made here, or "" if they can.
var privilegeProblem = sync.OnceValue(func() string {
	if os.Geteuid() != 0 {
		return "needs root (network namespaces need CAP_SYS_ADMIN)"
	}
	if _, err := exec.LookPath("ip"); err != nil {
		return "needs iproute2's ip: " + err.Error()
	}
	if out, err := exec.Command("ip", "netns", "list").CombinedOutput(); err != nil {
		return fmt.Sprintf("ip netns unavailable: %v: %s", err, bytes.TrimSpace(out))
	}
	// Root without CAP_SYS_ADMIN (some containers) cannot make namespaces:
	// probe by running ip in a fresh, throwaway network namespace.
	cmd := exec.Command("ip", "link", "show", "lo")
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNET}
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Sprintf("cannot create network namespaces: %v: %s", err, bytes.TrimSpace(out))
	}
	if _, err := script(); err != nil {
		return err.Error()
	}
	return ""
})

// RequirePrivileged skips the test, with the reason, unless this process can
// make labs (root, CAP_SYS_ADMIN, "ip netns" and scripts/lab available). With
// XMX_REQUIRE_PRIVILEGED=1 in the environment it fails the test instead, so
// that CI meant to run the privileged tests cannot silently skip them.
func RequirePrivileged(tb testing.TB) {
	tb.Helper()
	reason := privilegeProblem()
	if reason == "" {
		return
	}
	if os.Getenv("XMX_REQUIRE_PRIVILEGED") == "1" {
		tb.Fatalf("netlab: %s (and XMX_REQUIRE_PRIVILEGED=1)", reason)
	}
	tb.Skipf("netlab: %s", reason)
}

// Do runs fn on an OS thread switched into h's network namespace and returns
// its error.
//
// fn runs on a fresh goroutine locked to its thread (setns(2) with
// /var/run/netns/NS), and that thread is switched back to its original
// namespace before it is unlocked. Consequences:
//   - Sockets and other network objects created inside fn belong to h's
//     namespace for their whole life, and can be used from any goroutine after
//     Do returns.
//   - Goroutines started by fn do NOT run in h's namespace.
//   - If switching back fails, the thread is deliberately left locked: when
//     its goroutine exits the Go runtime terminates the thread instead of
//     reusing it, so no other goroutine ever runs in the lab namespace by
//     accident. The error is returned.
//   - A panic in fn is re-raised in the caller of Do (after switching back);
//     runtime.Goexit in fn (e.g. t.FailNow) makes Do's caller Goexit too.
//
// Threads the runtime creates while fn runs are not affected: since Go 1.10
// new threads are spawned from a clean template thread when the creating
// thread is locked.
func (h *Host) Do(fn func() error) error {
	type result struct {
		err      error
		panicked bool
		panicVal any
		goexit   bool
	}
	ch := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		res := result{goexit: true} // stays so only if fn calls runtime.Goexit
		defer func() { ch <- res }()

		orig, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			runtime.UnlockOSThread()
			res = result{err: fmt.Errorf("netlab: opening current network namespace: %w", err)}
			return
		}
		target, err := unix.Open(filepath.Join(netnsDir, h.Namespace), unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			unix.Close(orig)
			runtime.UnlockOSThread()
			res = result{err: fmt.Errorf("netlab: opening namespace %s: %w", h.Namespace, err)}
			return
		}
		err = unix.Setns(target, unix.CLONE_NEWNET)
		unix.Close(target)
		if err != nil {
			unix.Close(orig)
			runtime.UnlockOSThread()
			res = result{err: fmt.Errorf("netlab: setns %s: %w", h.Namespace, err)}
			return
		}
		defer func() {
			if r := recover(); r != nil {
				res = result{panicked: true, panicVal: r}
			}
			err := unix.Setns(orig, unix.CLONE_NEWNET)
			unix.Close(orig)
			if err != nil {
				// Stuck in h's namespace: keep the thread locked so that the
				// runtime kills it when this goroutine exits.
				res.err = errors.Join(res.err, fmt.Errorf("netlab: returning from namespace %s: %w (thread discarded)", h.Namespace, err))
				return
			}
			runtime.UnlockOSThread()
		}()
		err = fn()
		res = result{err: err}
	}()
	res := <-ch
	switch {
	case res.panicked:
		panic(res.panicVal)
	case res.goexit:
		runtime.Goexit()
	}
	return res.err
}

// Command returns an exec.Cmd running name with args inside h's namespace via
// "ip netns exec" (which also remounts /sys, so tools reading /sys/class/net
// see the namespace's interfaces).
func (h *Host) Command(name string, args ...string) *exec.Cmd {
	return exec.Command("ip", append([]string{"netns", "exec", h.Namespace, name}, args...)...)
}

// PingResult is the outcome of [Host.PingStats].
type PingResult struct {
	Transmitted, Received int
	Output                string
}

var pingStatsRE = regexp.MustCompile(`(\d+) packets transmitted, (\d+) (?:packets )?received`)

// PingStats runs a bounded ping (ping -n -c count -W 1 -i 0.2) from h to
// other's IP and reports how many echo requests were sent and answered. Loss
// is not an error here; failing to run ping or to parse its summary is.
func (h *Host) PingStats(other *Host, count int) (PingResult, error) {
	if count < 1 {
		count = 1
	}
	// ping itself is bounded by -c/-W/-i; the context is a safety net.
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(count)*200*time.Millisecond+10*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "ip", "netns", "exec", h.Namespace,
		"ping", "-n", "-c", strconv.Itoa(count), "-W", "1", "-i", "0.2", other.IP.String())
	out, err := cmd.CombinedOutput()
	res := PingResult{Output: string(out)}
	m := pingStatsRE.FindStringSubmatch(res.Output)
	if m == nil {
		if err == nil {
			err = errors.New("no statistics in output")
		}
		return res, fmt.Errorf("netlab: ping %s -> %s (%s): %w\n%s", h.Name, other.Name, other.IP, err, out)
	}
	res.Transmitted, _ = strconv.Atoi(m[1])
	res.Received, _ = strconv.Atoi(m[2])
	return res, nil
}

// Ping runs a bounded ping (ping -n -c count -W 1 -i 0.2) from h to other's IP.
// It returns an error containing ping's output unless every echo request was
// answered.
func (h *Host) Ping(other *Host, count int) error {
	res, err := h.PingStats(other, count)
	if err != nil {
		return err
	}
	if res.Received < res.Transmitted || res.Transmitted < max(count, 1) {
		return fmt.Errorf("netlab: ping %s -> %s (%s): %d/%d answered\n%s",
			h.Name, other.Name, other.IP, res.Received, res.Transmitted, res.Output)
	}
	return nil
}

// IfaceStats are the kernel counters of an interface (/proc/net/dev).
type IfaceStats struct {
	RxBytes, RxPackets, RxErrors, RxDropped uint64
	TxBytes, TxPackets, TxErrors, TxDropped uint64
}

// Sub returns s - prev, field by field.
func (s IfaceStats) Sub(prev IfaceStats) IfaceStats {
	return IfaceStats{
		RxBytes: s.RxBytes - prev.RxBytes, RxPackets: s.RxPackets - prev.RxPackets,
		RxErrors: s.RxErrors - prev.RxErrors, RxDropped: s.RxDropped - prev.RxDropped,
		TxBytes: s.TxBytes - prev.TxBytes, TxPackets: s.TxPackets - prev.TxPackets,
		TxErrors: s.TxErrors - prev.TxErrors, TxDropped: s.TxDropped - prev.TxDropped,
	}
}

// IfaceStats reads the kernel counters of h's eth0 from
// /proc/thread-self/net/dev inside [Host.Do] (no process is spawned).
func (h *Host) IfaceStats() (IfaceStats, error) {
	var s IfaceStats
	var data []byte
	err := h.Do(func() (err error) {
		data, err = os.ReadFile("/proc/thread-self/net/dev")
		return err
	})
	if err != nil {
		return s, err
	}
	return parseNetDev(data, h.Interface)
}

// parseNetDev extracts iface's counters from the contents of /proc/net/dev.
func parseNetDev(data []byte, iface string) (IfaceStats, error) {
	var s IfaceStats
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		name, rest, ok := strings.Cut(sc.Text(), ":")
		if !ok || strings.TrimSpace(name) != iface {
			continue
		}
		f := strings.Fields(rest)
		if len(f) < 16 {
			return s, fmt.Errorf("netlab: short /proc/net/dev line for %s: %q", iface, sc.Text())
		}
		var v [16]uint64
		for i := range v {
			n, err := strconv.ParseUint(f[i], 10, 64)
			if err != nil {
				return s, fmt.Errorf("netlab: /proc/net/dev %s field %d: %w", iface, i, err)
			}
			v[i] = n
		}
		// rx: bytes packets errs drop fifo frame compressed multicast
		// tx: bytes packets errs drop fifo colls carrier compressed
		return IfaceStats{
			RxBytes: v[0], RxPackets: v[1], RxErrors: v[2], RxDropped: v[3],
			TxBytes: v[8], TxPackets: v[9], TxErrors: v[10], TxDropped: v[11],
		}, nil
	}
	return s, fmt.Errorf("netlab: %s not in /proc/net/dev", iface)
}
