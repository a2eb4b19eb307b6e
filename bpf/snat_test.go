package bpf

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net/netip"
	"slices"
	"testing"
	"time"
)

// mix32 and flowHash mirror the C functions, on the tuple as a
// little-endian target loads it from the packet.
func mix32(h uint32) uint32 {
	h ^= h >> 16
	h *= 0x85ebca6b
	h ^= h >> 13
	h *= 0xc2b2ae35
	h ^= h >> 16
	return h
}

func flowHash(k ConntrackKey) uint32 {
	le32 := func(a netip.Addr) uint32 { b := a.As4(); return binary.LittleEndian.Uint32(b[:]) }
	be16 := func(p uint16) uint32 { return uint32(p>>8 | p<<8) } // a __be16 read as a number
	h := mix32(le32(k.Src) ^ 0x9e3779b9)
	h = mix32(h ^ le32(k.Dst))
	h = mix32(h ^ (be16(k.SrcPort)<<16 | be16(k.DstPort)))
	return mix32(h ^ uint32(k.Proto))
}

// snatCandidates lists the SNAT ports that a flow from client to backend
// (the tuple leaving the host, after DNAT) tries, in order.
func snatCandidates(client, backend string, proto Proto) []uint16 {
	c, b := ipp(client), ipp(backend)
	h := flowHash(ConntrackKey{Src: c.Addr(), Dst: b.Addr(), SrcPort: c.Port(), DstPort: b.Port(), Proto: proto})
	ports := make([]uint16, SNATPortTries)
	for i := range ports {
		ports[i] = uint16(SNATPortMin + (h+uint32(i))%(SNATPortMax-SNATPortMin+1))
	}
	return ports
}

// snatKey is the key of the SNAT reply entry for port: backend -> host IP.
func snatKey(backend string, port uint16, proto Proto) ConntrackKey {
	b := ipp(backend)
	return ConntrackKey{Src: b.Addr(), Dst: ip(hostIP), SrcPort: b.Port(), DstPort: port, Proto: proto}
}

// otherFlow is the SNAT reply entry of some other client's flow.
func otherFlow(i int, flags ConntrackFlags, lastSeen uint64) ConntrackValue {
	return ConntrackValue{
		CreatedNs: lastSeen, LastSeenNs: lastSeen, Flags: ConntrackSNATReply | flags, ServiceID: 4,
		NATAddr: ip(fmt.Sprintf("10.200.9.%d", i+1)), NATPort: 40000,
	}
}

func mkPacket(proto Proto, src, dst string, flags uint8) packet {
	if proto == UDP {
		return udp(src, dst)
	}
	return tcp(src, dst, flags)
}

// newFlow sends a new flow's first packet from client to the NodePort
// through host ingress and host egress, and returns the egress result.
func newFlow(t *testing.T, d *Datapath, client string, proto Proto) (result, packet) {
	t.Helper()
	r, got := runPacket(t, d.objs.TcHostIngress, mkPacket(proto, client, nodePort, tcpSYN))
	expect(t, "new flow at host ingress", r, got, tcActOK, MarkSeen, client, remotePod)
	return run2(t, d, got)
}

// run2 runs p through host egress; the packet is decoded only if it passes.
func run2(t *testing.T, d *Datapath, p packet) (result, packet) {
	t.Helper()
	r := run(t, d.objs.TcHostEgress, p.Bytes(), 0)
	if r.Ret != tcActOK {
		return r, packet{}
	}
	got, err := parsePacket(r.Out)
	if err != nil {
		t.Fatalf("%s: packet out of host egress: %v", p, err)
	}
	return r, got
}

// expectSNAT checks that a flow from client left with source hostIP:port and
// that its entries record the port.
func expectSNAT(t *testing.T, d *Datapath, client string, proto Proto, r result, got packet, port uint16) {
	t.Helper()
	want := netip.AddrPortFrom(ip(hostIP), port)
	if r.Ret != tcActOK || got.Src != want || got.Dst.String() != remotePod {
		t.Fatalf("flow from %s left as %s->%s (returned %d), want %s->%s", client, got.Src, got.Dst, r.Ret, want, remotePod)
	}
	if v := ctEntry(t, d, remotePod, client, proto); v.Flags&ConntrackSNAT == 0 || v.SNATPort != port {
		t.Errorf("reply entry %+v does not record SNAT port %d", v, port)
	}
	v, err := d.Conntrack().Lookup(snatKey(remotePod, port, proto))
	must(t, err)
	if v.Flags != ConntrackSNATReply || v.NATAddr != ipp(client).Addr() || v.NATPort != ipp(client).Port() {
		t.Errorf("SNAT reply entry for port %d: %+v, want the flow from %s, not closing", port, v, client)
	}
}

