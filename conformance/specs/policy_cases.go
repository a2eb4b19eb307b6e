package specs

import (
	"fmt"
	"net/netip"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/dpconform/dpconform/fv/workloads"
)

// policyCase is one case of POLICY-TRUTH-TABLE: the complete set of NetworkPolicies
// in force while it is probed. Policies of the previous case that it does not list
// are deleted; one it lists under the name of a previous one is updated in place (the
// case is then about the update). The expected matrix is not written here: the
// suite's model computes it from the policies as the API server stores them.
type policyCase struct {
	name     string
	policies func(ips podIPs) []*networkingv1.NetworkPolicy
	// catches names the faults of the reference the case is there for (docs only).
	catches []string
}

// PolicyCase is a case of POLICY-TRUTH-TABLE as others draw on them (the fuzzer
// composes them with the other transitions): its name, and the NetworkPolicies in
// force in it, given the netpol fixture's pod IPs by ID.
type PolicyCase struct {
	Name     string
	Policies func(ip func(id string) netip.Addr) []*networkingv1.NetworkPolicy
}

// PolicyCases are the truth table's cases, in its order.
func PolicyCases() []PolicyCase {
	out := make([]PolicyCase, len(policyCases))
	for i, c := range policyCases {
		out[i] = PolicyCase{Name: c.name, Policies: func(ip func(string) netip.Addr) []*networkingv1.NetworkPolicy { return c.policies(ip) }}
	}
	return out
}

// podIPs gives the fixture's pod IPs by ID ("y/b"), for ipBlock cases.
type podIPs func(id string) netip.Addr

