package msglayer

import (
	"testing"
	"time"
)

// The tests of this file lose chosen frames of a pull on a manual clock,
// so that what finds a loss, and when, is exact.

// pullLossNet is a manNet in which a sends b a rendezvous message of size
// bytes (above the rendezvous threshold), pulled blocks blocks at a
// time, its receive posted first.
type pullLossNet struct {
	*manNet
	send, recv Request
	copies     map[uint32]int // copies of each pull reply (by offset) a sent
}

func newPullLossNet(t *testing.T, size, blocks int) *pullLossNet {
	slow := 10 * time.Millisecond
	n := &pullLossNet{
		manNet: newManNetCfg(t, Config{}, Config{PullBlocks: blocks, InitialRTO: slow, MinRTO: slow}),
		copies: map[uint32]int{},
	}
	n.recv, _ = n.b.Irecv(1, ^uint64(0), [][]byte{make([]byte, size)}, nil)
	var err error
	if n.send, err = n.a.Isend(n.b.Addr(), 1, [][]byte{make([]byte, size)}, nil); err != nil {
		t.Fatal(err)
	}
	return n
}

// move moves frames both ways until none moves, without time passing;
// lose chooses the pull replies from a that are lost, by their offset and
// how many copies of it a sent before.
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
			}
			n.deliver(n.b, f)
		}
		for _, f := range fb {
			n.deliver(n.a, f)
		}
	}
	n.t.Fatal("frames keep moving")
}

// frameBytes is the data of one pull reply from a to b.
func (n *pullLossNet) frameBytes() uint32 {
	n.b.eng.mu.Lock()
	defer n.b.eng.mu.Unlock()
	return uint32(n.b.peers[n.a.Addr()].pullPayload())
}

// TestPullLastFrameFindsLoss: frames lost from a block's middle are found
// when the last frame its request asked for arrives (the sender answers
// in order), and asked for again at once, without waiting for a probe.
func TestPullLastFrameFindsLoss(t *testing.T) {
	n := newPullLossNet(t, 40000, 1)
	fb := n.frameBytes()
	n.move(func(off uint32, copies int) bool {
		return copies == 0 && (off == 3*fb || off == 9*fb)
	})
	mustComplete(t, n.b, n.recv, Success, "receive, no time passing")
	if c := n.b.Counters(); c.PullProbes != 0 || c.PullReRequests != 1 {
		t.Errorf("%d probes, %d re-requests: want the two holes asked for once, with no probe", c.PullProbes, c.PullReRequests)
	}
	n.settle(5, time.Millisecond)
	mustComplete(t, n.a, n.send, Success, "send")
}

// TestPullLaterRequestFindsLoss: frames lost from a block's tail, where
// nothing of its own request follows them, are found when a reply to a
// request sent after it arrives: the other block's, asked for in the same
// instant.
func TestPullLaterRequestFindsLoss(t *testing.T) {
	n := newPullLossNet(t, 80000, 2)
	fb := n.frameBytes()
	n.move(func(off uint32, copies int) bool {
		return copies == 0 && (off == 4*fb || off == 31*fb)
	})
	mustComplete(t, n.b, n.recv, Success, "receive, no time passing")
	if c := n.b.Counters(); c.PullProbes != 0 || c.PullReRequests != 1 {
		t.Errorf("%d probes, %d re-requests: want the first block's holes asked for once, with no probe", c.PullProbes, c.PullReRequests)
	}
}
