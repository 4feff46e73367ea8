package xdp_test

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/xmx-stack/xmx/internal/netlab"
	"github.com/xmx-stack/xmx/xdp"
	"github.com/xmx-stack/xmx/xdp/linktest"
)

// openAFXDP opens an AF_XDP link on h's eth0 and closes it at cleanup.
func openAFXDP(tb testing.TB, h *netlab.Host, cfg xdp.AFXDPConfig) *xdp.AFXDPLink {
	tb.Helper()
	cfg.Interface = h.Interface
	var l *xdp.AFXDPLink
	err := h.Do(func() (err error) {
		l, err = xdp.OpenAFXDP(cfg)
		return err
	})
	if errors.Is(err, xdp.ErrMultiBufferUnsupported) {
		release, _ := os.ReadFile("/proc/sys/kernel/osrelease")
		tb.Skipf("open AF_XDP on %s: %v (this kernel: %s)", h.Name, err, strings.TrimSpace(string(release)))
	}
	if err != nil {
		tb.Fatalf("open AF_XDP on %s: %v", h.Name, err)
	}
	tb.Cleanup(func() { l.Close() })
	return l
}

// kernelDrops sums the interface drop counters of the lab's hosts.
func kernelDrops(tb testing.TB, lab *netlab.Lab) func() uint64 {
	return func() uint64 {
		var sum uint64
		for _, h := range lab.Hosts {
			s, err := h.IfaceStats()
			if err != nil {
				tb.Errorf("interface counters of %s: %v", h.Name, err)
				continue
			}
			sum += s.RxDropped + s.TxDropped
		}
		return sum
	}
}

func TestAFXDPConformance(t *testing.T) {
	lab := netlab.New(t, netlab.Options{Hosts: 2})
	h1, h2 := lab.Hosts[0], lab.Hosts[1]
	for _, spin := range []bool{false, true} {
		name := map[bool]string{false: "poll", true: "spin"}[spin]
		t.Run(name, func(t *testing.T) {
			linktest.Run(t, func(tb testing.TB) linktest.Pair {
				a := openAFXDP(tb, h1, xdp.AFXDPConfig{Spin: spin, BufferBytes: 256 << 10})
				b := openAFXDP(tb, h2, xdp.AFXDPConfig{Spin: spin, BufferBytes: 256 << 10})
				return linktest.Pair{A: a, B: b, KernelDrops: kernelDrops(tb, lab)}
			}, linktest.Options{})
		})
	}
}

// TestAFXDPFillRoom checks that the fill ring's producer side reckons
// its room right from the start: it used to begin from a cached consumer
// index of 0, behind the frames given at open, and to see about 2^32
// free entries until the producer index wrapped.
func TestAFXDPFillRoom(t *testing.T) {
	lab := netlab.New(t, netlab.Options{Hosts: 2})
	l := openAFXDP(t, lab.Hosts[0], xdp.AFXDPConfig{})
	if room, size := l.FillRoomForTest(); room > size {
		t.Errorf("fill ring: room for %d entries in a ring of %d", room, size)
	}
}

func TestAFXDPInfo(t *testing.T) {
	lab := netlab.New(t, netlab.Options{Hosts: 2})
	l := openAFXDP(t, lab.Hosts[0], xdp.AFXDPConfig{})
	info := l.Info()
	// veth supports native XDP but not zero-copy AF_XDP.
	if info.Kind != "afxdp" || info.Mode != "copy drv poll" || info.Queue != 0 || info.Interface != "eth0" {
		t.Errorf("Info() = %+v, want afxdp on eth0 queue 0 in mode \"copy drv poll\"", info)
	}
	if l.ZeroCopy() {
		t.Error("ZeroCopy() on veth")
	}
	if _, err := xdp.OpenAFXDP(xdp.AFXDPConfig{Interface: "nonexistent0"}); err == nil ||
		!strings.Contains(err.Error(), "nonexistent0") {
		t.Errorf("open on a missing interface: %v, want an error naming it", err)
	}
	var err error
	lab.Hosts[0].Do(func() error {
		_, err = xdp.OpenAFXDP(xdp.AFXDPConfig{Interface: "eth0", Bind: xdp.BindZeroCopy})
		return nil
	})
	if err == nil || !strings.Contains(err.Error(), "zero-copy") {
		t.Errorf("forced zero-copy on veth: %v, want a zero-copy error", err)
	}
}

