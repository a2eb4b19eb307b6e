package bpf

import (
	"bytes"
	"encoding/binary"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
)

func ctKey(src, dst string, proto Proto) ConntrackKey {
	s, d := ipp(src), ipp(dst)
	return ConntrackKey{Src: s.Addr(), Dst: d.Addr(), SrcPort: s.Port(), DstPort: d.Port(), Proto: proto}
}

func frontend(addr string, proto Proto) FrontendKey {
	a := ipp(addr)
	return FrontendKey{Addr: a.Addr(), Port: a.Port(), Proto: proto}
}

func backend(addr string) BackendValue {
	a := ipp(addr)
	return BackendValue{Addr: a.Addr(), Port: a.Port()}
}

// dnatEntries are the original and reply entries the programs write for a flow from
// client through fe to be (see track_nat).
func dnatEntries(client, fe, be string, proto Proto, extra ConntrackFlags) map[ConntrackKey]ConntrackValue {
	return map[ConntrackKey]ConntrackValue{
		ctKey(client, fe, proto): {Flags: ConntrackDNAT | extra, ServiceID: 7, NATAddr: ipp(be).Addr(), NATPort: ipp(be).Port()},
		ctKey(be, client, proto): {Flags: ConntrackDNAT | ConntrackReply | extra, ServiceID: 7, NATAddr: ipp(fe).Addr(), NATPort: ipp(fe).Port()},
	}
}

func TestDNATFlowEntries(t *testing.T) {
	const (
		otherPod  = "10.244.0.6:40001"
		lonePod   = "10.244.0.9:40009"
		client2   = "10.200.0.3:50000"
		nodePort2 = "10.200.0.1:30081"
		snatPort  = 61234
		snatPort2 = 61235
	)
	table := map[ConntrackKey]ConntrackValue{}
	add := func(m map[ConntrackKey]ConntrackValue) {
		for k, v := range m {
			table[k] = v
		}
	}
	add(dnatEntries(clientPod, clusterIP, remotePod, UDP, 0))                  // stale
	add(dnatEntries(otherPod, clusterIP, remotePod2, UDP, 0))                  // to a backend that stays
	add(dnatEntries(clientPod, clusterIP, remotePod, TCP, 0))                  // TCP: another frontend
	add(dnatEntries(client, nodePort, remotePod, UDP, ConntrackHostIngress))   // stale, SNATed
	add(dnatEntries(client2, nodePort2, remotePod, UDP, ConntrackHostIngress)) // another frontend, SNATed
	// The NodePort flows' reply entries carry their SNAT ports, and each has its SNAT
	// reply entry (backend -> host IP:port, naming its client).
	for _, f := range []struct {
		client string
		port   uint16
	}{{client, snatPort}, {client2, snatPort2}} {
		r := ctKey(remotePod, f.client, UDP)
		v := table[r]
		v.Flags |= ConntrackSNAT
		v.SNATPort = f.port
		table[r] = v
		table[snatKey(remotePod, f.port, UDP)] = ConntrackValue{Flags: ConntrackSNATReply, ServiceID: 7, NATAddr: ipp(f.client).Addr(), NATPort: ipp(f.client).Port()}
	}
	// A reply entry whose original the LRU evicted.
	table[ctKey(remotePod, lonePod, UDP)] = ConntrackValue{Flags: ConntrackDNAT | ConntrackReply, NATAddr: ipp(clusterIP).Addr(), NATPort: 80}
	// A direct flow to the backend, not NATed.
	table[ctKey(otherPod, remotePod, UDP)] = ConntrackValue{}
	table[ctKey(remotePod, otherPod, UDP)] = ConntrackValue{Flags: ConntrackReply}

	got := dnatFlowEntries(table, []DNATFlows{
		{Frontend: frontend(clusterIP, UDP), Backend: backend(remotePod)},
		{Frontend: frontend(nodePort, UDP), Backend: backend(remotePod)},
	})
	want := []ConntrackKey{
		ctKey(clientPod, clusterIP, UDP), ctKey(remotePod, clientPod, UDP),
		ctKey(client, nodePort, UDP), ctKey(remotePod, client, UDP), snatKey(remotePod, snatPort, UDP),
		ctKey(remotePod, lonePod, UDP),
	}
	byString := func(a, b ConntrackKey) int { return strings.Compare(a.String(), b.String()) }
	slices.SortFunc(got, byString)
	slices.SortFunc(want, byString)
	if !slices.Equal(got, want) {
		t.Errorf("entries of the stale flows:\n got %v\nwant %v", got, want)
	}
	if n := len(dnatFlowEntries(table, nil)); n != 0 {
		t.Errorf("no stale flow: %d entries", n)
	}
}

