package bpf

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/cilium/ebpf"
)

const clientPod2 = "10.244.0.5:40002"

// A value encodes in either format and decodes from either, and the formats
// really differ: one is no prefix of the other.
func TestConntrackFormats(t *testing.T) {
	v := ConntrackValue{
		CreatedNs: 1e9, LastSeenNs: 2e9, Packets: 3, Bytes: 4096,
		Flags: ConntrackDNAT | ConntrackReply | ConntrackSNAT, ServiceID: 7,
		NATAddr: ip("10.96.0.10"), NATPort: 80, SNATPort: 61001,
	}
	for _, f := range ConntrackFormats {
		b, err := v.marshal(f)
		must(t, err)
		if len(b) != f.ValueSize() {
			t.Errorf("%s: %d bytes, want %d", f, len(b), f.ValueSize())
		}
		var back ConntrackValue
		must(t, back.UnmarshalBinary(b))
		want := v
		if f == ConntrackFormatV1 {
			want.Packets, want.Bytes = 0, 0 // not in format 1
		}
		if back != want {
			t.Errorf("%s round trip %+v, want %+v", f, back, want)
		}
	}
	if b, _ := v.MarshalBinary(); len(b) != DefaultConntrackFormat.ValueSize() {
		t.Errorf("MarshalBinary writes %d bytes, not the default format's", len(b))
	}
	// Format 1's bytes read in place as the head of format 2 put the flags
	// among the counters: a migration must convert, field by field.
	b1, err := v.marshal(ConntrackFormatV1)
	must(t, err)
	var misread ConntrackValue
	must(t, misread.UnmarshalBinary(append(b1, make([]byte, 16)...)))
	if misread.Flags == v.Flags || misread.NATAddr == v.NATAddr {
		t.Errorf("a v1 value copied byte for byte into v2 reads right (%+v): the formats do not differ", misread)
	}
	if err := misread.UnmarshalBinary(make([]byte, 40)); err == nil {
		t.Error("a 40-byte value decoded")
	}
	if _, err := ParseConntrackFormat("v3"); err == nil || !strings.Contains(err.Error(), "v1, v2") {
		t.Errorf("ParseConntrackFormat(v3): %v, want an error naming the versions", err)
	}
	if f, err := ParseConntrackFormat("v1"); err != nil || f != ConntrackFormatV1 {
		t.Errorf("ParseConntrackFormat(v1) = %v, %v", f, err)
	}
	if ConntrackFormatV1.PinName() != "dpc_conntrack" || ConntrackFormatV2.PinName() != "dpc_conntrack_v2" {
		t.Errorf("pin names %s, %s: v1's is the name it always had", ConntrackFormatV1.PinName(), ConntrackFormatV2.PinName())
	}
}

// nodeWithFlows opens a datapath in dir with opts, as a run of refdp that
// programs a ClusterIP and a NodePort to remote backends, and opens a flow
// through each: a pod to the ClusterIP, and the external client to the
// NodePort (SNATed on its way out).
func nodeWithFlows(t *testing.T, dir string, opts Options) *Datapath {
	t.Helper()
	d := open(t, dir, opts)
	must(t, d.SetConfig(ip(hostIP), 2))
	must(t, d.Endpoints().Put(testIfindex, EndpointValue{PodIP: ip("10.244.0.5")}))
	service(t, d, clusterIP, TCP, 1, remotePod)
	service(t, d, nodePort, TCP, 2, remotePod)
	r, got := runPacket(t, d.objs.TcEpIngress, tcp(clientPod, clusterIP, tcpSYN))
	expect(t, "SYN to the ClusterIP", r, got, tcActOK, MarkSeen, clientPod, remotePod)
	r, got = runPacket(t, d.objs.TcHostIngress, tcp(client, nodePort, tcpSYN))
	expect(t, "SYN to the NodePort", r, got, tcActOK, MarkSeen, client, remotePod)
	if r, got = runPacket(t, d.objs.TcHostEgress, got); r.Ret != tcActOK || got.Src.Addr() != ip(hostIP) {
		t.Fatalf("SYN to the NodePort leaving SNATed: %d, %s", r.Ret, got)
	}
	return d
}

