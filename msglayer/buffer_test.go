package msglayer_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/xmx-stack/xmx/internal/netlab"
	"github.com/xmx-stack/xmx/msglayer"
	"github.com/xmx-stack/xmx/xdp"
)

// testLentBuffers sends large messages and a Put from lent buffers and
// checks every byte arrives, that the replies left from the buffer where
// it lies, and that a buffer freed while a send from it is pending stays
// usable until the send completes.
func testLentBuffers(t *testing.T, w world, ca msglayer.Config, wantZeroCopy bool) {
	a, b := w.pair(t, ca, msglayer.Config{})
	ctx := ctxFor(t, 60*time.Second)
	const size = 3<<20 + 12345
	buf, err := a.AllocBuffer(size + 100)
	if err != nil {
		t.Fatal(err)
	}
	if buf.ZeroCopy() != wantZeroCopy {
		t.Errorf("ZeroCopy() = %v, want %v", buf.ZeroCopy(), wantZeroCopy)
	}
	before := a.Counters()
	for i, n := range []int{size, 100 << 10, 40 << 10} {
		data := buf.Bytes()[77 : 77+n] // not at the buffer's start
		copy(data, message(i, n))
		got := make([]byte, n)
		transfer(t, ctx, a, b, uint64(i), data, got)
		checkMessage(t, got, i, n)
	}
	c := a.Counters()
	if g := c.GatheredReplies - before.GatheredReplies; g == 0 {
		t.Errorf("no pull reply was sent from the lent buffer (counters %+v)", c)
	} else {
		t.Logf("%d pull replies sent from the lent buffer (%d in all)", g, c.PullReplies-before.PullReplies)
	}

	// A Put from the buffer into a region of b.
	target := make([]byte, 1<<20)
	reg, err := b.Register(target)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Deregister(reg)
	copy(buf.Bytes(), message(50, 900000))
	p, err := a.IPut(b.Addr(), reg.Mem, 4096, [][]byte{buf.Bytes()[:900000]}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Wait(ctx, p); err != nil {
		t.Fatalf("put from a lent buffer: %v", err)
	}
	b.Counters() // the target's engine wrote the region under its lock
	checkMessage(t, target[4096:4096+900000], 50, 900000)

	// Free while a send is pending: the data stays until it completes.
	copy(buf.Bytes(), message(60, size))
	s, err := a.Isend(b.Addr(), 60, [][]byte{buf.Bytes()[:size]}, nil)
	if err != nil {
		t.Fatal(err)
	}
	buf.Free()
	next, err := a.AllocBuffer(size) // must not get the memory in use
	if err != nil {
		t.Fatal(err)
	}
	clear(next.Bytes())
	got := make([]byte, size)
	r, _ := b.Irecv(60, ^uint64(0), [][]byte{got}, nil)
	if _, err := b.Wait(ctx, r); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Wait(ctx, s); err != nil {
		t.Fatal(err)
	}
	checkMessage(t, got, 60, size)
	next.Free()
	buf.Free()
	if _, err := a.AllocBuffer(0); err == nil {
		t.Error("AllocBuffer(0) succeeded")
	}
}

func TestLentBuffersMem(t *testing.T) {
	w := memWorld(t, xdp.MemConfig{Loss: 0.02, Reorder: 0.02, Seed: 5})
	testLentBuffers(t, w, msglayer.Config{}, false)
}

// TestLentBuffersAFXDP runs the lent-buffer test over AF_XDP in a lab at
// each MTU: the UMEM's buffer area, the socket in multi-buffer mode, pull
// replies as a header descriptor plus descriptors into the buffer (veth
// has no zero-copy mode, where that is the default: it is asked for).
// Then with the default on veth: the data is copied behind the headers.
func TestLentBuffersAFXDP(t *testing.T) {
	for _, mtu := range []int{1500, 3506, 9000} {
		t.Run(fmt.Sprint(mtu), func(t *testing.T) {
			w := labWorld2(t, netlab.New(t, netlab.Options{Hosts: 2, MTU: mtu}))
			testLentBuffers(t, w, msglayer.Config{UMEMBufferBytes: 16 << 20, UMEMGather: xdp.GatherDescriptors}, true)
		})
	}
	t.Run("1500-copy-mode-default", func(t *testing.T) {
		w := labWorld2(t, netlab.New(t, netlab.Options{Hosts: 2}))
		testLentBuffers(t, w, msglayer.Config{UMEMBufferBytes: 16 << 20}, false)
	})
}

// TestLentBufferFallback: without a buffer area (the default for an
// endpoint opening AF_XDP), or once it is full, AllocBuffer gives ordinary
// memory and sends from it work as any.
func TestLentBufferFallback(t *testing.T) {
	lab := netlab.New(t, netlab.Options{Hosts: 2})
	w := labWorld2(t, lab)
	a, b := w.pair(t, msglayer.Config{}, msglayer.Config{})
	buf, err := a.AllocBuffer(1 << 20)
	if err != nil {
		t.Fatal(err)
	}
	defer buf.Free()
	if buf.ZeroCopy() {
		t.Error("a buffer of an endpoint without a buffer area claims zero copy")
	}
	ctx := ctxFor(t, 20*time.Second)
	copy(buf.Bytes(), message(1, 1<<20))
	got := make([]byte, 1<<20)
	r, _ := b.Irecv(1, ^uint64(0), [][]byte{got}, nil)
	s, _ := a.Isend(b.Addr(), 1, [][]byte{buf.Bytes()}, nil)
	if _, err := b.Wait(ctx, r); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Wait(ctx, s); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, buf.Bytes()) {
		t.Fatal("data differs")
	}
	if c := a.Counters(); c.GatheredReplies != 0 {
		t.Errorf("GatheredReplies = %d without a buffer area", c.GatheredReplies)
	}
}

