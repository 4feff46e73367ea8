package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"reflect"
	"strings"
	"text/tabwriter"

	"github.com/xmx-stack/xmx/msglayer"
	"github.com/xmx-stack/xmx/xdp"
)

// runInfo is "xmx info": what Open-MX's omx_info and omx_counters showed.
func runInfo(args []string) error { return info(os.Stdout, os.Stderr, args) }

// infoDoc is the -json document of xmx info.
type infoDoc struct {
	Netns      string                     `json:"netns"` // network namespace xmx info ran in
	Interfaces []ifaceJSON                `json:"interfaces,omitempty"`
	RunDir     string                     `json:"run_dir"`
	Processes  []msglayer.ProcessCounters `json:"processes"`
	Errors     []string                   `json:"errors,omitempty"` // counter sockets that could not be read
}

// ifaceJSON is an interface in the -json document. The XDP abilities are
// null when the kernel does not report XDP features.
type ifaceJSON struct {
	Name            string        `json:"name"`
	Index           int           `json:"index"`
	MAC             string        `json:"mac"`
	MTU             int           `json:"mtu"`
	Kind            string        `json:"kind,omitempty"`
	Flags           string        `json:"flags"`
	Up              bool          `json:"up"`
	OperState       string        `json:"oper_state"`
	Driver          string        `json:"driver"`
	DriverVersion   string        `json:"driver_version,omitempty"`
	FirmwareVersion string        `json:"firmware_version,omitempty"`
	BusInfo         string        `json:"bus_info,omitempty"`
	RxQueues        int           `json:"rx_queues"`
	TxQueues        int           `json:"tx_queues"`
	QueuesFrom      string        `json:"queues_from"`
	XDPFeatures     []string      `json:"xdp_features"` // null when unknown
	XDPFeaturesWhy  string        `json:"xdp_features_why,omitempty"`
	XDPZeroCopySegs int           `json:"xdp_zc_max_segs,omitempty"`
	NativeXDP       *bool         `json:"native_xdp"`
	GenericXDP      bool          `json:"generic_xdp"`
	ZeroCopy        *bool         `json:"zerocopy"`
	MultiBuffer     *bool         `json:"multibuffer"`
	XDPProgs        []xdp.XDPProg `json:"xdp_progs"`
}

func toJSON(ii xdp.IfaceInfo) ifaceJSON {
	j := ifaceJSON{
		Name: ii.Name, Index: ii.Index, MAC: ii.MAC.String(), MTU: ii.MTU, Kind: ii.Kind,
		Flags: ii.Flags.String(), Up: ii.Up(), OperState: ii.OperState,
		Driver: ii.Driver, DriverVersion: ii.DriverVersion, FirmwareVersion: ii.FirmwareVersion, BusInfo: ii.BusInfo,
		RxQueues: ii.RxQueues, TxQueues: ii.TxQueues, QueuesFrom: ii.QueuesFrom,
		XDPFeaturesWhy: ii.XDPFeaturesWhy, XDPZeroCopySegs: ii.XDPZeroCopyMaxSegs,
		GenericXDP: ii.GenericXDP(), XDPProgs: ii.XDPProgs,
	}
	if j.XDPProgs == nil {
		j.XDPProgs = []xdp.XDPProg{}
	}
	if ii.XDPFeaturesKnown {
		native, zc, mb := ii.NativeXDP(), ii.ZeroCopy(), ii.MultiBuffer()
		j.XDPFeatures, j.NativeXDP, j.ZeroCopy, j.MultiBuffer = ii.XDPFeatures.Names(), &native, &zc, &mb
	}
	return j
}

