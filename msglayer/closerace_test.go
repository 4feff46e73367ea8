package msglayer_test

import (
	"testing"

	"github.com/xmx-stack/xmx/msglayer"
	"github.com/xmx-stack/xmx/xdp"
)

// The tests of this file race an endpoint's Close with the calls under
// way on it: whatever completed before the close, and what the close
// completed, is what those calls report.

// TestReceiveWithoutMessageKeepsMatch: a receive that ends without a
// message (Cancel, Close) carries the match info it was posted with, so
// that TestAny finds it by that info and a TestAny for other messages
// (match 0 here) does not take it.
func TestReceiveWithoutMessageKeepsMatch(t *testing.T) {
	l, _ := xdp.NewPair(xdp.MemConfig{})
	defer l.Close()
	e := openOn(t, l, 1, false)
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

func progressName(busy bool) string {
	if busy {
		return "busy"
	}
	return "blocking"
}

// openOn opens endpoint id on l (which the caller closes) and closes it
// at the test's end.
func openOn(t *testing.T, l xdp.Link, id uint8, busy bool) *msglayer.Endpoint {
	t.Helper()
	e, err := msglayer.Open(msglayer.Config{Link: l, EndpointID: id, BusyPoll: busy})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}
