// Package netlab brings up veth labs (network namespaces joined by veth pairs,
// or by a bridge in its own namespace) for tests and benchmarks that need real
// Linux interfaces, such as the AF_XDP and AF_PACKET links of package xdp.
//
// netlab does not build topologies itself: it runs scripts/lab, the single
// source of truth for the lab layout, and then reads the result back with
// "ip -j". The naming scheme, for a lab named P with hosts 1..N (N ≤ 250):
//
//	host namespace   P-hN              (e.g. t1a2b3c-h1)
//	host interface   eth0              (ifindex as seen inside P-hN)
//	host MAC         02:78:6d:00:00:NN (NN = N in hex; 78:6d is "xm")
//	host IP          198.18.0.N/24
//	bridge           br0 in namespace P-br (3+ hosts, or any lab with netem),
//	                 bridge-side ports hN with MAC 02:78:6d:01:00:NN
//
// Two hosts without netem are a direct veth pair; otherwise every host hangs off
// the bridge, and a netem spec is applied on the egress of every bridge-side
// port, so faults hit every frame, including frames sent by AF_XDP in copy mode
// (which bypass the qdisc of the sending veth but not the bridge's).
//
// Everything needs root (CAP_SYS_ADMIN and CAP_NET_ADMIN). Tests call [New],
// which skips the test when the environment cannot make namespaces (or fails
// it, when XMX_REQUIRE_PRIVILEGED=1) and removes the lab in tb.Cleanup.
// Leftovers from a killed test binary can be removed with
// "scripts/lab down --all".
package netlab
