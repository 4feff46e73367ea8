package msglayer

import (
	"encoding/binary"
	"slices"
	"testing"
	"time"

	"github.com/xmx-stack/xmx/xdp"
)

// The tests of this file lose or hold back chosen frames of a pull on a
// manual clock, so that what finds a loss, and when, is exact.

// pullLossNet is a manNet in which a sends b a rendezvous message of size
// bytes (above the rendezvous threshold), pulled blocks blocks at a
// time, its receive posted first.
type pullLossNet struct {
	*manNet
	send, recv Request
	copies     map[uint32]int // copies of each pull reply (by offset) a sent
	holding    bool           // pull replies from a wait in held
	held       [][]byte
	short      func(off uint32) bool // the pull replies that arrive a byte short
}

func newPullLossNet(t *testing.T, size, blocks int) *pullLossNet {
	slow := 10 * time.Millisecond
	n := &pullLossNet{
		manNet: newManNetCfg(t, Config{}, Config{PullBlocks: blocks, InitialRTO: slow, MinRTO: slow}),
	}
	n.message(size)
	return n
}

// message starts the next message, of size bytes (the replies' copies
// counted anew).
func (n *pullLossNet) message(size int) {
	n.copies = map[uint32]int{}
	n.recv, _ = n.b.Irecv(1, ^uint64(0), [][]byte{make([]byte, size)}, nil)
	var err error
	if n.send, err = n.a.Isend(n.b.Addr(), 1, [][]byte{make([]byte, size)}, nil); err != nil {
		n.t.Fatal(err)
	}
}

// move moves frames both ways until none moves, without time passing;
// lose chooses the pull replies from a that are lost, by their offset and
// how many copies of it a sent before. While holding, the pull replies
// from a wait (release).
func (n *pullLossNet) move(lose func(off uint32, copies int) bool) {
	for range 1000 {
		fa, fb := n.la.take(), n.lb.take()
		if len(fa)+len(fb) == 0 {
			return
		}
		for _, f := range fa {
			if h, err := decodeHeader(f); err == nil && h.typ == tPullReply {
				th, _ := typeHdr(f, &h)
				var ph pullReplyHdr
				ph.decode(th)
				c := n.copies[ph.offset]
				n.copies[ph.offset]++
				if lose(ph.offset, c) {
					continue
				}
				if n.short != nil && n.short(ph.offset) {
					f = slices.Clone(f)
					binary.BigEndian.PutUint16(f[xdp.EthHeaderLen+22:], uint16(h.payloadLen-1))
				}
				if n.holding {
					n.held = append(n.held, f)
					continue
				}
			}
			n.deliver(n.b, f)
		}
		for _, f := range fb {
			n.deliver(n.a, f)
		}
	}
	n.t.Fatal("frames keep moving")
}

// release delivers the first k pull replies held back, in order, and
// moves what follows.
func (n *pullLossNet) release(k int) {
	for _, f := range n.held[:k] {
		n.deliver(n.b, f)
	}
	n.held = n.held[k:]
	n.move(loseNone)
}

func loseNone(uint32, int) bool { return false }

// releaseReversed delivers the pull replies held back, the last first,
// and moves what follows.
func (n *pullLossNet) releaseReversed() {
	for _, f := range slices.Backward(n.held) {
		n.deliver(n.b, f)
	}
	n.held = nil
	n.move(loseNone)
}

// reorderWindow is b's reordering window for a's pull replies.
func (n *pullLossNet) reorderWindow() time.Duration {
	n.b.eng.mu.Lock()
	defer n.b.eng.mu.Unlock()
	return time.Duration(n.b.peers[n.a.Addr()].pullReo)
}

// sendDone lets time pass for the notify and acks, and fails the test
// unless the send (named what) completed with success.
func (n *pullLossNet) sendDone(what string) {
	n.t.Helper()
	n.settle(5, time.Millisecond)
	mustComplete(n.t, n.a, n.send, Success, what)
}

