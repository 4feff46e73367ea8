package main

// Running tools: a server in the server host's namespace, a client in the
// client host's, each with a hard time limit, each in its own process group
// so that a timeout or Ctrl-C takes the whole tool down.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Env is what a system's measurement needs to know about the run.
type Env struct {
	ctx      context.Context
	Repo     string // repository root
	Quick    bool
	Progress io.Writer

	Lab      string
	ServerNS string // namespace of the server host (h2)
	ClientNS string // namespace of the client host (h1)
	ServerIP string
	ClientIP string
	Iface    string // lab interface inside each namespace
	MTU      int
	XMXFrom  string // which xmx binary the xmx rows run (set by xmxBinary)
	XMXTree  bool   // and it was built from the working tree (may hold uncommitted changes)
	XMXRev   string // -xmx-rev: build ./cmd/xmx of this commit
	// UMEMGather, when set, is passed to the *-umem rows as
	// "xmx stream -umem-gather MODE" (else xmx's default, auto).
	UMEMGather string

	// Pin, when set, maps a namespace to the CPU list its tools are pinned
	// to with taskset (server and client on different cores).
	Pin map[string]string

	// wrap turns (namespace, environment, argv) into the argv to execute;
	// by default "ip netns exec NS [taskset -c CPUS] env K=V... argv" (ip
	// netns exec remounts /sys, which UCX reads). Tests replace it to run
	// without namespaces.
	wrap func(ns string, env []string, argv []string) []string

	mu    sync.Mutex
	port  int
	procs map[*proc]bool
}

func (e *Env) nextPort() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.port == 0 {
		e.port = 20000
	}
	e.port++
	if e.port > 29999 {
		e.port = 20001
	}
	return e.port
}

func (e *Env) argv(ns string, env []string, argv []string) []string {
	if e.wrap != nil {
		return e.wrap(ns, env, argv)
	}
	out := []string{"ip", "netns", "exec", ns}
	if cpus := e.Pin[ns]; cpus != "" && argv[0] != "ss" {
		out = append(out, "taskset", "-c", cpus)
	}
	if len(env) > 0 {
		out = append(out, "env")
		out = append(out, env...)
	}
	return append(out, argv...)
}

// toolError is a failed measurement: which tool, the exact command, what it said.
type toolError struct {
	Tool    string
	Command string
	Msg     string
	Stderr  string
}

func (t *toolError) Error() string {
	s := fmt.Sprintf("%s failed: %s\n    command: %s", t.Tool, t.message(), t.Command)
	if t.Stderr != "" {
		s += "\n    output tail: " + strings.ReplaceAll(t.Stderr, "\n", "\n        ")
	}
	return s
}

// message is Msg without a repeated "tool: " prefix (parsers add one).
func (t *toolError) message() string {
	return strings.TrimPrefix(t.Msg, t.Tool+": ")
}

// proc is one running tool.
type proc struct {
	cmd     *exec.Cmd
	command string // for messages
	stdout  lockedBuffer
	stderr  lockedBuffer
	done    chan struct{}
	err     error // exit status, valid after done
}

// lockedBuffer is a bytes.Buffer safe for a writer goroutine and a reader.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.b.Len() > 4<<20 { // no tool here prints that much; do not hoard memory if one does
		return len(p), nil
	}
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func shellQuote(args []string) string {
	q := make([]string, len(args))
	for i, a := range args {
		if a == "" || strings.ContainsAny(a, " \t\n'\"$\\*?;&|<>()[]{}") {
			a = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
		}
		q[i] = a
	}
	return strings.Join(q, " ")
}