func info(stdout, stderr io.Writer, args []string) error {
	fs := flag.NewFlagSet("info", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), `usage: xmx info [flags] [IFACE]

Describes the network interfaces of this network namespace as xmx sees them
(driver, MTU, queues, state, the XDP features the driver advertises: native
XDP, AF_XDP zero-copy, multi-buffer; the XDP program attached), then the
counters of every xmx endpoint open on this machine: each process with open
endpoints publishes them on a Unix socket in the run directory
($XMX_RUN_DIR, else /run/xmx). With IFACE: that interface in detail and the
endpoints on it. Counters that are zero are left out unless -all is given.
Needs no root: every user sees the counters and the processes' command
lines (as /proc shows them to every user).

`)
		fs.PrintDefaults()
	}
	asJSON := fs.Bool("json", false, "print one JSON document")
	countersOnly := fs.Bool("counters-only", false, "only the endpoints' counters, no interface information")
	all := fs.Bool("all", false, "print every counter, zero ones included")
	peers := fs.Bool("peers", false, "list each endpoint's peers: state, MTU, round trip, frames in flight, rendezvous and pulls")
	runDir := fs.String("run-dir", "", "directory of the counter sockets (default $XMX_RUN_DIR, else /run/xmx)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 1 {
		return fmt.Errorf("%w: one IFACE at most, got %q", errUsage, fs.Args())
	}
	iface := fs.Arg(0)
	doc := infoDoc{RunDir: *runDir, Processes: []msglayer.ProcessCounters{}}
	if doc.RunDir == "" {
		doc.RunDir = msglayer.RunDir()
	}
	doc.Netns, _ = os.Readlink("/proc/self/ns/net")

	var ifaces []xdp.IfaceInfo
	if iface != "" {
		ii, err := xdp.InterfaceInfo(iface)
		if errors.Is(err, xdp.ErrNoInterface) {
			names := []string{}
			if all, err := xdp.Interfaces(); err == nil {
				for _, a := range all {
					names = append(names, a.Name)
				}
			}
			return fmt.Errorf("no interface %q in this network namespace; interfaces: %s", iface, strings.Join(names, ", "))
		}
		if err != nil {
			return err
		}
		ifaces = []xdp.IfaceInfo{ii}
	} else if !*countersOnly {
		var err error
		if ifaces, err = xdp.Interfaces(); err != nil {
			return err
		}
	}

	procs, err := msglayer.ReadPublished(doc.RunDir)
	if err != nil {
		doc.Errors = append(doc.Errors, err.Error())
	}
	for _, p := range procs {
		// With IFACE: only the endpoints on it, in this namespace.
		if iface != "" {
			var eps []msglayer.EndpointCounters
			for _, e := range p.Endpoints {
				if e.Interface == iface && (e.Netns == "" || e.Netns == doc.Netns) {
					eps = append(eps, e)
				}
			}
			p.Endpoints = eps
		}
		if len(p.Endpoints) > 0 {
			doc.Processes = append(doc.Processes, p)
		}
	}

	if *asJSON {
		if !*countersOnly {
			doc.Interfaces = []ifaceJSON{}
			for _, ii := range ifaces {
				doc.Interfaces = append(doc.Interfaces, toJSON(ii))
			}
		}
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(doc)
	}

	for _, e := range doc.Errors {
		fmt.Fprintf(stderr, "xmx info: %s\n", e)
	}
	if !*countersOnly {
		if iface != "" {
			printIface(stdout, ifaces[0])
		} else {
			printIfaceTable(stdout, ifaces)
		}
		fmt.Fprintln(stdout)
	}
	printEndpoints(stdout, &doc, *all, *peers)
	return nil
}

// yesNo renders a derived XDP ability, "?" when the features are unknown.
func yesNo(known, v bool) string {
	switch {
	case !known:
		return "?"
	case v:
		return "yes"
	}
	return "no"
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// progs renders the attached XDP programs: "name#id/mode", or "-".
func progs(ps []xdp.XDPProg) string {
	if len(ps) == 0 {
		return "-"
	}
	var s []string
	for _, p := range ps {
		name := p.Name
		if name == "" {
			name = "prog"
		}
		s = append(s, fmt.Sprintf("%s#%d/%s", name, p.ID, p.Mode))
	}
	return strings.Join(s, ",")
}

// state is the operational state, or "down" when the interface is
// administratively down.
func state(ii xdp.IfaceInfo) string {
	if !ii.Up() {
		return "down"
	}
	return ii.OperState
}

func printIfaceTable(w io.Writer, ifaces []xdp.IfaceInfo) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "iface\tdriver\tmtu\tqueues rx/tx\tstate\txdp native\tgeneric\tzerocopy\tmultibuf\tattached xdp")
	for _, ii := range ifaces {
		k := ii.XDPFeaturesKnown
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d/%d\t%s\t%s\t%s\t%s\t%s\t%s\n", ii.Name, orDash(ii.Driver), ii.MTU,
			ii.RxQueues, ii.TxQueues, state(ii), yesNo(k, ii.NativeXDP()), yesNo(true, ii.GenericXDP()),
			yesNo(k, ii.ZeroCopy()), yesNo(k, ii.MultiBuffer()), progs(ii.XDPProgs))
	}
	tw.Flush()
	for _, ii := range ifaces {
		if !ii.XDPFeaturesKnown {
			fmt.Fprintf(w, "(XDP features unknown: %s)\n", ii.XDPFeaturesWhy)
			break
		}
	}
}

