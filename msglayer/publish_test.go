package msglayer

import (
	"bytes"
	"context"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/xmx-stack/xmx/xdp"
)

// publishDir points the counter sockets at a fresh directory for the test.
// It fails if endpoints of an earlier test are still open (their listener
// would be elsewhere).
func publishDir(t *testing.T) string {
	t.Helper()
	pub.mu.Lock()
	n := len(pub.eps)
	pub.mu.Unlock()
	if n != 0 {
		t.Fatalf("%d endpoints of earlier tests are still open", n)
	}
	dir := t.TempDir()
	t.Setenv(RunDirEnv, dir)
	return dir
}

func TestPublished(t *testing.T) {
	dir := publishDir(t)
	sock := filepath.Join(dir, strconv.Itoa(os.Getpid())+".sock")

	// A socket its process left behind (killed): nobody listens on it.
	stale := filepath.Join(dir, "999999999.sock")
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: stale, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	ln.SetUnlinkOnClose(false)
	ln.Close()
	os.WriteFile(filepath.Join(dir, "notes.txt"), []byte("not a socket"), 0o644)

	la, lb := xdp.NewPair(xdp.MemConfig{})
	a, err := Open(Config{Link: la, OwnLink: true, EndpointID: 1, Key: 7, Hostname: "ha"})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	if _, err := os.Stat(sock); err != nil {
		t.Fatalf("no counter socket after Open: %v", err)
	}
	b, err := Open(Config{Link: lb, OwnLink: true, EndpointID: 2, Key: 7, Hostname: "hb"})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := a.Connect(ctx, b.Addr(), 7); err != nil {
		t.Fatal(err)
	}
	msg := bytes.Repeat([]byte("x"), 3000)
	rbuf := make([]byte, len(msg))
	rr, err := b.Irecv(1, ^uint64(0), [][]byte{rbuf}, nil)
	if err != nil {
		t.Fatal(err)
	}
	sr, err := a.Isend(b.Addr(), 1, [][]byte{msg}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Wait(ctx, rr); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Wait(ctx, sr); err != nil {
		t.Fatal(err)
	}

	procs, err := ReadPublished(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(procs) != 1 || procs[0].PID != os.Getpid() || len(procs[0].Cmdline) == 0 || procs[0].Socket != sock {
		t.Fatalf("ReadPublished = %+v, want this process (pid %d) alone, from %s", procs, os.Getpid(), sock)
	}
	eps := procs[0].Endpoints
	if len(eps) != 2 {
		t.Fatalf("published endpoints %+v, want 2", eps)
	}
	for i, e := range []*Endpoint{a, b} {
		got := eps[i]
		if got.Addr != e.Addr().String() || got.EP != int(e.id) || got.LinkKind != "mem" || got.Peers != 1 ||
			got.Hostname != e.cfg.Hostname || got.LinkWhy != "link given" {
			t.Errorf("endpoint %d published as %+v", i, got)
		}
		c := got.Counters
		if c.FramesIn == 0 || c.FramesOut == 0 || c.BytesIn == 0 || c.BytesOut == 0 || got.LinkStats.TxFrames == 0 || got.LinkStats.RxFrames == 0 {
			t.Errorf("endpoint %s: zero counters %+v, link %+v", got.Addr, c, got.LinkStats)
		}
	}
	if eps[0].Counters.Sends != 1 || eps[1].Counters.Recvs != 1 {
		t.Errorf("sends %d, receives %d; want 1 and 1", eps[0].Counters.Sends, eps[1].Counters.Recvs)
	}
	if _, err := os.Stat(stale); !os.IsNotExist(err) {
		t.Errorf("the stale socket is still there (%v)", err)
	}

	a.Close()
	procs, err = ReadPublished(dir)
	if err != nil || len(procs) != 1 || len(procs[0].Endpoints) != 1 || procs[0].Endpoints[0].EP != 2 {
		t.Errorf("after closing endpoint 1: %+v, %v; want endpoint 2 alone", procs, err)
	}
	b.Close()
	if _, err := os.Stat(sock); !os.IsNotExist(err) {
		t.Errorf("counter socket still there after the last Close (%v)", err)
	}
	if procs, err := ReadPublished(dir); err != nil || len(procs) != 0 {
		t.Errorf("after closing every endpoint: %+v, %v", procs, err)
	}
	if procs, err := ReadPublished(filepath.Join(dir, "missing")); err != nil || procs != nil {
		t.Errorf("ReadPublished of a missing directory: %+v, %v; want nothing", procs, err)
	}
}

// TestPublishedOff: a directory that cannot be made turns publishing off
// without failing Open; the next first endpoint tries again.
func TestPublishedOff(t *testing.T) {
	dir := publishDir(t)
	file := filepath.Join(dir, "file")
	os.WriteFile(file, nil, 0o644)
	t.Setenv(RunDirEnv, filepath.Join(file, "sub"))
	la, lb := xdp.NewPair(xdp.MemConfig{})
	a, err := Open(Config{Link: la, OwnLink: true, EndpointID: 1})
	if err != nil {
		t.Fatalf("Open with an impossible run directory: %v", err)
	}
	b, err := Open(Config{Link: lb, OwnLink: true, EndpointID: 2})
	if err != nil {
		t.Fatal(err)
	}
	pub.mu.Lock()
	off, listening := pub.off, pub.ln != nil
	pub.mu.Unlock()
	if !off || listening {
		t.Errorf("publishing off %v, listening %v; want off", off, listening)
	}
	a.Close()
	b.Close()

	t.Setenv(RunDirEnv, dir)
	la, _ = xdp.NewPair(xdp.MemConfig{})
	c, err := Open(Config{Link: la, OwnLink: true, EndpointID: 3})
	if err != nil {
		t.Fatal(err)
	}
	procs, err := ReadPublished(dir)
	c.Close()
	if err != nil || len(procs) != 1 || len(procs[0].Endpoints) != 1 || procs[0].Endpoints[0].EP != 3 {
		t.Errorf("after publishing was off and every endpoint closed, a new one: %+v, %v", procs, err)
	}
}

// TestPublishedNotFromTests: a test binary without $XMX_RUN_DIR does not
// publish (in /run/xmx).
func TestPublishedNotFromTests(t *testing.T) {
	publishDir(t)
	t.Setenv(RunDirEnv, "")
	la, _ := xdp.NewPair(xdp.MemConfig{})
	a, err := Open(Config{Link: la, OwnLink: true, EndpointID: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	pub.mu.Lock()
	off, listening := pub.off, pub.ln != nil
	pub.mu.Unlock()
	if !off || listening {
		t.Errorf("a test binary without %s: publishing off %v, listening %v; want off", RunDirEnv, off, listening)
	}
}

// TestPublishedChurn reads the counters while endpoints open and close (for
// the race detector, and that a client never sees a closing endpoint).
func TestPublishedChurn(t *testing.T) {
	dir := publishDir(t)
	stopReading := readAlong(dir, func(err error) bool {
		if err != nil {
			t.Error(err)
		}
		return err == nil
	})
	for i := 0; i < 50; i++ {
		la, lb := xdp.NewPair(xdp.MemConfig{})
		a, err := Open(Config{Link: la, OwnLink: true, EndpointID: 1})
		if err != nil {
			t.Fatal(err)
		}
		b, err := Open(Config{Link: lb, OwnLink: true, EndpointID: 2})
		if err != nil {
			t.Fatal(err)
		}
		a.Close()
		b.Close()
	}
	stopReading()
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Errorf("left in the run directory: %v", ents)
	}
}

// TestReaderLeavesLiveSocket: a reader polling while this process opens
// and closes its first endpoint again and again never removes the socket
// of a live listener. The socket used to be bound at its path and listen
// a moment later: a reader refused in between took it for a dead
// process's and removed it, and the process stayed unreachable for good.
func TestReaderLeavesLiveSocket(t *testing.T) {
	dir := publishDir(t)
	sock := filepath.Join(dir, strconv.Itoa(os.Getpid())+".sock")
	defer readAlong(dir, func(error) bool { return true })()
	opens := 0
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); opens++ {
		la, _ := xdp.NewPair(xdp.MemConfig{})
		e, err := Open(Config{Link: la, OwnLink: true, EndpointID: 1})
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(200 * time.Microsecond)
		pub.mu.Lock()
		listening := pub.ln != nil
		_, statErr := os.Stat(sock)
		pub.mu.Unlock()
		e.Close()
		if listening && statErr != nil {
			t.Fatalf("after %d opens: a reader removed the socket of the live listener (%v)", opens, statErr)
		}
	}
	t.Logf("%d opens and closes beside a polling reader", opens)
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Errorf("left in the directory: %v", ents)
	}
}

// readAlong reads the counters in dir again and again in a goroutine of
// its own, handing each error to more, until more says false or the
// returned stop is called (which waits for the goroutine).
func readAlong(dir string, more func(error) bool) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-done:
				return
			default:
			}
			if _, err := ReadPublished(dir); !more(err) {
				return
			}
		}
	}()
	return func() { close(done); wg.Wait() }
}