// TestAFXDPKeepsIPWorking checks that the steering program passes ARP and
// IP to the kernel while a link is open, and that nothing stays attached
// after Close.
func TestAFXDPKeepsIPWorking(t *testing.T) {
	lab := netlab.New(t, netlab.Options{Hosts: 2})
	h1, h2 := lab.Hosts[0], lab.Hosts[1]
	a := openAFXDP(t, h1, xdp.AFXDPConfig{})
	b := openAFXDP(t, h2, xdp.AFXDPConfig{})
	if !hasXDP(t, h1) || !hasXDP(t, h2) {
		t.Fatal("no XDP program attached while links are open")
	}
	if err := h1.Ping(h2, 3); err != nil {
		t.Fatalf("ping with AF_XDP links open: %v", err)
	}
	if err := h2.Ping(h1, 3); err != nil {
		t.Fatalf("ping with AF_XDP links open: %v", err)
	}
	a.Close()
	b.Close()
	if hasXDP(t, h1) || hasXDP(t, h2) {
		t.Fatal("XDP program still attached after Close")
	}
}

func hasXDP(tb testing.TB, h *netlab.Host) bool {
	tb.Helper()
	out, err := exec.Command("ip", "-n", h.Namespace, "link", "show", "dev", h.Interface).CombinedOutput()
	if err != nil {
		tb.Fatalf("ip link show: %v: %s", err, out)
	}
	return strings.Contains(string(out), "prog/xdp")
}

