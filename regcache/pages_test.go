package regcache

import (
	"errors"
	"math/rand/v2"
	"testing"
)

// The page reference counts against a model, with the system calls
// recorded: a page is mlocked exactly when its count goes 0 → 1 and
// munlocked exactly when it goes 1 → 0.
func TestPageLockerModel(t *testing.T) {
	oldL, oldU := sysMlock, sysMunlock
	defer func() { sysMlock, sysMunlock = oldL, oldU }()
	var p pageLocker
	const base = uintptr(0x7000_0000_0000)
	const npages = 64
	model := make([]int, npages)
	locked := make([]bool, npages) // what the fake kernel has locked
	failAt := -1                   // page whose mlock fails
	pageOf := func(a uintptr) int { return int((a - base) / pageSize) }
	sysMlock = func(a, n uintptr) error {
		if a%pageSize != 0 || n%pageSize != 0 || n == 0 {
			t.Fatalf("mlock(%#x, %d) not page-aligned", a, n)
		}
		for i := pageOf(a); i < pageOf(a+n); i++ {
			if i == failAt {
				// The kernel locks nothing on failure of the range
				// (close enough: it may lock a prefix, undone below).
				for j := pageOf(a); j < i; j++ {
					locked[j] = false
				}
				return errors.New("injected")
			}
			if locked[i] {
				t.Fatalf("page %d locked twice", i)
			}
			locked[i] = true
		}
		return nil
	}
	sysMunlock = func(a, n uintptr) error {
		for i := pageOf(a); i < pageOf(a+n); i++ {
			if !locked[i] {
				t.Fatalf("page %d unlocked while not locked", i)
			}
			locked[i] = false
		}
		return nil
	}
	rng := rand.New(rand.NewPCG(5, 5))
	type rng2 struct{ lo, hi int }
	var held []rng2
	for op := 0; op < 20000; op++ {
		switch k := rng.IntN(100); {
		case k < 50 || len(held) == 0:
			lo := rng.IntN(npages)
			hi := lo + 1 + rng.IntN(min(8, npages-lo))
			failAt = -1
			if rng.IntN(10) == 0 {
				failAt = lo + rng.IntN(hi-lo)
			}
			err := p.lock(base+uintptr(lo)*pageSize, base+uintptr(hi)*pageSize)
			wantFail := failAt >= 0 && model[failAt] == 0
			if (err != nil) != wantFail {
				t.Fatalf("op %d: lock [%d,%d) failAt %d: %v", op, lo, hi, failAt, err)
			}
			if err == nil {
				for i := lo; i < hi; i++ {
					model[i]++
				}
				held = append(held, rng2{lo, hi})
			}
		case k < 98:
			i := rng.IntN(len(held))
			h := held[i]
			held = append(held[:i], held[i+1:]...)
			if err := p.unlock(base+uintptr(h.lo)*pageSize, base+uintptr(h.hi)*pageSize); err != nil {
				t.Fatal(err)
			}
			for i := h.lo; i < h.hi; i++ {
				model[i]--
			}
		default:
			// Unmap of a range holding regions of a registry that was
			// dropped without Close: their holds are leaked (never
			// unlocked), forget drops the counts in the range and munmap
			// unlocks it; counts of the leaked holds outside stay.
			lo := rng.IntN(npages)
			hi := lo + 1 + rng.IntN(npages-lo)
			keep := held[:0]
			for _, h := range held {
				if h.hi <= lo || h.lo >= hi {
					keep = append(keep, h)
				}
			}
			held = keep
			p.forget(base+uintptr(lo)*pageSize, base+uintptr(hi)*pageSize)
			for i := lo; i < hi; i++ {
				model[i] = 0
				locked[i] = false // munmap
			}
		}
		var bytes int64
		for i := 0; i < npages; i++ {
			if got := p.count(base + uintptr(i)*pageSize); int(got) != model[i] {
				t.Fatalf("op %d: page %d count %d, model %d", op, i, got, model[i])
			}
			if locked[i] != (model[i] > 0) {
				t.Fatalf("op %d: page %d locked %v, count %d", op, i, locked[i], model[i])
			}
			if model[i] > 0 {
				bytes += int64(pageSize)
			}
		}
		if p.locked != bytes {
			t.Fatalf("op %d: locked %d, want %d", op, p.locked, bytes)
		}
		for i := 1; i < len(p.seg); i++ {
			if p.seg[i-1].addr >= p.seg[i].addr || p.seg[i-1].n == p.seg[i].n {
				t.Fatalf("op %d: segments not normalized: %v", op, p.seg)
			}
		}
		if len(p.seg) > 0 && (p.seg[len(p.seg)-1].n != 0 || p.seg[0].n == 0) {
			t.Fatalf("op %d: bad ends: %v", op, p.seg)
		}
	}
}
