package bpf

import (
	"encoding"
	"net/netip"
	"os"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"
	"golang.org/x/sys/unix"
)

// TestLayoutMatchesBTF checks the Go mirrors against the C structs, as the
// compiler laid them out in each committed object (refdp v1's and v2's).
func TestLayoutMatchesBTF(t *testing.T) {
	for _, f := range ConntrackFormats {
		t.Run(f.String(), func(t *testing.T) { checkLayout(t, f) })
	}
}

// ctOffsets are the offsets of the conntrack layout Go uses for format f, by
// member name.
func ctOffsets(f ConntrackFormat) map[string]uint32 {
	l := conntrackLayouts[f]
	m := map[string]uint32{
		"created_ns": uint32(l.createdNs), "last_seen_ns": uint32(l.lastSeenNs), "flags": uint32(l.flags),
		"service_id": uint32(l.serviceID), "nat_addr": uint32(l.natAddr), "nat_port": uint32(l.natPort), "snat_port": uint32(l.snatPort),
	}
	if l.counters {
		m["packets"], m["bytes"] = uint32(l.packets), uint32(l.bytes)
	}
	return m
}

func checkLayout(t *testing.T, format ConntrackFormat) {
	load := map[ConntrackFormat]func() (*ebpf.CollectionSpec, error){ConntrackFormatV1: loadDatapathV1, ConntrackFormatV2: loadDatapathV2}[format]
	spec, err := load()
	if err != nil {
		t.Fatal(err)
	}
	ctName := "ct_value_" + format.String()
	for _, tc := range []struct {
		name    string
		goValue encoding.BinaryMarshaler
		size    int
		offsets map[string]uint32 // bytes
	}{
		{"frontend_key", FrontendKey{}, frontendKeySize, map[string]uint32{"addr": 0, "port": 4, "proto": 6}},
		{"frontend_value", FrontendValue{}, frontendValueSize, map[string]uint32{"service_id": 0, "backend_count": 4, "flags": 8}},
		{"backend_key", BackendKey{}, backendKeySize, map[string]uint32{"service_id": 0, "index": 4}},
		{"backend_value", BackendValue{}, backendValueSize, map[string]uint32{"addr": 0, "port": 4}},
		{"ct_key", ConntrackKey{}, conntrackKeySize, map[string]uint32{"src": 0, "dst": 4, "sport": 8, "dport": 10, "proto": 12}},
		{ctName, formatted{ConntrackValue{}, format}, format.ValueSize(), ctOffsets(format)},
		{"endpoint_value", EndpointValue{}, endpointValueSize, map[string]uint32{
			"pod_ip": 0, "flags": 4, "policy_slot": 8, "ingress_rules": 10, "egress_rules": 12,
		}},
		{"ipset_key", IPSetKey{Prefix: netip.MustParsePrefix("0.0.0.0/0")}, ipsetKeySize, map[string]uint32{"prefixlen": 0, "set_id": 4, "addr": 8}},
		{"ipset_value", IPSetValue{}, ipsetValueSize, map[string]uint32{"flags": 0}},
		{"policy_key", PolicyKey{}, policyKeySize, map[string]uint32{"ifindex": 0, "dir": 4, "slot": 5, "index": 6}},
		{"policy_rule", PolicyRule{}, policyRuleSize, map[string]uint32{"set_id": 0, "port_min": 4, "port_max": 6, "proto": 8}},
		{"config_value", Config{}, configValueSize, map[string]uint32{"host_ip": 0, "host_ifindex": 4, "flags": 8}},
		{"verdict_event", Verdict{}, verdictSize, map[string]uint32{
			"time_ns": 0, "src": 8, "dst": 12, "sport": 16, "dport": 18, "proto": 20, "verdict": 21, "dir": 22, "reason": 23, "ifindex": 24,
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var s *btf.Struct
			if err := spec.Types.TypeByName(tc.name, &s); err != nil {
				t.Fatalf("struct %s in BTF: %v", tc.name, err)
			}
			if int(s.Size) != tc.size {
				t.Errorf("sizeof(struct %s) = %d, Go mirror uses %d", tc.name, s.Size, tc.size)
			}
			b, err := tc.goValue.MarshalBinary()
			if err != nil || len(b) != int(s.Size) {
				t.Errorf("Go mirror marshals to %d bytes (%v), C struct has %d", len(b), err, s.Size)
			}
			seen := 0
			for _, m := range s.Members {
				want, ok := tc.offsets[m.Name]
				if !ok {
					continue
				}
				seen++
				if got := m.Offset.Bytes(); got != want {
					t.Errorf("%s.%s at offset %d, Go mirror uses %d", tc.name, m.Name, got, want)
				}
			}
			if seen != len(tc.offsets) || seen != len(s.Members) && tc.name == ctName {
				t.Errorf("struct %s has members %v, the Go mirror uses %v", tc.name, s.Members, tc.offsets)
			}
		})
	}

	// The maps use these types.
	for name, kv := range map[string][2]string{
		FrontendsMapName:    {"frontend_key", "frontend_value"},
		BackendsMapName:     {"backend_key", "backend_value"},
		ConntrackMapName:    {"ct_key", ctName},
		EndpointsMapName:    {"__u32", "endpoint_value"},
		IPSetsMapName:       {"ipset_key", "ipset_value"},
		PolicyMapName:       {"policy_key", "policy_rule"},
		ConfigMapName:       {"__u32", "config_value"},
		VerdictsLostMapName: {"__u32", "__u64"},
	} {
		m := spec.Maps[name]
		if m == nil {
			t.Errorf("no map %s", name)
			continue
		}
		if m.Key.TypeName() != kv[0] || m.Value.TypeName() != kv[1] {
			t.Errorf("map %s: %s -> %s, want %s -> %s", name, m.Key.TypeName(), m.Value.TypeName(), kv[0], kv[1])
		}
	}
	if m := spec.Maps[VerdictsMapName]; m == nil || m.Type != ebpf.RingBuf || m.MaxEntries != VerdictRingSize || m.Value.TypeName() != "verdict_event" {
		t.Errorf("map %s: %+v, want a ring buffer of %d bytes of verdict_event", VerdictsMapName, m, VerdictRingSize)
	}
	// The staging of the copy: a key, then a value of either format.
	if m := spec.Maps["dpc_ct_staging"]; m == nil || m.Type != ebpf.Array || m.MaxEntries != migrateChunk || m.ValueSize != ctStagedSize || m.Flags&unix.BPF_F_MMAPABLE == 0 {
		t.Errorf("map dpc_ct_staging: %+v, want an mmapable array of %d entries of %d bytes", m, migrateChunk, ctStagedSize)
	}
	// The slots of the previous maps take a conntrack map of each format.
	for name, f := range map[string]ConntrackFormat{"dpc_ct_prev_v1": ConntrackFormatV1, "dpc_ct_prev_v2": ConntrackFormatV2} {
		m := spec.Maps[name]
		if m == nil || m.Type != ebpf.ArrayOfMaps || m.MaxEntries != 1 || m.InnerMap == nil {
			t.Errorf("map %s: %+v, want an array of one map", name, m)
			continue
		}
		if in := m.InnerMap; in.Type != ebpf.LRUHash || in.KeySize != conntrackKeySize || int(in.ValueSize) != f.ValueSize() {
			t.Errorf("map %s holds %s of %d -> %d bytes, want an LRU hash of %d -> %d (format %s)", name, in.Type, in.KeySize, in.ValueSize, conntrackKeySize, f.ValueSize(), f)
		}
	}
}