// wait lets d pass, runs b's timers and moves what they send, lose
// choosing the pull replies lost (move).
func (n *pullLossNet) wait(d time.Duration, lose func(off uint32, copies int) bool) {
	n.clock.Advance(d)
	n.timers(n.b)
	n.move(lose)
}

// frameBytes is the data of one pull reply from a to b.
func (n *pullLossNet) frameBytes() uint32 {
	n.b.eng.mu.Lock()
	defer n.b.eng.mu.Unlock()
	return uint32(n.b.peers[n.a.Addr()].pullPayload())
}

// TestPullLossFoundWithoutProbe: frames lost from a block are found, and
// asked for again once, with no time passing and no probe, because the
// sender answers in order:
//   - from its middle, when the last frame its request asked for arrives;
//   - from its tail too, where nothing of its own request follows them,
//     when a reply to a request sent after it arrives (the other block's,
//     asked for in the same instant).
func TestPullLossFoundWithoutProbe(t *testing.T) {
	for _, tc := range []struct {
		name         string
		size, blocks int
		lost         [2]uint32 // frames lost once
	}{
		{"LastFrame", 40000, 1, [2]uint32{3, 9}},
		{"LaterRequest", 80000, 2, [2]uint32{4, 31}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := newPullLossNet(t, tc.size, tc.blocks)
			fb := n.frameBytes()
			n.move(func(off uint32, copies int) bool {
				return copies == 0 && (off == tc.lost[0]*fb || off == tc.lost[1]*fb)
			})
			mustComplete(t, n.b, n.recv, Success, "receive, no time passing")
			if c := n.b.Counters(); c.PullProbes != 0 || c.PullReRequests != 1 {
				t.Errorf("%d probes, %d re-requests: want the holes asked for once, with no probe", c.PullProbes, c.PullReRequests)
			}
			n.sendDone("send")
		})
	}
}

// TestPullBackoffEndsWithFrame: a probe answered shows the peer answers,
// so the next loss of the block waits the plain pull timeout, not one
// backed off. Frame x is lost twice and the last frame once: the probe
// for the last frame finds x lost, and x asked for again is lost too; x is
// probed one pull timeout later.
func TestPullBackoffEndsWithFrame(t *testing.T) {
	n := newPullLossNet(t, 40000, 1)
	fb := n.frameBytes()
	last := (40000 - 1) / fb * fb
	x := 5 * fb
	lose := func(off uint32, copies int) bool {
		return (off == x && copies < 2) || (off == last && copies == 0)
	}
	n.move(lose)
	d := n.b.DebugPullTimeout(n.a.Addr())
	for i := range 2 {
		if st, done, _ := n.b.Test(n.recv); done {
			t.Fatalf("receive complete (%v) after %d pull timeouts: nothing was lost", st.Code, i)
		}
		n.wait(d+time.Microsecond, lose)
	}
	mustComplete(t, n.b, n.recv, Success, "receive two pull timeouts after the losses")
	n.sendDone("send")
	if c := n.b.Counters(); c.PullProbes != 2 || c.PullReRequests != 1 {
		t.Errorf("%d probes, %d re-requests: want 2 probes (the last frame, then x) and 1 re-request (x)", c.PullProbes, c.PullReRequests)
	}
	if got := n.copies[x]; got != 3 {
		t.Errorf("frame x sent %d times, want 3", got)
	}
}

// TestPullStallAsksNothingAgain: a sender that stalls (its replies held
// back for pull timeouts) while a pull has two blocks in flight costs
// probes, not the blocks. Both blocks are probed; a few frames of the
// first come, and the first alone is probed again; then the rest comes in
// order. The first block completes with its first request's frames while
// its probe is later than the second block's: the second's frames follow
// in the sender's queue, and are not lost.
func TestPullStallAsksNothingAgain(t *testing.T) {
	n := newPullLossNet(t, 80000, 2)
	n.holding = true
	n.move(loseNone)
	d := n.b.DebugPullTimeout(n.a.Addr())
	n.wait(d+time.Microsecond, loseNone)
	if c := n.b.Counters(); c.PullProbes != 2 {
		t.Fatalf("%d probes one pull timeout into the stall, want 2 (one per block)", c.PullProbes)
	}
	n.release(6)
	n.wait(d+time.Microsecond, loseNone)
	if c := n.b.Counters(); c.PullProbes != 3 {
		t.Fatalf("%d probes after the first block's frames stalled again, want 3", c.PullProbes)
	}
	n.holding = false
	n.release(len(n.held))
	mustComplete(t, n.b, n.recv, Success, "receive")
	if c := n.b.Counters(); c.PullReRequests != 0 || c.PullProbes != 3 {
		t.Errorf("%d re-requests, %d probes: the stalled sender's blocks were asked for again", c.PullReRequests, c.PullProbes)
	}
	n.sendDone("send")
}

