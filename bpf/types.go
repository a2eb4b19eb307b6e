package bpf

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"time"
)

// Packet marks, mirrored from DPC_MARK_* in datapath.h. The datapath sets one
// of them (within MarkMask, leaving the other bits of skb->mark alone) on the
// packets it handles, so that the node's iptables FORWARD and INPUT chains can
// accept each class:
//
//	-m mark --mark 0x1000000/0xf000000 -j ACCEPT
//	-m mark --mark 0x2000000/0xf000000 -m conntrack --ctstate ESTABLISHED,RELATED -j MARK --or-mark 0x4000000
//	-m mark --mark 0x6000000/0xf000000 -j ACCEPT
const (
	// MarkMask covers the mark bits that belong to the datapath.
	MarkMask uint32 = 0x0f000000
	// MarkSeen is set on every packet that BPF conntrack tracks (and NATs, if
	// its flow needs NAT). Such a packet is accepted unconditionally.
	MarkSeen uint32 = 0x01000000
	// MarkFallthrough is set on a TCP packet in the middle of a flow (no SYN)
	// that BPF conntrack does not know, e.g. one that predates the datapath.
	// The packet is passed on unchanged (TC_ACT_OK) for the Linux stack, whose
	// conntrack may know it: accept it only if ESTABLISHED or RELATED.
	MarkFallthrough uint32 = 0x02000000
	// MarkVouched is added by iptables to a fallthrough packet whose flow Linux
	// conntrack knows. The egress programs drop a fallthrough packet without it:
	// a mid-flow packet that neither conntrack knows leaves by none of the
	// interfaces the datapath manages.
	MarkVouched uint32 = 0x04000000
)

// Port range of the source ports that NodePort SNAT uses (DPC_SNAT_PORT_*):
// above Linux's default ip_local_port_range, to stay clear of the node's own
// connections.
const (
	SNATPortMin = 61000
	SNATPortMax = 65535
)

// How NodePort SNAT picks a port for a new flow (DPC_SNAT_TRIES and
// DPC_CT_*_QUIET_MS/_IDLE_SEC). It tries SNATPortTries ports, starting at a
// hash of the flow's tuple, and takes the first free one; if none is free,
// the least recently seen candidate whose SNAT reply entry is reusable; if
// none is, it drops the packet (a TCP client retransmits its SYN). A SNAT
// reply entry of another flow is reusable when it is ConntrackClosing and
// has been quiet for ConntrackCloseQuiet, or has been idle for
// ConntrackTCPIdleTimeout or ConntrackUDPIdleTimeout (whatever its state).
// Conntrack entries have no other timeout: the LRU evicts them.
const (
	SNATPortTries           = 32
	ConntrackCloseQuiet     = 1000 * time.Millisecond
	ConntrackTCPIdleTimeout = 120 * time.Second
	ConntrackUDPIdleTimeout = 30 * time.Second
)

// Capacities of the maps that are not sized at load time (DPC_*_MAX).
const (
	MaxFrontends = 16384
	MaxBackends  = 65536
	MaxEndpoints = 4096
	// MaxIPSets is the capacity of the IP set map, in prefixes over all sets.
	MaxIPSets = 65536
	// MaxPolicy is the capacity of the policy map, in rules over all
	// endpoints, directions and both slots.
	MaxPolicy = 65536
	// MaxPolicyRules is the most rules an endpoint has for one direction.
	MaxPolicyRules = 256
)

// ErrNotIPv4 is returned when an address given to the datapath is not IPv4.
var ErrNotIPv4 = errors.New("not an IPv4 address")

// Proto is an IP protocol number as the datapath stores it.
type Proto uint8

// The protocols the datapath handles. A policy rule may name SCTP too, but
// the programs do not parse SCTP: its packets pass unpoliced, like any other
// protocol they do not parse.
const (
	TCP  Proto = 6
	UDP  Proto = 17
	SCTP Proto = 132
)

// String returns "TCP", "UDP", "SCTP" or the protocol number.
func (p Proto) String() string {
	switch p {
	case TCP:
		return "TCP"
	case UDP:
		return "UDP"
	case SCTP:
		return "SCTP"
	}
	return fmt.Sprintf("proto(%d)", uint8(p))
}

