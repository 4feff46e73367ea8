package main

import (
	"encoding/json"
	"errors"
	"flag"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/xmx-stack/xmx/internal/netlab"
	"github.com/xmx-stack/xmx/msglayer"
	"github.com/xmx-stack/xmx/xdp"
)

func TestManyClientsFlagErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string // the error names the flag
	}{
		{nil, "-role"},
		{[]string{"-role", "both"}, `-role "both"`},
		{[]string{"-role", "clients", "-peer", "h1", "-n", "0"}, "-n 0"},
		{[]string{"-role", "clients", "-peer", "h1", "-n", "256"}, "-n 256"},
		{[]string{"-role", "clients", "-peer", "h1", "-n", "lots"}, "-n"},
		{[]string{"-role", "clients", "-peer", "h1", "-n", "200", "-e", "100"}, "-e 100 -n 200"},
		{[]string{"-role", "clients", "-n", "4"}, "-peer"},
		{[]string{"-role", "clients", "-peer", "h1", "-window", "0"}, "-window 0"},
		{[]string{"-role", "clients", "-peer", "h1", "-size", "64q"}, "-size 64q"},
		{[]string{"-role", "clients", "-peer", "h1", "-duration", "2h"}, "-duration"},
		{[]string{"-role", "clients", "-peer", "h1", "-start-at", "soon"}, "-start-at"},
		{[]string{"-role", "clients", "-peer", "h1", "-start-at", "NaN"}, "-start-at"},
		{[]string{"-role", "clients", "-peer", "h1", "-start-at", "1e20"}, "-start-at"},
		{[]string{"-role", "clients", "-peer", "h1", "-timeout", "-1s"}, "-timeout"},
		{[]string{"-role", "clients", "-peer", "h1", "-recvs", "8"}, "-recvs is a server flag"},
		{[]string{"-role", "clients", "-peer", "h1", "-pull-blocks", "8"}, "-pull-blocks is a server flag"},
		{[]string{"-role", "server", "-sample", "1000h"}, "-sample"},
		{[]string{"-role", "server", "-peer", "h1"}, "-peer is a clients flag"},
		{[]string{"-role", "server", "-recvs", "0"}, "-recvs 0"},
		{[]string{"-role", "server", "-recvs", "4096", "-max-size", "16M"}, "-recvs 4096 -max-size 16M"},
		{[]string{"-role", "server", "-recvs", "65", "-max-size", "16M"}, "more than 1 GiB"},
		{[]string{"-role", "server", "-recv-budget", "-2"}, "-recv-budget -2"},
		{[]string{"-role", "server", "-e", "300"}, "-e 300"},
		{[]string{"-role", "server", "extra"}, "unexpected arguments"},
		{[]string{"-role", "server", "-umem"}, "-umem is a clients flag"},
		{[]string{"-role", "server", "-buffer-per-client"}, "-buffer-per-client is a clients flag"},
		{[]string{"-role", "server", "-goroutine-per-client"}, "-goroutine-per-client is a clients flag"},
		{[]string{"-role", "clients", "-peer", "h1", "-umem-gather", "copy"}, "only with -umem"},
		{[]string{"-role", "clients", "-peer", "h1", "-umem", "-umem-gather", "some"}, `-umem-gather "some"`},
		{[]string{"-role", "clients", "-peer", "h1", "-umem", "-n", "255", "-size", "16M"}, "more than 1 GiB"},
		{[]string{"-role", "clients", "-peer", "h1", "-umem", "-size", "0"}, "-umem -size 0"},
	} {
		_, err := parseManyClients(tc.args, io.Discard)
		if err == nil {
			t.Errorf("%q: no error", tc.args)
			continue
		}
		if !errors.Is(err, errUsage) {
			t.Errorf("%q: %v: not a usage error (exit status 2)", tc.args, err)
		}
		if !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: %v: does not name %q", tc.args, err, tc.want)
		}
	}
}

