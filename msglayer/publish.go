package msglayer

// Publishing counters (what Open-MX's omx_counters read from the driver):
// every process with open endpoints listens on a Unix socket
// <run dir>/<pid>.sock; a client that connects gets one JSON document (a
// ProcessCounters) and the connection is closed. The listener starts with
// the process's first endpoint and goes away, socket file included, with
// its last. Nothing here runs on the data path: counters are read only when
// a client asks. When the directory cannot be created or the socket bound,
// publishing is off for that process, silently; until it has no endpoint
// left.

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/xmx-stack/xmx/xdp"
)

// RunDirEnv names the environment variable that moves the directory of
// the counter sockets away from DefaultRunDir.
const RunDirEnv = "XMX_RUN_DIR"

// DefaultRunDir is where processes publish their endpoints' counters.
const DefaultRunDir = "/run/xmx"

// RunDir returns the directory of the counter sockets: $XMX_RUN_DIR, else
// DefaultRunDir.
func RunDir() string {
	if d := os.Getenv(RunDirEnv); d != "" {
		return d
	}
	return DefaultRunDir
}

// publishingDir is where this process publishes: RunDir(), except that a test
// binary publishes only when $XMX_RUN_DIR names a directory (so that
// "go test" leaves /run/xmx, and what "xmx info" shows, alone).
func publishingDir() (string, bool) {
	if os.Getenv(RunDirEnv) == "" && testing.Testing() {
		return "", false
	}
	return RunDir(), true
}

// ProcessCounters is what one process publishes.
type ProcessCounters struct {
	PID       int                `json:"pid"`
	Cmdline   []string           `json:"cmdline"`
	Endpoints []EndpointCounters `json:"endpoints"`
	// Socket is the socket it was read from (set by ReadPublished).
	Socket string `json:"socket,omitempty"`
}

// EndpointCounters describes one open endpoint and its counters.
type EndpointCounters struct {
	Interface string     `json:"interface"`       // "" for a link given to Open
	Netns     string     `json:"netns,omitempty"` // network namespace of the opener, "net:[4026531840]"
	Hostname  string     `json:"hostname"`        // the name the endpoint answers host queries for
	EP        int        `json:"ep"`              // endpoint id
	Addr      string     `json:"addr"`            // Addr.String(): MAC:ep
	LinkKind  string     `json:"link_kind"`       // "afxdp", "afpacket", "mem"
	LinkMode  string     `json:"link_mode"`       // xdp.Info.Mode: "copy drv poll"...
	LinkQueue int        `json:"link_queue"`      // receive queue, -1 when not applicable
	LinkWhy   string     `json:"link_why"`        // why this link kind was chosen
	BusyPoll  bool       `json:"busy_poll"`       // waits spin instead of sleeping
	Peers     int        `json:"peers"`           // peers known to the endpoint
	PeerList  []PeerInfo `json:"peer_list"`       // their channels
	Counters  Counters   `json:"counters"`
	LinkStats xdp.Stats  `json:"link_stats"` // shared by the endpoints of one link
}

// pubEntry is a published endpoint.
type pubEntry struct {
	e     *Endpoint
	netns string
}

var pub struct {
	mu sync.Mutex
	// +checklocks:mu
	eps []pubEntry
	// +checklocks:mu
	ln *net.UnixListener // nil when not listening
	// +checklocks:mu
	path string // where ln is bound (listenPublished)
	// +checklocks:mu
	done chan struct{} // closed when ln's server goroutine has left
	// +checklocks:mu
	off bool // the listener could not be started: do not retry until no endpoint is open
}

// registerPublished adds e to the endpoints this process publishes,
// starting the listener with the first one. Open calls it once e is
// registered with its engine.
func registerPublished(e *Endpoint) {
	ns, _ := os.Readlink("/proc/thread-self/ns/net")
	pub.mu.Lock()
	defer pub.mu.Unlock()
	pub.eps = append(pub.eps, pubEntry{e: e, netns: ns})
	if pub.ln == nil && !pub.off {
		pub.off = true
		if dir, ok := publishingDir(); ok {
			if ln, path := listenPublished(dir); ln != nil {
				pub.ln, pub.path, pub.done, pub.off = ln, path, make(chan struct{}), false
				go servePublished(ln, pub.done)
			}
		}
	}
}

// unregisterPublished removes e (Close calls it first, so that no client
// reads an endpoint being closed); the last endpoint stops the listener
// and removes the socket before it returns.
func unregisterPublished(e *Endpoint) {
	pub.mu.Lock()
	i := slices.IndexFunc(pub.eps, func(p pubEntry) bool { return p.e == e })
	if i < 0 {
		pub.mu.Unlock()
		return
	}
	pub.eps = slices.Delete(pub.eps, i, i+1)
	var done chan struct{}
	if len(pub.eps) == 0 {
		pub.off = false
		if pub.ln != nil {
			// Under the lock, the socket goes before a new first
			// endpoint could bind the same path.
			os.Remove(pub.path)
			pub.ln.Close()
			pub.ln, done = nil, pub.done
		}
	}
	pub.mu.Unlock()
	if done != nil {
		<-done // the server goroutine finishes its client, if any, and leaves
	}
}