// start runs argv (already wrapped) in its own process group; it is killed
// when limit passes or the run is cancelled.
func (e *Env) start(argv []string, limit time.Duration) (*proc, error) {
	p := &proc{command: shellQuote(argv), done: make(chan struct{})}
	p.cmd = exec.Command(argv[0], argv[1:]...)
	p.cmd.Stdout = &p.stdout
	p.cmd.Stderr = &p.stderr
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := p.cmd.Start(); err != nil {
		return nil, err
	}
	e.mu.Lock()
	if e.procs == nil {
		e.procs = map[*proc]bool{}
	}
	e.procs[p] = true
	e.mu.Unlock()
	go func() {
		p.err = p.cmd.Wait()
		e.mu.Lock()
		delete(e.procs, p)
		e.mu.Unlock()
		close(p.done)
	}()
	go func() {
		t := time.NewTimer(limit)
		defer t.Stop()
		select {
		case <-p.done:
		case <-t.C:
			p.kill()
		case <-e.ctx.Done():
			p.kill()
		}
	}()
	return p, nil
}

// kill ends the process group: SIGTERM, then SIGKILL if it lingers.
func (p *proc) kill() {
	pid := p.cmd.Process.Pid
	_ = syscall.Kill(-pid, syscall.SIGTERM)
	select {
	case <-p.done:
		return
	case <-time.After(time.Second):
	}
	_ = syscall.Kill(-pid, syscall.SIGKILL)
	<-p.done
}

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// waitFor waits up to d for the process to exit by itself; false if it did not.
func (p *proc) waitFor(d time.Duration) bool {
	select {
	case <-p.done:
		return true
	case <-time.After(d):
		return false
	}
}

// killAll ends every tool still running (used on the way out).
func (e *Env) killAll() {
	e.mu.Lock()
	ps := make([]*proc, 0, len(e.procs))
	for p := range e.procs {
		ps = append(ps, p)
	}
	e.mu.Unlock()
	for _, p := range ps {
		p.kill()
	}
}