// The TCP flows an agent finds at its start are the DNATed ones still live, each
// frontend and backend once: not UDP, not a reply entry, not a flow that is over.
func TestTCPDNATFlows(t *testing.T) {
	const now = uint64(1000 * time.Second)
	table := map[ConntrackKey]ConntrackValue{}
	add := func(client, fe, be string, proto Proto, lastSeen uint64, extra ConntrackFlags) {
		for k, v := range dnatEntries(client, fe, be, proto, extra) {
			v.LastSeenNs = lastSeen
			table[k] = v
		}
	}
	add(clientPod, clusterIP, remotePod, TCP, now, 0)
	add("10.244.0.6:40001", clusterIP, remotePod, TCP, now, 0)                                       // the same frontend and backend
	add(client, nodePort, remotePod2, TCP, now-uint64(time.Second), ConntrackHostIngress)            // another frontend
	add("10.244.0.7:40002", clusterIP, remotePod2, UDP, now, 0)                                      // UDP
	add("10.244.0.8:40003", clusterIP, remotePod2, TCP, now-uint64(2*time.Second), ConntrackClosing) // closed and quiet
	add("10.244.0.9:40004", clusterIP, remotePod2, TCP, now-uint64(ConntrackTCPIdleTimeout)-1, 0)    // idle
	table[ctKey("10.244.0.6:40005", remotePod2, TCP)] = ConntrackValue{LastSeenNs: now}              // not NATed
	got := tcpDNATFlows(table, now)
	want := []DNATFlows{
		{Frontend: frontend(clusterIP, TCP), Backend: backend(remotePod)},
		{Frontend: frontend(nodePort, TCP), Backend: backend(remotePod2)},
	}
	byString := func(a, b DNATFlows) int { return strings.Compare(a.String(), b.String()) }
	slices.SortFunc(got, byString)
	slices.SortFunc(want, byString)
	if !slices.Equal(got, want) {
		t.Errorf("live TCP DNAT flows:\n got %v\nwant %v", got, want)
	}
}

// A UDP client keeps its 5-tuple while the Service's backend is replaced: the
// programs keep sending it to the backend in its conntrack entry, the removed one,
// until that entry is deleted; then its next datagram picks the new backend. A TCP
// flow to the backend is not touched.
func TestUDPFlowMovesOnceItsEntriesAreDeleted(t *testing.T) {
	d := setup(t, Options{})
	fe := service(t, d, clusterIP, UDP, 7, remotePod)
	service(t, d, clusterIP, TCP, 8, remotePod)
	r, got := runPacket(t, d.objs.TcEpIngress, udp(clientPod, clusterIP))
	expect(t, "first datagram", r, got, tcActOK, MarkSeen, clientPod, remotePod)
	r, got = runPacket(t, d.objs.TcEpIngress, tcp(clientPod, clusterIP, tcpSYN))
	expect(t, "TCP SYN", r, got, tcActOK, MarkSeen, clientPod, remotePod)

	// The backend is replaced: a new service ID with the new backend, the frontend
	// switched to it.
	service(t, d, clusterIP, UDP, 9, remotePod2)
	r, got = runPacket(t, d.objs.TcEpIngress, udp(clientPod, clusterIP))
	expect(t, "a datagram on the flow's conntrack entry", r, got, tcActOK, MarkSeen, clientPod, remotePod)

	n, err := d.DeleteDNATFlows([]DNATFlows{{Frontend: fe, Backend: backend(remotePod)}})
	must(t, err)
	if n != 2 {
		t.Errorf("deleted %d entries, want the flow's 2", n)
	}
	for _, k := range []ConntrackKey{ctKey(clientPod, clusterIP, UDP), ctKey(remotePod, clientPod, UDP)} {
		if _, err := d.Conntrack().Lookup(k); !errors.Is(err, ebpf.ErrKeyNotExist) {
			t.Errorf("entry %s still there: %v", k, err)
		}
	}
	r, got = runPacket(t, d.objs.TcEpIngress, udp(clientPod, clusterIP))
	expect(t, "the next datagram", r, got, tcActOK, MarkSeen, clientPod, remotePod2)
	r, got = runPacket(t, d.objs.TcEpEgress, udp(remotePod2, clientPod))
	expect(t, "the new backend's answer at the client", r, got, tcActOK, MarkSeen, clusterIP, clientPod)

	if v := ctEntry(t, d, clientPod, clusterIP, TCP); v.NATAddr != ipp(remotePod).Addr() {
		t.Errorf("the TCP flow's entry changed: %+v", v)
	}
	ctEntry(t, d, remotePod, clientPod, TCP)
}