// TestConstantsMatchHeader checks the Go constants against the #defines of
// datapath.h.
func TestConstantsMatchHeader(t *testing.T) {
	header, err := os.ReadFile("datapath.h")
	if err != nil {
		t.Fatal(err)
	}
	defines := map[string]uint64{}
	re := regexp.MustCompile(`(?m)^#define\s+(DPC_\w+)\s+\(?(0x[0-9a-fA-F]+|\d+)(U\s*<<\s*(\d+)\))?`)
	for _, m := range re.FindAllStringSubmatch(string(header), -1) {
		v, err := strconv.ParseUint(m[2], 0, 64)
		if err != nil {
			t.Fatal(err)
		}
		if m[4] != "" {
			shift, _ := strconv.Atoi(m[4])
			v <<= shift
		}
		defines[m[1]] = v
	}
	for name, goValue := range map[string]uint64{
		"DPC_MARK_MASK":           uint64(MarkMask),
		"DPC_MARK_SEEN":           uint64(MarkSeen),
		"DPC_MARK_FALLTHROUGH":    uint64(MarkFallthrough),
		"DPC_MARK_VOUCHED":        uint64(MarkVouched),
		"DPC_FRONTENDS_MAX":       MaxFrontends,
		"DPC_BACKENDS_MAX":        MaxBackends,
		"DPC_ENDPOINTS_MAX":       MaxEndpoints,
		"DPC_SNAT_PORT_MIN":       SNATPortMin,
		"DPC_SNAT_PORT_MAX":       SNATPortMax,
		"DPC_CT_REPLY":            uint64(ConntrackReply),
		"DPC_CT_DNAT":             uint64(ConntrackDNAT),
		"DPC_CT_HOST_INGRESS":     uint64(ConntrackHostIngress),
		"DPC_CT_SNAT":             uint64(ConntrackSNAT),
		"DPC_CT_SNAT_REPLY":       uint64(ConntrackSNATReply),
		"DPC_CT_CLOSING":          uint64(ConntrackClosing),
		"DPC_SNAT_TRIES":          SNATPortTries,
		"DPC_CT_CLOSE_QUIET_MS":   uint64(ConntrackCloseQuiet / time.Millisecond),
		"DPC_CT_TCP_IDLE_SEC":     uint64(ConntrackTCPIdleTimeout / time.Second),
		"DPC_CT_UDP_IDLE_SEC":     uint64(ConntrackUDPIdleTimeout / time.Second),
		"DPC_EP_ANTISPOOF":        uint64(EndpointAntiSpoof),
		"DPC_EP_INGRESS_ISOLATED": uint64(EndpointIngressIsolated),
		"DPC_EP_EGRESS_ISOLATED":  uint64(EndpointEgressIsolated),
		"DPC_CT_INGRESS_OK":       uint64(ConntrackIngressOK),
		"DPC_CT_BACKEND_GONE":     uint64(ConntrackBackendGone),
		"DPC_CT_FOREIGN":          uint64(ConntrackForeign),
		"DPC_CT_PORT_MOVED":       uint64(ConntrackPortMoved),
		"DPC_IPSETS_MAX":          MaxIPSets,
		"DPC_POLICY_MAX":          MaxPolicy,
		"DPC_POLICY_RULES_MAX":    MaxPolicyRules,
		"DPC_IPSET_EXCEPT":        ipsetExcept,
		"DPC_DIR_INGRESS":         uint64(Ingress),
		"DPC_DIR_EGRESS":          uint64(Egress),
		"DPC_VERDICTS_SIZE":       VerdictRingSize,
		"DPC_VERDICT_DENY":        uint64(VerdictDeny),
		"DPC_VERDICT_ALLOW":       uint64(VerdictAllow),
		"DPC_REASON_NO_RULES":     uint64(ReasonNoRules),
		"DPC_REASON_NO_MATCH":     uint64(ReasonNoMatch),
		"DPC_REASON_NOT_ADMITTED": uint64(ReasonNotAdmitted),
		"DPC_REASON_RULE_MATCHED": uint64(ReasonRuleMatched),
	} {
		c, ok := defines[name]
		if !ok {
			t.Errorf("datapath.h does not define %s", name)
			continue
		}
		if c != goValue {
			t.Errorf("%s is %#x in datapath.h, %#x in Go", name, c, goValue)
		}
	}
	if MarkSeen&MarkMask != MarkSeen || MarkFallthrough&MarkMask != MarkFallthrough || MarkSeen == MarkFallthrough {
		t.Error("marks must be distinct and within MarkMask")
	}
}

