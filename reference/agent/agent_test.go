package agent

import (
	"net/netip"
	"slices"
	"testing"

	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/dpconform/dpconform/bpf"
	"github.com/dpconform/dpconform/reference/faults"
	"github.com/dpconform/dpconform/reference/services"
)

// TestRoundOrder pins the order of a round's steps, clean and under each fault that
// reorders them: the window each fault opens is the steps it moves.
func TestRoundOrder(t *testing.T) {
	for _, tc := range []struct {
		faults []string
		want   []step
	}{
		// IP sets, then the policy of existing endpoints (the peers switch to sets
		// that hold the new pod), then new endpoints with their policy, then the gates.
		{nil, []step{stepWriteIPSets, stepWritePolicies, stepAttachNew, stepWriteIPTables, stepDetachGone, stepDeleteSets}},
		// Calico before PR 12164: the new pod is live before its peers' policy knows it.
		{[]string{faults.AttachBeforeIPSets}, []step{stepAttachNew, stepWriteIPTables, stepWriteIPSets, stepWritePolicies, stepDetachGone, stepDeleteSets}},
		// The gate opens before the new endpoint's own policy is written.
		{[]string{faults.RedirectBeforePolicy}, []step{stepWriteIPSets, stepWritePolicies, stepAttachNewUnpoliced, stepWriteIPTables, stepWritePolicies, stepDetachGone, stepDeleteSets}},
		{[]string{faults.AttachBeforeIPSets, faults.RedirectBeforePolicy}, []step{stepAttachNewUnpoliced, stepWriteIPTables, stepWriteIPSets, stepWritePolicies, stepWritePolicies, stepDetachGone, stepDeleteSets}},
		// Faults that are not about the order leave it alone.
		{[]string{faults.DeleteThenAddPolicy, faults.OpenWhileRestarting}, []step{stepWriteIPSets, stepWritePolicies, stepAttachNew, stepWriteIPTables, stepDetachGone, stepDeleteSets}},
	} {
		f, err := faults.Parse(tc.faults)
		if err != nil {
			t.Fatal(err)
		}
		if got := roundOrder(f); !slices.Equal(got, tc.want) {
			t.Errorf("faults %v: order %v, want %v", tc.faults, got, tc.want)
		}
	}
}

// TestStartOrder pins the order of the start steps: the conntrack migration after
// every hook runs this run's programs, or before (ct-copy-before-attach, the review
// point of Calico PR 12164), which is the window that fault opens.
func TestStartOrder(t *testing.T) {
	for _, tc := range []struct {
		faults []string
		want   []startStep
	}{
		{nil, []startStep{startChains, startAttach, startMigrate}},
		{[]string{faults.CTCopyBeforeAttach}, []startStep{startMigrate, startChains, startAttach}},
		// Faults of the start that are not about the migration leave it last.
		{[]string{faults.NoCTMigration, faults.OpenWhileRestarting, faults.CleanupBeforeAttach}, []startStep{startChains, startAttach, startMigrate}},
	} {
		f, err := faults.Parse(tc.faults)
		if err != nil {
			t.Fatal(err)
		}
		if got := startOrder(f); !slices.Equal(got, tc.want) {
			t.Errorf("faults %v: start order %v, want %v", tc.faults, got, tc.want)
		}
	}
}

// TestRoundOrderInvariants checks, for every combination of faults, what the order
// must keep: the gates open after the attach, IP sets are written before sets are
// deleted, and gone endpoints are detached only after the gates closed.
func TestRoundOrderInvariants(t *testing.T) {
	for _, names := range [][]string{nil, {faults.AttachBeforeIPSets}, {faults.RedirectBeforePolicy}, {faults.AttachBeforeIPSets, faults.RedirectBeforePolicy}} {
		f, _ := faults.Parse(names)
		o := roundOrder(f)
		at := func(s step) int { return slices.Index(o, s) }
		attach := max(at(stepAttachNew), at(stepAttachNewUnpoliced))
		if attach < 0 || at(stepWriteIPTables) < attach {
			t.Errorf("%v: %v: the gates must be written after the attach", names, o)
		}
		if at(stepDeleteSets) < at(stepWriteIPSets) || at(stepDeleteSets) < slices.Index(o, stepWritePolicies) {
			t.Errorf("%v: %v: sets deleted before the sets and policies are written", names, o)
		}
		if at(stepDetachGone) < at(stepWriteIPTables) {
			t.Errorf("%v: %v: detach before the gates close", names, o)
		}
	}
	clean := roundOrder(nil)
	if i := slices.Index(clean, stepWriteIPSets); i != 0 {
		t.Errorf("clean: %v: IP sets are not written first", clean)
	}
	if slices.Index(clean, stepWritePolicies) > slices.Index(clean, stepAttachNew) {
		t.Errorf("clean: %v: a new endpoint is attached before its peers' policy knows it", clean)
	}
}

func netpol(name, rv string) *networkingv1.NetworkPolicy {
	return &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, ResourceVersion: rv}}
}