// A NodePort UDP flow to a remote backend has a third entry, its SNAT reply entry,
// which goes with it.
func TestNodePortUDPFlowEntriesDeleted(t *testing.T) {
	d := setup(t, Options{})
	fe := service(t, d, nodePort, UDP, 7, remotePod)
	r, got := newFlow(t, d, client, UDP)
	if r.Ret != tcActOK || got.Src.Addr() != ip(hostIP) {
		t.Fatalf("first datagram leaves %+v as %s", r, got)
	}
	sk := snatKey(remotePod, got.Src.Port(), UDP)
	if _, err := d.Conntrack().Lookup(sk); err != nil {
		t.Fatalf("the flow's SNAT reply entry: %v", err)
	}

	service(t, d, nodePort, UDP, 9, remotePod2)
	n, err := d.DeleteDNATFlows([]DNATFlows{{Frontend: fe, Backend: backend(remotePod)}})
	must(t, err)
	if n != 3 {
		t.Errorf("deleted %d entries, want the flow's 3", n)
	}
	for _, k := range []ConntrackKey{ctKey(client, nodePort, UDP), ctKey(remotePod, client, UDP), sk} {
		if _, err := d.Conntrack().Lookup(k); !errors.Is(err, ebpf.ErrKeyNotExist) {
			t.Errorf("entry %s still there: %v", k, err)
		}
	}
	r, got = runPacket(t, d.objs.TcHostIngress, udp(client, nodePort))
	expect(t, "the next datagram at host ingress", r, got, tcActOK, MarkSeen, client, remotePod2)
}

