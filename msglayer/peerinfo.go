package msglayer

import (
	"slices"
	"time"
)

// PeerInfo describes an endpoint's channel to one peer (what Open-MX's
// omx_endpoint_info showed per partner).
type PeerInfo struct {
	Addr      Addr          `json:"addr"`
	Connected bool          `json:"connected"`
	Dead      bool          `json:"dead"`  // given up on: sends fail until a new connect
	Local     bool          `json:"local"` // an endpoint of this process: the NIC is not used
	MTU       int           `json:"mtu"`   // negotiated frame payload
	SRTT      time.Duration `json:"srtt_ns"`
	RTO       time.Duration `json:"rto_ns"`
	InFlight  int           `json:"in_flight"`   // reliable frames sent and not acknowledged
	Window    int           `json:"window"`      // the most that may be
	Cwnd      int           `json:"cwnd"`        // the most the congestion window lets be now
	RecvWin   int           `json:"recv_window"` // the most the peer said it takes (0: no limit said)
	Queued    bool          `json:"queued"`      // messages wait for window space
	OutOfOrd  int           `json:"out_of_ord"`  // frames from it held until the ones before arrive
	Rndvs     int           `json:"rndvs"`       // our rendezvous sends it has not finished pulling
	Pulls     int           `json:"pulls"`       // our pulls from it
	Retrans   uint64        `json:"retrans"`     // frames retransmitted to it
	LastHeard time.Duration `json:"last_heard_ns"`
}

// Peers describes the endpoint's peers, ordered by address.
func (e *Endpoint) Peers() []PeerInfo {
	g := e.eng
	g.mu.Lock()
	defer g.mu.Unlock()
	now := g.readClock()
	out := make([]PeerInfo, 0, len(e.peers))
	for _, p := range e.peers {
		pi := PeerInfo{
			Addr: p.addr, Connected: p.connected, Dead: p.dead, Local: p.local != nil,
			MTU: p.mtuOr(g.mtu), SRTT: time.Duration(p.srtt), RTO: time.Duration(p.rto),
			InFlight: int(p.inFlight()), Window: len(p.win), Cwnd: int(p.cwnd), RecvWin: int(p.rwnd), Queued: p.sendHead != nil,
			OutOfOrd: p.oooCount, Rndvs: p.rndvs, Pulls: p.pulls, Retrans: p.retx,
		}
		if p.lastHeard != 0 {
			pi.LastHeard = time.Duration(now - p.lastHeard)
		}
		out = append(out, pi)
	}
	slices.SortFunc(out, func(a, b PeerInfo) int {
		if c := slices.Compare(a.Addr.MAC[:], b.Addr.MAC[:]); c != 0 {
			return c
		}
		return int(a.Addr.EP) - int(b.Addr.EP)
	})
	return out
}
