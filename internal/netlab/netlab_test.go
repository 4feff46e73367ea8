//go:build linux

package netlab

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// TestMain fails the run if any lab brought up by this process is left behind.
func TestMain(m *testing.M) {
	code := m.Run()
	if all, err := netnsList(); err == nil {
		var leaked []string
		for _, ns := range all {
			name, _, _ := strings.Cut(ns, "-")
			if _, ok := upNames.Load(name); ok {
				leaked = append(leaked, ns)
			}
		}
		if len(leaked) > 0 {
			fmt.Fprintf(os.Stderr, "netlab: namespaces left behind: %v\n", leaked)
			code = 1
		}
	}
	os.Exit(code)
}

// netnsList returns the names printed by "ip netns list".
func netnsList() ([]string, error) {
	out, err := exec.Command("ip", "netns", "list").Output()
	if err != nil {
		return nil, err
	}
	var names []string
	for line := range strings.Lines(string(out)) {
		if f := strings.Fields(line); len(f) > 0 {
			names = append(names, f[0])
		}
	}
	return names, nil
}

// labNamespaces returns the namespaces of lab name that exist.
func labNamespaces(t *testing.T, name string) []string {
	t.Helper()
	all, err := netnsList()
	if err != nil {
		t.Fatalf("ip netns list: %v", err)
	}
	var ns []string
	for _, n := range all {
		if strings.HasPrefix(n, name+"-") {
			ns = append(ns, n)
		}
	}
	return ns
}

func wantMAC(i int) net.HardwareAddr { return net.HardwareAddr{0x02, 0x78, 0x6d, 0, 0, byte(i)} }
func wantIP(i int) netip.Addr        { return netip.AddrFrom4([4]byte{198, 18, 0, byte(i)}) }

func checkHosts(t *testing.T, l *Lab, n, mtu int) {
	t.Helper()
	if len(l.Hosts) != n {
		t.Fatalf("lab %s has %d hosts, want %d", l.Name, len(l.Hosts), n)
	}
	for i, h := range l.Hosts {
		idx := i + 1
		if h.Name != fmt.Sprintf("h%d", idx) || h.Namespace != fmt.Sprintf("%s-h%d", l.Name, idx) || h.Interface != "eth0" {
			t.Errorf("host %d named %s/%s/%s", idx, h.Name, h.Namespace, h.Interface)
		}
		if !bytes.Equal(h.MAC, wantMAC(idx)) {
			t.Errorf("%s MAC %s, want %s", h.Namespace, h.MAC, wantMAC(idx))
		}
		if h.IP != wantIP(idx) {
			t.Errorf("%s IP %s, want %s", h.Namespace, h.IP, wantIP(idx))
		}
		if h.Ifindex <= 0 || h.MTU != mtu {
			t.Errorf("%s ifindex %d mtu %d, want >0 and %d", h.Namespace, h.Ifindex, h.MTU, mtu)
		}
		if l.Host(h.Name) != h || l.Host(h.Namespace) != h {
			t.Errorf("Lab.Host(%q) does not find the host", h.Name)
		}
	}
	if l.Host("h999") != nil {
		t.Errorf("Lab.Host(h999) != nil")
	}
}

func pingAll(t *testing.T, l *Lab, count int) {
	t.Helper()
	var wg sync.WaitGroup
	for _, a := range l.Hosts {
		for _, b := range l.Hosts {
			if a != b {
				wg.Go(func() {
					if err := a.Ping(b, count); err != nil {
						t.Error(err)
					}
				})
			}
		}
	}
	wg.Wait()
}