// A TCP flow whose backend has gone is flagged; the client pod's next packet on it
// is answered with a RST from the ClusterIP, in window for the client (the
// sequence number it acknowledged, an ACK of what it sent), back out of the
// interface it came in on, and the flow is forgotten: the next SYN on the tuple
// picks a backend the service has now.
func TestGoneBackendFlowIsReset(t *testing.T) {
	d := setup(t, Options{})
	fe := service(t, d, clusterIP, TCP, 7, remotePod)
	udpFE := service(t, d, clusterIP, UDP, 8, remotePod)
	r, got := runPacket(t, d.objs.TcEpIngress, tcp(clientPod, clusterIP, tcpSYN))
	expect(t, "SYN", r, got, tcActOK, MarkSeen, clientPod, remotePod)
	r, got = runPacket(t, d.objs.TcEpIngress, udp(clientPod, clusterIP))
	expect(t, "datagram", r, got, tcActOK, MarkSeen, clientPod, remotePod)

	service(t, d, clusterIP, TCP, 9, remotePod2)
	n, err := d.MarkDNATFlowsGone([]DNATFlows{{Frontend: fe, Backend: backend(remotePod)}, {Frontend: udpFE, Backend: backend(remotePod)}})
	must(t, err)
	if n != 1 {
		t.Errorf("flagged %d entries, want the TCP flow's original entry", n)
	}
	if v := ctEntry(t, d, clientPod, clusterIP, TCP); v.Flags != ConntrackDNAT|ConntrackBackendGone {
		t.Errorf("original entry flags %v, want DNAT|backend-gone", v.Flags)
	}
	if v := ctEntry(t, d, clientPod, clusterIP, UDP); v.Flags&ConntrackBackendGone != 0 {
		t.Errorf("the UDP flow was flagged: %+v", v)
	}

	in := tcp(clientPod, clusterIP, tcpACK|tcpPSH) // seq 1000, ack 2000, 5 bytes
	r = run(t, d.objs.TcEpIngress, in.Bytes(), 0)
	if r.Ret != tcActRedirect {
		t.Fatalf("returned %d, want TC_ACT_REDIRECT (%d)", r.Ret, tcActRedirect)
	}
	if len(r.Out) != 14+20+20 {
		t.Errorf("RST is %d bytes, want 54 (no payload, no options)", len(r.Out))
	}
	rst, err := parsePacket(r.Out)
	must(t, err)
	if rst.Src != ipp(clusterIP) || rst.Dst != ipp(clientPod) || rst.Proto != TCP {
		t.Errorf("RST %s, want %s->%s TCP", rst, clusterIP, clientPod)
	}
	if rst.TCPFlags != tcpRST|tcpACK || len(rst.Payload) != 0 {
		t.Errorf("flags %#x and %d bytes of payload, want RST|ACK and none", rst.TCPFlags, len(rst.Payload))
	}
	if !bytes.Equal(r.Out[0:6], macB) || !bytes.Equal(r.Out[6:12], macA) {
		t.Errorf("MACs % x -> % x, want the packet's swapped: % x -> % x", r.Out[6:12], r.Out[0:6], macA, macB)
	}
	l4 := r.Out[34:]
	if seq, ack := binary.BigEndian.Uint32(l4[4:]), binary.BigEndian.Uint32(l4[8:]); seq != 2000 || ack != 1005 {
		t.Errorf("seq %d ack %d, want 2000 (what the client acknowledged) and 1005 (its data acknowledged)", seq, ack)
	}
	if r.Mark&MarkMask != 0 {
		t.Errorf("mark %#x keeps the datapath's bits", r.Mark)
	}
	for _, k := range []ConntrackKey{ctKey(clientPod, clusterIP, TCP), ctKey(remotePod, clientPod, TCP)} {
		if _, err := d.Conntrack().Lookup(k); !errors.Is(err, ebpf.ErrKeyNotExist) {
			t.Errorf("entry %s still there: %v", k, err)
		}
	}

	// The RST leaves towards the client untouched: no entry knows it now.
	r, got = runPacket(t, d.objs.TcEpEgress, tcp(clusterIP, clientPod, tcpRST|tcpACK))
	expect(t, "RST towards the client", r, got, tcActOK, 0, clusterIP, clientPod)

	// A SYN on the tuple is a new flow, to the service's backend now.
	r, got = runPacket(t, d.objs.TcEpIngress, tcp(clientPod, clusterIP, tcpSYN))
	expect(t, "SYN after the reset", r, got, tcActOK, MarkSeen, clientPod, remotePod2)
}

// A flagged flow whose client sends a RST itself, or a SYN, gets no RST back.
func TestGoneBackendFlowClientRSTOrSYN(t *testing.T) {
	d := setup(t, Options{})
	fe := service(t, d, clusterIP, TCP, 7, remotePod)
	for _, tc := range []struct {
		flags uint8
		ret   uint32
	}{{tcpRST | tcpACK, tcActShot}, {tcpSYN, tcActOK}} {
		r, _ := runPacket(t, d.objs.TcEpIngress, tcp(clientPod, clusterIP, tcpSYN))
		if r.Ret != tcActOK {
			t.Fatalf("SYN returned %d", r.Ret)
		}
		_, err := d.MarkDNATFlowsGone([]DNATFlows{{Frontend: fe, Backend: backend(remotePod)}})
		must(t, err)
		if r = run(t, d.objs.TcEpIngress, tcp(clientPod, clusterIP, tc.flags).Bytes(), 0); r.Ret != tc.ret {
			t.Errorf("flags %#x: returned %d, want %d", tc.flags, r.Ret, tc.ret)
		}
	}
}

