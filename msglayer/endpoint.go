package msglayer

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"os"
	"slices"
	"time"

	"github.com/xmx-stack/xmx/regcache"
	"github.com/xmx-stack/xmx/xdp"
)

// Config configures an endpoint. Zero values select the defaults.
type Config struct {
	// Interface names the NIC. Every endpoint of this process on one
	// interface shares its link. Ignored when Link is set.
	Interface string
	// LinkKind chooses the link: "auto" (AF_XDP, else AF_PACKET, saying
	// why), "afxdp" or "afpacket".
	LinkKind string
	// Link, when set, is used instead of opening one (the in-memory links
	// of tests). The endpoint does not close it unless OwnLink is set.
	Link    xdp.Link
	OwnLink bool

	EndpointID uint8
	Key        uint32 // connects must present it
	// Hostname answers host queries (default: $XMX_HOSTNAME, else the
	// system host name).
	Hostname  string
	EtherType uint16 // default 0x88B5

	// BusyPoll makes waits spin on the link (lowest latency, one CPU
	// busy); otherwise waits sleep in the kernel.
	BusyPoll bool
	// SpinBeforeSleep, in blocking mode, makes a wait poll the link this
	// long before it sleeps in the kernel. An answer that comes within it
	// is seen without a kernel wake-up (which costs tens of microseconds
	// on a VM whose other vCPU halted); an idle endpoint still burns no
	// CPU beyond it. 0 (the default) adapts the poll to the waits, up to
	// 50 µs: none while sleeps last over 200 µs; NoSpin sleeps at once.
	//
	// The endpoints of a process on one interface share its link and its
	// progress: one whose EtherType, BusyPoll or SpinBeforeSleep differ
	// from the first's is refused (ArgError).
	SpinBeforeSleep time.Duration

	RendezvousThreshold int // messages above it go by rendezvous (default 32 KiB)
	UnexpectedBytes     int // bound on unexpected eager messages held: their data and their records (about 100 bytes each); default 8 MiB
	// OutOfOrderBytes bounds the memory of the frames an endpoint holds
	// because they arrived ahead of a gap, from all its peers (default
	// 4 MiB, at least one frame). At the bound such a frame is dropped
	// (OutOfOrderDropped) and comes again from its sender, which it was
	// not acked to: many senders whose frames a receiver's ring dropped
	// at once would otherwise have it hold up to a window per sender.
	OutOfOrderBytes int
	// MaxUnexpectedRndv bounds the unexpected rendezvous records held
	// (default 65536). At the bound a peer's next record is dropped and
	// resent until there is room, and the frames behind it from that peer
	// (the notifies that complete our sends to it included) wait with it.
	// A same-process sender's message at the bound is held here, its
	// send pending, with the ones that sender sends us after it, until a
	// receive is posted, a record taken or unexpected memory freed.
	MaxUnexpectedRndv int
	// MaxPeers bounds the records of peers that connect to the endpoint
	// (default 1024, as Open-MX's peer table; each costs about 20 KiB with
	// the default window); records of peers we connected to are neither
	// counted nor taken while connected. A connect from a new address at
	// the bound takes the record of a peer with nothing under way that is
	// disconnected or was silent for GiveUp (that peer's next frame is
	// answered as from a stranger: it reconnects), or is refused with
	// Aborted (PeersRefused).
	MaxPeers          int
	Window            int // reliable frames in flight per peer, a power of two (default 256)
	AckDelay          time.Duration
	AckEvery          int
	InitialRTO        time.Duration // the timeout before a round trip is measured (default 5 ms; at most MaxRTO)
	MinRTO, MaxRTO    time.Duration // bounds of the adaptive timeout (default 2 ms; 250 ms or MinRTO if above)
	GiveUp            time.Duration // a peer silent this long is unreachable (default 5 s)
	KeepaliveInterval time.Duration
	ConnectRetry      time.Duration
	PullBlocks        int // pull blocks (32 frames each) in flight per rendezvous (default 16)

	// UMEMBufferBytes sizes the buffer area of an AF_XDP link this
	// endpoint opens: UMEM lent by AllocBuffer, from which large sends
	// leave without a CPU copy when the socket is in zero-copy mode (the
	// link then asks for multi-buffer too). 0: none, AllocBuffer gives
	// ordinary memory. UMEMGather overrides how the data leaves (see
	// xdp.GatherMode). The first endpoint of a process on an interface
	// decides for all (later ones' values are not looked at).
	UMEMBufferBytes int
	UMEMGather      xdp.GatherMode

	// RecvBudget is how many reliable frames in flight from all peers
	// together the link should have to hold: the engine shares it among
	// the peers heard from lately and tells each its share (its receive
	// window, at least 8 frames or twice AckEvery; none said at 256 or
	// more) in every frame it sends them, so that many senders together
	// do not overrun the link's receive ring. 0: three quarters of the
	// frames the link holds (on AF_XDP, 1536 of the 2048 receive frames);
	// -1: no window is said. Like UMEMBufferBytes, the first endpoint of a
	// process on an interface decides for all.
	RecvBudget int

	// RegCache limits the pin-down cache of Register (zero: defaults from
	// RLIMIT_MEMLOCK).
	RegCache regcache.CacheConfig

	Clock Clock

	// UnexpectedHandler, when set, is called once for every message that
	// matches no posted receive, before it is queued. It runs on the
	// goroutine that drives the link, without the engine lock, while no
	// other frame is received: it may make the calls that do not wait
	// (Irecv, Isend, Test, Iprobe, Cancel, Forget, Disconnect), but not
	// those that wait for frames (Wait, WaitAny, Probe, Connect, Resolve,
	// a Group's Wait) nor Close, which waits for that goroutine. A message
	// whose sender is disconnected (or resets) while the handler runs is
	// dropped with the rest of the exchange.
	//
	// Messages from endpoints of the same process (or from this one) do
	// not come through the link, but their handler calls are the driver's
	// too, one at a time: such a message waits for the driver's next round
	// when no receive matches it (and every same-process message sent
	// behind it waits too, to keep each sender's order).
	//
	// A handler that panics does as if it had returned Continue (the
	// message queues), and the goroutine that ran it panics with the same
	// value once the engine no longer needs it: a Wait (or other wait)
	// then, or the background goroutine, which ends the process.
	UnexpectedHandler func(UnexpectedMessage) HandlerAction

	// ContextIDBits (0..8) bits of the match info, starting at bit
	// ContextIDShift, name a message's context, as MX's context ids do:
	// each context has its own queues of posted receives and unexpected
	// messages, so matching in one never walks another's. A receive must
	// name its context: its mask must cover those bits (else
	// ErrBadMatchMask).
	ContextIDBits, ContextIDShift uint
}

