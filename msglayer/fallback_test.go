package msglayer_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/xmx-stack/xmx/internal/netlab"
	"github.com/xmx-stack/xmx/msglayer"
	"github.com/xmx-stack/xmx/xdp"
)

// TestFallbackToAFPacket: with LinkKind auto, an interface on which
// AF_XDP cannot open gets an AF_PACKET link, LinkInfo says why, and
// messages flow as on any link.
func TestFallbackToAFPacket(t *testing.T) {
	lab := netlab.New(t, netlab.Options{Hosts: 2})
	defer msglayer.FailAFXDP(errors.New("refused by the test"))()
	a, b := labWorldOf(t, lab, "auto").pair(t, msglayer.Config{}, msglayer.Config{})
	for _, e := range []*msglayer.Endpoint{a, b} {
		if info, why := e.LinkInfo(); info.Kind != "afpacket" || !strings.Contains(why, "AF_PACKET, because AF_XDP failed") || !strings.Contains(why, "refused by the test") {
			t.Errorf("%v: a %s link, chosen because %q", e.Addr(), info.Kind, why)
		}
	}
	pingPong(t, a, b, 1000, 20, nil)
}

// TestInterfaceGoneEndsWait deletes the interface under an endpoint whose
// Wait sleeps in the link: the Wait ends with the link's ErrInterfaceGone
// (within the link's look, about a second) instead of waiting for good.
func TestInterfaceGoneEndsWait(t *testing.T) {
	for _, kind := range []string{"afxdp", "afpacket"} {
		t.Run(kind, func(t *testing.T) {
			lab := netlab.New(t, netlab.Options{Hosts: 2})
			a, _ := labWorldOf(t, lab, kind).pair(t, msglayer.Config{}, msglayer.Config{})
			r, err := a.Irecv(0, 0, [][]byte{make([]byte, 64)}, nil)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			ended := make(chan error, 1)
			go func() {
				_, err := a.Wait(ctx, r)
				ended <- err
			}()
			time.Sleep(50 * time.Millisecond)
			h := lab.Hosts[0]
			if out, err := h.Command("ip", "link", "del", h.Interface).CombinedOutput(); err != nil {
				t.Fatalf("ip link del %s: %v: %s", h.Interface, err, out)
			}
			for i := 0; ; i++ {
				err := <-ended
				if i < 3 && errors.Is(err, syscall.ENETDOWN) && !errors.Is(err, xdp.ErrInterfaceGone) {
					// AF_PACKET says the interface went down on its way out.
					go func() {
						_, err := a.Wait(ctx, r)
						ended <- err
					}()
					continue
				}
				if !errors.Is(err, xdp.ErrInterfaceGone) {
					t.Fatalf("Wait after the interface was deleted = %v; want xdp.ErrInterfaceGone", err)
				}
				t.Logf("Wait ended: %v", err)
				break
			}
		})
	}
}