// TestManyClientsBadInterface: an -i that names no interface is the
// command line's error, said once, not the first endpoint's.
func TestManyClientsBadInterface(t *testing.T) {
	netlab.RequirePrivileged(t) // xmx manyclients refuses to run without root before it opens an endpoint
	c, err := parseManyClients([]string{"-role", "clients", "-peer", "h1", "-i", "xmxnosuch0"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	err = mcClients(c)
	if !errors.Is(err, errUsage) || !strings.HasPrefix(usageMessage(err), "-i xmxnosuch0: no such interface") {
		t.Errorf("mcClients with -i xmxnosuch0: %v; want the usage error of -i", err)
	}
}

func TestManyClientsFlagDefaults(t *testing.T) {
	c, err := parseManyClients([]string{"-role", "clients", "-peer", "h1", "-n", "32", "-start-at", "1700000000.5"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c.ef.ep != 1 || c.clients != 32 || c.size != 64<<10 || c.window != 2 || c.duration != 3*time.Second || c.perClient {
		t.Errorf("clients defaults: ep %d n %d size %d window %d duration %v buffer per client %v", c.ef.ep, c.clients, c.size, c.window, c.duration, c.perClient)
	}
	if p, err := parseManyClients([]string{"-role", "clients", "-peer", "h1", "-buffer-per-client"}, io.Discard); err != nil || !p.perClient {
		t.Errorf("-buffer-per-client: %v, %v", p, err)
	}
	if c.goPerClient {
		t.Error("clients default to a goroutine per endpoint")
	}
	if p, err := parseManyClients([]string{"-role", "clients", "-peer", "h1", "-goroutine-per-client"}, io.Discard); err != nil || !p.goPerClient {
		t.Errorf("-goroutine-per-client: %v, %v", p, err)
	}
	if got := c.startAt.UnixMilli(); got != 1700000000500 {
		t.Errorf("-start-at: %d ms, want 1700000000500", got)
	}
	// 64 receives of 16 MiB: 1 GiB, the most.
	if _, err := parseManyClients([]string{"-role", "server", "-recvs", "64", "-max-size", "16M"}, io.Discard); err != nil {
		t.Errorf("-recvs 64 -max-size 16M: %v", err)
	}
	s, err := parseManyClients([]string{"-role", "server", "-recvs", "16", "-max-size", "1M"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if s.ef.ep != 0 || s.recvs != 16 || s.recvSize != 1<<20 || s.duration != 10*time.Minute {
		t.Errorf("server: ep %d recvs %d size %d duration %v", s.ef.ep, s.recvs, s.recvSize, s.duration)
	}
	u, err := parseManyClients([]string{"-role", "clients", "-peer", "h1", "-n", "8", "-umem", "-umem-gather", "descriptors"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if !u.umem || u.ef.umemBytes != 8*64<<10 || u.ef.umemGather != xdp.GatherDescriptors {
		t.Errorf("-umem: umem %v, buffer area %d bytes, gather %v", u.umem, u.ef.umemBytes, u.ef.umemGather)
	}
	// Each lent buffer takes whole UMEM frames.
	u, err = parseManyClients([]string{"-role", "clients", "-peer", "h1", "-n", "128", "-size", "1000", "-umem"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if want := 128 * xdp.DefaultFrameSize; u.ef.umemBytes != want {
		t.Errorf("-umem -n 128 -size 1000: buffer area %d bytes, want %d", u.ef.umemBytes, want)
	}
	if _, err := parseManyClients([]string{"-h"}, io.Discard); !errors.Is(err, flag.ErrHelp) {
		t.Errorf("-h: %v, want flag.ErrHelp", err)
	}
}

// TestManyClientsEndpointConfig checks that the endpoint flags reach
// msglayer: -spin was once parsed and then dropped, so every manyclients
// process polled adaptively whatever it was told.
func TestManyClientsEndpointConfig(t *testing.T) {
	for _, c := range []struct {
		args []string
		spin time.Duration
		busy bool
	}{
		{nil, 0, false},
		{[]string{"-spin", "0"}, msglayer.NoSpin, false},
		{[]string{"-spin", "500us"}, 500 * time.Microsecond, false},
		{[]string{"-busy"}, 0, true},
	} {
		args := append([]string{"-role", "server", "-i", "eth9", "-min-rto", "2ms", "-pull-blocks", "4", "-recv-budget", "-1"}, c.args...)
		mc, err := parseManyClients(args, io.Discard)
		if err != nil {
			t.Fatalf("%q: %v", args, err)
		}
		cfg := mc.endpointConfig(7)
		if cfg.SpinBeforeSleep != c.spin || cfg.BusyPoll != c.busy {
			t.Errorf("%q: SpinBeforeSleep %v, BusyPoll %v; want %v, %v", c.args, cfg.SpinBeforeSleep, cfg.BusyPoll, c.spin, c.busy)
		}
		if cfg.Interface != "eth9" || cfg.EndpointID != 7 || cfg.MinRTO != 2*time.Millisecond || cfg.PullBlocks != 4 || cfg.RecvBudget != -1 {
			t.Errorf("%q: interface %q, endpoint %d, min RTO %v, pull blocks %d, receive budget %d", c.args, cfg.Interface, cfg.EndpointID, cfg.MinRTO, cfg.PullBlocks, cfg.RecvBudget)
		}
	}
}

// TestManyClientsEndToEnd runs a manyclients server on h2 and clients on
// h1 of a fresh lab, driven by one goroutine and by one per endpoint, and
// parses their reports back: every message sent completed, none failed.
func TestManyClientsEndToEnd(t *testing.T) {
	lab := netlab.New(t, netlab.Options{Hosts: 2})
	bin := buildTool(t)
	h1, h2 := lab.Hosts[0], lab.Hosts[1]
	serverLog, _ := startServer(t, h2, bin, append(os.Environ(), "XMX_HOSTNAME=h2"),
		"manyclients", "-role", "server", "-i", "eth0", "-duration", "2m")
	for _, tc := range []struct {
		first   string
		flags   []string
		drivers int
	}{
		{"1", nil, 1},
		{"10", []string{"-goroutine-per-client"}, 4},
	} {
		args := append([]string{"manyclients", "-role", "clients", "-i", "eth0", "-e", tc.first, "-n", "4",
			"-peer", "h2", "-duration", "300ms", "-size", "64k", "-window", "2"}, tc.flags...)
		out := runClient(t, h1, bin, serverLog, args...)
		var rep mcClientsReport
		if err := json.Unmarshal(out, &rep); err != nil {
			t.Fatalf("%v: report %q: %v", tc.flags, out, err)
		}
		if rep.Role != "clients" || rep.Endpoints != 4 || rep.Drivers != tc.drivers {
			t.Errorf("%v: role %q, %d endpoints, %d drivers; want clients, 4, %d", tc.flags, rep.Role, rep.Endpoints, rep.Drivers, tc.drivers)
		}
		if rep.Messages == 0 || rep.MinPerEP == 0 || rep.Bytes != rep.Messages*64<<10 {
			t.Errorf("%v: %d messages (%d bytes), at least %d per endpoint", tc.flags, rep.Messages, rep.Bytes, rep.MinPerEP)
		}
		if rep.Failed != 0 || rep.Unfinished != 0 || len(rep.Errors) != 0 {
			t.Errorf("%v: %d failed, %d unfinished, errors %q", tc.flags, rep.Failed, rep.Unfinished, rep.Errors)
		}
		// The process waited for the server's answers at least once
		// (connects, if nothing else): getrusage's counts reached the report.
		if p := rep.Proc; p.CPUs <= 0 || p.SysCPUs <= 0 || p.SysCPUs > p.CPUs || p.VolCtxSw <= 0 || p.MaxRSSKiB <= 0 {
			t.Errorf("%v: process figures %+v", tc.flags, p)
		}
	}
}