// sameFlow compares two entries but for what packets change: when it was last
// seen, and the counters.
func sameFlow(a, b ConntrackValue) bool {
	a.LastSeenNs, a.Packets, a.Bytes = 0, 0, 0
	b.LastSeenNs, b.Packets, b.Bytes = 0, 0, 0
	return a == b
}

// A restart with another size or format: the new programs find the previous
// map's entries before the copy (converted), the copy brings the rest,
// including a flow the old programs opened after the new map was made, and
// the previous map is gone after it.
func TestMigrateConntrack(t *testing.T) {
	requireBPF(t)
	for _, tc := range []struct {
		name     string
		from, to Options
	}{
		{"resize v2", Options{ConntrackSize: 1024}, Options{ConntrackSize: 2048}},
		{"resize v1 smaller", Options{ConntrackFormat: ConntrackFormatV1, ConntrackSize: 2048}, Options{ConntrackFormat: ConntrackFormatV1, ConntrackSize: 1024}},
		{"upgrade v1 to v2", Options{ConntrackFormat: ConntrackFormatV1}, Options{ConntrackFormat: ConntrackFormatV2}},
		{"upgrade and resize", Options{ConntrackFormat: ConntrackFormatV1, ConntrackSize: 1024}, Options{ConntrackSize: 4096}},
		{"downgrade v2 to v1", Options{ConntrackFormat: ConntrackFormatV2}, Options{ConntrackFormat: ConntrackFormatV1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := bpffs(t)
			old := nodeWithFlows(t, dir, tc.from)
			fromPin := old.Conntrack().Name()

			d := open(t, dir, tc.to)
			if prev := d.PreviousConntracks(); len(prev) != 1 || !strings.HasPrefix(prev[0], fromPin) {
				t.Fatalf("previous conntrack maps %v, want %s", prev, fromPin)
			}
			if all, _ := d.Conntrack().All(); len(all) != 0 {
				t.Errorf("the new map has %d entries before any packet or the copy", len(all))
			}
			info, err := d.Conntrack().Raw().Info()
			must(t, err)
			if want := d.opts.ConntrackSize; info.MaxEntries != want || d.Conntrack().Raw().ValueSize() != uint32(d.ConntrackFormat().ValueSize()) {
				t.Errorf("new map: %d entries of %d bytes, want %d of %d", info.MaxEntries, d.Conntrack().Raw().ValueSize(), want, d.ConntrackFormat().ValueSize())
			}

			// The old programs are still attached somewhere, and open a flow
			// after the new map was made.
			r, got := runPacket(t, old.objs.TcEpIngress, tcp(clientPod2, clusterIP, tcpSYN))
			expect(t, "SYN through the old programs", r, got, tcActOK, MarkSeen, clientPod2, remotePod)
			before, err := old.Conntrack().All()
			must(t, err)

			// Before the copy, the new programs find the first flow in the
			// previous map.
			r, got = runPacket(t, d.objs.TcEpIngress, tcp(clientPod, clusterIP, tcpACK))
			expect(t, "ACK through the new programs before the copy", r, got, tcActOK, MarkSeen, clientPod, remotePod)
			adopted := ctEntry(t, d, clientPod, clusterIP, TCP)
			if !sameFlow(adopted, before[ctKey(clientPod, clusterIP, TCP)]) {
				t.Errorf("entry adopted by the programs %+v, the previous map has %+v", adopted, before[ctKey(clientPod, clusterIP, TCP)])
			}
			if d.ConntrackFormat() == ConntrackFormatV2 && adopted.Packets != 1 {
				t.Errorf("adopted entry counts %d packets, want the 1 since", adopted.Packets)
			}

			mig, err := d.MigrateConntrack()
			must(t, err)
			if mig.Copied+mig.Present != len(before) || mig.Present != 1 {
				t.Errorf("migration %+v, want %d entries of which 1 present (adopted)", mig, len(before))
			}
			var counted uint64
			for k, v := range before {
				got, err := d.Conntrack().Lookup(k)
				if err != nil {
					t.Errorf("entry %s not migrated: %v", k, err)
					continue
				}
				if !sameFlow(got, v) {
					t.Errorf("entry %s migrated as %+v, was %+v", k, got, v)
				}
				// The counters carry over from v2 only (the adopted entry
				// counts since its adoption).
				want := uint64(0)
				if old.ConntrackFormat() == ConntrackFormatV2 && d.ConntrackFormat() == ConntrackFormatV2 {
					want = v.Packets
					counted += v.Packets
				}
				if k != ctKey(clientPod, clusterIP, TCP) && got.Packets != want {
					t.Errorf("entry %s: %d packets migrated from %d (format %s to %s), want %d", k, got.Packets, v.Packets, old.ConntrackFormat(), d.ConntrackFormat(), want)
				}
			}
			if old.ConntrackFormat() == ConntrackFormatV2 && d.ConntrackFormat() == ConntrackFormatV2 && counted == 0 {
				t.Error("no migrated entry had counted a packet: the test shows nothing of the counters")
			}
			if pins := conntrackPins(t, dir); !slices.Equal(pins, []string{d.Conntrack().Name()}) {
				t.Errorf("conntrack maps pinned after the migration: %v, want only %s", pins, d.Conntrack().Name())
			}
			for _, slot := range []*ebpf.Map{d.objs.DpcCtPrevV1, d.objs.DpcCtPrevV2} {
				var id uint32
				if err := slot.Lookup(uint32(0), &id); !errors.Is(err, ebpf.ErrKeyNotExist) {
					t.Errorf("slot %s still holds a map (%d, %v)", slot, id, err)
				}
			}
			if prev := d.PreviousConntracks(); len(prev) != 0 {
				t.Errorf("previous maps after the migration: %v", prev)
			}

			// Every flow goes on: the one opened in the window, and the
			// NodePort flow's reply through its SNAT entry.
			r, got = runPacket(t, d.objs.TcEpIngress, tcp(clientPod2, clusterIP, tcpACK))
			expect(t, "ACK of the flow opened in the window", r, got, tcActOK, MarkSeen, clientPod2, remotePod)
			snat := before[ctKey(remotePod, client, TCP)].SNATPort
			r, got = runPacket(t, d.objs.TcHostIngress, tcp(remotePod, fmt.Sprintf("%s:%d", hostIP, snat), tcpSYN|tcpACK))
			expect(t, "NodePort reply", r, got, tcActOK, MarkSeen, remotePod, client)

			// A second Open finds nothing more to migrate.
			must(t, d.Close())
			d = open(t, dir, tc.to)
			if prev := d.PreviousConntracks(); len(prev) != 0 {
				t.Errorf("previous maps on the next start: %v", prev)
			}
		})
	}
}

