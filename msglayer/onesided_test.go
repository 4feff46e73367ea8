package msglayer_test

import (
	"bytes"
	"context"
	"errors"
	"math"
	"testing"
	"time"

	"github.com/xmx-stack/xmx/msglayer"
	"github.com/xmx-stack/xmx/regcache"
	"github.com/xmx-stack/xmx/xdp"
)

func runOneSided(t *testing.T, w world) {
	t.Run("PutGet", func(t *testing.T) { testPutGet(t, w) })
	t.Run("Refusals", func(t *testing.T) { testRefusals(t, w) })
	t.Run("UnmapInvalidates", func(t *testing.T) { testUnmap(t, w) })
}

func TestOneSidedMem(t *testing.T) {
	runOneSided(t, memWorld(t, xdp.MemConfig{Loss: 0.05, Reorder: 0.05, Duplicate: 0.01, Seed: 5}))
}

func TestOneSidedAFXDP(t *testing.T) { runOneSided(t, labWorld(t, "afxdp")) }

// testPutGet writes into a peer's registered buffer and reads it back,
// for several sizes and offsets, over the network and on the same NIC.
func testPutGet(t *testing.T, w world) {
	a, b := w.pair(t, msglayer.Config{}, msglayer.Config{})
	c := w.open(t, 1, msglayer.Config{EndpointID: 3, Key: 3}) // on b's NIC
	ctx := ctxFor(t, 60*time.Second)
	target := make([]byte, 2<<20)
	reg, err := b.Register(target)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Deregister(reg)
	if err := c.Connect(ctx, b.Addr(), 0xb); err != nil {
		t.Fatal(err)
	}
	for _, from := range []*msglayer.Endpoint{a, c} {
		for i, tc := range []struct{ off, n int }{{0, 0}, {0, 1}, {100, 1500}, {4095, 40000}, {1 << 20, 1 << 20}} {
			data := message(i, tc.n)
			put, err := from.IPut(b.Addr(), reg.Mem, uint64(tc.off), [][]byte{data}, nil)
			if err != nil {
				t.Fatal(err)
			}
			if st, err := from.Wait(ctx, put); err != nil || st.XferLen != tc.n {
				t.Fatalf("put %d bytes at %d: %+v, %v", tc.n, tc.off, st, err)
			}
			// The target's engine wrote its memory under its lock; an
			// application learns of a Put through its endpoint, which
			// orders the write before its reads (as Counters does here).
			b.Counters()
			if !bytes.Equal(target[tc.off:tc.off+tc.n], data) {
				t.Fatalf("put %d bytes at %d: target memory differs", tc.n, tc.off)
			}
			back := make([]byte, tc.n)
			get, err := from.IGet(b.Addr(), reg.Mem, uint64(tc.off), [][]byte{back}, nil)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := from.Wait(ctx, get); err != nil {
				t.Fatalf("get %d bytes at %d: %v", tc.n, tc.off, err)
			}
			if !bytes.Equal(back, data) {
				t.Fatalf("get %d bytes at %d: data differs", tc.n, tc.off)
			}
		}
	}
	if got := a.Counters(); got.Gets == 0 || got.Puts == 0 {
		t.Errorf("counters: %+v", got)
	}
}

