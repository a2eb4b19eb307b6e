package bpf

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"runtime"
	"slices"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// enterNewNetns moves the test's goroutine, locked to its thread, into a new
// network namespace, which goes away when the test ends. Subtests run on
// goroutines of their own and must enter a namespace themselves.
func enterNewNetns(t *testing.T) netns.NsHandle {
	t.Helper()
	runtime.LockOSThread()
	orig, err := netns.Get()
	if err != nil {
		runtime.UnlockOSThread()
		t.Fatalf("get netns: %v", err)
	}
	h, err := netns.New()
	if err != nil {
		orig.Close()
		runtime.UnlockOSThread()
		t.Fatalf("new netns: %v", err)
	}
	t.Cleanup(func() {
		if err := netns.Set(orig); err != nil {
			// Leave the thread locked: the runtime will retire it.
			t.Errorf("back to the original netns: %v", err)
			return
		}
		h.Close()
		orig.Close()
		runtime.UnlockOSThread()
	})
	return h
}

func addVeth(t *testing.T, name, peer string) (int, int) {
	t.Helper()
	must(t, netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}, PeerName: peer}))
	var idx [2]int
	for i, n := range []string{name, peer} {
		l, err := netlink.LinkByName(n)
		must(t, err)
		must(t, netlink.LinkSetUp(l))
		idx[i] = l.Attrs().Index
	}
	return idx[0], idx[1]
}

func progID(t *testing.T, p *ebpf.Program) ebpf.ProgramID {
	t.Helper()
	info, err := p.Info()
	must(t, err)
	id, ok := info.ID()
	if !ok {
		t.Fatal("kernel does not report program IDs")
	}
	return id
}

// hooks is what is attached to one interface, per direction.
type hooks struct {
	tcx    [2][]ebpf.ProgramID
	tcxLnk [2][]link.ID
	clsact [2][]ebpf.ProgramID
}

func attachedTo(t *testing.T, ifindex int) hooks {
	t.Helper()
	var h hooks
	for _, dir := range tcHooks {
		if HaveTCX() == nil {
			res, err := link.QueryPrograms(link.QueryOptions{Target: ifindex, Attach: dir.tcxAttach()})
			must(t, err)
			for _, p := range res.Programs {
				h.tcx[dir] = append(h.tcx[dir], p.ID)
				if id, ok := p.LinkID(); ok {
					h.tcxLnk[dir] = append(h.tcxLnk[dir], id)
				}
			}
		}
		l, err := netlink.LinkByIndex(ifindex)
		must(t, err)
		qdiscs, err := netlink.QdiscList(l)
		must(t, err)
		for _, q := range qdiscs {
			if q.Type() != "clsact" {
				continue
			}
			filters, err := netlink.FilterList(l, dir.clsactParent())
			must(t, err)
			for _, f := range filters {
				if bf, ok := f.(*netlink.BpfFilter); ok {
					h.clsact[dir] = append(h.clsact[dir], ebpf.ProgramID(bf.Id))
				}
			}
		}
	}
	return h
}

// expectAttached checks that exactly the given programs are attached, the
// given way, on ingress and egress.
func expectAttached(t *testing.T, what string, ifindex int, mode AttachMode, in, eg ebpf.ProgramID) hooks {
	t.Helper()
	h := attachedTo(t, ifindex)
	t.Logf("%s: ifindex %d: tcx %v links %v clsact %v", what, ifindex, h.tcx, h.tcxLnk, h.clsact)
	want := [2][]ebpf.ProgramID{{in}, {eg}}
	var none [2][]ebpf.ProgramID
	if in == 0 {
		want = none
	}
	got, other := h.tcx, h.clsact
	if mode == AttachClsact {
		got, other = h.clsact, h.tcx
	}
	for _, dir := range tcHooks {
		if !equalIDs(got[dir], want[dir]) || len(other[dir]) != 0 {
			t.Errorf("%s: %s: %s programs %v (want %v), other mode %v", what, dir, mode, got[dir], want[dir], other[dir])
		}
	}
	return h
}

func sameLinks(a, b hooks) bool {
	return fmt.Sprint(a.tcxLnk) == fmt.Sprint(b.tcxLnk)
}

