module github.com/xmx-stack/xmx

go 1.26

require (
	github.com/asavie/xdp v0.3.3
	github.com/cilium/ebpf v0.22.0
	golang.org/x/sys v0.43.0
)

require (
	github.com/vishvananda/netlink v1.1.0 // indirect
	github.com/vishvananda/netns v0.0.0-20191106174202-0a2b9b5464df // indirect
)

tool github.com/cilium/ebpf/cmd/bpf2go
