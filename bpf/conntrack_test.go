package bpf

import (
	"errors"
	"slices"
	"strings"
	"testing"

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
