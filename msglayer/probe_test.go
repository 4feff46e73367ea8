package msglayer_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/xmx-stack/xmx/msglayer"
	"github.com/xmx-stack/xmx/xdp"
)

// holdLink delays every pull reply sent during the first hold after the
// first one, then sends them in order: a sender that was descheduled.
type holdLink struct {
	xdp.Link
	hold  time.Duration
	mu    sync.Mutex
	until time.Time // zero until the first pull reply
	held  [][]byte
}

func (l *holdLink) Send(frames [][]byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := time.Now()
	for _, f := range frames {
		_, isReply := msglayer.PullReplyFrame(f)
		if isReply && l.until.IsZero() {
			l.until = now.Add(l.hold)
			time.AfterFunc(l.hold, l.release)
		}
		if len(l.held) > 0 || (isReply && now.Before(l.until)) {
			l.held = append(l.held, append([]byte(nil), f...))
			continue
		}
		if _, err := l.Link.Send([][]byte{f}); err != nil {
			return 0, err
		}
	}
	return len(frames), nil
}

func (l *holdLink) release() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.Link.Send(l.held)
	l.held = nil
}

// pullOnce sends one size-byte rendezvous message from a to b and checks
// it arrived intact.
func pullOnce(t *testing.T, a, b *msglayer.Endpoint, size int) {
	t.Helper()
	ctx := ctxFor(t, 10*time.Second)
	s, err := a.Isend(b.Addr(), 7, [][]byte{message(7, size)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	sent := make(chan error, 1)
	go func() { _, err := a.Wait(ctx, s); sent <- err }()
	buf := make([]byte, size)
	r, _ := b.Irecv(7, ^uint64(0), [][]byte{buf}, nil)
	if _, err := b.Wait(ctx, r); err != nil {
		t.Fatalf("receive: %v\nreceiver %+v", err, b.Counters())
	}
	if err := <-sent; err != nil {
		t.Fatalf("send: %v", err)
	}
	checkMessage(t, buf, 7, size)
}

// TestPullProbeLateSender checks that a pull whose sender is only slow
// (all its replies held back for many pull timeouts) costs a probe frame
// per block and timeout, not the blocks again.
func TestPullProbeLateSender(t *testing.T) {
	hub := xdp.NewHub(xdp.MemConfig{})
	la, lb := hub.Attach(), hub.Attach()
	t.Cleanup(func() { la.Close(); lb.Close() })
	hl := &holdLink{Link: la, hold: 60 * time.Millisecond}
	a := openEP(t, msglayer.Config{Link: hl, EndpointID: 1, Key: 1, BusyPoll: true})
	b := openEP(t, msglayer.Config{Link: lb, EndpointID: 2, Key: 2, BusyPoll: true,
		InitialRTO: 5 * time.Millisecond, MinRTO: 5 * time.Millisecond})
	connectPair(t, a, b)
	pullOnce(t, a, b, 4*32*1468) // four blocks of 32 frames
	c := b.Counters()
	if c.PullProbes == 0 {
		t.Errorf("no probe while the sender was silent for 12 pull timeouts: %+v", c)
	}
	if c.PullReRequests != 0 || c.PullRepliesLate > c.PullProbes {
		t.Errorf("%d re-requests, %d late replies for %d probes: the late sender's blocks were asked for again", c.PullReRequests, c.PullRepliesLate, c.PullProbes)
	}
	// The probes were needless: once their answers came (after the
	// blocks' own frames), the blocks' time counts as the sender's, and
	// the next pull waits longer before probing.
	for deadline := time.Now().Add(5 * time.Second); b.Counters().PullRepliesLate < c.PullProbes && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
	}
	if got := b.DebugPullTimeout(a.Addr()); got < hl.hold/2 {
		t.Errorf("pull timeout %v after blocks that took %v and lost nothing (%+v)", got, hl.hold, b.Counters())
	}
}

// TestPullProbeFindsLoss checks that frames lost from a block's middle and
// tail (nothing after them to show the loss) are found by a probe and
// asked for once.
func TestPullProbeFindsLoss(t *testing.T) {
	hub := xdp.NewHub(xdp.MemConfig{})
	la, lb := hub.Attach(), hub.Attach()
	t.Cleanup(func() { la.Close(); lb.Close() })
	const payload = 1468
	dl := &dropLink{Link: la, dropped: map[uint32]bool{}, drop: func(f []byte) (uint32, bool) {
		off, ok := msglayer.PullReplyFrame(f)
		return off, ok && (off == 10*payload || off == 31*payload)
	}}
	a := openEP(t, msglayer.Config{Link: dl, EndpointID: 1, Key: 1, BusyPoll: true})
	b := openEP(t, msglayer.Config{Link: lb, EndpointID: 2, Key: 2, BusyPoll: true,
		InitialRTO: 5 * time.Millisecond, MinRTO: 5 * time.Millisecond})
	connectPair(t, a, b)
	pullOnce(t, a, b, 32*payload) // one block
	// One probe finds both holes. More are right too when the first one's
	// answer takes longer than a pull timeout (a starved CPU: it happens
	// with the test's 5 ms RTO on a loaded machine), one per timeout, and
	// their answers may come after the block is whole; the holes are still
	// asked for once.
	c := b.Counters()
	if c.PullProbes < 1 || c.PullProbes > 5 || c.PullReRequests != 1 || c.PullRepliesLate > c.PullProbes-1 {
		t.Errorf("%d probes, %d re-requests, %d late replies: want 1 probe (a few on a starved CPU), 1 re-request, late replies only to the extra probes", c.PullProbes, c.PullReRequests, c.PullRepliesLate)
	}
}

func connectPair(t *testing.T, a, b *msglayer.Endpoint) {
	t.Helper()
	ctx := ctxFor(t, 10*time.Second)
	if err := a.Connect(ctx, b.Addr(), 2); err != nil {
		t.Fatal(err)
	}
	if err := b.Connect(ctx, a.Addr(), 1); err != nil {
		t.Fatal(err)
	}
}

// TestPullBudgetShared pulls many large messages at once over a lossy
// link: more frames than the engine's pull budget, so most pulls wait for
// it. The messages are sent first and the receives posted together once
// every rendezvous record is in the unexpected queue, so that all 40 pulls
// start at once (posted first, the receives matched the records as they
// came, and the pulls sometimes ran one after the other without waiting).
// Every message arrives intact, and afterwards the budget is whole and no
// pull waits.
func TestPullBudgetShared(t *testing.T) {
	w := memWorld(t, xdp.MemConfig{Loss: 0.05, Reorder: 0.05, Duplicate: 0.01, Seed: 11})
	a, b := w.pair(t, msglayer.Config{}, msglayer.Config{})
	ctx := ctxFor(t, 60*time.Second)
	const n, size = 40, 100 << 10 // 40 x 70 frames against a budget of 1024
	sends := make([]msglayer.Request, n)
	for i := range n {
		s, err := a.Isend(b.Addr(), uint64(i), [][]byte{message(i, size)}, nil)
		if err != nil {
			t.Fatal(err)
		}
		sends[i] = s
	}
	for b.Counters().Unexpected < n {
		if ctx.Err() != nil {
			t.Fatalf("%d of %d rendezvous records arrived", b.Counters().Unexpected, n)
		}
		time.Sleep(time.Millisecond)
	}
	recvs := make([]msglayer.Request, n)
	bufs := make([][]byte, n)
	for i := range n {
		bufs[i] = make([]byte, size)
		r, err := b.Irecv(uint64(i), ^uint64(0), [][]byte{bufs[i]}, nil)
		if err != nil {
			t.Fatal(err)
		}
		recvs[i] = r
	}
	go func() {
		for _, s := range sends {
			a.Wait(ctx, s)
		}
	}()
	for i, r := range recvs {
		st, err := b.Wait(ctx, r)
		if err != nil {
			t.Fatalf("receive %d: %v (%v)", i, err, st)
		}
		checkMessage(t, bufs[i], i, size)
	}
	if b.Counters().PullBudgetWaits == 0 {
		t.Error("no pull ever waited for the budget: the test does not test it")
	}
	if frames, starved := b.DebugPullBudget(); frames != 0 || starved != 0 {
		t.Errorf("after every pull ended: %d frames still counted in the budget, %d pulls waiting for it", frames, starved)
	}
	if c := b.Counters(); c.Pulls != n {
		t.Errorf("%d pulls, want %d", c.Pulls, n)
	}
}

// TestPullTimeoutUnderLoss pulls a stream of large messages over a link
// that loses 5 % of its frames. A block that lost a frame waits for its
// probe, so timing it would grow the pull timeout with every loss until
// each loss cost MaxRTO (the estimate once ran away past 1 s here, with
// MaxRTO at its default of 250 ms). It
// must stay near the time of a block that lost nothing.
func TestPullTimeoutUnderLoss(t *testing.T) {
	w := memWorld(t, xdp.MemConfig{Loss: 0.05, Seed: 5})
	const maxRTO = 2 * time.Second // room for a runaway to show
	a, b := w.pair(t, msglayer.Config{MaxRTO: maxRTO}, msglayer.Config{MaxRTO: maxRTO})
	ctx := ctxFor(t, 60*time.Second)
	const n, size = 30, 256 << 10
	buf := make([]byte, size)
	var worst time.Duration
	for i := range n {
		transfer(t, ctx, a, b, uint64(i), message(i, size), buf)
		checkMessage(t, buf, i, size)
		worst = max(worst, b.DebugPullTimeout(a.Addr()))
	}
	c := b.Counters()
	last := b.DebugPullTimeout(a.Addr())
	t.Logf("pull timeout at the end %v, at worst %v; %d probes, %d re-requests", last, worst, c.PullProbes, c.PullReRequests)
	if c.PullProbes+c.PullReRequests == 0 {
		t.Fatal("no frame was asked for again: the test did not exercise loss")
	}
	// A slow moment of the machine (the sender's goroutine not running)
	// lengthens blocks for real, and the estimate follows it; only a
	// timeout fed by the losses themselves stays up at the end.
	if limit := maxRTO / 4; last > limit {
		t.Errorf("pull timeout %v after 30 pulls at 5 %% loss, want at most %v", last, limit)
	}
}

// TestPullKeepsItsBudget pulls many 1 MiB messages at once: each needs 23
// blocks, 16 in flight, so two pulls take the whole budget. A pull keeps
// the frames its finished blocks free for its next ones, so only a few
// pulls are under way at any time and the messages finish one after the
// other. (Were the frames of every finished block handed to a waiting
// pull, every message would be under way at once, a block each, and all
// would finish together at the end.)
func TestPullKeepsItsBudget(t *testing.T) {
	w := memWorld(t, xdp.MemConfig{})
	a, b := w.pair(t, msglayer.Config{}, msglayer.Config{})
	ctx := ctxFor(t, 60*time.Second)
	const n, size = 16, 1 << 20
	for i := range n {
		s, err := a.Isend(b.Addr(), uint64(i), [][]byte{message(i, size)}, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer a.Forget(s)
	}
	most := 0
	receiveUnexpected(ctx, t, b, n, size, func() { most = max(most, b.DebugPullsUnderWay()+1) })
	if most > 6 {
		t.Errorf("up to %d of %d pulls under way at once, want at most 6 (two hold the budget, and the next start as one runs out of blocks to ask for)", most, n)
	}
}

// receiveUnexpected waits until n rendezvous records of size bytes
// (match info 0..n-1, the payload of message(i, size)) wait unexpected at
// b, posts a receive for each, and checks every payload as its receive
// completes, calling after each.
func receiveUnexpected(ctx context.Context, t *testing.T, b *msglayer.Endpoint, n, size int, after func()) {
	t.Helper()
	for b.Counters().Unexpected < uint64(n) {
		if ctx.Err() != nil {
			t.Fatalf("%d of %d rendezvous records arrived", b.Counters().Unexpected, n)
		}
		time.Sleep(time.Millisecond)
	}
	bufs := make([][]byte, n)
	for i := range n {
		bufs[i] = make([]byte, size)
		if _, err := b.Irecv(uint64(i), ^uint64(0), [][]byte{bufs[i]}, nil); err != nil {
			t.Fatal(err)
		}
	}
	for done := 0; done < n; done++ {
		st, err := b.WaitAny(ctx, 0, 0)
		if err != nil {
			t.Fatalf("after %d receives: %v", done, err)
		}
		i := int(st.Match)
		if st.Code != msglayer.Success || i >= n {
			t.Fatalf("receive %d completed with %+v", i, st)
		}
		checkMessage(t, bufs[i], i, size)
		after()
	}
}

// TestPickStarved checks the choice of the pull that gets the budget
// next, in both lists (under way and not started): of two taken at
// random, the one whose host has fewer frames asked for and not received;
// the first on a tie.
func TestPickStarved(t *testing.T) {
	for _, c := range []struct {
		frames, draws []int
		want          int
	}{
		{[]int{96, 0}, []int{0, 1}, 1},
		{[]int{0, 96}, []int{0, 1}, 0},
		{[]int{64, 64}, []int{1, 0}, 1},
		{[]int{32, 160, 0}, []int{1, 1}, 1},
		{[]int{32, 160, 0}, []int{1, 2}, 2},
	} {
		for k := range 2 {
			if got := msglayer.PickStarved(k, c.frames, c.draws); got != c.want {
				t.Errorf("list %d, frames asked per host %v, draws %v: picked host %d, want %d", k, c.frames, c.draws, got, c.want)
			}
		}
	}
}

// TestPullsFromSeveralHosts pulls rendezvous messages from two sender
// hosts at once: every payload arrives whole, and the engine's count of
// the frames asked of each host comes back to nothing.
func TestPullsFromSeveralHosts(t *testing.T) {
	hub := xdp.NewHub(xdp.MemConfig{})
	var eps [3]*msglayer.Endpoint
	for i := range eps {
		l := hub.Attach()
		t.Cleanup(func() { l.Close() })
		eps[i] = openEP(t, msglayer.Config{Link: l, EndpointID: uint8(i + 1), Key: 7})
	}
	b, senders := eps[0], eps[1:]
	ctx := ctxFor(t, 60*time.Second)
	const per, size = 6, 1 << 20
	for _, s := range senders {
		if err := s.Connect(ctx, b.Addr(), 7); err != nil {
			t.Fatal(err)
		}
	}
	for h, s := range senders {
		for i := range per {
			m := h*per + i
			r, err := s.Isend(b.Addr(), uint64(m), [][]byte{message(m, size)}, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Forget(r)
		}
	}
	receiveUnexpected(ctx, t, b, 2*per, size, func() {})
	if left := b.DebugHostFrames(); len(left) != 0 {
		t.Errorf("frames asked of hosts still counted after every pull ended: %v", left)
	}
}

// dupReplyLink is an in-memory link that receives every pull reply twice.
type dupReplyLink struct{ *xdp.MemLink }

type dupReplyVisitor struct{ v xdp.Visitor }

func (d dupReplyVisitor) Visit(f []byte) {
	d.v.Visit(f)
	if _, ok := msglayer.PullReplyFrame(f); ok {
		d.v.Visit(f)
	}
}

func (l *dupReplyLink) RecvVisit(max int, timeout time.Duration, v xdp.Visitor) (int, error) {
	return l.MemLink.RecvVisit(max, timeout, dupReplyVisitor{v})
}

// TestLateRepliesCounted: every copy of a pull reply after the first is
// counted late, also when the block it belongs to completed meanwhile
// (such copies used to go uncounted, but for the last block's).
func TestLateRepliesCounted(t *testing.T) {
	w := memWorldOf(t, xdp.MemConfig{}, func(l *xdp.MemLink) xdp.Link { return &dupReplyLink{l} })
	a, b := w.pair(t, msglayer.Config{}, msglayer.Config{})
	ctx := ctxFor(t, 10*time.Second)
	data, got := message(1, 1<<20), make([]byte, 1<<20)
	transfer(t, ctx, a, b, 1, data, got)
	checkMessage(t, got, 1, 1<<20)
	ca, cb := a.Counters(), b.Counters()
	if cb.PullRepliesLate != ca.PullReplies || cb.BadFrames != 0 {
		t.Errorf("%d pull replies sent, each received twice: %d counted late, %d bad; want %d late, 0 bad",
			ca.PullReplies, cb.PullRepliesLate, cb.BadFrames, ca.PullReplies)
	}
}