func TestSNATCandidatesMatchDatapath(t *testing.T) {
	for _, proto := range []Proto{TCP, UDP} {
		d := setup(t, Options{})
		service(t, d, nodePort, proto, 4, remotePod)
		for _, c := range []string{client, "10.200.0.3:1", "10.200.7.7:65535"} {
			r, got := newFlow(t, d, c, proto)
			expectSNAT(t, d, c, proto, r, got, snatCandidates(c, remotePod, proto)[0])
		}
	}
}

func TestSNATPortReuse(t *testing.T) {
	const second = uint64(time.Second)
	up := monotonicNow(t)
	for _, tc := range []struct {
		name     string
		proto    Proto
		flags    ConntrackFlags
		age      uint64 // how long ago the entries were last seen
		reusable bool
		needUp   time.Duration // uptime the case needs
	}{
		{"TCP open, recent", TCP, 0, 0, false, 0},
		{"TCP closing, recent", TCP, ConntrackClosing, 0, false, 0},
		{"TCP closing, quiet", TCP, ConntrackClosing, 2 * second, true, 2 * time.Second},
		{"TCP closing, long ago", TCP, ConntrackClosing, up, true, 0},
		{"TCP open, idle under the TCP timeout", TCP, 0, 60 * second, false, time.Minute},
		{"TCP open, idle long ago", TCP, 0, up, true, ConntrackTCPIdleTimeout},
		{"UDP recent", UDP, 0, 0, false, 0},
		{"UDP idle over the UDP timeout", UDP, 0, 60 * second, true, time.Minute},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if time.Duration(up) <= tc.needUp+time.Second {
				t.Skipf("SKIPPED: the case needs entries %s old; CLOCK_MONOTONIC is at %s", tc.needUp, time.Duration(up))
			}
			d := setup(t, Options{})
			service(t, d, nodePort, tc.proto, 4, remotePod)
			cands := snatCandidates(client, remotePod, tc.proto)
			now := monotonicNow(t)
			// All candidates taken, by entries seen tc.age ago, except
			// that the one at index 17 is the least recently seen.
			const lru = 17
			for i, port := range cands {
				seen := now - tc.age + uint64(i+1)
				if i == lru {
					seen = now - tc.age
				}
				must(t, d.Conntrack().Put(snatKey(remotePod, port, tc.proto), otherFlow(i, tc.flags, seen)))
			}
			before, err := d.Conntrack().All()
			must(t, err)

			r, got := newFlow(t, d, client, tc.proto)
			if !tc.reusable {
				if r.Ret != tcActShot {
					t.Fatalf("all %d SNAT ports taken by live flows: returned %d (source %s), want a drop", len(cands), r.Ret, got.Src)
				}
				for i, port := range cands {
					k := snatKey(remotePod, port, tc.proto)
					if v, err := d.Conntrack().Lookup(k); err != nil || v != before[k] {
						t.Errorf("candidate %d (port %d) changed: %+v, %v", i, port, v, err)
					}
				}
				return
			}
			expectSNAT(t, d, client, tc.proto, r, got, cands[lru])
			v := ctEntry(t, d, remotePod, netip.AddrPortFrom(ip(hostIP), cands[lru]).String(), tc.proto)
			if v.CreatedNs < now || v.LastSeenNs < now || v.ServiceID != 4 {
				t.Errorf("reused entry not renewed: %+v (now %d)", v, now)
			}
			for i, port := range cands {
				k := snatKey(remotePod, port, tc.proto)
				if v, err := d.Conntrack().Lookup(k); i != lru && (err != nil || v != before[k]) {
					t.Errorf("candidate %d (port %d) changed: %+v, %v", i, port, v, err)
				}
			}
			// The backend's reply goes to the new flow's client.
			snat := netip.AddrPortFrom(ip(hostIP), cands[lru]).String()
			r, got = runPacket(t, d.objs.TcHostIngress, mkPacket(tc.proto, remotePod, snat, tcpSYN|tcpACK))
			expect(t, "reply on the reused port", r, got, tcActOK, MarkSeen, remotePod, client)
		})
	}
}