// UnexpectedMessage describes a message that matched no posted receive.
type UnexpectedMessage struct {
	Source Addr
	Match  uint64
	Length int
	// Data is the message when it was sent eagerly in one frame (valid
	// only during the call), nil otherwise (more than one frame, a
	// rendezvous message, an Issend).
	Data []byte
}

// HandlerAction is what an unexpected-message handler decided.
type HandlerAction int

const (
	// Continue queues the message (or matches it to a receive the handler
	// posted).
	Continue HandlerAction = iota
	// Finished means the handler consumed the message: it is dropped, and
	// a rendezvous sender is told so (its send completes with XferLen 0).
	Finished
)

// NoSpin is the SpinBeforeSleep of a wait that sleeps at once.
const NoSpin time.Duration = -1

func (c *Config) setDefaults() error {
	if c.LinkKind == "" {
		c.LinkKind = "auto"
	}
	if c.EtherType == 0 {
		c.EtherType = xdp.DefaultEtherType
	}
	if c.Hostname == "" {
		c.Hostname = os.Getenv("XMX_HOSTNAME")
	}
	if c.Hostname == "" {
		c.Hostname, _ = os.Hostname()
	}
	if len(c.Hostname) > maxHostNameLen {
		return &ArgError{Arg: "Hostname", Err: errHostNameLen}
	}
	def := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	defD := func(v *time.Duration, d time.Duration) {
		if *v == 0 {
			*v = d
		}
	}
	def(&c.RendezvousThreshold, 32<<10)
	def(&c.UnexpectedBytes, 8<<20)
	def(&c.OutOfOrderBytes, 4<<20)
	def(&c.MaxUnexpectedRndv, 65536)
	def(&c.MaxPeers, 1024)
	def(&c.Window, 256)
	def(&c.AckEvery, 4)
	def(&c.PullBlocks, 16)
	defD(&c.AckDelay, 100*time.Microsecond)
	defD(&c.InitialRTO, 5*time.Millisecond)
	minRTOGiven := c.MinRTO != 0
	defD(&c.MinRTO, 2*time.Millisecond)
	defD(&c.MaxRTO, max(250*time.Millisecond, c.MinRTO))
	defD(&c.GiveUp, 5*time.Second)
	defD(&c.KeepaliveInterval, 250*time.Millisecond)
	defD(&c.ConnectRetry, 50*time.Millisecond)
	if c.Clock == nil {
		c.Clock = NewRealClock()
	}
	for _, v := range []struct {
		name string
		v    int
	}{{"RendezvousThreshold", c.RendezvousThreshold}, {"UnexpectedBytes", c.UnexpectedBytes}, {"OutOfOrderBytes", c.OutOfOrderBytes},
		{"MaxUnexpectedRndv", c.MaxUnexpectedRndv}, {"MaxPeers", c.MaxPeers}, {"Window", c.Window}, {"AckEvery", c.AckEvery},
		{"PullBlocks", c.PullBlocks}, {"UMEMBufferBytes", c.UMEMBufferBytes}} {
		if v.v < 0 {
			return &ArgError{Arg: v.name, Err: fmt.Errorf("%d is negative", v.v)}
		}
	}
	if c.RecvBudget < -1 {
		return &ArgError{Arg: "RecvBudget", Err: fmt.Errorf("%d: want a count of frames, 0 (the link's) or -1 (none)", c.RecvBudget)}
	}
	if c.Window < 2 || c.Window > 1<<15 || c.Window&(c.Window-1) != 0 {
		// A power of two divides 2^32: sequence numbers map to the same
		// window slots across their wrap.
		return &ArgError{Arg: "Window", Err: fmt.Errorf("%d: want a power of two from 2 to 32768", c.Window)}
	}
	if c.ContextIDBits > 8 || c.ContextIDBits > 0 && c.ContextIDShift+c.ContextIDBits > 64 {
		return &ArgError{Arg: "ContextIDBits", Err: fmt.Errorf("%d bits at bit %d: want 0..8 bits within the 64-bit match info", c.ContextIDBits, c.ContextIDShift)}
	}
	for _, v := range []struct {
		name string
		v    *time.Duration
	}{{"AckDelay", &c.AckDelay}, {"InitialRTO", &c.InitialRTO}, {"MinRTO", &c.MinRTO}, {"MaxRTO", &c.MaxRTO},
		{"GiveUp", &c.GiveUp}, {"KeepaliveInterval", &c.KeepaliveInterval}, {"ConnectRetry", &c.ConnectRetry}} {
		if *v.v < 0 {
			return &ArgError{Arg: v.name, Err: fmt.Errorf("%v is negative", *v.v)}
		}
		// Longer is never (math.MaxInt64 says so): a deadline of the
		// clock plus the duration must not overflow.
		*v.v = min(*v.v, forever)
	}
	if c.MinRTO > c.MaxRTO {
		if !minRTOGiven {
			return &ArgError{Arg: "MaxRTO", Err: fmt.Errorf("%v is below MinRTO's default %v: set MinRTO too", c.MaxRTO, c.MinRTO)}
		}
		return &ArgError{Arg: "MinRTO", Err: fmt.Errorf("%v is above MaxRTO %v", c.MinRTO, c.MaxRTO)}
	}
	// MaxRTO bounds the first timeout too: it is armed as InitialRTO
	// says, and the bound applied later would not move the timer earlier.
	c.InitialRTO = min(c.InitialRTO, c.MaxRTO)
	if c.SpinBeforeSleep < NoSpin || c.SpinBeforeSleep > time.Second {
		return &ArgError{Arg: "SpinBeforeSleep", Err: fmt.Errorf("%v: want NoSpin, 0 (adaptive) or up to 1s", c.SpinBeforeSleep)}
	}
	if c.PullBlocks > 64 {
		return &ArgError{Arg: "PullBlocks", Err: fmt.Errorf("%d: want 1..64", c.PullBlocks)}
	}
	return nil
}

