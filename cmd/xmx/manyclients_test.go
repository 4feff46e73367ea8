package main

import (
	"errors"
	"flag"
	"io"
	"strings"
	"testing"
	"time"

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
		{[]string{"-role", "clients", "-peer", "h1", "-recvs", "8"}, "-recvs is a server flag"},
		{[]string{"-role", "server", "-peer", "h1"}, "-peer is a clients flag"},
		{[]string{"-role", "server", "-recvs", "0"}, "-recvs 0"},
		{[]string{"-role", "server", "-e", "300"}, "-e 300"},
		{[]string{"-role", "server", "extra"}, "unexpected arguments"},
		{[]string{"-role", "server", "-umem"}, "-umem is a clients flag"},
		{[]string{"-role", "server", "-buffer-per-client"}, "-buffer-per-client is a clients flag"},
		{[]string{"-role", "clients", "-peer", "h1", "-umem-gather", "copy"}, "only with -umem"},
		{[]string{"-role", "clients", "-peer", "h1", "-umem", "-umem-gather", "some"}, `-umem-gather "some"`},
		{[]string{"-role", "clients", "-peer", "h1", "-umem", "-n", "255", "-size", "16M"}, "more than 1 GiB"},
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
	if got := c.startAt.UnixMilli(); got != 1700000000500 {
		t.Errorf("-start-at: %d ms, want 1700000000500", got)
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
