// SPDX-License-Identifier: (GPL-2.0 OR BSD-2-Clause)

//go:build ignore

// steer.c - XDP steering program of the xmx messaging stack.
//
// Frames whose outer EtherType equals the load-time constant `ethertype` are
// redirected to the AF_XDP socket registered for the receiving RX queue in the
// XSKMAP `xsks`, if they are for this interface: broadcast and multicast, or
// unicast to the load-time `ifmac` (when `match_mac` is set). Every other
// frame (ARP, IPv4, IPv6, VLAN-tagged, runts, unicast to another MAC, ...) is
// handed to the kernel stack unchanged with XDP_PASS, so that ordinary
// networking on the interface, and devices stacked on it (a macvlan), keep
// working.
//
// Two entry points share the same maps and logic:
//   xmx_steer        SEC("xdp")        for ordinary single-buffer sockets;
//   xmx_steer_frags  SEC("xdp.frags")  for multi-buffer (jumbo) sockets.
//
// Counters live in the per-CPU array `stats`, indexed by enum xmx_stat.
//
// Regenerate the Go bindings with `go generate ./bpf` (see gen.go).

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

// Indexes into the `stats` per-CPU array.
enum xmx_stat {
	// Frame of the stack's EtherType with a socket on its queue.
	XMX_STAT_REDIRECTED = 0,
	// Frame of another EtherType, passed to the kernel.
	XMX_STAT_PASSED = 1,
	// Frame shorter than an Ethernet header, passed to the kernel.
	XMX_STAT_RUNT = 2,
	// Frame of the stack's EtherType but no socket on its queue.
	XMX_STAT_NO_SOCKET = 3,
	// Frame of the stack's EtherType unicast to another MAC (a macvlan
	// stacked on the interface, another host on a promiscuous one),
	// passed to the kernel.
	XMX_STAT_OTHER_HOST = 4,
	// Number of counters; not a counter itself.
	XMX_STAT_MAX = 5,
};

// Number of XSKMAP slots, i.e. the highest RX queue index served plus one.
#define XMX_MAX_QUEUES 64

// EtherType steered to AF_XDP, in HOST byte order. Set by the loader before
// the program is loaded (it lives in .rodata, so the verifier sees it as a
// constant); the program converts it to network byte order itself.
volatile const __u16 ethertype = 0x88B5;

// The interface's MAC, set by the loader like `ethertype`: with `match_mac`
// set, unicast frames of the EtherType to another MAC go to the kernel.
volatile const __u8 ifmac[ETH_ALEN] = {};
volatile const __u8 match_mac = 0;

// Never read by the program: it only makes clang emit enum xmx_stat into BTF
// so that bpf2go generates the matching Go constants. It
// shares the .rodata section with `ethertype`, so it costs no extra map.
volatile const enum xmx_stat xmx_stat_count = XMX_STAT_MAX;

// RX queue index -> AF_XDP socket.
struct {
	__uint(type, BPF_MAP_TYPE_XSKMAP);
	__uint(max_entries, XMX_MAX_QUEUES);
	__type(key, __u32);
	__type(value, __u32);
} xsks SEC(".maps");

// Per-CPU packet counters, indexed by enum xmx_stat.
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, XMX_STAT_MAX);
	__type(key, __u32);
	__type(value, __u64);
} stats SEC(".maps");

static __always_inline void count(__u32 idx)
{
	__u64 *v = bpf_map_lookup_elem(&stats, &idx);

	// Per-CPU slot: no other CPU writes it and the program cannot migrate,
	// so a plain increment suffices (under PREEMPT_RT an increment could in
	// rare cases be lost, which is acceptable for statistics).
	if (v)
		*v += 1;
}

static __always_inline int is_ifmac(const __u8 *mac)
{
	// Compare byte by byte: the header need not be 4-byte aligned, and
	// clang unrolls this into six loads and compares.
	for (int i = 0; i < ETH_ALEN; i++)
		if (mac[i] != ifmac[i])
			return 0;
	return 1;
}

static __always_inline int steer(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	__u32 queue = ctx->rx_queue_index;

	// Runt: not even a full Ethernet header in the (first) buffer. Never
	// read past data_end; let the kernel deal with (and count) it.
	if ((void *)(eth + 1) > data_end) {
		count(XMX_STAT_RUNT);
		return XDP_PASS;
	}

	if (eth->h_proto != bpf_htons(ethertype)) {
		count(XMX_STAT_PASSED);
		return XDP_PASS;
	}

	// The group bit of the first octet marks broadcast and multicast,
	// which every endpoint may need (the host query); unicast must be ours.
	if (match_mac && !(eth->h_dest[0] & 1) && !is_ifmac(eth->h_dest)) {
		count(XMX_STAT_OTHER_HOST);
		return XDP_PASS;
	}

	// A stack frame. bpf_redirect_map falls back to XDP_PASS (the low bits
	// of flags) when the queue has no socket; look first so that this case
	// shows up in the counters.
	if (bpf_map_lookup_elem(&xsks, &queue))
		count(XMX_STAT_REDIRECTED);
	else
		count(XMX_STAT_NO_SOCKET);

	return bpf_redirect_map(&xsks, queue, XDP_PASS);
}

SEC("xdp")
int xmx_steer(struct xdp_md *ctx)
{
	return steer(ctx);
}

// Same logic for multi-buffer frames. Only the first buffer is inspected; it
// always holds at least the Ethernet header of a real frame.
SEC("xdp.frags")
int xmx_steer_frags(struct xdp_md *ctx)
{
	return steer(ctx);
}

char __license[] SEC("license") = "Dual BSD/GPL";