func TestMarshalRoundTrip(t *testing.T) {
	k := ConntrackKey{Src: ip("10.0.0.1"), Dst: ip("10.0.0.2"), SrcPort: 1, DstPort: 65535, Proto: UDP}
	b, err := k.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	var back ConntrackKey
	if err := back.UnmarshalBinary(b); err != nil || back != k {
		t.Errorf("round trip %v -> % x -> %v (%v)", k, b, back, err)
	}
	if k.Reverse().Reverse() != k {
		t.Error("Reverse is not an involution")
	}
	for _, k := range []IPSetKey{
		{SetID: 7, Prefix: netip.MustParsePrefix("10.244.0.0/16")},
		{SetID: 1 << 24, Prefix: netip.MustParsePrefix("10.244.0.5/32")},
		{SetID: 3, Prefix: netip.MustParsePrefix("0.0.0.0/0")},
	} {
		b, err := k.MarshalBinary()
		var back IPSetKey
		if err != nil || back.UnmarshalBinary(b) != nil || back != k {
			t.Errorf("round trip %v -> % x -> %v (%v)", k, b, back, err)
		}
	}
	// Set ID in network order, prefixlen covering it: the trie matches the
	// set whole before the address.
	if b, _ := (IPSetKey{SetID: 7, Prefix: netip.MustParsePrefix("10.244.1.9/24")}).MarshalBinary(); string(b) != "\x38\x00\x00\x00\x00\x00\x00\x07\x0a\xf4\x01\x00" {
		t.Errorf("IP set key wire format % x", b)
	}
	if _, err := (IPSetKey{SetID: 1, Prefix: netip.MustParsePrefix("fd00::/64")}).MarshalBinary(); err == nil {
		t.Error("IPv6 IP set prefix accepted")
	}
	if _, err := (PolicyRule{PortMin: 81, PortMax: 80}).MarshalBinary(); err == nil {
		t.Error("empty port range accepted")
	}
	if _, err := (FrontendKey{Addr: ip("fd00::1")}).MarshalBinary(); err == nil {
		t.Error("IPv6 frontend accepted")
	}
	if b, _ := (FrontendKey{Addr: ip("10.96.0.1"), Port: 443, Proto: TCP}).MarshalBinary(); string(b) != "\x0a\x60\x00\x01\x01\xbb\x06\x00" {
		t.Errorf("frontend key wire format % x", b)
	}
}