// TestLentBufferFallbackFullArea: once the link's buffer area is full,
// AllocBuffer gives ordinary memory (counted in BufferFallbacks), sends
// from it are copied and arrive whole, and a Free makes room for link
// memory again.
func TestLentBufferFallbackFullArea(t *testing.T) {
	w := memWorld(t, xdp.MemConfig{BufferBytes: 1 << 20, Loss: 0.02, Seed: 9})
	a, b := w.pair(t, msglayer.Config{}, msglayer.Config{})
	ctx := ctxFor(t, 30*time.Second)
	const size = 600 << 10
	// send sends size bytes from buf and reports whether pull replies
	// were sent from it where it lies (link memory) or copied.
	send := func(buf *msglayer.Buffer, i int) (lent bool) {
		t.Helper()
		before := a.Counters().GatheredReplies
		copy(buf.Bytes(), message(i, size))
		got := make([]byte, size)
		transfer(t, ctx, a, b, uint64(i), buf.Bytes()[:size], got)
		checkMessage(t, got, i, size)
		return a.Counters().GatheredReplies > before
	}
	alloc := func() *msglayer.Buffer {
		t.Helper()
		buf, err := a.AllocBuffer(size)
		if err != nil {
			t.Fatal(err)
		}
		return buf
	}
	first := alloc()
	if !send(first, 1) {
		t.Error("the first buffer, inside the area, was not sent from where it lies")
	}
	second := alloc() // the area has 424 KiB left
	if c := a.Counters(); c.BufferFallbacks != 1 {
		t.Errorf("BufferFallbacks = %d after an AllocBuffer past the area, want 1", c.BufferFallbacks)
	}
	if send(second, 2) {
		t.Error("pull replies were gathered from a buffer of ordinary memory")
	}
	second.Free()
	first.Free()
	third := alloc()
	defer third.Free()
	if !send(third, 3) {
		t.Error("after the Frees, a new buffer was not link memory")
	}
	if c := a.Counters(); c.BufferFallbacks != 1 {
		t.Errorf("BufferFallbacks = %d after the area had room again, want 1", c.BufferFallbacks)
	}
}