// Endpoint is an MX endpoint: it sends and receives matched messages.
// All of its state is owned by its engine and guarded by the engine lock;
// its methods are safe for concurrent use.
type Endpoint struct {
	eng     *engine
	cfg     Config
	id      uint8
	session uint32
	addr    Addr
	linkWhy string // why the link kind in use was chosen

	// reg holds the regions peers may access (Get, Put); cache is the
	// pin-down cache in front of it. Both are safe for concurrent use.
	reg   *regcache.Registry
	cache *regcache.Cache
	// windows are the registrations peers address (Register): each a
	// window of a cache region, with its own id and key, so that a peer
	// reaches the registered buffer and nothing else of the region.
	// +checklocks:eng.mu
	windows map[uint32]*window

	// +checklocks:eng.mu
	closed bool
	// +checklocks:eng.mu
	peers map[Addr]*peer
	// +checklocks:eng.mu
	lastPeer *peer // the peer last looked up (peerAt); nil when it left peers
	// dialed counts the records of peers we connected to (peer.dialed),
	// which MaxPeers does not bound.
	// +checklocks:eng.mu
	dialed int
	// noEvictUntil: a look for an evictable record found none; connects
	// from new peers are refused until then (roomForPeer).
	// +checklocks:eng.mu
	noEvictUntil int64
	// +checklocks:eng.mu
	timers timerHeap // peers' and pulls' timers
	// +checklocks:eng.mu
	dueTimers []*timer // scratch for runTimers
	// +checklocks:eng.mu
	acksDue []*peer // peers that delayed an ack since the last flushAcks, once each
	// +checklocks:eng.mu
	nextTimer int64
	// +checklocks:eng.mu
	match matcher
	// +checklocks:eng.mu
	done doneQueue // completed requests not in a group
	// +checklocks:eng.mu
	free []*request
	// +checklocks:eng.mu
	rndvs map[uint32]*request // our sends the receiver may pull
	// +checklocks:eng.mu
	pulls map[uint32]*pull // our receives pulling data
	// +checklocks:eng.mu
	nextID uint32
	// nextConnID numbers connects, apart from nextID: the peer orders a
	// self's connects by it (serial arithmetic), which 2^31 rendezvous
	// or pulls in between must not turn round.
	// +checklocks:eng.mu
	nextConnID uint32
	// +checklocks:eng.mu
	unexpBytes int
	// +checklocks:eng.mu
	unexpRndv int
	// heldLocal counts the same-process messages to this endpoint held
	// at its MaxUnexpectedRndv bound, in the chains of heldPeers (one a
	// sender: peer.held). heldRetry: it is in engine.localRetry.
	// +checklocks:eng.mu
	heldLocal int
	// +checklocks:eng.mu
	heldPeers []*peer
	// +checklocks:eng.mu
	heldRetry bool
	// oooHeld counts the frames the endpoint's peers hold out of order
	// (peer.oooCount summed), against Config.OutOfOrderBytes.
	// +checklocks:eng.mu
	oooHeld int
	// +checklocks:eng.mu
	connects []*request
	// held are failed sends from lent buffers waiting for the link to be
	// done with their buffer (holdFailed).
	// +checklocks:eng.mu
	held []*request
	// heldEvery is how often heldTimers looks at them now, heldNext
	// when it looks next.
	// +checklocks:eng.mu
	heldEvery, heldNext int64
	// +checklocks:eng.mu
	blockedOnSlot bool
	// +checklocks:eng.mu
	stats Counters
	// anyWaiting: the goroutines in WaitAny, Peek or Probe, each with a
	// wake channel of its own, signalled at every completion outside a
	// group, every unexpected arrival and Close. Each its own: a shared
	// one was taken by a waiter for which the completion was not, and
	// the one it was for slept on.
	// +checklocks:eng.mu
	anyWaiting []*anyWaiter
	// +checklocks:eng.mu
	anyFree []*anyWaiter // idle records, for the next waits
	// groupWaiting: the groups with this endpoint among their views and
	// goroutines in their Wait (groupQueue.watch); Close wakes them.
	// +checklocks:eng.mu
	groupWaiting []*groupQueue
}

// anyWaiter is one goroutine waiting in WaitAny, Peek or Probe.
type anyWaiter struct {
	wake chan struct{} // capacity 1
}