func printIface(w io.Writer, ii xdp.IfaceInfo) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	k := ii.XDPFeaturesKnown
	fmt.Fprintf(tw, "interface\t%s (index %d)\n", ii.Name, ii.Index)
	fmt.Fprintf(tw, "mac\t%s\n", ii.MAC)
	fmt.Fprintf(tw, "mtu\t%d\n", ii.MTU)
	fmt.Fprintf(tw, "state\t%s (flags %s)\n", state(ii), ii.Flags)
	drv := orDash(ii.Driver)
	if ii.DriverVersion != "" {
		drv += " " + ii.DriverVersion
	}
	if ii.Kind != "" && ii.Kind != ii.Driver {
		drv += ", link kind " + ii.Kind
	}
	fmt.Fprintf(tw, "driver\t%s\n", drv)
	if ii.BusInfo != "" || ii.FirmwareVersion != "" {
		fmt.Fprintf(tw, "bus, firmware\t%s, %s\n", orDash(ii.BusInfo), orDash(ii.FirmwareVersion))
	}
	fmt.Fprintf(tw, "queues\trx %d, tx %d (%s)\n", ii.RxQueues, ii.TxQueues, ii.QueuesFrom)
	if k {
		fmt.Fprintf(tw, "xdp features\t%s\n", ii.XDPFeatures)
	} else {
		fmt.Fprintf(tw, "xdp features\tunknown: %s\n", ii.XDPFeaturesWhy)
	}
	fmt.Fprintf(tw, "native xdp\t%s\n", yesNo(k, ii.NativeXDP()))
	fmt.Fprintf(tw, "generic xdp\t%s\n", yesNo(true, ii.GenericXDP()))
	zc := yesNo(k, ii.ZeroCopy())
	if ii.ZeroCopy() {
		zc += fmt.Sprintf(" (at most %d buffers per frame)", ii.XDPZeroCopyMaxSegs)
	}
	fmt.Fprintf(tw, "af_xdp zero-copy\t%s\n", zc)
	fmt.Fprintf(tw, "multi-buffer\t%s\n", yesNo(k, ii.MultiBuffer()))
	if len(ii.XDPProgs) == 0 {
		fmt.Fprintf(tw, "xdp program\tnone\n")
	}
	for _, p := range ii.XDPProgs {
		fmt.Fprintf(tw, "xdp program\t%s (id %d) in %s mode\n", orDash(p.Name), p.ID, p.Mode)
	}
	tw.Flush()
}

func printEndpoints(w io.Writer, doc *infoDoc, all, peers bool) {
	n := 0
	for _, p := range doc.Processes {
		n += len(p.Endpoints)
	}
	fmt.Fprintf(w, "endpoints: %d open in %s (counters published in %s)\n", n, plural(len(doc.Processes), "process"), doc.RunDir)
	for _, p := range doc.Processes {
		fmt.Fprintf(w, "\npid %d: %s\n", p.PID, strings.Join(p.Cmdline, " "))
		shown := map[string]bool{} // link counters are per link: once per interface
		for _, e := range p.Endpoints {
			where := orDash(e.Interface)
			if e.Netns != "" && e.Netns != doc.Netns {
				where += " in netns " + e.Netns
			}
			fmt.Fprintf(w, "  endpoint %s (ep %d, host %s) on %s: %s %s, %s\n", e.Addr, e.EP, orDash(e.Hostname),
				where, e.LinkKind, e.LinkMode, plural(e.Peers, "peer"))
			fmt.Fprintf(w, "    link chosen: %s\n", e.LinkWhy)
			if peers {
				printPeers(w, "    ", e.PeerList)
			}
			printCounters(w, "    ", e.Counters, all)
			key := e.Interface + "@" + e.Netns
			if !shown[key] {
				shown[key] = true
				fmt.Fprintf(w, "    link %s (shared by this process's endpoints on it):\n", orDash(e.Interface))
				printCounters(w, "      ", e.LinkStats, all)
			}
		}
	}
}

// printPeers prints one line per peer.
func printPeers(w io.Writer, indent string, ps []msglayer.PeerInfo) {
	if len(ps) == 0 {
		return
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "%speer\tstate\tmtu\tsrtt µs\trto ms\tin flight\tooo\trndvs\tpulls\tretrans\theard ms ago\n", indent)
	for _, p := range ps {
		state := "connecting"
		switch {
		case p.Dead:
			state = "dead"
		case p.Local && p.Connected:
			state = "local"
		case p.Connected:
			state = "connected"
		}
		if p.Queued {
			state += ",queued"
		}
		fmt.Fprintf(tw, "%s%s\t%s\t%d\t%.1f\t%.1f\t%d/%d\t%d\t%d\t%d\t%d\t%.1f\n", indent, p.Addr, state, p.MTU,
			float64(p.SRTT)/1e3, float64(p.RTO)/1e6, p.InFlight, p.Window, p.OutOfOrd, p.Rndvs, p.Pulls, p.Retrans,
			float64(p.LastHeard)/1e6)
	}
	tw.Flush()
}

// plural renders "1 peer", "2 peers", "0 processes".
func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	if strings.HasSuffix(noun, "s") {
		return fmt.Sprintf("%d %ses", n, noun)
	}
	return fmt.Sprintf("%d %ss", n, noun)
}

// printCounters prints the numeric fields of a counter struct, one per
// line, zero ones only with all.
func printCounters(w io.Writer, indent string, counters any, all bool) {
	v := reflect.ValueOf(counters)
	t := v.Type()
	width := 0
	for i := range t.NumField() {
		width = max(width, len(t.Field(i).Name))
	}
	printed := 0
	for i := range t.NumField() {
		f := v.Field(i)
		var n uint64
		switch f.Kind() {
		case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
			n = f.Uint()
		case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
			n = uint64(f.Int())
		default:
			continue
		}
		if n == 0 && !all {
			continue
		}
		fmt.Fprintf(w, "%s%-*s %14d\n", indent, width, t.Field(i).Name, n)
		printed++
	}
	if printed == 0 {
		fmt.Fprintf(w, "%s(all zero)\n", indent)
	}
}
