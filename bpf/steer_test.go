//go:build linux

package bpf

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/xmx-stack/xmx/internal/netlab"
	"golang.org/x/sys/unix"
)

// XDP actions (enum xdp_action).
const (
	xdpAborted  = 0
	xdpDrop     = 1
	xdpPass     = 2
	xdpTX       = 3
	xdpRedirect = 4
)

// xdpMd mirrors struct xdp_md, the context of BPF_PROG_TEST_RUN for XDP.
type xdpMd struct {
	Data           uint32
	DataEnd        uint32
	DataMeta       uint32
	IngressIfindex uint32
	RxQueueIndex   uint32
	EgressIfindex  uint32
}

// requirePrivileged skips the test when not root, or fails it when
// XMX_REQUIRE_PRIVILEGED=1 (CI on a privileged runner must not silently skip).
func requirePrivileged(t *testing.T) {
	t.Helper()
	if os.Geteuid() == 0 {
		return
	}
	const reason = "needs root (CAP_BPF, CAP_NET_ADMIN) to load XDP programs and use BPF_PROG_TEST_RUN"
	if os.Getenv("XMX_REQUIRE_PRIVILEGED") == "1" {
		t.Fatal(reason + ", and XMX_REQUIRE_PRIVILEGED=1")
	}
	t.Skip(reason)
}