// Counters are an endpoint's statistics.
type Counters struct {
	FramesIn, FramesOut uint64 // FramesOut: first sends (host queries and connects included)
	Predicted           uint64 // of FramesIn, those header prediction took: the next message, whole, from the peer last heard, for a posted receive
	BytesIn, BytesOut   uint64
	Retransmits         uint64 // frames sent again (not in FramesOut)
	CwndCuts            uint64 // times losses shrank a peer's congestion window (a selective ack halves it, a timeout drops it to 2 frames)
	WindowHeld          uint64 // times a frame waited for the receive window a peer said (smaller than the congestion window then)
	Duplicates          uint64 // reliable frames received twice
	OutOfOrder          uint64 // frames held until the ones before them arrived
	OutOfOrderDropped   uint64 // frames ahead of a gap not held: OutOfOrderBytes was reached
	AcksOut, AcksIn     uint64 // explicit acks
	AcksBundled         uint64 // of AcksOut, those that rode in a frame to another peer (an ack bundle, tAcks, or a pull request)
	Unexpected          uint64 // messages that matched no posted receive (those the unexpected handler finished included)
	UnexpectedBytes     uint64 // eager bytes held for them
	UnexpectedBytesNow  int    // held now, against UnexpectedBytes (records included)
	UnexpectedRndvNow   int    // rendezvous records held now, against MaxUnexpectedRndv
	RndvDeferred        uint64 // times a rendezvous record found no room under MaxUnexpectedRndv (each try counts): dropped, to come again (network), or held, its send pending (same process)
	Pulls               uint64 // rendezvous pulls started
	PullRequests        uint64 // pull requests sent (re-requests included)
	PullReplies         uint64 // data frames sent for pulls
	PullProbes          uint64 // pull blocks whose last missing frame was asked for again: their pull went quiet
	PullReRequests      uint64 // pull blocks whose missing frames were asked for again: found lost (a later block or a probe came first)
	PullRepliesLate     uint64 // pull data frames that arrived when no longer wanted (answers to a probe or re-request, duplicates)
	PullBudgetWaits     uint64 // times a pull waited for the engine's pull budget (frames asked for and not arrived, shared by its endpoints)
	EagerRefused        uint64 // eager messages refused for want of memory
	EagerConverted      uint64 // our eager sends the receiver refused, resent as rendezvous
	BadFrames           uint64 // frames that did not decode or named nothing here; those that name no endpoint of the link (or do not decode so far) are the link's, and every endpoint on it counts them
	StaleFrames         uint64 // frames of a dead session
	Challenges          uint64 // keepalives asking a connected peer's self whether it lives: a connect (or reply) came from another self
	BeyondWindow        uint64 // reliable frames too far ahead
	PeersDead           uint64
	PeersEvicted        uint64 // idle peers' records given to new peers at MaxPeers
	PeersRefused        uint64 // connects from new peers refused at MaxPeers
	Sends, Recvs        uint64
	Completed           uint64 // the user's requests completed (sends, receives, connects, Gets, Puts), Forgotten ones too
	Gets, Puts          uint64 // one-sided operations started here
	PutsIn              uint64 // Puts peers made into our regions
	RegionRefused       uint64 // region accesses refused (unknown id, wrong key, out of bounds)
	GatheredReplies     uint64 // pull replies sent from a lent Buffer where it lies
	BufferFallbacks     uint64 // AllocBuffer calls that got ordinary memory: the link's buffer area was full
	HeldCut             uint64 // failed sends from lent buffers completed after MaxRTO with the link still sending from the buffer
}

// Open opens an endpoint.
func Open(cfg Config) (*Endpoint, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	g, why, err := acquireEngine(&cfg)
	if err != nil {
		return nil, err
	}
	reg := regcache.NewRegistry()
	cache, err := regcache.NewCache(reg, cfg.RegCache)
	if err != nil {
		reg.Close()
		releaseEngine(g)
		return nil, fmt.Errorf("msglayer: open endpoint %d: %w", cfg.EndpointID, err)
	}
	e := &Endpoint{
		reg:     reg,
		cache:   cache,
		eng:     g,
		cfg:     cfg,
		id:      cfg.EndpointID,
		linkWhy: why,
		peers:   map[Addr]*peer{},
		rndvs:   map[uint32]*request{},
		pulls:   map[uint32]*pull{},
		windows: map[uint32]*window{},
	}
	var b [12]byte
	rand.Read(b[:])
	e.session = binary.BigEndian.Uint32(b[:]) | 1 // never 0 (0 means "unknown")
	e.nextID = binary.BigEndian.Uint32(b[4:])
	e.nextConnID = binary.BigEndian.Uint32(b[8:])
	e.addr = Addr{MAC: g.mac, EP: e.id}
	e.match.init(cfg.ContextIDBits, cfg.ContextIDShift)
	g.mu.Lock()
	if g.eps[e.id] != nil {
		g.mu.Unlock()
		cache.Close()
		reg.Close()
		releaseEngine(g)
		return nil, &ArgError{Arg: "EndpointID", Err: fmt.Errorf("endpoint %d already open on %s", e.id, g.ifname)}
	}
	g.eps[e.id] = e
	g.epList = append(g.epList, e)
	if cfg.Hostname != "" {
		g.hostnames[cfg.Hostname]++
	}
	g.mu.Unlock()
	registerPublished(e)
	return e, nil
}

// acquireEngine returns the engine of cfg's link, opening it if needed.
// Endpoints on the same interface, or on the same given link, share one.
func acquireEngine(cfg *Config) (*engine, string, error) {
	// Two network namespaces may hold interfaces of the same name.
	ns, _ := os.Readlink("/proc/thread-self/ns/net")
	key := ns + "/" + cfg.Interface
	if cfg.Link != nil {
		key = fmt.Sprintf("link@%p", cfg.Link)
	} else if cfg.Interface == "" {
		return nil, "", &ArgError{Arg: "Interface", Err: errors.New("no interface and no link given")}
	}
	enginesMu.Lock()
	defer enginesMu.Unlock()
	for {
		g := engines[key]
		if g == nil {
			break
		}
		if cfg.Link == nil && g.linkGone.Load() && g.refs > 0 {
			// Its interface is gone: this one (of the same name) is a
			// new interface, for a new engine. The old one leaves the
			// map when its last endpoint closes, if still there. (A
			// given link that failed is the same link: joined.)
			break
		}
		if g.refs > 0 {
			if err := g.shares(cfg); err != nil {
				return nil, "", err
			}
			g.refs++
			return g, "shared with this process's other endpoints", nil
		}
		// Its last endpoint closed and it is stopping: its driver may
		// still receive from the link, or its socket still hold the
		// queue. Open after it is gone.
		enginesMu.Unlock()
		<-g.stopped
		enginesMu.Lock()
	}
	link, why := cfg.Link, "link given"
	if link == nil {
		var err error
		if link, why, err = openLink(cfg); err != nil {
			return nil, "", err
		}
	} else if !cfg.OwnLink {
		link = noClose{link}
	}
	g := newEngine(link, cfg)
	g.key = key
	g.refs = 1
	engines[key] = g
	liveEngines.Add(1)
	return g, why, nil
}