// policyCases are the truth table's cases, after the upstream NetworkPolicy e2e tests
// (test/e2e/network/netpol) and Cyclonus. Each case's matrix differs from the one
// before it (TestPolicyCasesDiffer), so that a case cannot pass on what the
// implementation still holds from the previous one.
var policyCases = []policyCase{
	{name: "deny all ingress in x", policies: func(podIPs) []*networkingv1.NetworkPolicy {
		return pols(ingressOnly("x", "deny-ingress", everyPod()))
	}},
	{name: "deny all egress in x", policies: func(podIPs) []*networkingv1.NetworkPolicy {
		return pols(egressOnly("x", "deny-egress", everyPod()))
	}},
	{name: "deny all ingress and egress in x", policies: func(podIPs) []*networkingv1.NetworkPolicy {
		return pols(ingressOnly("x", "deny-ingress", everyPod()), egressOnly("x", "deny-egress", everyPod()))
	}},
	{name: "allow ingress to x/a from namespace y", policies: func(podIPs) []*networkingv1.NetworkPolicy {
		return pols(ingressOnly("x", "allow-a", pod("a"), from(peerNS("y"))))
	}},
	{name: "allow ingress to x/a from pod b of its own namespace", policies: func(podIPs) []*networkingv1.NetworkPolicy {
		return pols(ingressOnly("x", "allow-a", pod("a"), from(peerPod("b"))))
	}},
	{name: "allow ingress to x/a from pod b in namespace y (one peer, both selectors)", policies: func(podIPs) []*networkingv1.NetworkPolicy {
		return pols(ingressOnly("x", "allow-a", pod("a"), from(peerNSPod("y", "b"))))
	}},
	{name: "allow ingress to x/a from pod b, or from namespace y (two peers)", policies: func(podIPs) []*networkingv1.NetworkPolicy {
		return pols(ingressOnly("x", "allow-a", pod("a"), from(peerPod("b"), peerNS("y"))))
	}},
	{name: "allow ingress to x/a from every namespace", policies: func(podIPs) []*networkingv1.NetworkPolicy {
		return pols(ingressOnly("x", "allow-a", pod("a"), from(networkingv1.NetworkPolicyPeer{NamespaceSelector: &metav1.LabelSelector{}})))
	}},
	{name: "allow ingress to x/a from namespaces y and z, except pods c (match expressions)", policies: func(podIPs) []*networkingv1.NetworkPolicy {
		return pols(ingressOnly("x", "allow-a", pod("a"), from(networkingv1.NetworkPolicyPeer{
			NamespaceSelector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
				{Key: workloads.NamespaceLabel, Operator: metav1.LabelSelectorOpIn, Values: []string{"y", "z"}}}},
			PodSelector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
				{Key: workloads.PodLabel, Operator: metav1.LabelSelectorOpNotIn, Values: []string{"c"}}}},
		})))
	}},
	{name: "allow ingress to x/a from y/b's IP (ipBlock /32)", policies: func(ip podIPs) []*networkingv1.NetworkPolicy {
		return pols(ingressOnly("x", "allow-a", pod("a"), from(ipBlock(host(ip("y/b"))))))
	}},
	{name: "allow ingress to x/a from everywhere except y/b (ipBlock except)", catches: []string{"ignore-ipblock-except"},
		policies: func(ip podIPs) []*networkingv1.NetworkPolicy {
			return pols(ingressOnly("x", "allow-a", pod("a"), from(ipBlock("0.0.0.0/0", host(ip("y/b"))))))
		}},
	{name: "allow ingress to x/a from z/c's /30, except z/c (ipBlock except, narrow)", catches: []string{"ignore-ipblock-except"},
		policies: func(ip podIPs) []*networkingv1.NetworkPolicy {
			return pols(ingressOnly("x", "allow-a", pod("a"), from(ipBlock(net30(ip("z/c")), host(ip("z/c"))))))
		}},
	{name: "allow ingress to x/a on TCP 80 only", policies: func(podIPs) []*networkingv1.NetworkPolicy {
		return pols(ingressOnly("x", "allow-a", pod("a"), onPorts(tcp(80))))
	}},
	{name: "allow ingress to x/a on UDP 81 only", policies: func(podIPs) []*networkingv1.NetworkPolicy {
		return pols(ingressOnly("x", "allow-a", pod("a"), onPorts(udp(81))))
	}},
	{name: "allow ingress to x/a on the named port serve-81-tcp", catches: []string{"named-ports-unresolved"},
		policies: func(podIPs) []*networkingv1.NetworkPolicy {
			return pols(ingressOnly("x", "allow-a", pod("a"), onPorts(named("serve-81-tcp", corev1.ProtocolTCP))))
		}},
	{name: "allow ingress to x/a on the named port serve-80-udp, but as TCP (matches nothing)", policies: func(podIPs) []*networkingv1.NetworkPolicy {
		return pols(ingressOnly("x", "allow-a", pod("a"), onPorts(named("serve-80-udp", corev1.ProtocolTCP))))
	}},
	{name: "allow ingress to x/a on TCP 80-81 (endPort), from namespace z", policies: func(podIPs) []*networkingv1.NetworkPolicy {
		return pols(ingressOnly("x", "allow-a", pod("a"), rule(peers(peerNS("z")), ports(tcpRange(80, 81)))))
	}},
	{name: "allow egress from x/a to namespace y only", policies: func(podIPs) []*networkingv1.NetworkPolicy {
		return pols(egressOnly("x", "egress-a", pod("a"), to(peerNS("y"))))
	}},
	{name: "allow egress from x/a to namespace y on TCP 80 only", catches: []string{"egress-ignores-ports"},
		policies: func(podIPs) []*networkingv1.NetworkPolicy {
			return pols(egressOnly("x", "egress-a", pod("a"), egressRule(peers(peerNS("y")), ports(tcp(80)))))
		}},
	{name: "allow egress from x/a on the named port serve-81-udp", catches: []string{"named-ports-unresolved", "egress-ignores-ports"},
		policies: func(podIPs) []*networkingv1.NetworkPolicy {
			return pols(egressOnly("x", "egress-a", pod("a"), egressRule(nil, ports(named("serve-81-udp", corev1.ProtocolUDP)))))
		}},
	{name: "allow egress from x/a on UDP 80-81 (endPort) to pods b", catches: []string{"egress-ignores-ports"},
		policies: func(podIPs) []*networkingv1.NetworkPolicy {
			return pols(egressOnly("x", "egress-a", pod("a"), egressRule(peers(networkingv1.NetworkPolicyPeer{
				NamespaceSelector: &metav1.LabelSelector{}, PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{workloads.PodLabel: "b"}}}),
				ports(udpRange(80, 81)))))
		}},
	{name: "allow egress from x/a to everywhere except y/c (ipBlock except)", catches: []string{"ignore-ipblock-except"},
		policies: func(ip podIPs) []*networkingv1.NetworkPolicy {
			return pols(egressOnly("x", "egress-a", pod("a"), to(ipBlock("0.0.0.0/0", host(ip("y/c"))))))
		}},
	{name: "two policies select x/a: from namespace y, and from z/c; their union", policies: func(podIPs) []*networkingv1.NetworkPolicy {
		return pols(ingressOnly("x", "allow-a", pod("a"), from(peerNS("y"))),
			ingressOnly("x", "allow-a-2", pod("a"), from(peerNSPod("z", "c"))))
	}},
	{name: "a policy updated in place: allow-a now admits namespace z instead of y", policies: func(podIPs) []*networkingv1.NetworkPolicy {
		return pols(ingressOnly("x", "allow-a", pod("a"), from(peerNS("z"))),
			ingressOnly("x", "allow-a-2", pod("a"), from(peerNSPod("z", "c"))))
	}},
	{name: "deny all in x, then allow TCP 81 to x/b from anywhere", policies: func(podIPs) []*networkingv1.NetworkPolicy {
		return pols(ingressOnly("x", "deny-ingress", everyPod()),
			ingressOnly("x", "allow-b-81", pod("b"), onPorts(tcp(81))))
	}},
	{name: "y is isolated both ways and allows only itself", policies: func(podIPs) []*networkingv1.NetworkPolicy {
		self := peers(networkingv1.NetworkPolicyPeer{PodSelector: &metav1.LabelSelector{}})
		return pols(both("y", "only-y", everyPod(),
			[]networkingv1.NetworkPolicyIngressRule{{From: self}},
			[]networkingv1.NetworkPolicyEgressRule{{To: self}}))
	}},
	{name: "pods c of z admit only namespace x, on port 80 (both protocols)", policies: func(podIPs) []*networkingv1.NetworkPolicy {
		return pols(ingressOnly("z", "allow-c", pod("c"), rule(peers(peerNS("x")), ports(tcp(80), udp(80)))))
	}},
	{name: "deny all egress in z, and all ingress to x", policies: func(podIPs) []*networkingv1.NetworkPolicy {
		return pols(egressOnly("z", "deny-egress", everyPod()), ingressOnly("x", "deny-ingress", everyPod()))
	}},
	{name: "an empty ingress rule admits everything: x isolated, and open", policies: func(podIPs) []*networkingv1.NetworkPolicy {
		return pols(egressOnly("z", "deny-egress", everyPod()),
			ingressOnly("x", "allow-all", everyPod(), networkingv1.NetworkPolicyIngressRule{}))
	}},
	{name: "egress from y/b to TCP 81 of x and ingress to x/c from y only: both must hold", catches: []string{"egress-ignores-ports"},
		policies: func(podIPs) []*networkingv1.NetworkPolicy {
			return pols(egressOnly("y", "egress-b", pod("b"), egressRule(peers(peerNS("x")), ports(tcp(81)))),
				ingressOnly("x", "allow-c", pod("c"), from(peerNS("y"))))
		}},
	{name: "no policies: everything reaches everything again", policies: func(podIPs) []*networkingv1.NetworkPolicy {
		return nil
	}},
}

