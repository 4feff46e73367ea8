package xdp

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"net"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/xmx-stack/xmx/internal/netlab"
)

// The AF_PACKET tests need root: each builds its own lab of two network
// namespaces joined by a veth pair (eth0 on both sides) and opens one link in
// each. The namespaces are internal/netlab's, which removes them in the
// test's cleanup or, should the test binary die first (a -timeout, a
// kill), by its reaper.

// pktLab is two fresh network namespaces, A and B, each holding one end of a
// veth pair named eth0.
type pktLab struct {
	nsA, nsB string
}

func pktIP(args ...string) error {
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, bytes.TrimSpace(out))
	}
	return nil
}

// newPktLab creates the lab (skipping the test without privileges, or
// failing it with XMX_REQUIRE_PRIVILEGED=1). Links opened afterwards are
// closed before the namespaces go (cleanups run last-in first-out).
func newPktLab(tb testing.TB) *pktLab {
	tb.Helper()
	lab := &pktLab{nsA: netlab.Namespace(tb), nsB: netlab.Namespace(tb)}
	steps := [][]string{
		{"-n", lab.nsA, "link", "add", "eth0", "type", "veth", "peer", "name", "eth0", "netns", lab.nsB},
		{"-n", lab.nsA, "link", "set", "eth0", "up"},
		{"-n", lab.nsB, "link", "set", "eth0", "up"},
	}
	for _, s := range steps {
		if err := pktIP(s...); err != nil {
			tb.Fatal(err)
		}
	}
	lab.waitUp(tb, lab.nsA)
	lab.waitUp(tb, lab.nsB)
	return lab
}

// waitUp waits until eth0 in ns is operationally up, which also means the
// kernel has activated its qdisc.
func (lab *pktLab) waitUp(tb testing.TB, ns string) {
	tb.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		out, err := exec.Command("ip", "-n", ns, "-o", "link", "show", "eth0").CombinedOutput()
		if err == nil && bytes.Contains(out, []byte("state UP")) {
			return
		}
		if time.Now().After(deadline) {
			tb.Fatalf("eth0 in %s not up: %v %s", ns, err, out)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// pktInNetns runs fn on a thread locked in network namespace ns, then moves the
// thread back. Sockets fn opens stay in ns.
func pktInNetns(ns string, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			runtime.UnlockOSThread()
			errc <- err
			return
		}
		defer unix.Close(orig)
		target, err := unix.Open("/var/run/netns/"+ns, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			runtime.UnlockOSThread()
			errc <- err
			return
		}
		err = unix.Setns(target, unix.CLONE_NEWNET)
		unix.Close(target)
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("setns %s: %w", ns, err)
			return
		}
		ferr := fn()
		if err := unix.Setns(orig, unix.CLONE_NEWNET); err != nil {
			// Leave the thread locked: the runtime discards it when this
			// goroutine exits.
			errc <- fmt.Errorf("restore namespace: %w", err)
			return
		}
		runtime.UnlockOSThread()
		errc <- ferr
	}()
	return <-errc
}

// open opens a link on eth0 in namespace ns and closes it in tb.Cleanup.
func (lab *pktLab) open(tb testing.TB, ns string, cfg AFPacketConfig) *AFPacketLink {
	tb.Helper()
	if cfg.Interface == "" {
		cfg.Interface = "eth0"
	}
	var l *AFPacketLink
	err := pktInNetns(ns, func() (err error) {
		l, err = OpenAFPacket(cfg)
		return err
	})
	if err != nil {
		tb.Fatalf("open in %s: %v", ns, err)
	}
	tb.Cleanup(func() { l.Close() })
	return l
}

func (lab *pktLab) pair(tb testing.TB, cfgA, cfgB AFPacketConfig) (a, b *AFPacketLink) {
	return lab.open(tb, lab.nsA, cfgA), lab.open(tb, lab.nsB, cfgB)
}

// rawSocket opens a plain AF_PACKET socket (protocol 0: it receives nothing)
// in ns for sending arbitrary frames on ifname, and returns a function that
// sends one frame.
func (lab *pktLab) rawSocket(tb testing.TB, ns, ifname string) func(frame []byte) error {
	tb.Helper()
	var fd, ifindex int
	err := pktInNetns(ns, func() error {
		ifi, err := net.InterfaceByName(ifname)
		if err != nil {
			return err
		}
		ifindex = ifi.Index
		fd, err = unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, 0)
		return err
	})
	if err != nil {
		tb.Fatalf("raw socket in %s: %v", ns, err)
	}
	tb.Cleanup(func() { unix.Close(fd) })
	return func(frame []byte) error {
		sa := &unix.SockaddrLinklayer{
			Ifindex:  ifindex,
			Protocol: htons(binary.BigEndian.Uint16(frame[12:14])),
			Halen:    6,
		}
		copy(sa.Addr[:], frame[:6])
		return unix.Sendto(fd, frame, 0, sa)
	}
}

// Test frames: Ethernet header, sequence number, length, CRC-32 of the rest,
// then a pattern derived from the sequence number.
const (
	pktfSeq     = EthHeaderLen      // uint32
	pktfLen     = EthHeaderLen + 4  // uint16
	pktfSum     = EthHeaderLen + 6  // uint32: CRC-32 of b[pktfPattern:]
	pktfPattern = EthHeaderLen + 10 // pattern from here on
)

func pktFrame(b []byte, dst, src net.HardwareAddr, et uint16, seq uint32, size int) []byte {
	b = b[:size]
	copy(b[0:6], dst)
	copy(b[6:12], src)
	binary.BigEndian.PutUint16(b[12:14], et)
	binary.BigEndian.PutUint32(b[pktfSeq:], seq)
	binary.BigEndian.PutUint16(b[pktfLen:], uint16(size))
	x := seq*2654435761 | 1
	for i := pktfPattern; i < size; i++ {
		x ^= x << 13
		x ^= x >> 17
		x ^= x << 5
		b[i] = byte(x)
	}
	binary.BigEndian.PutUint32(b[pktfSum:], crc32.ChecksumIEEE(b[pktfPattern:size]))
	return b
}

