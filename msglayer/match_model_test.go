package msglayer

import (
	"fmt"
	"slices"
	"testing"
)

// Model-based fuzzing of the matcher: the fuzz input is decoded into a
// sequence of operations applied both to the real matcher (intrusive lists
// of *request and *unexp) and to a naive model (two slices scanned in
// order). After every operation the two must agree on what matched, on
// the queue lengths and on the order of both lists, walked forward and
// backward.

// Small alphabets, so that matches are frequent.
var (
	modelMatches = [...]uint64{0, 1, 2, 3, 0x10, 0x11, 0xff, ^uint64(0)}
	modelMasks   = [...]uint64{^uint64(0), 0, 1, 0x0f, 0xf0, 0x11, 0xff, 0x8000000000000000}
)

// matcherModel is the reference: posted receives and unexpected messages
// in arrival order.
type matcherModel struct {
	recvs []*request
	unexp []*unexp
}

func (m *matcherModel) arrive(match uint64) *request {
	for i, r := range m.recvs {
		if match&r.mask == r.info {
			m.recvs = slices.Delete(m.recvs, i, i+1)
			return r
		}
	}
	return nil
}

func (m *matcherModel) probe(info, mask uint64) int {
	for i, u := range m.unexp {
		if u.match&mask == info {
			return i
		}
	}
	return -1
}

func (m *matcherModel) post(info, mask uint64) *unexp {
	i := m.probe(info, mask)
	if i < 0 {
		return nil
	}
	u := m.unexp[i]
	m.unexp = slices.Delete(m.unexp, i, i+1)
	return u
}

func (m *matcherModel) removeRecv(r *request) {
	if i := slices.Index(m.recvs, r); i >= 0 {
		m.recvs = slices.Delete(m.recvs, i, i+1)
	}
}

// Operations.
const (
	mopPost      = iota // post a receive (takes an unexpected message or queues)
	mopArrive           // a message arrives (takes a receive or becomes unexpected)
	mopCancel           // cancel a receive (queued or not)
	mopProbe            // probe the unexpected queue
	mopTakeUnexp        // remove one unexpected message (the engine does so via post)
	mopN
)

func FuzzMatcher(f *testing.F) {
	f.Add([]byte{})
	f.Add([]byte{mopPost, 0x00, mopArrive, 0x00, mopArrive, 0x01, mopPost, 0x09, mopProbe, 0x08})
	f.Add([]byte{mopArrive, 1, mopArrive, 2, mopArrive, 1, mopPost, 0x0a, mopPost, 0x0a, mopPost, 0x0a, mopPost, 0x08})
	f.Add([]byte{mopPost, 0x01, mopPost, 0x02, mopPost, 0x03, mopCancel, 1, mopCancel, 0, mopArrive, 3, mopCancel, 2, mopArrive, 1})
	f.Add([]byte{mopArrive, 7, mopArrive, 6, mopTakeUnexp, 1, mopTakeUnexp, 0, mopPost, 0x38, mopArrive, 4, mopPost, 0x3c})
	f.Add([]byte{0x05, mopArrive, 1, mopArrive, 0x11, mopPost, 0x39, mopProbe, 0x0b, mopPost, 0x09})
	f.Fuzz(func(t *testing.T, data []byte) {
		var q matcher
		var m matcherModel
		// The first byte chooses the context ids: 0, 1 or 2 bits, at bit
		// 0 or 4. The model knows nothing of contexts: receives name
		// theirs exactly, so per-context queues must behave as one.
		if len(data) > 0 && len(data)%2 == 1 {
			q.init(uint(data[0]%3), uint(data[0]>>2&1)*4)
			data = data[1:]
		} else {
			q.init(0, 0)
		}
		var all []*request // every receive ever posted, queued or not
		var log []string
		fail := func(format string, args ...any) {
			t.Helper()
			t.Fatalf("after %v: %s", log, fmt.Sprintf(format, args...))
		}
		for i := 0; i+1 < len(data) && i < 4096; i += 2 {
			op, arg := data[i]%mopN, data[i+1]
			switch op {
			case mopPost:
				mask := modelMasks[arg>>3&7]
				info := modelMatches[arg&7] & mask // the API rejects info&^mask != 0
				if mask&q.ctxBits() != q.ctxBits() {
					continue // the API rejects a receive that wildcards its context
				}
				log = append(log, fmt.Sprintf("post(%#x,%#x)", info, mask))
				r := &request{requestState: requestState{kind: kindRecv, info: info, mask: mask}}
				all = append(all, r)
				got, want := q.post(info, mask), m.post(info, mask)
				if got != want {
					fail("post took %p (%+v), model %p (%+v)", got, got, want, want)
				}
				if got == nil {
					q.pushRecv(r)
					m.recvs = append(m.recvs, r)
				} else if got.prev != nil || got.next != nil {
					fail("unexpected message taken but still linked")
				}
			case mopArrive:
				match := modelMatches[arg&7]
				log = append(log, fmt.Sprintf("arrive(%#x)", match))
				got, want := q.arrive(match), m.arrive(match)
				if got != want {
					fail("message %#x took receive %p, model %p", match, got, want)
				}
				if got == nil {
					u := &unexp{match: match}
					q.pushUnexp(u)
					m.unexp = append(m.unexp, u)
				} else if got.queued || got.rprev != nil || got.rnext != nil {
					fail("receive taken but still marked queued or linked")
				}
			case mopCancel:
				if len(all) == 0 {
					continue
				}
				r := all[int(arg)%len(all)]
				log = append(log, fmt.Sprintf("cancel(#%d queued=%v)", int(arg)%len(all), r.queued))
				q.removeRecv(r) // a no-op for a receive no longer queued
				m.removeRecv(r)
			case mopProbe:
				mask := modelMasks[arg>>3&7]
				info := modelMatches[arg&7] & mask
				log = append(log, fmt.Sprintf("probe(%#x,%#x)", info, mask))
				got := q.probe(info, mask)
				var want *unexp
				if i := m.probe(info, mask); i >= 0 {
					want = m.unexp[i]
				}
				if got != want {
					fail("probe found %p, model %p", got, want)
				}
			case mopTakeUnexp:
				if len(m.unexp) == 0 {
					continue
				}
				k := int(arg) % len(m.unexp)
				log = append(log, fmt.Sprintf("take(#%d)", k))
				u := m.unexp[k]
				m.unexp = slices.Delete(m.unexp, k, k+1)
				q.removeUnexp(u)
			}
			checkMatcher(t, &q, &m, all, log)
		}
	})
}

