package xdp

import (
	"errors"
	"fmt"
	"net"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/xmx-stack/xmx/bpf"
)

// An interface carries at most one XDP program, so every AF_XDP link of this
// process on one interface shares one steering program; the last link to
// close detaches it. Interfaces are keyed by network namespace and ifindex,
// because two namespaces can hold interfaces with the same index.

type steerKey struct {
	netns   uint64 // inode of the network namespace
	ifindex int
}

type steerEntry struct {
	steer *bpf.Steering
	mode  bpf.AttachMode // the mode in force
	opts  bpf.LoadOptions
	refs  int
	// detached: the program is closed and the entry out of steerTab,
	// by the last link's Close or, before it, because the interface left
	// the namespace (detachGone). Guarded by steerMu.
	detached  bool
	detachErr error // what detachGone's close returned, for the last Close
}

var steerMu sync.Mutex

// +checklocks:steerMu
var steerTab = map[steerKey]*steerEntry{}

// currentNetns returns the inode of the calling thread's network namespace.
// The caller must have its OS thread locked if it switched namespaces.
func currentNetns() (uint64, error) {
	var st unix.Stat_t
	if err := unix.Stat("/proc/thread-self/ns/net", &st); err != nil {
		return 0, err
	}
	return st.Ino, nil
}

// acquireSteering returns the steering program of ifindex in the calling
// thread's namespace, loading and attaching it on first use.
func acquireSteering(ifname string, ifindex int, opts bpf.LoadOptions, mode bpf.AttachMode) (steerKey, *steerEntry, error) {
	ns, err := currentNetns()
	if err != nil {
		return steerKey{}, nil, &OpError{Op: "read network namespace", Interface: ifname, Err: err}
	}
	key := steerKey{netns: ns, ifindex: ifindex}

	steerMu.Lock()
	defer steerMu.Unlock()
	if e := steerTab[key]; e != nil {
		if e.opts.Frags != opts.Frags {
			return key, nil, &OpError{Op: "attach steering program", Interface: ifname,
				Err: fmt.Errorf("another AF_XDP link of this process holds the %s program here, this link needs the %s one: "+
					"the links of one interface must all be multi-buffer or all single-buffer (AFXDPConfig.MultiBuffer, MTU)",
					progKind(e.opts), progKind(opts))}
		}
		if e.opts.HardwareAddr != opts.HardwareAddr {
			return key, nil, &OpError{Op: "attach steering program", Interface: ifname,
				Err: fmt.Errorf("the interface's MAC changed from %v to %v since this process attached its program: "+
					"close the other links of the interface and open them again",
					net.HardwareAddr(e.opts.HardwareAddr[:]), net.HardwareAddr(opts.HardwareAddr[:]))}
		}
		if e.opts != opts {
			return key, nil, &OpError{Op: "attach steering program", Interface: ifname,
				Err: fmt.Errorf("already attached by this process for EtherType %#04x, want %#04x", e.opts.EtherType, opts.EtherType)}
		}
		if mode != bpf.AttachAuto && mode != e.mode {
			return key, nil, &OpError{Op: "attach steering program", Interface: ifname,
				Err: fmt.Errorf("already attached in %s mode, %s requested", e.mode, mode)}
		}
		e.refs++
		return key, e, nil
	}
	s, err := bpf.Load(opts)
	if err != nil {
		return key, nil, &OpError{Op: "load steering program", Interface: ifname, Err: err}
	}
	got, err := s.Attach(ifindex, mode)
	if err != nil {
		s.Close()
		return key, nil, &OpError{Op: "attach steering program", Interface: ifname, Err: err}
	}
	e := &steerEntry{steer: s, mode: got, opts: opts, refs: 1}
	steerTab[key] = e
	return key, e, nil
}

// progKind names the steering program variant opts selects.
func progKind(opts bpf.LoadOptions) string {
	if opts.Frags {
		return "multi-buffer (xdp.frags)"
	}
	return "single-buffer (xdp)"
}

// releaseSteering takes a closing link's socket, registered for queue (-1:
// none), out of the XSKMAP and drops its reference; the last one detaches
// the program.
func releaseSteering(key steerKey, e *steerEntry, queue int) error {
	steerMu.Lock()
	defer steerMu.Unlock()
	e.refs--
	if e.detached { // the program went with the interface: see detachGone
		if e.refs > 0 {
			return nil
		}
		return e.detachErr
	}
	var err error
	if queue >= 0 {
		err = e.steer.Unregister(queue)
	}
	if e.refs > 0 {
		return err
	}
	e.detached = true
	delete(steerTab, key)
	return errors.Join(err, e.steer.Close())
}

// detachGone closes the steering program of an interface that a link found
// gone (unless it is closed already), without waiting for the links'
// Close. The kernel removes a deleted device's program itself, but it
// leaves it on a device that moved to another namespace, where it would
// take that namespace's frames of the EtherType from the kernel (for
// sockets that are no longer bound) and refuse anyone else's program.
// Every socket of the interface is unbound by then, so the program serves
// none of this process's links any more.
func detachGone(key steerKey, e *steerEntry) {
	steerMu.Lock()
	defer steerMu.Unlock()
	if e.detached {
		return
	}
	e.detached = true
	delete(steerTab, key)
	e.detachErr = e.steer.Close()
}
