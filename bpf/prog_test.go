package bpf

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
)

// Addresses of the program-level tests. BPF_PROG_RUN runs a program as if
// on interface 1, so the endpoint programs see endpoint 1.
const (
	hostIP      = "10.200.0.1"
	client      = "10.200.0.2:50000" // external client
	nodePort    = "10.200.0.1:30080"
	clientPod   = "10.244.0.5:40000"
	clusterIP   = "10.96.0.10:80"
	localPod    = "10.244.0.7:8080"
	remotePod   = "10.244.1.10:8080"
	remotePod2  = "10.244.1.11:8080"
	testIfindex = 1
)

func setup(t *testing.T, opts Options) *Datapath {
	t.Helper()
	requireBPF(t)
	d := open(t, bpffs(t), opts)
	must(t, d.SetConfig(ip(hostIP), 2))
	must(t, d.Endpoints().Put(testIfindex, EndpointValue{PodIP: ip("10.244.0.5")}))
	return d
}

// service programs a frontend with its backends under service id svc.
func service(t *testing.T, d *Datapath, frontend string, proto Proto, svc uint32, backends ...string) FrontendKey {
	t.Helper()
	fe := ipp(frontend)
	k := FrontendKey{Addr: fe.Addr(), Port: fe.Port(), Proto: proto}
	for i, b := range backends {
		be := ipp(b)
		must(t, d.Backends().Put(BackendKey{ServiceID: svc, Index: uint32(i)}, BackendValue{Addr: be.Addr(), Port: be.Port()}))
	}
	must(t, d.Frontends().Put(k, FrontendValue{ServiceID: svc, BackendCount: uint32(len(backends))}))
	return k
}

// expect checks a program's verdict, mark and output packet.
func expect(t *testing.T, what string, r result, got packet, ret, mark uint32, src, dst string) {
	t.Helper()
	if r.Ret != ret {
		t.Errorf("%s: returned %d, want %d", what, r.Ret, ret)
	}
	if r.Mark != mark {
		t.Errorf("%s: mark %#x, want %#x", what, r.Mark, mark)
	}
	if got.Src.String() != src || got.Dst.String() != dst {
		t.Errorf("%s: packet %s->%s, want %s->%s", what, got.Src, got.Dst, src, dst)
	}
}

func ctEntry(t *testing.T, d *Datapath, src, dst string, proto Proto) ConntrackValue {
	t.Helper()
	s, ds := ipp(src), ipp(dst)
	v, err := d.Conntrack().Lookup(ConntrackKey{Src: s.Addr(), Dst: ds.Addr(), SrcPort: s.Port(), DstPort: ds.Port(), Proto: proto})
	if err != nil {
		t.Fatalf("conntrack entry %s->%s: %v", src, dst, err)
	}
	return v
}