func equalIDs(a, b []ebpf.ProgramID) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestAttachUpdateDetach(t *testing.T) {
	requireBPF(t)
	for _, mode := range []AttachMode{AttachTCX, AttachClsact} {
		t.Run(string(mode), func(t *testing.T) {
			if mode == AttachTCX {
				if err := HaveTCX(); err != nil {
					t.Skipf("SKIPPED: %v", err)
				}
			}
			opts := Options{ForceClsact: mode == AttachClsact}
			enterNewNetns(t)
			dir := bpffs(t)
			host, pod := addVeth(t, "dpc-host", "dpc-pod")

			d1, err := Open(dir, opts)
			must(t, err)
			if d1.Mode() != mode {
				t.Fatalf("mode %s, want %s", d1.Mode(), mode)
			}
			if got := d1.hookOrder(host); !slices.Equal(got, []tcHook{tcEgress, tcIngress}) {
				t.Errorf("order of a first attach %v, want egress first: the replies of what ingress NATs must meet the program that reverses it", got)
			}
			must(t, d1.AttachHostByName("dpc-host"))
			in1, eg1 := progID(t, d1.objs.TcHostIngress), progID(t, d1.objs.TcHostEgress)
			h1 := expectAttached(t, "first attach", host, mode, in1, eg1)
			if mode == AttachTCX && !(h1.tcxLnk[tcEgress][0] < h1.tcxLnk[tcIngress][0]) {
				t.Errorf("first attach made the ingress link before the egress one: %v", h1.tcxLnk)
			}
			if got := d1.hookOrder(host); !slices.Equal(got, []tcHook{tcIngress, tcEgress}) {
				t.Errorf("order of a replacement %v, want ingress first (ct_mirror covers it)", got)
			}
			must(t, d1.AttachHost(host))
			h2 := expectAttached(t, "attach again", host, mode, in1, eg1)
			if mode == AttachTCX {
				if len(h1.tcxLnk[tcIngress]) != 1 || !sameLinks(h1, h2) {
					t.Errorf("attach again changed links: %v -> %v", h1.tcxLnk, h2.tcxLnk)
				}
				if _, err := os.Stat(LinkPinPath(dir, host, "ingress")); err != nil {
					t.Errorf("link not pinned: %v", err)
				}
			}

			// The agent goes away: programs stay attached.
			must(t, d1.Close())
			expectAttached(t, "after Close", host, mode, in1, eg1)

			// A new agent updates the same links (or filters) in place.
			d2 := open(t, dir, opts)
			must(t, d2.AttachHost(host))
			in2, eg2 := progID(t, d2.objs.TcHostIngress), progID(t, d2.objs.TcHostEgress)
			if in2 == in1 {
				t.Fatal("reopen did not load new programs")
			}
			h3 := expectAttached(t, "after reopen and attach", host, mode, in2, eg2)
			if mode == AttachTCX && !sameLinks(h1, h3) {
				t.Errorf("links replaced rather than updated: %v -> %v", h1.tcxLnk, h3.tcxLnk)
			}

			// An endpoint: state first, then programs; detach undoes both.
			podIP := netip.MustParseAddr("10.244.0.5")
			must(t, d2.AttachEndpointByName("dpc-pod", podIP, EndpointAntiSpoof))
			epIn, epEg := progID(t, d2.objs.TcEpIngress), progID(t, d2.objs.TcEpEgress)
			expectAttached(t, "endpoint", pod, mode, epIn, epEg)
			if v, err := d2.Endpoints().Lookup(uint32(pod)); err != nil || v.PodIP != podIP || v.Flags != EndpointAntiSpoof {
				t.Errorf("endpoint state %+v, %v", v, err)
			}
			must(t, d2.AttachEndpoint(pod, podIP, 0))
			expectAttached(t, "endpoint again", pod, mode, epIn, epEg)
			must(t, d2.DetachEndpointByName("dpc-pod"))
			expectAttached(t, "endpoint detached", pod, mode, 0, 0)
			if _, err := d2.Endpoints().Lookup(uint32(pod)); !errors.Is(err, ebpf.ErrKeyNotExist) {
				t.Errorf("endpoint state after detach: %v", err)
			}
			must(t, d2.DetachEndpoint(pod)) // idempotent

			// An endpoint whose interface disappears before its detach.
			must(t, d2.AttachEndpoint(pod, podIP, 0))
			l, err := netlink.LinkByIndex(pod)
			must(t, err)
			must(t, netlink.LinkDel(l)) // takes its peer, the host side, along
			must(t, d2.DetachEndpoint(pod))
			if _, err := os.Stat(LinkPinPath(dir, pod, "ingress")); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("pin of a vanished endpoint left: %v", err)
			}

			// The host interface is back (same name, new index): attach
			// anew, then Remove takes everything away.
			host, _ = addVeth(t, "dpc-host", "dpc-pod")
			must(t, d2.AttachHost(host))
			expectAttached(t, "host interface recreated", host, mode, in2, eg2)
			must(t, d2.DetachHost(host))
			expectAttached(t, "host detached", host, mode, 0, 0)
			must(t, d2.DetachHost(host)) // idempotent
			must(t, d2.AttachHost(host))
			must(t, Remove(dir))
			expectAttached(t, "after Remove", host, mode, 0, 0)
			entries, err := os.ReadDir(dir)
			must(t, err)
			for _, e := range entries {
				if e.Name() != "maps.debug" && e.Name() != "progs.debug" {
					t.Errorf("left in pin dir after Remove: %s", e.Name())
				}
			}
		})
	}
}

func TestAttachModeSwitch(t *testing.T) {
	requireBPF(t)
	if err := HaveTCX(); err != nil {
		t.Skipf("SKIPPED: %v", err)
	}
	enterNewNetns(t)
	dir := bpffs(t)
	host, _ := addVeth(t, "dpc-host", "dpc-pod")

	tcx := open(t, dir, Options{})
	must(t, tcx.AttachHost(host))
	cls := open(t, dir, Options{ForceClsact: true})
	must(t, cls.AttachHost(host))
	expectAttached(t, "tcx -> clsact", host, AttachClsact, progID(t, cls.objs.TcHostIngress), progID(t, cls.objs.TcHostEgress))
	must(t, tcx.AttachHost(host))
	expectAttached(t, "clsact -> tcx", host, AttachTCX, progID(t, tcx.objs.TcHostIngress), progID(t, tcx.objs.TcHostEgress))
	must(t, Remove(dir))
	expectAttached(t, "after Remove", host, AttachTCX, 0, 0)
}

func TestFeatureChecks(t *testing.T) {
	requireBPF(t)
	if err := CheckKernel(); err != nil {
		t.Fatal(err)
	}
	if err := HaveTCX(); err != nil && !errors.Is(err, ebpf.ErrNotSupported) {
		t.Errorf("HaveTCX: %v does not wrap ErrNotSupported", err)
	}
}
