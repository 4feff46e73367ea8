package msglayer

import (
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Addr names an endpoint: the MAC address of its NIC and its endpoint id.
// It is comparable and usable as a map key.
type Addr struct {
	MAC [6]byte
	EP  uint8
}

// MakeAddr returns the address of endpoint ep on the NIC with address mac.
func MakeAddr(mac net.HardwareAddr, ep uint8) Addr {
	var a Addr
	copy(a.MAC[:], mac)
	a.EP = ep
	return a
}

// ParseAddr parses "02:78:6d:00:00:01:3" or "02:78:6d:00:00:01" (endpoint 0).
func ParseAddr(s string) (Addr, error) {
	mac, ep := s, "0"
	if strings.Count(s, ":") == 6 {
		i := strings.LastIndexByte(s, ':')
		mac, ep = s[:i], s[i+1:]
	}
	hw, err := net.ParseMAC(mac)
	if err != nil || len(hw) != 6 {
		return Addr{}, &ArgError{Arg: "address " + strconv.Quote(s), Err: fmt.Errorf("want MAC[:endpoint], e.g. 02:78:6d:00:00:01:0")}
	}
	n, err := strconv.ParseUint(ep, 10, 8)
	if err != nil {
		return Addr{}, &ArgError{Arg: "address " + strconv.Quote(s), Err: fmt.Errorf("endpoint id %q: want 0..255", ep)}
	}
	return MakeAddr(hw, uint8(n)), nil
}

func (a Addr) String() string {
	return fmt.Sprintf("%s:%d", net.HardwareAddr(a.MAC[:]), a.EP)
}

// MarshalText renders the address as String does (JSON, flags).
func (a Addr) MarshalText() ([]byte, error) { return []byte(a.String()), nil }

// UnmarshalText parses what MarshalText wrote.
func (a *Addr) UnmarshalText(b []byte) error {
	x, err := ParseAddr(string(b))
	if err != nil {
		return err
	}
	*a = x
	return nil
}

// Clock reads monotonic time in nanoseconds. The engine reads time only
// through it, so tests can drive timers by hand.
type Clock interface {
	Now() int64
}

type realClock struct{ base time.Time }

func (c realClock) Now() int64 { return int64(time.Since(c.base)) }

// NewRealClock returns the clock the engine uses by default.
func NewRealClock() Clock { return realClock{base: time.Now()} }

// ManualClock is a Clock that moves only when told: for tests.
type ManualClock struct {
	mu  sync.Mutex
	now int64
}

// Now implements Clock.
func (c *ManualClock) Now() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Advance moves the clock forward by d.
func (c *ManualClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now += int64(d)
	c.mu.Unlock()
}
