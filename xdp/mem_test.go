package xdp

import (
	"bytes"
	"encoding/binary"
	"errors"
	"net"
	"runtime"
	"sync"
	"testing"
	"time"
)

var memBroadcast = [6]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}

// memFrameTo builds a frame of length n to dst from src carrying seq in
// bytes 14..21.
func memFrameTo(dst, src net.HardwareAddr, seq uint64, n int) []byte {
	f := make([]byte, n)
	copy(f[0:6], dst)
	copy(f[6:12], src)
	binary.BigEndian.PutUint16(f[12:14], DefaultEtherType)
	binary.BigEndian.PutUint64(f[14:22], seq)
	return f
}

func memSeq(f []byte) uint64 { return binary.BigEndian.Uint64(f[14:22]) }

func memBufs(n, size int) ([][]byte, []int) {
	bufs := make([][]byte, n)
	for i := range bufs {
		bufs[i] = make([]byte, size)
	}
	return bufs, make([]int, n)
}

// memSendSeq sends frames numbered from first to first+count-1 from a to b,
// in batches of 64.
func memSendSeq(t testing.TB, a, b *MemLink, first, count int) {
	t.Helper()
	batch := make([][]byte, 0, 64)
	for i := first; i < first+count; i++ {
		batch = append(batch, memFrameTo(b.HardwareAddr(), a.HardwareAddr(), uint64(i), 64))
		if len(batch) == cap(batch) || i == first+count-1 {
			n, err := a.Send(batch)
			if err != nil || n != len(batch) {
				t.Fatalf("Send = %d, %v; want %d, nil", n, err, len(batch))
			}
			batch = batch[:0]
		}
	}
}

// memDrain receives until no frame arrives for quiet, and returns the
// sequence numbers received in order.
func memDrain(t testing.TB, l *MemLink, quiet time.Duration) []uint64 {
	t.Helper()
	bufs, sizes := memBufs(64, 2048)
	var seqs []uint64
	for {
		n, err := l.Recv(bufs, sizes, quiet)
		if err != nil {
			t.Fatalf("Recv: %v", err)
		}
		if n == 0 {
			return seqs
		}
		for i := range n {
			seqs = append(seqs, memSeq(bufs[i][:sizes[i]]))
		}
	}
}

func TestMemPairInOrder(t *testing.T) {
	a, b := NewPair(MemConfig{})
	defer a.Close()
	defer b.Close()

	if got, want := a.HardwareAddr().String(), "02:00:00:00:00:01"; got != want {
		t.Errorf("a MAC = %s, want %s", got, want)
	}
	if got, want := b.HardwareAddr().String(), "02:00:00:00:00:02"; got != want {
		t.Errorf("b MAC = %s, want %s", got, want)
	}
	if a.MTU() != 1500 || MaxFrameLen(a) != 1514 {
		t.Errorf("MTU = %d, MaxFrameLen = %d; want 1500, 1514", a.MTU(), MaxFrameLen(a))
	}
	info := b.Info()
	if info.Kind != "mem" || info.Interface != "mem1" || info.Queue != -1 || info.Mode != "ideal" {
		t.Errorf("Info = %+v", info)
	}

	// Send reuses one buffer: the link must have copied each frame.
	const count = 1000
	buf := memFrameTo(b.HardwareAddr(), a.HardwareAddr(), 0, 100)
	for i := range count {
		binary.BigEndian.PutUint64(buf[14:22], uint64(i))
		if n, err := a.Send([][]byte{buf}); n != 1 || err != nil {
			t.Fatalf("Send = %d, %v", n, err)
		}
	}
	seqs := memDrain(t, b, 0)
	if len(seqs) != count {
		t.Fatalf("received %d frames, want %d", len(seqs), count)
	}
	for i, s := range seqs {
		if s != uint64(i) {
			t.Fatalf("frame %d has seq %d", i, s)
		}
	}
	sa, sb := a.Stats(), b.Stats()
	if sa.TxFrames != count || sa.TxBytes != count*100 {
		t.Errorf("sender stats %+v", sa)
	}
	if sb.RxFrames != count || sb.RxBytes != count*100 || sb.Lost() != 0 {
		t.Errorf("receiver stats %+v", sb)
	}
	// Recv(0) on an empty queue polls.
	bufs, sizes := memBufs(4, 2048)
	if n, err := b.Recv(bufs, sizes, 0); n != 0 || err != nil {
		t.Errorf("Recv(0) on empty = %d, %v", n, err)
	}
	// A bounded Recv times out with 0, nil.
	start := time.Now()
	if n, err := b.Recv(bufs, sizes, 20*time.Millisecond); n != 0 || err != nil {
		t.Errorf("Recv(20ms) on empty = %d, %v", n, err)
	}
	if d := time.Since(start); d < 20*time.Millisecond {
		t.Errorf("Recv(20ms) returned after %v", d)
	}
}

