package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/xmx-stack/xmx/internal/netlab"
	"github.com/xmx-stack/xmx/msglayer"
	"github.com/xmx-stack/xmx/xdp"
)

func TestInfoArgErrors(t *testing.T) {
	var out, errb bytes.Buffer
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"lo", "eth0"}, "IFACE"},
		{[]string{"-bogus"}, "-bogus"},
	} {
		err := info(&out, &errb, c.args)
		if !errors.Is(err, errUsage) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("xmx info %v: %v; want a usage error naming %q", c.args, err, c.want)
		}
	}
	err := info(&out, &errb, []string{"xmxnosuch0"})
	if err == nil || errors.Is(err, errUsage) || !strings.Contains(err.Error(), `no interface "xmxnosuch0"`) ||
		!strings.Contains(err.Error(), "lo") {
		t.Errorf("xmx info on a missing interface: %v; want an error naming it and listing the interfaces", err)
	}
}

// parseInfo runs xmx info in this process with args and parses its -json
// output.
func parseInfo(t *testing.T, args ...string) (infoDoc, map[string]any) {
	t.Helper()
	var out, errb bytes.Buffer
	if err := info(&out, &errb, append([]string{"-json"}, args...)); err != nil {
		t.Fatalf("xmx info -json %v: %v\n%s", args, err, errb.String())
	}
	var doc infoDoc
	var raw map[string]any
	if err := json.Unmarshal(out.Bytes(), &doc); err != nil {
		t.Fatalf("xmx info -json %v: %v\n%s", args, err, out.String())
	}
	json.Unmarshal(out.Bytes(), &raw)
	return doc, raw
}