func pktParse(b []byte, et uint16) (uint32, error) {
	switch {
	case len(b) < pktfPattern:
		return 0, fmt.Errorf("runt frame of %d bytes", len(b))
	case binary.BigEndian.Uint16(b[12:14]) != et:
		return 0, fmt.Errorf("EtherType %#04x", binary.BigEndian.Uint16(b[12:14]))
	case int(binary.BigEndian.Uint16(b[pktfLen:])) != len(b):
		return 0, fmt.Errorf("length %d, sent %d", len(b), binary.BigEndian.Uint16(b[pktfLen:]))
	case binary.BigEndian.Uint32(b[pktfSum:]) != crc32.ChecksumIEEE(b[pktfPattern:]):
		return 0, errors.New("checksum mismatch")
	}
	return binary.BigEndian.Uint32(b[pktfSeq:]), nil
}

func pktBufs(n, size int) ([][]byte, []int) {
	b := make([][]byte, n)
	for i := range b {
		b[i] = make([]byte, size)
	}
	return b, make([]int, n)
}

func TestMmsghdrLayout(t *testing.T) {
	ptr := unsafe.Sizeof(uintptr(0))
	want := (unsafe.Sizeof(unix.Msghdr{}) + 4 + ptr - 1) &^ (ptr - 1)
	if got := unsafe.Sizeof(mmsghdr{}); got != want {
		t.Fatalf("sizeof(mmsghdr) = %d, want %d", got, want)
	}
	if got := unsafe.Offsetof(mmsghdr{}.Len); got != unsafe.Sizeof(unix.Msghdr{}) {
		t.Fatalf("offsetof(msg_len) = %d", got)
	}
	if htons(0x88B5) != binary.NativeEndian.Uint16([]byte{0x88, 0xB5}) {
		t.Fatalf("htons(0x88B5) = %#x", htons(0x88B5))
	}
}

func TestAFPacketOpenErrors(t *testing.T) {
	if _, err := OpenAFPacket(AFPacketConfig{}); err == nil {
		t.Error("OpenAFPacket without an interface succeeded")
	}
	_, err := OpenAFPacket(AFPacketConfig{Interface: "xpkt-none0"})
	var oe *OpError
	if !errors.As(err, &oe) || oe.Interface != "xpkt-none0" {
		t.Errorf("OpenAFPacket on a missing interface = %v, want an *OpError naming it", err)
	}
	if _, err := OpenAFPacket(AFPacketConfig{Interface: "lo", Batch: -1}); err == nil {
		t.Error("OpenAFPacket with a negative batch succeeded")
	}
	// Loopback has no hardware address: nothing could be sent to it.
	if _, err := OpenAFPacket(AFPacketConfig{Interface: "lo"}); !errors.Is(err, ErrNotEthernet) || !errors.As(err, &oe) || oe.Interface != "lo" {
		t.Errorf("OpenAFPacket on lo = %v, want ErrNotEthernet naming it", err)
	}
	if _, err := OpenAFXDP(AFXDPConfig{Interface: "lo"}); !errors.Is(err, ErrNotEthernet) {
		t.Errorf("OpenAFXDP on lo = %v, want ErrNotEthernet", err)
	}
}

// TestAFPacketOpenWhileDown opens a link on an interface that is down
// (bind leaves ENETDOWN as the socket's pending error, which the open's
// drain reads): the open succeeds, and frames flow once it is up.
func TestAFPacketOpenWhileDown(t *testing.T) {
	lab := newPktLab(t)
	if err := pktIP("-n", lab.nsA, "link", "set", "eth0", "down"); err != nil {
		t.Fatal(err)
	}
	a := lab.open(t, lab.nsA, AFPacketConfig{})
	b := lab.open(t, lab.nsB, AFPacketConfig{})
	if err := pktIP("-n", lab.nsA, "link", "set", "eth0", "up"); err != nil {
		t.Fatal(err)
	}
	lab.waitUp(t, lab.nsA)
	lab.waitUp(t, lab.nsB)
	bufs, sizes := pktBufs(4, 2048)
	for _, c := range []struct{ from, to *AFPacketLink }{{a, b}, {b, a}} {
		f := pktFrame(make([]byte, 100), c.to.HardwareAddr(), c.from.HardwareAddr(), DefaultEtherType, 0, 100)
		if _, err := c.from.Send([][]byte{f}); err != nil {
			t.Fatalf("Send once up = %v", err)
		}
		k, err := c.to.Recv(bufs, sizes, time.Second)
		for err != nil && errors.Is(err, unix.ENETDOWN) { // reported once, if the open did not read it
			k, err = c.to.Recv(bufs, sizes, time.Second)
		}
		if k != 1 || err != nil {
			t.Fatalf("Recv once up = %d, %v", k, err)
		}
	}
}

func TestAFPacketInfo(t *testing.T) {
	lab := newPktLab(t)
	a, b := lab.pair(t, AFPacketConfig{}, AFPacketConfig{NoQdiscBypass: true, Spin: true, Batch: 5000})
	for _, c := range []struct {
		l    *AFPacketLink
		mode string
	}{{a, "qdisc-bypass poll"}, {b, "qdisc spin"}} {
		info := c.l.Info()
		if info.Kind != "afpacket" || info.Interface != "eth0" || info.Queue != -1 || info.Mode != c.mode {
			t.Errorf("Info() = %+v, want afpacket on eth0, queue -1, mode %q", info, c.mode)
		}
		if len(c.l.HardwareAddr()) != 6 || c.l.MTU() != 1500 || MaxFrameLen(c.l) != 1514 {
			t.Errorf("HardwareAddr %v, MTU %d", c.l.HardwareAddr(), c.l.MTU())
		}
		// The kernel holds the six-instruction EtherType filter: with
		// optlen 0, SO_GET_FILTER stores the program length in optlen.
		var optlen uint32
		if _, _, e := unix.Syscall6(unix.SYS_GETSOCKOPT, uintptr(c.l.fd), unix.SOL_SOCKET,
			unix.SO_GET_FILTER, 0, uintptr(unsafe.Pointer(&optlen)), 0); e != 0 || optlen != uint32(len(etherTypeFilter(0, 0))) {
			t.Errorf("SO_GET_FILTER: %v, %d instructions, want %d", e, optlen, len(etherTypeFilter(0, 0)))
		}
	}
	if bytes.Equal(a.HardwareAddr(), b.HardwareAddr()) {
		t.Errorf("both ends have address %v", a.HardwareAddr())
	}
	if b.batch != afpacketMaxBatch {
		t.Errorf("batch %d, want clamped to %d", b.batch, afpacketMaxBatch)
	}
	hw := a.HardwareAddr()
	hw[0] ^= 0xff
	if bytes.Equal(hw, a.HardwareAddr()) {
		t.Error("HardwareAddr returns the link's own slice")
	}
}