// shares reports why an endpoint configured with cfg cannot share engine
// g, whose link and progress its endpoints have in common: a setting of
// the engine's that cfg gives otherwise.
func (g *engine) shares(cfg *Config) error {
	differs := func(arg string, want, have any) error {
		return &ArgError{Arg: arg, Err: fmt.Errorf("%v, but the endpoints open on %s already use %v: "+
			"endpoints of one link share it", want, g.ifname, have)}
	}
	switch {
	case cfg.BusyPoll != g.busyPoll:
		return differs("BusyPoll", cfg.BusyPoll, g.busyPoll)
	case cfg.SpinBeforeSleep != g.spinCfg:
		return differs("SpinBeforeSleep", cfg.SpinBeforeSleep, g.spinCfg)
	case cfg.EtherType != g.ethType:
		return differs("EtherType", fmt.Sprintf("%#04x", cfg.EtherType), fmt.Sprintf("%#04x", g.ethType))
	}
	return nil
}

// openAFXDP opens AF_XDP links: a variable, so that a test can make
// AF_XDP fail and see the fallback to AF_PACKET.
var openAFXDP = xdp.OpenAFXDP

// openLink opens the link cfg asks for.
func openLink(cfg *Config) (xdp.Link, string, error) {
	openXDP := func() (xdp.Link, error) {
		// Lost frames are sent again: a few warm receive frames serve
		// quiet traffic faster (xdp.QuietRxLevel).
		return openAFXDP(xdp.AFXDPConfig{Interface: cfg.Interface, EtherType: cfg.EtherType,
			BufferBytes: cfg.UMEMBufferBytes, Gather: cfg.UMEMGather, RxLevel: xdp.QuietRxLevel})
	}
	openPacket := func() (xdp.Link, error) {
		return xdp.OpenAFPacket(xdp.AFPacketConfig{Interface: cfg.Interface, EtherType: cfg.EtherType})
	}
	switch cfg.LinkKind {
	case "afxdp":
		l, err := openXDP()
		return l, "AF_XDP requested", err
	case "afpacket":
		l, err := openPacket()
		return l, "AF_PACKET requested", err
	case "auto":
		l, err := openXDP()
		if err == nil {
			return l, "AF_XDP", nil
		}
		if errors.Is(err, xdp.ErrQueueBusy) {
			// An AF_PACKET socket would hear nothing: the other socket's
			// steering program takes the stack's frames.
			return nil, "", fmt.Errorf("msglayer: open %s: %w: it takes every frame of the stack's EtherType, so AF_PACKET would receive none; open more endpoints (other endpoint ids) in that process instead, or stop it (xmx info lists the processes)", cfg.Interface, err)
		}
		l2, err2 := openPacket()
		if err2 != nil {
			return nil, "", fmt.Errorf("msglayer: open %s: AF_XDP: %v; AF_PACKET: %w", cfg.Interface, err, err2)
		}
		return l2, "AF_PACKET, because AF_XDP failed: " + err.Error(), nil
	}
	return nil, "", &ArgError{Arg: "LinkKind", Err: fmt.Errorf("%q: want auto, afxdp or afpacket", cfg.LinkKind)}
}

// releaseEngine drops an endpoint's reference; the last stops the engine
// and closes the link. The engine stays in the engine map while it
// stops, so that an Open of the same link waits for it (acquireEngine)
// rather than receiving beside its driver or binding a queue its socket
// still holds.
func releaseEngine(g *engine) error {
	enginesMu.Lock()
	g.refs--
	last := g.refs == 0
	if last {
		liveEngines.Add(-1)
	}
	enginesMu.Unlock()
	if !last {
		return nil
	}
	// Out of the map even if the stop panics: an Open waiting for it
	// must not wait for ever.
	defer func() {
		enginesMu.Lock()
		if engines[g.key] == g {
			delete(engines, g.key)
		}
		enginesMu.Unlock()
		close(g.stopped)
	}()
	if testHookEngineStop != nil {
		testHookEngineStop(g)
	}
	return g.stop()
}

// noClose keeps an endpoint from closing a link it was given.
type noClose struct{ xdp.Link }

func (noClose) Close() error { return nil }

func (n noClose) Wake() {
	if w, ok := n.Link.(xdp.Waker); ok {
		w.Wake()
	}
}

// Addr is the endpoint's own address.
func (e *Endpoint) Addr() Addr { return e.addr }

// LinkInfo describes the link under the endpoint and why it was chosen.
func (e *Endpoint) LinkInfo() (xdp.Info, string) { return e.eng.link.Info(), e.linkWhy }

// LinkStats returns the counters of the link under the endpoint.
func (e *Endpoint) LinkStats() xdp.Stats { return e.eng.link.Stats() }

// Counters returns a snapshot of the endpoint's counters.
func (e *Endpoint) Counters() Counters {
	e.eng.mu.Lock()
	defer e.eng.mu.Unlock()
	c := e.stats
	c.UnexpectedBytesNow = e.unexpBytes
	c.UnexpectedRndvNow = e.unexpRndv
	c.BadFrames += e.eng.badFrames
	return c
}