// checkMatcher compares the real matcher with the model.
func checkMatcher(t *testing.T, q *matcher, m *matcherModel, all []*request, log []string) {
	t.Helper()
	fail := func(format string, args ...any) {
		t.Helper()
		t.Fatalf("after %v: %s", log, fmt.Sprintf(format, args...))
	}
	if q.nRecvs != len(m.recvs) || q.nUnexp != len(m.unexp) {
		fail("nRecvs %d nUnexp %d, model %d %d", q.nRecvs, q.nUnexp, len(m.recvs), len(m.unexp))
	}
	for c := range q.queues {
		cq := &q.queues[c]
		inCtx := func(m uint64) bool { return q.of(m) == cq }
		var recvs []*request
		for _, r := range m.recvs {
			if inCtx(r.info) {
				recvs = append(recvs, r)
			}
		}
		var unexps []*unexp
		for _, u := range m.unexp {
			if inCtx(u.match) {
				unexps = append(unexps, u)
			}
		}
		checkQueue(fail, c, cq, recvs, unexps)
	}
	for _, r := range all {
		if want := slices.Contains(m.recvs, r); r.queued != want {
			fail("receive %p queued=%v, model %v", r, r.queued, want)
		} else if !want && (r.rprev != nil || r.rnext != nil) {
			fail("receive %p not queued but linked", r)
		}
	}
}

// checkQueue compares context c's lists with the model's (those of the
// model's receives and messages that belong to the context, in order).
func checkQueue(fail func(string, ...any), c int, q *ctxQueue, recvs []*request, unexps []*unexp) {
	// Receives, forward then backward; the walks are bounded so that a
	// cycle fails instead of hanging.
	var fw []*request
	var prev *request
	for r := q.recvHead; r != nil && len(fw) <= len(recvs); r = r.rnext {
		if r.rprev != prev {
			fail("context %d receive %d: rprev %p, want %p", c, len(fw), r.rprev, prev)
		}
		fw = append(fw, r)
		prev = r
	}
	if !slices.Equal(fw, recvs) {
		fail("context %d receive list forward %p, model %p", c, fw, recvs)
	}
	if q.recvTail != prev {
		fail("context %d recvTail %p, last element %p", c, q.recvTail, prev)
	}
	var bw []*request
	for r := q.recvTail; r != nil && len(bw) <= len(recvs); r = r.rprev {
		bw = append(bw, r)
	}
	slices.Reverse(bw)
	if !slices.Equal(bw, recvs) {
		fail("context %d receive list backward %p, model %p", c, bw, recvs)
	}
	// Unexpected messages.
	var ufw []*unexp
	var uprev *unexp
	for u := q.unexpHead; u != nil && len(ufw) <= len(unexps); u = u.next {
		if u.prev != uprev {
			fail("context %d unexpected %d: prev %p, want %p", c, len(ufw), u.prev, uprev)
		}
		ufw = append(ufw, u)
		uprev = u
	}
	if !slices.Equal(ufw, unexps) {
		fail("context %d unexpected list forward %p, model %p", c, ufw, unexps)
	}
	if q.unexpTail != uprev {
		fail("context %d unexpTail %p, last element %p", c, q.unexpTail, uprev)
	}
	var ubw []*unexp
	for u := q.unexpTail; u != nil && len(ubw) <= len(unexps); u = u.prev {
		ubw = append(ubw, u)
	}
	slices.Reverse(ubw)
	if !slices.Equal(ubw, unexps) {
		fail("context %d unexpected list backward %p, model %p", c, ubw, unexps)
	}
}
