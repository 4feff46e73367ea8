package msglayer_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/xmx-stack/xmx/msglayer"
	"github.com/xmx-stack/xmx/xdp"
)

// The tests of this file race an endpoint's Close with the calls under
// way on it: whatever completed before the close, and what the close
// completed, is what those calls report.

// TestWaitSeesCompletionBeforeClose: a receive that completed just before
// its endpoint (the engine's last) closed is reported by the Wait driving
// for it with its own status, not as a bare ErrClosed with the handle left
// unspent: the driver looked at the request, then at the close, and the
// completion came between the two looks.
func TestWaitSeesCompletionBeforeClose(t *testing.T) {
	for _, m := range progressModes[:2] { // busy, blocking
		t.Run(m.name, func(t *testing.T) {
			for round := range 300 {
				l, _ := xdp.NewPair(xdp.MemConfig{})
				a := openWith(t, m.cfg, l, 1)
				b := openWith(t, m.cfg, l, 2)
				if err := a.Connect(context.Background(), b.Addr(), 0); err != nil {
					t.Fatal(err)
				}
				h, err := b.Irecv(1, ^uint64(0), [][]byte{make([]byte, 8)}, nil)
				if err != nil {
					t.Fatal(err)
				}
				type result struct {
					st  msglayer.Status
					err error
				}
				out := make(chan result, 1)
				go func() {
					st, err := b.Wait(context.Background(), h)
					out <- result{st, err}
				}()
				time.Sleep(time.Duration(rand.IntN(300)) * time.Microsecond)
				// The same engine: the send completes the receive at once.
				s, err := a.Isend(b.Addr(), 1, [][]byte{[]byte("12345678")}, nil)
				if err != nil {
					t.Fatal(err)
				}
				a.Forget(s)
				a.Close()
				b.Close()
				r := <-out
				l.Close()
				if r.err != nil || r.st.Code != msglayer.Success || r.st.XferLen != 8 {
					st, ok, err := b.Test(h)
					t.Fatalf("round %d: Wait returned %+v, %v; the request: %v, done %v (%v)", round, r.st, r.err, st.Code, ok, err)
				}
			}
		})
	}
}

// TestWaitsReportClose: Waits and a WaitAny asleep or driving on receives
// that the endpoint's Close completes return each its request's Closed
// status, and spend the handles.
func TestWaitsReportClose(t *testing.T) {
	for _, m := range progressModes[:2] { // busy, blocking
		t.Run(m.name, func(t *testing.T) {
			for round := range 100 {
				l, _ := xdp.NewPair(xdp.MemConfig{})
				e := openWith(t, m.cfg, l, 1)
				const n = 4
				hs := make([]msglayer.Request, n)
				for i := range hs {
					var err error
					if hs[i], err = e.Irecv(uint64(i), ^uint64(0), nil, i); err != nil {
						t.Fatal(err)
					}
				}
				sts := make(chan msglayer.Status, n+1)
				errs := make(chan error, n+1)
				var wg sync.WaitGroup
				wait := func(f func() (msglayer.Status, error)) {
					wg.Go(func() {
						st, err := f()
						sts <- st
						errs <- err
					})
				}
				for _, h := range hs[1:] {
					wait(func() (msglayer.Status, error) { return e.Wait(context.Background(), h) })
				}
				// Receive 0 only WaitAny may take: no Wait holds its handle.
				wait(func() (msglayer.Status, error) { return e.WaitAny(context.Background(), 0, ^uint64(0)) })
				time.Sleep(time.Duration(rand.IntN(2000)) * time.Microsecond)
				e.Close()
				wg.Wait()
				l.Close()
				close(sts)
				close(errs)
				seen := map[uint64]bool{}
				for st := range sts {
					err := <-errs
					if st.Code != msglayer.Closed || !errors.Is(err, msglayer.ErrClosed) || st.Context != int(st.Match) || seen[st.Match] {
						t.Fatalf("round %d: a wait returned %+v, %v; want each receive's own Closed status", round, st, err)
					}
					seen[st.Match] = true
				}
				for i, h := range hs {
					if _, _, err := e.Test(h); !errors.Is(err, msglayer.ErrStaleRequest) {
						t.Fatalf("round %d: handle %d after its wait: %v, want ErrStaleRequest", round, i, err)
					}
				}
			}
		})
	}
}