// The order of a migration decides what survives. A flow the old programs
// open after the new map exists is in the previous map only: copied after
// the new programs are attached, it survives; copied before (the fault
// ct-copy-before-attach), it is lost, and its next packet falls through.
func TestMigrationOrder(t *testing.T) {
	requireBPF(t)
	for _, tc := range []struct {
		name        string
		copyFirst   bool
		mark        uint32
		wantBackend bool
	}{
		{"attach, then copy", false, MarkSeen, true},
		{"copy, then attach (ct-copy-before-attach)", true, MarkFallthrough, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := bpffs(t)
			old := nodeWithFlows(t, dir, Options{ConntrackFormat: ConntrackFormatV1})
			d := open(t, dir, Options{ConntrackFormat: ConntrackFormatV2})
			if tc.copyFirst {
				_, err := d.MigrateConntrack()
				must(t, err)
			}
			// Until the new programs replace them, the old ones run: a new
			// connection opens through them.
			r, _ := runPacket(t, old.objs.TcEpIngress, tcp(clientPod2, clusterIP, tcpSYN))
			if r.Ret != tcActOK {
				t.Fatalf("SYN through the old programs: %d", r.Ret)
			}
			// Attached: only the new programs run from here on.
			if !tc.copyFirst {
				_, err := d.MigrateConntrack()
				must(t, err)
			}
			r, got := runPacket(t, d.objs.TcEpIngress, tcp(clientPod2, clusterIP, tcpACK))
			if r.Mark != tc.mark {
				t.Errorf("the window's flow's next packet: mark %#x, want %#x", r.Mark, tc.mark)
			}
			if tc.wantBackend != (got.Dst.String() == remotePod) {
				t.Errorf("the window's flow's next packet goes to %s (DNAT to %s: %v)", got.Dst, remotePod, tc.wantBackend)
			}
			// The flow opened before the new map was made survives either way.
			r, got = runPacket(t, d.objs.TcEpIngress, tcp(clientPod, clusterIP, tcpACK))
			expect(t, "the earlier flow", r, got, tcActOK, MarkSeen, clientPod, remotePod)
		})
	}
}

