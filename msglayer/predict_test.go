package msglayer

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/xmx-stack/xmx/xdp"
)

// TestPredictionChangesNothing runs scripts of the endpoint fuzzer
// (FuzzEndpointFrames) twice, with header prediction (predictEager) and
// with every frame taking the general path: the frames each side sends,
// byte for byte and in order, the statuses of the requests and the
// counters (Predicted aside) must be the same. The scripts are the
// fuzzer's seeds and corpus, conversations of small messages back and
// forth with losses, and random ones.
func TestPredictionChangesNothing(t *testing.T) {
	capture(t)
	scripts := [][]byte{seedScript2}
	scripts = append(scripts, handSeeds()...)
	scripts = append(scripts, corpusScripts(t, "FuzzEndpointFrames")...)
	rng := rand.New(rand.NewPCG(7, 11))
	for range 100 {
		scripts = append(scripts, chatScript(rng))
	}
	for range 40 {
		s := make([]byte, 8+rng.IntN(300))
		for i := range s {
			s[i] = byte(rng.Uint32())
		}
		scripts = append(scripts, s)
	}
	var predicted uint64
	for i, s := range scripts {
		general := observeScript(t, s, true)
		pred := observeScript(t, s, false)
		predicted += pred.predicted
		if general.predicted != 0 {
			t.Fatalf("script %d: %d frames predicted with prediction off", i, general.predicted)
		}
		if d := general.diff(pred); d != "" {
			t.Fatalf("script %d (% x): with prediction, %s", i, s, d)
		}
	}
	if predicted < 100 {
		t.Fatalf("only %d frames predicted in %d scripts: the test does not exercise prediction", predicted, len(scripts))
	}
	t.Logf("%d scripts, %d frames predicted", len(scripts), predicted)
}

// chatScript is a conversation of small messages (tiny and one-frame
// eager, some synchronous, some of three frames) back and forth, with
// receives posted before and after, floods that fill the unexpected
// queue, losses, pumps, ticks, and forged eager frames aimed at the
// conversation: in sequence or not, of a stale session or an unknown
// endpoint, the first fragment of a message never finished.
func chatScript(rng *rand.Rand) []byte {
	s := []byte{byte(rng.IntN(16))}
	small := func() byte {
		// Sizes 0-1 of fuzzSizes are one frame (size 2, three frames,
		// now and then); matches 0-3 are those receives of masks 0-1
		// take.
		x := byte(rng.IntN(2)<<3 | rng.IntN(4))
		if rng.IntN(8) == 0 {
			x = 2<<3 | x&7
		}
		return x
	}
	for range 20 + rng.IntN(150) {
		switch k := rng.IntN(14); {
		case k < 3:
			s = append(s, fopRecvB, small()|byte(rng.IntN(2))<<6)
		case k < 5:
			s = append(s, fopRecvA, small()|byte(rng.IntN(2))<<6)
		case k < 7:
			s = append(s, fopSendAB, small()|byte(b2u(rng.IntN(8) == 0))<<5)
		case k < 8:
			s = append(s, fopSendBA, small()|byte(b2u(rng.IntN(8) == 0))<<5)
		case k < 9:
			for range rng.IntN(50) {
				s = append(s, fopSendAB, small())
			}
		case k < 10:
			s = append(s, fopPump, 0)
		case k < 11:
			corrupt := [...]byte{0, 0, 0, 0x20, 1, 2, 4, 0x40}
			seqOff := [...]int8{0, 0, 0, 1, -1, 2}
			fix := byte(1 | rng.IntN(8)<<1 | (1+rng.IntN(3))<<4)
			n := [...]int{0, 8, 100}[rng.IntN(3)]
			s = append(s, forgeOp(rng.IntN(3) != 0, tEager, corrupt[rng.IntN(len(corrupt))], seqOff[rng.IntN(len(seqOff))], fix, n)...)
		case k < 12:
			s = append(s, fopCancel, byte(rng.IntN(2)))
		default:
			if rng.IntN(3) == 0 {
				s = append(s, fopLoss, byte(rng.IntN(16)))
			} else {
				s = append(s, fopTick, byte(rng.IntN(4)))
			}
		}
	}
	return s
}