func TestMemBlockingRecv(t *testing.T) {
	a, b := NewPair(MemConfig{})
	defer a.Close()
	defer b.Close()
	got := make(chan uint64)
	go func() {
		bufs, sizes := memBufs(1, 2048)
		n, err := b.Recv(bufs, sizes, -1)
		if err != nil || n != 1 {
			t.Errorf("Recv = %d, %v", n, err)
			close(got)
			return
		}
		got <- memSeq(bufs[0])
	}()
	time.Sleep(10 * time.Millisecond)
	if _, err := a.Send([][]byte{memFrameTo(b.HardwareAddr(), a.HardwareAddr(), 42, 60)}); err != nil {
		t.Fatal(err)
	}
	select {
	case s := <-got:
		if s != 42 {
			t.Errorf("seq = %d", s)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("blocked Recv not woken by Send")
	}
}

func TestMemMTU(t *testing.T) {
	a, b := NewPair(MemConfig{MTU: 100})
	defer a.Close()
	defer b.Close()
	if a.MTU() != 100 || MaxFrameLen(a) != 114 {
		t.Fatalf("MTU = %d", a.MTU())
	}
	dst, src := b.HardwareAddr(), a.HardwareAddr()
	frames := [][]byte{
		memFrameTo(dst, src, 0, 114),
		memFrameTo(dst, src, 1, 115),
		memFrameTo(dst, src, 2, 60),
	}
	n, err := a.Send(frames)
	if n != 1 || !errors.Is(err, ErrFrameTooLong) {
		t.Fatalf("Send = %d, %v; want 1, ErrFrameTooLong", n, err)
	}
	var oe *OpError
	if !errors.As(err, &oe) || oe.Op != "send" || oe.Interface != "mem0" {
		t.Errorf("error %#v, want *OpError{send, mem0}", err)
	}
	n, err = a.Send([][]byte{frames[0], make([]byte, EthHeaderLen-1)})
	if n != 1 || !errors.Is(err, ErrFrameTooShort) {
		t.Fatalf("Send = %d, %v; want 1, ErrFrameTooShort", n, err)
	}
	if got := len(memDrain(t, b, 0)); got != 2 {
		t.Errorf("received %d frames, want 2", got)
	}
	if s := a.Stats(); s.TxFrames != 2 {
		t.Errorf("TxFrames = %d, want 2", s.TxFrames)
	}
}

func TestMemLoss(t *testing.T) {
	const count, loss = 10000, 0.1
	a, b := NewPair(MemConfig{Loss: loss, QueueLen: count})
	defer a.Close()
	defer b.Close()
	if got, want := a.Info().Mode, "loss=10%"; got != want {
		t.Errorf("Mode = %q, want %q", got, want)
	}
	memSendSeq(t, a, b, 0, count)
	got := len(memDrain(t, b, 0))
	sa, sb := a.Stats(), b.Stats()
	if uint64(got)+sa.InjectedLoss != count {
		t.Errorf("received %d + InjectedLoss %d != sent %d", got, sa.InjectedLoss, count)
	}
	if sb.RxFrames != uint64(got) || sb.QueueDrops != 0 {
		t.Errorf("receiver stats %+v", sb)
	}
	if rate := float64(sa.InjectedLoss) / count; rate < 0.08 || rate > 0.12 {
		t.Errorf("loss rate %.3f, want about %.2f", rate, loss)
	}

	// The same seed gives the same losses.
	c, d := NewPair(MemConfig{Loss: loss, QueueLen: count})
	defer c.Close()
	defer d.Close()
	memSendSeq(t, c, d, 0, count)
	if got2 := len(memDrain(t, d, 0)); got2 != got {
		t.Errorf("same seed: received %d, then %d", got, got2)
	}
	e, f := NewPair(MemConfig{Loss: loss, QueueLen: count, Seed: 7})
	defer e.Close()
	defer f.Close()
	memSendSeq(t, e, f, 0, count)
	if got3 := len(memDrain(t, f, 0)); got3 == got {
		t.Logf("seed 7 lost as many frames as the default seed (%d); unlikely but possible", got3)
	}
}

func TestMemCutAndMend(t *testing.T) {
	a, b := NewPair(MemConfig{})
	defer a.Close()
	defer b.Close()
	a.Hub().SetConfig(MemConfig{Loss: 1})
	memSendSeq(t, a, b, 0, 10)
	if got := len(memDrain(t, b, 0)); got != 0 {
		t.Errorf("cut segment delivered %d frames", got)
	}
	a.Hub().SetConfig(MemConfig{})
	memSendSeq(t, a, b, 10, 10)
	if got := len(memDrain(t, b, 0)); got != 10 {
		t.Errorf("mended segment delivered %d frames, want 10", got)
	}

	b.Partition(true)
	memSendSeq(t, a, b, 20, 5)
	b.Partition(false)
	memSendSeq(t, a, b, 25, 5)
	seqs := memDrain(t, b, 0)
	if len(seqs) != 5 || seqs[0] != 25 {
		t.Errorf("after partition received %v, want 25..29", seqs)
	}
	if s := a.Stats(); s.InjectedLoss != 15 {
		t.Errorf("InjectedLoss = %d, want 15", s.InjectedLoss)
	}
}

func TestMemDuplicate(t *testing.T) {
	const count = 2000
	a, b := NewPair(MemConfig{Duplicate: 0.1, QueueLen: 2 * count})
	defer a.Close()
	defer b.Close()
	memSendSeq(t, a, b, 0, count)
	seqs := memDrain(t, b, 0)
	sa := a.Stats()
	if uint64(len(seqs)) != count+sa.InjectedDuplicate {
		t.Errorf("received %d, want sent %d + InjectedDuplicate %d", len(seqs), count, sa.InjectedDuplicate)
	}
	if sa.InjectedDuplicate < count/20 || sa.InjectedDuplicate > count*3/20 {
		t.Errorf("InjectedDuplicate = %d, want about %d", sa.InjectedDuplicate, count/10)
	}
	// Duplicates are adjacent, and every frame arrives.
	dups := 0
	seen := make(map[uint64]bool)
	for i, s := range seqs {
		if i > 0 && seqs[i-1] == s {
			dups++
		}
		seen[s] = true
	}
	if uint64(dups) != sa.InjectedDuplicate || len(seen) != count {
		t.Errorf("observed %d adjacent duplicates of %d distinct frames; want %d of %d",
			dups, len(seen), sa.InjectedDuplicate, count)
	}
}

func TestMemReorder(t *testing.T) {
	const count = 2000
	a, b := NewPair(MemConfig{Reorder: 0.1, QueueLen: count})
	defer a.Close()
	defer b.Close()
	// One Send for the whole run, so that each held frame is followed by the
	// next one well within the hold bound.
	frames := make([][]byte, count)
	for i := range frames {
		frames[i] = memFrameTo(b.HardwareAddr(), a.HardwareAddr(), uint64(i), 64)
	}
	if n, err := a.Send(frames); n != count || err != nil {
		t.Fatalf("Send = %d, %v", n, err)
	}
	// A frame held at the end of the batch comes out after the hold bound.
	time.Sleep(2 * memReorderHold)
	seqs := memDrain(t, b, 0)
	if len(seqs) != count {
		t.Fatalf("received %d frames, want %d", len(seqs), count)
	}
	// Count the frames that arrive after a later one.
	late := 0
	var highest uint64
	for i, s := range seqs {
		if i > 0 && s < highest {
			late++
		}
		highest = max(highest, s)
	}
	sa := a.Stats()
	if sa.InjectedReorder == 0 || uint64(late) != sa.InjectedReorder {
		t.Errorf("observed %d late frames, InjectedReorder = %d", late, sa.InjectedReorder)
	}
	if sa.InjectedReorder < count/20 || sa.InjectedReorder > count*3/20 {
		t.Errorf("InjectedReorder = %d, want about %d", sa.InjectedReorder, count/10)
	}
}

func TestMemReorderHoldBound(t *testing.T) {
	a, b := NewPair(MemConfig{Reorder: 1})
	defer a.Close()
	defer b.Close()
	// A lone frame is held, but not forever.
	memSendSeq(t, a, b, 0, 1)
	bufs, sizes := memBufs(1, 2048)
	start := time.Now()
	n, err := b.Recv(bufs, sizes, time.Second)
	if n != 1 || err != nil {
		t.Fatalf("Recv = %d, %v", n, err)
	}
	if d := time.Since(start); d > 500*time.Millisecond {
		t.Errorf("held frame delivered after %v", d)
	}
	if s := a.Stats(); s.InjectedReorder != 0 {
		t.Errorf("InjectedReorder = %d for a frame delivered in order", s.InjectedReorder)
	}
}

func TestMemDelay(t *testing.T) {
	const delay = 30 * time.Millisecond
	a, b := NewPair(MemConfig{Delay: delay, Jitter: 5 * time.Millisecond})
	defer a.Close()
	defer b.Close()
	start := time.Now()
	memSendSeq(t, a, b, 0, 10)
	bufs, sizes := memBufs(16, 2048)
	if n, err := b.Recv(bufs, sizes, 0); n != 0 || err != nil {
		t.Fatalf("Recv(0) before the delay = %d, %v", n, err)
	}
	if n, err := b.Recv(bufs, sizes, 5*time.Millisecond); n != 0 || err != nil {
		t.Fatalf("Recv(5ms) before the delay = %d, %v", n, err)
	}
	got := 0
	for got < 10 {
		n, err := b.Recv(bufs[got:], sizes[got:], time.Second)
		if err != nil || n == 0 {
			t.Fatalf("Recv = %d, %v after %d frames", n, err, got)
		}
		if got == 0 {
			if d := time.Since(start); d < delay {
				t.Errorf("first frame after %v, want >= %v", d, delay)
			}
		}
		got += n
	}
}

func TestMemQueueOverflow(t *testing.T) {
	a, b := NewPair(MemConfig{QueueLen: 8})
	defer a.Close()
	defer b.Close()
	memSendSeq(t, a, b, 0, 20)
	seqs := memDrain(t, b, 0)
	if len(seqs) != 8 || seqs[7] != 7 {
		t.Errorf("received %v, want 0..7", seqs)
	}
	if s := b.Stats(); s.QueueDrops != 12 || s.Lost() != 12 {
		t.Errorf("receiver QueueDrops = %d, Lost = %d; want 12", s.QueueDrops, s.Lost())
	}
	if s := a.Stats(); s.TxFrames != 20 || s.QueueDrops != 0 {
		t.Errorf("sender stats %+v", s)
	}
}

func TestMemTruncation(t *testing.T) {
	a, b := NewPair(MemConfig{})
	defer a.Close()
	defer b.Close()
	f := memFrameTo(b.HardwareAddr(), a.HardwareAddr(), 9, 100)
	if _, err := a.Send([][]byte{f, f}); err != nil {
		t.Fatal(err)
	}
	bufs := [][]byte{make([]byte, 30), make([]byte, 100)}
	sizes := make([]int, 2)
	n, err := b.Recv(bufs, sizes, 0)
	if n != 2 || err != nil {
		t.Fatalf("Recv = %d, %v", n, err)
	}
	if sizes[0] != 30 || sizes[1] != 100 || string(bufs[0]) != string(f[:30]) {
		t.Errorf("sizes = %v", sizes)
	}
	if s := b.Stats(); s.RxTruncated != 1 || s.RxBytes != 130 {
		t.Errorf("RxTruncated = %d, RxBytes = %d; want 1, 130", s.RxTruncated, s.RxBytes)
	}
}

func TestMemHubBroadcast(t *testing.T) {
	h := NewHub(MemConfig{})
	l := []*MemLink{h.Attach(), h.Attach(), h.Attach()}
	for _, x := range l {
		defer x.Close()
	}
	if got := l[2].HardwareAddr().String(); got != "02:00:00:00:00:03" {
		t.Errorf("third MAC = %s", got)
	}
	src := l[0].HardwareAddr()
	frames := [][]byte{
		memFrameTo(memBroadcast[:], src, 1, 60),
		memFrameTo(net.HardwareAddr{0x33, 0x33, 0, 0, 0, 1}, src, 2, 60), // multicast
		memFrameTo(l[2].HardwareAddr(), src, 3, 60),                      // unicast to 2
		memFrameTo(net.HardwareAddr{2, 0, 0, 0, 0, 99}, src, 4, 60),      // unknown unicast
		memFrameTo(src, src, 5, 60),                                      // to itself
	}
	if n, err := l[0].Send(frames); n != len(frames) || err != nil {
		t.Fatalf("Send = %d, %v", n, err)
	}
	want := [][]uint64{nil, {1, 2}, {1, 2, 3}}
	for i, x := range l {
		got := memDrain(t, x, 0)
		if len(got) != len(want[i]) {
			t.Errorf("link %d received %v, want %v", i, got, want[i])
			continue
		}
		for j := range got {
			if got[j] != want[i][j] {
				t.Errorf("link %d received %v, want %v", i, got, want[i])
				break
			}
		}
	}
}

func TestMemClose(t *testing.T) {
	a, b := NewPair(MemConfig{})
	defer a.Close()
	errc := make(chan error, 1)
	go func() {
		bufs, sizes := memBufs(1, 2048)
		_, err := b.Recv(bufs, sizes, -1)
		errc <- err
	}()
	time.Sleep(20 * time.Millisecond)
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-errc:
		if !errors.Is(err, net.ErrClosed) {
			t.Errorf("blocked Recv returned %v, want net.ErrClosed", err)
		}
		var oe *OpError
		if !errors.As(err, &oe) || oe.Op != "recv" {
			t.Errorf("blocked Recv returned %#v, want *OpError{Op: recv}", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not unblock Recv")
	}
	if err := b.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	bufs, sizes := memBufs(1, 2048)
	if _, err := b.Recv(bufs, sizes, 0); !errors.Is(err, net.ErrClosed) {
		t.Errorf("Recv after Close: %v", err)
	}
	f := memFrameTo(a.HardwareAddr(), b.HardwareAddr(), 0, 60)
	if n, err := b.Send([][]byte{f}); n != 0 || !errors.Is(err, net.ErrClosed) {
		t.Errorf("Send after Close = %d, %v", n, err)
	}
	// The other end still works; frames to the closed end vanish.
	g := memFrameTo(b.HardwareAddr(), a.HardwareAddr(), 0, 60)
	if n, err := a.Send([][]byte{g}); n != 1 || err != nil {
		t.Errorf("Send to closed peer = %d, %v", n, err)
	}
	if n, err := a.Recv(bufs, sizes, 0); n != 0 || err != nil {
		t.Errorf("Recv on open end = %d, %v", n, err)
	}
}

func TestMemNoGoroutineLeak(t *testing.T) {
	before := runtime.NumGoroutine()
	h := NewHub(MemConfig{Delay: time.Millisecond})
	links := []*MemLink{h.Attach(), h.Attach(), h.Attach()}
	var wg sync.WaitGroup
	for _, l := range links {
		wg.Add(1)
		go func() {
			defer wg.Done()
			bufs, sizes := memBufs(8, 2048)
			for {
				if _, err := l.Recv(bufs, sizes, 50*time.Millisecond); err != nil {
					return
				}
			}
		}()
	}
	f := memFrameTo(memBroadcast[:], links[0].HardwareAddr(), 0, 60)
	for range 100 {
		if _, err := links[0].Send([][]byte{f}); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(10 * time.Millisecond)
	for _, l := range links {
		l.Close()
	}
	wg.Wait()
	deadline := time.Now().Add(2 * time.Second)
	for runtime.NumGoroutine() > before && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if after := runtime.NumGoroutine(); after > before {
		t.Errorf("goroutines: %d before, %d after", before, after)
	}
}

// TestMemHubConcurrent has every link of a hub send to every other link
// while all of them receive, under -race.
func TestMemHubConcurrent(t *testing.T) {
	const ports, perPeer = 4, 500
	h := NewHub(MemConfig{Loss: 0.05, Duplicate: 0.05, Reorder: 0.05, Jitter: 100 * time.Microsecond})
	links := make([]*MemLink, ports)
	for i := range links {
		links[i] = h.Attach()
	}
	var recvWG, sendWG sync.WaitGroup
	received := make([]int, ports)
	for i, l := range links {
		recvWG.Add(1)
		go func() {
			defer recvWG.Done()
			bufs, sizes := memBufs(16, 2048)
			for {
				n, err := l.Recv(bufs, sizes, -1)
				if err != nil {
					return
				}
				received[i] += n
			}
		}()
	}
	for _, l := range links {
		sendWG.Add(1)
		go func() {
			defer sendWG.Done()
			batch := make([][]byte, 0, ports-1)
			for s := range perPeer {
				batch = batch[:0]
				for _, peer := range links {
					if peer != l {
						batch = append(batch, memFrameTo(peer.HardwareAddr(), l.HardwareAddr(), uint64(s), 64))
					}
				}
				if _, err := l.Send(batch); err != nil {
					t.Error(err)
					return
				}
				if s%50 == 0 {
					runtime.Gosched()
				}
			}
		}()
	}
	sendWG.Wait()
	// Wait until every frame accounted for has been received.
	var sent, injected, lost, rx uint64
	deadline := time.Now().Add(5 * time.Second)
	for {
		sent, injected, lost, rx = 0, 0, 0, 0
		for _, l := range links {
			s := l.Stats()
			sent += s.TxFrames
			injected += s.InjectedDuplicate
			lost += s.InjectedLoss + s.QueueDrops
			rx += s.RxFrames
		}
		if rx+lost == sent+injected || time.Now().After(deadline) {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	for _, l := range links {
		l.Close()
	}
	recvWG.Wait()
	if sent != ports*(ports-1)*perPeer {
		t.Errorf("sent %d", sent)
	}
	if rx+lost != sent+injected {
		t.Errorf("received %d + lost %d != sent %d + duplicated %d", rx, lost, sent, injected)
	}
	total := 0
	for _, n := range received {
		total += n
	}
	if uint64(total) != rx {
		t.Errorf("Recv returned %d frames, RxFrames = %d", total, rx)
	}
}

func BenchmarkMemPairPingPong(b *testing.B) {
	a, z := NewPair(MemConfig{})
	ping := memFrameTo(z.HardwareAddr(), a.HardwareAddr(), 0, 64)
	pong := memFrameTo(a.HardwareAddr(), z.HardwareAddr(), 0, 64)
	done := make(chan struct{})
	go func() {
		defer close(done)
		bufs, sizes := memBufs(1, 2048)
		out := [][]byte{pong}
		for {
			if _, err := z.Recv(bufs, sizes, -1); err != nil {
				return
			}
			if _, err := z.Send(out); err != nil {
				return
			}
		}
	}()
	bufs, sizes := memBufs(1, 2048)
	in := [][]byte{ping}
	b.ReportAllocs()
	b.SetBytes(int64(2 * len(ping)))
	for b.Loop() {
		if _, err := a.Send(in); err != nil {
			b.Fatal(err)
		}
		if n, err := a.Recv(bufs, sizes, -1); n != 1 || err != nil {
			b.Fatalf("Recv = %d, %v", n, err)
		}
	}
	b.StopTimer()
	a.Close()
	z.Close()
	<-done
}

// TestMemDuplicateBackToBack: a duplicated frame that releases a frame
// held for reordering arrives twice, back to back, before the released one.
func TestMemDuplicateBackToBack(t *testing.T) {
	a, b := NewPair(MemConfig{Reorder: 1})
	mk := func(seq byte) []byte {
		f := make([]byte, 60)
		copy(f, b.HardwareAddr())
		copy(f[6:], a.HardwareAddr())
		f[14] = seq
		return f
	}
	a.Send([][]byte{mk(1)}) // held for reordering
	a.Hub().SetConfig(MemConfig{Duplicate: 1})
	a.Send([][]byte{mk(2)}) // duplicated, and releases 1
	bufs, sizes := make([][]byte, 8), make([]int, 8)
	for i := range bufs {
		bufs[i] = make([]byte, 100)
	}
	var got []byte
	for deadline := time.Now().Add(2 * time.Second); len(got) < 3 && time.Now().Before(deadline); {
		n, err := b.Recv(bufs, sizes, 10*time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		for i := range n {
			got = append(got, bufs[i][14])
		}
	}
	if !bytes.Equal(got, []byte{2, 2, 1}) {
		t.Fatalf("order %v, want [2 2 1]", got)
	}
}

// keepVisitor keeps the frames it is shown, which the Visitor contract
// forbids: they stay the link's.
type keepVisitor struct{ kept [][]byte }

func (v *keepVisitor) Visit(f []byte) { v.kept = append(v.kept, f) }

// A frame kept past its Visit is junk once RecvVisit returns, as on a
// kernel link whose slot is refilled, whether or not the pool hands its
// buffer out again.
func TestMemVisitedFramesAreJunkAfterVisit(t *testing.T) {
	a, b := NewPair(MemConfig{})
	defer a.Close()
	defer b.Close()
	memSendSeq(t, a, b, 0, 3)
	v := &keepVisitor{}
	if n, err := b.RecvVisit(8, time.Second, v); n != 3 || err != nil {
		t.Fatalf("RecvVisit = %d, %v; want 3, nil", n, err)
	}
	for i, f := range v.kept {
		if len(f) != 64 {
			t.Fatalf("frame %d: %d bytes, want 64", i, len(f))
		}
		if !bytes.Equal(f, bytes.Repeat([]byte{memJunk}, len(f))) {
			t.Errorf("frame %d kept past its Visit still reads % x...", i, f[:22])
		}
	}
}

// MemConfig.BufferBytes bounds what a link lends at once, per link, as an
// AF_XDP buffer area does; Free makes room again (once, however often it
// is called).
func TestMemBufferBytes(t *testing.T) {
	a, b := NewPair(MemConfig{BufferBytes: 1000})
	defer a.Close()
	defer b.Close()
	alloc := func(l *MemLink, n int) *Buffer {
		t.Helper()
		buf, err := l.AllocBuffer(n)
		if err != nil {
			t.Fatalf("AllocBuffer(%d): %v", n, err)
		}
		return buf
	}
	x := alloc(a, 600)
	if _, err := a.AllocBuffer(401); !errors.Is(err, ErrNoBufferSpace) {
		t.Fatalf("AllocBuffer(401) with 400 bytes left = %v, want ErrNoBufferSpace", err)
	}
	alloc(b, 1000) // the other link has its own room
	alloc(a, 400)
	x.Free()
	x.Free()
	alloc(a, 600)
	if _, err := a.AllocBuffer(1); !errors.Is(err, ErrNoBufferSpace) {
		t.Fatalf("AllocBuffer(1) on a full area = %v, want ErrNoBufferSpace", err)
	}
}

// stallingBuilder builds frame over and over and stalls l's transmit
// once the first is built.
type stallingBuilder struct {
	l     *MemLink
	frame []byte
}

func (b *stallingBuilder) Build(i int, buf []byte) int {
	if i == 0 {
		b.l.StallTx(true)
	}
	return copy(buf, b.frame)
}

// TestHubConfig: Config returns every knob as the segment uses it,
// defaults filled in, so that Config, a change, SetConfig changes only
// that knob.
func TestHubConfig(t *testing.T) {
	h := NewHub(MemConfig{Loss: 2, QueueLen: -1, BufferBytes: 1 << 20, Seed: 7})
	want := MemConfig{MTU: memDefaultMTU, Loss: 1, QueueLen: memDefaultQueueLen,
		Seed: 7, BufferBytes: 1 << 20, SendWait: memDefaultSendWait}
	if got := h.Config(); got != want {
		t.Fatalf("Config() = %+v, want %+v", got, want)
	}
	set := MemConfig{MTU: 9000, Loss: 0.1, Reorder: 0.2, Duplicate: 0.3,
		Delay: time.Millisecond, Jitter: 2 * time.Millisecond, QueueLen: 16,
		SendWait: 5 * time.Second, Seed: 9, BufferBytes: 5}
	h.SetConfig(set)
	want = set
	want.MTU, want.Seed, want.BufferBytes = memDefaultMTU, 7, 1<<20 // fixed at NewHub
	if got := h.Config(); got != want {
		t.Fatalf("Config() after SetConfig = %+v, want %+v", got, want)
	}
	cfg := h.Config()
	cfg.Loss = 0
	h.SetConfig(cfg)
	want.Loss = 0
	if got := h.Config(); got != want {
		t.Fatalf("Config() after a round trip = %+v, want %+v", got, want)
	}
}

// TestMemStallTx: a stalled link's send waits, goes on when the transmit
// starts again, fails with ErrTxStalled after SendWait (counted in
// TxErrors, the frames before the stall sent), and ends with net.ErrClosed
// when the link is closed; receiving goes on meanwhile.
func TestMemStallTx(t *testing.T) {
	a, b := NewPair(MemConfig{SendWait: 30 * time.Millisecond})
	defer b.Close()
	f := memFrameTo(b.HardwareAddr(), a.HardwareAddr(), 1, 64)
	back := memFrameTo(a.HardwareAddr(), b.HardwareAddr(), 2, 64)

	a.StallTx(true)
	start := time.Now()
	n, err := a.Send([][]byte{f, f})
	if n != 0 || !errors.Is(err, ErrTxStalled) {
		t.Fatalf("Send while stalled = %d, %v; want 0, ErrTxStalled", n, err)
	}
	if d := time.Since(start); d < 30*time.Millisecond {
		t.Errorf("Send gave up after %v, before SendWait (30ms)", d)
	}
	if s := a.Stats(); s.TxErrors != 1 || s.TxFrames != 0 {
		t.Errorf("TxErrors %d, TxFrames %d; want 1, 0", s.TxErrors, s.TxFrames)
	}
	// The stalled link still receives.
	if n, err := b.Send([][]byte{back}); n != 1 || err != nil {
		t.Fatalf("Send to the stalled link = %d, %v", n, err)
	}
	if got := memDrain(t, a, 0); len(got) != 1 || got[0] != 2 {
		t.Errorf("the stalled link received %v, want [2]", got)
	}

	// A send waiting goes on when the transmit starts again (SendWait
	// long enough for a test goroutine woken late).
	a.Hub().SetConfig(MemConfig{SendWait: time.Hour})
	done := make(chan error, 1)
	go func() {
		n, err := a.Send([][]byte{f})
		if err == nil && n != 1 {
			err = errors.New("sent none")
		}
		done <- err
	}()
	time.Sleep(10 * time.Millisecond)
	a.StallTx(false)
	if err := <-done; err != nil {
		t.Fatalf("Send after the stall ended: %v", err)
	}
	if got := memDrain(t, b, 0); len(got) != 1 || got[0] != 1 {
		t.Errorf("received %v after the stall, want [1]", got)
	}

	// A stall that begins part-way through a batch: the frames before it
	// are sent and counted, the rest wait, then fail.
	a.Hub().SetConfig(MemConfig{SendWait: 30 * time.Millisecond})
	stallAfter := &stallingBuilder{l: a, frame: f}
	if n, err := a.SendBuilt(3, stallAfter); n != 1 || !errors.Is(err, ErrTxStalled) {
		t.Fatalf("SendBuilt stalled after its first frame = %d, %v; want 1, ErrTxStalled", n, err)
	}
	if s := a.Stats(); s.TxErrors != 2 || s.TxFrames != 2 {
		t.Errorf("TxErrors %d, TxFrames %d; want 2, 2", s.TxErrors, s.TxFrames)
	}
	if got := memDrain(t, b, 0); len(got) != 1 || got[0] != 1 {
		t.Errorf("received %v from the batch stalled part-way, want [1]", got)
	}

	// Close ends a send waiting, with net.ErrClosed, long before SendWait.
	a.Hub().SetConfig(MemConfig{SendWait: time.Hour})
	a.StallTx(true) // still stalled from the batch: said again for the reader
	go func() {
		_, err := a.Send([][]byte{f})
		done <- err
	}()
	time.Sleep(10 * time.Millisecond)
	a.Close()
	select {
	case err := <-done:
		if !errors.Is(err, net.ErrClosed) {
			t.Errorf("a stalled Send ended by Close: %v, want net.ErrClosed", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not end a stalled Send")
	}
}
