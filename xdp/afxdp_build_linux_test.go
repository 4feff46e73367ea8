package xdp_test

// Lab tests and benchmark of the in-place calls (SendBuilt, RecvVisit) of
// the AF_XDP links beyond the conformance suite: jumbo frames built in
// place, routing of built frames over several queues, and the frame rate
// gained by skipping the copies.

import (
	"bytes"
	"encoding/binary"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/xmx-stack/xmx/internal/netlab"
	"github.com/xmx-stack/xmx/xdp"
)

// seqBuilder builds frames from src to dst[i%len(dst)] of the given size
// carrying seq+i after the header and a pattern derived from it.
type seqBuilder struct {
	dst  [][]byte
	src  []byte
	seq  uint64
	size func(seq uint64) int
}

func fillFrame(f []byte, dst, src []byte, seq uint64) {
	copy(f, dst)
	copy(f[6:], src)
	f[12], f[13] = 0x88, 0xb5
	binary.BigEndian.PutUint64(f[14:], seq)
	x := uint32(seq)*2654435761 | 1
	for i := 22; i < len(f); i++ {
		x ^= x << 13
		x ^= x >> 17
		x ^= x << 5
		f[i] = byte(x)
	}
}

func (b *seqBuilder) Build(i int, buf []byte) int {
	seq := b.seq + uint64(i)
	n := b.size(seq)
	fillFrame(buf[:n], b.dst[int(seq)%len(b.dst)], b.src, seq)
	return n
}

// seqChecker checks the frames it visits against fillFrame and records
// their sequence numbers per destination.
type seqChecker struct {
	t     *testing.T
	size  func(seq uint64) int
	byDst map[string][]uint64 // by destination MAC
	want  []byte
}

func (c *seqChecker) Visit(f []byte) {
	if len(f) < 22 {
		c.t.Errorf("runt frame of %d bytes", len(f))
		return
	}
	seq := binary.BigEndian.Uint64(f[14:])
	if len(f) != c.size(seq) {
		c.t.Errorf("frame %d: %d bytes, want %d", seq, len(f), c.size(seq))
		return
	}
	if cap(c.want) < len(f) {
		c.want = make([]byte, len(f))
	}
	w := c.want[:len(f)]
	fillFrame(w, f[0:6], f[6:12], seq)
	if !bytes.Equal(w, f) {
		c.t.Errorf("frame %d (%d bytes) corrupted", seq, len(f))
		return
	}
	c.byDst[string(f[0:6])] = append(c.byDst[string(f[0:6])], seq)
}

// TestAFXDPJumboBuiltInPlace sends frames of every size up to 9014 bytes,
// built in place in multi-slot sends, over multi-buffer links and checks
// that they arrive intact and in order through RecvVisit.
func TestAFXDPJumboBuiltInPlace(t *testing.T) {
	lab := netlab.New(t, netlab.Options{Hosts: 2, MTU: jumboMTU})
	a := openAFXDP(t, lab.Hosts[0], xdp.AFXDPConfig{})
	b := openAFXDP(t, lab.Hosts[1], xdp.AFXDPConfig{})
	const n = 8955 // every size from 60 to 9014
	size := func(seq uint64) int { return xdp.MinFrameLen + int(seq)%(jumboMTU+xdp.EthHeaderLen-xdp.MinFrameLen+1) }
	bld := &seqBuilder{dst: [][]byte{b.HardwareAddr()}, src: a.HardwareAddr(), size: size}
	chk := &seqChecker{t: t, size: size, byDst: map[string][]uint64{}}
	got := func() int { return len(chk.byDst[string(b.HardwareAddr())]) }
	for sent := 0; sent < n; {
		// A few frames at a time, received before the next: no drop.
		k := min(8, n-sent)
		bld.seq = uint64(sent)
		m, err := a.SendBuilt(k, bld)
		if err != nil {
			t.Fatalf("SendBuilt: %v", err)
		}
		sent += m
		deadline := time.Now().Add(2 * time.Second)
		for got() < sent && time.Now().Before(deadline) {
			if _, err := b.RecvVisit(64, 100*time.Millisecond, chk); err != nil {
				t.Fatalf("RecvVisit: %v", err)
			}
		}
		if got() < sent {
			t.Fatalf("received %d of %d frames; stats %+v", got(), sent, b.Stats())
		}
	}
	for i, s := range chk.byDst[string(b.HardwareAddr())] {
		if s != uint64(i) {
			t.Fatalf("frame %d has sequence number %d", i, s)
		}
	}
	st := a.Stats()
	if st.TxFrames != n || st.TxBytes != uint64(n*(xdp.MinFrameLen+jumboMTU+xdp.EthHeaderLen)/2) {
		t.Errorf("sender counted %d frames, %d bytes", st.TxFrames, st.TxBytes)
	}
}

