package xdp

import (
	"errors"
	"testing"

	"golang.org/x/sys/unix"
)

// TestIfInfoMissingFamily checks what an old kernel (no netdev family)
// looks like to xdpFeatures: ENOENT from CTRL_CMD_GETFAMILY, which
// InterfaceInfo turns into unknown features rather than an error.
func TestIfInfoMissingFamily(t *testing.T) {
	c, err := dialNetlink(unix.NETLINK_GENERIC)
	if err != nil {
		t.Fatal(err)
	}
	defer c.close()
	if _, err := c.genlFamily("xmx-no-such"); !errors.Is(err, unix.ENOENT) {
		t.Errorf("resolving a missing family: %v, want ENOENT", err)
	}
	id, err := c.genlFamily("nlctrl")
	if err != nil || id != unix.GENL_ID_CTRL {
		t.Errorf("resolving nlctrl: %d, %v; want %d", id, err, unix.GENL_ID_CTRL)
	}
}

// TestIfInfoAttrs checks the attribute walker on well-formed, padded and
// malformed input: it never reads past the buffer.
func TestIfInfoAttrs(t *testing.T) {
	b := appendAttr(nil, 1, []byte{1, 2, 3})
	b = appendAttr(b, 2|unix.NLA_F_NESTED, appendAttr(nil, 7, []byte{9, 0, 0, 0}))
	var got []uint16
	for typ, v := range attrs(b) {
		got = append(got, typ)
		if typ == 2 {
			for typ2, v2 := range attrs(v) {
				if typ2 != 7 || u32(v2) != 9 {
					t.Errorf("nested attribute %d = %v", typ2, v2)
				}
			}
		}
	}
	if len(got) != 2 || got[0] != 1 || got[1] != 2 {
		t.Errorf("attribute types %v, want [1 2]", got)
	}
	for _, bad := range [][]byte{{}, {3, 0}, {2, 0, 1, 0}, {200, 0, 1, 0, 0, 0, 0, 0}} {
		for range attrs(bad) {
			t.Errorf("malformed %v yielded an attribute", bad)
		}
	}
	if _, ok := parseLink([]byte{1, 2, 3}); ok {
		t.Error("parseLink accepted a short message")
	}
}
