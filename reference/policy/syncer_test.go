package policy

import (
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"testing"

	networkingv1 "k8s.io/api/networking/v1"

	"github.com/dpconform/dpconform/bpf"
)

// fakeDatapath is the IP set map and the endpoints' policies, logging every write in
// order.
type fakeDatapath struct {
	sets     map[bpf.IPSetKey]bpf.IPSetValue
	policies map[int]bpf.EndpointPolicy
	log      []string
	fail     error
}

func newFake() *fakeDatapath {
	return &fakeDatapath{sets: map[bpf.IPSetKey]bpf.IPSetValue{}, policies: map[int]bpf.EndpointPolicy{}}
}

func (f *fakeDatapath) Put(k bpf.IPSetKey, v bpf.IPSetValue) error {
	f.sets[k] = v
	f.log = append(f.log, "put "+k.String())
	return nil
}

func (f *fakeDatapath) Delete(k bpf.IPSetKey) error {
	delete(f.sets, k)
	f.log = append(f.log, "delete "+k.String())
	return nil
}

func (f *fakeDatapath) All() (map[bpf.IPSetKey]bpf.IPSetValue, error) { return maps.Clone(f.sets), nil }

func (f *fakeDatapath) SetEndpointPolicy(ifindex int, p bpf.EndpointPolicy) error {
	if f.fail != nil {
		return f.fail
	}
	f.policies[ifindex] = p
	f.log = append(f.log, fmt.Sprintf("policy %d %v", ifindex, p.Ingress))
	return nil
}

// check verifies that every rule of every endpoint's policy refers to a set that is
// in the map: what the datapath would see at any point.
func (f *fakeDatapath) check(t *testing.T) {
	t.Helper()
	have := map[uint32]bool{}
	for k := range f.sets {
		have[k.SetID] = true
	}
	for ifindex, p := range f.policies {
		for _, r := range append(slices.Clone(p.Ingress), p.Egress...) {
			if r.SetID != 0 && !have[r.SetID] {
				t.Errorf("endpoint %d refers to set %d, which the map lacks", ifindex, r.SetID)
			}
		}
	}
}

// syncRound runs the agent's steps for endpoints that exist already.
func syncRound(t *testing.T, s *Syncer, f *fakeDatapath, d Desired) {
	t.Helper()
	if _, _, err := s.WriteIPSets(d); err != nil {
		t.Fatal(err)
	}
	f.check(t)
	for ifindex, p := range d.Endpoints {
		if _, err := s.WriteEndpointPolicy(ifindex, p); err != nil {
			t.Fatal(err)
		}
		f.check(t)
	}
	if _, err := s.DeleteUnreferencedSets(d); err != nil {
		t.Fatal(err)
	}
	f.check(t)
}

func TestSyncerMakeBeforeBreak(t *testing.T) {
	f := newFake()
	s, err := NewSyncer(f, f)
	if err != nil {
		t.Fatal(err)
	}
	c := NewCompiler(Options{})
	np := newPolicy("prod", "p", sel("app", "web"), networkingv1.NetworkPolicySpec{
		Ingress: from(ports(tcp(80)), networkingv1.NetworkPolicyPeer{PodSelector: sel("app", "client")}),
	})
	in := Input{Policies: []*networkingv1.NetworkPolicy{np}, Pods: testPods, Namespaces: testNamespaces, Endpoints: testEndpoints}
	d1, _ := c.Compile(in)
	syncRound(t, s, f, d1)
	id1 := d1.Endpoints[7].Ingress[0].SetID
	if got := f.log; !reflect.DeepEqual(got, []string{fmt.Sprintf("put %d/10.0.0.3/32", id1), fmt.Sprintf("policy 7 %v", d1.Endpoints[7].Ingress)}) {
		t.Errorf("first round wrote %q", got)
	}

	// Unchanged: nothing written.
	f.log = nil
	syncRound(t, s, f, d1)
	if len(f.log) != 0 {
		t.Errorf("an unchanged round wrote %q", f.log)
	}

	// A second client: the new set is written whole, the endpoint switched, and only
	// then the old set deleted.
	f.log = nil
	in.Pods = append(slices.Clone(testPods), newPod("prod", "client-2", "10.0.0.4", map[string]string{"app": "client"}))
	d2, _ := c.Compile(in)
	syncRound(t, s, f, d2)
	id2 := d2.Endpoints[7].Ingress[0].SetID
	want := []string{
		fmt.Sprintf("put %d/10.0.0.3/32", id2), fmt.Sprintf("put %d/10.0.0.4/32", id2),
		fmt.Sprintf("policy 7 %v", d2.Endpoints[7].Ingress),
		fmt.Sprintf("delete %d/10.0.0.3/32", id1),
	}
	got := f.log
	slices.Sort(got[:2]) // map order
	if !reflect.DeepEqual(got, want) {
		t.Errorf("a change of peers wrote\n  %s\nwant\n  %s", strings.Join(got, "\n  "), strings.Join(want, "\n  "))
	}
}