// TestReaderRemovesStaleTmp: a socket left under its temporary name by a
// process that died between its bind and its rename is removed by a
// reader once it is older than staleTmpAge and nobody listens on it; a
// young one, or one with a listener, stays.
func TestReaderRemovesStaleTmp(t *testing.T) {
	dir := publishDir(t)
	old := time.Now().Add(-2 * staleTmpAge)
	mk := func(name string, listen bool, mtime time.Time) string {
		path := filepath.Join(dir, name)
		ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
		if err != nil {
			t.Fatal(err)
		}
		ln.SetUnlinkOnClose(false)
		if listen {
			t.Cleanup(func() { ln.Close(); os.Remove(path) })
		} else {
			ln.Close()
		}
		if err := os.Chtimes(path, mtime, mtime); err != nil {
			t.Fatal(err)
		}
		return path
	}
	dead := mk("99999.1.tmp", false, old)
	young := mk("99999.2.tmp", false, time.Now())
	live := mk("99999.3.tmp", true, old)
	if _, err := ReadPublished(dir); err != nil {
		t.Fatal(err)
	}
	for path, want := range map[string]bool{dead: false, young: true, live: true} {
		if _, err := os.Lstat(path); (err == nil) != want {
			t.Errorf("%s: there %v after a read, want %v", filepath.Base(path), err == nil, want)
		}
	}
}