func TestClusterIP(t *testing.T) {
	for _, tc := range []struct {
		name    string
		backend string
	}{
		{"local backend", localPod},
		{"remote backend", remotePod},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := setup(t, Options{})
			service(t, d, clusterIP, TCP, 7, tc.backend)

			// SYN from the client pod: DNAT at its interface's ingress.
			r, got := runPacket(t, d.objs.TcEpIngress, tcp(clientPod, clusterIP, tcpSYN))
			expect(t, "SYN at client ingress", r, got, tcActOK, MarkSeen, clientPod, tc.backend)
			if string(got.Payload) != "hello" {
				t.Errorf("payload %q changed", got.Payload)
			}

			fwd := ctEntry(t, d, clientPod, clusterIP, TCP)
			if fwd.Flags != ConntrackDNAT || fwd.ServiceID != 7 || fwd.NATAddr != ipp(tc.backend).Addr() || fwd.NATPort != ipp(tc.backend).Port() {
				t.Errorf("original entry %+v", fwd)
			}
			rev := ctEntry(t, d, tc.backend, clientPod, TCP)
			if rev.Flags != ConntrackDNAT|ConntrackReply || rev.NATAddr != ipp(clusterIP).Addr() || rev.NATPort != 80 {
				t.Errorf("reply entry %+v", rev)
			}

			// The DNATed packet leaves the host interface (remote backend)
			// or reaches the backend's interface (local) unchanged.
			egress := d.objs.TcEpEgress
			if tc.backend == remotePod {
				egress = d.objs.TcHostEgress
			}
			r, got = runPacket(t, egress, tcp(clientPod, tc.backend, tcpSYN))
			expect(t, "SYN towards backend", r, got, tcActOK, MarkSeen, clientPod, tc.backend)

			// The reply enters (backend's interface or host interface)
			// unchanged: a source rewrite there would be a martian.
			ingress := d.objs.TcEpIngress
			if tc.backend == remotePod {
				ingress = d.objs.TcHostIngress
			}
			r, got = runPacket(t, ingress, tcp(tc.backend, clientPod, tcpSYN|tcpACK))
			expect(t, "SYN-ACK entering", r, got, tcActOK, MarkSeen, tc.backend, clientPod)

			// Reverse DNAT where the reply leaves, to the client pod.
			r, got = runPacket(t, d.objs.TcEpEgress, tcp(tc.backend, clientPod, tcpSYN|tcpACK))
			expect(t, "SYN-ACK to client pod", r, got, tcActOK, MarkSeen, clusterIP, clientPod)

			// The rest of the flow.
			r, got = runPacket(t, d.objs.TcEpIngress, tcp(clientPod, clusterIP, tcpACK|tcpPSH))
			expect(t, "ACK at client ingress", r, got, tcActOK, MarkSeen, clientPod, tc.backend)
		})
	}
}

func TestConntrackKeepsBackend(t *testing.T) {
	d := setup(t, Options{})
	backends := []string{"10.244.1.1:8080", "10.244.1.2:8080", "10.244.1.3:8080", "10.244.1.4:8080"}
	fe := service(t, d, clusterIP, TCP, 1, backends...)

	// New flows spread over the backends.
	chosen := map[string]int{}
	for port := 40000; port < 40064; port++ {
		_, got := runPacket(t, d.objs.TcEpIngress, tcp(fmt.Sprintf("10.244.0.5:%d", port), clusterIP, tcpSYN))
		chosen[got.Dst.String()]++
	}
	if len(chosen) < 3 {
		t.Errorf("64 flows went to %d backends only: %v", len(chosen), chosen)
	}

	_, first := runPacket(t, d.objs.TcEpIngress, tcp(clientPod, clusterIP, tcpSYN))
	// The service's backends change: a known flow keeps its backend ...
	service(t, d, clusterIP, TCP, 2, "10.244.2.1:8080")
	if _, err := d.Frontends().Lookup(fe); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		r, got := runPacket(t, d.objs.TcEpIngress, tcp(clientPod, clusterIP, tcpACK))
		expect(t, "ACK of known flow", r, got, tcActOK, MarkSeen, clientPod, first.Dst.String())
	}
	// ... and a new SYN on the same tuple goes to the new backend.
	r, got := runPacket(t, d.objs.TcEpIngress, tcp(clientPod, clusterIP, tcpSYN))
	expect(t, "new SYN on reused tuple", r, got, tcActOK, MarkSeen, clientPod, "10.244.2.1:8080")
}

func TestNodePortLocalBackend(t *testing.T) {
	d := setup(t, Options{})
	service(t, d, nodePort, TCP, 3, localPod)

	r, got := runPacket(t, d.objs.TcHostIngress, tcp(client, nodePort, tcpSYN))
	expect(t, "SYN at host ingress", r, got, tcActOK, MarkSeen, client, localPod)
	if v := ctEntry(t, d, client, nodePort, TCP); v.Flags != ConntrackDNAT|ConntrackHostIngress {
		t.Errorf("original entry flags %#x", v.Flags)
	}

	r, got = runPacket(t, d.objs.TcEpEgress, tcp(client, localPod, tcpSYN))
	expect(t, "SYN to the backend pod", r, got, tcActOK, MarkSeen, client, localPod)

	r, got = runPacket(t, d.objs.TcEpIngress, tcp(localPod, client, tcpSYN|tcpACK))
	expect(t, "SYN-ACK from the backend pod", r, got, tcActOK, MarkSeen, localPod, client)

	r, got = runPacket(t, d.objs.TcHostEgress, tcp(localPod, client, tcpSYN|tcpACK))
	expect(t, "SYN-ACK leaving the host", r, got, tcActOK, MarkSeen, nodePort, client)
}