// TestPullRepliesThatFillNothing: replies that store nothing (here a
// frame of each of two blocks always arrives a byte short, counted bad)
// find nothing lost, whatever their stamps: otherwise each block's bad
// copy had the other asked for again, without end and with no time
// passing.
func TestPullRepliesThatFillNothing(t *testing.T) {
	n := newPullLossNet(t, 64*1468, 2)
	fb := n.frameBytes()
	n.short = func(off uint32) bool { return off == 5*fb || off == 37*fb }
	n.move(loseNone) // fails the test if frames keep moving
	if c := n.b.Counters(); c.BadFrames == 0 || c.PullReRequests > 2 {
		t.Errorf("%d bad frames, %d re-requests: want the short frames counted bad, and at most one re-request per block", c.BadFrames, c.PullReRequests)
	}
	if st, done, _ := n.b.Test(n.recv); done {
		t.Errorf("receive complete (%v) without two of its frames", st.Code)
	}
}

// TestPullReorderingLearned: a block whose frames all come in reverse
// order, nothing lost, is asked for again once (the last frame found the
// others missing), not once per frame: only the reply to the block's
// latest request proves the frames before it lost. The overtaken copies
// that come after that re-request open the peer's reordering window, and
// the next block so reordered waits it out and is asked for nothing. A
// loss found after that waits the window, not the pull timeout.
func TestPullReorderingLearned(t *testing.T) {
	n := newPullLossNet(t, 32*1468, 1)
	n.holding = true
	n.move(loseNone)
	n.holding = false
	n.releaseReversed()
	mustComplete(t, n.b, n.recv, Success, "first receive, no time passing")
	if c := n.b.Counters(); c.PullReRequests != 1 {
		t.Errorf("first block reversed: %d re-requests, want 1", c.PullReRequests)
	}
	w := n.reorderWindow()
	if w == 0 {
		t.Fatal("reordering window still closed after frames came overtaken")
	}
	n.sendDone("first send")

	before := n.b.Counters()
	n.message(32 * 1468)
	n.holding = true
	n.move(loseNone)
	n.holding = false
	n.releaseReversed()
	mustComplete(t, n.b, n.recv, Success, "second receive, no time passing")
	if c := n.b.Counters(); c.PullReRequests != before.PullReRequests {
		t.Errorf("second block reversed, window %v open: %d re-requests", w, c.PullReRequests-before.PullReRequests)
	}
	n.sendDone("second send")

	before = n.b.Counters()
	n.message(32 * 1468)
	fb := n.frameBytes()
	lose := func(off uint32, copies int) bool { return off == 3*fb && copies == 0 }
	n.move(lose)
	if _, done, _ := n.b.Test(n.recv); done {
		t.Fatal("third receive complete with frame 3 lost")
	}
	w = n.reorderWindow()
	if d := n.b.DebugPullTimeout(n.a.Addr()); w == 0 || w >= d {
		t.Fatalf("window %v, pull timeout %v: want the window open and shorter", w, d)
	}
	n.wait(w, lose)
	mustComplete(t, n.b, n.recv, Success, "third receive, a window after the loss")
	if c := n.b.Counters(); c.PullReRequests != before.PullReRequests+1 || c.PullProbes != before.PullProbes {
		t.Errorf("third block lost frame 3: %d re-requests, %d probes; want 1 re-request, no probe",
			c.PullReRequests-before.PullReRequests, c.PullProbes-before.PullProbes)
	}
}