func TestTwoHostsDirect(t *testing.T) {
	t.Parallel()
	l := New(t, Options{})
	checkHosts(t, l, 2, 1500)
	if l.BridgeNamespace != "" {
		t.Errorf("2-host lab without netem has bridge namespace %q", l.BridgeNamespace)
	}
	if got, want := labNamespaces(t, l.Name), []string{l.Name + "-h1", l.Name + "-h2"}; !sameSet(got, want) {
		t.Errorf("namespaces %v, want %v", got, want)
	}
	h1, h2 := l.Host("h1"), l.Host("h2")
	if err := h1.Ping(h2, 3); err != nil {
		t.Error(err)
	}
	if err := h2.Ping(h1, 3); err != nil {
		t.Error(err)
	}

	// ip netns exec remounts /sys: sysfs shows the namespace's eth0.
	out, err := h2.Command("cat", "/sys/class/net/eth0/address").Output()
	if err != nil || strings.TrimSpace(string(out)) != h2.MAC.String() {
		t.Errorf("sysfs eth0 address in %s = %q, %v; want %s", h2.Namespace, out, err, h2.MAC)
	}
	// scripts/lab exec and list agree.
	p, _ := Script()
	out, err = exec.Command(p, "exec", "--name", l.Name, "h1", "--", "cat", "/sys/class/net/eth0/address").Output()
	if err != nil || strings.TrimSpace(string(out)) != h1.MAC.String() {
		t.Errorf("lab exec h1 cat address = %q, %v; want %s", out, err, h1.MAC)
	}
	out, err = exec.Command(p, "list", "--name", l.Name).Output()
	if err != nil {
		t.Fatalf("lab list: %v", err)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(lines) != 2 {
		t.Fatalf("lab list printed %d lines, want 2:\n%s", len(lines), out)
	}
	for i, line := range lines {
		h := l.Hosts[i]
		for _, want := range []string{h.Namespace, "eth0", h.MAC.String(), h.IP.String() + "/24", "mtu 1500"} {
			if !strings.Contains(line, want) {
				t.Errorf("lab list line %q lacks %q", line, want)
			}
		}
	}

	if err := l.Down(); err != nil {
		t.Fatal(err)
	}
	if ns := labNamespaces(t, l.Name); len(ns) > 0 {
		t.Errorf("after Down, namespaces remain: %v", ns)
	}
	if err := l.Down(); err != nil {
		t.Errorf("second Down: %v", err)
	}
	out, err = exec.Command(p, "list", "--name", l.Name).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "no lab") {
		t.Errorf("lab list after down = %q, %v; want 'no lab...' and success", out, err)
	}
}

func sameSet(a, b []string) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(a, b)
}

func TestBridgeThreeHosts(t *testing.T) {
	t.Parallel()
	const mtu = 65535 // veth's largest
	l := New(t, Options{Hosts: 3, MTU: mtu, Queues: 2})
	checkHosts(t, l, 3, mtu)
	if l.BridgeNamespace != l.Name+"-br" {
		t.Errorf("BridgeNamespace = %q, want %s-br", l.BridgeNamespace, l.Name)
	}
	want := []string{l.Name + "-h1", l.Name + "-h2", l.Name + "-h3", l.Name + "-br"}
	if got := labNamespaces(t, l.Name); !sameSet(got, want) {
		t.Errorf("namespaces %v, want %v", got, want)
	}
	pingAll(t, l, 2)

	// The largest frames cross the bridge unfragmented: the MTU is set everywhere.
	h1, h3 := l.Host("h1"), l.Host("h3")
	out, err := h1.Command("ping", "-n", "-c", "1", "-W", "1", "-M", "do", "-s", fmt.Sprint(mtu-28), h3.IP.String()).CombinedOutput()
	if err != nil {
		t.Errorf("jumbo ping: %v\n%s", err, out)
	}
	out, err = exec.Command("ip", "-d", "-n", l.BridgeNamespace, "link", "show", "br0").Output()
	if err != nil || !strings.Contains(string(out), fmt.Sprintf("mtu %d", mtu)) || !strings.Contains(string(out), "stp_state 0") {
		t.Errorf("br0: %v\n%s", err, out)
	}
	out, err = exec.Command("ip", "-d", "-n", h1.Namespace, "link", "show", "eth0").Output()
	if err != nil || !strings.Contains(string(out), "numtxqueues 2 numrxqueues 2") {
		t.Errorf("eth0 queues: %v\n%s", err, out)
	}
}