// TestAFXDPKill9 kills a process that holds an AF_XDP link and checks that
// the interface is left as it was: no program attached, ping working.
func TestAFXDPKill9(t *testing.T) {
	lab := netlab.New(t, netlab.Options{Hosts: 2})
	h1, h2 := lab.Hosts[0], lab.Hosts[1]
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := h1.Command(exe, "-test.run=^TestHelperHoldLink$")
	cmd.Env = append(os.Environ(), "XMX_HOLD_LINK="+h1.Interface)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	ready := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if strings.HasPrefix(sc.Text(), "ready") {
				ready <- sc.Text()
				return
			}
		}
		ready <- "exited"
	}()
	select {
	case line := <-ready:
		if line != "ready" {
			t.Fatalf("holder process: %s", line)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("holder process did not open its link")
	}
	if !hasXDP(t, h1) {
		t.Fatal("holder process has no XDP program attached")
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()
	// The bpf_link is released with the last file descriptor of the killed
	// process; give the kernel a moment to tear it down.
	deadline := time.Now().Add(5 * time.Second)
	for hasXDP(t, h1) {
		if time.Now().After(deadline) {
			t.Fatal("XDP program still attached 5 s after kill -9")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := h2.Ping(h1, 3); err != nil {
		t.Fatalf("ping after kill -9 of the link holder: %v", err)
	}
}

// TestHelperHoldLink is run as a separate process by TestAFXDPKill9: it opens
// a link, says "ready" and waits to be killed.
func TestHelperHoldLink(t *testing.T) {
	ifname := os.Getenv("XMX_HOLD_LINK")
	if ifname == "" {
		t.Skip("helper process for TestAFXDPKill9")
	}
	l, err := xdp.OpenAFXDP(xdp.AFXDPConfig{Interface: ifname})
	if err != nil {
		fmt.Println("open:", err)
		os.Exit(1)
	}
	fmt.Println("ready")
	bufs, sizes := [][]byte{make([]byte, 2048)}, []int{0}
	deadline := time.Now().Add(60 * time.Second) // bounded even if nobody kills us
	for time.Now().Before(deadline) {
		l.Recv(bufs, sizes, 100*time.Millisecond)
	}
	os.Exit(0)
}

// TestAFXDPNoAllocs checks that Send and Recv make no heap allocation in
// steady state, in both receive modes.
func TestAFXDPNoAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are meaningless under the race detector")
	}
	lab := netlab.New(t, netlab.Options{Hosts: 2})
	for _, spin := range []bool{false, true} {
		a := openAFXDP(t, lab.Hosts[0], xdp.AFXDPConfig{Spin: spin})
		b := openAFXDP(t, lab.Hosts[1], xdp.AFXDPConfig{Spin: spin})
		f := make([]byte, 64)
		copy(f, b.HardwareAddr())
		copy(f[6:], a.HardwareAddr())
		f[12], f[13] = 0x88, 0xb5
		frames := [][]byte{f}
		bufs, sizes := [][]byte{make([]byte, 2048)}, []int{0}
		allocs := testing.AllocsPerRun(2000, func() {
			if _, err := a.Send(frames); err != nil {
				t.Fatal(err)
			}
			if n, err := b.Recv(bufs, sizes, time.Second); n != 1 || err != nil {
				t.Fatalf("recv = %d, %v", n, err)
			}
		})
		if allocs != 0 {
			t.Errorf("spin=%v: %.1f allocations per Send+Recv, want 0", spin, allocs)
		}
		a.Close()
		b.Close()
	}
}

// TestAFXDPMultiQueue runs the conformance suite over one socket per queue
// on two-queue veths, and checks that a frame arriving on the second queue
// is received.
func TestAFXDPMultiQueue(t *testing.T) {
	lab := netlab.New(t, netlab.Options{Hosts: 2, Queues: 2})
	h1, h2 := lab.Hosts[0], lab.Hosts[1]
	openMulti := func(tb testing.TB, h *netlab.Host, spin bool) *xdp.AFXDPMultiLink {
		var l *xdp.AFXDPMultiLink
		err := h.Do(func() (err error) {
			l, err = xdp.OpenAFXDPQueues(xdp.AFXDPConfig{Interface: h.Interface, Spin: spin}, []int{0, 1})
			return err
		})
		if err != nil {
			tb.Fatalf("open AF_XDP queues 0,1 on %s: %v", h.Name, err)
		}
		tb.Cleanup(func() { l.Close() })
		return l
	}
	for _, spin := range []bool{false, true} {
		t.Run(map[bool]string{false: "poll", true: "spin"}[spin], func(t *testing.T) {
			linktest.Run(t, func(tb testing.TB) linktest.Pair {
				return linktest.Pair{A: openMulti(tb, h1, spin), B: openMulti(tb, h2, spin)}
			}, linktest.Options{Frames: 10000})
		})
	}
	t.Run("EachQueue", func(t *testing.T) {
		b := openMulti(t, h2, false)
		for _, q := range []int{0, 1} {
			a := openAFXDP(t, h1, xdp.AFXDPConfig{Queue: q})
			f := make([]byte, 100)
			copy(f, b.HardwareAddr())
			copy(f[6:], a.HardwareAddr())
			f[12], f[13] = 0x88, 0xb5
			f[20] = byte(q)
			if _, err := a.Send([][]byte{f}); err != nil {
				t.Fatal(err)
			}
			bufs, sizes := [][]byte{make([]byte, 2048)}, []int{0}
			n, err := b.Recv(bufs, sizes, 2*time.Second)
			if err != nil || n != 1 || bufs[0][20] != byte(q) {
				t.Fatalf("frame sent on queue %d: Recv = %d, %v", q, n, err)
			}
			if got := b.Queues()[q].Stats().RxFrames; got != 1 {
				t.Errorf("queue %d link received %d frames, want 1", q, got)
			}
			a.Close()
		}
	})
}

// vethNativeMaxMTU is the largest MTU at which veth runs a single-buffer
// (not xdp.frags) XDP program in driver mode: a page minus the XDP headroom
// and the skb_shared_info.
const vethNativeMaxMTU = 3506

// TestAFXDPConformanceMTU3506 runs the conformance suite at the largest MTU
// veth carries in native XDP mode without multi-buffer: every frame still
// fits one UMEM frame, so the link stays single-buffer and in driver mode.
func TestAFXDPConformanceMTU3506(t *testing.T) {
	lab := netlab.New(t, netlab.Options{Hosts: 2, MTU: vethNativeMaxMTU})
	h1, h2 := lab.Hosts[0], lab.Hosts[1]
	for _, spin := range []bool{false, true} {
		name := map[bool]string{false: "poll", true: "spin"}[spin]
		t.Run(name, func(t *testing.T) {
			linktest.Run(t, func(tb testing.TB) linktest.Pair {
				a := openAFXDP(tb, h1, xdp.AFXDPConfig{Spin: spin, BufferBytes: 256 << 10})
				b := openAFXDP(tb, h2, xdp.AFXDPConfig{Spin: spin, BufferBytes: 256 << 10})
				for _, l := range []*xdp.AFXDPLink{a, b} {
					if want := "copy drv " + name; l.Info().Mode != want || l.MTU() != vethNativeMaxMTU {
						tb.Fatalf("%s: MTU %d, mode %q; want MTU %d, mode %q", l.Info().Interface, l.MTU(), l.Info().Mode, vethNativeMaxMTU, want)
					}
				}
				return linktest.Pair{A: a, B: b, KernelDrops: kernelDrops(tb, lab)}
			}, linktest.Options{})
		})
	}
}

// TestAFXDPInterfaceGone deletes the interface under links that are
// waiting in the kernel: the kernel never makes an unbound AF_XDP socket
// ready again, so without the link's own look (goneCheck) the waits would
// last for good. Each wait ends with ErrInterfaceGone, and so does every
// later call; Close still works.
func TestAFXDPInterfaceGone(t *testing.T) {
	for _, tc := range []struct {
		name   string
		queues int
	}{{"single", 1}, {"multi", 2}} {
		t.Run(tc.name, func(t *testing.T) {
			lab := netlab.New(t, netlab.Options{Hosts: 2, Queues: tc.queues})
			h := lab.Hosts[0]
			var l xdp.Link
			var v xdp.FrameVisitor
			if tc.queues == 1 {
				a := openAFXDP(t, h, xdp.AFXDPConfig{})
				l, v = a, a
			} else {
				var m *xdp.AFXDPMultiLink
				if err := h.Do(func() (err error) {
					m, err = xdp.OpenAFXDPQueues(xdp.AFXDPConfig{Interface: h.Interface}, []int{0, 1})
					return err
				}); err != nil {
					t.Fatalf("open AF_XDP queues 0,1 on %s: %v", h.Name, err)
				}
				t.Cleanup(func() { m.Close() })
				l, v = m, m
			}
			bufs, sizes := [][]byte{make([]byte, 2048)}, []int{0}
			waits := make(chan error, 2)
			go func() {
				_, err := l.Recv(bufs, sizes, -1) // unbounded
				waits <- err
			}()
			time.Sleep(50 * time.Millisecond) // let it sleep in the kernel
			if out, err := h.Command("ip", "link", "del", h.Interface).CombinedOutput(); err != nil {
				t.Fatalf("ip link del %s: %v: %s", h.Interface, err, out)
			}
			start := time.Now()
			select {
			case err := <-waits:
				var oe *xdp.OpError
				if !errors.Is(err, xdp.ErrInterfaceGone) || !errors.As(err, &oe) || oe.Op != "recv" || oe.Interface != h.Interface {
					t.Fatalf("unbounded Recv ended with %v; want ErrInterfaceGone from recv on %s", err, h.Interface)
				}
				t.Logf("unbounded Recv ended after %v: %v", time.Since(start).Round(time.Millisecond), err)
			case <-time.After(5 * time.Second):
				t.Fatal("unbounded Recv still waiting 5 s after its interface was deleted")
			}
			if _, err := l.Recv(bufs, sizes, 0); !errors.Is(err, xdp.ErrInterfaceGone) {
				t.Errorf("polling Recv after = %v, want ErrInterfaceGone", err)
			}
			if _, err := v.RecvVisit(4, time.Millisecond, visitNone{}); !errors.Is(err, xdp.ErrInterfaceGone) {
				t.Errorf("RecvVisit after = %v, want ErrInterfaceGone", err)
			}
			f := make([]byte, 60)
			f[12], f[13] = 0x88, 0xb5
			if n, err := l.Send([][]byte{f}); n != 0 || !errors.Is(err, xdp.ErrInterfaceGone) {
				t.Errorf("Send after = %d, %v; want 0, ErrInterfaceGone", n, err)
			}
			if err := l.Close(); err != nil {
				t.Logf("Close after the interface went: %v", err)
			}
			if _, err := l.Recv(bufs, sizes, 0); !errors.Is(err, net.ErrClosed) {
				t.Errorf("Recv after Close = %v, want net.ErrClosed", err)
			}
		})
	}
}

// TestAFXDPSendFindsInterfaceGone: a send is the first to meet the deleted
// interface (the kernel refuses to be woken, ENXIO); the receive side then
// reports it at once, without waiting for its look.
func TestAFXDPSendFindsInterfaceGone(t *testing.T) {
	lab := netlab.New(t, netlab.Options{Hosts: 2})
	h := lab.Hosts[0]
	a := openAFXDP(t, h, xdp.AFXDPConfig{})
	if out, err := h.Command("ip", "link", "del", h.Interface).CombinedOutput(); err != nil {
		t.Fatalf("ip link del %s: %v: %s", h.Interface, err, out)
	}
	f := make([]byte, 60)
	f[12], f[13] = 0x88, 0xb5
	var err error
	for range 3 { // the first frame may go on the ring before the kick fails
		if _, err = a.Send([][]byte{f}); err != nil {
			break
		}
	}
	if !errors.Is(err, xdp.ErrInterfaceGone) || !errors.Is(err, syscall.ENXIO) {
		t.Fatalf("Send on a deleted interface = %v; want ErrInterfaceGone (ENXIO)", err)
	}
	if a.RxIdle() {
		t.Error("RxIdle true on a link whose interface is gone: a poller would never learn it")
	}
	start := time.Now()
	if _, err := a.Recv([][]byte{make([]byte, 2048)}, []int{0}, time.Second); !errors.Is(err, xdp.ErrInterfaceGone) {
		t.Errorf("Recv after = %v, want ErrInterfaceGone", err)
	} else if el := time.Since(start); el > 100*time.Millisecond {
		t.Errorf("Recv took %v to report what Send had found", el)
	}
}

// visitNone is a Visitor that looks at nothing.
type visitNone struct{}

func (visitNone) Visit([]byte) {}

// TestAFXDPCountsDroppedSends takes the peer's end of the veth down: the
// driver drops every frame (sendto says EBUSY in copy mode), and each one
// is counted in TxErrors (and so in Stats.Lost) rather than vanishing.
func TestAFXDPCountsDroppedSends(t *testing.T) {
	lab := netlab.New(t, netlab.Options{Hosts: 2})
	h1, h2 := lab.Hosts[0], lab.Hosts[1]
	a := openAFXDP(t, h1, xdp.AFXDPConfig{})
	b := openAFXDP(t, h2, xdp.AFXDPConfig{})
	if out, err := h2.Command("ip", "link", "set", h2.Interface, "down").CombinedOutput(); err != nil {
		t.Fatalf("ip link set down: %v: %s", err, out)
	}
	f := make([]byte, 64)
	copy(f, b.HardwareAddr())
	copy(f[6:], a.HardwareAddr())
	f[12], f[13] = 0x88, 0xb5
	before := a.Stats()
	n, err := a.Send([][]byte{f, f, f})
	after := a.Stats()
	if got := after.TxErrors - before.TxErrors; err == nil && got != 3 {
		t.Errorf("3 frames dropped by the driver: Send = %d, nil, TxErrors grew by %d; want 3", n, got)
	}
}

// TestAFXDPInterfaceGoneOtherWaits: the waits that do not sleep without
// a bound learn of a deleted interface too: a bounded wait longer than
// goneCheck (its polls are cut to it), a spinning wait (it asks every
// few ten thousand turns), and a poller that asks CheckInterface.
func TestAFXDPInterfaceGoneOtherWaits(t *testing.T) {
	for _, tc := range []struct {
		name    string
		spin    bool
		timeout time.Duration
	}{{"bounded", false, 4 * time.Second}, {"spin", true, -1}, {"poll", false, 0}} {
		t.Run(tc.name, func(t *testing.T) {
			lab := netlab.New(t, netlab.Options{Hosts: 2})
			h := lab.Hosts[0]
			a := openAFXDP(t, h, xdp.AFXDPConfig{Spin: tc.spin})
			if err := a.CheckInterface(); err != nil {
				t.Fatalf("CheckInterface before = %v", err)
			}
			done := make(chan error, 1)
			go func() {
				bufs, sizes := [][]byte{make([]byte, 2048)}, []int{0}
				if tc.timeout != 0 {
					_, err := a.Recv(bufs, sizes, tc.timeout)
					done <- err
					return
				}
				for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); {
					if _, err := a.Recv(bufs, sizes, 0); err != nil {
						done <- err
						return
					}
					if err := a.CheckInterface(); err != nil {
						done <- err
						return
					}
					time.Sleep(10 * time.Millisecond)
				}
				done <- nil
			}()
			time.Sleep(50 * time.Millisecond)
			if out, err := h.Command("ip", "link", "del", h.Interface).CombinedOutput(); err != nil {
				t.Fatalf("ip link del %s: %v: %s", h.Interface, err, out)
			}
			start := time.Now()
			select {
			case err := <-done:
				if el := time.Since(start); !errors.Is(err, xdp.ErrInterfaceGone) || el > 1500*time.Millisecond {
					t.Errorf("ended after %v with %v; want ErrInterfaceGone within goneCheck", el, err)
				}
			case <-time.After(5 * time.Second):
				a.Close()
				<-done
				t.Fatal("still waiting 5 s after the interface was deleted")
			}
		})
	}
}