func TestNodePortRemoteBackendSNAT(t *testing.T) {
	for _, proto := range []Proto{TCP, UDP} {
		t.Run(proto.String(), func(t *testing.T) {
			d := setup(t, Options{})
			service(t, d, nodePort, proto, 4, remotePod)
			mk := func(src, dst string, flags uint8) packet {
				if proto == UDP {
					return udp(src, dst)
				}
				return tcp(src, dst, flags)
			}

			r, got := runPacket(t, d.objs.TcHostIngress, mk(client, nodePort, tcpSYN))
			expect(t, "request at host ingress", r, got, tcActOK, MarkSeen, client, remotePod)

			// Leaving the host interface again: SNAT to the host IP.
			r, got = runPacket(t, d.objs.TcHostEgress, mk(client, remotePod, tcpSYN))
			snat := got.Src
			if snat.Addr() != ip(hostIP) || snat.Port() < SNATPortMin || snat.Port() > SNATPortMax {
				t.Fatalf("request leaving the host: source %s, want %s:%d-%d", snat, hostIP, SNATPortMin, SNATPortMax)
			}
			expect(t, "request leaving the host", r, got, tcActOK, MarkSeen, snat.String(), remotePod)
			if v := ctEntry(t, d, remotePod, client, proto); v.Flags&ConntrackSNAT == 0 || v.SNATPort != snat.Port() {
				t.Errorf("reply entry %+v does not record SNAT port %d", v, snat.Port())
			}
			if v := ctEntry(t, d, remotePod, snat.String(), proto); v.Flags != ConntrackSNATReply || v.NATAddr != ipp(client).Addr() || v.NATPort != ipp(client).Port() {
				t.Errorf("SNAT reply entry %+v", v)
			}

			// The next request keeps its SNAT port.
			_, again := runPacket(t, d.objs.TcHostIngress, mk(client, nodePort, tcpACK))
			_, again = runPacket(t, d.objs.TcHostEgress, again)
			if again.Src != snat || again.Dst.String() != remotePod {
				t.Errorf("second request %s->%s, want %s->%s", again.Src, again.Dst, snat, remotePod)
			}

			// The reply: back to the client at host ingress (its source is
			// the backend's, legitimate), then the frontend as source at
			// host egress.
			r, got = runPacket(t, d.objs.TcHostIngress, mk(remotePod, snat.String(), tcpSYN|tcpACK))
			expect(t, "reply at host ingress", r, got, tcActOK, MarkSeen, remotePod, client)
			r, got = runPacket(t, d.objs.TcHostEgress, mk(remotePod, client, tcpSYN|tcpACK))
			expect(t, "reply leaving the host", r, got, tcActOK, MarkSeen, nodePort, client)

			// Another client gets its own SNAT port.
			_, other := runPacket(t, d.objs.TcHostIngress, mk("10.200.0.3:50000", nodePort, tcpSYN))
			_, other = runPacket(t, d.objs.TcHostEgress, other)
			if other.Src == snat {
				t.Errorf("two clients share SNAT source %s", snat)
			}
		})
	}
}

func TestUDPChecksumZeroStaysZero(t *testing.T) {
	d := setup(t, Options{})
	service(t, d, nodePort, UDP, 5, localPod)
	p := udp(client, nodePort)
	p.NoUDPChecksum = true
	r, got := runPacket(t, d.objs.TcHostIngress, p)
	expect(t, "UDP without checksum", r, got, tcActOK, MarkSeen, client, localPod)
	if !got.NoUDPChecksum {
		t.Errorf("UDP checksum 0 was rewritten")
	}
}

