package specs

import (
	"net/netip"
	"testing"

	networkingv1 "k8s.io/api/networking/v1"

	"github.com/dpconform/dpconform/fv/netpolmodel"
	"github.com/dpconform/dpconform/fv/workloads"
)

// fakeTable is the truth table's model view with the pods at addresses of a
// netns topology's (two nodes, a /24 of pods each), no network needed.
func fakeTable() (netpolmodel.Cluster, podIPs) {
	ips := map[string]netip.Addr{}
	i := 0
	for _, ns := range workloads.NetpolNamespaces {
		for _, name := range workloads.NetpolPods {
			ips[ns+"/"+name] = netip.AddrFrom4([4]byte{10, 244, byte(i % 2), byte(2 + i/2)})
			i++
		}
	}
	ip := func(id string) netip.Addr {
		a, ok := ips[id]
		if !ok {
			panic("no pod " + id)
		}
		return a
	}
	return workloads.NetpolCluster(ip), ip
}

func values(ps []*networkingv1.NetworkPolicy) []networkingv1.NetworkPolicy {
	out := make([]networkingv1.NetworkPolicy, len(ps))
	for i, p := range ps {
		out[i] = *p
	}
	return out
}

// TestPolicyCasesDiffer: each case's expected matrix differs from the one before it
// (the first from the all-open precondition), so an implementation that still holds
// the previous case's state cannot pass a case by standing still.
func TestPolicyCasesDiffer(t *testing.T) {
	if len(policyCases) < 25 {
		t.Errorf("the truth table has %d cases; it needs at least 25", len(policyCases))
	}
	c, ips := fakeTable()
	prev := c.Expected(nil, truthPorts)
	for i, pc := range policyCases {
		cur := c.Expected(values(pc.policies(ips)), truthPorts)
		if wrong, _, _ := netpolmodel.Compare(prev, cur); len(wrong) == 0 {
			t.Errorf("%s expects the same matrix as the case before it", caseLabel(i, pc))
		}
		prev = cur
	}
}

// TestPolicyCasesNamesUnique: a policy's name in a namespace is reused across cases
// only on purpose (an update), and never twice within one case.
func TestPolicyCasesNamesUnique(t *testing.T) {
	_, ips := fakeTable()
	for i, pc := range policyCases {
		seen := map[string]bool{}
		for _, p := range pc.policies(ips) {
			key := p.Namespace + "/" + p.Name
			if seen[key] {
				t.Errorf("%s names %s twice", caseLabel(i, pc), key)
			}
			seen[key] = true
		}
	}
}

// TestPolicyCasesCoverFaults: every fault the spec says it catches has a case there
// for it.
func TestPolicyCasesCoverFaults(t *testing.T) {
	covered := map[string]bool{}
	for _, pc := range policyCases {
		for _, f := range pc.catches {
			covered[f] = true
		}
	}
	for _, f := range []string{"ignore-ipblock-except", "named-ports-unresolved", "egress-ignores-ports"} {
		if !covered[f] {
			t.Errorf("no case is there for fault %s", f)
		}
	}
}

// TestPolicyCasesValid: every case's policies are ones the API server accepts, so the
// model judges what the implementation is given.
func TestPolicyCasesValid(t *testing.T) {
	_, ips := fakeTable()
	for i, pc := range policyCases {
		if err := netpolmodel.Validate(values(pc.policies(ips))); err != nil {
			t.Errorf("%s: %v", caseLabel(i, pc), err)
		}
	}
}