// TestQuietWire checks that an idle lab sends nothing (no IPv6 RS/MLD/DAD, no
// IGMP from the bridge, no STP), so frame counts in tests are exact.
func TestQuietWire(t *testing.T) {
	t.Parallel()
	l := New(t, Options{Hosts: 3})
	time.Sleep(2 * time.Second)
	for _, h := range l.Hosts {
		s, err := h.IfaceStats()
		if err != nil {
			t.Fatal(err)
		}
		if s != (IfaceStats{}) {
			t.Errorf("%s eth0 counters after 2s idle: %+v, want all zero", h.Namespace, s)
		}
	}
}

func TestNetemLoss(t *testing.T) {
	t.Parallel()
	l := New(t, Options{Netem: "loss 50%"})
	if l.BridgeNamespace == "" || len(l.Hosts) != 2 {
		t.Fatalf("netem lab: bridge %q, %d hosts; want a bridge and 2 hosts", l.BridgeNamespace, len(l.Hosts))
	}
	h1, h2 := l.Host("h1"), l.Host("h2")
	res, err := h1.PingStats(h2, 20)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("loss 50%% each way: %d/%d answered", res.Received, res.Transmitted)
	if res.Transmitted != 20 || res.Received >= res.Transmitted {
		t.Errorf("ping through loss 50%%: %d/%d answered, want loss\n%s", res.Received, res.Transmitted, res.Output)
	}
	if err := h1.Ping(h2, 10); err == nil {
		t.Errorf("Ping through loss 50%% reported no error")
	}
	// The drops happen on the bridge-side ports (netem, or its cBPF
	// emulation on kernels without sch_netem).
	out, err := exec.Command("tc", "-n", l.BridgeNamespace, "-s", "qdisc", "show", "dev", "h2").Output()
	if err != nil || !regexp.MustCompile(`dropped [1-9]`).Match(out) {
		t.Errorf("tc -s qdisc show dev h2: %v\n%s", err, out)
	}
}

func TestUpIdempotent(t *testing.T) {
	t.Parallel()
	RequirePrivileged(t)
	name := uniqueName()
	l := New(t, Options{Name: name})
	h1 := l.Host("h1")
	// A marker that would vanish if the namespace were recreated.
	if out, err := exec.Command("ip", "-n", h1.Namespace, "link", "set", "lo", "alias", "keepme").CombinedOutput(); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	marker := func() bool {
		out, _ := exec.Command("ip", "-n", h1.Namespace, "link", "show", "lo").Output()
		return strings.Contains(string(out), "keepme")
	}

	l2, err := Up(Options{Name: name})
	if err != nil {
		t.Fatal(err)
	}
	if !marker() {
		t.Errorf("second up with the same shape recreated the lab")
	}
	if l2.Host("h1").Ifindex != h1.Ifindex || !bytes.Equal(l2.Host("h1").MAC, h1.MAC) {
		t.Errorf("second up: h1 %+v, first %+v", l2.Host("h1"), h1)
	}

	// Another shape: torn down and rebuilt.
	l3, err := Up(Options{Name: name, MTU: 1400})
	if err != nil {
		t.Fatal(err)
	}
	if marker() {
		t.Errorf("up with another shape kept the old lab")
	}
	checkHosts(t, l3, 2, 1400)
	if err := l3.Host("h1").Ping(l3.Host("h2"), 2); err != nil {
		t.Error(err)
	}
	l4, err := Up(Options{Name: name, Hosts: 3})
	if err != nil {
		t.Fatal(err)
	}
	checkHosts(t, l4, 3, 1500)
	want := []string{name + "-h1", name + "-h2", name + "-h3", name + "-br"}
	if got := labNamespaces(t, name); !sameSet(got, want) {
		t.Errorf("namespaces %v, want %v", got, want)
	}
	l5, err := Up(Options{Name: name})
	if err != nil {
		t.Fatal(err)
	}
	checkHosts(t, l5, 2, 1500)
	if got, want := labNamespaces(t, name), []string{name + "-h1", name + "-h2"}; !sameSet(got, want) {
		t.Errorf("shrinking 3 -> 2 hosts: namespaces %v, want %v", got, want)
	}
}

