//go:build linux

package netlab

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
)

// The reaper removes the labs this process brought up under names it made
// up ([Up] without Options.Name) when the process dies before it removed
// them itself: a panic in a subtest (which ends the test binary before its
// parents' cleanups run), a -timeout, a kill. It is a shell started at the
// first such lab, in a process group of its own (a Ctrl-C to the test does
// not reach it), whose standard input is a pipe only this process writes
// to: when this process dies, however it dies, the kernel closes the pipe,
// the shell reads end of file and takes every lab still listed in its file
// down. A lab leaves the list once Down removed it, so the reaper never
// touches a lab of the same name that another process makes later.
//
// One owner: reaper.mu guards the list and its file.
var reaper struct {
	mu    sync.Mutex
	err   error    // the reaper could not start: labs are not covered
	pipe  *os.File // the write end; never written, open until the process dies
	file  string   // the list the shell reads, one lab name per line
	names []string // what file holds
}

// reaperScript runs in the reaper: $1 is scripts/lab, $2 the list, $3 the
// directory holding it.
const reaperScript = `cat >/dev/null
while read -r name; do
	"$1" down --name "$name" >/dev/null 2>&1
done <"$2"
rm -rf "$3"
`

// startReaperLocked starts the reaper unless it runs (or failed to start).
//
// +checklocks:reaper.mu
func startReaperLocked() error {
	if reaper.pipe != nil || reaper.err != nil {
		return reaper.err
	}
	reaper.err = func() error {
		lab, err := script()
		if err != nil {
			return err
		}
		dir, err := os.MkdirTemp("", "xmx-netlab-reaper-")
		if err != nil {
			return err
		}
		file := filepath.Join(dir, "labs")
		if err := os.WriteFile(file, nil, 0o600); err != nil {
			os.RemoveAll(dir)
			return err
		}
		r, w, err := os.Pipe() // close-on-exec: no other child holds w
		if err != nil {
			os.RemoveAll(dir)
			return err
		}
		defer r.Close()
		cmd := exec.Command("bash", "-c", reaperScript, "xmx-netlab-reaper", lab, file, dir)
		cmd.Stdin = r // stdout and stderr: /dev/null, not the test's pipes
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		if err := cmd.Start(); err != nil {
			w.Close()
			os.RemoveAll(dir)
			return err
		}
		go cmd.Wait() // reaps the shell should it end before this process
		reaper.pipe, reaper.file = w, file
		return nil
	}()
	if reaper.err != nil {
		reaper.err = fmt.Errorf("netlab: starting the lab reaper: %w", reaper.err)
	}
	return reaper.err
}

// reapLater lists lab name for the reaper, starting it if need be.
func reapLater(name string) error {
	reaper.mu.Lock()
	defer reaper.mu.Unlock()
	if err := startReaperLocked(); err != nil {
		return err
	}
	reaper.names = append(reaper.names, name)
	return writeReapListLocked()
}

// reaped takes lab name off the reaper's list, once Down removed it.
func reaped(name string) {
	reaper.mu.Lock()
	defer reaper.mu.Unlock()
	i := slices.Index(reaper.names, name)
	if i < 0 {
		return
	}
	reaper.names = slices.Delete(reaper.names, i, i+1)
	writeReapListLocked() // on failure the reaper downs a removed lab: harmless, Down is idempotent
}

// writeReapListLocked replaces the reaper's file with reaper.names, whole
// (a rename: the shell never reads half a list).
//
// +checklocks:reaper.mu
func writeReapListLocked() error {
	var b strings.Builder
	for _, n := range reaper.names {
		b.WriteString(n + "\n")
	}
	tmp := reaper.file + ".new"
	if err := os.WriteFile(tmp, []byte(b.String()), 0o600); err != nil {
		return fmt.Errorf("netlab: listing labs for the reaper: %w", err)
	}
	if err := os.Rename(tmp, reaper.file); err != nil {
		return fmt.Errorf("netlab: listing labs for the reaper: %w", err)
	}
	return nil
}