// testRefusals checks that the target refuses a wrong key, an unknown
// region and an access beyond the region, with BadRegion, and counts them.
func testRefusals(t *testing.T, w world) {
	a, b := w.pair(t, msglayer.Config{}, msglayer.Config{})
	ctx := ctxFor(t, 20*time.Second)
	target := make([]byte, 64<<10)
	reg, err := b.Register(target)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Deregister(reg)
	wrongKey := reg.Mem
	wrongKey.Key ^= 1
	unknown := reg.Mem
	unknown.Region ^= 0x5a5a0000
	tooLong := reg.Mem
	tooLong.Len = 1 << 30 // the local check passes; the target's does not
	before := b.Counters().RegionRefused
	buf := [][]byte{make([]byte, 3000)}
	cases := []struct {
		name string
		m    msglayer.RemoteMem
		off  uint64
	}{{"wrong key", wrongKey, 0}, {"unknown region", unknown, 0}, {"beyond the region", tooLong, 63 << 10}}
	for _, c := range cases {
		for _, op := range []string{"get", "put"} {
			var r msglayer.Request
			if op == "get" {
				r, err = a.IGet(b.Addr(), c.m, c.off, buf, nil)
			} else {
				r, err = a.IPut(b.Addr(), c.m, c.off, buf, nil)
			}
			if err != nil {
				t.Fatal(err)
			}
			if _, err := a.Wait(ctx, r); !errors.Is(err, msglayer.ErrBadRegion) {
				t.Fatalf("%s, %s: %v, want ErrBadRegion", op, c.name, err)
			}
		}
	}
	if got := b.Counters().RegionRefused - before; got < uint64(2*len(cases)) {
		t.Errorf("target counted %d refusals, want at least %d", got, 2*len(cases))
	}
	if _, err := a.IGet(b.Addr(), reg.Mem, 64<<10-10, buf, nil); err == nil {
		t.Error("a get beyond the remote buffer was not refused locally")
	}
	// A registration reaches its buffer only, also when the cache hands it
	// a larger region registered before (a cache hit), and not after
	// Deregister.
	small, err := b.Register(target[:16])
	if err != nil {
		t.Fatal(err)
	}
	wide := small.Mem
	wide.Len = 64 << 10 // the local check passes; the target's does not
	for _, c := range []struct {
		name string
		m    msglayer.RemoteMem
		off  uint64
	}{{"beyond the registered buffer", wide, 1000}, {"deregistered", small.Mem, 0}} {
		if c.name == "deregistered" {
			b.Deregister(small)
		}
		p, _ := a.IPut(b.Addr(), c.m, c.off, [][]byte{[]byte("PWNED")}, nil)
		if _, err := a.Wait(ctx, p); !errors.Is(err, msglayer.ErrBadRegion) {
			t.Fatalf("put %s: %v, want ErrBadRegion", c.name, err)
		}
		b.Counters()
		if bytes.Contains(target, []byte("PWNED")) {
			t.Fatalf("put %s: written", c.name)
		}
	}
	// Explicit invalidation: the region is gone at once.
	b.Invalidate(target)
	r, _ := a.IGet(b.Addr(), reg.Mem, 0, buf, nil)
	if _, err := a.Wait(ctx, r); !errors.Is(err, msglayer.ErrBadRegion) {
		t.Fatalf("get after Invalidate: %v, want ErrBadRegion", err)
	}
}

// testUnmap registers memory mapped with regcache.Map; after Unmap a
// peer's Get on the old region is refused, never a crash.
func testUnmap(t *testing.T, w world) {
	a, b := w.pair(t, msglayer.Config{}, msglayer.Config{})
	ctx := ctxFor(t, 20*time.Second)
	mem, err := regcache.Map(256 << 10)
	if err != nil {
		t.Fatal(err)
	}
	copy(mem, message(7, len(mem)))
	reg, err := b.Register(mem)
	if err != nil {
		t.Fatal(err)
	}
	back := make([]byte, len(mem))
	r, _ := a.IGet(b.Addr(), reg.Mem, 0, [][]byte{back}, nil)
	if _, err := a.Wait(ctx, r); err != nil || !bytes.Equal(back, mem) {
		t.Fatalf("get of mapped memory: %v", err)
	}
	if err := regcache.Unmap(mem); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		r, _ := a.IGet(b.Addr(), reg.Mem, 0, [][]byte{back}, nil)
		if _, err := a.Wait(ctx, r); !errors.Is(err, msglayer.ErrBadRegion) {
			t.Fatalf("get after unmap: %v, want ErrBadRegion", err)
		}
	}
	b.Deregister(reg)
}

