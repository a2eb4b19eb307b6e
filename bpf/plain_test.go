package bpf

import "testing"

// A client reuses a source port for a direct connection to a pod it earlier reached
// through a ClusterIP. The old NAT flow's reply entry has the new flow's reply tuple:
// once the old flow is over (closed and quiet, or idle) the new flow takes the tuple
// over, or its replies would come back from the ClusterIP and the client would never
// complete the handshake. A flow that saw its FIN gives way at once, as Linux
// conntrack does for a SYN on a tuple in TIME_WAIT. While the old flow is live it
// keeps the tuple, and the new flow moves to another source port
// (TestPortMovedOnClash).
func TestPlainFlowTakesOverStaleNATReply(t *testing.T) {
	for _, tc := range []struct {
		name      string
		closing   bool // the old flow saw a FIN or RST
		idle      bool // and has been quiet since boot
		wantMoved bool // the direct flow moves to another source port
		wantFlags ConntrackFlags
	}{
		{"over", true, true, false, ConntrackReply},
		{"closing just now", true, false, false, ConntrackReply},
		{"idle", false, true, false, ConntrackReply},
		{"live", false, false, true, ConntrackDNAT | ConntrackReply},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := setup(t, Options{})
			service(t, d, clusterIP, TCP, 7, localPod)
			r, got := runPacket(t, d.objs.TcEpIngress, tcp(clientPod, clusterIP, tcpSYN))
			expect(t, "SYN to the ClusterIP", r, got, tcActOK, MarkSeen, clientPod, localPod)
			k := ConntrackKey{Src: ipp(localPod).Addr(), Dst: ipp(clientPod).Addr(), SrcPort: ipp(localPod).Port(), DstPort: ipp(clientPod).Port(), Proto: TCP}
			v := ctEntry(t, d, localPod, clientPod, TCP)
			if tc.closing {
				v.Flags |= ConntrackClosing
			}
			if tc.idle {
				v.LastSeenNs = 0
			}
			must(t, d.Conntrack().Put(k, v))
			// The direct connection, same client port.
			r, got = runPacket(t, d.objs.TcEpIngress, tcp(clientPod, localPod, tcpSYN))
			wire := clientPod
			if moved := got.Src.Port() != ipp(clientPod).Port(); moved != tc.wantMoved {
				t.Errorf("direct SYN left from %s: moved %v, want %v", got.Src, moved, tc.wantMoved)
			} else if moved {
				wire = got.Src.String()
			}
			expect(t, "direct SYN", r, got, tcActOK, MarkSeen, wire, localPod)
			rev := ctEntry(t, d, localPod, clientPod, TCP)
			if rev.Flags&^ConntrackClosing != tc.wantFlags {
				t.Errorf("reply entry flags %v, want %v", rev.Flags, tc.wantFlags)
			}
			r, got = runPacket(t, d.objs.TcEpEgress, tcp(localPod, wire, tcpSYN|tcpACK))
			expect(t, "SYN-ACK to the client", r, got, tcActOK, MarkSeen, localPod, clientPod)
		})
	}
}