func putAddr(b []byte, a netip.Addr, what string) error {
	if a == (netip.Addr{}) {
		copy(b, []byte{0, 0, 0, 0})
		return nil
	}
	a = a.Unmap()
	if !a.Is4() {
		return fmt.Errorf("%s %s: %w", what, a, ErrNotIPv4)
	}
	v := a.As4()
	copy(b, v[:])
	return nil
}

func getAddr(b []byte) netip.Addr {
	return netip.AddrFrom4([4]byte(b[:4]))
}

func checkLen(b []byte, n int, what string) error {
	if len(b) != n {
		return fmt.Errorf("%s: %d bytes, want %d", what, len(b), n)
	}
	return nil
}

// FrontendKey mirrors struct frontend_key: a service frontend. For a
// ClusterIP it is (cluster IP, port, proto); for a NodePort, (the node's host
// IP, node port, proto); there is no wildcard frontend.
type FrontendKey struct {
	Addr  netip.Addr
	Port  uint16
	Proto Proto
}

const frontendKeySize = 8

// MarshalBinary encodes k as struct frontend_key.
func (k FrontendKey) MarshalBinary() ([]byte, error) {
	b := make([]byte, frontendKeySize)
	if err := putAddr(b[0:4], k.Addr, "frontend"); err != nil {
		return nil, err
	}
	binary.BigEndian.PutUint16(b[4:6], k.Port)
	b[6] = byte(k.Proto)
	return b, nil
}

// UnmarshalBinary decodes struct frontend_key.
func (k *FrontendKey) UnmarshalBinary(b []byte) error {
	if err := checkLen(b, frontendKeySize, "frontend key"); err != nil {
		return err
	}
	*k = FrontendKey{Addr: getAddr(b), Port: binary.BigEndian.Uint16(b[4:6]), Proto: Proto(b[6])}
	return nil
}

// String formats k as addr:port/proto.
func (k FrontendKey) String() string {
	return fmt.Sprintf("%s/%s", netip.AddrPortFrom(k.Addr, k.Port), k.Proto)
}

// FrontendValue mirrors struct frontend_value: which backends serve a
// frontend. Its backends are BackendKey{ServiceID, 0..BackendCount-1}.
type FrontendValue struct {
	ServiceID    uint32
	BackendCount uint32
	// Flags is reserved and must be 0.
	Flags uint32
}

const frontendValueSize = 12

// MarshalBinary encodes v as struct frontend_value.
func (v FrontendValue) MarshalBinary() ([]byte, error) {
	b := make([]byte, frontendValueSize)
	binary.NativeEndian.PutUint32(b[0:], v.ServiceID)
	binary.NativeEndian.PutUint32(b[4:], v.BackendCount)
	binary.NativeEndian.PutUint32(b[8:], v.Flags)
	return b, nil
}

// UnmarshalBinary decodes struct frontend_value.
func (v *FrontendValue) UnmarshalBinary(b []byte) error {
	if err := checkLen(b, frontendValueSize, "frontend value"); err != nil {
		return err
	}
	*v = FrontendValue{
		ServiceID:    binary.NativeEndian.Uint32(b[0:]),
		BackendCount: binary.NativeEndian.Uint32(b[4:]),
		Flags:        binary.NativeEndian.Uint32(b[8:]),
	}
	return nil
}

// BackendKey mirrors struct backend_key: the Index-th backend of a service.
type BackendKey struct {
	ServiceID uint32
	Index     uint32
}

const backendKeySize = 8

// MarshalBinary encodes k as struct backend_key.
func (k BackendKey) MarshalBinary() ([]byte, error) {
	b := make([]byte, backendKeySize)
	binary.NativeEndian.PutUint32(b[0:], k.ServiceID)
	binary.NativeEndian.PutUint32(b[4:], k.Index)
	return b, nil
}

// UnmarshalBinary decodes struct backend_key.
func (k *BackendKey) UnmarshalBinary(b []byte) error {
	if err := checkLen(b, backendKeySize, "backend key"); err != nil {
		return err
	}
	*k = BackendKey{ServiceID: binary.NativeEndian.Uint32(b[0:]), Index: binary.NativeEndian.Uint32(b[4:])}
	return nil
}