// TestAFPacketStream sends 10000 frames of every size from 60 to 1514 bytes
// from A to B at full rate and checks what B receives.
func TestAFPacketStream(t *testing.T) {
	for _, c := range []struct {
		name string
		cfg  AFPacketConfig
	}{
		{"bypass-poll", AFPacketConfig{}},
		{"qdisc-spin", AFPacketConfig{NoQdiscBypass: true, Spin: true, Batch: 16}},
	} {
		t.Run(c.name, func(t *testing.T) {
			lab := newPktLab(t)
			a, b := lab.pair(t, c.cfg, c.cfg)
			pktStream(t, a, b, 10000)
		})
	}
}

func pktStream(t *testing.T, a, b *AFPacketLink, n int) {
	t.Helper()
	maxLen := MaxFrameLen(a)
	sizeOf := func(seq int) int { return MinFrameLen + seq%(maxLen-MinFrameLen+1) }
	dst, src := b.HardwareAddr(), a.HardwareAddr()

	start := time.Now()
	sendErr := make(chan error, 1)
	go func() {
		const batch = 32
		store, _ := pktBufs(batch, maxLen)
		frames := make([][]byte, batch)
		for seq := 0; seq < n; {
			k := min(batch, n-seq)
			for i := range k {
				frames[i] = pktFrame(store[i], dst, src, DefaultEtherType, uint32(seq+i), sizeOf(seq+i))
			}
			m, err := a.Send(frames[:k])
			seq += m
			if err != nil {
				sendErr <- fmt.Errorf("send at %d: %w", seq, err)
				return
			}
		}
		sendErr <- nil
	}()

	seen := make([]bool, n)
	got, dups, reordered, corrupt := 0, 0, 0, 0
	last := -1
	var sendDone bool
	var idle time.Time
	bufs, sizes := pktBufs(64, maxLen+100)
	for got < n {
		k, err := b.Recv(bufs, sizes, 20*time.Millisecond)
		if err != nil {
			t.Fatalf("recv: %v", err)
		}
		if !sendDone {
			select {
			case err := <-sendErr:
				if err != nil {
					t.Fatal(err)
				}
				sendDone = true
			default:
			}
		}
		if k == 0 {
			if sendDone {
				if idle.IsZero() {
					idle = time.Now()
				} else if time.Since(idle) > 500*time.Millisecond {
					break
				}
			}
			continue
		}
		idle = time.Time{}
		for i := range k {
			seq, err := pktParse(bufs[i][:sizes[i]], DefaultEtherType)
			if err == nil && (int(seq) >= n || sizes[i] != sizeOf(int(seq))) {
				err = fmt.Errorf("sequence number %d with %d bytes", seq, sizes[i])
			}
			if err != nil {
				if corrupt == 0 {
					t.Errorf("corrupt frame: %v", err)
				}
				corrupt++
				continue
			}
			if seen[seq] {
				dups++
				continue
			}
			seen[seq] = true
			got++
			if int(seq) < last {
				reordered++
			}
			last = int(seq)
		}
	}
	elapsed := time.Since(start)
	if !sendDone {
		if err := <-sendErr; err != nil {
			t.Fatal(err)
		}
	}
	sa, sb := a.Stats(), b.Stats()
	missing := n - got
	t.Logf("%s: %d frames in %v (%.0f frames/s): missing %d, B dropped %d, duplicates %d, reordered %d, corrupt %d; A %+v",
		a.Info().Mode, n, elapsed.Round(time.Millisecond), float64(got)/elapsed.Seconds(),
		missing, sb.RxDropped, dups, reordered, corrupt, sa)
	if dups > 0 || corrupt > 0 || reordered > 0 {
		t.Errorf("%d duplicates, %d corrupt, %d reordered", dups, corrupt, reordered)
	}
	if uint64(missing) > sb.RxDropped+sa.TxErrors {
		t.Errorf("%d frames missing, only %d drops counted", missing, sb.RxDropped+sa.TxErrors)
	}
	if sa.TxFrames != uint64(n) || sa.TxErrors != 0 {
		t.Errorf("A counted %d frames sent, %d errors; want %d, 0", sa.TxFrames, sa.TxErrors, n)
	}
	if sb.RxFrames != uint64(got+dups+corrupt) {
		t.Errorf("B counted %d frames received, test saw %d", sb.RxFrames, got+dups+corrupt)
	}
	wantBytes := uint64(0)
	for seq := range n {
		wantBytes += uint64(sizeOf(seq))
	}
	if sa.TxBytes != wantBytes {
		t.Errorf("A counted %d bytes sent, want %d", sa.TxBytes, wantBytes)
	}
}