func TestFallthrough(t *testing.T) {
	d := setup(t, Options{})
	service(t, d, clusterIP, TCP, 1, localPod)
	service(t, d, nodePort, TCP, 2, remotePod)

	for _, tc := range []struct {
		name string
		prog *ebpf.Program
		p    packet
	}{
		{"mid-flow to a ClusterIP", d.objs.TcEpIngress, tcp(clientPod, clusterIP, tcpACK)},
		{"mid-flow to a NodePort", d.objs.TcHostIngress, tcp(client, nodePort, tcpACK|tcpPSH)},
		{"mid-flow reply from a backend", d.objs.TcHostIngress, tcp(remotePod, "10.200.0.1:33333", tcpACK)},
		{"FIN pod to pod", d.objs.TcEpIngress, tcp(clientPod, localPod, tcpFIN|tcpACK)},
		{"RST", d.objs.TcEpIngress, tcp(clientPod, localPod, tcpRST)},
		{"SYN-ACK", d.objs.TcHostIngress, tcp(client, hostIP+":22", tcpSYN|tcpACK)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := tc.p.Bytes()
			r := run(t, tc.prog, in, 0x4000) // kube-proxy's masquerade bit stays
			if r.Ret != tcActOK || r.Mark != 0x4000|MarkFallthrough {
				t.Errorf("returned %d with mark %#x, want %d with %#x", r.Ret, r.Mark, tcActOK, 0x4000|MarkFallthrough)
			}
			if !bytes.Equal(r.Out, in) {
				t.Errorf("packet changed")
			}
		})
	}
	n := 0
	must(t, d.Conntrack().Iterate(func(ConntrackKey, ConntrackValue) bool { n++; return true }))
	if n != 0 {
		t.Errorf("fallthrough created %d conntrack entries", n)
	}
}

// A fallthrough packet leaves by an interface of the datapath only if iptables added
// MarkVouched (Linux conntrack knows its flow); a mid-flow packet neither conntrack
// knows is dropped, and the node's own traffic (no mark of ours) is left alone.
func TestFallthroughLeavesOnlyVouched(t *testing.T) {
	d := setup(t, Options{})
	for _, prog := range []struct {
		name string
		p    *ebpf.Program
		pkt  packet
	}{
		{"to a workload", d.objs.TcEpEgress, tcp(client, localPod, tcpACK)},
		{"out of the host interface", d.objs.TcHostEgress, tcp(hostIP+":40000", remotePod, tcpACK|tcpPSH)},
	} {
		for _, tc := range []struct {
			name string
			mark uint32
			ret  uint32
		}{
			{"vouched for by Linux conntrack", 0x4000 | MarkFallthrough | MarkVouched, tcActOK},
			{"known to neither conntrack", 0x4000 | MarkFallthrough, tcActShot},
			{"the node's own, no mark of ours", 0x4000, tcActOK},
		} {
			t.Run(prog.name+", "+tc.name, func(t *testing.T) {
				in := prog.pkt.Bytes()
				r := run(t, prog.p, in, tc.mark)
				if r.Ret != tc.ret {
					t.Errorf("returned %d, want %d", r.Ret, tc.ret)
				}
				if tc.ret == tcActOK && !bytes.Equal(r.Out, in) {
					t.Errorf("packet changed")
				}
			})
		}
	}
}