// corpusScripts reads the fuzzer's corpus for fuzz test name.
func corpusScripts(t *testing.T, name string) [][]byte {
	files, err := filepath.Glob(filepath.Join("testdata", "fuzz", name, "*"))
	if err != nil {
		t.Fatal(err)
	}
	var out [][]byte
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		_, v, ok := strings.Cut(strings.TrimSpace(string(b)), "\n[]byte(")
		if !ok {
			t.Fatalf("%s: not a []byte corpus file", f)
		}
		s, err := strconv.Unquote(strings.TrimSuffix(v, ")"))
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		out = append(out, []byte(s))
	}
	return out
}

// scriptRun is what a script's run showed.
type scriptRun struct {
	sentA, sentB [][]byte
	statuses     []Status
	countersA    Counters
	countersB    Counters
	predicted    uint64
}

// observeScript runs script s (runScript) and records what it showed.
func observeScript(t *testing.T, s []byte, noPredict bool) scriptRun {
	fp := runScript(t, s, true, noPredict)
	var o scriptRun
	for _, rf := range fp.la.sent {
		o.sentA = append(o.sentA, rf.frame)
	}
	for _, rf := range fp.lb.sent {
		o.sentB = append(o.sentB, rf.frame)
	}
	for _, q := range fp.reqs {
		st, _, _ := q.e.Test(q.h)
		st.Context = nil
		o.statuses = append(o.statuses, st)
	}
	o.countersA, o.countersB = fp.a.Counters(), fp.b.Counters()
	o.predicted = o.countersA.Predicted + o.countersB.Predicted
	o.countersA.Predicted, o.countersB.Predicted = 0, 0
	return o
}

// diff describes how run x differs from o, or returns "".
func (o *scriptRun) diff(x scriptRun) string {
	frames := func(side string, a, b [][]byte) string {
		for i := range min(len(a), len(b)) {
			if !bytes.Equal(a[i], b[i]) {
				return fmt.Sprintf("%s's frame %d is\n% x\nnot\n% x", side, i, b[i], a[i])
			}
		}
		if len(a) != len(b) {
			return fmt.Sprintf("%s sent %d frames, not %d", side, len(b), len(a))
		}
		return ""
	}
	if d := frames("A", o.sentA, x.sentA); d != "" {
		return d
	}
	if d := frames("B", o.sentB, x.sentB); d != "" {
		return d
	}
	if !reflect.DeepEqual(o.statuses, x.statuses) {
		return fmt.Sprintf("statuses\n%+v\nnot\n%+v", x.statuses, o.statuses)
	}
	if o.countersA != x.countersA {
		return fmt.Sprintf("A's counters\n%+v\nnot\n%+v", x.countersA, o.countersA)
	}
	if o.countersB != x.countersB {
		return fmt.Sprintf("B's counters\n%+v\nnot\n%+v", x.countersB, o.countersB)
	}
	return ""
}