// The fault no-ct-migration: the previous map is dropped, not migrated.
func TestNoConntrackMigration(t *testing.T) {
	requireBPF(t)
	dir := bpffs(t)
	nodeWithFlows(t, dir, Options{ConntrackFormat: ConntrackFormatV1})
	d := open(t, dir, Options{NoConntrackMigration: true})
	if prev := d.PreviousConntracks(); len(prev) != 0 {
		t.Errorf("previous maps kept: %v", prev)
	}
	if _, err := os.Stat(filepath.Join(dir, ConntrackFormatV1.PinName())); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the v1 map is still pinned: %v", err)
	}
	r, _ := runPacket(t, d.objs.TcEpIngress, tcp(clientPod, clusterIP, tcpACK))
	if r.Mark != MarkFallthrough {
		t.Errorf("an established flow's packet after the upgrade: mark %#x, want fallthrough", r.Mark)
	}
}

// A migration that was interrupted (the agent died between Open and the
// copy) leaves two previous maps; the next one migrates both, the newest's
// entry winning where both have a tuple, and Remove unpins whatever is left.
func TestMigrateSeveralPreviousMaps(t *testing.T) {
	requireBPF(t)
	dir := bpffs(t)
	k := ctKey(clientPod, clusterIP, TCP)
	first := open(t, dir, Options{ConntrackFormat: ConntrackFormatV1, ConntrackSize: 1024})
	must(t, first.Conntrack().Put(k, ConntrackValue{Flags: ConntrackDNAT, NATAddr: ip("10.244.1.1"), NATPort: 1}))
	must(t, first.Conntrack().Put(ctKey(client, nodePort, TCP), ConntrackValue{Flags: ConntrackDNAT, NATPort: 3}))
	must(t, first.Close())
	// Resized, not migrated: the v1 map of 1024 is set aside.
	second := open(t, dir, Options{ConntrackFormat: ConntrackFormatV1, ConntrackSize: 2048})
	must(t, second.Conntrack().Put(k, ConntrackValue{Flags: ConntrackDNAT, NATAddr: ip("10.244.1.2"), NATPort: 2}))
	must(t, second.Close())

	d := open(t, dir, Options{ConntrackFormat: ConntrackFormatV2})
	prev := d.PreviousConntracks()
	if len(prev) != 2 || !strings.HasPrefix(prev[0], ConntrackFormatV1.PinName()+" ") || !strings.HasPrefix(prev[1], ConntrackFormatV1.asidePinName()) {
		t.Fatalf("previous maps %v, want the resized v1 map, then the one set aside", prev)
	}
	mig, err := d.MigrateConntrack()
	must(t, err)
	if mig.Copied != 2 || mig.Present != 1 {
		t.Errorf("migration %+v, want 2 copied, 1 present (the older map's copy of the tuple)", mig)
	}
	if v := ctEntry(t, d, clientPod, clusterIP, TCP); v.NATPort != 2 {
		t.Errorf("tuple in both maps migrated as %+v, want the newer map's (port 2)", v)
	}
	ctEntry(t, d, client, nodePort, TCP)

	// An interrupted migration again, then Remove.
	must(t, d.Close())
	d = open(t, dir, Options{ConntrackFormat: ConntrackFormatV1})
	must(t, d.Close())
	must(t, Remove(dir))
	entries, err := os.ReadDir(dir)
	must(t, err)
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), ".debug") {
			t.Errorf("left in pin dir after Remove: %s", e.Name())
		}
	}
}