// Close closes the endpoint: every pending request completes with Closed.
func (e *Endpoint) Close() error {
	unregisterPublished(e)
	g := e.eng
	g.mu.Lock()
	if e.closed {
		g.mu.Unlock()
		return nil
	}
	e.closed = true
	g.dropLocal(e)
	// Whoever waits for any completion learns of the close at once,
	// pending requests or not; so do the waiters of a group whose last
	// open endpoint this was.
	e.notifyAny()
	for _, gq := range e.groupWaiting {
		gq.noteOver()
	}
	// Acks owed are sent now: a peer whose last message we took (a
	// goodbye, say) learns it arrived instead of retransmitting into a
	// closed endpoint until its send gives up. Lazy ones too: as if
	// their time had come.
	e.flushAcks(math.MaxInt64)
	for _, p := range e.peers {
		if p.connected && p.local == nil {
			e.sayClosed(p) // after the acks: what it sent us arrived
		}
		p.failAll(Closed)
	}
	for r := e.match.firstRecv(); r != nil; r = e.match.firstRecv() {
		e.match.removeRecv(r)
		e.complete(r, Closed)
	}
	for _, r := range e.connects {
		e.complete(r, Closed)
	}
	e.connects = nil
	// Pulls of peers already forgotten are not reached through e.peers.
	for _, pl := range e.pulls {
		e.endPull(pl, Closed)
	}
	// Sends held for their buffers complete now: Close does not wait for
	// the link (the README tells to Free such a buffer, not rewrite it).
	for _, r := range e.held {
		e.releaseHeld(r)
	}
	clear(e.held)
	e.held = nil
	g.eps[e.id] = nil
	if i := slices.Index(g.epList, e); i >= 0 {
		g.epList = slices.Delete(g.epList, i, i+1)
	}
	if n := e.cfg.Hostname; n != "" {
		if g.hostnames[n]--; g.hostnames[n] == 0 {
			delete(g.hostnames, n)
		}
	}
	g.flushAndUnlock()
	g.signal()
	err := errors.Join(e.cache.Close(), e.reg.Close())
	return errors.Join(err, releaseEngine(g))
}

// newRequest takes a request from the free list.
//
// +checklocks:e.eng.mu
func (e *Endpoint) newRequest(kind reqKind, ctx any) *request {
	var r *request
	if n := len(e.free); n > 0 {
		r = e.free[n-1]
		e.free = e.free[:n-1]
	} else {
		r = &request{ep: e, wake: make(chan struct{}, 1)}
	}
	r.kind = kind
	r.status = Status{Context: ctx}
	return r
}

// release returns a completed request to the free list and spends its
// handles.
//
// +checklocks:e.eng.mu
func (e *Endpoint) release(r *request) {
	gen := r.gen + 1
	if r.signalled {
		select {
		case <-r.wake:
		default:
		}
	}
	if r.doneFlag.Load() {
		r.doneFlag.Store(false)
	}
	r.requestState = requestState{gen: gen}
	r.liveGen.Store(gen)
	if r.waiters.Load() > 0 {
		// A Wait on a handle this spends is asleep (one that raced with
		// another Wait, a collect by TestAny or a group, or Forget): wake
		// it to find its handle spent. It passes the wake on as it leaves
		// (Endpoint.Wait), so that none meant for the request's next use
		// is lost to it.
		r.poke()
	}
	e.free = append(e.free, r)
}

// complete finishes a request with code (unless it is done already).
//
// +checklocks:e.eng.mu
func (e *Endpoint) complete(r *request, code Code) {
	if r.done {
		return
	}
	if r.txRefs > 0 {
		// Pull replies still read the send's data: complete once they
		// are out (engine.unpin), so the user may then reuse it. The
		// first completion decides the code, as it would have at once.
		if !r.completeLater {
			r.completeLater, r.laterCode = true, code
		}
		return
	}
	if r.zbuf != nil {
		if code != Success && e.holdFailed(r, code) {
			return
		}
		e.eng.unuse(r.zbuf)
		r.zbuf = nil
	}
	if r.status.Code == Success {
		r.status.Code = code
	}
	if code == Success && r.kind == kindRecv && r.status.XferLen < r.status.MsgLen {
		r.status.Code = Truncated
	}
	if r.kind != kindNotify && r.kind != kindPutTarget {
		e.stats.Completed++ // the user's requests only
	}
	gr := r.group
	if gr != nil {
		gr.posted--
	}
	if r.forgotten {
		e.release(r) // no handle is left to look at it
		if gr != nil {
			gr.noteOver() // the last a Wait on the group waited for, maybe
		}
		return
	}
	r.done = true
	// doneFlag is for a Wait that looks without the lock. The driver
	// handling frames for the Wait of r collects r itself before it lets
	// go of the lock (engine.reap), and never looks: no atomic store
	// (an exchange, which waits for every store before it) is needed
	// then.
	if !e.eng.reapsNow(r) {
		r.doneFlag.Store(true)
	}
	if gr != nil {
		gr.push(r)
		gr.poke()
		gr.noteOver()
	} else if !r.private {
		e.done.push(r)
		e.notifyAny()
	}
	if r.waiters.Load() > 0 {
		r.signalled = true
		r.poke()
	}
	// A completion made outside the driver (a receive that matched a
	// queued message, a same-process send, a cancel) must wake a driver
	// asleep in the kernel: it may be the goroutine waiting for it.
	e.eng.signal()
}

// forever is the longest duration the engine adds to its clock's
// readings (about 146 years): a Config duration above it is cut to it.
const forever = time.Duration(1 << 62)

// heldPoll is how often, at first, the endpoint asks the link whether it
// is done with the buffers of failed sends holdFailed held; each look
// that lets none go doubles it, up to maxHeldPoll.
const (
	heldPoll    = int64(100 * time.Microsecond)
	maxHeldPoll = int64(10 * time.Millisecond)
)

