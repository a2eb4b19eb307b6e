package bpf

import (
	"fmt"
	"strings"
)

// ConntrackFormat is the format of the conntrack map's values (datapath.h):
// each version of refdp writes one, and reads the other to migrate it. The
// conntrack map's pin name carries its format, so that a map pinned by one
// version is never taken by another for its own.
type ConntrackFormat int

// Conntrack formats.
const (
	// ConntrackFormatV1 is refdp v1's: struct ct_value_v1, 32 bytes, pinned
	// as ConntrackMapName.
	ConntrackFormatV1 ConntrackFormat = 1
	// ConntrackFormatV2 is refdp v2's: struct ct_value_v2, 48 bytes, pinned as
	// ConntrackMapName + "_v2". It adds a count of the packets and bytes of
	// each entry, before the flags: every field after LastSeenNs moved.
	ConntrackFormatV2 ConntrackFormat = 2
	// DefaultConntrackFormat is the format of Options with none set.
	DefaultConntrackFormat = ConntrackFormatV2
)

// ConntrackFormats lists the formats, oldest first.
var ConntrackFormats = []ConntrackFormat{ConntrackFormatV1, ConntrackFormatV2}

// String names the format as refdp's versions are named, v1 or v2.
func (f ConntrackFormat) String() string { return fmt.Sprintf("v%d", int(f)) }

// ParseConntrackFormat parses a refdp version, v1 or v2, as the conntrack
// format it writes.
func ParseConntrackFormat(s string) (ConntrackFormat, error) {
	for _, f := range ConntrackFormats {
		if s == f.String() {
			return f, nil
		}
	}
	names := make([]string, len(ConntrackFormats))
	for i, f := range ConntrackFormats {
		names[i] = f.String()
	}
	return 0, fmt.Errorf("unknown version %q: refdp has versions %s", s, strings.Join(names, ", "))
}

// PinName is the name the conntrack map of format f is pinned under.
func (f ConntrackFormat) PinName() string {
	if f == ConntrackFormatV1 {
		return ConntrackMapName // the name v1 pinned it under before formats had names
	}
	return fmt.Sprintf("%s_v%d", ConntrackMapName, int(f))
}

// asidePinName is where Open sets aside a pinned map of format f that does not
// fit the requested one (another size) until MigrateConntrack has copied it.
func (f ConntrackFormat) asidePinName() string { return f.PinName() + "_old" }

// ValueSize is the size of a value of format f, in bytes.
func (f ConntrackFormat) ValueSize() int {
	l, err := f.layout()
	if err != nil {
		return 0
	}
	return l.size
}

// conntrackLayout is where each field of a conntrack value lies, in bytes, in
// one format. TestLayoutMatchesBTF checks it against each object's BTF.
type conntrackLayout struct {
	size                                         int
	createdNs, lastSeenNs                        int
	counters                                     bool
	packets, bytes                               int
	flags, serviceID, natAddr, natPort, snatPort int
}

var conntrackLayouts = map[ConntrackFormat]conntrackLayout{
	ConntrackFormatV1: {size: 32, createdNs: 0, lastSeenNs: 8, flags: 16, serviceID: 20, natAddr: 24, natPort: 28, snatPort: 30},
	ConntrackFormatV2: {size: 48, createdNs: 0, lastSeenNs: 8, counters: true, packets: 16, bytes: 24,
		flags: 32, serviceID: 36, natAddr: 40, natPort: 44, snatPort: 46},
}

func (f ConntrackFormat) layout() (conntrackLayout, error) {
	l, ok := conntrackLayouts[f]
	if !ok {
		return conntrackLayout{}, fmt.Errorf("unknown conntrack format %d", int(f))
	}
	return l, nil
}

func conntrackFormatOfSize(n int) (ConntrackFormat, error) {
	for f, l := range conntrackLayouts {
		if l.size == n {
			return f, nil
		}
	}
	return 0, fmt.Errorf("conntrack value: %d bytes is no format's size (v1: 32, v2: 48)", n)
}