// A map pinned under a conntrack name that no version of refdp wrote is
// refused, with the way out.
func TestPreviousConntrackOfUnknownLayout(t *testing.T) {
	requireBPF(t)
	dir := bpffs(t)
	m, err := ebpf.NewMap(&ebpf.MapSpec{Name: "dpc_conntrack", Type: ebpf.LRUHash, KeySize: 16, ValueSize: 40, MaxEntries: 16})
	must(t, err)
	defer m.Close()
	must(t, m.Pin(filepath.Join(dir, "dpc_conntrack")))
	_, err = Open(dir, Options{})
	if err == nil || !strings.Contains(err.Error(), "refdp cleanup") {
		t.Fatalf("Open with a foreign map pinned as dpc_conntrack: %v, want an error naming refdp cleanup", err)
	}
}

// ReattachEndpoints gives the pinned endpoints this Datapath's programs, and
// leaves their state alone.
func TestReattachEndpoints(t *testing.T) {
	requireBPF(t)
	enterNewNetns(t)
	dir := bpffs(t)
	ifA, _ := addVeth(t, "veth-a", "peer-a")
	old := open(t, dir, Options{ConntrackFormat: ConntrackFormatV1})
	must(t, old.AttachEndpoint(ifA, ip("10.244.0.9"), EndpointAntiSpoof))
	must(t, old.Endpoints().Put(4242, EndpointValue{PodIP: ip("10.244.0.10")})) // its interface is gone
	state, err := old.Endpoints().Lookup(uint32(ifA))
	must(t, err)

	d := open(t, dir, Options{ConntrackFormat: ConntrackFormatV2})
	n, err := d.ReattachEndpoints()
	must(t, err)
	if n != 1 {
		t.Errorf("reattached %d endpoints, want the 1 whose interface exists", n)
	}
	expectAttached(t, "after ReattachEndpoints", ifA, d.Mode(), progID(t, d.objs.TcEpIngress), progID(t, d.objs.TcEpEgress))
	if got, err := d.Endpoints().Lookup(uint32(ifA)); err != nil || got != state {
		t.Errorf("endpoint state %+v (%v), was %+v", got, err, state)
	}
	all, err := d.Endpoints().All()
	must(t, err)
	if keys := slices.Sorted(maps.Keys(all)); len(keys) != 2 {
		t.Errorf("endpoints %v: ReattachEndpoints must not forget any", keys)
	}
}

// conntrackPins lists the conntrack maps pinned in dir.
func conntrackPins(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	must(t, err)
	var out []string
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), ConntrackMapName) {
			out = append(out, e.Name())
		}
	}
	return out
}

// Dump reads what is pinned, conntrack maps of either format included, and
// changes nothing: a map of another size than Open's default stays where it is.
func TestDumpReadsWithoutChanging(t *testing.T) {
	requireBPF(t)
	dir := bpffs(t)
	old := nodeWithFlows(t, dir, Options{ConntrackFormat: ConntrackFormatV1, ConntrackSize: 1024})
	must(t, old.Close())
	d := open(t, dir, Options{ConntrackSize: 2048}) // v2, the v1 map still to migrate
	r, _ := runPacket(t, d.objs.TcEpIngress, tcp(clientPod2, clusterIP, tcpSYN))
	if r.Ret != tcActOK {
		t.Fatalf("SYN: %d", r.Ret)
	}
	must(t, d.Close())
	before := conntrackPins(t, dir)

	out, err := Dump(dir)
	must(t, err)
	v1, v2 := out[ConntrackFormatV1.PinName()], out[ConntrackFormatV2.PinName()]
	// The v1 map holds its two flows (one SNATed) and the v2 programs' flow,
	// mirrored while it is in their slot.
	if len(v1) != 7 || len(v2) != 2 {
		t.Errorf("dumped %d v1 and %d v2 conntrack entries, want 7 and 2:\n%v", len(v1), len(v2), out)
	}
	if got := v2[ctKey(clientPod2, clusterIP, TCP).String()]; !strings.Contains(got, "Flags:2") || !strings.Contains(got, "NATAddr:10.244.1.10") {
		t.Errorf("v2 entry rendered %q", got)
	}
	if len(out[FrontendsMapName]) != 2 || len(out[EndpointsMapName]) != 1 {
		t.Errorf("frontends %v, endpoints %v", out[FrontendsMapName], out[EndpointsMapName])
	}
	if after := conntrackPins(t, dir); !slices.Equal(before, after) {
		t.Errorf("Dump changed the pins: %v, then %v", before, after)
	}
	if _, err := Dump(t.TempDir()); err == nil {
		t.Error("Dump of a directory outside bpffs succeeded")
	}
}

