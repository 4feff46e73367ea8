package xdp

// Multi-buffer AF_XDP (XDP_USE_SG, Linux 6.6+): when to use it and what the
// kernel allows. The receive and send paths themselves are in
// afxdp_linux.go (recvReady, Send, queueFrame), which handle single- and
// multi-buffer packets alike; this file is owned by the AF_XDP link too.
//
// Kernel facts this relies on (Documentation/networking/af_xdp.rst,
// "Multi-Buffer Support"):
//   - A packet is a run of descriptors, each pointing at one UMEM frame; all
//     but the last carry XDP_PKT_CONTD in their options. Without XDP_USE_SG
//     the kernel drops a packet that does not fit one frame.
//   - Receive: in copy mode the kernel fills each frame with up to
//     FrameSize-256 bytes (the headroom stays in front of every fragment)
//     and only hands complete packets to the socket: it reserves the fill
//     and RX ring entries for all fragments first, and drops the packet
//     (rx_dropped, rx_ring_full) if it cannot.
//   - Send: a fragment holds up to FrameSize bytes. In copy mode a packet
//     becomes one skb, its first fragment in the linear part and the others
//     as page fragments, so it takes at most MAX_SKB_FRAGS+1 descriptors
//     (18 with the default MAX_SKB_FRAGS of 17); a longer one is dropped as
//     invalid. In zero-copy mode the driver's limit (netlink attribute
//     xdp-zc-max-segs) applies instead; bind refuses XDP_USE_SG in
//     zero-copy mode on a driver that allows one segment only.
//   - Every fragment's frame comes back on the completion ring by itself.
//   - The XDP program must be of type xdp.frags to see (and redirect)
//     multi-buffer frames; on veth only such a program runs in driver mode
//     at an MTU above 3506.

import (
	"errors"
	"fmt"

	"golang.org/x/sys/unix"
)

// copyModeMaxDescs is the most descriptors a sent packet may take in copy
// mode: MAX_SKB_FRAGS+1 with the kernel's default MAX_SKB_FRAGS (17). A
// kernel built with a larger CONFIG_MAX_SKB_FRAGS takes more; this is the
// bound every kernel honours.
const copyModeMaxDescs = 18

// zeroCopyFits refuses zero-copy multi-buffer mode when the driver takes
// fewer buffers per frame (segs, its xdp-zc-max-segs; 0 when unknown) than
// the link's largest frame of maxFrame bytes needs (descs): such frames
// would be dropped as invalid. The error wraps EOPNOTSUPP, so that
// BindAuto falls back to copy mode.
func zeroCopyFits(segs, descs, maxFrame int) error {
	if segs == 0 || descs <= segs {
		return nil
	}
	return fmt.Errorf("the driver takes %d buffers per frame in zero-copy mode, a %d-byte frame needs %d: %w",
		segs, maxFrame, descs, unix.EOPNOTSUPP)
}

// driverZCMaxSegs is the xdp-zc-max-segs of the device at ifindex in the
// calling thread's namespace: the most buffers of one frame a zero-copy
// socket may use. 0 when the kernel does not tell (before Linux 6.3, where
// multi-buffer AF_XDP does not exist either).
func driverZCMaxSegs(ifindex int) int {
	feats, _ := xdpFeatures()
	return feats[ifindex].zcMaxSegs
}

// multiBufferNeeded decides whether a link on an interface with this MTU
// runs in multi-buffer mode (force asks for it even when not needed) and
// checks that the UMEM can carry the largest frame: its descriptors must fit
// the kernel's per-packet limit and the rings (each half of the UMEM must
// hold at least one whole frame, or Send and Recv would wait forever).
func multiBufferNeeded(mtu, frameSize, numFrames int, force bool) (bool, error) {
	maxFrame := mtu + EthHeaderLen
	rxRoom := frameSize - xdpHeadroom
	if maxFrame <= rxRoom && !force {
		return false, nil
	}
	txDescs := (maxFrame + frameSize - 1) / frameSize
	rxDescs := (maxFrame + rxRoom - 1) / rxRoom
	if txDescs > copyModeMaxDescs {
		return false, fmt.Errorf("MTU %d needs %d descriptors of %d bytes per frame, more than the %d the kernel takes per packet: %w",
			mtu, txDescs, frameSize, copyModeMaxDescs, ErrNotSupported)
	}
	if half := numFrames / 2; half < max(txDescs, rxDescs) {
		return false, fmt.Errorf("frame count %d: a %d-byte frame takes %d receive and %d send frames of %d bytes, more than half the UMEM (%d)",
			numFrames, maxFrame, rxDescs, txDescs, frameSize, half)
	}
	return true, nil
}

// sgBindErr explains a bind refused because of XDP_USE_SG: kernels before
// 6.6 do not know the flag and answer EINVAL.
func (l *AFXDPLink) sgBindErr(err error) error {
	if err == nil || !l.sg || !errors.Is(err, unix.EINVAL) {
		return err
	}
	return fmt.Errorf("%w: %w", ErrMultiBufferUnsupported, err)
}

// ErrMultiBufferUnsupported is the error (wrapped) of opening a
// multi-buffer AF_XDP link (jumbo MTU, MultiBuffer) on a kernel that
// refuses XDP_USE_SG.
var ErrMultiBufferUnsupported = errors.New("multi-buffer AF_XDP (XDP_USE_SG) refused: needs Linux 6.6 or later")