// BackendValue mirrors struct backend_value: where a backend listens.
type BackendValue struct {
	Addr netip.Addr
	Port uint16
}

const backendValueSize = 8

// MarshalBinary encodes v as struct backend_value.
func (v BackendValue) MarshalBinary() ([]byte, error) {
	b := make([]byte, backendValueSize)
	if err := putAddr(b[0:4], v.Addr, "backend"); err != nil {
		return nil, err
	}
	binary.BigEndian.PutUint16(b[4:6], v.Port)
	return b, nil
}

// UnmarshalBinary decodes struct backend_value.
func (v *BackendValue) UnmarshalBinary(b []byte) error {
	if err := checkLen(b, backendValueSize, "backend value"); err != nil {
		return err
	}
	*v = BackendValue{Addr: getAddr(b), Port: binary.BigEndian.Uint16(b[4:6])}
	return nil
}

// String formats v as addr:port.
func (v BackendValue) String() string { return netip.AddrPortFrom(v.Addr, v.Port).String() }

// ConntrackKey mirrors struct ct_key: a flow's tuple in one direction, as it
// is on the wire where the datapath looks it up.
type ConntrackKey struct {
	Src, Dst         netip.Addr
	SrcPort, DstPort uint16
	Proto            Proto
}

const conntrackKeySize = 16

// MarshalBinary encodes k as struct ct_key.
func (k ConntrackKey) MarshalBinary() ([]byte, error) {
	b := make([]byte, conntrackKeySize)
	if err := putAddr(b[0:4], k.Src, "conntrack source"); err != nil {
		return nil, err
	}
	if err := putAddr(b[4:8], k.Dst, "conntrack destination"); err != nil {
		return nil, err
	}
	binary.BigEndian.PutUint16(b[8:10], k.SrcPort)
	binary.BigEndian.PutUint16(b[10:12], k.DstPort)
	b[12] = byte(k.Proto)
	return b, nil
}

// UnmarshalBinary decodes struct ct_key.
func (k *ConntrackKey) UnmarshalBinary(b []byte) error {
	if err := checkLen(b, conntrackKeySize, "conntrack key"); err != nil {
		return err
	}
	*k = ConntrackKey{
		Src:     getAddr(b[0:4]),
		Dst:     getAddr(b[4:8]),
		SrcPort: binary.BigEndian.Uint16(b[8:10]),
		DstPort: binary.BigEndian.Uint16(b[10:12]),
		Proto:   Proto(b[12]),
	}
	return nil
}

// Reverse returns the tuple of the other direction.
func (k ConntrackKey) Reverse() ConntrackKey {
	return ConntrackKey{Src: k.Dst, Dst: k.Src, SrcPort: k.DstPort, DstPort: k.SrcPort, Proto: k.Proto}
}

// String formats k as src:port->dst:port/proto.
func (k ConntrackKey) String() string {
	return fmt.Sprintf("%s->%s/%s", netip.AddrPortFrom(k.Src, k.SrcPort), netip.AddrPortFrom(k.Dst, k.DstPort), k.Proto)
}

// ConntrackFlags mirrors DPC_CT_*.
type ConntrackFlags uint32