// New flows open while the copy runs in the kernel (on another CPU, with the
// previous map still in the programs' slot): none is dropped.
func TestMigrationUnderNewFlows(t *testing.T) {
	requireBPF(t)
	dir := bpffs(t)
	old := open(t, dir, Options{ConntrackFormat: ConntrackFormatV1, ConntrackSize: 1 << 19})
	fillConntrack(t, old.Conntrack().Raw(), ConntrackFormatV1, 200_000)
	must(t, old.Close())
	// The old programs are gone: what they wrote is all in the previous map.
	d := nodeWithFlows(t, dir, Options{ConntrackFormat: ConntrackFormatV2, ConntrackSize: 1 << 19})
	var stop atomic.Bool
	var ok, dropped atomic.Int64
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := 0; !stop.Load(); i++ {
			p := tcp(fmt.Sprintf("10.244.0.5:%d", 1024+i%60000), clusterIP, tcpSYN)
			if r := run(t, d.objs.TcEpIngress, p.Bytes(), 0); r.Ret == tcActOK && r.Mark == MarkSeen {
				ok.Add(1)
			} else {
				dropped.Add(1)
			}
		}
	})
	mig, err := d.MigrateConntrack()
	stop.Store(true)
	wg.Wait()
	must(t, err)
	t.Logf("copied %d entries in %s while %d SYNs went through", mig.Copied, mig.Duration, ok.Load())
	if dropped.Load() > 0 || ok.Load() == 0 {
		t.Errorf("%d of %d SYNs not DNATed during the copy", dropped.Load(), dropped.Load()+ok.Load())
	}
	// The SYNs' flows are mirrored into the previous map: present when copied.
	if mig.Copied != 200_000 || mig.Present > 2*int(ok.Load()) {
		t.Errorf("migration %+v, want the 200,000 entries copied, and at most the SYNs' %d present", mig, 2*ok.Load())
	}
}

// Until every hook runs the new programs, some still run the previous run's,
// which look in the previous map only: a flow a new program opens on one hook
// must be found by an old program on the next (its SYN-ACK reverse-NATed, its
// SNAT reply entry known), and the other way round. The new programs mirror
// what they create into the previous map, and adopt what they lack from it.
func TestMixedHooksDuringMigration(t *testing.T) {
	requireBPF(t)
	for _, tc := range []struct {
		name     string
		from, to Options
	}{
		{"resize", Options{ConntrackSize: 1024}, Options{ConntrackSize: 2048}},
		{"upgrade v1 to v2", Options{ConntrackFormat: ConntrackFormatV1}, Options{ConntrackFormat: ConntrackFormatV2}},
		{"downgrade v2 to v1", Options{ConntrackFormat: ConntrackFormatV2}, Options{ConntrackFormat: ConntrackFormatV1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := bpffs(t)
			old := nodeWithFlows(t, dir, tc.from)
			d := open(t, dir, tc.to)
			type hooks struct{ epIn, epEg, hostIn, hostEg *ebpf.Program }
			oldP := hooks{old.objs.TcEpIngress, old.objs.TcEpEgress, old.objs.TcHostIngress, old.objs.TcHostEgress}
			newP := hooks{d.objs.TcEpIngress, d.objs.TcEpEgress, d.objs.TcHostIngress, d.objs.TcHostEgress}
			for i, mix := range []struct {
				name     string
				in, eg   hooks
				clientEP string // a fresh client per case: a new flow each
			}{
				{"new ingress, old egress", newP, oldP, "10.244.0.5:41001"},
				{"old ingress, new egress", oldP, newP, "10.244.0.5:41002"},
			} {
				// A pod to the ClusterIP: SYN in at the pod's interface, SYN-ACK
				// out to it.
				r, got := runPacket(t, mix.in.epIn, tcp(mix.clientEP, clusterIP, tcpSYN))
				expect(t, mix.name+": SYN", r, got, tcActOK, MarkSeen, mix.clientEP, remotePod)
				r, got = runPacket(t, mix.eg.epEg, tcp(remotePod, mix.clientEP, tcpSYN|tcpACK))
				expect(t, mix.name+": SYN-ACK to the pod", r, got, tcActOK, MarkSeen, clusterIP, mix.clientEP)

				// The outside to the NodePort, backend remote: SNATed on its way
				// out, its reply back in through the SNAT reply entry.
				ext := fmt.Sprintf("10.200.0.9:%d", 52000+i)
				r, got = runPacket(t, mix.in.hostIn, tcp(ext, nodePort, tcpSYN))
				expect(t, mix.name+": NodePort SYN in", r, got, tcActOK, MarkSeen, ext, remotePod)
				r, snatted := runPacket(t, mix.eg.hostEg, got)
				if r.Ret != tcActOK || snatted.Src.Addr() != ip(hostIP) {
					t.Fatalf("%s: NodePort SYN out: %d, %s, want SNATed to %s", mix.name, r.Ret, snatted, hostIP)
				}
				r, got = runPacket(t, mix.in.hostIn, tcp(remotePod, snatted.Src.String(), tcpSYN|tcpACK))
				expect(t, mix.name+": SYN-ACK back in", r, got, tcActOK, MarkSeen, remotePod, ext)
				r, got = runPacket(t, mix.eg.hostEg, got)
				expect(t, mix.name+": SYN-ACK out to the client", r, got, tcActOK, MarkSeen, nodePort, ext)
			}
			// Once every hook runs the new programs, the copy brings the rest.
			_, err := d.MigrateConntrack()
			must(t, err)
			r, got := runPacket(t, d.objs.TcEpEgress, tcp(remotePod, clientPod, tcpACK))
			expect(t, "the first flow's reply after the copy", r, got, tcActOK, MarkSeen, clusterIP, clientPod)
		})
	}
}