func TestSNATPrefersFreePorts(t *testing.T) {
	d := setup(t, Options{})
	service(t, d, nodePort, TCP, 4, remotePod)
	cands := snatCandidates(client, remotePod, TCP)
	const free = 20
	for i, port := range cands {
		if i != free {
			must(t, d.Conntrack().Put(snatKey(remotePod, port, TCP), otherFlow(i, ConntrackClosing, 0)))
		}
	}
	before, err := d.Conntrack().All()
	must(t, err)
	r, got := newFlow(t, d, client, TCP)
	expectSNAT(t, d, client, TCP, r, got, cands[free])
	for i, port := range cands {
		k := snatKey(remotePod, port, TCP)
		if v, err := d.Conntrack().Lookup(k); i != free && (err != nil || v != before[k]) {
			t.Errorf("reusable candidate %d (port %d) taken over although port %d was free: %+v, %v", i, port, cands[free], v, err)
		}
	}
}

func TestConntrackClosing(t *testing.T) {
	for _, tc := range []struct {
		name        string
		fromBackend bool
		flags       uint8
	}{
		{"backend FIN", true, tcpFIN | tcpACK},
		{"backend RST", true, tcpRST},
		{"client FIN", false, tcpFIN | tcpACK},
		{"client RST", false, tcpRST | tcpACK},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := setup(t, Options{})
			service(t, d, nodePort, TCP, 4, remotePod)
			_, out := newFlow(t, d, client, TCP)
			snat := out.Src.String()
			// The handshake and some data: nothing is closing.
			runPacket(t, d.objs.TcHostIngress, tcp(remotePod, snat, tcpSYN|tcpACK))
			runPacket(t, d.objs.TcHostEgress, tcp(remotePod, client, tcpSYN|tcpACK))
			runPacket(t, d.objs.TcHostIngress, tcp(client, nodePort, tcpACK))
			runPacket(t, d.objs.TcHostEgress, tcp(client, remotePod, tcpACK))
			entries := func() (fwd, rev, sn ConntrackValue) {
				return ctEntry(t, d, client, nodePort, TCP), ctEntry(t, d, remotePod, client, TCP), ctEntry(t, d, remotePod, snat, TCP)
			}
			fwd, rev, sn := entries()
			if (fwd.Flags|rev.Flags|sn.Flags)&ConntrackClosing != 0 {
				t.Fatalf("closing before any FIN or RST: %+v %+v %+v", fwd, rev, sn)
			}

			now := monotonicNow(t)
			var r result
			var got packet
			if tc.fromBackend {
				// Host ingress matches the SNAT reply entry, host
				// egress the flow's reply entry.
				r, got = runPacket(t, d.objs.TcHostIngress, tcp(remotePod, snat, tc.flags))
				expect(t, "backend's packet at host ingress", r, got, tcActOK, MarkSeen, remotePod, client)
				r, got = runPacket(t, d.objs.TcHostEgress, got)
				expect(t, "backend's packet at host egress", r, got, tcActOK, MarkSeen, nodePort, client)
			} else {
				// Host ingress matches the original entry, host egress
				// the reply entry, which leads to the SNAT reply entry.
				r, got = runPacket(t, d.objs.TcHostIngress, tcp(client, nodePort, tc.flags))
				expect(t, "client's packet at host ingress", r, got, tcActOK, MarkSeen, client, remotePod)
				r, got = runPacket(t, d.objs.TcHostEgress, got)
				expect(t, "client's packet at host egress", r, got, tcActOK, MarkSeen, snat, remotePod)
			}
			fwd, rev, sn = entries()
			if sn.Flags != ConntrackSNATReply|ConntrackClosing || sn.LastSeenNs < now {
				t.Errorf("SNAT reply entry after %s: %+v, want closing and seen", tc.name, sn)
			}
			if rev.Flags&ConntrackClosing == 0 || rev.LastSeenNs < now {
				t.Errorf("reply entry after %s: %+v, want closing and seen", tc.name, rev)
			}
			if tc.fromBackend == (fwd.Flags&ConntrackClosing != 0) {
				t.Errorf("original entry after %s: %+v (closing only if the client's packet matched it)", tc.name, fwd)
			}

			// The client starts again on the same tuple: the flow keeps
			// its backend and its SNAT port, and is no longer closing.
			r, got = newFlow(t, d, client, TCP)
			expectSNAT(t, d, client, TCP, r, got, out.Src.Port())
			fwd, rev, _ = entries()
			if (fwd.Flags|rev.Flags)&ConntrackClosing != 0 {
				t.Errorf("closing after a new SYN: %+v %+v", fwd, rev)
			}
		})
	}
}