// Conntrack entry flags.
const (
	// ConntrackReply: the entry is keyed by the reply tuple of its flow.
	ConntrackReply ConntrackFlags = 1 << 0
	// ConntrackDNAT: the flow was DNATed. Original entry: NATAddr/NATPort is
	// the backend. Reply entry: it is the frontend, restored as the source
	// where the reply leaves the node.
	ConntrackDNAT ConntrackFlags = 1 << 1
	// ConntrackHostIngress: the flow entered the node on the host interface.
	ConntrackHostIngress ConntrackFlags = 1 << 2
	// ConntrackSNAT: reply entry of a flow that leaves the host interface
	// with source (host IP, SNATPort).
	ConntrackSNAT ConntrackFlags = 1 << 3
	// ConntrackSNATReply: the entry is keyed by the reply tuple after SNAT
	// (backend -> host IP:SNAT port); NATAddr/NATPort is the client.
	ConntrackSNATReply ConntrackFlags = 1 << 4
	// ConntrackClosing: a TCP FIN or RST matched the entry, so its flow is
	// closing or closed; a bare SYN that matches it clears the flag. A
	// closing SNAT reply entry is reusable once quiet (ConntrackCloseQuiet).
	ConntrackClosing ConntrackFlags = 1 << 5
	// ConntrackIngressOK: the destination endpoint's ingress policy admitted
	// the flow (or the endpoint was not isolated), so its later packets are
	// not judged again. It is set on the entry the destination's tc egress
	// finds (the original entry; for a DNAT flow, the reply entry) and on the
	// reply entry; a bare SYN that restarts the tuple clears it.
	ConntrackIngressOK ConntrackFlags = 1 << 6
	// ConntrackBackendGone: the flow's backend has left its service and is not
	// listed any more (set by Datapath.MarkDNATFlowsGone on the original entry of
	// a TCP DNAT flow). A pod's next packet on the flow, other than a SYN, is
	// answered with a RST from the frontend, and the flow's entries are deleted.
	ConntrackBackendGone ConntrackFlags = 1 << 7
	// ConntrackForeign: the reply tuple of a TCP flow that predates the
	// datapath, NATed by the stack to a port of the SNAT range (kube-proxy's
	// MASQUERADE before a switch), recorded when one of its packets fell
	// through at host ingress: no SNAT of the datapath takes that port
	// towards the same backend while the flow lives.
	ConntrackForeign ConntrackFlags = 1 << 8
	// ConntrackPortMoved: the flow's source port was moved where it entered
	// from its workload, because its tuple on the wire (after DNAT) was a live
	// flow's: a client may use one source port towards a Service's frontend and
	// one of its backends, which DNAT makes one tuple. Original entry: SNATPort
	// is the source port on the wire, one of the SNAT range. Reply entry, keyed
	// by that port: SNATPort is the client's own port, restored as destination
	// where the reply leaves.
	ConntrackPortMoved ConntrackFlags = 1 << 9
)

// ConntrackValue is a conntrack entry's value, in either format
// (ConntrackFormat): it mirrors struct ct_value_v2, and format 1 lacks the
// counters. It decodes from a value of either format (told apart by their
// sizes) and encodes as the default format, ConntrackFormatV2; the
// Datapath's conntrack map encodes it in the map's own format.
type ConntrackValue struct {
	// CreatedNs and LastSeenNs are CLOCK_MONOTONIC nanoseconds.
	CreatedNs  uint64
	LastSeenNs uint64
	// Packets and Bytes count the packets that matched the entry since it was
	// created (the one that created it not included) or converted from
	// format 1. Format 2 only: zero when read from a format 1 map, and not
	// written to one.
	Packets, Bytes uint64
	Flags          ConntrackFlags
	ServiceID      uint32
	NATAddr        netip.Addr
	NATPort        uint16
	// SNATPort is the port of a SNAT (ConntrackSNAT) or of a moved flow
	// (ConntrackPortMoved).
	SNATPort uint16
}

// MarshalBinary encodes v in the default format (struct ct_value_v2).
func (v ConntrackValue) MarshalBinary() ([]byte, error) {
	return v.marshal(DefaultConntrackFormat)
}

// MarshalFormat encodes v in format f, e.g. to fill a map of that format.
func (v ConntrackValue) MarshalFormat(f ConntrackFormat) ([]byte, error) { return v.marshal(f) }

func (v ConntrackValue) marshal(f ConntrackFormat) ([]byte, error) {
	l, err := f.layout()
	if err != nil {
		return nil, err
	}
	b := make([]byte, l.size)
	binary.NativeEndian.PutUint64(b[l.createdNs:], v.CreatedNs)
	binary.NativeEndian.PutUint64(b[l.lastSeenNs:], v.LastSeenNs)
	if l.counters {
		binary.NativeEndian.PutUint64(b[l.packets:], v.Packets)
		binary.NativeEndian.PutUint64(b[l.bytes:], v.Bytes)
	}
	binary.NativeEndian.PutUint32(b[l.flags:], uint32(v.Flags))
	binary.NativeEndian.PutUint32(b[l.serviceID:], v.ServiceID)
	if err := putAddr(b[l.natAddr:l.natAddr+4], v.NATAddr, "conntrack NAT"); err != nil {
		return nil, err
	}
	binary.BigEndian.PutUint16(b[l.natPort:], v.NATPort)
	binary.BigEndian.PutUint16(b[l.snatPort:], v.SNATPort)
	return b, nil
}