// holdingLink is an in-memory link that keeps its lent buffers in use
// while holding is set, as a zero-copy NIC slow to complete would, or
// frames a refused kick left on an AF_XDP ring: BufferSent says no.
type holdingLink struct {
	*xdp.MemLink
	holding atomic.Bool
	asked   atomic.Int64 // BufferSent calls while holding
}

func (l *holdingLink) BufferSent(b *xdp.Buffer) bool {
	if l.holding.Load() {
		l.asked.Add(1)
		return false
	}
	return l.MemLink.BufferSent(b)
}

// TestFailedLentSendWaitsForBuffer: a send from a lent buffer that fails
// (here Disconnect) completes only once the link is done with the buffer,
// so that data written into it after the completion cannot leave in a
// pull reply a receiver still takes as the message's; or after MaxRTO, if
// the link never is. Close does not wait.
func TestFailedLentSendWaitsForBuffer(t *testing.T) {
	var links []*holdingLink
	w := memWorldOf(t, xdp.MemConfig{}, func(l *xdp.MemLink) xdp.Link {
		h := &holdingLink{MemLink: l}
		links = append(links, h)
		return h
	})
	const maxRTO = 200 * time.Millisecond
	a, b := w.pair(t, msglayer.Config{MaxRTO: maxRTO}, msglayer.Config{})
	hold := links[0]
	ctx := ctxFor(t, 20*time.Second)
	buf, err := a.AllocBuffer(256 << 10)
	if err != nil {
		t.Fatal(err)
	}
	defer buf.Free()

	send := func(match uint64) msglayer.Request {
		t.Helper()
		s, err := a.Isend(b.Addr(), match, [][]byte{buf.Bytes()[:200<<10]}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := b.Probe(ctx, match, ^uint64(0)); err != nil { // its rendezvous record is there
			t.Fatal(err)
		}
		return s
	}
	s := send(1)
	hold.holding.Store(true)
	a.Disconnect(b.Addr())
	short, cancel := context.WithTimeout(ctx, 30*time.Millisecond)
	st, err := a.Wait(short, s)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("the failed send completed (%v, %v) while the link still used its buffer", st.Code, err)
	}
	if hold.asked.Load() < 2 {
		t.Errorf("the engine asked the link %d times whether it was done with the buffer; want it to keep asking", hold.asked.Load())
	}
	hold.holding.Store(false)
	st, err = a.Wait(ctx, s)
	if err == nil || st.Code == msglayer.Success {
		t.Fatalf("the disconnected send, once the buffer is free: %v, %v; want its failure", st.Code, err)
	}
	t.Logf("the send completed with %v once the link let go of the buffer", st.Code)
	if c := a.Counters(); c.HeldCut != 0 {
		t.Errorf("HeldCut %d, want 0", c.HeldCut)
	}

	// A link that never lets go (stopped, or other sends keep the buffer
	// busy): the failure is told after MaxRTO.
	if err := a.Connect(ctx, b.Addr(), 0xb); err != nil {
		t.Fatal(err)
	}
	s = send(3)
	hold.holding.Store(true)
	start := time.Now()
	a.Disconnect(b.Addr())
	st, err = a.Wait(ctx, s)
	took := time.Since(start)
	if err == nil || st.Code == msglayer.Success || took < maxRTO || took > maxRTO+5*time.Second {
		t.Errorf("a send held by a link that never lets go: %v, %v after %v; want its failure after MaxRTO %v", st.Code, err, took, maxRTO)
	}
	if c := a.Counters(); c.HeldCut != 1 {
		t.Errorf("HeldCut %d, want 1", c.HeldCut)
	}
	hold.holding.Store(false)

	// Close completes a held send at once.
	if err := a.Connect(ctx, b.Addr(), 0xb); err != nil {
		t.Fatal(err)
	}
	s = send(2)
	hold.holding.Store(true)
	a.Disconnect(b.Addr())
	done := make(chan error, 1)
	go func() {
		_, err := a.Wait(ctx, s)
		done <- err
	}()
	time.Sleep(20 * time.Millisecond)
	a.Close()
	select {
	case err := <-done:
		if err == nil {
			t.Error("the held send succeeded at Close")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a send held for its buffer did not complete at Close")
	}
}
