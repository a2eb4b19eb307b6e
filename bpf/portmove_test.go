package bpf

import (
	"net/netip"
	"testing"
	"time"
)

// A client pod may use one source port towards a Service's frontend and
// towards one of its backends (Linux picks a connection's source port per
// destination). DNAT makes the two flows one tuple; the flow that comes second
// moves to another source port where it leaves the pod, both ways, and
// neither flow's replies go to the other.
func TestPortMovedOnClash(t *testing.T) {
	for _, tc := range []struct {
		name    string
		proto   Proto
		backend string
		// serviceFirst: the flow to the frontend starts first, and the
		// direct one moves; else the direct one starts first.
		serviceFirst bool
	}{
		{"TCP, remote backend, direct flow first", TCP, remotePod, false},
		{"UDP, local backend, direct flow first", UDP, localPod, false},
		{"TCP, remote backend, flow to the frontend first", TCP, remotePod, true},
		{"UDP, remote backend, flow to the frontend first", UDP, remotePod, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := setup(t, Options{})
			fe := clusterIP
			if tc.proto == UDP {
				fe = "10.96.0.10:53"
			}
			service(t, d, fe, tc.proto, 7, tc.backend)
			pkt := func(src, dst string, flags uint8) packet {
				if tc.proto == UDP {
					return udp(src, dst)
				}
				return tcp(src, dst, flags)
			}
			toBackend := d.objs.TcHostEgress
			fromBackend := d.objs.TcHostIngress
			if tc.backend == localPod {
				toBackend, fromBackend = d.objs.TcEpEgress, d.objs.TcEpIngress
			}

			// first and second are the flows' destinations as the client sees
			// them; the second flow's source port moves.
			first, second := tc.backend, fe
			if tc.serviceFirst {
				first, second = fe, tc.backend
			}
			r, got := runPacket(t, d.objs.TcEpIngress, pkt(clientPod, first, tcpSYN))
			expect(t, "first flow's SYN", r, got, tcActOK, MarkSeen, clientPod, tc.backend)
			r, got = runPacket(t, d.objs.TcEpIngress, pkt(clientPod, second, tcpSYN))
			moved := got.Src
			if p := moved.Port(); moved.Addr() != ipp(clientPod).Addr() || p < SNATPortMin || p > SNATPortMax {
				t.Fatalf("second flow's SYN left the pod from %s, want the pod's address and a port of %d-%d", moved, SNATPortMin, SNATPortMax)
			}
			expect(t, "second flow's SYN", r, got, tcActOK, MarkSeen, moved.String(), tc.backend)

			// The second flow's entries name the moved port; the first's
			// reply entry is still its own.
			wantFlags := func(base ConntrackFlags) ConntrackFlags {
				if tc.serviceFirst {
					return base
				}
				return base | ConntrackDNAT
			}
			orig := ctEntry(t, d, clientPod, second, tc.proto)
			if orig.Flags != wantFlags(ConntrackPortMoved) || orig.SNATPort != moved.Port() {
				t.Errorf("second flow's original entry %+v, want flags %#x and port %d", orig, wantFlags(ConntrackPortMoved), moved.Port())
			}
			rev := ctEntry(t, d, tc.backend, moved.String(), tc.proto)
			if rev.Flags != wantFlags(ConntrackPortMoved|ConntrackReply) || rev.SNATPort != ipp(clientPod).Port() {
				t.Errorf("second flow's reply entry %+v, want flags %#x and port %d", rev, wantFlags(ConntrackPortMoved|ConntrackReply), ipp(clientPod).Port())
			}
			firstReply := ctEntry(t, d, tc.backend, clientPod, tc.proto)
			want := ConntrackReply
			if tc.serviceFirst {
				want |= ConntrackDNAT
			}
			if firstReply.Flags != want {
				t.Errorf("first flow's reply entry %+v, want flags %#x", firstReply, want)
			}

			// Each flow's packets, both ways, on every hook they pass.
			for _, f := range []struct {
				what        string
				dst, wire   string // the client's destination; its source on the wire
				replyFrom   string // the reply's source at the client
				replyToWire string // the reply's destination on the wire
			}{
				{"first flow", first, clientPod, first, clientPod},
				{"second flow", second, moved.String(), second, moved.String()},
			} {
				r, got := runPacket(t, d.objs.TcEpIngress, pkt(clientPod, f.dst, tcpACK))
				expect(t, f.what+" from the client", r, got, tcActOK, MarkSeen, f.wire, tc.backend)
				r, got = runPacket(t, toBackend, pkt(f.wire, tc.backend, tcpACK))
				expect(t, f.what+" to the backend", r, got, tcActOK, MarkSeen, f.wire, tc.backend)
				r, got = runPacket(t, fromBackend, pkt(tc.backend, f.replyToWire, tcpACK))
				expect(t, f.what+"'s reply from the backend", r, got, tcActOK, MarkSeen, tc.backend, f.replyToWire)
				r, got = runPacket(t, d.objs.TcEpEgress, pkt(tc.backend, f.replyToWire, tcpACK))
				expect(t, f.what+"'s reply to the client", r, got, tcActOK, MarkSeen, f.replyFrom, clientPod)
			}
		})
	}
}

// A flow that holds the tuple only while it lives: once over, a new flow
// takes the tuple, as before, and keeps its port.
func TestPortKeptWhenHolderIsOver(t *testing.T) {
	d := setup(t, Options{})
	service(t, d, clusterIP, TCP, 7, remotePod)
	runPacket(t, d.objs.TcEpIngress, tcp(clientPod, remotePod, tcpSYN))
	// The direct flow's reply entry, idle past the TCP timeout.
	k := ConntrackKey{Src: ipp(remotePod).Addr(), Dst: ipp(clientPod).Addr(), SrcPort: ipp(remotePod).Port(), DstPort: ipp(clientPod).Port(), Proto: TCP}
	v := ctEntry(t, d, remotePod, clientPod, TCP)
	v.LastSeenNs -= uint64(ConntrackTCPIdleTimeout + time.Second)
	must(t, d.Conntrack().Put(k, v))

	r, got := runPacket(t, d.objs.TcEpIngress, tcp(clientPod, clusterIP, tcpSYN))
	expect(t, "SYN to the frontend", r, got, tcActOK, MarkSeen, clientPod, remotePod)
	if rev := ctEntry(t, d, remotePod, clientPod, TCP); rev.Flags != ConntrackDNAT|ConntrackReply || rev.NATAddr != netip.MustParseAddrPort(clusterIP).Addr() {
		t.Errorf("reply entry %+v, want the new flow's", rev)
	}
}