// TestSyncerAdopts checks a restart: a new Syncer and Compiler over the maps a previous
// run left rewrite nothing of a set they still want, replace a set whose content is
// not what they want (a write cut short) with a new one, and delete the rest only at
// the end of their first round.
func TestSyncerAdopts(t *testing.T) {
	f := newFake()
	s, _ := NewSyncer(f, f)
	c := NewCompiler(Options{})
	np := newPolicy("prod", "p", sel("app", "web"), networkingv1.NetworkPolicySpec{
		Ingress: from(nil,
			networkingv1.NetworkPolicyPeer{PodSelector: sel("app", "client")},
			networkingv1.NetworkPolicyPeer{IPBlock: &networkingv1.IPBlock{CIDR: "192.0.2.0/24", Except: []string{"192.0.2.128/25"}}}),
	})
	in := Input{Policies: []*networkingv1.NetworkPolicy{np}, Pods: testPods, Namespaces: testNamespaces, Endpoints: testEndpoints}
	d, _ := c.Compile(in)
	syncRound(t, s, f, d)
	var blockID, podsID uint32
	for id, set := range d.Sets {
		if len(set) == 2 {
			blockID = id
		} else {
			podsID = id
		}
	}
	// A stale set of the previous run, and a set with an entry too many.
	f.sets[bpf.IPSetKey{SetID: 99, Prefix: netip.MustParsePrefix("10.9.9.9/32")}] = bpf.IPSetValue{}
	f.sets[bpf.IPSetKey{SetID: blockID, Prefix: netip.MustParsePrefix("192.0.2.7/32")}] = bpf.IPSetValue{}

	f.log = nil
	s2, _ := NewSyncer(f, f)
	c2 := NewCompiler(Options{})
	c2.Adopt(s2.Sets())
	d2, err := c2.Compile(in)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := d2.Sets[podsID]; !ok {
		t.Errorf("the pods' set %d is not adopted: %v", podsID, d2.Sets)
	}
	if _, ok := d2.Sets[blockID]; ok {
		t.Errorf("set %d, whose content differs, is adopted", blockID)
	}
	if _, _, err := s2.WriteIPSets(d2); err != nil {
		t.Fatal(err)
	}
	for _, l := range f.log {
		if !strings.HasPrefix(l, "put 100/") {
			t.Errorf("WriteIPSets after a restart: %s; want only the new block set (100) written", l)
		}
	}
	f.log = nil
	for ifindex, p := range d2.Endpoints {
		s2.Written(ifindex, p)
	}
	if _, err := s2.DeleteUnreferencedSets(d2); err != nil {
		t.Fatal(err)
	}
	slices.Sort(f.log)
	want := []string{fmt.Sprintf("delete %d/192.0.2.0/24", blockID), fmt.Sprintf("delete %d/192.0.2.128/25", blockID), fmt.Sprintf("delete %d/192.0.2.7/32", blockID), "delete 99/10.9.9.9/32"}
	if !reflect.DeepEqual(f.log, want) {
		t.Errorf("DeleteUnreferencedSets: %q, want %q", f.log, want)
	}
}

// TestSyncerKeepsSetsOfFailedWrites checks that a set stays while a live policy refers
// to it, as one does whose update failed.
func TestSyncerKeepsSetsOfFailedWrites(t *testing.T) {
	f := newFake()
	s, _ := NewSyncer(f, f)
	c := NewCompiler(Options{})
	np := newPolicy("prod", "p", sel("app", "web"), networkingv1.NetworkPolicySpec{
		Ingress: from(nil, networkingv1.NetworkPolicyPeer{PodSelector: sel("app", "client")}),
	})
	in := Input{Policies: []*networkingv1.NetworkPolicy{np}, Pods: testPods, Namespaces: testNamespaces, Endpoints: testEndpoints}
	d1, _ := c.Compile(in)
	syncRound(t, s, f, d1)

	in.Policies = nil
	d2, _ := c.Compile(in)
	f.fail = errors.New("boom")
	if _, _, err := s.WriteIPSets(d2); err != nil {
		t.Fatal(err)
	}
	if _, err := s.WriteEndpointPolicy(7, d2.Endpoints[7]); err == nil {
		t.Fatal("no error")
	}
	if _, err := s.DeleteUnreferencedSets(d2); err != nil {
		t.Fatal(err)
	}
	f.check(t)
}