// listenPublished binds <dir>/<pid>.sock and returns its listener and
// path, or nil. The socket is bound and listening under a name readers
// pass by before it is renamed into place: a reader that finds a socket
// at a .sock path and has its connection refused knows that its process
// is gone, and may remove it (ReadPublished).
func listenPublished(dir string) (*net.UnixListener, string) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, ""
	}
	path := filepath.Join(dir, strconv.Itoa(os.Getpid())+".sock")
	tmp := filepath.Join(dir, fmt.Sprintf("%d.%x.tmp", os.Getpid(), time.Now().UnixNano()))
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: tmp, Net: "unix"})
	if err != nil {
		return nil, ""
	}
	ln.SetUnlinkOnClose(false) // the socket is renamed: unregisterPublished removes it
	// Counters are no secret (the command line is in /proc too): let
	// "xmx info" read them without root.
	os.Chmod(tmp, 0o666)
	// A socket at path is one left by a dead process that had our pid,
	// unless a live one (another pid namespace sharing the directory)
	// answers.
	if c, err := net.DialTimeout("unix", path, 100*time.Millisecond); err == nil {
		c.Close()
		ln.Close()
		os.Remove(tmp)
		return nil, ""
	}
	if err := os.Rename(tmp, path); err != nil {
		ln.Close()
		os.Remove(tmp)
		return nil, ""
	}
	return ln, path
}

// servePublished answers clients of ln until ln is closed.
func servePublished(ln *net.UnixListener, done chan struct{}) {
	defer close(done)
	for {
		c, err := ln.AcceptUnix()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			time.Sleep(50 * time.Millisecond) // EMFILE and the like: try again later
			continue
		}
		doc := publishedSnapshot()
		c.SetWriteDeadline(time.Now().Add(time.Second))
		json.NewEncoder(c).Encode(doc)
		c.Close()
	}
}

// publishedSnapshot reads the counters of every published endpoint. It
// holds pub.mu throughout, so Close (which unregisters first) waits for it
// and no endpoint or link is read while it closes.
func publishedSnapshot() ProcessCounters {
	doc := ProcessCounters{PID: os.Getpid(), Cmdline: os.Args, Endpoints: []EndpointCounters{}}
	pub.mu.Lock()
	defer pub.mu.Unlock()
	for _, p := range pub.eps {
		e := p.e
		info, why := e.LinkInfo()
		ifname := info.Interface
		if ifname == "" {
			ifname = e.cfg.Interface
		}
		peers := e.Peers()
		doc.Endpoints = append(doc.Endpoints, EndpointCounters{
			Interface: ifname,
			Netns:     p.netns,
			Hostname:  e.cfg.Hostname,
			EP:        int(e.id),
			Addr:      e.addr.String(),
			LinkKind:  info.Kind,
			LinkMode:  info.Mode,
			LinkQueue: info.Queue,
			LinkWhy:   why,
			BusyPoll:  e.cfg.BusyPoll,
			Peers:     len(peers),
			PeerList:  peers,
			Counters:  e.Counters(),
			LinkStats: e.LinkStats(),
		})
	}
	return doc
}

// ReadPublished reads the counters every live process publishes in dir
// ("" means RunDir()), ordered by pid. Sockets nobody listens on (their
// process died without closing its endpoints) are removed. A missing dir
// means no process publishes. Sockets that could not be read are skipped
// and named in the error, returned with what could be read.
func ReadPublished(dir string) ([]ProcessCounters, error) {
	if dir == "" {
		dir = RunDir()
	}
	ents, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("msglayer: reading published counters in %s: %w", dir, err)
	}
	var out []ProcessCounters
	var errs []error
	for _, ent := range ents {
		name := ent.Name()
		path := filepath.Join(dir, name)
		if filepath.Ext(name) == ".tmp" {
			removeStaleTmp(path)
			continue
		}
		if filepath.Ext(name) != ".sock" {
			continue
		}
		pc, err := readPublished(path)
		switch {
		case err == nil:
			out = append(out, pc)
		case errors.Is(err, syscall.ECONNREFUSED):
			os.Remove(path) // dead process
		case errors.Is(err, fs.ErrNotExist), errors.Is(err, syscall.ECONNRESET), errors.Is(err, io.EOF):
			// its process closed its last endpoint meanwhile (a client
			// the listener had not accepted yet is reset)
		default:
			errs = append(errs, err)
		}
	}
	slices.SortFunc(out, func(a, b ProcessCounters) int { return a.PID - b.PID })
	return out, errors.Join(errs...)
}

// staleTmpAge is how old a socket under its temporary name must be for a
// reader to take it for one left by a process that died between its bind
// and its rename (listenPublished holds that name for a dial's time).
const staleTmpAge = time.Minute

// removeStaleTmp removes the socket at path, under its temporary name, if
// it is older than staleTmpAge and nobody listens on it.
func removeStaleTmp(path string) {
	fi, err := os.Lstat(path)
	if err != nil || fi.Mode().Type() != fs.ModeSocket || time.Since(fi.ModTime()) < staleTmpAge {
		return
	}
	c, err := net.DialTimeout("unix", path, time.Second)
	if err == nil {
		c.Close()
		return
	}
	if errors.Is(err, syscall.ECONNREFUSED) {
		os.Remove(path)
	}
}

// readPublished reads one process's document from the socket at path.
func readPublished(path string) (ProcessCounters, error) {
	var pc ProcessCounters
	c, err := net.DialTimeout("unix", path, time.Second)
	if err != nil {
		return pc, fmt.Errorf("msglayer: connecting to %s: %w", path, err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(2 * time.Second))
	if err := json.NewDecoder(c).Decode(&pc); err != nil {
		return pc, fmt.Errorf("msglayer: reading counters from %s: %w", path, err)
	}
	pc.Socket = path
	return pc, nil
}
