package bpf

import "testing"

// A client reuses a source port for a direct connection to a pod it earlier reached
// through a ClusterIP. The old NAT flow's reply entry has the new flow's reply tuple:
// while the old flow is live it wins, but once it is over (closed and quiet, or idle)
// the new flow takes the tuple over, or its replies would come back from the
// ClusterIP and the client would never complete the handshake. A flow that saw its
// FIN gives way at once, as Linux conntrack does for a SYN on a tuple in TIME_WAIT.
func TestPlainFlowTakesOverStaleNATReply(t *testing.T) {
	for _, tc := range []struct {
		name      string
		closing   bool // the old flow saw a FIN or RST
		idle      bool // and has been quiet since boot
		wantSrc   string
		wantFlags ConntrackFlags
	}{
		{"over", true, true, localPod, ConntrackReply},
		{"closing just now", true, false, localPod, ConntrackReply},
		{"idle", false, true, localPod, ConntrackReply},
		{"live", false, false, clusterIP, ConntrackDNAT | ConntrackReply},
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
			expect(t, "direct SYN", r, got, tcActOK, MarkSeen, clientPod, localPod)
			rev := ctEntry(t, d, localPod, clientPod, TCP)
			if rev.Flags&^ConntrackClosing != tc.wantFlags {
				t.Errorf("reply entry flags %v, want %v", rev.Flags, tc.wantFlags)
			}
			r, got = runPacket(t, d.objs.TcEpEgress, tcp(localPod, clientPod, tcpSYN|tcpACK))
			expect(t, "SYN-ACK to the client", r, got, tcActOK, MarkSeen, tc.wantSrc, clientPod)
		})
	}
}