// holdFailed holds back the completion of r, a send from a lent buffer
// failing with code, while the link may still read the buffer: pull
// replies sent from it can still be queued for the kernel (a refused
// kick) or being read by a zero-copy NIC. A send that succeeds needs no
// such wait: its receiver had every reply, and a duplicate left over
// carries data it discards; but a failed one (Disconnect, GiveUp) would
// let the user write new data into the buffer that a receiver still
// pulling could take as the message's.
//
// The link tells whether any frame sent from the buffer is still out,
// not whether this send's are; the endpoint's timers ask it (from every
// heldPoll, less often while it keeps them) and complete r once it says
// none is (heldTimers), or after MaxRTO:
// a link that keeps frames longer is broken or stopped (an interface
// down), or other sends from the buffer keep it busy, and the failure
// must still be told (HeldCut counts it). Close completes r at once.
// It reports whether r is held; the first failure's code is the one it
// completes with.
//
// +checklocks:e.eng.mu
func (e *Endpoint) holdFailed(r *request, code Code) bool {
	if r.held {
		return true
	}
	g := e.eng
	if e.closed || r.zbuf.xb == nil || g.gather.BufferSent(r.zbuf.xb) {
		return false
	}
	now := g.readClock()
	r.held, r.laterCode, r.heldEnd = true, code, now+int64(e.cfg.MaxRTO)
	e.held = append(e.held, r)
	e.heldEvery, e.heldNext = heldPoll, now+heldPoll
	e.armAt(e.heldNext)
	// A driver asleep in the kernel learns of the timer (a Disconnect,
	// say, sends no frame that would wake it).
	g.signal()
	return true
}

// heldTimers completes the sends holdFailed held whose buffers the link
// is done with, or whose time is up, and returns when to look again at
// the others (0: none left).
//
// +checklocks:e.eng.mu
func (e *Endpoint) heldTimers(now int64) int64 {
	if len(e.held) == 0 {
		return 0
	}
	if now < e.heldNext {
		return e.heldNext // the endpoint's other timers ran
	}
	kept := e.held[:0]
	// Sends from one buffer are asked about once a pass: they are often
	// held together (a pool buffer, a peer given up on).
	var asked *xdp.Buffer
	var sent bool
	end := int64(math.MaxInt64)
	for _, r := range e.held {
		if xb := r.zbuf.xb; xb != asked {
			asked, sent = xb, e.eng.gather.BufferSent(xb)
		}
		switch {
		case sent:
		case now >= r.heldEnd:
			e.stats.HeldCut++
		default:
			kept = append(kept, r)
			end = min(end, r.heldEnd)
			continue
		}
		e.releaseHeld(r)
	}
	released := len(kept) < len(e.held)
	clear(e.held[len(kept):])
	e.held = kept
	if len(kept) == 0 {
		return 0
	}
	// A link that keeps frames is asked less and less often.
	if !released {
		e.heldEvery = min(2*e.heldEvery, maxHeldPoll)
	}
	e.heldNext = min(now+e.heldEvery, end)
	return e.heldNext
}

// releaseHeld completes r, a send holdFailed held, with its failure.
//
// +checklocks:e.eng.mu
func (e *Endpoint) releaseHeld(r *request) {
	r.held = false
	e.eng.unuse(r.zbuf)
	r.zbuf = nil
	e.complete(r, r.laterCode)
}

// notifyAny tells the goroutines waiting for any completion or arrival
// (WaitAny, Peek, Probe) that one happened: it moves the engine's
// completion count, which they watch, and wakes each. With none waiting
// it costs nothing (no atomic operation).
//
// +checklocks:e.eng.mu
func (e *Endpoint) notifyAny() {
	if len(e.anyWaiting) == 0 {
		return
	}
	e.eng.completion.Add(1)
	for _, w := range e.anyWaiting {
		select {
		case w.wake <- struct{}{}:
		default:
		}
	}
}

// addAnyWaiter registers the calling goroutine as waiting for any
// completion and returns its record, for removeAnyWaiter.
//
// +checklocks:e.eng.mu
func (e *Endpoint) addAnyWaiter() *anyWaiter {
	var w *anyWaiter
	if n := len(e.anyFree); n > 0 {
		w, e.anyFree = e.anyFree[n-1], e.anyFree[:n-1]
	} else {
		w = &anyWaiter{wake: make(chan struct{}, 1)}
	}
	e.anyWaiting = append(e.anyWaiting, w)
	return w
}

// removeAnyWaiter ends w's wait.
//
// +checklocks:e.eng.mu
func (e *Endpoint) removeAnyWaiter(w *anyWaiter) {
	if i := slices.Index(e.anyWaiting, w); i >= 0 {
		e.anyWaiting = slices.Delete(e.anyWaiting, i, i+1)
	}
	select {
	case <-w.wake:
	default:
	}
	e.anyFree = append(e.anyFree, w)
}

// arm makes timer t (a peer's or a pull's) due at at, or earlier if it is.
//
// +checklocks:e.eng.mu
func (e *Endpoint) arm(t *timer, at int64) {
	e.timers.schedule(t, at)
	e.armAt(at)
}

// armAt makes the endpoint's timers run at t at the latest.
//
// +checklocks:e.eng.mu
func (e *Endpoint) armAt(t int64) {
	if e.nextTimer == 0 || t < e.nextTimer {
		e.nextTimer = t
		if g := e.eng; g.nextTimer == 0 || t < g.nextTimer {
			g.nextTimer = t
		}
	}
}

// runTimers runs the timers that are due (peers', pulls') and those of
// connects.
//
// +checklocks:e.eng.mu
func (e *Endpoint) runTimers(now int64) {
	// Take every due timer out first: each runs once, even if it finds
	// itself due again.
	due := e.dueTimers[:0]
	for t := e.timers.popDue(now); t != nil; t = e.timers.popDue(now) {
		due = append(due, t)
	}
	for _, t := range due {
		var next int64
		switch {
		case t.peer != nil:
			next = t.peer.runTimers(now)
		case !t.pull.ended: // not ended by a timer that ran before it
			next = e.pullTimers(t.pull, now) // 0 if it ended the pull
		}
		if next != 0 {
			e.timers.schedule(t, next)
		}
	}
	clear(due)
	e.dueTimers = due[:0]
	next := e.timers.next()
	if t := e.connectTimers(now); t != 0 && (next == 0 || t < next) {
		next = t
	}
	if t := e.heldTimers(now); t != 0 && (next == 0 || t < next) {
		next = t
	}
	e.nextTimer = next
}

