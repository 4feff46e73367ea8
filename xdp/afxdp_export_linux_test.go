package xdp

// FillRoomForTest is how many entries the link's fill ring has room for,
// as its producer side reckons it.
func (l *AFXDPLink) FillRoomForTest() (room, size uint32) {
	l.rxMu.Lock()
	defer l.rxMu.Unlock()
	return l.fill.free(1), l.fill.size
}