// TestNoCTMirrorFault: with the fault no-ct-mirror, what a new program opens
// while the previous map is in its slot stays out of it: an old program on the
// other hook does not know the flow, and the SYN-ACK of a ClusterIP flow leaves
// with the backend's address, that of a NodePort flow without its SNAT undone.
func TestNoCTMirrorFault(t *testing.T) {
	requireBPF(t)
	dir := bpffs(t)
	old := nodeWithFlows(t, dir, Options{ConntrackSize: 1024})
	d := open(t, dir, Options{ConntrackSize: 2048, NoCTMirror: true})

	client := "10.244.0.5:41001"
	r, got := runPacket(t, d.objs.TcEpIngress, tcp(client, clusterIP, tcpSYN))
	expect(t, "SYN through the new ingress", r, got, tcActOK, MarkSeen, client, remotePod)
	r, got = runPacket(t, old.objs.TcEpEgress, tcp(remotePod, client, tcpSYN|tcpACK))
	if r.Ret == tcActOK && got.Src.String() == clusterIP {
		t.Errorf("SYN-ACK through the old egress left from %s: the flow was mirrored with the fault on", got.Src)
	}

	ext := "10.200.0.9:52000"
	r, got = runPacket(t, d.objs.TcHostIngress, tcp(ext, nodePort, tcpSYN))
	expect(t, "NodePort SYN through the new host ingress", r, got, tcActOK, MarkSeen, ext, remotePod)
	r, got = runPacket(t, old.objs.TcHostEgress, got)
	if r.Ret == tcActOK && got.Src.Addr() == ip(hostIP) {
		t.Errorf("NodePort SYN through the old host egress was SNATed to %s: the flow was mirrored with the fault on", got.Src)
	}
}

// The copy's chunk in Go is the one the program counts to (conntrack.h).
func TestMigrateChunkMatchesHeader(t *testing.T) {
	h, err := os.ReadFile("conntrack.h")
	must(t, err)
	if want := fmt.Sprintf("#define DPC_CT_MIGRATE_CHUNK %d\n", migrateChunk); !strings.Contains(string(h), want) || !strings.Contains(string(h), "__u8 value[sizeof(struct ct_value_v2)];") || ctStagedSize != conntrackKeySize+ConntrackFormatV2.ValueSize() {
		t.Errorf("conntrack.h lacks %q", want)
	}
}