func TestPodToPodUntouched(t *testing.T) {
	d := setup(t, Options{})
	for _, p := range []packet{tcp(clientPod, remotePod, tcpSYN), udp(clientPod, remotePod)} {
		in := p.Bytes()
		r := run(t, d.objs.TcEpIngress, in, 0)
		if r.Ret != tcActOK || r.Mark != MarkSeen || !bytes.Equal(r.Out, in) {
			t.Errorf("%s: returned %d, mark %#x, changed %v", p, r.Ret, r.Mark, !bytes.Equal(r.Out, in))
		}
		if v := ctEntry(t, d, clientPod, remotePod, p.Proto); v.Flags != 0 {
			t.Errorf("%s: original entry flags %#x", p, v.Flags)
		}
		if v := ctEntry(t, d, remotePod, clientPod, p.Proto); v.Flags != ConntrackReply {
			t.Errorf("%s: reply entry flags %#x", p, v.Flags)
		}
	}
	// Known now: the rest of the flow is tracked, not fallthrough.
	for _, tc := range []struct {
		prog *ebpf.Program
		p    packet
	}{
		{d.objs.TcEpIngress, tcp(clientPod, remotePod, tcpACK)},
		{d.objs.TcHostEgress, tcp(clientPod, remotePod, tcpACK)},
		{d.objs.TcHostIngress, tcp(remotePod, clientPod, tcpACK)},
		{d.objs.TcEpEgress, tcp(remotePod, clientPod, tcpACK)},
	} {
		in := tc.p.Bytes()
		r := run(t, tc.prog, in, 0)
		if r.Ret != tcActOK || r.Mark != MarkSeen || !bytes.Equal(r.Out, in) {
			t.Errorf("%s at %s: returned %d, mark %#x, changed %v", tc.p, tc.prog, r.Ret, r.Mark, !bytes.Equal(r.Out, in))
		}
	}
}

func TestNotOurs(t *testing.T) {
	d := setup(t, Options{})
	service(t, d, clusterIP, TCP, 1, localPod)

	arp := append(append(append([]byte{}, macA...), macB...), 0x08, 0x06)
	arp = append(arp, make([]byte, 28)...)
	icmp := tcp(clientPod, clusterIP, 0).Bytes()
	icmp[14+9] = 1 // ICMP: not parsed, whatever follows
	frag := tcp(clientPod, clusterIP, tcpSYN).Bytes()
	frag[14+6] |= 0x20 // more fragments
	for name, data := range map[string][]byte{"ARP": arp, "ICMP": icmp, "fragment": frag} {
		for _, prog := range []*ebpf.Program{d.objs.TcHostIngress, d.objs.TcHostEgress, d.objs.TcEpIngress, d.objs.TcEpEgress} {
			r := run(t, prog, data, 0)
			if r.Ret != tcActOK || r.Mark != 0 || !bytes.Equal(r.Out, data) {
				t.Errorf("%s at %s: returned %d, mark %#x, changed %v", name, prog, r.Ret, r.Mark, !bytes.Equal(r.Out, data))
			}
		}
	}

	// An interface without endpoint state is not managed.
	must(t, d.Endpoints().Delete(testIfindex))
	in := tcp(clientPod, clusterIP, tcpSYN).Bytes()
	if r := run(t, d.objs.TcEpIngress, in, 0); r.Ret != tcActOK || r.Mark != 0 || !bytes.Equal(r.Out, in) {
		t.Errorf("unmanaged interface: returned %d, mark %#x, changed %v", r.Ret, r.Mark, !bytes.Equal(r.Out, in))
	}
}

func TestNoBackendsDrops(t *testing.T) {
	d := setup(t, Options{})
	service(t, d, clusterIP, TCP, 1)
	if r := run(t, d.objs.TcEpIngress, tcp(clientPod, clusterIP, tcpSYN).Bytes(), 0); r.Ret != tcActShot {
		t.Errorf("SYN to a service without backends: returned %d, want %d (drop)", r.Ret, tcActShot)
	}
}

func TestAntiSpoof(t *testing.T) {
	d := setup(t, Options{})
	must(t, d.Endpoints().Put(testIfindex, EndpointValue{PodIP: ip("10.244.0.5"), Flags: EndpointAntiSpoof}))
	if r := run(t, d.objs.TcEpIngress, tcp("10.244.0.99:1234", localPod, tcpSYN).Bytes(), 0); r.Ret != tcActShot {
		t.Errorf("spoofed source: returned %d, want drop", r.Ret)
	}
	if r := run(t, d.objs.TcEpIngress, tcp(clientPod, localPod, tcpSYN).Bytes(), 0); r.Ret != tcActOK {
		t.Errorf("pod's own source: returned %d, want pass", r.Ret)
	}
}

