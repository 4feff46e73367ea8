package xdp

import "golang.org/x/sys/unix"

// FillRoomForTest is how many entries the link's fill ring has room for,
// as its producer side reckons it.
func (l *AFXDPLink) FillRoomForTest() (room, size uint32) {
	l.rxMu.Lock()
	defer l.rxMu.Unlock()
	return l.fill.free(1), l.fill.size
}

// SetMaxDescsForTest makes the link put at most n descriptors in a sent
// packet, as a driver's xdp-zc-max-segs would in zero-copy mode.
func (l *AFXDPLink) SetMaxDescsForTest(n int) {
	l.txMu.Lock()
	defer l.txMu.Unlock()
	l.maxDescs = n
}

// TxPacketDescsForTest returns how many descriptors each packet took that
// the link put on its TX ring from producer index from on, and the index
// it has reached.
func (l *AFXDPLink) TxPacketDescsForTest(from uint32) (packets []int, to uint32) {
	l.txMu.Lock()
	defer l.txMu.Unlock()
	n := 0
	for i := from; i != l.tx.cachedProd; i++ {
		n++
		if l.tx.descs[i&l.tx.mask].Options&unix.XDP_PKT_CONTD == 0 {
			packets = append(packets, n)
			n = 0
		}
	}
	return packets, l.tx.cachedProd
}

var ZeroCopyFitsForTest = zeroCopyFits

// ClosingForTest reports whether Close has begun.
func (l *AFXDPLink) ClosingForTest() bool { return l.closed.Load() }