// TestSNATReusedPortNotHijacked: once a closed flow's SNAT port has gone to
// another flow, the old flow's entries (which still name the port) must not
// put packets on the new flow's tuple.
func TestSNATReusedPortNotHijacked(t *testing.T) {
	d := setup(t, Options{})
	service(t, d, nodePort, TCP, 4, remotePod)
	const oldClient = client
	_, out := newFlow(t, d, oldClient, TCP)
	port := out.Src.Port()
	snat := out.Src.String()
	// The old flow closes, long ago.
	old := ctEntry(t, d, remotePod, snat, TCP)
	old.Flags |= ConntrackClosing
	old.LastSeenNs = 0
	must(t, d.Conntrack().Put(snatKey(remotePod, port, TCP), old))

	// A new client whose candidates include the old flow's port, all
	// others taken by live flows: it must reuse the port.
	var newClient string
	var cands []uint16
	for p := 1024; p < 65536 && newClient == ""; p++ {
		c := fmt.Sprintf("10.200.0.4:%d", p)
		if cands = snatCandidates(c, remotePod, TCP); slices.Contains(cands, port) {
			newClient = c
		}
	}
	if newClient == "" {
		t.Fatal("no client port whose SNAT candidates include", port)
	}
	now := monotonicNow(t)
	for i, c := range cands {
		if c != port {
			must(t, d.Conntrack().Put(snatKey(remotePod, c, TCP), otherFlow(i, 0, now)))
		}
	}
	r, got := newFlow(t, d, newClient, TCP)
	expectSNAT(t, d, newClient, TCP, r, got, port)

	// A late packet of the old flow is dropped at host egress: SNATed, it
	// would land on the new flow.
	r, got = runPacket(t, d.objs.TcHostIngress, tcp(oldClient, nodePort, tcpFIN|tcpACK))
	expect(t, "old flow's late packet at host ingress", r, got, tcActOK, MarkSeen, oldClient, remotePod)
	if r, got = run2(t, d, got); r.Ret != tcActShot {
		t.Errorf("old flow's late packet left as %s->%s (returned %d), want a drop", got.Src, got.Dst, r.Ret)
	}
	// The backend's packets on the port go to the new flow's client.
	r, got = runPacket(t, d.objs.TcHostIngress, tcp(remotePod, snat, tcpSYN|tcpACK))
	expect(t, "backend's packet on the reused port", r, got, tcActOK, MarkSeen, remotePod, newClient)

	// The old client starts a new flow on its old tuple: a port of its own.
	r, got = newFlow(t, d, oldClient, TCP)
	if r.Ret != tcActOK || got.Src.Port() == port {
		t.Fatalf("new SYN on the old tuple left as %s (returned %d), want a port other than %d", got.Src, r.Ret, port)
	}
	expectSNAT(t, d, oldClient, TCP, r, got, got.Src.Port())
	if v := ctEntry(t, d, remotePod, snat, TCP); v.NATAddr != ipp(newClient).Addr() || v.NATPort != ipp(newClient).Port() {
		t.Errorf("reused SNAT reply entry taken back by the old client: %+v", v)
	}

	// The LRU evicts a live flow's SNAT reply entry: its next packet takes
	// the (free) port again.
	mine := got.Src
	must(t, d.Conntrack().Delete(snatKey(remotePod, mine.Port(), TCP)))
	_, got = runPacket(t, d.objs.TcHostIngress, tcp(oldClient, nodePort, tcpACK))
	r, got = run2(t, d, got)
	expectSNAT(t, d, oldClient, TCP, r, got, mine.Port())
}