// A SYN that restarts a flagged tuple and picks the same backend (back in its
// service: a pod relabeled back, or a pod IP given again) starts a new flow: its
// handshake is DNATed, not reset.
func TestGoneBackendFlagEndsWithASYN(t *testing.T) {
	d := setup(t, Options{})
	fe := service(t, d, clusterIP, TCP, 7, remotePod)
	r, got := runPacket(t, d.objs.TcEpIngress, tcp(clientPod, clusterIP, tcpSYN))
	expect(t, "SYN", r, got, tcActOK, MarkSeen, clientPod, remotePod)
	n, err := d.MarkDNATFlowsGone([]DNATFlows{{Frontend: fe, Backend: backend(remotePod)}})
	must(t, err)
	if n != 1 {
		t.Fatalf("flagged %d entries, want 1", n)
	}

	r, got = runPacket(t, d.objs.TcEpIngress, tcp(clientPod, clusterIP, tcpSYN))
	expect(t, "SYN of a new flow on the tuple", r, got, tcActOK, MarkSeen, clientPod, remotePod)
	if v := ctEntry(t, d, clientPod, clusterIP, TCP); v.Flags&ConntrackBackendGone != 0 {
		t.Errorf("original entry flags %v after the SYN, want backend-gone cleared", v.Flags)
	}
	r, got = runPacket(t, d.objs.TcEpIngress, tcp(clientPod, clusterIP, tcpACK))
	expect(t, "the handshake's ACK", r, got, tcActOK, MarkSeen, clientPod, remotePod)
}

// Flagging re-reads each entry, and leaves one that a SYN gave another backend
// after the table was read: the client reused the tuple for a new flow, which is
// not reset. (refdp flagged such flows while a restarted agent walked its table,
// and new connections got a RST.)
func TestGoneBackendFlagSkipsARestartedTuple(t *testing.T) {
	d := setup(t, Options{})
	fe := service(t, d, clusterIP, TCP, 7, remotePod)
	r, got := runPacket(t, d.objs.TcEpIngress, tcp(clientPod, clusterIP, tcpSYN))
	expect(t, "SYN", r, got, tcActOK, MarkSeen, clientPod, remotePod)
	all, err := d.conntrack.All()
	must(t, err)

	service(t, d, clusterIP, TCP, 9, remotePod2)
	r, got = runPacket(t, d.objs.TcEpIngress, tcp(clientPod, clusterIP, tcpSYN))
	expect(t, "SYN of a new flow on the tuple", r, got, tcActOK, MarkSeen, clientPod, remotePod2)

	n, err := d.markDNATFlowsGone(all, []DNATFlows{{Frontend: fe, Backend: backend(remotePod)}}, monotonicNow(t))
	must(t, err)
	if n != 0 {
		t.Errorf("flagged %d entries, want none: the tuple's flow is a new one, to %s", n, remotePod2)
	}
	if v := ctEntry(t, d, clientPod, clusterIP, TCP); v.Flags&ConntrackBackendGone != 0 || v.NATAddr != ipp(remotePod2).Addr() {
		t.Errorf("original entry %+v, want the new flow's, to %s, unflagged", v, remotePod2)
	}
	r, got = runPacket(t, d.objs.TcEpIngress, tcp(clientPod, clusterIP, tcpACK))
	expect(t, "the new flow's ACK", r, got, tcActOK, MarkSeen, clientPod, remotePod2)
}

// A flow that is over (closed and quiet, or idle) is not flagged: its client has
// nothing left to send, and a SYN on its tuple is a new flow.
func TestGoneBackendFlagSkipsFlowsThatAreOver(t *testing.T) {
	d := setup(t, Options{})
	fe := service(t, d, clusterIP, TCP, 7, remotePod)
	flows := []DNATFlows{{Frontend: fe, Backend: backend(remotePod)}}
	for _, flags := range []uint8{tcpSYN, tcpFIN | tcpACK} {
		r, _ := runPacket(t, d.objs.TcEpIngress, tcp(clientPod, clusterIP, flags))
		if r.Ret != tcActOK {
			t.Fatalf("flags %#x: returned %d", flags, r.Ret)
		}
	}
	all, err := d.conntrack.All()
	must(t, err)
	seen := ctEntry(t, d, clientPod, clusterIP, TCP).LastSeenNs

	for _, tc := range []struct {
		after time.Duration
		want  int
	}{
		{ConntrackCloseQuiet + time.Millisecond, 0},
		{ConntrackCloseQuiet / 2, 1},
	} {
		n, err := d.markDNATFlowsGone(all, flows, seen+uint64(tc.after))
		must(t, err)
		if n != tc.want {
			t.Errorf("closing flow, %v after its FIN: flagged %d entries, want %d", tc.after, n, tc.want)
		}
	}
}
