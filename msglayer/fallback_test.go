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