// UnmarshalBinary decodes a value of either format, by its size.
func (v *ConntrackValue) UnmarshalBinary(b []byte) error {
	f, err := conntrackFormatOfSize(len(b))
	if err != nil {
		return err
	}
	l := conntrackLayouts[f]
	*v = ConntrackValue{
		CreatedNs:  binary.NativeEndian.Uint64(b[l.createdNs:]),
		LastSeenNs: binary.NativeEndian.Uint64(b[l.lastSeenNs:]),
		Flags:      ConntrackFlags(binary.NativeEndian.Uint32(b[l.flags:])),
		ServiceID:  binary.NativeEndian.Uint32(b[l.serviceID:]),
		NATAddr:    getAddr(b[l.natAddr:]),
		NATPort:    binary.BigEndian.Uint16(b[l.natPort:]),
		SNATPort:   binary.BigEndian.Uint16(b[l.snatPort:]),
	}
	if l.counters {
		v.Packets = binary.NativeEndian.Uint64(b[l.packets:])
		v.Bytes = binary.NativeEndian.Uint64(b[l.bytes:])
	}
	return nil
}

// EndpointFlags mirrors DPC_EP_*.
type EndpointFlags uint32

// Endpoint flags.
const (
	// EndpointAntiSpoof drops IPv4 packets from the workload whose source is
	// not its pod IP.
	EndpointAntiSpoof EndpointFlags = 1 << 0
	// EndpointIngressIsolated: some policy selects the endpoint for ingress.
	// A new flow to it passes only if one of its ingress rules allows it.
	EndpointIngressIsolated EndpointFlags = 1 << 1
	// EndpointEgressIsolated: some policy selects the endpoint for egress. A
	// new flow from it passes only if one of its egress rules allows it.
	EndpointEgressIsolated EndpointFlags = 1 << 2

	policyFlags = EndpointIngressIsolated | EndpointEgressIsolated
)

// EndpointValue mirrors struct endpoint_value, keyed by the ifindex of a
// workload's host-side interface. The endpoint programs leave alone the
// traffic of an interface that has no entry.
type EndpointValue struct {
	PodIP netip.Addr
	Flags EndpointFlags
	// PolicySlot is the slot of the policy map whose rules are live;
	// IngressRules and EgressRules count them (PolicyKey.Index 0..n-1).
	PolicySlot                uint8
	IngressRules, EgressRules uint16
}

const (
	endpointValueSize = 16
	// endpointValueV0Size is the size of struct endpoint_value before
	// network policy: pod_ip and flags only.
	endpointValueV0Size = 8
)

// MarshalBinary encodes v as struct endpoint_value.
func (v EndpointValue) MarshalBinary() ([]byte, error) {
	b := make([]byte, endpointValueSize)
	if err := putAddr(b[0:4], v.PodIP, "pod IP"); err != nil {
		return nil, err
	}
	binary.NativeEndian.PutUint32(b[4:], uint32(v.Flags))
	b[8] = v.PolicySlot
	binary.NativeEndian.PutUint16(b[10:], v.IngressRules)
	binary.NativeEndian.PutUint16(b[12:], v.EgressRules)
	return b, nil
}

// UnmarshalBinary decodes struct endpoint_value.
func (v *EndpointValue) UnmarshalBinary(b []byte) error {
	if err := checkLen(b, endpointValueSize, "endpoint value"); err != nil {
		return err
	}
	*v = EndpointValue{
		PodIP:        getAddr(b[0:4]),
		Flags:        EndpointFlags(binary.NativeEndian.Uint32(b[4:])),
		PolicySlot:   b[8],
		IngressRules: binary.NativeEndian.Uint16(b[10:]),
		EgressRules:  binary.NativeEndian.Uint16(b[12:]),
	}
	return nil
}