// TestDoubleDeregister: a second Deregister of a registration does
// nothing; in particular it does not release the region another live
// registration shares (a cache hit), which would let the cache evict it.
func TestDoubleDeregister(t *testing.T) {
	w := memWorld(t, xdp.MemConfig{Seed: 1})
	a, b := w.pair(t, msglayer.Config{}, msglayer.Config{RegCache: regcache.CacheConfig{MaxRegions: 1}})
	ctx := ctxFor(t, 10*time.Second)
	target := make([]byte, 64<<10)
	r1, err := b.Register(target)
	if err != nil {
		t.Fatal(err)
	}
	r2, err := b.Register(target[100:200]) // a cache hit: the same region
	if err != nil {
		t.Fatal(err)
	}
	b.Deregister(r1)
	b.Deregister(r1)
	if st := b.RegCache().Stats(); st.InUse != 1 {
		t.Fatalf("after a double Deregister the live registration's region is not in use: %+v", st)
	}
	if _, err := b.Register(make([]byte, 64<<10)); err == nil {
		t.Fatal("a second region fitted a cache of one whose region is in use")
	}
	p, err := a.IPut(b.Addr(), r2.Mem, 0, [][]byte{[]byte("x")}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Wait(ctx, p); err != nil {
		t.Fatalf("put into the live registration: %v", err)
	}
	if target[100] != 'x' {
		t.Fatal("put did not land")
	}
	b.Deregister(r2)
	if st := b.RegCache().Stats(); st.InUse != 0 {
		t.Fatalf("after the last Deregister: %+v", st)
	}
}

// TestLocalOneSidedCounted: Puts and Gets between endpoints of one engine
// count as the network ones do.
func TestLocalOneSidedCounted(t *testing.T) {
	b, c, reg, ctx := localTarget(t)
	defer b.Deregister(reg)
	bIn := b.Counters().PutsIn
	p, _ := c.IPut(b.Addr(), reg.Mem, 0, [][]byte{[]byte("hello")}, nil)
	if _, err := c.Wait(ctx, p); err != nil {
		t.Fatal(err)
	}
	g, _ := c.IGet(b.Addr(), reg.Mem, 0, [][]byte{make([]byte, 5)}, nil)
	if _, err := c.Wait(ctx, g); err != nil {
		t.Fatal(err)
	}
	if cc, in := c.Counters(), b.Counters().PutsIn-bIn; cc.Puts != 1 || cc.Gets != 1 || in != 1 {
		t.Fatalf("Puts %d, Gets %d, target's PutsIn +%d; want 1, 1, +1", cc.Puts, cc.Gets, in)
	}
}

// TestZeroLengthGetChecked: a zero-length Get moves no data, but the
// target still checks the region, as for a zero-length Put: an unknown
// region is refused, a known one succeeds.
func TestZeroLengthGetChecked(t *testing.T) {
	w := memWorld(t, xdp.MemConfig{Seed: 1})
	a, b := w.pair(t, msglayer.Config{}, msglayer.Config{})
	ctx := ctxFor(t, 10*time.Second)
	reg, err := b.Register(make([]byte, 4096))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Deregister(reg)
	for _, c := range []struct {
		m    msglayer.RemoteMem
		want error
	}{
		{msglayer.RemoteMem{Region: 12345, Key: 42, Len: 100}, msglayer.ErrBadRegion},
		{reg.Mem, nil},
	} {
		g, err := a.IGet(b.Addr(), c.m, 0, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := a.Wait(ctx, g); !errors.Is(err, c.want) {
			t.Errorf("zero-length Get of region %d: %v, want %v", c.m.Region, err, c.want)
		}
	}
}

// TestLocalOneSidedToClosed: a Get or Put to a closed endpoint of the
// same process fails BadEndpoint, as a send to it does (and as over the
// network, where its engine nacks them), not BadRegion after a look at its regions, and counts
// nothing at the closed endpoint.
func TestLocalOneSidedToClosed(t *testing.T) {
	b, c, reg, ctx := localTarget(t)
	b.Close()
	before := b.Counters()
	s, _ := c.Isend(b.Addr(), 1, [][]byte{[]byte("x")}, nil)
	sst, _ := c.Wait(ctx, s)
	p, _ := c.IPut(b.Addr(), reg.Mem, 0, [][]byte{[]byte("hello")}, nil)
	pst, _ := c.Wait(ctx, p)
	g, _ := c.IGet(b.Addr(), reg.Mem, 0, [][]byte{make([]byte, 5)}, nil)
	gst, _ := c.Wait(ctx, g)
	if sst.Code != msglayer.BadEndpoint || pst.Code != msglayer.BadEndpoint || gst.Code != msglayer.BadEndpoint {
		t.Errorf("to a closed endpoint of the process: send %v, put %v, get %v; want all bad endpoint", sst.Code, pst.Code, gst.Code)
	}
	if after := b.Counters(); after.PutsIn != before.PutsIn || after.RegionRefused != before.RegionRefused {
		t.Errorf("the closed endpoint counted PutsIn %d, RegionRefused %d (before %d, %d)", after.PutsIn, after.RegionRefused, before.PutsIn, before.RegionRefused)
	}
}

// localTarget opens b (of a connected pair) and c on b's engine,
// connected to b, and registers 4 KiB at b for their one-sided calls.
func localTarget(t *testing.T) (b, c *msglayer.Endpoint, reg msglayer.Registration, ctx context.Context) {
	t.Helper()
	w := memWorld(t, xdp.MemConfig{Seed: 1})
	_, b = w.pair(t, msglayer.Config{}, msglayer.Config{})
	c = w.open(t, 1, msglayer.Config{EndpointID: 3, Key: 3})
	ctx = ctxFor(t, 10*time.Second)
	if err := c.Connect(ctx, b.Addr(), 0xb); err != nil {
		t.Fatal(err)
	}
	reg, err := b.Register(make([]byte, 4096))
	if err != nil {
		t.Fatal(err)
	}
	return b, c, reg, ctx
}

// TestOneSidedOffsetWraps: a remote offset whose sum with the operation's
// offset (and length) wraps past 2^64 is refused at the call, on the
// network and between endpoints of one engine; it used to reach the target
// as a small offset and read or write the registration's first bytes.
func TestOneSidedOffsetWraps(t *testing.T) {
	w := memWorld(t, xdp.MemConfig{Seed: 1})
	a, b := w.pair(t, msglayer.Config{}, msglayer.Config{})
	c := w.open(t, 1, msglayer.Config{EndpointID: 3, Key: 3})
	target := make([]byte, 4096)
	reg, err := b.Register(target)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Deregister(reg)
	for _, from := range []*msglayer.Endpoint{a, c} {
		for _, at := range []uint64{math.MaxUint64 - 3, math.MaxUint64 - 1} {
			m := reg.Mem
			m.Offset = at // + 4 (+ 5 bytes) wraps
			data := []byte("wraps")
			if _, err := from.IPut(b.Addr(), m, 4, [][]byte{data}, nil); !errors.As(err, new(*msglayer.ArgError)) {
				t.Errorf("Put at remote offset %d + 4 from %v: %v, want an ArgError", at, from.Addr(), err)
			}
			if _, err := from.IGet(b.Addr(), m, 4, [][]byte{data}, nil); !errors.As(err, new(*msglayer.ArgError)) {
				t.Errorf("Get at remote offset %d + 4 from %v: %v, want an ArgError", at, from.Addr(), err)
			}
		}
	}
	if !bytes.Equal(target, make([]byte, len(target))) {
		t.Error("the registration was written")
	}
}