// TestPredictionDeclines checks that predictEager declines, changing
// nothing, every frame or state it must leave to the general path, and
// takes the one it is for: the next message, whole in one frame, from
// the peer last heard, for a posted receive.
func TestPredictionDeclines(t *testing.T) {
	fp := newFuzzPair(t, 0, true, false)
	a, b := fp.a, fp.b
	// A message exchanged both ways makes each the other's last peer.
	fp.exchange(a, b, 1)
	fp.exchange(b, a, 2)
	buf := make([]byte, 64)
	rh, err := b.Irecv(7, ^uint64(0), [][]byte{buf}, nil)
	if err != nil {
		t.Fatal(err)
	}
	// The frame A sends is recorded and lost: B never sees it but here.
	fp.la.lose(0)
	sent := len(fp.la.sent)
	msg := []byte("predicted")
	if _, err := a.Isend(b.addr, 7, [][]byte{msg}, nil); err != nil {
		t.Fatal(err)
	}
	if len(fp.la.sent) != sent+1 {
		t.Fatalf("A sent %d frames, not 1", len(fp.la.sent)-sent)
	}
	frame := fp.la.sent[sent].frame
	g := b.eng
	p := b.peers[a.addr]
	be := binary.BigEndian
	frameCases := []struct {
		name   string
		mutate func(f []byte) []byte
	}{
		{"another EtherType", func(f []byte) []byte { be.PutUint16(f[12:], 0x0800); return f }},
		{"from a group address", func(f []byte) []byte { f[6] |= 1; return f }},
		{"to another station", func(f []byte) []byte { f[5] ^= 0x10; return f }},
		{"to the broadcast address", func(f []byte) []byte { copy(f, broadcastMAC[:]); return f }},
		{"another version", func(f []byte) []byte { f[xdp.EthHeaderLen]++; return f }},
		{"a rendezvous record", func(f []byte) []byte { f[xdp.EthHeaderLen+1] = byte(tRndv); return f }},
		{"to another endpoint", func(f []byte) []byte { f[xdp.EthHeaderLen+2]++; return f }},
		{"from another endpoint", func(f []byte) []byte { f[xdp.EthHeaderLen+3]++; return f }},
		{"to another session", func(f []byte) []byte { f[xdp.EthHeaderLen+7] ^= 1; return f }},
		{"from another session", func(f []byte) []byte { f[xdp.EthHeaderLen+11] ^= 1; return f }},
		{"ahead of sequence", func(f []byte) []byte { f[xdp.EthHeaderLen+15]++; return f }},
		{"a duplicate", func(f []byte) []byte { f[xdp.EthHeaderLen+15]--; return f }},
		{"a payload beyond the frame", func(f []byte) []byte {
			// The message as long as the payload said: only the frame's
			// length gives it away.
			be.PutUint16(f[xdp.EthHeaderLen+22:], uint16(len(f)))
			be.PutUint32(f[hdrLen+8:], uint32(len(f)))
			return f
		}},
		{"cut short", func(f []byte) []byte { return f[:hdrLen+eagerHdrLen-1] }},
		{"the first fragment of a longer message", func(f []byte) []byte { be.PutUint32(f[hdrLen+8:], 100); return f }},
		{"a later fragment", func(f []byte) []byte { be.PutUint32(f[hdrLen+8:], 100); be.PutUint32(f[hdrLen+12:], 50); return f }},
		{"for no posted receive", func(f []byte) []byte { f[hdrLen+7] = 8; return f }},
	}
	stateCases := []struct {
		name string
		set  func(on bool)
	}{
		{"the endpoint closed", func(on bool) { b.closed = on }},
		{"the last peer another", func(on bool) {
			if on {
				b.lastPeer = nil
			} else {
				b.lastPeer = p
			}
		}},
		{"the peer not connected", func(on bool) { p.connected = !on }},
		{"frames held out of order", func(on bool) { p.oooCount = int(b2u(on)) }},
		{"a message being reassembled", func(on bool) { p.in.active = on }},
		{"a refused message being converted", func(on bool) { p.refused = on }},
	}
	// What taking a frame changes, but the counters.
	state := func() string {
		return fmt.Sprintf("heard %d rwnd %d expected %d acked %d ack pending %d due %d lazy %v queued %v, ackq %d, acksDue %d, posted %v",
			p.lastHeard, p.rwnd, p.expected, p.acked, p.ackPending, p.ackDue, p.ackLazy, p.inAcksDue,
			len(g.ackq), len(b.acksDue), b.match.firstRecv() != nil)
	}
	declines := func(name string, f []byte) {
		t.Helper()
		before, stateBefore := b.stats, state()
		if g.predictEager(f, fp.clock.Now()) {
			t.Fatalf("%s: predicted", name)
		}
		if b.stats != before || state() != stateBefore {
			t.Fatalf("%s: declined, but changed the counters or the state:\n%+v\n%s\nnot\n%+v\n%s", name,
				b.stats, state(), before, stateBefore)
		}
	}
	// The checks run under the engine lock, which a failure must release
	// (the cleanup closes the endpoints).
	var ok bool
	var before Counters
	func() {
		g.mu.Lock()
		defer g.mu.Unlock()
		if b.lastPeer != p {
			t.Fatal("A is not B's last peer")
		}
		for _, c := range frameCases {
			declines(c.name, c.mutate(bytes.Clone(frame)))
		}
		for _, c := range stateCases {
			c.set(true)
			declines(c.name, frame)
			c.set(false)
		}
		before = b.stats
		ok = g.predictEager(frame, fp.clock.Now())
	}()
	if !ok {
		t.Fatal("the next message from the last peer, for a posted receive, not predicted")
	}
	if d := b.stats.Predicted - before.Predicted; d != 1 {
		t.Fatalf("Predicted went up by %d", d)
	}
	st, done, err := b.Test(rh)
	if err != nil || !done || st.Code != Success || st.XferLen != len(msg) || !bytes.Equal(buf[:st.XferLen], msg) {
		t.Fatalf("receive: %+v done %v err %v data %q", st, done, err, buf[:st.XferLen])
	}
	// The ack goes out as after the general path, and the pair is in step.
	fp.la.mu.Lock()
	clear(fp.la.drop)
	fp.la.mu.Unlock()
	fp.pump()
	fp.exchange(a, b, 3)
	fp.exchange(b, a, 4)
}