// IPSetKey mirrors struct ipset_key: a prefix of the IP set SetID, in the
// LPM trie of all sets. Its prefixlen is 32 (the set ID) plus the prefix's.
// A lookup of (SetID, a /32) finds the longest prefix of the set that holds
// the address.
type IPSetKey struct {
	SetID  uint32
	Prefix netip.Prefix
}

const ipsetKeySize = 12

// MarshalBinary encodes k as struct ipset_key. The prefix is masked: the
// trie ignores the bits beyond the prefix length, and so does the key.
func (k IPSetKey) MarshalBinary() ([]byte, error) {
	if !k.Prefix.IsValid() {
		return nil, fmt.Errorf("IP set %d: invalid prefix %s", k.SetID, k.Prefix)
	}
	p := k.Prefix.Masked()
	if !p.Addr().Is4() {
		return nil, fmt.Errorf("IP set %d prefix %s: %w", k.SetID, k.Prefix, ErrNotIPv4)
	}
	b := make([]byte, ipsetKeySize)
	binary.NativeEndian.PutUint32(b[0:], uint32(32+p.Bits()))
	binary.BigEndian.PutUint32(b[4:], k.SetID)
	a := p.Addr().As4()
	copy(b[8:], a[:])
	return b, nil
}

// UnmarshalBinary decodes struct ipset_key.
func (k *IPSetKey) UnmarshalBinary(b []byte) error {
	if err := checkLen(b, ipsetKeySize, "IP set key"); err != nil {
		return err
	}
	plen := binary.NativeEndian.Uint32(b[0:])
	if plen < 32 || plen > 64 {
		return fmt.Errorf("IP set key: prefixlen %d, want 32..64", plen)
	}
	*k = IPSetKey{
		SetID:  binary.BigEndian.Uint32(b[4:]),
		Prefix: netip.PrefixFrom(getAddr(b[8:12]), int(plen-32)),
	}
	return nil
}

// String formats k as set/prefix.
func (k IPSetKey) String() string { return fmt.Sprintf("%d/%s", k.SetID, k.Prefix) }

// IPSetValue mirrors struct ipset_value.
type IPSetValue struct {
	// Except carves the prefix out of its set (an ipBlock's except): the
	// longest prefix wins, so the addresses under it are not members.
	Except bool
}

const (
	ipsetValueSize = 4
	ipsetExcept    = 1 << 0 // DPC_IPSET_EXCEPT
)

// MarshalBinary encodes v as struct ipset_value.
func (v IPSetValue) MarshalBinary() ([]byte, error) {
	b := make([]byte, ipsetValueSize)
	if v.Except {
		binary.NativeEndian.PutUint32(b, ipsetExcept)
	}
	return b, nil
}

// UnmarshalBinary decodes struct ipset_value.
func (v *IPSetValue) UnmarshalBinary(b []byte) error {
	if err := checkLen(b, ipsetValueSize, "IP set value"); err != nil {
		return err
	}
	*v = IPSetValue{Except: binary.NativeEndian.Uint32(b)&ipsetExcept != 0}
	return nil
}

// Direction is the direction of traffic that a policy rule applies to, seen
// from the workload (DPC_DIR_*). Ingress rules are judged where traffic
// reaches the workload: at tc egress of its host-side interface.
type Direction uint8

// Policy directions.
const (
	// Ingress is traffic to the workload; its rules match the source.
	Ingress Direction = 0
	// Egress is traffic from the workload; its rules match the destination
	// (after service DNAT: the backend, not the ClusterIP).
	Egress Direction = 1
)

// String returns "ingress" or "egress".
func (d Direction) String() string {
	switch d {
	case Ingress:
		return "ingress"
	case Egress:
		return "egress"
	}
	return fmt.Sprintf("direction(%d)", uint8(d))
}

// PolicyKey mirrors struct policy_key: the Index-th rule of an endpoint for
// one direction, in one of its two slots (0 or 1).
type PolicyKey struct {
	Ifindex uint32
	Dir     Direction
	Slot    uint8
	Index   uint16
}

const policyKeySize = 8