// TestSNATPortUncheckedFault: with the fault snat-port-unchecked, a new flow
// that finds no candidate free takes over the first one although its flow is
// live (the clean datapath drops the SYN: TestSNATPortReuse), and the live
// flow's replies go to the new client; a free candidate still comes first.
func TestSNATPortUncheckedFault(t *testing.T) {
	for _, freeAt := range []int{-1, 9} {
		t.Run(fmt.Sprintf("free candidate %d", freeAt), func(t *testing.T) {
			d := setup(t, Options{SNATPortUnchecked: true})
			service(t, d, nodePort, TCP, 4, remotePod)
			cands := snatCandidates(client, remotePod, TCP)
			now := monotonicNow(t)
			for i, port := range cands {
				if i != freeAt {
					must(t, d.Conntrack().Put(snatKey(remotePod, port, TCP), otherFlow(i, 0, now)))
				}
			}
			want := cands[0]
			if freeAt >= 0 {
				want = cands[freeAt]
			}
			r, got := newFlow(t, d, client, TCP)
			expectSNAT(t, d, client, TCP, r, got, want)
			if freeAt >= 0 {
				return
			}
			snat := netip.AddrPortFrom(ip(hostIP), want).String()
			r, got = runPacket(t, d.objs.TcHostIngress, tcp(remotePod, snat, tcpACK))
			expect(t, "the live flow's reply on its stolen port", r, got, tcActOK, MarkSeen, remotePod, client)
		})
	}
}

// A flow the stack NATed to a port of the SNAT range before the datapath ran
// (kube-proxy's MASQUERADE before a switch) is recorded when its reply falls
// through at host ingress, and keeps its port: a new flow whose first candidate
// it is takes the next, so the old flow's replies still fall through to the
// stack rather than being turned to the new flow's client. Once the old flow is
// stale, its port may be taken.
func TestSNATKeepsForeignFlowsPorts(t *testing.T) {
	d := setup(t, Options{})
	service(t, d, nodePort, TCP, 4, remotePod)
	cands := snatCandidates(client, remotePod, TCP)
	foreign := netip.AddrPortFrom(ip(hostIP), cands[0]).String()

	reply := tcp(remotePod, foreign, tcpACK|tcpPSH)
	for i := range 2 {
		in := reply.Bytes()
		r := run(t, d.objs.TcHostIngress, in, 0)
		if r.Ret != tcActOK || r.Mark != MarkFallthrough || !bytes.Equal(r.Out, in) {
			t.Fatalf("foreign flow's reply %d: returned %d with mark %#x (changed: %t), want it to fall through unchanged", i+1, r.Ret, r.Mark, !bytes.Equal(r.Out, in))
		}
	}
	if v := ctEntry(t, d, remotePod, foreign, TCP); v.Flags != ConntrackForeign {
		t.Fatalf("entry of the foreign flow's reply: %+v, want flags %#x", v, ConntrackForeign)
	}
	r, got := newFlow(t, d, client, TCP)
	expectSNAT(t, d, client, TCP, r, got, cands[1])

	// A reply to a port below the SNAT range is no SNAT's: not recorded.
	in := tcp(remotePod, hostIP+":33333", tcpACK).Bytes()
	if r := run(t, d.objs.TcHostIngress, in, 0); r.Mark != MarkFallthrough {
		t.Errorf("reply to port 33333: mark %#x, want %#x", r.Mark, MarkFallthrough)
	}
	if _, err := d.Conntrack().Lookup(ConntrackKey{Src: ipp(remotePod).Addr(), Dst: ip(hostIP), SrcPort: ipp(remotePod).Port(), DstPort: 33333, Proto: TCP}); err == nil {
		t.Errorf("a reply to port 33333 was recorded")
	}

	// Stale (idle past the TCP timeout), the foreign entry gives its port up, as
	// the only reusable one among live flows' entries.
	if up := time.Duration(monotonicNow(t)); up <= ConntrackTCPIdleTimeout+time.Second {
		t.Skipf("SKIPPED: a stale entry needs CLOCK_MONOTONIC past %s; it is at %s", ConntrackTCPIdleTimeout, up)
	}
	d = setup(t, Options{})
	service(t, d, nodePort, TCP, 4, remotePod)
	now := monotonicNow(t)
	must(t, d.Conntrack().Put(snatKey(remotePod, cands[0], TCP), ConntrackValue{Flags: ConntrackForeign}))
	for i, port := range cands[1:] {
		must(t, d.Conntrack().Put(snatKey(remotePod, port, TCP), otherFlow(i, 0, now)))
	}
	r, got = newFlow(t, d, client, TCP)
	expectSNAT(t, d, client, TCP, r, got, cands[0])
}