// load loads a Steering that is closed when the test ends.
func load(t *testing.T, opts LoadOptions) *Steering {
	t.Helper()
	s, err := Load(opts)
	if err != nil {
		t.Fatalf("Load(%+v): %v", opts, err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return s
}

// variants runs fn once for each program of the object.
func variants(t *testing.T, opts LoadOptions, fn func(t *testing.T, s *Steering)) {
	for _, frags := range []bool{false, true} {
		name := "xdp"
		if frags {
			name = "xdp.frags"
		}
		t.Run(name, func(t *testing.T) {
			o := opts
			o.Frags = frags
			fn(t, load(t, o))
		})
	}
}

// frame builds an Ethernet frame with the given outer EtherType and payload
// of n bytes.
func frame(ethertype uint16, n int) []byte {
	f := make([]byte, 14+n)
	copy(f[0:6], []byte{0x02, 0x00, 0x00, 0x00, 0x00, 0x01})  // dst
	copy(f[6:12], []byte{0x02, 0x00, 0x00, 0x00, 0x00, 0x02}) // src
	binary.BigEndian.PutUint16(f[12:14], ethertype)
	for i := range n {
		f[14+i] = byte(i)
	}
	return f
}

func (a Stats) sub(b Stats) Stats {
	return Stats{
		Redirected: a.Redirected - b.Redirected,
		Passed:     a.Passed - b.Passed,
		Runt:       a.Runt - b.Runt,
		NoSocket:   a.NoSocket - b.NoSocket,
		OtherHost:  a.OtherHost - b.OtherHost,
	}
}

func stats(t *testing.T, s *Steering) Stats {
	t.Helper()
	st, err := s.Stats()
	if err != nil {
		t.Fatalf("Stats: %v", err)
	}
	return st
}

// run runs the program once with BPF_PROG_TEST_RUN and returns its action
// and the change of the counters.
func run(t *testing.T, s *Steering, opts *ebpf.RunOptions) (uint32, Stats, error) {
	t.Helper()
	before := stats(t, s)
	ret, err := s.Program().Run(opts)
	return ret, stats(t, s).sub(before), err
}

// expect runs data through the program and checks action and counters.
func expect(t *testing.T, s *Steering, data []byte, wantRet uint32, want Stats) {
	t.Helper()
	ret, got, err := run(t, s, &ebpf.RunOptions{Data: data})
	if err != nil {
		t.Fatalf("run %d-byte frame: %v", len(data), err)
	}
	if ret != wantRet {
		t.Errorf("%d-byte frame %x: action %d, want %d", len(data), data[:min(len(data), 16)], ret, wantRet)
	}
	if got != want {
		t.Errorf("%d-byte frame %x: counters moved by %+v, want %+v", len(data), data[:min(len(data), 16)], got, want)
	}
}

func TestAttachModeString(t *testing.T) {
	for m, want := range map[AttachMode]string{
		AttachAuto: "auto", AttachDriver: "drv", AttachGeneric: "skb", AttachMode(7): "AttachMode(7)",
	} {
		if got := m.String(); got != want {
			t.Errorf("AttachMode(%d).String() = %q, want %q", int(m), got, want)
		}
	}
}

// A stack frame with no socket registered for its queue: bpf_redirect_map
// falls back to its flags (XDP_PASS), and the NoSocket counter moves.
func TestStackFrameWithoutSocketIsPassed(t *testing.T) {
	requirePrivileged(t)
	variants(t, LoadOptions{}, func(t *testing.T, s *Steering) {
		expect(t, s, frame(0x88B5, 64), xdpPass, Stats{NoSocket: 1})
		// A bare header (exactly 14 bytes, no payload) is not a runt.
		expect(t, s, frame(0x88B5, 0), xdpPass, Stats{NoSocket: 1})
	})
}

// Every other EtherType goes to the kernel untouched, including a VLAN tag
// in front of the stack's EtherType: only the outer EtherType counts. (A
// tag held in the packet's metadata instead is not seen: see the package
// doc.)
func TestOtherEtherTypesArePassed(t *testing.T) {
	requirePrivileged(t)
	variants(t, LoadOptions{}, func(t *testing.T, s *Steering) {
		vlan := frame(0x8100, 4+46)
		binary.BigEndian.PutUint16(vlan[14:], 42)     // TCI: VID 42
		binary.BigEndian.PutUint16(vlan[16:], 0x88B5) // inner EtherType
		for name, f := range map[string][]byte{
			"ARP":            frame(0x0806, 28),
			"IPv4":           frame(0x0800, 46),
			"IPv6":           frame(0x86DD, 60),
			"VLAN":           vlan,
			"QinQ":           frame(0x88A8, 46),
			"byte-swapped":   frame(0xB588, 46), // catches a missing bpf_htons
			"neighbour 88B6": frame(0x88B6, 46),
			"IPv4 bare":      frame(0x0800, 0),
		} {
			t.Run(name, func(t *testing.T) {
				expect(t, s, f, xdpPass, Stats{Passed: 1})
			})
		}
	})
}

// LoadOptions.EtherType replaces 0x88B5, which is then an ordinary foreign
// EtherType.
func TestConfiguredEtherType(t *testing.T) {
	requirePrivileged(t)
	variants(t, LoadOptions{EtherType: 0x88B6}, func(t *testing.T, s *Steering) {
		expect(t, s, frame(0x88B6, 46), xdpPass, Stats{NoSocket: 1})
		expect(t, s, frame(0x88B5, 46), xdpPass, Stats{Passed: 1})
	})
}

// With LoadOptions.HardwareAddr, a unicast frame of the EtherType to
// another MAC (a macvlan's, another host's) goes to the kernel, counted as
// OtherHost; broadcast and multicast are steered whatever the address, and
// frames of other EtherTypes pass as before. Without it, every frame of
// the EtherType is steered.
func TestDestinationMAC(t *testing.T) {
	requirePrivileged(t)
	to := func(dst string, et uint16) []byte {
		f := frame(et, 46)
		mac, err := net.ParseMAC(dst)
		if err != nil {
			t.Fatal(err)
		}
		copy(f, mac)
		return f
	}
	ifmac := [6]byte{0x02, 0x78, 0x6d, 0x00, 0x00, 0x01}
	variants(t, LoadOptions{HardwareAddr: ifmac}, func(t *testing.T, s *Steering) {
		for _, tc := range []struct {
			name string
			f    []byte
			want Stats
		}{
			{"ours", to("02:78:6d:00:00:01", 0x88B5), Stats{NoSocket: 1}},
			{"broadcast", to("ff:ff:ff:ff:ff:ff", 0x88B5), Stats{NoSocket: 1}},
			{"multicast", to("01:00:5e:00:00:01", 0x88B5), Stats{NoSocket: 1}},
			{"macvlan", to("02:78:6d:ee:00:01", 0x88B5), Stats{OtherHost: 1}},
			{"last octet", to("02:78:6d:00:00:02", 0x88B5), Stats{OtherHost: 1}},
			{"first octet", to("06:78:6d:00:00:01", 0x88B5), Stats{OtherHost: 1}},
			{"IPv4 to another", to("02:78:6d:ee:00:01", 0x0800), Stats{Passed: 1}},
		} {
			t.Run(tc.name, func(t *testing.T) { expect(t, s, tc.f, xdpPass, tc.want) })
		}
	})
	variants(t, LoadOptions{}, func(t *testing.T, s *Steering) {
		expect(t, s, to("02:78:6d:ee:00:01", 0x88B5), xdpPass, Stats{NoSocket: 1})
	})
}

// Runts. BPF_PROG_TEST_RUN refuses (EINVAL) input shorter than an Ethernet
// header, so a 0..13-byte frame cannot be fed in directly. Linux 6.18 lets
// the context's data_end make the linear part shorter than the input (the
// rest becomes fragments), which exposes a first buffer of 0, 1 or 13 bytes
// to the program: exactly what its bounds check guards against.
func TestRuntsArePassed(t *testing.T) {
	requirePrivileged(t)
	variants(t, LoadOptions{}, func(t *testing.T, s *Steering) {
		for _, n := range []int{0, 1, 13} {
			t.Run(fmt.Sprintf("data %d bytes", n), func(t *testing.T) {
				ret, got, err := run(t, s, &ebpf.RunOptions{Data: frame(0x88B5, 0)[:n]})
				switch {
				case errors.Is(err, unix.EINVAL):
					t.Logf("kernel refuses a %d-byte test-run input (EINVAL), as documented", n)
				case err != nil:
					t.Fatalf("run: %v", err)
				case ret != xdpPass || got != (Stats{Runt: 1}):
					// A kernel that accepts it must see a runt.
					t.Errorf("action %d, counters %+v; want %d, %+v", ret, got, xdpPass, Stats{Runt: 1})
				}
			})
		}
		for _, linear := range []uint32{0, 1, 13} {
			t.Run(fmt.Sprintf("linear %d bytes", linear), func(t *testing.T) {
				f := frame(0x88B5, 64)
				ret, got, err := run(t, s, &ebpf.RunOptions{
					Data:    f,
					Context: xdpMd{DataEnd: linear},
				})
				if errors.Is(err, unix.EINVAL) {
					t.Skipf("kernel %s cannot test-run a %d-byte linear part (needs Linux 6.18)", kernelRelease(), linear)
				}
				if err != nil {
					t.Fatalf("run: %v", err)
				}
				if ret != xdpPass || got != (Stats{Runt: 1}) {
					t.Errorf("action %d, counters %+v; want %d, %+v", ret, got, xdpPass, Stats{Runt: 1})
				}
			})
		}
		// The shortest input the kernel accepts: a bare 14-byte header.
		expect(t, s, frame(0x0806, 0), xdpPass, Stats{Passed: 1})
	})
}

func kernelRelease() string {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return "?"
	}
	return unix.ByteSliceToString(u.Release[:])
}

func TestLoadDefaults(t *testing.T) {
	requirePrivileged(t)
	s := load(t, LoadOptions{})
	info, err := s.Program().Info()
	if err != nil {
		t.Fatalf("program info: %v", err)
	}
	if info.Name != "xmx_steer" {
		t.Errorf("program name %q, want xmx_steer", info.Name)
	}
	if s.Program().Type() != ebpf.XDP {
		t.Errorf("program type %v, want XDP", s.Program().Type())
	}
	if got := s.xsks.MaxEntries(); got != MaxQueues {
		t.Errorf("xskmap max_entries %d, want %d", got, MaxQueues)
	}
	if got := stats(t, s); got != (Stats{}) {
		t.Errorf("fresh counters %+v, want zero", got)
	}
	f := load(t, LoadOptions{Frags: true})
	if info, err := f.Program().Info(); err != nil || info.Name != "xmx_steer_frags" {
		t.Errorf("frags program name %q (%v), want xmx_steer_frags", info.Name, err)
	}
}

func TestRegisterValidationAndClose(t *testing.T) {
	requirePrivileged(t)
	s, err := Load(LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()

	for _, q := range []int{-1, MaxQueues} {
		if err := s.Register(q, 0); err == nil || !strings.Contains(err.Error(), fmt.Sprint("queue ", q)) {
			t.Errorf("Register(%d): %v, want out-of-range error naming the queue", q, err)
		}
		if err := s.Unregister(q); err == nil {
			t.Errorf("Unregister(%d): nil error", q)
		}
	}
	if err := s.Register(0, -1); err == nil {
		t.Error("Register(0, -1): nil error")
	}
	// The kernel refuses anything but an AF_XDP socket.
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	if err := s.Register(0, int(r.Fd())); err == nil || !strings.Contains(err.Error(), "register xsk") {
		t.Errorf("Register(0, pipe): %v, want a kernel error", err)
	} else {
		t.Logf("Register(0, pipe): %v", err)
	}
	if err := s.Unregister(5); err != nil {
		t.Errorf("Unregister of an empty queue: %v", err)
	}

	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if s.Program() != nil {
		t.Error("Program() after Close is not nil")
	}
	if err := s.Register(0, 0); !errors.Is(err, ErrClosed) {
		t.Errorf("Register after Close: %v, want ErrClosed", err)
	}
	if err := s.Unregister(0); !errors.Is(err, ErrClosed) {
		t.Errorf("Unregister after Close: %v, want ErrClosed", err)
	}
	if _, err := s.Stats(); !errors.Is(err, ErrClosed) {
		t.Errorf("Stats after Close: %v, want ErrClosed", err)
	}
	if _, err := s.Attach(1, AttachGeneric); !errors.Is(err, ErrClosed) {
		t.Errorf("Attach after Close: %v, want ErrClosed", err)
	}
}

// Register/Unregister/Stats from many goroutines, then a Close racing with
// them; run with -race.
func TestConcurrentRegister(t *testing.T) {
	requirePrivileged(t)
	s, err := Load(LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// An unbound AF_XDP socket is enough for the XSKMAP.
	fd, err := unix.Socket(unix.AF_XDP, unix.SOCK_RAW|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatalf("socket(AF_XDP): %v", err)
	}
	defer unix.Close(fd)

	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 200 {
				q := (g*200 + i) % MaxQueues
				if err := s.Register(q, fd); err != nil {
					t.Errorf("Register(%d): %v", q, err)
					return
				}
				if err := s.Unregister(q); err != nil {
					t.Errorf("Unregister(%d): %v", q, err)
					return
				}
				if _, err := s.Stats(); err != nil {
					t.Errorf("Stats: %v", err)
					return
				}
			}
		})
	}
	wg.Wait()

	// Close while others still use it: they must get ErrClosed, not crash.
	var closing sync.WaitGroup
	for range 4 {
		closing.Go(func() {
			for range 100 {
				if err := s.Register(1, fd); err != nil && !errors.Is(err, ErrClosed) {
					t.Errorf("Register during Close: %v", err)
				}
				_ = s.Program()
			}
		})
	}
	closing.Go(func() {
		if err := s.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	closing.Wait()
}

// ---- network namespaces ----

// ipCmd runs ip(8) and returns its output.
func ipCmd(t *testing.T, args ...string) string {
	t.Helper()
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		t.Fatalf("ip %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// newNetns creates a uniquely named network namespace, deleted when the test
// ends (whether it passed or not) or, should the test binary die first, by
// netlab's reaper.
func newNetns(t *testing.T) string {
	t.Helper()
	return netlab.Namespace(t)
}

// inNetns runs fn on the calling (test) goroutine, locked to its OS thread
// while that thread is inside the named network namespace. The thread goes
// back to the original namespace afterwards, also when fn calls t.Fatal; if
// that fails, the thread stays locked and dies with the goroutine instead of
// being reused in the wrong namespace.
func inNetns(t *testing.T, name string, fn func()) {
	t.Helper()
	runtime.LockOSThread()
	unlock := true
	defer func() {
		if unlock {
			runtime.UnlockOSThread()
		}
	}()
	orig, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatalf("open own netns: %v", err)
	}
	defer unix.Close(orig)
	target, err := unix.Open("/run/netns/"+name, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatalf("open netns %s: %v", name, err)
	}
	defer unix.Close(target)
	if err := unix.Setns(target, unix.CLONE_NEWNET); err != nil {
		t.Fatalf("setns %s: %v", name, err)
	}
	defer func() {
		if err := unix.Setns(orig, unix.CLONE_NEWNET); err != nil {
			unlock = false
			t.Errorf("setns back to the original netns: %v", err)
		}
	}()
	fn()
}

// ifindexIn returns the index of interface dev in network namespace ns.
func ifindexIn(t *testing.T, ns, dev string) int {
	t.Helper()
	var idx int
	inNetns(t, ns, func() {
		ifi, err := net.InterfaceByName(dev)
		if err != nil {
			t.Fatalf("interface %s in %s: %v", dev, ns, err)
		}
		idx = ifi.Index
	})
	return idx
}

func progID(t *testing.T, s *Steering) ebpf.ProgramID {
	t.Helper()
	info, err := s.Program().Info()
	if err != nil {
		t.Fatalf("program info: %v", err)
	}
	id, ok := info.ID()
	if !ok {
		t.Fatal("kernel reports no program id")
	}
	return id
}

// newVethNetns returns a fresh namespace holding the veth pair xmx0/xmx1.
func newVethNetns(t *testing.T) string {
	t.Helper()
	ns := newNetns(t)
	ipCmd(t, "-n", ns, "link", "add", "xmx0", "type", "veth", "peer", "name", "xmx1")
	ipCmd(t, "-n", ns, "link", "set", "xmx0", "up")
	ipCmd(t, "-n", ns, "link", "set", "xmx1", "up")
	return ns
}

// xdpShown reports what `ip -d link show` says about XDP on dev.
func xdpShown(t *testing.T, ns, dev string) string {
	return ipCmd(t, "-n", ns, "-d", "link", "show", "dev", dev)
}

func TestAttachVeth(t *testing.T) {
	requirePrivileged(t)
	ns := newVethNetns(t)
	idx0 := ifindexIn(t, ns, "xmx0")
	idx1 := ifindexIn(t, ns, "xmx1")

	s := load(t, LoadOptions{})
	want := fmt.Sprintf("prog/xdp id %d", progID(t, s))
	inNetns(t, ns, func() {
		mode, err := s.Attach(idx0, AttachAuto)
		if err != nil {
			t.Fatalf("Attach(auto): %v", err)
		}
		if mode != AttachDriver {
			t.Errorf("Attach(auto) on veth: mode %s, want drv", mode)
		}
		// One Steering, one interface.
		if _, err := s.Attach(idx1, AttachAuto); err == nil {
			t.Error("second Attach of the same Steering succeeded")
		}
	})
	out := xdpShown(t, ns, "xmx0")
	if !strings.Contains(out, want) || !strings.Contains(out, "xdp") {
		t.Fatalf("ip -d link show xmx0 lacks %q:\n%s", want, out)
	}

	// One interface, one steering program: a second one is refused, in
	// either mode, and the error names the interface.
	s2 := load(t, LoadOptions{})
	inNetns(t, ns, func() {
		for _, m := range []AttachMode{AttachAuto, AttachDriver, AttachGeneric} {
			_, err := s2.Attach(idx0, m)
			if err == nil {
				t.Errorf("second program attached to xmx0 in %s mode", m)
				continue
			}
			if !strings.Contains(err.Error(), fmt.Sprintf("ifindex %d", idx0)) {
				t.Errorf("error does not name the interface: %v", err)
			}
			t.Logf("second program, %s: %v", m, err)
		}
	})

	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if out := xdpShown(t, ns, "xmx0"); strings.Contains(out, "prog/xdp") {
		t.Fatalf("program still attached after Close:\n%s", out)
	}

	// Generic mode, explicitly, on the peer.
	inNetns(t, ns, func() {
		mode, err := s2.Attach(idx1, AttachGeneric)
		if err != nil || mode != AttachGeneric {
			t.Errorf("Attach(skb) on xmx1: %s, %v", mode, err)
		}
	})
	if out := xdpShown(t, ns, "xmx1"); !strings.Contains(out, "xdpgeneric") ||
		!strings.Contains(out, fmt.Sprintf("prog/xdp id %d", progID(t, s2))) {
		t.Fatalf("ip -d link show xmx1 shows no generic program:\n%s", out)
	}
	if err := s2.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if out := xdpShown(t, ns, "xmx1"); strings.Contains(out, "prog/xdp") {
		t.Fatalf("program still attached after Close:\n%s", out)
	}
}

// lo has no native XDP: auto falls back to generic, drv fails cleanly.
func TestAttachFallbackOnLoopback(t *testing.T) {
	requirePrivileged(t)
	ns := newNetns(t)
	lo := ifindexIn(t, ns, "lo")
	s := load(t, LoadOptions{})
	inNetns(t, ns, func() {
		_, err := s.Attach(lo, AttachDriver)
		if err == nil {
			t.Fatal("Attach(drv) on lo succeeded")
		}
		if want := fmt.Sprintf("bpf: attach xdp (drv) to ifindex %d: ", lo); !strings.HasPrefix(err.Error(), want) {
			t.Errorf("error %q does not start with %q", err, want)
		}
		mode, err := s.Attach(lo, AttachAuto)
		if err != nil || mode != AttachGeneric {
			t.Errorf("Attach(auto) on lo: %s, %v; want skb", mode, err)
		}
	})
	if out := xdpShown(t, ns, "lo"); !strings.Contains(out, "xdpgeneric") {
		t.Errorf("lo shows no generic program:\n%s", out)
	}
	// A missing interface is an error naming it, not a panic.
	s2 := load(t, LoadOptions{})
	if _, err := s2.Attach(1<<30, AttachAuto); err == nil || !strings.Contains(err.Error(), fmt.Sprint("ifindex ", 1<<30)) {
		t.Errorf("Attach to a missing interface: %v", err)
	}
	if _, err := s2.Attach(0, AttachAuto); err == nil {
		t.Error("Attach to ifindex 0 succeeded")
	}
}

// The program is attached through a bpf_link owned by the process: killing
// the process detaches it.
func TestAttachReleasedWhenProcessKilled(t *testing.T) {
	requirePrivileged(t)
	ns := newVethNetns(t)

	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperAttachAndWait$")
	cmd.Env = append(os.Environ(), helperNetnsEnv+"="+ns)
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })

	lines := make(chan string)
	stop := make(chan struct{})
	t.Cleanup(func() { close(stop) })
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			select {
			case lines <- sc.Text():
			case <-stop:
				return
			}
		}
	}()
	var id string
	timeout := time.After(30 * time.Second)
	for id == "" {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatal("helper exited before attaching")
			}
			if rest, ok := strings.CutPrefix(l, helperReady); ok {
				id = rest
			}
		case <-timeout:
			t.Fatal("helper did not attach within 30s")
		}
	}
	if out := xdpShown(t, ns, "xmx0"); !strings.Contains(out, "prog/xdp id "+id) {
		t.Fatalf("helper's program %s not attached:\n%s", id, out)
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	deadline := time.Now().Add(5 * time.Second)
	for {
		out := xdpShown(t, ns, "xmx0")
		if !strings.Contains(out, "prog/xdp") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("program still attached 5s after SIGKILL:\n%s", out)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

const (
	helperNetnsEnv = "XMX_BPF_TEST_HELPER_NETNS"
	helperReady    = "XMX-ATTACHED "
)

// TestHelperAttachAndWait is not a test: it is the child process of
// TestAttachReleasedWhenProcessKilled, which SIGKILLs it once attached.
func TestHelperAttachAndWait(t *testing.T) {
	ns := os.Getenv(helperNetnsEnv)
	if ns == "" {
		t.Skip("helper process of TestAttachReleasedWhenProcessKilled")
	}
	s := load(t, LoadOptions{})
	idx := ifindexIn(t, ns, "xmx0")
	inNetns(t, ns, func() {
		if _, err := s.Attach(idx, AttachAuto); err != nil {
			t.Errorf("Attach: %v", err)
		}
	})
	fmt.Printf("%s%d\n", helperReady, progID(t, s))
	time.Sleep(time.Minute) // killed long before
}

// ---- a real AF_XDP socket ----

const (
	xskFrames    = 16
	xskFrameSize = 2048
	xskRing      = 16 // entries in every ring
)

// xsk is a minimal AF_XDP socket (copy mode) with an RX ring and a UMEM
// whose fill ring is stocked with every frame.
type xsk struct {
	fd   int
	umem []byte
	fill []byte
	rx   []byte
	off  unix.XDPMmapOffsets
}

func sockopt(fd, opt int, p unsafe.Pointer, size uintptr) error {
	_, _, e := unix.Syscall6(unix.SYS_SETSOCKOPT, uintptr(fd), unix.SOL_XDP, uintptr(opt), uintptr(p), size, 0)
	if e != 0 {
		return e
	}
	return nil
}

// newXSK creates an AF_XDP socket bound to queue 0 of ifindex in the
// calling thread's network namespace; it is closed when the test ends.
func newXSK(t *testing.T, ifindex int) *xsk {
	t.Helper()
	fd, err := unix.Socket(unix.AF_XDP, unix.SOCK_RAW|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatalf("socket(AF_XDP): %v", err)
	}
	x := &xsk{fd: fd}
	t.Cleanup(x.close)

	x.umem, err = unix.Mmap(-1, 0, xskFrames*xskFrameSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatalf("mmap umem: %v", err)
	}
	reg := unix.XDPUmemReg{
		Addr: uint64(uintptr(unsafe.Pointer(&x.umem[0]))),
		Len:  uint64(len(x.umem)),
		Size: xskFrameSize,
	}
	if err := sockopt(fd, unix.XDP_UMEM_REG, unsafe.Pointer(&reg), unsafe.Sizeof(reg)); err != nil {
		t.Fatalf("XDP_UMEM_REG: %v", err)
	}
	for _, opt := range []int{unix.XDP_UMEM_FILL_RING, unix.XDP_UMEM_COMPLETION_RING, unix.XDP_RX_RING} {
		if err := unix.SetsockoptInt(fd, unix.SOL_XDP, opt, xskRing); err != nil {
			t.Fatalf("setsockopt ring %d: %v", opt, err)
		}
	}
	size := uint32(unsafe.Sizeof(x.off))
	if _, _, e := unix.Syscall6(unix.SYS_GETSOCKOPT, uintptr(fd), unix.SOL_XDP, unix.XDP_MMAP_OFFSETS,
		uintptr(unsafe.Pointer(&x.off)), uintptr(unsafe.Pointer(&size)), 0); e != 0 {
		t.Fatalf("XDP_MMAP_OFFSETS: %v", e)
	}
	x.fill, err = unix.Mmap(fd, unix.XDP_UMEM_PGOFF_FILL_RING, int(x.off.Fr.Desc)+xskRing*8,
		unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
	if err != nil {
		t.Fatalf("mmap fill ring: %v", err)
	}
	x.rx, err = unix.Mmap(fd, unix.XDP_PGOFF_RX_RING, int(x.off.Rx.Desc)+xskRing*int(unsafe.Sizeof(unix.XDPDesc{})),
		unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
	if err != nil {
		t.Fatalf("mmap rx ring: %v", err)
	}
	// Hand every UMEM frame to the kernel.
	for i := range xskFrames {
		binary.NativeEndian.PutUint64(x.fill[int(x.off.Fr.Desc)+i*8:], uint64(i*xskFrameSize))
	}
	x.u32(x.fill, x.off.Fr.Producer).Store(xskFrames)

	if err := unix.Bind(fd, &unix.SockaddrXDP{Flags: unix.XDP_COPY, Ifindex: uint32(ifindex), QueueID: 0}); err != nil {
		t.Fatalf("bind AF_XDP to ifindex %d queue 0 (copy mode): %v", ifindex, err)
	}
	return x
}

func (x *xsk) u32(ring []byte, off uint64) *atomic.Uint32 {
	return (*atomic.Uint32)(unsafe.Pointer(&ring[off]))
}

// receive returns the frames waiting in the RX ring and consumes them.
func (x *xsk) receive() [][]byte {
	prod := x.u32(x.rx, x.off.Rx.Producer).Load()
	cons := x.u32(x.rx, x.off.Rx.Consumer).Load()
	var frames [][]byte
	for ; cons != prod; cons++ {
		d := (*unix.XDPDesc)(unsafe.Pointer(&x.rx[int(x.off.Rx.Desc)+int(cons%xskRing)*int(unsafe.Sizeof(unix.XDPDesc{}))]))
		frames = append(frames, bytes.Clone(x.umem[d.Addr:d.Addr+uint64(d.Len)]))
	}
	x.u32(x.rx, x.off.Rx.Consumer).Store(cons)
	return frames
}

// receiveWithin polls the RX ring until it holds n frames or d has passed,
// and returns what it found.
func (x *xsk) receiveWithin(d time.Duration, n int) [][]byte {
	var frames [][]byte
	for end := time.Now().Add(d); len(frames) < n && time.Now().Before(end); time.Sleep(time.Millisecond) {
		frames = append(frames, x.receive()...)
	}
	return frames
}

// sendOn sends frame f out of interface ifindex through an AF_PACKET
// socket of the calling thread's network namespace.
func sendOn(t *testing.T, ifindex int, f []byte) {
	t.Helper()
	fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatalf("AF_PACKET socket: %v", err)
	}
	defer unix.Close(fd)
	to := &unix.SockaddrLinklayer{Ifindex: ifindex, Protocol: binary.NativeEndian.Uint16(f[12:14])} // network order, as sll_protocol
	if err := unix.Sendto(fd, f, 0, to); err != nil {
		t.Fatalf("send %d-byte frame on ifindex %d: %v", len(f), ifindex, err)
	}
}

func (x *xsk) close() {
	for _, m := range [][]byte{x.rx, x.fill, x.umem} {
		if m != nil {
			_ = unix.Munmap(m)
		}
	}
	_ = unix.Close(x.fd)
}

// The redirect path with a real socket: an AF_XDP socket bound to queue 0 of
// lo (copy mode; no XDP program needs to be attached for that) in a private
// namespace. Each variant gets its own namespace: the kernel releases a
// closed socket's hold on its queue asynchronously, so binding the same
// queue again right away can fail with EBUSY.
func TestRedirectToSocket(t *testing.T) {
	requirePrivileged(t)
	variants(t, LoadOptions{}, func(t *testing.T, s *Steering) {
		ns := newNetns(t)
		lo := ifindexIn(t, ns, "lo")
		inNetns(t, ns, func() {
			x := newXSK(t, lo)
			if err := s.Register(0, x.fd); err != nil {
				t.Fatalf("Register: %v", err)
			}
			f := frame(0x88B5, 64)

			// Plain test-run only reports the action.
			expect(t, s, f, xdpRedirect, Stats{Redirected: 1})
			// Other EtherTypes still go to the kernel.
			expect(t, s, frame(0x0806, 28), xdpPass, Stats{Passed: 1})
			// ...and a plain test-run delivers nothing.
			if got := x.receive(); len(got) != 0 {
				t.Errorf("plain test-run delivered %d frames", len(got))
			}

			// A real frame performs the redirect: attached to lo (generic
			// mode), the program must put a frame sent out of lo into the
			// socket's RX ring, byte for byte.
			if _, err := s.Attach(lo, AttachGeneric); err != nil {
				t.Fatalf("Attach: %v", err)
			}
			before := stats(t, s)
			sendOn(t, lo, f)
			rx := x.receiveWithin(time.Second, 1)
			if len(rx) != 1 || !bytes.Equal(rx[0], f) {
				t.Errorf("RX ring holds %d frames %x, want exactly the sent frame", len(rx), rx)
			}
			if got := stats(t, s).sub(before); got != (Stats{Redirected: 1}) {
				t.Errorf("a real frame moved counters by %+v", got)
			}

			if err := s.Unregister(0); err != nil {
				t.Errorf("Unregister: %v", err)
			}
			expect(t, s, f, xdpPass, Stats{NoSocket: 1})
		})
	})
}

// TestEtherTypeRefused: EtherTypes the kernel or its daemons need (ARP,
// IP, VLAN tags, MPLS, PPPoE, MACsec, LLDP, EAPOL, PTP) and 802.3 lengths
// are refused, naming the value in hex; Load refuses them before loading
// anything.
func TestEtherTypeRefused(t *testing.T) {
	for _, et := range []uint16{0x0040, 0x05ff, 0x0800, 0x0806, 0x8035, 0x86dd, 0x8100, 0x88a8, 0x9100,
		0x8847, 0x8848, 0x8863, 0x8864, 0x88e5, 0x88cc, 0x888e, 0x88f7} {
		err := CheckEtherType(et)
		if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("%#04x", et)) {
			t.Errorf("CheckEtherType(%#04x) = %v, want an error naming it", et, err)
		}
		if _, err := Load(LoadOptions{EtherType: et}); err == nil {
			t.Errorf("Load with EtherType %#04x succeeded", et)
		}
	}
	for _, et := range []uint16{0x0600, DefaultEtherType, 0x88b6, 0xffff} {
		if err := CheckEtherType(et); err != nil {
			t.Errorf("CheckEtherType(%#04x): %v", et, err)
		}
	}
}