// TestAFXDPMultiQueueBuiltRouting sends built frames to two destinations
// that the multi-queue link routes to different queues, interleaved, and
// checks that each destination's frames arrive in order, and that the
// queues carried what Send would have put on them.
func TestAFXDPMultiQueueBuiltRouting(t *testing.T) {
	lab := netlab.New(t, netlab.Options{Hosts: 2, Queues: 2})
	open := func(h *netlab.Host) *xdp.AFXDPMultiLink {
		var l *xdp.AFXDPMultiLink
		if err := h.Do(func() (err error) {
			l, err = xdp.OpenAFXDPQueues(xdp.AFXDPConfig{Interface: h.Interface}, []int{0, 1})
			return err
		}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Close() })
		return l
	}
	a, b := open(lab.Hosts[0]), open(lab.Hosts[1])
	// Destinations: b's address, and b's address with the group bit set:
	// a multicast address, which the steering program takes as it takes
	// b's (unicast to another MAC it leaves to the kernel). The one bit
	// flips the low bit of queueFor's hash, so two queues part them.
	mcast := slices.Clone(b.HardwareAddr())
	mcast[0] |= 1
	dsts := [][]byte{b.HardwareAddr(), mcast}
	size := func(seq uint64) int { return 100 + int(seq%1400) }
	perQueue := func() [2]uint64 {
		return [2]uint64{a.Queues()[0].Stats().TxFrames, a.Queues()[1].Stats().TxFrames}
	}

	// The queues Send uses for each destination.
	var sendQ [2][2]uint64
	for d := range dsts {
		before := perQueue()
		f := make([]byte, 100)
		fillFrame(f, dsts[d], a.HardwareAddr(), 0)
		if _, err := a.Send([][]byte{f}); err != nil {
			t.Fatal(err)
		}
		after := perQueue()
		sendQ[d] = [2]uint64{after[0] - before[0], after[1] - before[1]}
	}
	if sendQ[0] == sendQ[1] {
		t.Skipf("both destinations hash to one queue (%v)", sendQ)
	}
	drain := func() {
		for {
			n, err := b.Recv([][]byte{make([]byte, 2048)}, []int{0}, 100*time.Millisecond)
			if err != nil {
				t.Fatal(err)
			}
			if n == 0 {
				return
			}
		}
	}
	drain()

	// Runs of 1, 2 and 3 frames per destination, so that frames are built
	// on the wrong queue and moved, and runs continue on the new queue.
	const n = 600
	var pattern []int
	for len(pattern) < n {
		for run := 1; run <= 3; run++ {
			for d := range dsts {
				for range run {
					pattern = append(pattern, d)
				}
			}
		}
	}
	pattern = pattern[:n]
	bld := &seqBuilder{src: a.HardwareAddr(), size: size}
	bld.dst = make([][]byte, n)
	for i, d := range pattern {
		bld.dst[i] = dsts[d]
	}
	before := perQueue()
	for sent := 0; sent < n; {
		bld.seq = uint64(sent)
		k, err := a.SendBuilt(min(16, n-sent), bld)
		if err != nil {
			t.Fatalf("SendBuilt: %v", err)
		}
		sent += k
		time.Sleep(time.Millisecond) // let b keep up: no drop
	}
	after := perQueue()
	var want [2]uint64
	for _, d := range pattern {
		want[0] += sendQ[d][0]
		want[1] += sendQ[d][1]
	}
	if got := [2]uint64{after[0] - before[0], after[1] - before[1]}; got != want {
		t.Errorf("queues carried %v frames, want %v as Send routes them", got, want)
	}

	chk := &seqChecker{t: t, size: size, byDst: map[string][]uint64{}}
	total := func() int { return len(chk.byDst[string(dsts[0])]) + len(chk.byDst[string(dsts[1])]) }
	deadline := time.Now().Add(5 * time.Second)
	for total() < n && time.Now().Before(deadline) {
		if _, err := b.RecvVisit(64, 100*time.Millisecond, chk); err != nil {
			t.Fatal(err)
		}
	}
	for d, dst := range dsts {
		var wantSeqs []uint64
		for i, pd := range pattern {
			if pd == d {
				wantSeqs = append(wantSeqs, uint64(i))
			}
		}
		if got := chk.byDst[string(dst)]; len(got) != len(wantSeqs) || !equalSeqs(got, wantSeqs) {
			t.Errorf("destination %d: received %d frames (%v...), want %d in order; stats %+v", d, len(got), head(got), len(wantSeqs), b.Stats())
		}
	}
}