// TestReceiveWithoutMessageKeepsMatch: a receive that ends without a
// message (Cancel, Close) carries the match info it was posted with, so
// that TestAny finds it by that info and a TestAny for other messages
// (match 0 here) does not take it.
func TestReceiveWithoutMessageKeepsMatch(t *testing.T) {
	l, _ := xdp.NewPair(xdp.MemConfig{})
	defer l.Close()
	e := openEP(t, msglayer.Config{Link: l, EndpointID: 1})
	h, err := e.Irecv(5, ^uint64(0), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := e.Cancel(h); !ok || err != nil {
		t.Fatalf("Cancel: %v, %v", ok, err)
	}
	if st, ok := e.TestAny(0, ^uint64(0)); ok {
		t.Fatalf("TestAny for match 0 took the cancelled receive for 5: %+v", st)
	}
	if st, ok := e.TestAny(5, ^uint64(0)); !ok || st.Code != msglayer.Cancelled || st.Match != 5 {
		t.Fatalf("TestAny for match 5: %+v, %v; want the cancelled receive", st, ok)
	}

	if _, err := e.Irecv(6, ^uint64(0), nil, nil); err != nil {
		t.Fatal(err)
	}
	e.Close()
	if st, ok := e.TestAny(6, ^uint64(0)); !ok || st.Code != msglayer.Closed || st.Match != 6 {
		t.Fatalf("after Close, TestAny for match 6: %+v, %v; want the closed receive", st, ok)
	}
}

// TestCloseGoodbyeWhileAnotherFlushes: an endpoint's Close queues the
// frame that tells its peer it closed; when another goroutine is sending
// the endpoint's frames at that moment, Close leaves the frame to it. The
// engine's stop waits for that flush before it closes the link (which the
// engine owns), so the peer's send waiting on the closed endpoint fails
// BadEndpoint at once, not Unreachable at its give-up.
func TestCloseGoodbyeWhileAnotherFlushes(t *testing.T) {
	const giveUp = 300 * time.Millisecond
	for round := range 30 {
		hub := xdp.NewHub(xdp.MemConfig{})
		la, lb := hub.Attach(), hub.Attach()
		a, err := msglayer.Open(msglayer.Config{Link: la, OwnLink: true, EndpointID: 1, GiveUp: giveUp})
		if err != nil {
			t.Fatal(err)
		}
		b, err := msglayer.Open(msglayer.Config{Link: lb, EndpointID: 2, GiveUp: giveUp})
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		if err := a.Connect(ctx, b.Addr(), 0); err != nil {
			t.Fatal(err)
		}
		if err := b.Connect(ctx, a.Addr(), 0); err != nil {
			t.Fatal(err)
		}
		// A rendezvous send a never receives: it waits on a.
		bs, err := b.Isend(a.Addr(), 9, [][]byte{make([]byte, 100000)}, nil)
		if err != nil {
			t.Fatal(err)
		}
		stop := make(chan struct{})
		var wg sync.WaitGroup
		for range 2 {
			wg.Go(func() { // flushers on a, until it closes
				for {
					select {
					case <-stop:
						return
					default:
					}
					h, err := a.Isend(b.Addr(), 1, [][]byte{make([]byte, 8)}, nil)
					if err != nil {
						return
					}
					a.Forget(h)
				}
			})
		}
		time.Sleep(5 * time.Millisecond)
		a.Close()
		close(stop)
		wg.Wait()
		wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		st, err := b.Wait(wctx, bs)
		cancel()
		b.Close()
		lb.Close()
		if st.Code != msglayer.BadEndpoint {
			t.Fatalf("round %d: the send to the closed endpoint ended %v (%v), want BadEndpoint", round, st.Code, err)
		}
	}
}

// openWith opens endpoint id on l with cfg's progress mode.
func openWith(t *testing.T, cfg msglayer.Config, l xdp.Link, id uint8) *msglayer.Endpoint {
	cfg.Link, cfg.EndpointID = l, id
	return openEP(t, cfg)
}