// TestBadArguments needs no privileges: arguments are checked before anything
// else.
func TestBadArguments(t *testing.T) {
	p, err := Script()
	if err != nil {
		t.Fatal(err)
	}
	name := uniqueName()
	t.Cleanup(func() {
		if os.Geteuid() == 0 {
			exec.Command(p, "down", "--name", name).Run()
		}
	})
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"up", "--hosts", "1"}, "--hosts"},
		{[]string{"up", "--hosts", "251"}, "--hosts"},
		{[]string{"up", "--hosts", "two"}, "--hosts"},
		{[]string{"up", "--hosts"}, "--hosts"},
		{[]string{"up", "--mtu", "67"}, "--mtu"},
		{[]string{"up", "--mtu", "65536"}, "--mtu"},
		{[]string{"up", "--mtu=1e3"}, "--mtu"},
		{[]string{"up", "--queues", "0"}, "--queues"},
		{[]string{"up", "--bogus"}, "--bogus"},
		{[]string{"up", "--name", "waytoolong"}, "--name"},
		{[]string{"up", "--name", "Ab"}, "--name"},
		{[]string{"up", "--name", "a-b"}, "--name"},
		{[]string{"up", "--name", ""}, "--name"},
		{[]string{"list", "--frob"}, "--frob"},
		{[]string{"down", "--name", "x_y"}, "--name"},
		{[]string{"exec", "h1"}, "command"},
		{[]string{"frobnicate"}, "frobnicate"},
	} {
		args := tc.args
		if args[0] == "up" && !slices.Contains(args, "--name") {
			args = append(slices.Clone(args), "--name", name) // never touch a real lab
		}
		var stderr bytes.Buffer
		cmd := exec.Command(p, args...)
		cmd.Stderr = &stderr
		err := cmd.Run()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 2 {
			t.Errorf("lab %q: %v, want exit status 2; stderr:\n%s", args, err, stderr.String())
			continue
		}
		if !strings.Contains(stderr.String(), tc.want) {
			t.Errorf("lab %q: stderr %q does not name %q", args, stderr.String(), tc.want)
		}
	}
	if ns := labNamespaces(t, name); len(ns) > 0 {
		t.Errorf("bad arguments created namespaces %v", ns)
	}

	// The same through the API.
	if _, err := Up(Options{Name: "Bad_Name"}); err == nil || !strings.Contains(err.Error(), "Name") {
		t.Errorf("Up(Name: Bad_Name) = %v, want an error naming Name", err)
	}
	_, err = Up(Options{Name: name, Hosts: 1})
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 2 || !strings.Contains(err.Error(), "--hosts") {
		t.Errorf("Up(Hosts: 1) = %v, want exit status 2 naming --hosts", err)
	}

	out, err := exec.Command(p, "-h").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "usage:") {
		t.Errorf("lab -h: %v\n%s", err, out)
	}
}

// netnsIno returns the inode of a network namespace handle.
func netnsIno(t *testing.T, path string) uint64 {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		t.Fatalf("stat %s: %v", path, err)
	}
	return st.Ino
}

// checkAllThreadsIn fails unless every thread of this process is in the
// network namespace with inode ino.
func checkAllThreadsIn(t *testing.T, ino uint64) {
	t.Helper()
	tasks, err := filepath.Glob("/proc/self/task/*/ns/net")
	if err != nil || len(tasks) == 0 {
		t.Fatalf("listing threads: %v", err)
	}
	for _, p := range tasks {
		var st syscall.Stat_t
		if err := syscall.Stat(p, &st); err != nil {
			continue // thread exited meanwhile
		}
		if st.Ino != ino {
			t.Errorf("thread %s is in netns %d, want %d", p, st.Ino, ino)
		}
	}
}