// TestAFPacketDropsCounted overflows a small receive buffer and checks that
// every frame is either received or counted in RxDropped, across several
// Stats calls (each resets the kernel's counters).
func TestAFPacketDropsCounted(t *testing.T) {
	lab := newPktLab(t)
	a, b := lab.pair(t, AFPacketConfig{}, AFPacketConfig{RcvBuf: 64 << 10})
	dst, src := b.HardwareAddr(), a.HardwareAddr()
	frames, _ := pktBufs(50, 1000)
	seq := uint32(0)
	const rounds, per = 4, 500
	for range rounds {
		for sent := 0; sent < per; sent += len(frames) {
			for i := range frames {
				frames[i] = pktFrame(frames[i][:cap(frames[i])], dst, src, DefaultEtherType, seq, 1000)
				seq++
			}
			if _, err := a.Send(frames); err != nil {
				t.Fatal(err)
			}
		}
		b.Stats() // read and reset the kernel counters
	}
	bufs, sizes := pktBufs(64, 2048)
	got := 0
	for {
		k, err := b.Recv(bufs, sizes, 200*time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		if k == 0 {
			break
		}
		got += k
	}
	st := b.Stats()
	t.Logf("sent %d, received %d, dropped %d", rounds*per, got, st.RxDropped)
	if st.RxDropped == 0 {
		t.Error("no drop counted although the receive buffer overflowed")
	}
	if uint64(got)+st.RxDropped != rounds*per {
		t.Errorf("received %d + dropped %d != sent %d", got, st.RxDropped, rounds*per)
	}
}

// TestAFPacketFiltersOtherEtherType sends frames of other EtherTypes with a
// second raw socket: B must see only its own EtherType.
func TestAFPacketFiltersOtherEtherType(t *testing.T) {
	lab := newPktLab(t)
	a, b := lab.pair(t, AFPacketConfig{}, AFPacketConfig{})
	raw := lab.rawSocket(t, lab.nsA, "eth0")
	dst, src := b.HardwareAddr(), a.HardwareAddr()
	buf := make([]byte, 200)
	want := 0
	for i := range 300 {
		et := uint16(0x88B6 + i%2) // other local experimental EtherTypes
		if i%30 == 0 {
			et = DefaultEtherType
			want++
		}
		if err := raw(pktFrame(buf, dst, src, et, uint32(i), 100+i%100)); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 5 {
		if _, err := a.Send([][]byte{pktFrame(buf, dst, src, DefaultEtherType, uint32(1000+i), 200)}); err != nil {
			t.Fatal(err)
		}
		want++
	}
	bufs, sizes := pktBufs(64, 2048)
	got := 0
	for {
		k, err := b.Recv(bufs, sizes, 300*time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		if k == 0 {
			break
		}
		for i := range k {
			if _, err := pktParse(bufs[i][:sizes[i]], DefaultEtherType); err != nil {
				t.Errorf("received a foreign frame: %v", err)
			}
		}
		got += k
	}
	if got != want {
		t.Errorf("received %d frames of EtherType %#04x, want %d", got, DefaultEtherType, want)
	}
}

// TestAFPacketOnlyBoundInterface floods the loopback interface of B's
// namespace with frames of the link's EtherType while links are opened on
// eth0: none of them may reach a link (bind, drop-all filter and drain).
func TestAFPacketOnlyBoundInterface(t *testing.T) {
	lab := newPktLab(t)
	raw := lab.rawSocket(t, lab.nsB, "lo")
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		f := pktFrame(make([]byte, 64), net.HardwareAddr{0, 0, 0, 0, 0, 0}, net.HardwareAddr{0, 0, 0, 0, 0, 0}, DefaultEtherType, 7, 64)
		for {
			select {
			case <-stop:
				return
			default:
			}
			for range 64 {
				raw(f)
			}
		}
	}()
	defer func() { close(stop); wg.Wait() }()
	bufs, sizes := pktBufs(64, 2048)
	for i := range 20 {
		l := lab.open(t, lab.nsB, AFPacketConfig{})
		n, err := l.Recv(bufs, sizes, 10*time.Millisecond)
		if err != nil || n != 0 {
			t.Fatalf("open %d: link on eth0 received %d frames (%v) sent on lo", i, n, err)
		}
		l.Close()
	}
}

func TestAFPacketRecvTimeout(t *testing.T) {
	lab := newPktLab(t)
	for _, spin := range []bool{false, true} {
		l := lab.open(t, lab.nsB, AFPacketConfig{Spin: spin})
		bufs, sizes := pktBufs(4, 2048)
		start := time.Now()
		if n, err := l.Recv(bufs, sizes, 0); n != 0 || err != nil || time.Since(start) > 100*time.Millisecond {
			t.Errorf("spin=%v: Recv(0) = %d, %v after %v", spin, n, err, time.Since(start))
		}
		start = time.Now()
		n, err := l.Recv(bufs, sizes, 50*time.Millisecond)
		if el := time.Since(start); n != 0 || err != nil || el < 50*time.Millisecond || el > 2*time.Second {
			t.Errorf("spin=%v: Recv(50ms) = %d, %v after %v", spin, n, err, el)
		}
		if n, err := l.Recv(nil, nil, -1); n != 0 || err != nil {
			t.Errorf("spin=%v: Recv without buffers = %d, %v", spin, n, err)
		}
	}
}

func TestAFPacketTruncation(t *testing.T) {
	lab := newPktLab(t)
	a, b := lab.pair(t, AFPacketConfig{}, AFPacketConfig{})
	f := pktFrame(make([]byte, 300), b.HardwareAddr(), a.HardwareAddr(), DefaultEtherType, 1, 300)
	g := pktFrame(make([]byte, 90), b.HardwareAddr(), a.HardwareAddr(), DefaultEtherType, 2, 90)
	if _, err := a.Send([][]byte{f, g}); err != nil {
		t.Fatal(err)
	}
	small := [][]byte{make([]byte, 100), make([]byte, 100)}
	sizes := []int{0, 0}
	got := 0
	for got < 2 {
		n, err := b.Recv(small[got:], sizes[got:], time.Second)
		if err != nil || n == 0 {
			t.Fatalf("Recv = %d, %v", n, err)
		}
		got += n
	}
	if sizes[0] != 100 || !bytes.Equal(small[0], f[:100]) {
		t.Errorf("truncated frame: %d bytes, want the first 100", sizes[0])
	}
	if sizes[1] != 90 || !bytes.Equal(small[1][:90], g) {
		t.Errorf("short frame: %d bytes, want 90", sizes[1])
	}
	st := b.Stats()
	if st.RxTruncated != 1 || st.RxFrames != 2 || st.RxBytes != 190 {
		t.Errorf("stats %+v, want 1 truncated, 2 frames, 190 bytes", st)
	}
}

func TestAFPacketFrameTooLong(t *testing.T) {
	lab := newPktLab(t)
	a, b := lab.pair(t, AFPacketConfig{}, AFPacketConfig{})
	dst, src := b.HardwareAddr(), a.HardwareAddr()
	maxLen := MaxFrameLen(a)
	long := pktFrame(make([]byte, maxLen+1), dst, src, DefaultEtherType, 1, maxLen+1)
	n, err := a.Send([][]byte{long})
	var oe *OpError
	if n != 0 || !errors.Is(err, ErrFrameTooLong) || !errors.As(err, &oe) || oe.Op != "send" || oe.Interface != "eth0" {
		t.Fatalf("Send(%d bytes) = %d, %v; want 0, ErrFrameTooLong", len(long), n, err)
	}
	if n, err := a.Send([][]byte{make([]byte, 13)}); n != 0 || !errors.Is(err, ErrFrameTooShort) {
		t.Fatalf("Send(13 bytes) = %d, %v; want 0, ErrFrameTooShort", n, err)
	}
	// The frames before a bad one go; the largest frame goes whole.
	full := pktFrame(make([]byte, maxLen), dst, src, DefaultEtherType, 2, maxLen)
	n, err = a.Send([][]byte{full, long, full})
	if n != 1 || !errors.Is(err, ErrFrameTooLong) {
		t.Fatalf("Send(ok, long, ok) = %d, %v; want 1, ErrFrameTooLong", n, err)
	}
	bufs, sizes := pktBufs(4, 2048)
	k, err := b.Recv(bufs, sizes, time.Second)
	if err != nil || k != 1 {
		t.Fatalf("Recv = %d, %v; want 1 frame", k, err)
	}
	if seq, err := pktParse(bufs[0][:sizes[0]], DefaultEtherType); err != nil || seq != 2 || sizes[0] != maxLen {
		t.Fatalf("received %d bytes, seq %d, %v", sizes[0], seq, err)
	}
	if k, _ := b.Recv(bufs, sizes, 50*time.Millisecond); k != 0 {
		t.Fatalf("received %d more frames", k)
	}
	if st := a.Stats(); st.TxFrames != 1 || st.TxErrors != 0 {
		t.Errorf("A stats %+v, want 1 frame sent, no error", st)
	}
}

func TestAFPacketCloseUnblocksRecv(t *testing.T) {
	for _, spin := range []bool{false, true} {
		t.Run(fmt.Sprintf("spin=%v", spin), func(t *testing.T) {
			lab := newPktLab(t)
			a, b := lab.pair(t, AFPacketConfig{}, AFPacketConfig{Spin: spin})
			errc := make(chan error, 1)
			go func() {
				bufs, sizes := pktBufs(4, 2048)
				_, err := b.Recv(bufs, sizes, -1)
				errc <- err
			}()
			time.Sleep(50 * time.Millisecond)
			start := time.Now()
			if err := b.Close(); err != nil {
				t.Fatalf("close: %v", err)
			}
			select {
			case err := <-errc:
				if !errors.Is(err, net.ErrClosed) {
					t.Fatalf("blocked Recv returned %v, want net.ErrClosed", err)
				}
				if el := time.Since(start); el > 500*time.Millisecond {
					t.Errorf("Recv took %v to return after Close", el)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("Recv still blocked 5 s after Close")
			}
			bufs, sizes := pktBufs(1, 2048)
			if _, err := b.Recv(bufs, sizes, 0); !errors.Is(err, net.ErrClosed) {
				t.Errorf("Recv after Close = %v", err)
			}
			f := pktFrame(make([]byte, 100), a.HardwareAddr(), b.HardwareAddr(), DefaultEtherType, 0, 100)
			if _, err := b.Send([][]byte{f}); !errors.Is(err, net.ErrClosed) {
				t.Errorf("Send after Close = %v", err)
			}
			if err := b.Close(); err != nil {
				t.Errorf("second Close = %v", err)
			}
			_ = b.Stats()
		})
	}
}

// TestAFPacketSendStall takes the peer down, so that every frame is refused
// with ENOBUFS: Send gives up with ErrTxStalled, and later Sends fail at
// once until a frame goes again (before, each waited the whole stall).
// Close wakes a stalled Send at once.
func TestAFPacketSendStall(t *testing.T) {
	lab := newPktLab(t)
	a, b := lab.pair(t, AFPacketConfig{}, AFPacketConfig{})
	f := pktFrame(make([]byte, 100), b.HardwareAddr(), a.HardwareAddr(), DefaultEtherType, 0, 100)
	peer := func(state string) {
		t.Helper()
		if err := pktIP("-n", lab.nsB, "link", "set", "eth0", state); err != nil {
			t.Fatal(err)
		}
	}
	stalled := func(what string, min, max time.Duration) {
		t.Helper()
		start := time.Now()
		n, err := a.Send([][]byte{f})
		el := time.Since(start)
		if n != 0 || !errors.Is(err, ErrTxStalled) || !errors.Is(err, unix.ENOBUFS) {
			t.Fatalf("%s: Send to a downed peer = %d, %v; want 0, ErrTxStalled", what, n, err)
		}
		if el < min || el > max {
			t.Errorf("%s: stalled Send returned after %v, want %v to %v", what, el, min, max)
		}
	}
	peer("down")
	stalled("first Send", afpacketSendStall, afpacketSendStall+time.Second)
	for i := range 3 {
		stalled(fmt.Sprintf("Send %d after the stall", i+2), 0, 100*time.Millisecond)
	}
	if st := a.Stats(); st.TxErrors != 4 || st.TxFrames != 0 {
		t.Errorf("stats %+v, want 4 errors", st)
	}

	// Back up: the next Send goes, and a new outage waits again.
	peer("up")
	lab.waitUp(t, lab.nsB)
	deadline := time.Now().Add(5 * time.Second)
	for {
		n, err := a.Send([][]byte{f})
		if err == nil && n == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Send after the peer came back = %d, %v", n, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	bufs, sizes := pktBufs(4, 2048)
	k, err := b.Recv(bufs, sizes, time.Second)
	if errors.Is(err, unix.ENETDOWN) { // once, after the interface was down
		k, err = b.Recv(bufs, sizes, time.Second)
	}
	if k < 1 || err != nil {
		t.Fatalf("Recv after the peer came back = %d, %v", k, err)
	}
	peer("down")
	errc := make(chan error, 1)
	go func() {
		_, err := a.Send([][]byte{f})
		errc <- err
	}()
	time.Sleep(100 * time.Millisecond)
	start := time.Now()
	a.Close()
	if err := <-errc; !errors.Is(err, net.ErrClosed) {
		t.Errorf("stalled Send returned %v after Close, want net.ErrClosed (it must have waited)", err)
	}
	if el := time.Since(start); el > 200*time.Millisecond {
		t.Errorf("Close took %v to wake a stalled Send", el)
	}
}

// TestAFPacketInterfaceErrors takes the interface down and then deletes it:
// the kernel's errors come back wrapped, and nothing panics.
func TestAFPacketInterfaceErrors(t *testing.T) {
	lab := newPktLab(t)
	a, b := lab.pair(t, AFPacketConfig{}, AFPacketConfig{})
	f := pktFrame(make([]byte, 100), b.HardwareAddr(), a.HardwareAddr(), DefaultEtherType, 0, 100)
	bufs, sizes := pktBufs(4, 2048)

	if err := pktIP("-n", lab.nsA, "link", "set", "eth0", "down"); err != nil {
		t.Fatal(err)
	}
	n, err := a.Send([][]byte{f})
	var oe *OpError
	if n != 0 || !errors.Is(err, unix.ENETDOWN) || !errors.As(err, &oe) || oe.Op != "send" || oe.Interface != "eth0" {
		t.Errorf("Send on a down interface = %d, %v; want 0, ENETDOWN in an OpError", n, err)
	}
	if st := a.Stats(); st.TxErrors != 1 {
		t.Errorf("TxErrors = %d, want 1", st.TxErrors)
	}
	// The socket reports ENETDOWN once to the receiver.
	if _, err := a.Recv(bufs, sizes, 0); err != nil && !errors.Is(err, unix.ENETDOWN) {
		t.Errorf("Recv on a down interface = %v", err)
	}
	if _, err := a.Recv(bufs, sizes, 10*time.Millisecond); err != nil {
		t.Errorf("second Recv on a down interface = %v", err)
	}

	// Back up, it works again.
	if err := pktIP("-n", lab.nsA, "link", "set", "eth0", "up"); err != nil {
		t.Fatal(err)
	}
	lab.waitUp(t, lab.nsA)
	if _, err := a.Send([][]byte{f}); err != nil {
		t.Fatalf("Send after the interface came back = %v", err)
	}
	if k, err := b.Recv(bufs, sizes, time.Second); k != 1 || err != nil {
		t.Fatalf("Recv after the interface came back = %d, %v", k, err)
	}

	// Deleted: ENXIO on send, and the interface is gone for good.
	if err := pktIP("-n", lab.nsA, "link", "del", "eth0"); err != nil {
		t.Fatal(err)
	}
	for _, l := range []*AFPacketLink{a, b} {
		if n, err := l.Send([][]byte{f}); n != 0 || !errors.Is(err, unix.ENXIO) || !errors.Is(err, ErrInterfaceGone) {
			t.Errorf("Send on a deleted interface = %d, %v; want ErrInterfaceGone (ENXIO)", n, err)
		}
		for range 2 {
			if _, err := l.Recv(bufs, sizes, 10*time.Millisecond); !errors.Is(err, ErrInterfaceGone) {
				t.Errorf("Recv on a deleted interface = %v, want ErrInterfaceGone", err)
			}
		}
		if err := l.Close(); err != nil {
			t.Errorf("Close = %v", err)
		}
	}
}

// pktRecvAll returns copies of the frames l receives in 300 ms.
func pktRecvAll(t *testing.T, l *AFPacketLink) [][]byte {
	t.Helper()
	bufs, sizes := pktBufs(8, 2048)
	var got [][]byte
	for deadline := time.Now().Add(300 * time.Millisecond); time.Now().Before(deadline); {
		n, err := l.Recv(bufs, sizes, 50*time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		for i := range n {
			got = append(got, bytes.Clone(bufs[i][:sizes[i]]))
		}
	}
	return got
}

// TestAFPacketDropsOtherVLAN sends b a frame of the stack's EtherType
// tagged with a VLAN b is not on, then an untagged one: the kernel strips
// the tag before the socket sees the frame, so only its mark (for another
// host) tells them apart, and the filter drops it as AF_XDP's steering
// leaves it to the kernel. b receives the untagged frame only.
func TestAFPacketDropsOtherVLAN(t *testing.T) {
	lab := newPktLab(t)
	_, b := lab.pair(t, AFPacketConfig{}, AFPacketConfig{})
	raw := lab.rawSocket(t, lab.nsA, "eth0")
	src := net.HardwareAddr{0x02, 0, 0, 0, 0, 0x99}
	tagged := make([]byte, 100)
	copy(tagged[0:6], b.HardwareAddr())
	copy(tagged[6:12], src)
	binary.BigEndian.PutUint16(tagged[12:], 0x8100)
	binary.BigEndian.PutUint16(tagged[14:], 42) // VID 42
	binary.BigEndian.PutUint16(tagged[16:], DefaultEtherType)
	copy(tagged[18:], "frame of VLAN 42")
	plain := pktFrame(make([]byte, 80), b.HardwareAddr(), src, DefaultEtherType, 7, 80)
	for _, f := range [][]byte{tagged, plain} {
		if err := raw(f); err != nil {
			t.Fatal(err)
		}
	}
	got := pktRecvAll(t, b)
	if len(got) != 1 || !bytes.Equal(got[0], plain) {
		for _, f := range got {
			t.Logf("received %d bytes: % x", len(f), f[:min(len(f), 32)])
		}
		t.Fatalf("received %d frames, want the untagged one only", len(got))
	}
}

// TestAFPacketDropsStackedDeviceFrames: frames for a macvlan stacked on
// the link's interface, which the kernel delivers to that macvlan, reach
// neither the link nor its counters; frames for the interface do.
func TestAFPacketDropsStackedDeviceFrames(t *testing.T) {
	lab := newPktLab(t)
	mvMAC := net.HardwareAddr{0x02, 0x78, 0x6d, 0xee, 0, 0x01}
	for _, s := range [][]string{
		{"-n", lab.nsB, "link", "add", "link", "eth0", "name", "mv0", "address", mvMAC.String(), "type", "macvlan", "mode", "bridge"},
		{"-n", lab.nsB, "link", "set", "mv0", "up"},
	} {
		if err := pktIP(s...); err != nil {
			t.Skipf("no macvlan here: %v", err)
		}
	}
	_, b := lab.pair(t, AFPacketConfig{}, AFPacketConfig{})
	raw := lab.rawSocket(t, lab.nsA, "eth0")
	src := net.HardwareAddr{0x02, 0, 0, 0, 0, 0x99}
	var want [][]byte
	for i := range 20 {
		dst := mvMAC
		if i%5 == 0 {
			dst = b.HardwareAddr()
		}
		f := pktFrame(make([]byte, 80), dst, src, DefaultEtherType, uint32(i), 80)
		if i%5 == 0 {
			want = append(want, f)
		}
		if err := raw(f); err != nil {
			t.Fatal(err)
		}
	}
	got := pktRecvAll(t, b)
	if !slices.EqualFunc(got, want, bytes.Equal) {
		for _, f := range got {
			t.Logf("received %d bytes to %v", len(f), net.HardwareAddr(f[:6]))
		}
		t.Fatalf("received %d frames, want the %d to eth0's MAC only", len(got), len(want))
	}
	if st := b.Stats(); st.RxFrames != uint64(len(want)) {
		t.Errorf("Stats.RxFrames = %d, want %d: the macvlan's frames were counted", st.RxFrames, len(want))
	}
}

// TestAFPacketInterfaceGoneWaits deletes the interface under two waiting
// receives: one that sleeps through the deletion (the kernel's ENETDOWN,
// said as the interface goes down on its way out, wakes it once) and one
// that starts after another call took that error (nothing wakes it: the
// link's own look ends it within goneCheck). Waits that follow end with
// ErrInterfaceGone.
func TestAFPacketInterfaceGoneWaits(t *testing.T) {
	lab := newPktLab(t)
	a, b := lab.pair(t, AFPacketConfig{}, AFPacketConfig{})
	ended := make(chan error, 1)
	wait := func(l *AFPacketLink) {
		go func() {
			bufs, sizes := pktBufs(4, 2048)
			_, err := l.Recv(bufs, sizes, -1)
			ended <- err
		}()
	}
	wait(a)
	time.Sleep(50 * time.Millisecond) // let it sleep in the kernel
	if err := pktIP("-n", lab.nsA, "link", "del", "eth0"); err != nil {
		t.Fatal(err)
	}
	for i := 0; ; i++ {
		select {
		case err := <-ended:
			var oe *OpError
			if i == 0 && errors.Is(err, unix.ENETDOWN) && !errors.Is(err, ErrInterfaceGone) {
				wait(a) // woken as it went down; it is gone by now
				continue
			}
			if !errors.Is(err, ErrInterfaceGone) || !errors.As(err, &oe) || oe.Op != "recv" || oe.Interface != "eth0" {
				t.Fatalf("waiting Recv ended with %v; want ErrInterfaceGone from recv on eth0", err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("waiting Recv still waiting 5 s after its interface was deleted")
		}
		break
	}

	// b's pending ENETDOWN is taken by a raw read, as another reader of
	// the socket would: no error is left to wake b's wait.
	var one [1]byte
	unix.Recvfrom(b.fd, one[:], unix.MSG_DONTWAIT)
	wait(b)
	select {
	case err := <-ended:
		if !errors.Is(err, ErrInterfaceGone) {
			t.Fatalf("Recv started after the deletion ended with %v; want ErrInterfaceGone", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Recv started after the deletion still waiting after 5 s")
	}
	if n, err := b.Send([][]byte{make([]byte, 60)}); n != 0 || !errors.Is(err, ErrInterfaceGone) {
		t.Errorf("Send after = %d, %v; want 0, ErrInterfaceGone", n, err)
	}
}

// closeAtFirst builds frames for SendBuilt and SendTails; building the
// first, it starts Close on its link and waits until Close has begun (it
// then waits for the send to end).
type closeAtFirst struct {
	l        *AFPacketLink
	dst, src net.HardwareAddr
	closed   chan error
}

func (c *closeAtFirst) Build(i int, buf []byte) int {
	if i == 0 {
		go func() { c.closed <- c.l.Close() }()
		for !c.l.closed.Load() {
			time.Sleep(time.Millisecond)
		}
	}
	return len(pktFrame(buf, c.dst, c.src, DefaultEtherType, uint32(i), 100))
}

func (c *closeAtFirst) Tail(i int, head []byte) (int, []byte) { return c.Build(i, head), nil }

// TestAFPacketSendStopsAtClose: a long SendBuilt or SendTails that Close
// begins under stops at the end of the batch it was building, rather than
// send every frame first while Close waits.
func TestAFPacketSendStopsAtClose(t *testing.T) {
	lab := newPktLab(t)
	const batch, n = 8, 200
	for _, how := range []string{"SendBuilt", "SendTails"} {
		t.Run(how, func(t *testing.T) {
			a, b := lab.pair(t, AFPacketConfig{Batch: batch}, AFPacketConfig{})
			c := &closeAtFirst{l: a, dst: b.HardwareAddr(), src: a.HardwareAddr(), closed: make(chan error, 1)}
			var sent int
			var err error
			if how == "SendBuilt" {
				sent, err = a.SendBuilt(n, c)
			} else {
				sent, err = a.SendTails(n, c)
			}
			if sent != batch || !errors.Is(err, net.ErrClosed) {
				t.Errorf("%s of %d frames, Close begun at the first: %d, %v; want %d (one batch), net.ErrClosed", how, n, sent, err, batch)
			}
			if err := <-c.closed; err != nil {
				t.Errorf("Close: %v", err)
			}
		})
	}
}

// TestAFPacketConcurrentClose closes links while goroutines send and
// receive on them: every call ends with net.ErrClosed, nothing races.
func TestAFPacketConcurrentClose(t *testing.T) {
	lab := newPktLab(t)
	for round := range 5 {
		spin := round%2 == 1
		a, b := lab.pair(t, AFPacketConfig{Spin: spin}, AFPacketConfig{Spin: spin})
		var wg sync.WaitGroup
		errs := make(chan error, 8)
		for _, l := range []*AFPacketLink{a, b} {
			peer := a.HardwareAddr()
			if l == a {
				peer = b.HardwareAddr()
			}
			f := pktFrame(make([]byte, 500), peer, l.HardwareAddr(), DefaultEtherType, 0, 500)
			wg.Add(3)
			go func() {
				defer wg.Done()
				frames := [][]byte{f, f, f, f}
				for {
					if _, err := l.Send(frames); err != nil {
						errs <- err
						return
					}
				}
			}()
			for _, timeout := range []time.Duration{-1, time.Millisecond} {
				go func() {
					defer wg.Done()
					bufs, sizes := pktBufs(8, 2048)
					for {
						if _, err := l.Recv(bufs, sizes, timeout); err != nil {
							errs <- err
							return
						}
					}
				}()
			}
		}
		time.Sleep(30 * time.Millisecond)
		var cw sync.WaitGroup
		for _, l := range []*AFPacketLink{a, b, a, b} {
			cw.Go(func() { l.Stats(); l.Close(); l.Stats() })
		}
		cw.Wait()
		wg.Wait()
		close(errs)
		for err := range errs {
			if !errors.Is(err, net.ErrClosed) {
				t.Errorf("call ended with %v, want net.ErrClosed", err)
			}
		}
	}
}

func pktCountFDs(tb testing.TB) int {
	d, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		tb.Fatal(err)
	}
	return len(d)
}

func TestAFPacketNoLeak(t *testing.T) {
	lab := newPktLab(t)
	cycle := func() {
		a, b := lab.pair(t, AFPacketConfig{}, AFPacketConfig{})
		f := pktFrame(make([]byte, 200), b.HardwareAddr(), a.HardwareAddr(), DefaultEtherType, 0, 200)
		if _, err := a.Send([][]byte{f, f, f}); err != nil {
			t.Fatal(err)
		}
		done := make(chan struct{})
		go func() {
			defer close(done)
			bufs, sizes := pktBufs(4, 2048)
			for {
				if _, err := b.Recv(bufs, sizes, -1); err != nil {
					return
				}
			}
		}()
		time.Sleep(5 * time.Millisecond)
		a.Close()
		b.Close()
		<-done
	}
	cycle() // warm up process-wide state
	g0, fd0 := runtime.NumGoroutine(), pktCountFDs(t)
	for range 10 {
		cycle()
	}
	deadline := time.Now().Add(3 * time.Second)
	for {
		g, fd := runtime.NumGoroutine(), pktCountFDs(t)
		if g <= g0 && fd <= fd0 {
			t.Logf("goroutines %d → %d, fds %d → %d", g0, g, fd0, fd)
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("leak: goroutines %d → %d, fds %d → %d", g0, g, fd0, fd)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestAFPacketZeroAlloc(t *testing.T) {
	lab := newPktLab(t)
	for _, spin := range []bool{false, true} {
		a, b := lab.pair(t, AFPacketConfig{Spin: spin}, AFPacketConfig{Spin: spin})
		const batch = 8
		store, _ := pktBufs(batch, 600)
		frames := make([][]byte, batch)
		for i := range frames {
			frames[i] = pktFrame(store[i], b.HardwareAddr(), a.HardwareAddr(), DefaultEtherType, uint32(i), 100+50*i)
		}
		bufs, sizes := pktBufs(64, 2048)
		var failed error
		roundTrip := func() {
			if n, err := a.Send(frames); n != batch || err != nil {
				failed = err
				return
			}
			for got := 0; got < batch; {
				k, err := b.Recv(bufs, sizes, time.Second)
				if err != nil || k == 0 {
					failed = err
					return
				}
				got += k
			}
			// Polls of an empty socket, blocking and not.
			b.Recv(bufs, sizes, 0)
		}
		roundTrip()
		allocs := testing.AllocsPerRun(200, roundTrip)
		if failed != nil {
			t.Fatalf("spin=%v: round trip failed: %v", spin, failed)
		}
		if allocs != 0 {
			t.Errorf("spin=%v: %v allocations per Send+Recv batch, want 0", spin, allocs)
		}
		idle := testing.AllocsPerRun(20, func() { b.Recv(bufs, sizes, 100*time.Microsecond) })
		if idle != 0 {
			t.Errorf("spin=%v: %v allocations per timed-out Recv, want 0", spin, idle)
		}
		a.Close()
		b.Close()
	}
}

// BenchmarkAFPacketPingPong measures 64-byte round trips from A to an echo
// on B and back, reporting the median and 99th percentile.
func BenchmarkAFPacketPingPong(bm *testing.B) {
	for _, spin := range []bool{false, true} {
		name := "poll"
		if spin {
			name = "spin"
		}
		bm.Run(name, func(bm *testing.B) {
			lab := newPktLab(bm)
			cfg := AFPacketConfig{Spin: spin}
			a, b := lab.pair(bm, cfg, cfg)
			echoDone := make(chan struct{})
			go func() {
				defer close(echoDone)
				bufs, sizes := pktBufs(8, 2048)
				out := make([][]byte, 8)
				for {
					n, err := b.Recv(bufs, sizes, -1)
					if err != nil {
						return
					}
					for i := range n {
						f := bufs[i][:sizes[i]]
						var mac [6]byte
						copy(mac[:], f[0:6])
						copy(f[0:6], f[6:12])
						copy(f[6:12], mac[:])
						out[i] = f
					}
					if _, err := b.Send(out[:n]); err != nil {
						return
					}
				}
			}()
			ping := [][]byte{pktFrame(make([]byte, 64), b.HardwareAddr(), a.HardwareAddr(), DefaultEtherType, 0, 64)}
			bufs, sizes := pktBufs(8, 2048)
			rtt := func() time.Duration {
				t0 := time.Now()
				if _, err := a.Send(ping); err != nil {
					bm.Fatal(err)
				}
				for {
					n, err := a.Recv(bufs, sizes, time.Second)
					if err != nil {
						bm.Fatal(err)
					}
					if n == 0 {
						bm.Fatal("echo lost")
					}
					if sizes[0] == 64 {
						return time.Since(t0)
					}
				}
			}
			for range 100 {
				rtt()
			}
			lat := make([]time.Duration, 0, bm.N)
			bm.ResetTimer()
			for range bm.N {
				lat = append(lat, rtt())
			}
			bm.StopTimer()
			a.Close()
			b.Close()
			<-echoDone
			slices.Sort(lat)
			bm.ReportMetric(float64(lat[len(lat)/2].Nanoseconds()), "p50-ns")
			bm.ReportMetric(float64(lat[len(lat)*99/100].Nanoseconds()), "p99-ns")
		})
	}
}