// flushAcks sends the delayed acks now, but for lazy ones (peer.ackLazy)
// not due yet: they stay in acksDue, and it returns the earliest of their
// due times (0: none), past which the driver must not sleep.
//
// +checklocks:e.eng.mu
func (e *Endpoint) flushAcks(now int64) (lazyAt int64) {
	kept := 0
	for _, p := range e.acksDue {
		if p.ackDue != 0 && p.ackLazy && p.ackDue > now {
			e.acksDue[kept] = p
			kept++
			if lazyAt == 0 || p.ackDue < lazyAt {
				lazyAt = p.ackDue
			}
			continue
		}
		if p.ackDue != 0 {
			p.sendAck() // may take lazy acks along: their ackDue becomes 0
		}
		p.inAcksDue = false
	}
	clear(e.acksDue[kept:])
	e.acksDue = e.acksDue[:kept]
	return lazyAt
}

// peerAt returns the peer record of a, or nil. Most frames come from, and
// most sends go to, the peer of the last one: it is looked at before the
// map.
//
// +checklocks:e.eng.mu
func (e *Endpoint) peerAt(a Addr) *peer {
	if p := e.lastPeer; p != nil && p.addr == a {
		return p
	}
	return e.lookupPeer(a)
}

// lookupPeer is peerAt's look in the peer map, which remembers the peer
// found.
//
// +checklocks:e.eng.mu
func (e *Endpoint) lookupPeer(a Addr) *peer {
	p := e.peers[a]
	if p != nil {
		e.lastPeer = p
	}
	return p
}

// peerFrom returns the peer that sent frame f (header h), as peerAt
// does. The last peer's address is compared with the frame's in place:
// an Addr built on the stack field by field and then read whole costs a
// failed store-to-load forwarding on every frame.
//
// +checklocks:e.eng.mu
func (e *Endpoint) peerFrom(f []byte, h *header) *peer {
	if p := e.lastPeer; p != nil && p.addr.EP == h.srcEP && p.addr.MAC == [6]byte(f[6:12]) {
		return p
	}
	return e.lookupPeer(srcAddr(f, h))
}

// srcAddr returns the address that sent frame f (header h).
func srcAddr(f []byte, h *header) Addr {
	return Addr{MAC: [6]byte(f[6:12]), EP: h.srcEP}
}

// peerFor returns the peer record of a, creating it.
//
// +checklocks:e.eng.mu
func (e *Endpoint) peerFor(a Addr) *peer {
	p := e.peers[a]
	if p == nil {
		p = newPeer(e, a)
		e.peers[a] = p
	}
	return p
}

// evictScanPause is how long, after a look for an evictable record found
// none, connects from new peers are refused without looking again: a
// flood of them costs a scan of the records a millisecond, not a frame.
const evictScanPause = int64(time.Millisecond)

// roomForPeer reports whether a record for a new peer may be made: below
// MaxPeers, or once enough idle records (peer.evictable) are given up to
// be within it again, those of disconnected peers first.
//
// +checklocks:e.eng.mu
func (e *Endpoint) roomForPeer(now int64) bool {
	// need: records to give up for one more within the bound; more than
	// one when records counted again (dialed ones reset) went past it.
	need := len(e.peers) - e.dialed - e.cfg.MaxPeers + 1
	if need <= 0 {
		return true
	}
	if now < e.noEvictUntil {
		return false
	}
	// Disconnected records first, then connected ones silent for GiveUp.
	for _, quiet := range [2]bool{false, true} {
		for _, p := range e.peers {
			if need > 0 && p.connected == quiet && p.evictable(now) && !e.connecting(p.addr) {
				e.evict(p)
				need--
			}
		}
	}
	if need > 0 {
		e.noEvictUntil = now + evictScanPause
		return false
	}
	return true
}

// connecting reports whether a connect of ours to a is pending.
//
// +checklocks:e.eng.mu
func (e *Endpoint) connecting(a Addr) bool {
	for _, r := range e.connects {
		if r.connAddr == a {
			return true
		}
	}
	return false
}

// evict forgets p's record: nothing refers to it but the map (evictable).
//
// +checklocks:e.eng.mu
func (e *Endpoint) evict(p *peer) {
	delete(e.peers, p.addr)
	if e.lastPeer == p {
		e.lastPeer = nil
	}
	e.eng.leaveHost(p)
	e.stats.PeersEvicted++
}

// checkSegs validates a segment list and returns its total length.
func checkSegs(segs [][]byte) (int, error) {
	if len(segs) > 256 {
		return 0, &ArgError{Arg: "segments", Err: ErrTooManySegs}
	}
	n := segsLen(segs)
	if n > 1<<32-1 {
		return 0, &ArgError{Arg: "segments", Err: ErrTooLong}
	}
	return n, nil
}

// Context helpers: a context that never ends, without allocation.
var background = context.Background()

// LinkMTU is the MTU of the endpoint's link.
func (e *Endpoint) LinkMTU() int { return e.eng.mtu }

// PeerMTU is the MTU of frames to a connected peer: the smaller of both
// links' MTUs, negotiated at connect (0 if a is not a peer).
func (e *Endpoint) PeerMTU(a Addr) int {
	e.eng.mu.Lock()
	defer e.eng.mu.Unlock()
	if p := e.peers[a]; p != nil {
		return p.mtuOr(e.eng.mtu)
	}
	return 0
}