// MarshalBinary encodes k as struct policy_key.
func (k PolicyKey) MarshalBinary() ([]byte, error) {
	b := make([]byte, policyKeySize)
	binary.NativeEndian.PutUint32(b[0:], k.Ifindex)
	b[4] = byte(k.Dir)
	b[5] = k.Slot
	binary.NativeEndian.PutUint16(b[6:], k.Index)
	return b, nil
}

// UnmarshalBinary decodes struct policy_key.
func (k *PolicyKey) UnmarshalBinary(b []byte) error {
	if err := checkLen(b, policyKeySize, "policy key"); err != nil {
		return err
	}
	*k = PolicyKey{
		Ifindex: binary.NativeEndian.Uint32(b[0:]),
		Dir:     Direction(b[4]),
		Slot:    b[5],
		Index:   binary.NativeEndian.Uint16(b[6:]),
	}
	return nil
}

// String formats k as if<ifindex>/<dir>/<slot>/<index>.
func (k PolicyKey) String() string {
	return fmt.Sprintf("if%d/%s/%d/%d", k.Ifindex, k.Dir, k.Slot, k.Index)
}

// PolicyRule mirrors struct policy_rule. A peer (the source for ingress, the
// destination for egress) matches when it is in the IP set SetID (0: any
// peer), the packet's protocol is Proto (0: any) and its destination port is
// within PortMin..PortMax (both 0: any port).
type PolicyRule struct {
	SetID            uint32
	PortMin, PortMax uint16
	Proto            Proto
}

const policyRuleSize = 12

// MarshalBinary encodes r as struct policy_rule.
func (r PolicyRule) MarshalBinary() ([]byte, error) {
	if r.PortMin > r.PortMax {
		return nil, fmt.Errorf("policy rule: port range %d-%d is empty", r.PortMin, r.PortMax)
	}
	b := make([]byte, policyRuleSize)
	binary.NativeEndian.PutUint32(b[0:], r.SetID)
	binary.NativeEndian.PutUint16(b[4:], r.PortMin)
	binary.NativeEndian.PutUint16(b[6:], r.PortMax)
	b[8] = byte(r.Proto)
	return b, nil
}

// UnmarshalBinary decodes struct policy_rule.
func (r *PolicyRule) UnmarshalBinary(b []byte) error {
	if err := checkLen(b, policyRuleSize, "policy rule"); err != nil {
		return err
	}
	*r = PolicyRule{
		SetID:   binary.NativeEndian.Uint32(b[0:]),
		PortMin: binary.NativeEndian.Uint16(b[4:]),
		PortMax: binary.NativeEndian.Uint16(b[6:]),
		Proto:   Proto(b[8]),
	}
	return nil
}

// Config mirrors struct config_value, the single entry of dpc_config.
type Config struct {
	// HostIP is the node's IP on its host interface: the source of NodePort
	// SNAT. Until it is set, NodePort traffic to remote backends is not
	// SNATed.
	HostIP      netip.Addr
	HostIfindex uint32
}

const configValueSize = 16

// MarshalBinary encodes c as struct config_value.
func (c Config) MarshalBinary() ([]byte, error) {
	b := make([]byte, configValueSize)
	if err := putAddr(b[0:4], c.HostIP, "host IP"); err != nil {
		return nil, err
	}
	binary.NativeEndian.PutUint32(b[4:], c.HostIfindex)
	return b, nil
}

// UnmarshalBinary decodes struct config_value.
func (c *Config) UnmarshalBinary(b []byte) error {
	if err := checkLen(b, configValueSize, "config value"); err != nil {
		return err
	}
	*c = Config{HostIP: getAddr(b[0:4]), HostIfindex: binary.NativeEndian.Uint32(b[4:])}
	return nil
}

// VerdictRingSize is the size of the ring buffer of policy verdicts, in bytes
// (DPC_VERDICTS_SIZE): some 26000 verdicts that no one has read yet.
const VerdictRingSize = 1 << 20

// VerdictAction mirrors DPC_VERDICT_*: what policy did with a flow.
type VerdictAction uint8

// Verdict actions.
const (
	VerdictDeny  VerdictAction = 0
	VerdictAllow VerdictAction = 1
)