func equalSeqs(a, b []uint64) bool {
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func head(s []uint64) []uint64 { return s[:min(len(s), 8)] }

// The benchmark's stream models a messaging engine moving a long message:
// the sender writes a header and a slice of the message into each frame, the
// receiver copies each frame's payload into the message buffer. In plain
// mode the sender builds frames in its own buffers, which Send copies into
// the UMEM, and Recv copies received frames out into the receiver's buffers;
// in place the sender builds them in the UMEM (SendBuilt) and the receiver
// reads them there (RecvVisit). The engine work is the same; the link copies
// are what differs.

const streamFrame = 1514

type streamSender struct {
	dst, src []byte
	msg      []byte // the message whose slices the frames carry
	seq      uint64
}

func (s *streamSender) Build(i int, buf []byte) int {
	seq := s.seq + uint64(i)
	copy(buf, s.dst)
	copy(buf[6:], s.src)
	buf[12], buf[13] = 0x88, 0xb5
	binary.BigEndian.PutUint64(buf[14:], seq)
	const payload = streamFrame - 22
	off := int(seq*payload) % (len(s.msg) - payload)
	copy(buf[22:streamFrame], s.msg[off:off+payload])
	return streamFrame
}

type streamReceiver struct {
	msg   []byte
	count uint64
}

func (r *streamReceiver) Visit(f []byte) {
	if len(f) < 22 {
		return
	}
	seq := binary.BigEndian.Uint64(f[14:])
	payload := len(f) - 22
	off := int(seq*uint64(payload)) % (len(r.msg) - payload)
	copy(r.msg[off:], f[22:])
	r.count++
}

type streamResult struct {
	sent, received uint64
	elapsed        time.Duration // first to last frame received
}

// stream moves n frames from a to b, in place or not, and returns what b got.
func stream(tb testing.TB, a, b *xdp.AFXDPLink, n int, inPlace bool) streamResult {
	const batch = 64
	msg := make([]byte, 1<<20)
	for i := range msg {
		msg[i] = byte(i * 7)
	}
	var res streamResult
	var sending atomic.Bool
	sending.Store(true)
	var sendErr error
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer sending.Store(false)
		s := &streamSender{dst: b.HardwareAddr(), src: a.HardwareAddr(), msg: msg}
		frames := make([][]byte, batch)
		for i := range frames {
			frames[i] = make([]byte, streamFrame)
		}
		for res.sent < uint64(n) {
			k := min(batch, n-int(res.sent))
			s.seq = res.sent
			var m int
			var err error
			if inPlace {
				m, err = a.SendBuilt(k, s)
			} else {
				for i := range k {
					s.Build(i, frames[i])
				}
				m, err = a.Send(frames[:k])
			}
			res.sent += uint64(m)
			if err != nil {
				sendErr = err
				return
			}
		}
	}()
	r := &streamReceiver{msg: make([]byte, 1<<20)}
	bufs, sizes := make([][]byte, batch), make([]int, batch)
	for i := range bufs {
		bufs[i] = make([]byte, xdp.MaxFrameLen(b))
	}
	var first, last, idle time.Time
	for {
		var k int
		var err error
		if inPlace {
			k, err = b.RecvVisit(batch, 20*time.Millisecond, r)
		} else {
			k, err = b.Recv(bufs, sizes, 20*time.Millisecond)
			for i := range k {
				r.Visit(bufs[i][:sizes[i]])
			}
		}
		if err != nil {
			tb.Fatalf("receive: %v", err)
		}
		now := time.Now()
		if k > 0 {
			if first.IsZero() {
				first = now
			}
			last = now
			res.received += uint64(k)
			idle = time.Time{}
			if res.received >= uint64(n) {
				break
			}
			continue
		}
		if !sending.Load() {
			if idle.IsZero() {
				idle = now
			} else if now.Sub(idle) > 100*time.Millisecond {
				break
			}
		}
	}
	wg.Wait()
	if sendErr != nil {
		tb.Fatalf("send: %v", sendErr)
	}
	res.elapsed = last.Sub(first)
	return res
}