// tail returns the last n lines of s, trimmed, without terminal escapes.
func tail(s string, n int) string {
	s = strings.TrimRight(ansiRE.ReplaceAllString(s, ""), "\n ")
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// Readiness says how to know a server is ready for its client.
type Readiness struct {
	Proto string // "tcp" or "udp": wait until the port listens (ss in the server namespace)
	Port  int
	Line  string // or: wait until the server prints a line containing this
}

// pair is one server/client measurement.
type pair struct {
	Tool        string   // name for messages ("ucx_perftest")
	Env         []string // environment for both sides ("UCX_TLS=tcp")
	ServerEnv   []string // and for one side only
	ClientEnv   []string
	Server      []string // server argv (runs in ServerNS)
	Client      []string // client argv (runs in ClientNS)
	Ready       Readiness
	Limit       time.Duration // hard limit for the client
	ServerLives bool          // the server runs until killed (sockperf sr)
}

// runOut is what a client printed, and how it was started.
type runOut struct {
	Stdout, Stderr string
	Command        string // the client's command line
	Server         string // what the server printed (stdout, then stderr) by the end of the run
}

// All is stdout then stderr (for tools that mix their report into both).
func (r runOut) All() string { return r.Stdout + r.Stderr }

// runPair starts the server, waits until it is ready, runs the client to
// completion and collects the server.
func (e *Env) runPair(pr pair) (runOut, error) {
	cliArgv := e.argv(e.ClientNS, append(slices.Clone(pr.Env), pr.ClientEnv...), pr.Client)
	ro := runOut{Command: shellQuote(cliArgv)}
	if err := e.ctx.Err(); err != nil {
		return ro, err
	}
	limit := pr.Limit + 15*time.Second
	srvArgv := e.argv(e.ServerNS, append(slices.Clone(pr.Env), pr.ServerEnv...), pr.Server)
	srv, err := e.start(srvArgv, limit)
	if err != nil {
		return ro, &toolError{Tool: pr.Tool, Command: shellQuote(srvArgv), Msg: "cannot start server: " + err.Error()}
	}
	defer func() {
		if !srv.exited() {
			srv.kill()
		}
	}()
	if err := e.waitReady(srv, pr.Ready, 10*time.Second); err != nil {
		return ro, &toolError{Tool: pr.Tool, Command: srv.command, Msg: "server not ready: " + err.Error(),
			Stderr: tail(srv.stdout.String()+srv.stderr.String(), 8)}
	}
	cli, err := e.start(cliArgv, pr.Limit)
	if err != nil {
		return ro, &toolError{Tool: pr.Tool, Command: ro.Command, Msg: "cannot start client: " + err.Error()}
	}
	start := time.Now()
	<-cli.done
	ro.Stdout, ro.Stderr = cli.stdout.String(), cli.stderr.String()
	ro.Server = srv.stdout.String() + srv.stderr.String()
	if e.ctx.Err() != nil {
		return ro, e.ctx.Err()
	}
	if time.Since(start) >= pr.Limit {
		return ro, &toolError{Tool: pr.Tool, Command: ro.Command, Msg: fmt.Sprintf("client killed after the %v limit", pr.Limit),
			Stderr: tail(ro.All(), 8) + serverSaid(srv)}
	}
	if cli.err != nil {
		return ro, &toolError{Tool: pr.Tool, Command: ro.Command, Msg: "client: " + cli.err.Error(),
			Stderr: tail(ro.Stderr+"\n"+ro.Stdout, 8) + serverSaid(srv)}
	}
	if !pr.ServerLives && !srv.waitFor(5*time.Second) {
		// The measurement is done; a server that does not leave is only noted.
		fmt.Fprintf(e.Progress, "\nnote: %s server still running 5s after its client; killed\n", pr.Tool)
	}
	return ro, nil
}

func serverSaid(srv *proc) string {
	s := tail(srv.stdout.String()+srv.stderr.String(), 4)
	if s == "" {
		return ""
	}
	return "\n[server] " + strings.ReplaceAll(s, "\n", "\n[server] ")
}

// waitReady polls until the server is ready, or fails when the server exits
// or the deadline passes.
func (e *Env) waitReady(srv *proc, r Readiness, d time.Duration) error {
	deadline := time.Now().Add(d)
	for {
		if r.Line != "" && strings.Contains(srv.stdout.String()+srv.stderr.String(), r.Line) {
			return nil
		}
		if srv.exited() {
			return fmt.Errorf("server exited before it was ready (%v)", srv.err)
		}
		if err := e.ctx.Err(); err != nil {
			return err
		}
		switch {
		case r.Line != "":
		case r.Port != 0:
			flag := "-Hltn"
			if r.Proto == "udp" {
				flag = "-Hlun"
			}
			argv := e.argv(e.ServerNS, nil, []string{"ss", flag, "sport = :" + strconv.Itoa(r.Port)})
			out, err := exec.CommandContext(e.ctx, argv[0], argv[1:]...).Output()
			if err == nil && len(bytes.TrimSpace(out)) > 0 {
				return nil
			}
		default:
			return nil
		}
		if time.Now().After(deadline) {
			return errors.New("timed out waiting for it to listen")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// runLocal runs argv in the root namespace with a limit and returns stdout.
func (e *Env) runLocal(tool string, argv []string, limit time.Duration) (string, error) {
	p, err := e.start(argv, limit)
	if err != nil {
		return "", &toolError{Tool: tool, Command: shellQuote(argv), Msg: err.Error()}
	}
	start := time.Now()
	<-p.done
	if e.ctx.Err() != nil {
		return "", e.ctx.Err()
	}
	if time.Since(start) >= limit {
		return "", &toolError{Tool: tool, Command: p.command, Msg: fmt.Sprintf("killed after the %v limit", limit),
			Stderr: tail(p.stderr.String(), 8)}
	}
	if p.err != nil {
		return "", &toolError{Tool: tool, Command: p.command, Msg: p.err.Error(), Stderr: tail(p.stderr.String()+"\n"+p.stdout.String(), 8)}
	}
	return p.stdout.String(), nil
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}