// TestAFXDPSlicedWaitKeepsItsBound: a bounded wait longer than goneCheck,
// cut into slices, still lasts its bound, and Waited says so.
func TestAFXDPSlicedWaitKeepsItsBound(t *testing.T) {
	lab := netlab.New(t, netlab.Options{Hosts: 2})
	a := openAFXDP(t, lab.Hosts[0], xdp.AFXDPConfig{})
	const bound = 1300 * time.Millisecond
	start := time.Now()
	n, err := a.Recv([][]byte{make([]byte, 2048)}, []int{0}, bound)
	el := time.Since(start)
	if n != 0 || err != nil || el < bound-50*time.Millisecond || el > bound+300*time.Millisecond {
		t.Errorf("Recv(%v) on an idle link = %d, %v after %v", bound, n, err, el)
	}
	if w, ok := a.Waited(); !ok || w < bound-time.Millisecond || w > bound+time.Millisecond {
		t.Errorf("Waited = %v, %v; want %v", w, ok, bound)
	}
}

// TestAFXDPCheckInterfaceBesideRecv: CheckInterface answers at once while
// a Recv waits (it does not take the receive side's lock).
func TestAFXDPCheckInterfaceBesideRecv(t *testing.T) {
	lab := netlab.New(t, netlab.Options{Hosts: 2})
	a := openAFXDP(t, lab.Hosts[0], xdp.AFXDPConfig{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		a.Recv([][]byte{make([]byte, 2048)}, []int{0}, time.Second)
	}()
	time.Sleep(50 * time.Millisecond)
	start := time.Now()
	err := a.CheckInterface()
	el := time.Since(start)
	<-done
	if err != nil || el > 100*time.Millisecond {
		t.Errorf("CheckInterface beside a waiting Recv = %v after %v", err, el)
	}
}

// TestAFXDPLeavesStackedDeviceFrames: frames of the EtherType unicast to a
// macvlan stacked on the link's interface stay with the kernel, which
// gives them to the macvlan (a packet link there receives them); the
// AF_XDP link receives only the frames to its own MAC, and broadcast,
// which it takes from the kernel (XDP cannot both redirect and pass).
func TestAFXDPLeavesStackedDeviceFrames(t *testing.T) {
	lab := netlab.New(t, netlab.Options{Hosts: 2})
	h1, h2 := lab.Hosts[0], lab.Hosts[1]
	mvMAC := net.HardwareAddr{0x02, 0x78, 0x6d, 0xee, 0, 0x02}
	for _, args := range [][]string{
		{"link", "add", "link", h2.Interface, "name", "mv0", "address", mvMAC.String(), "type", "macvlan", "mode", "bridge"},
		{"link", "set", "mv0", "up"},
	} {
		if out, err := h2.Command("ip", args...).CombinedOutput(); err != nil {
			t.Skipf("no macvlan here: ip %s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	a := openAFXDP(t, h1, xdp.AFXDPConfig{})
	b := openAFXDP(t, h2, xdp.AFXDPConfig{})
	var m *xdp.AFPacketLink
	if err := h2.Do(func() (err error) {
		m, err = xdp.OpenAFPacket(xdp.AFPacketConfig{Interface: "mv0"})
		return err
	}); err != nil {
		t.Fatalf("open AF_PACKET on mv0 in %s: %v", h2.Name, err)
	}
	t.Cleanup(func() { m.Close() })

	// Frames to b's MAC, the macvlan's and broadcast, in turn.
	bcast := net.HardwareAddr{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}
	dsts := []net.HardwareAddr{b.HardwareAddr(), mvMAC, bcast}
	const rounds = 10
	var frames [][]byte
	for i := range rounds * len(dsts) {
		f := make([]byte, 64)
		copy(f, dsts[i%len(dsts)])
		copy(f[6:], a.HardwareAddr())
		f[12], f[13] = 0x88, 0xb5
		f[14] = byte(i)
		frames = append(frames, f)
	}
	wantB, wantM := 2*rounds, rounds
	if n, err := a.Send(frames); n != len(frames) || err != nil {
		t.Fatalf("Send: %d, %v", n, err)
	}
	count := func(l xdp.Link, dstOK func(net.HardwareAddr) bool) int {
		bufs, sizes := make([][]byte, 16), make([]int, 16)
		for i := range bufs {
			bufs[i] = make([]byte, 2048)
		}
		got := 0
		for deadline := time.Now().Add(300 * time.Millisecond); time.Now().Before(deadline); {
			n, err := l.Recv(bufs, sizes, 50*time.Millisecond)
			if err != nil {
				t.Fatalf("Recv: %v", err)
			}
			for i := range n {
				if dst := net.HardwareAddr(bufs[i][:6]); !dstOK(dst) {
					t.Errorf("received a frame to %v", dst)
				}
			}
			got += n
		}
		return got
	}
	isB := func(d net.HardwareAddr) bool { return bytes.Equal(d, b.HardwareAddr()) || bytes.Equal(d, bcast) }
	isM := func(d net.HardwareAddr) bool { return bytes.Equal(d, mvMAC) }
	if got := count(b, isB); got != wantB {
		t.Errorf("AF_XDP link on %s received %d frames, want %d (to its MAC and broadcast)", h2.Interface, got, wantB)
	}
	if got := count(m, isM); got != wantM {
		t.Errorf("packet link on mv0 received %d frames, want %d (to its MAC)", got, wantM)
	}
}

// TestAFXDPInterfaceMovedDetaches moves the interface of an open link to
// another namespace. The kernel unbinds the socket but leaves the XDP
// program on the device, where it would keep that namespace's frames of
// the EtherType from the kernel and keep any link there from attaching its
// own. Once the link has found its interface gone, the program is off the
// device, before the link is closed, and a link can be opened there.
func TestAFXDPInterfaceMovedDetaches(t *testing.T) {
	for _, queues := range []int{1, 2} {
		t.Run(fmt.Sprintf("queues=%d", queues), func(t *testing.T) { testInterfaceMoved(t, queues) })
	}
}

func testInterfaceMoved(t *testing.T, queues int) {
	lab := netlab.New(t, netlab.Options{Hosts: 2, Queues: queues})
	h1, h2 := lab.Hosts[0], lab.Hosts[1]
	var a xdp.Link
	if queues == 1 {
		a = openAFXDP(t, h1, xdp.AFXDPConfig{})
	} else if err := h1.Do(func() (err error) {
		a, err = xdp.OpenAFXDPQueues(xdp.AFXDPConfig{Interface: h1.Interface}, []int{0, 1})
		return err
	}); err != nil {
		t.Fatalf("open AF_XDP queues 0,1 on %s: %v", h1.Name, err)
	} else {
		t.Cleanup(func() { a.Close() })
	}
	const moved = "mv0"
	if out, err := h1.Command("ip", "link", "set", h1.Interface, "netns", h2.Namespace, "name", moved).CombinedOutput(); err != nil {
		t.Fatalf("move %s of %s to %s: %v: %s", h1.Interface, h1.Name, h2.Namespace, err, out)
	}
	if err := a.(xdp.InterfaceChecker).CheckInterface(); !errors.Is(err, xdp.ErrInterfaceGone) {
		t.Fatalf("CheckInterface after the move = %v, want ErrInterfaceGone", err)
	}
	// programOn says whether the moved interface carries an XDP program.
	programOn := func() (bool, string) {
		out, err := h2.Command("ip", "-d", "link", "show", "dev", moved).CombinedOutput()
		if err != nil {
			t.Fatalf("ip -d link show %s in %s: %v: %s", moved, h2.Namespace, err, out)
		}
		return strings.Contains(string(out), "prog/xdp"), string(out)
	}
	if on, out := programOn(); on {
		t.Errorf("the moved interface still carries the link's program before Close:\n%s", out)
	}
	var b *xdp.AFXDPLink
	if err := h2.Do(func() (err error) {
		b, err = xdp.OpenAFXDP(xdp.AFXDPConfig{Interface: moved})
		return err
	}); err != nil {
		t.Fatalf("open AF_XDP on %s, moved into %s: %v", moved, h2.Name, err)
	}
	if err := a.Close(); err != nil {
		t.Errorf("Close of the link whose interface moved: %v", err)
	}
	if err := b.CheckInterface(); err != nil {
		t.Errorf("the new link's CheckInterface after the old link's Close: %v", err)
	}
	if err := b.Close(); err != nil {
		t.Errorf("Close of the new link: %v", err)
	}
	if on, out := programOn(); on {
		t.Errorf("a program is left on %s after both links closed:\n%s", moved, out)
	}
}