func pols(ps ...*networkingv1.NetworkPolicy) []*networkingv1.NetworkPolicy { return ps }

func everyPod() metav1.LabelSelector { return metav1.LabelSelector{} }

func pod(name string) metav1.LabelSelector {
	return metav1.LabelSelector{MatchLabels: map[string]string{workloads.PodLabel: name}}
}

// ingressOnly is a policy of type Ingress only, with the given rules (none: deny all).
func ingressOnly(ns, name string, sel metav1.LabelSelector, rules ...networkingv1.NetworkPolicyIngressRule) *networkingv1.NetworkPolicy {
	return &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: networkingv1.NetworkPolicySpec{PodSelector: sel, PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}, Ingress: rules}}
}

// egressOnly is a policy of type Egress only, with the given rules (none: deny all).
func egressOnly(ns, name string, sel metav1.LabelSelector, rules ...networkingv1.NetworkPolicyEgressRule) *networkingv1.NetworkPolicy {
	return &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: networkingv1.NetworkPolicySpec{PodSelector: sel, PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeEgress}, Egress: rules}}
}

// both is a policy of both types; its PolicyTypes are left for the API server to
// default (Ingress, and Egress because it has egress rules).
func both(ns, name string, sel metav1.LabelSelector, in []networkingv1.NetworkPolicyIngressRule, out []networkingv1.NetworkPolicyEgressRule) *networkingv1.NetworkPolicy {
	return &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: networkingv1.NetworkPolicySpec{PodSelector: sel, Ingress: in, Egress: out}}
}