// waitGone waits on a receive of e until its Wait fails with the link's
// ErrInterfaceGone (AF_PACKET may first say ENETDOWN).
func waitGone(t *testing.T, e *msglayer.Endpoint) {
	t.Helper()
	r, err := e.Irecv(0, 0, [][]byte{make([]byte, 64)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for range 5 {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err = e.Wait(ctx, r)
		cancel()
		if errors.Is(err, xdp.ErrInterfaceGone) {
			return
		}
	}
	t.Fatalf("Wait = %v, want xdp.ErrInterfaceGone", err)
}

// TestInterfaceGoneBusyPoll: a busy-polling Wait never sleeps in the
// link, whose sleeps are where it asks after its interface: the driver
// asks the link itself, about once a second.
func TestInterfaceGoneBusyPoll(t *testing.T) {
	lab := netlab.New(t, netlab.Options{Hosts: 2})
	e := labWorldOf(t, lab, "afxdp").open(t, 0, msglayer.Config{EndpointID: 1, BusyPoll: true})
	h := lab.Hosts[0]
	r, err := e.Irecv(0, 0, [][]byte{make([]byte, 64)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	ended := make(chan error, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	go func() { _, err := e.Wait(ctx, r); ended <- err }()
	time.Sleep(50 * time.Millisecond)
	if out, err := h.Command("ip", "link", "del", h.Interface).CombinedOutput(); err != nil {
		t.Fatalf("ip link del: %v: %s", err, out)
	}
	if err := <-ended; !errors.Is(err, xdp.ErrInterfaceGone) {
		t.Errorf("busy-polling Wait after the interface was deleted = %v; want xdp.ErrInterfaceGone", err)
	}
}

// TestOpenAfterInterfaceGone: an endpoint opened on a new interface of the
// name of one that was deleted, while an endpoint of the old one is still
// open, gets a new engine on a live link, not the old, dead one; and the
// old engine's background goroutine, its link failing, backs off rather
// than wake hundreds of times a second.
func TestOpenAfterInterfaceGone(t *testing.T) {
	for _, kind := range []string{"afxdp", "afpacket"} {
		t.Run(kind, func(t *testing.T) {
			var bg atomic.Int64
			msglayer.SetSleepHook(func(background bool) {
				if background {
					bg.Add(1)
				}
			})
			// Reset once the engines are gone (cleanups run last first).
			t.Cleanup(func() { msglayer.SetSleepHook(nil) })
			lab := netlab.New(t, netlab.Options{Hosts: 2})
			w := labWorldOf(t, lab, kind)
			h := lab.Hosts[0]
			old := w.open(t, 0, msglayer.Config{EndpointID: 1})
			for _, args := range [][]string{
				{"link", "del", h.Interface},
				{"link", "add", h.Interface, "type", "veth", "peer", "name", "other0"},
				{"link", "set", h.Interface, "up"},
				{"link", "set", "other0", "up"},
			} {
				if out, err := h.Command("ip", args...).CombinedOutput(); err != nil {
					t.Fatalf("ip %v: %v: %s", args, err, out)
				}
			}
			waitGone(t, old) // old stays open
			n0 := bg.Load()
			time.Sleep(time.Second)
			if wakes := bg.Load() - n0; wakes > 20 {
				t.Errorf("the old engine's background goroutine slept %d times in the second after its link failed", wakes)
			}
			fresh := w.open(t, 0, msglayer.Config{EndpointID: 2})
			r, err := fresh.Irecv(0, 0, [][]byte{make([]byte, 64)}, nil)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
			defer cancel()
			if _, err = fresh.Wait(ctx, r); !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("Wait on an endpoint opened on the new %s = %v; want a live link (the context's end)", h.Interface, err)
			}
		})
	}
}

// failLink is a link whose receives fail once fail is set.
type failLink struct {
	xdp.Link
	fail atomic.Bool
}

var errLinkFails = errors.New("the link fails")

func (f *failLink) Recv(bufs [][]byte, sizes []int, timeout time.Duration) (int, error) {
	if f.fail.Load() {
		return 0, errLinkFails
	}
	return f.Link.Recv(bufs, sizes, timeout)
}

func (f *failLink) Wake() { f.Link.(xdp.Waker).Wake() }

// TestFailingLinkBackoffFreesToken: the background goroutine, backing
// off from a link that keeps failing (up to 250 ms), does so without the
// drive token: a Wait learns the link's error at once.
func TestFailingLinkBackoffFreesToken(t *testing.T) {
	ml, _ := xdp.NewPair(xdp.MemConfig{})
	defer ml.Close()
	fl := &failLink{Link: ml}
	e, err := msglayer.Open(msglayer.Config{Link: fl, EndpointID: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	fl.fail.Store(true)
	worst := time.Duration(0)
	for range 4 {
		time.Sleep(700 * time.Millisecond) // the backoff reaches 250 ms
		r, err := e.Irecv(0, 0, [][]byte{make([]byte, 8)}, nil)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		start := time.Now()
		_, err = e.Wait(ctx, r)
		worst = max(worst, time.Since(start))
		cancel()
		if !errors.Is(err, errLinkFails) {
			t.Fatalf("Wait = %v, want the link's error", err)
		}
		e.Cancel(r)
	}
	if worst > 20*time.Millisecond {
		t.Errorf("a Wait on a failing link took up to %v to learn the link's error", worst)
	}
}

// TestGivenFailedLinkJoined: a given link whose interface went is the same
// link still: an Open on it joins its engine (and refuses an endpoint id
// open there), rather than put a second engine on the link.
func TestGivenFailedLinkJoined(t *testing.T) {
	lab := netlab.New(t, netlab.Options{Hosts: 2})
	h := lab.Hosts[0]
	var l *xdp.AFPacketLink
	if err := h.Do(func() (err error) {
		l, err = xdp.OpenAFPacket(xdp.AFPacketConfig{Interface: h.Interface})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	old, err := msglayer.Open(msglayer.Config{Link: l, EndpointID: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	if out, err := h.Command("ip", "link", "del", h.Interface).CombinedOutput(); err != nil {
		t.Fatalf("ip link del: %v: %s", err, out)
	}
	waitGone(t, old)
	if again, err := msglayer.Open(msglayer.Config{Link: l, EndpointID: 1}); err == nil {
		again.Close()
		t.Error("a second endpoint 1 opened on the given link endpoint 1 is open on")
	}
}

// TestInterfaceGoneBusyPollManualClock: the busy-polling driver asks the
// link after its interface in real time, whatever clock the engine has.
func TestInterfaceGoneBusyPollManualClock(t *testing.T) {
	lab := netlab.New(t, netlab.Options{Hosts: 2})
	clk := &msglayer.ManualClock{}
	e := labWorldOf(t, lab, "afxdp").open(t, 0, msglayer.Config{EndpointID: 1, BusyPoll: true, Clock: clk})
	h := lab.Hosts[0]
	r, err := e.Irecv(0, 0, [][]byte{make([]byte, 64)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	ended := make(chan error, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	go func() { _, err := e.Wait(ctx, r); ended <- err }()
	time.Sleep(50 * time.Millisecond)
	if out, err := h.Command("ip", "link", "del", h.Interface).CombinedOutput(); err != nil {
		t.Fatalf("ip link del: %v: %s", err, out)
	}
	if err := <-ended; !errors.Is(err, xdp.ErrInterfaceGone) {
		t.Errorf("busy-polling Wait (manual clock) after the interface was deleted = %v; want xdp.ErrInterfaceGone", err)
	}
}
