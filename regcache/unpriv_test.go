package regcache

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// The unprivileged path: an mlock refused for lack of RLIMIT_MEMLOCK gives
// a clear error. The check runs in a child process (this test binary) that
// lowers its RLIMIT_MEMLOCK and, when root, drops CAP_IPC_LOCK from the
// thread that registers, so it runs the same with or without privileges.
func TestMlockUnprivileged(t *testing.T) {
	for _, c := range []struct {
		mode, errno, want string
	}{
		{"eperm", "operation not permitted", "RLIMIT_MEMLOCK soft limit is 0 bytes and the process lacks CAP_IPC_LOCK"},
		{"enomem", "cannot allocate memory", "RLIMIT_MEMLOCK soft limit is 65536 bytes"},
	} {
		t.Run(c.mode, func(t *testing.T) {
			cmd := exec.Command(os.Args[0])
			cmd.Env = append(os.Environ(), "REGCACHE_UNPRIV_CHILD="+c.mode)
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("child: %v\n%s", err, out)
			}
			s := string(out)
			if _, reason, ok := strings.Cut(s, "CHILD SKIP: "); ok {
				skipOrFatal(t, "%s", strings.TrimSpace(reason))
			}
			if !strings.Contains(s, "CHILD ERROR: regcache: register 1048576 bytes at 0x") ||
				!strings.Contains(s, ": mlock: "+c.errno+" (") || !strings.Contains(s, c.want) {
				t.Fatalf("child output:\n%s", s)
			}
			for _, l := range strings.Split(s, "\n") {
				if strings.HasPrefix(l, "CHILD ERROR:") {
					t.Log(strings.TrimPrefix(l, "CHILD ERROR: "))
				}
			}
		})
	}
}

func TestMain(m *testing.M) {
	if mode := os.Getenv("REGCACHE_UNPRIV_CHILD"); mode != "" {
		msg, err := unprivChild(mode)
		if err != nil {
			fmt.Println("CHILD FAILED:", err)
			os.Exit(1)
		}
		fmt.Println("CHILD ERROR:", msg)
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// unprivChild registers 1 MiB without privileges and returns the error.
func unprivChild(mode string) (string, error) {
	// The main goroutine keeps its thread, whose capabilities we change;
	// the process exits right after.
	runtime.LockOSThread()
	if err := dropIPCLock(); err != nil {
		return "", err
	}
	var lim unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_MEMLOCK, &lim); err != nil {
		return "", err
	}
	lim.Cur = 0
	if mode == "enomem" {
		lim.Cur = 64 << 10
		if lim.Max != unix.RLIM_INFINITY && lim.Max < lim.Cur && os.Geteuid() != 0 {
			fmt.Printf("CHILD SKIP: RLIMIT_MEMLOCK hard limit %d bytes < 64 KiB\n", lim.Max)
			os.Exit(0)
		}
	}
	if err := unix.Setrlimit(unix.RLIMIT_MEMLOCK, &lim); err != nil {
		return "", err
	}
	g := NewRegistry()
	defer g.Close()
	buf := make([]byte, 1<<20)
	_, err := g.Register(buf)
	if err == nil {
		return "", errors.New("mlock of 1 MiB succeeded without privileges")
	}
	want := unix.EPERM
	if mode == "enomem" {
		want = unix.ENOMEM
	}
	if !errors.Is(err, want) {
		return "", fmt.Errorf("error %v, want %v", err, want)
	}
	// Small registrations within the limit still work in enomem mode.
	if mode == "enomem" {
		r, err := g.Register(buf[:100])
		if err != nil {
			return "", fmt.Errorf("small registration: %v", err)
		}
		g.Deregister(r)
	}
	if lockedBytes() != 0 {
		return "", errors.New("counts left after a refused mlock")
	}
	return err.Error(), nil
}

// dropIPCLock removes CAP_IPC_LOCK from the calling thread's effective and
// permitted sets (a no-op for an unprivileged process).
func dropIPCLock() error {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return fmt.Errorf("capget: %w", err)
	}
	const bit = unix.CAP_IPC_LOCK
	data[bit/32].Effective &^= 1 << (bit % 32)
	data[bit/32].Permitted &^= 1 << (bit % 32)
	if err := unix.Capset(&hdr, &data[0]); err != nil {
		return fmt.Errorf("capset: %w", err)
	}
	return nil
}