func TestDo(t *testing.T) {
	t.Parallel()
	l := New(t, Options{})
	h1, h2 := l.Host("h1"), l.Host("h2")

	runtime.LockOSThread()
	orig := netnsIno(t, "/proc/thread-self/ns/net")
	runtime.UnlockOSThread()
	labIno := netnsIno(t, filepath.Join(netnsDir, h2.Namespace))
	if orig == labIno {
		t.Fatal("test already runs in the lab namespace")
	}

	err := h2.Do(func() error {
		if ino := netnsIno(t, "/proc/thread-self/ns/net"); ino != labIno {
			return fmt.Errorf("inside Do: netns %d, want %d", ino, labIno)
		}
		ifi, err := net.InterfaceByName("eth0")
		if err != nil {
			return err
		}
		if !bytes.Equal(ifi.HardwareAddr, h2.MAC) || ifi.Index != h2.Ifindex || ifi.MTU != h2.MTU {
			return fmt.Errorf("inside Do: eth0 %s index %d mtu %d, want %s %d %d", ifi.HardwareAddr, ifi.Index, ifi.MTU, h2.MAC, h2.Ifindex, h2.MTU)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	checkAllThreadsIn(t, orig)

	// Errors come back; panics are re-raised in the caller after switching
	// back; Goexit propagates.
	sentinel := errors.New("sentinel")
	if err := h1.Do(func() error { return sentinel }); !errors.Is(err, sentinel) {
		t.Errorf("Do returned %v, want the sentinel", err)
	}
	func() {
		defer func() {
			if r := recover(); r != "boom" {
				t.Errorf("recovered %v, want boom", r)
			}
		}()
		h1.Do(func() error { panic("boom") })
		t.Errorf("Do did not re-panic")
	}()
	done, reached := make(chan struct{}), false
	go func() {
		defer close(done)
		h1.Do(func() error { runtime.Goexit(); return nil })
		reached = true
	}()
	<-done
	if reached {
		t.Errorf("Goexit in fn did not end the caller's goroutine")
	}
	checkAllThreadsIn(t, orig)

	// A socket made inside Do stays in the namespace: h2 listens on its lab
	// IP (which only exists there), h1 sends to it, h2 reads outside Do.
	var srv net.PacketConn
	if err := h2.Do(func() (err error) {
		srv, err = net.ListenPacket("udp4", h2.IP.String()+":0")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	var cli net.Conn
	if err := h1.Do(func() (err error) {
		cli, err = net.Dial("udp4", srv.LocalAddr().String())
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	if _, err := cli.Write([]byte("hello")); err != nil {
		t.Fatal(err)
	}
	srv.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 64)
	n, from, err := srv.ReadFrom(buf)
	if err != nil || string(buf[:n]) != "hello" || from.(*net.UDPAddr).IP.String() != h1.IP.String() {
		t.Errorf("ReadFrom = %q from %v, %v; want hello from %s", buf[:n], from, err, h1.IP)
	}
	checkAllThreadsIn(t, orig)

	if err := (&Host{Namespace: "nonexistent-h1"}).Do(func() error { return nil }); err == nil {
		t.Errorf("Do in a missing namespace succeeded")
	}
	checkAllThreadsIn(t, orig)
}

func TestIfaceStats(t *testing.T) {
	t.Parallel()
	l := New(t, Options{})
	h1, h2 := l.Host("h1"), l.Host("h2")
	b1, err := h1.IfaceStats()
	if err != nil {
		t.Fatal(err)
	}
	b2, err := h2.IfaceStats()
	if err != nil {
		t.Fatal(err)
	}
	if err := h1.Ping(h2, 5); err != nil {
		t.Fatal(err)
	}
	a1, err := h1.IfaceStats()
	if err != nil {
		t.Fatal(err)
	}
	a2, err := h2.IfaceStats()
	if err != nil {
		t.Fatal(err)
	}
	d1, d2 := a1.Sub(b1), a2.Sub(b2)
	// 5 echo requests + replies (ARP adds a frame or two each way).
	if d1.TxPackets < 5 || d1.RxPackets < 5 || d2.TxPackets < 5 || d2.RxPackets < 5 {
		t.Errorf("after 5 pings: h1 %+v, h2 %+v", d1, d2)
	}
	if d1.TxPackets != d2.RxPackets || d1.TxBytes != d2.RxBytes {
		t.Errorf("veth pair: h1 sent %d/%dB, h2 received %d/%dB", d1.TxPackets, d1.TxBytes, d2.RxPackets, d2.RxBytes)
	}
	// Cross-check with ip -s.
	out, err := exec.Command("ip", "-s", "-n", h1.Namespace, "link", "show", "eth0").Output()
	if err != nil || !strings.Contains(string(out), fmt.Sprint(a1.TxBytes)) {
		t.Errorf("ip -s link show does not contain tx bytes %d: %v\n%s", a1.TxBytes, err, out)
	}
}

func TestParseNetDev(t *testing.T) {
	const data = `Inter-|   Receive                                                |  Transmit
 face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed
    lo:       0       0    0    0    0     0          0         0        0       0    0    0    0     0       0          0
  eth0:    1234      12    1    2    0     0          0         0     5678      34    3    4    0     0       0          0
`
	s, err := parseNetDev([]byte(data), "eth0")
	want := IfaceStats{RxBytes: 1234, RxPackets: 12, RxErrors: 1, RxDropped: 2, TxBytes: 5678, TxPackets: 34, TxErrors: 3, TxDropped: 4}
	if err != nil || s != want {
		t.Errorf("parseNetDev = %+v, %v; want %+v", s, err, want)
	}
	if _, err := parseNetDev([]byte(data), "eth1"); err == nil {
		t.Errorf("parseNetDev(eth1) succeeded")
	}
}

// TestCleanupOnFailure runs helperFailingLab in a child test process that
// brings a lab up and then fails (t.Fatal in a subtest) or panics, and checks
// that the lab is gone afterwards.
func TestCleanupOnFailure(t *testing.T) {
	t.Parallel()
	RequirePrivileged(t)
	for _, mode := range []string{"fatal", "panic"} {
		t.Run(mode, func(t *testing.T) {
			name := uniqueName()
			cmd := exec.Command(os.Args[0], "-test.run=^TestHelperFailingLab$", "-test.v", "-test.count=1")
			cmd.Env = append(os.Environ(), "NETLAB_HELPER_MODE="+mode, "NETLAB_HELPER_NAME="+name)
			out, err := cmd.CombinedOutput()
			if err == nil {
				t.Fatalf("helper succeeded, want failure:\n%s", out)
			}
			if !strings.Contains(string(out), "LAB-IS-UP "+name) {
				t.Fatalf("helper did not bring the lab up:\n%s", out)
			}
			if ns := labNamespaces(t, name); len(ns) > 0 {
				exec.Command("ip", "netns", "delete", ns[0]).Run()
				p, _ := Script()
				exec.Command(p, "down", "--name", name).Run()
				t.Fatalf("lab %s survived a %s: %v\n%s", name, mode, ns, out)
			}
		})
	}
}

// TestReaper runs a child test process that brings up a lab of a name
// netlab makes up and then dies before the lab's cleanup can run: a
// sub-benchmark panics (which ends the process before its parent's
// cleanups run), or the process is killed. The reaper must remove the lab.
func TestReaper(t *testing.T) {
	t.Parallel()
	RequirePrivileged(t)
	for _, mode := range []string{"panic-in-benchmark", "killed", "killed-during-up"} {
		t.Run(mode, func(t *testing.T) {
			if mode == "killed-during-up" {
				reapDuringUp(t)
				return
			}
			cmd := exec.Command(os.Args[0], "-test.run=^TestHelperFailingLab$", "-test.v", "-test.count=1")
			if mode == "panic-in-benchmark" {
				cmd = exec.Command(os.Args[0], "-test.run=^$", "-test.bench=^BenchmarkHelperFailingLab$", "-test.benchtime=1x")
			}
			cmd.Env = append(os.Environ(), "NETLAB_HELPER_MODE="+mode)
			out, err := cmd.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			cmd.Stderr = cmd.Stdout
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			var name string
			var log bytes.Buffer
			sc := bufio.NewScanner(out)
			for name == "" && sc.Scan() {
				log.WriteString(sc.Text() + "\n")
				if n, ok := strings.CutPrefix(sc.Text(), "LAB-IS-UP "); ok {
					name = n
				}
			}
			if mode == "killed" && name != "" {
				cmd.Process.Kill()
			}
			rest, _ := io.ReadAll(out)
			log.Write(rest)
			if err := cmd.Wait(); err == nil || name == "" {
				t.Fatalf("helper: %v, lab %q; want a death with a lab up:\n%s", err, name, log.Bytes())
			}
			for deadline := time.Now().Add(20 * time.Second); len(labNamespaces(t, name)) > 0; time.Sleep(50 * time.Millisecond) {
				if time.Now().After(deadline) {
					p, _ := Script()
					exec.Command(p, "down", "--name", name).Run()
					t.Fatalf("lab %s survived its process (%s) by 20 s:\n%s", name, mode, log.Bytes())
				}
			}
		})
	}
}

// reapDuringUp kills a test process while its lab's "scripts/lab up"
// runs. The up goes on, orphaned; the reaper's down must wait for it
// and remove the whole lab, not find nothing and leave what up builds.
func reapDuringUp(t *testing.T) {
	real, err := Script()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	mark, done := filepath.Join(dir, "mark"), filepath.Join(dir, "done")
	// The wrapper says which lab an up builds, then builds it slowly.
	wrapper := filepath.Join(dir, "lab")
	script := fmt.Sprintf(`#!/bin/bash
if [[ $1 == up ]]; then
	echo "$3" >%[1]q.tmp && mv %[1]q.tmp %[1]q
	sleep 0.5
	%[3]q "$@"
	rc=$?
	touch %[2]q
	exit $rc
fi
exec %[3]q "$@"
`, mark, done, real)
	if err := os.WriteFile(wrapper, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperFailingLab$", "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), "NETLAB_HELPER_MODE=killed", "XMX_LAB_SCRIPT="+wrapper)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var name string
	for deadline := time.Now().Add(20 * time.Second); name == ""; time.Sleep(time.Millisecond) {
		if b, err := os.ReadFile(mark); err == nil {
			name = strings.TrimSpace(string(b))
		} else if time.Now().After(deadline) {
			cmd.Process.Kill()
			cmd.Wait()
			t.Fatal("the helper never ran up")
		}
	}
	cmd.Process.Kill()
	cmd.Wait()
	defer exec.Command(real, "down", "--name", name).Run()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		_, err := os.Stat(done)
		left := labNamespaces(t, name)
		if err == nil && len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("lab %s: up finished %v, namespaces left %v 30 s after its process was killed during up", name, err == nil, left)
		}
	}
}

func TestHelperFailingLab(t *testing.T) {
	mode, name := os.Getenv("NETLAB_HELPER_MODE"), os.Getenv("NETLAB_HELPER_NAME")
	if mode == "" {
		t.Skip("helper for TestCleanupOnFailure and TestReaper")
	}
	if mode == "killed" {
		l := New(t, Options{})
		fmt.Println("LAB-IS-UP", l.Name)
		time.Sleep(time.Minute)
		return
	}
	t.Run("sub", func(t *testing.T) {
		l := New(t, Options{Name: name, Hosts: 3})
		fmt.Println("LAB-IS-UP", l.Name)
		if mode == "panic" {
			panic("deliberate panic with a lab up")
		}
		t.Fatal("deliberate failure with a lab up")
	})
}

func BenchmarkHelperFailingLab(b *testing.B) {
	if os.Getenv("NETLAB_HELPER_MODE") == "" {
		b.Skip("helper for TestReaper")
	}
	l := New(b, Options{}) // removed by a cleanup that the panic below skips
	fmt.Println("LAB-IS-UP", l.Name)
	b.Run("sub", func(b *testing.B) { panic("deliberate panic in a sub-benchmark") })
}