// String returns "deny" or "allow".
func (a VerdictAction) String() string {
	switch a {
	case VerdictDeny:
		return "deny"
	case VerdictAllow:
		return "allow"
	}
	return fmt.Sprintf("action(%d)", uint8(a))
}

// VerdictReason mirrors DPC_REASON_*: why policy decided as it did.
type VerdictReason uint8

// Verdict reasons.
const (
	// ReasonNoRules: the direction is isolated and has no rules (deny).
	ReasonNoRules VerdictReason = 0
	// ReasonNoMatch: none of the direction's rules matched (deny).
	ReasonNoMatch VerdictReason = 1
	// ReasonNotAdmitted: the endpoint replied on a flow that its ingress
	// policy did not admit (deny); the flow is the reply.
	ReasonNotAdmitted VerdictReason = 2
	// ReasonRuleMatched: a rule matched (allow).
	ReasonRuleMatched VerdictReason = 3
)

// String describes the reason in a few words.
func (r VerdictReason) String() string {
	switch r {
	case ReasonNoRules:
		return "isolated, no rules"
	case ReasonNoMatch:
		return "no rule matched"
	case ReasonNotAdmitted:
		return "reply on a flow not admitted"
	case ReasonRuleMatched:
		return "rule matched"
	}
	return fmt.Sprintf("reason(%d)", uint8(r))
}

// Verdict mirrors struct verdict_event: one policy verdict that the programs
// reported (see VerdictReader). They report every packet that policy drops,
// and one allow per new flow that an isolated direction of an endpoint
// admits; nothing on a direction that is not isolated.
type Verdict struct {
	// TimeNs is when the verdict was given, in CLOCK_MONOTONIC nanoseconds.
	TimeNs uint64
	// Flow is the flow as policy judged it: for egress, after service DNAT
	// (the backend as destination); for ReasonNotAdmitted, the reply.
	Flow    ConntrackKey
	Action  VerdictAction
	Dir     Direction
	Reason  VerdictReason
	Ifindex uint32 // the endpoint's host-side interface
}

const verdictSize = 32

// MarshalBinary encodes v as struct verdict_event.
func (v Verdict) MarshalBinary() ([]byte, error) {
	b := make([]byte, verdictSize)
	binary.NativeEndian.PutUint64(b[0:], v.TimeNs)
	if err := putAddr(b[8:12], v.Flow.Src, "verdict source"); err != nil {
		return nil, err
	}
	if err := putAddr(b[12:16], v.Flow.Dst, "verdict destination"); err != nil {
		return nil, err
	}
	binary.BigEndian.PutUint16(b[16:], v.Flow.SrcPort)
	binary.BigEndian.PutUint16(b[18:], v.Flow.DstPort)
	b[20] = byte(v.Flow.Proto)
	b[21] = byte(v.Action)
	b[22] = byte(v.Dir)
	b[23] = byte(v.Reason)
	binary.NativeEndian.PutUint32(b[24:], v.Ifindex)
	return b, nil
}

// UnmarshalBinary decodes struct verdict_event.
func (v *Verdict) UnmarshalBinary(b []byte) error {
	if err := checkLen(b, verdictSize, "verdict"); err != nil {
		return err
	}
	*v = Verdict{
		TimeNs: binary.NativeEndian.Uint64(b[0:]),
		Flow: ConntrackKey{
			Src:     getAddr(b[8:12]),
			Dst:     getAddr(b[12:16]),
			SrcPort: binary.BigEndian.Uint16(b[16:]),
			DstPort: binary.BigEndian.Uint16(b[18:]),
			Proto:   Proto(b[20]),
		},
		Action:  VerdictAction(b[21]),
		Dir:     Direction(b[22]),
		Reason:  VerdictReason(b[23]),
		Ifindex: binary.NativeEndian.Uint32(b[24:]),
	}
	return nil
}

// String formats v as "deny ingress src:port->dst:port/proto on if<n> (reason)".
func (v Verdict) String() string {
	return fmt.Sprintf("%s %s %s on if%d (%s)", v.Action, v.Dir, v.Flow, v.Ifindex, v.Reason)
}