func TestStateSurvivesReopen(t *testing.T) {
	requireBPF(t)
	for _, tc := range []struct {
		name     string
		opts     Options
		ctKept   bool
		wantMark uint32
	}{
		{"pinned conntrack", Options{}, true, MarkSeen},
		{"unpinned-conntrack fault", Options{UnpinnedConntrack: true}, false, MarkFallthrough},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := bpffs(t)
			d, err := Open(dir, tc.opts)
			must(t, err)
			must(t, d.SetConfig(ip(hostIP), 2))
			fe := service(t, d, nodePort, TCP, 9, remotePod, remotePod2)
			_, first := runPacket(t, d.objs.TcHostIngress, tcp(client, nodePort, tcpSYN))
			must(t, d.Close())

			d = open(t, dir, tc.opts)
			if v, err := d.Frontends().Lookup(fe); err != nil || v.BackendCount != 2 {
				t.Errorf("frontend after reopen: %+v, %v", v, err)
			}
			if c, err := d.Config(); err != nil || c.HostIP != ip(hostIP) {
				t.Errorf("config after reopen: %+v, %v", c, err)
			}
			_, err = d.Conntrack().Lookup(ConntrackKey{Src: ipp(client).Addr(), Dst: ip(hostIP), SrcPort: 50000, DstPort: 30080, Proto: TCP})
			if tc.ctKept && err != nil {
				t.Errorf("conntrack entry lost: %v", err)
			}
			if !tc.ctKept && !errors.Is(err, ebpf.ErrKeyNotExist) {
				t.Errorf("conntrack entry adopted although unpinned: %v", err)
			}

			in := tcp(client, nodePort, tcpACK)
			r, got := runPacket(t, d.objs.TcHostIngress, in)
			if r.Mark != tc.wantMark {
				t.Errorf("ACK after reopen: mark %#x, want %#x", r.Mark, tc.wantMark)
			}
			if tc.ctKept && got.Dst != first.Dst {
				t.Errorf("ACK after reopen went to %s, flow is on %s", got.Dst, first.Dst)
			}
		})
	}
}

func TestRemoveUnpinsMaps(t *testing.T) {
	requireBPF(t)
	dir := bpffs(t)
	d := open(t, dir, Options{})
	must(t, d.Close())
	must(t, Remove(dir))
	entries, err := os.ReadDir(dir)
	must(t, err)
	for _, e := range entries {
		// bpffs preloads maps.debug and progs.debug in every mount.
		if !strings.HasSuffix(e.Name(), ".debug") {
			t.Errorf("left in pin dir after Remove: %s", e.Name())
		}
	}
	must(t, Remove(dir)) // idempotent
}

func TestOpenNeedsBPFFS(t *testing.T) {
	requireBPF(t)
	if _, err := Open(t.TempDir(), Options{}); err == nil {
		t.Fatal("Open on a directory outside bpffs succeeded")
	}
}

// An endpoint map pinned by a version before network policy (8-byte values)
// is replaced by one of the current layout, with its endpoints carried over
// without policy.
func TestAdoptsEndpointsOfOlderLayout(t *testing.T) {
	requireBPF(t)
	dir := bpffs(t)
	old, err := ebpf.NewMap(&ebpf.MapSpec{
		Name: EndpointsMapName, Type: ebpf.Hash, KeySize: 4, ValueSize: endpointValueV0Size, MaxEntries: MaxEndpoints,
	})
	must(t, err)
	defer old.Close()
	must(t, old.Pin(filepath.Join(dir, EndpointsMapName)))
	v := []byte{10, 244, 0, 5, 0, 0, 0, 0}
	binary.NativeEndian.PutUint32(v[4:], uint32(EndpointAntiSpoof))
	must(t, old.Put(uint32(7), v))

	d := open(t, dir, Options{})
	got, err := d.Endpoints().Lookup(7)
	must(t, err)
	if want := (EndpointValue{PodIP: ip("10.244.0.5"), Flags: EndpointAntiSpoof}); got != want {
		t.Errorf("adopted endpoint %+v, want %+v", got, want)
	}
	if info, err := d.Endpoints().Raw().Info(); err != nil || d.Endpoints().Raw().ValueSize() != endpointValueSize {
		t.Errorf("endpoint map %+v (%v) has value size %d", info, err, d.Endpoints().Raw().ValueSize())
	}
}