func from(ps ...networkingv1.NetworkPolicyPeer) networkingv1.NetworkPolicyIngressRule {
	return networkingv1.NetworkPolicyIngressRule{From: ps}
}

func to(ps ...networkingv1.NetworkPolicyPeer) networkingv1.NetworkPolicyEgressRule {
	return networkingv1.NetworkPolicyEgressRule{To: ps}
}

func ports(ps ...networkingv1.NetworkPolicyPort) []networkingv1.NetworkPolicyPort { return ps }

func peers(ps ...networkingv1.NetworkPolicyPeer) []networkingv1.NetworkPolicyPeer { return ps }

func rule(from []networkingv1.NetworkPolicyPeer, ports []networkingv1.NetworkPolicyPort) networkingv1.NetworkPolicyIngressRule {
	return networkingv1.NetworkPolicyIngressRule{From: from, Ports: ports}
}

func egressRule(to []networkingv1.NetworkPolicyPeer, ports []networkingv1.NetworkPolicyPort) networkingv1.NetworkPolicyEgressRule {
	return networkingv1.NetworkPolicyEgressRule{To: to, Ports: ports}
}

// onPorts is an ingress rule from any peer on the given ports.
func onPorts(ps ...networkingv1.NetworkPolicyPort) networkingv1.NetworkPolicyIngressRule {
	return networkingv1.NetworkPolicyIngressRule{Ports: ps}
}

func peerNS(ns string) networkingv1.NetworkPolicyPeer {
	return networkingv1.NetworkPolicyPeer{NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{workloads.NamespaceLabel: ns}}}
}

func peerPod(name string) networkingv1.NetworkPolicyPeer {
	return networkingv1.NetworkPolicyPeer{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{workloads.PodLabel: name}}}
}

func peerNSPod(ns, name string) networkingv1.NetworkPolicyPeer {
	p := peerNS(ns)
	p.PodSelector = peerPod(name).PodSelector
	return p
}

func ipBlock(cidr string, except ...string) networkingv1.NetworkPolicyPeer {
	return networkingv1.NetworkPolicyPeer{IPBlock: &networkingv1.IPBlock{CIDR: cidr, Except: except}}
}

func host(ip netip.Addr) string { return netip.PrefixFrom(ip, ip.BitLen()).String() }

// net30 is the /30 that holds ip: a block with neighbours of ip in it.
func net30(ip netip.Addr) string { return netip.PrefixFrom(ip, 30).Masked().String() }

func portOf(proto corev1.Protocol, port intstr.IntOrString, end *int32) networkingv1.NetworkPolicyPort {
	return networkingv1.NetworkPolicyPort{Protocol: &proto, Port: &port, EndPort: end}
}

func tcp(p int32) networkingv1.NetworkPolicyPort {
	return portOf(corev1.ProtocolTCP, intstr.FromInt32(p), nil)
}

func udp(p int32) networkingv1.NetworkPolicyPort {
	return portOf(corev1.ProtocolUDP, intstr.FromInt32(p), nil)
}

func tcpRange(p, end int32) networkingv1.NetworkPolicyPort {
	return portOf(corev1.ProtocolTCP, intstr.FromInt32(p), &end)
}

func udpRange(p, end int32) networkingv1.NetworkPolicyPort {
	return portOf(corev1.ProtocolUDP, intstr.FromInt32(p), &end)
}

func named(name string, proto corev1.Protocol) networkingv1.NetworkPolicyPort {
	return portOf(proto, intstr.FromString(name), nil)
}

// caseLabel numbers a case for its check's name: "case 07: ...".
func caseLabel(i int, c policyCase) string { return fmt.Sprintf("case %02d: %s", i+1, c.name) }