// TestInfoLocal publishes two in-memory endpoints of this process and reads
// them back with xmx info, in JSON and as text.
func TestInfoLocal(t *testing.T) {
	dir := t.TempDir()
	t.Setenv(msglayer.RunDirEnv, dir)
	la, lb := xdp.NewPair(xdp.MemConfig{})
	a, err := msglayer.Open(msglayer.Config{Link: la, OwnLink: true, EndpointID: 1, Key: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := msglayer.Open(msglayer.Config{Link: lb, OwnLink: true, EndpointID: 2, Key: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := a.Connect(ctx, b.Addr(), 1); err != nil {
		t.Fatal(err)
	}
	if err := sendWait(ctx, a, b.Addr(), 7, []byte("hello")); err != nil {
		t.Fatal(err)
	}

	doc, raw := parseInfo(t, "-run-dir", dir)
	if doc.RunDir != dir || !strings.HasPrefix(doc.Netns, "net:[") {
		t.Errorf("run dir %q, netns %q", doc.RunDir, doc.Netns)
	}
	i := slices.IndexFunc(doc.Interfaces, func(j ifaceJSON) bool { return j.Name == "lo" })
	if i < 0 {
		t.Fatalf("no lo among %+v", doc.Interfaces)
	}
	if lo := doc.Interfaces[i]; !lo.GenericXDP || lo.MTU <= 0 || lo.XDPProgs == nil ||
		(lo.XDPFeatures != nil) != (lo.NativeXDP != nil) {
		t.Errorf("lo: %+v", lo)
	}
	if len(doc.Processes) != 1 || doc.Processes[0].PID != os.Getpid() || len(doc.Processes[0].Endpoints) != 2 {
		t.Fatalf("processes %+v, want this one with 2 endpoints", doc.Processes)
	}
	for _, e := range doc.Processes[0].Endpoints {
		if e.Counters.FramesOut == 0 || e.Counters.FramesIn == 0 || e.LinkKind != "mem" {
			t.Errorf("endpoint %+v", e)
		}
	}
	if _, ok := raw["interfaces"]; !ok {
		t.Error("no interfaces in the JSON document")
	}
	doc, raw = parseInfo(t, "-run-dir", dir, "-counters-only")
	if _, ok := raw["interfaces"]; ok || len(doc.Processes) != 1 {
		t.Errorf("-counters-only: %v", raw)
	}

	var out, errb bytes.Buffer
	if err := info(&out, &errb, []string{"-run-dir", dir}); err != nil {
		t.Fatal(err)
	}
	text := out.String()
	for _, want := range []string{"iface", "lo", "endpoints: 2 open in 1 process", a.Addr().String(), "FramesIn", "TxFrames"} {
		if !strings.Contains(text, want) {
			t.Errorf("xmx info output lacks %q:\n%s", want, text)
		}
	}
	if strings.Contains(text, "RegionRefused") {
		t.Errorf("a zero counter printed without -all:\n%s", text)
	}
	out.Reset()
	if err := info(&out, &errb, []string{"-run-dir", dir, "-all", "-counters-only"}); err != nil {
		t.Fatal(err)
	}
	if text := out.String(); !strings.Contains(text, "RegionRefused") || strings.Contains(text, "xdp native") {
		t.Errorf("xmx info -all -counters-only:\n%s", text)
	}

	// Peers: in the JSON document always, in the text with -peers.
	for _, e := range doc.Processes[0].Endpoints {
		if len(e.PeerList) != 1 || e.PeerList[0].MTU != 1500 || e.PeerList[0].Window == 0 {
			t.Errorf("endpoint %s peers %+v", e.Addr, e.PeerList)
		}
	}
	if pl := doc.Processes[0].Endpoints[0].PeerList; len(pl) == 1 {
		want := map[string]msglayer.Addr{a.Addr().String(): b.Addr(), b.Addr().String(): a.Addr()}[doc.Processes[0].Endpoints[0].Addr]
		if pl[0].Addr != want || !pl[0].Connected {
			t.Errorf("peer %+v, want %v connected", pl[0], want)
		}
	}
	out.Reset()
	if err := info(&out, &errb, []string{"-run-dir", dir, "-counters-only", "-peers"}); err != nil {
		t.Fatal(err)
	}
	if text := out.String(); !strings.Contains(text, "srtt µs") || !strings.Contains(text, b.Addr().String()+"  connected") {
		t.Errorf("xmx info -peers:\n%s", text)
	}
}

// TestInfoEndToEnd runs xmx info in a lab host while a pingpong server runs
// there: the interface shows the steering program, the endpoint its
// counters; from the other host, that endpoint is not on its eth0.
func TestInfoEndToEnd(t *testing.T) {
	lab := netlab.New(t, netlab.Options{Hosts: 2})
	bin := buildTool(t)
	runDir := t.TempDir()
	env := func(host string) []string {
		return append(os.Environ(), "XMX_HOSTNAME="+host, msglayer.RunDirEnv+"="+runDir)
	}
	h1, h2 := lab.Hosts[0], lab.Hosts[1]
	serverLog, stop := startServer(t, h2, bin, env("h2"), "pingpong", "-i", "eth0")

	var err error
	for try := 0; try < 20; try++ {
		c := h1.Command(bin, "pingpong", "-i", "eth0", "-e", "1", "-sizes", "8,4k", "-n", "50", "-warmup", "5", "h2")
		c.Env = env("h1")
		if _, err = c.Output(); err == nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("pingpong client: %v\nserver: %s", err, serverLog.String())
	}

	run := func(h *netlab.Host, args ...string) []byte {
		t.Helper()
		c := h.Command(bin, append([]string{"info"}, args...)...)
		c.Env = env(h.Name)
		out, err := c.Output()
		if err != nil {
			var ee *exec.ExitError
			if errors.As(err, &ee) {
				t.Fatalf("xmx info %v in %s: %v\n%s", args, h.Name, err, ee.Stderr)
			}
			t.Fatal(err)
		}
		return out
	}
	var doc infoDoc
	out := run(h2, "-json", "eth0")
	if err := json.Unmarshal(out, &doc); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if len(doc.Interfaces) != 1 {
		t.Fatalf("interfaces %+v", doc.Interfaces)
	}
	ifc := doc.Interfaces[0]
	if ifc.Name != "eth0" || ifc.Driver != "veth" || ifc.MAC != h2.MAC.String() ||
		len(ifc.XDPProgs) != 1 || ifc.XDPProgs[0].Mode != "drv" || !strings.HasPrefix(ifc.XDPProgs[0].Name, "xmx_steer") {
		t.Errorf("eth0 of h2 while the server runs: %+v", ifc)
	}
	if len(doc.Processes) != 1 || len(doc.Processes[0].Endpoints) != 1 {
		t.Fatalf("processes %+v, want the server with one endpoint", doc.Processes)
	}
	p := doc.Processes[0]
	e := p.Endpoints[0]
	if !slices.Contains(p.Cmdline, "pingpong") || e.Hostname != "h2" || e.EP != 0 || e.Interface != "eth0" ||
		e.LinkKind != "afxdp" || e.Peers < 1 || e.Counters.FramesIn < 100 || e.Counters.FramesOut < 100 ||
		e.LinkStats.RxFrames < 100 || e.Netns != doc.Netns {
		t.Errorf("the server's endpoint: pid %d %q: %+v", p.PID, p.Cmdline, e)
	}

	// The table form, from h1: its eth0 carries no program, and the
	// server's endpoint lives in h2's namespace.
	table := string(run(h1))
	if !strings.Contains(table, "eth0") || !strings.Contains(table, "veth") || !strings.Contains(table, "in netns") {
		t.Errorf("xmx info in h1:\n%s", table)
	}
	if err := json.Unmarshal(run(h1, "-json", "eth0"), &doc); err != nil || len(doc.Processes) != 0 ||
		len(doc.Interfaces[0].XDPProgs) != 0 {
		t.Errorf("xmx info -json eth0 in h1: %+v, %v; want no endpoint and no program", doc, err)
	}

	stop()
	if socks, _ := filepath.Glob(filepath.Join(runDir, "*.sock")); len(socks) != 0 {
		t.Errorf("counter sockets left after the server ended: %v", socks)
	}
}