// BenchmarkStreamBuiltAFXDP compares the one-direction rate of 1514-byte
// frames over AF_XDP (spin) with Send and Recv and with SendBuilt and
// RecvVisit, in alternating rounds of one run (each round runs both modes,
// in turn first). b.N is the number of frames per mode. It reports both
// rates (frames received per second, from the first to the last frame
// received, over all rounds), the median over the rounds of the in-place /
// plain ratio, and the share of frames lost in each mode (frames the
// receiver's RX ring could not take while the sender ran flat out).
//
// The spin sub-benchmark is the one that counts; poll is there for
// comparison (on a two-core machine two spinning ends compete with the
// kernel's own work on the veth path).
func BenchmarkStreamBuiltAFXDP(b *testing.B) {
	lab := netlab.New(b, netlab.Options{Hosts: 2})
	for _, spin := range []bool{true, false} {
		b.Run(map[bool]string{true: "spin", false: "poll"}[spin], func(b *testing.B) {
			a := openAFXDP(b, lab.Hosts[0], xdp.AFXDPConfig{Spin: spin})
			r := openAFXDP(b, lab.Hosts[1], xdp.AFXDPConfig{Spin: spin})
			benchStreamBuilt(b, a, r)
		})
	}
}

func benchStreamBuilt(b *testing.B, a, r *xdp.AFXDPLink) {
	stream(b, a, r, 10000, false) // warm up
	stream(b, a, r, 10000, true)
	const rounds = 10
	per := max(b.N/rounds, 1)
	var tot [2]streamResult
	var ratios []float64
	rate := func(s streamResult) float64 {
		if s.elapsed <= 0 {
			return 0
		}
		return float64(s.received) / s.elapsed.Seconds()
	}
	b.ResetTimer()
	for round := range rounds {
		var res [2]streamResult
		for mode := range 2 {
			i := (mode + round) % 2 // 0 plain, 1 in place
			res[i] = stream(b, a, r, per, i == 1)
			tot[i].sent += res[i].sent
			tot[i].received += res[i].received
			tot[i].elapsed += res[i].elapsed
		}
		if rate(res[0]) > 0 {
			ratios = append(ratios, rate(res[1])/rate(res[0]))
		}
	}
	b.StopTimer()
	loss := func(s streamResult) float64 {
		if s.sent == 0 {
			return 0
		}
		return 100 * float64(s.sent-s.received) / float64(s.sent)
	}
	b.ReportMetric(rate(tot[0]), "plain-frames/s")
	b.ReportMetric(rate(tot[1]), "inplace-frames/s")
	if len(ratios) > 0 {
		slices.Sort(ratios)
		b.ReportMetric(ratios[len(ratios)/2], "inplace/plain")
	}
	b.ReportMetric(loss(tot[0]), "plain-loss-%")
	b.ReportMetric(loss(tot[1]), "inplace-loss-%")
}
