package linktest

// Subtests of xdp.TailSender: frames whose tails the link reads from the
// caller's memory during the send. Skipped on links that lack the
// interface.

import (
	"errors"
	"testing"
	"time"

	"github.com/xmx-stack/xmx/xdp"
)

// tailer sends frames whose whole bytes are in whole[i]: the first head[i]
// bytes built as the head, the rest from tails[i], the caller's memory.
// With panicAt >= 0, Tail panics on that frame.
type tailer struct {
	whole, tails [][]byte
	head         []int
	panicAt      int
	calls        int
}

func (t *tailer) Tail(i int, head []byte) (int, []byte) {
	t.calls++
	if i == t.panicAt {
		panic("tailer: panicking as told")
	}
	return copy(head, t.whole[i][:t.head[i]]), t.tails[i]
}

// testTails sends frames of every size split into a head and a tail at
// varying points, scribbles over the tails once SendTails has returned (the
// link must have read them by then), and checks each frame arrives whole
// and intact; then that plain sends after tailed ones carry no stale tail,
// that a panicking Tailer leaves the link usable, and the refusals.
func testTails(t *testing.T, mk MakePair, opts Options) {
	p := mk(t)
	at, ok := p.A.(xdp.TailSender)
	bv, okv := p.B.(xdp.FrameVisitor)
	if !ok || !okv {
		t.Skipf("%s does not implement xdp.TailSender", p.A.Info().Kind)
	}
	maxLen := xdp.MaxFrameLen(p.A)
	const batch = 8
	const run = 40
	src, dst := p.A.HardwareAddr(), p.B.HardwareAddr()
	tl := &tailer{whole: make([][]byte, batch), tails: make([][]byte, batch), head: make([]int, batch), panicAt: -1}
	for i := range tl.whole {
		tl.whole[i] = make([]byte, maxLen)
	}
	sent, got := 0, 0
	splitFrames(maxLen, batch, func(n int, seq uint64, size, head int) {
		f := frame(tl.whole[n], dst, src, run, seq, size)
		tl.head[n], tl.tails[n] = head, nil
		if head < size {
			tl.tails[n] = append([]byte(nil), f[head:]...)
		}
	}, func(n int) {
		if k, err := at.SendTails(n, tl); k != n || err != nil {
			t.Fatalf("SendTails(%d) = %d, %v", n, k, err)
		}
		for _, tail := range tl.tails[:n] {
			for j := range tail {
				tail[j] = 0xee
			}
		}
		sent += n
		seqs := collect(t, p.B, bv, src, run, n, 2*time.Second)
		got += len(seqs)
		if !opts.Faults && len(seqs) != n {
			t.Fatalf("batch of %d tailed frames: received %d intact (%v)", n, len(seqs), seqs)
		}
	})
	t.Logf("%d tailed frames of %d..%d bytes sent, %d received intact", sent, xdp.MinFrameLen, maxLen, got)

	// A plain Send right after a batch of tailed frames: each frame is
	// its own bytes, nothing of an earlier tail.
	// plainBatch sends batch plain frames of size bytes from A, after
	// what, and checks they arrive whole at B.
	plainBatch := func(t *testing.T, run uint32, size int, after string) {
		t.Helper()
		plain := make([][]byte, batch)
		for i := range plain {
			plain[i] = frame(make([]byte, size), dst, src, run, uint64(i), size)
		}
		if k, err := p.A.Send(plain); k != batch || err != nil {
			t.Fatalf("Send(%d) after %s = %d, %v", batch, after, k, err)
		}
		seqs := collect(t, p.B, bv, src, run, batch, 2*time.Second)
		if !opts.Faults && len(seqs) != batch {
			t.Fatalf("%d plain frames after %s: received %d intact (%v)", batch, after, len(seqs), seqs)
		}
	}
	t.Run("SendAfterTails", func(t *testing.T) { plainBatch(t, run+1, 100, "tailed ones") })

	// A Tailer that panics: the panic reaches the caller, and the link
	// still sends plain frames whole.
	t.Run("PanickingTailer", func(t *testing.T) {
		big := maxLen / 2
		for i := range batch {
			frame(tl.whole[i], dst, src, run+2, uint64(i), big)
			tl.head[i], tl.tails[i] = xdp.EthHeaderLen+30, tl.whole[i][xdp.EthHeaderLen+30:big]
		}
		tl.panicAt = 3
		func() {
			defer func() {
				if recover() == nil {
					t.Fatal("SendTails with a panicking Tailer returned")
				}
			}()
			at.SendTails(batch, tl)
		}()
		tl.panicAt = -1
		collect(t, p.B, bv, src, run+2, 0, 100*time.Millisecond) // whatever left before the panic
		plainBatch(t, run+3, 80, "the panic")
	})

	// Refusals: the frames before the bad one go out, the call stops there.
	t.Run("Refusals", func(t *testing.T) {
		for _, c := range []struct {
			name       string
			head, tail int
			want       error
		}{
			{"TooLong", xdp.EthHeaderLen + 10, maxLen - xdp.EthHeaderLen - 9, xdp.ErrFrameTooLong},
			{"HeadTooShort", xdp.EthHeaderLen - 1, 100, xdp.ErrFrameTooShort},
		} {
			t.Run(c.name, func(t *testing.T) {
				for i := range 3 {
					frame(tl.whole[i], dst, src, run+4, uint64(i), 100)
					tl.head[i], tl.tails[i] = 60, tl.whole[i][60:100]
				}
				tl.head[1], tl.tails[1] = c.head, make([]byte, c.tail)
				tl.calls = 0
				before := p.A.Stats()
				k, err := at.SendTails(3, tl)
				if k != 1 || !errors.Is(err, c.want) {
					t.Fatalf("SendTails with frame 1 of %d+%d bytes = %d, %v; want 1, %v", c.head, c.tail, k, err, c.want)
				}
				if tl.calls != 2 {
					t.Errorf("Tail called %d times, want 2", tl.calls)
				}
				after := p.A.Stats()
				if after.TxFrames-before.TxFrames != 1 || after.TxBytes-before.TxBytes != 100 {
					t.Errorf("counted %d frames, %d bytes sent; want 1, 100", after.TxFrames-before.TxFrames, after.TxBytes-before.TxBytes)
				}
				collect(t, p.B, bv, src, run+4, 1, 200*time.Millisecond)
			})
		}
		if k, err := at.SendTails(1, nil); k != 0 || err == nil {
			t.Errorf("SendTails with a nil Tailer = %d, %v; want an error", k, err)
		}
		if k, err := at.SendTails(0, tl); k != 0 || err != nil {
			t.Errorf("SendTails(0) = %d, %v; want 0, nil", k, err)
		}
	})
	closeAll(t, p)
}

// splitFrames walks the frame sizes from MinFrameLen to maxLen in batches
// of up to batch frames, each split into a head and a tail at a varying
// point, from a bare Ethernet header to the whole frame (every fourth
// frame has no tail). It calls each(n, seq, size, head) for the n-th frame
// of a batch, then send(n) for the batch.
func splitFrames(maxLen, batch int, each func(n int, seq uint64, size, head int), send func(n int)) {
	var seq uint64
	for size := xdp.MinFrameLen; size <= maxLen; {
		n := 0
		for ; n < batch && size <= maxLen; n++ {
			seq++
			head := xdp.EthHeaderLen + int(seq*53)%(size-xdp.EthHeaderLen)
			if seq%4 == 0 {
				head = size
			}
			each(n, seq-1, size, head)
			size += 1 + int(seq*7919)%97
		}
		send(n)
	}
}