func versions(nps []*networkingv1.NetworkPolicy) []string {
	var out []string
	for _, np := range nps {
		out = append(out, np.Name+"@"+np.ResourceVersion)
	}
	return out
}

// TestPolicyViewUpdateInPlace: clean, every round sees the old version or the new one.
func TestPolicyViewUpdateInPlace(t *testing.T) {
	v := newPolicyView(false)
	pokes := 0
	h := v.handler(func() { pokes++ })
	h.OnAdd(netpol("a", "1"), true)
	h.OnAdd(netpol("b", "1"), true)
	if got := versions(v.snapshot()); !slices.Equal(got, []string{"a@1", "b@1"}) {
		t.Fatalf("after adds: %v", got)
	}
	h.OnUpdate(netpol("a", "1"), netpol("a", "2"))
	if got := versions(v.snapshot()); !slices.Equal(got, []string{"a@2", "b@1"}) {
		t.Errorf("round after the update: %v, want a@2 b@1", got)
	}
	if got := v.roundDone(); got != nil {
		t.Errorf("roundDone: %v, want nothing", got)
	}
	h.OnDelete(cache.DeletedFinalStateUnknown{Key: "ns/b", Obj: netpol("b", "1")})
	if got := versions(v.snapshot()); !slices.Equal(got, []string{"a@2"}) {
		t.Errorf("after a tombstone: %v", got)
	}
	if pokes != 4 {
		t.Errorf("%d pokes, want one per event (4)", pokes)
	}
}

// TestPolicyViewSplitUpdate: with delete-then-add-policy, exactly one round compiles
// the view without the updated policy, the next one with its new version.
func TestPolicyViewSplitUpdate(t *testing.T) {
	v := newPolicyView(true)
	h := v.handler(func() {})
	h.OnAdd(netpol("a", "1"), true)
	h.OnAdd(netpol("b", "1"), true)
	v.snapshot()
	v.roundDone()

	h.OnUpdate(netpol("a", "1"), netpol("a", "2"))
	// Until a round has compiled the delete, the add is held back.
	if got := v.roundDone(); got != nil {
		t.Fatalf("roundDone before a round: %v", got)
	}
	h.OnUpdate(netpol("a", "2"), netpol("a", "3")) // a second update meanwhile
	if got := versions(v.snapshot()); !slices.Equal(got, []string{"b@1"}) {
		t.Errorf("the round after the update: %v, want b@1 alone", got)
	}
	if got := v.roundDone(); !slices.Equal(got, []string{"ns/a"}) {
		t.Errorf("roundDone: %v, want ns/a", got)
	}
	if got := versions(v.snapshot()); !slices.Equal(got, []string{"a@3", "b@1"}) {
		t.Errorf("the next round: %v, want a@3 b@1", got)
	}
	if got := v.roundDone(); got != nil {
		t.Errorf("roundDone again: %v", got)
	}

	// Deleted while its add is pending: it stays deleted.
	h.OnUpdate(netpol("b", "1"), netpol("b", "2"))
	h.OnDelete(netpol("b", "2"))
	v.snapshot()
	v.roundDone()
	if got := versions(v.snapshot()); !slices.Equal(got, []string{"a@3"}) {
		t.Errorf("after update and delete: %v, want a@3", got)
	}
}

// A TCP backend removed from its frontend is flagged gone only once its endpoint is
// not listed and no pod holds its address: while listed (terminating), or while its
// pod runs outside the Service, it drains, and one back in its frontend's backends is
// dropped from the watch. Duplicates count once.
func TestGoneTCP(t *testing.T) {
	fe := bpf.FrontendKey{Addr: netip.MustParseAddr("10.96.0.10"), Port: 80, Proto: bpf.TCP}
	be := func(s string) bpf.BackendValue { return bpf.BackendValue{Addr: netip.MustParseAddr(s), Port: 8080} }
	flows := func(bs ...string) []bpf.DNATFlows {
		var out []bpf.DNATFlows
		for _, b := range bs {
			out = append(out, bpf.DNATFlows{Frontend: fe, Backend: be(b)})
		}
		return out
	}
	left := flows("10.244.1.2", "10.244.1.3", "10.244.1.4", "10.244.1.2", "10.244.1.5")
	inMaps := map[bpf.FrontendKey][]bpf.BackendValue{fe: {be("10.244.0.2"), be("10.244.1.4")}}
	listed := services.Desired{"default/web:80/TCP": {Frontends: []bpf.FrontendKey{fe}, Backends: []bpf.BackendValue{be("10.244.0.2"), be("10.244.1.3"), be("10.244.1.4")}}}
	running := map[netip.Addr]bool{netip.MustParseAddr("10.244.1.5"): true}
	gone, draining := goneTCP(left, inMaps, listed, running)
	if want := flows("10.244.1.2"); !slices.Equal(gone, want) {
		t.Errorf("gone %v, want %v (not listed, no pod)", gone, want)
	}
	if want := flows("10.244.1.3", "10.244.1.5"); !slices.Equal(draining, want) {
		t.Errorf("draining %v, want %v (listed, terminating; a pod that left the Service)", draining, want)
	}
}
