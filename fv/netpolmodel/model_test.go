package netpolmodel_test

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/dpconform/dpconform/fv/netpolmodel"
	"github.com/dpconform/dpconform/fv/workloads"
)

// fixture is the netpol fixture as the model sees it: namespaces x, y, z labelled
// ns=<name>, pods a, b, c labelled pod=<name>, each declaring the fixture's named
// ports; pod j of namespace i has the IP 10.0.i.(j+1).
func fixture() netpolmodel.Cluster {
	var c netpolmodel.Cluster
	for i, ns := range workloads.NetpolNamespaces {
		c.Namespaces = append(c.Namespaces, netpolmodel.Namespace{Name: ns, Labels: map[string]string{workloads.NamespaceLabel: ns}})
		for j, name := range workloads.NetpolPods {
			var ports []corev1.ContainerPort
			for _, n := range workloads.NetpolPorts {
				for _, proto := range []corev1.Protocol{corev1.ProtocolTCP, corev1.ProtocolUDP} {
					ports = append(ports, corev1.ContainerPort{Name: workloads.NetpolPortName(n, proto), ContainerPort: n, Protocol: proto})
				}
			}
			c.Pods = append(c.Pods, netpolmodel.Pod{
				Namespace: ns, Name: name,
				Labels: map[string]string{workloads.PodLabel: name},
				IP:     netip.AddrFrom4([4]byte{10, 0, byte(i), byte(j + 1)}),
				Ports:  ports,
			})
		}
	}
	return c
}

var (
	fixturePorts = netpolmodel.Ports(workloads.NetpolPorts, corev1.ProtocolTCP, corev1.ProtocolUDP)

	tcp80  = netpolmodel.Port{Port: 80, Protocol: corev1.ProtocolTCP}
	tcp81  = netpolmodel.Port{Port: 81, Protocol: corev1.ProtocolTCP}
	udp80  = netpolmodel.Port{Port: 80, Protocol: corev1.ProtocolUDP}
	udp81  = netpolmodel.Port{Port: 81, Protocol: corev1.ProtocolUDP}
	sctp80 = netpolmodel.Port{Port: 80, Protocol: corev1.ProtocolSCTP}
)

// Builders, so that each case reads like the policy it is.

func policy(ns, name string, pods *metav1.LabelSelector, spec networkingv1.NetworkPolicySpec) networkingv1.NetworkPolicy {
	if pods != nil {
		spec.PodSelector = *pods
	}
	return networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: spec}
}

func all() *metav1.LabelSelector { return &metav1.LabelSelector{} }

func podLabel(name string) *metav1.LabelSelector {
	return &metav1.LabelSelector{MatchLabels: map[string]string{workloads.PodLabel: name}}
}

func nsLabel(name string) *metav1.LabelSelector {
	return &metav1.LabelSelector{MatchLabels: map[string]string{workloads.NamespaceLabel: name}}
}

func types(ts ...networkingv1.PolicyType) []networkingv1.PolicyType { return ts }

func proto(p corev1.Protocol) *corev1.Protocol { return &p }

func num(n int32) *intstr.IntOrString { v := intstr.FromInt32(n); return &v }

func named(name string) *intstr.IntOrString { v := intstr.FromString(name); return &v }

func portOf(p corev1.Protocol, port *intstr.IntOrString) networkingv1.NetworkPolicyPort {
	return networkingv1.NetworkPolicyPort{Protocol: proto(p), Port: port}
}

func rangeOf(p corev1.Protocol, from, to int32) networkingv1.NetworkPolicyPort {
	return networkingv1.NetworkPolicyPort{Protocol: proto(p), Port: num(from), EndPort: &to}
}

func from(peers ...networkingv1.NetworkPolicyPeer) networkingv1.NetworkPolicyIngressRule {
	return networkingv1.NetworkPolicyIngressRule{From: peers}
}

func to(peers ...networkingv1.NetworkPolicyPeer) networkingv1.NetworkPolicyEgressRule {
	return networkingv1.NetworkPolicyEgressRule{To: peers}
}

func pods(sel *metav1.LabelSelector) networkingv1.NetworkPolicyPeer {
	return networkingv1.NetworkPolicyPeer{PodSelector: sel}
}

func namespaces(sel *metav1.LabelSelector) networkingv1.NetworkPolicyPeer {
	return networkingv1.NetworkPolicyPeer{NamespaceSelector: sel}
}

func podsIn(ns, pod *metav1.LabelSelector) networkingv1.NetworkPolicyPeer {
	return networkingv1.NetworkPolicyPeer{NamespaceSelector: ns, PodSelector: pod}
}

func block(cidr string, except ...string) networkingv1.NetworkPolicyPeer {
	return networkingv1.NetworkPolicyPeer{IPBlock: &networkingv1.IPBlock{CIDR: cidr, Except: except}}
}

// cell is one expectation of a case: the verdict of a connection and words its
// reason must contain.
type cell struct {
	from, to string
	port     netpolmodel.Port
	allowed  bool
	reason   string
}

func TestAllowed(t *testing.T) {
	tests := []struct {
		name     string
		policies []networkingv1.NetworkPolicy
		cluster  func(*netpolmodel.Cluster) // changes to the fixture, if any
		denied   int                        // cells of the fixture's matrix denied
		cells    []cell
	}{{
		name:   "no policies allow everything",
		denied: 0,
		cells: []cell{
			{"x/a", "y/b", tcp80, true, "x/a egress not isolated; y/b ingress not isolated"},
			{"z/c", "z/a", udp81, true, "z/c egress not isolated; z/a ingress not isolated"},
		},
	}, {
		name:     "default deny ingress isolates a namespace's pods for ingress only",
		policies: []networkingv1.NetworkPolicy{policy("x", "deny-ingress", all(), networkingv1.NetworkPolicySpec{})},
		denied:   24 * 4, // into x, from the 8 others
		cells: []cell{
			{"y/a", "x/b", tcp80, false, "x/b ingress isolated by [x/deny-ingress], no rule allows y/a -> x/b TCP/80"},
			{"x/a", "x/b", udp81, false, "x/b ingress isolated by [x/deny-ingress]"},
			{"x/a", "y/a", tcp80, true, "x/a egress not isolated; y/a ingress not isolated"},
		},
	}, {
		name:     "default deny egress needs policyTypes",
		policies: []networkingv1.NetworkPolicy{policy("x", "deny-egress", all(), networkingv1.NetworkPolicySpec{PolicyTypes: types(networkingv1.PolicyTypeEgress)})},
		denied:   24 * 4, // out of x
		cells: []cell{
			{"x/a", "y/b", tcp80, false, "x/a egress isolated by [x/deny-egress], no rule allows x/a -> y/b TCP/80"},
			{"y/a", "x/a", tcp80, true, "x/a ingress not isolated"},
		},
	}, {
		name: "default deny both directions",
		policies: []networkingv1.NetworkPolicy{policy("x", "deny-all", all(), networkingv1.NetworkPolicySpec{
			PolicyTypes: types(networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress)})},
		denied: (24 + 24 - 6) * 4, // into or out of x, the 6 pairs within x once
		cells: []cell{
			{"x/a", "x/b", tcp80, false, "x/a egress isolated by [x/deny-all], no rule allows x/a -> x/b TCP/80; x/b ingress isolated by [x/deny-all]"},
			{"y/a", "z/a", tcp80, true, "not isolated"},
		},
	}, {
		name: "a label podSelector isolates only the pods it selects",
		policies: []networkingv1.NetworkPolicy{policy("x", "deny-a", podLabel("a"), networkingv1.NetworkPolicySpec{
			PolicyTypes: types(networkingv1.PolicyTypeIngress)})},
		denied: 8 * 4,
		cells: []cell{
			{"x/b", "x/a", tcp80, false, "x/a ingress isolated by [x/deny-a]"},
			{"x/a", "x/b", tcp80, true, "x/b ingress not isolated"},
			{"x/c", "y/a", tcp80, true, "y/a ingress not isolated"}, // the same labels in another namespace
		},
	}, {
		name: "policyTypes defaulted from egress rules isolate for both",
		policies: []networkingv1.NetworkPolicy{policy("x", "egress-to-b", all(), networkingv1.NetworkPolicySpec{
			Egress: []networkingv1.NetworkPolicyEgressRule{to(pods(podLabel("b")))}})},
		denied: (24 + 24 - 6) * 4, // x's ingress is isolated with no rule; its egress reaches only x/b
		cells: []cell{
			{"x/a", "x/b", tcp80, false, "x/b ingress isolated by [x/egress-to-b]"},
			{"x/a", "y/b", tcp80, false, "x/a egress isolated by [x/egress-to-b], no rule allows x/a -> y/b TCP/80"},
			{"y/a", "x/b", tcp80, false, "x/b ingress isolated"},
		},
	}, {
		name: "explicit policyTypes Egress ignore the ingress rules",
		policies: []networkingv1.NetworkPolicy{policy("x", "egress-to-y", all(), networkingv1.NetworkPolicySpec{
			PolicyTypes: types(networkingv1.PolicyTypeEgress),
			Ingress:     []networkingv1.NetworkPolicyIngressRule{{}},
			Egress:      []networkingv1.NetworkPolicyEgressRule{to(namespaces(nsLabel("y")))}})},
		denied: 3 * 5 * 4, // each x pod, to the 2 others in x and the 3 in z
		cells: []cell{
			{"x/a", "y/c", udp80, true, "x/a egress allowed by x/egress-to-y egress[0]; y/c ingress not isolated"},
			{"x/a", "z/a", tcp80, false, "x/a egress isolated by [x/egress-to-y]"},
			{"y/a", "x/a", tcp80, true, "x/a ingress not isolated"},
		},
	}, {
		name: "an empty rule allows everything",
		policies: []networkingv1.NetworkPolicy{policy("x", "allow-all", all(), networkingv1.NetworkPolicySpec{
			Ingress: []networkingv1.NetworkPolicyIngressRule{{}}})},
		denied: 0,
		cells:  []cell{{"z/c", "x/a", udp81, true, "x/a ingress allowed by x/allow-all ingress[0]"}},
	}, {
		name: "allow from a namespace",
		policies: []networkingv1.NetworkPolicy{policy("x", "from-y", all(), networkingv1.NetworkPolicySpec{
			Ingress: []networkingv1.NetworkPolicyIngressRule{from(namespaces(nsLabel("y")))}})},
		denied: (6 + 9) * 4, // into x, from x and z
		cells: []cell{
			{"y/a", "x/a", tcp80, true, "x/a ingress allowed by x/from-y ingress[0]"},
			{"z/a", "x/a", tcp80, false, "x/a ingress isolated by [x/from-y], no rule allows z/a -> x/a TCP/80"},
			{"x/b", "x/a", tcp80, false, "x/a ingress isolated by [x/from-y]"},
		},
	}, {
		name: "allow from pod labels is within the policy's namespace",
		policies: []networkingv1.NetworkPolicy{policy("x", "a-from-b", podLabel("a"), networkingv1.NetworkPolicySpec{
			Ingress: []networkingv1.NetworkPolicyIngressRule{from(pods(podLabel("b")))}})},
		denied: 7 * 4,
		cells: []cell{
			{"x/b", "x/a", tcp81, true, "x/a ingress allowed by x/a-from-b ingress[0]"},
			{"y/b", "x/a", tcp80, false, "x/a ingress isolated by [x/a-from-b]"},
			{"x/c", "x/a", tcp80, false, "x/a ingress isolated by [x/a-from-b]"},
		},
	}, {
		name: "namespace and pod selectors in one peer select their intersection",
		policies: []networkingv1.NetworkPolicy{policy("x", "a-from-y-b", podLabel("a"), networkingv1.NetworkPolicySpec{
			Ingress: []networkingv1.NetworkPolicyIngressRule{from(podsIn(nsLabel("y"), podLabel("b")))}})},
		denied: 7 * 4,
		cells: []cell{
			{"y/b", "x/a", tcp80, true, "allowed by x/a-from-y-b ingress[0]"},
			{"y/a", "x/a", tcp80, false, "isolated by [x/a-from-y-b]"},
			{"x/b", "x/a", tcp80, false, "isolated by [x/a-from-y-b]"},
		},
	}, {
		name: "namespace and pod selectors in two peers select their union",
		policies: []networkingv1.NetworkPolicy{policy("x", "a-from-y-or-b", podLabel("a"), networkingv1.NetworkPolicySpec{
			Ingress: []networkingv1.NetworkPolicyIngressRule{from(namespaces(nsLabel("y")), pods(podLabel("b")))}})},
		denied: 4 * 4, // x/c and z/*
		cells: []cell{
			{"x/b", "x/a", tcp80, true, "allowed by x/a-from-y-or-b ingress[0]"},
			{"y/c", "x/a", tcp80, true, "allowed by x/a-from-y-or-b ingress[0]"},
			{"z/b", "x/a", tcp80, false, "isolated by [x/a-from-y-or-b]"},
		},
	}, {
		name: "an empty namespaceSelector with a podSelector selects those pods everywhere",
		policies: []networkingv1.NetworkPolicy{policy("x", "a-from-any-b", podLabel("a"), networkingv1.NetworkPolicySpec{
			Ingress: []networkingv1.NetworkPolicyIngressRule{from(podsIn(all(), podLabel("b")))}})},
		denied: 5 * 4,
		cells: []cell{
			{"z/b", "x/a", tcp80, true, "allowed by x/a-from-any-b ingress[0]"},
			{"z/a", "x/a", tcp80, false, "isolated by [x/a-from-any-b]"},
		},
	}, {
		name: "namespaces by the kubernetes.io/metadata.name label",
		policies: []networkingv1.NetworkPolicy{policy("x", "a-from-z", podLabel("a"), networkingv1.NetworkPolicySpec{
			Ingress: []networkingv1.NetworkPolicyIngressRule{from(namespaces(&metav1.LabelSelector{
				MatchLabels: map[string]string{"kubernetes.io/metadata.name": "z"}}))}})},
		denied: 5 * 4,
		cells: []cell{
			{"z/c", "x/a", tcp80, true, "allowed by x/a-from-z ingress[0]"},
			{"y/a", "x/a", tcp80, false, "isolated by [x/a-from-z]"},
		},
	}, {
		name: "namespaces by a NotIn expression",
		policies: []networkingv1.NetworkPolicy{policy("x", "not-from-x", all(), networkingv1.NetworkPolicySpec{
			Ingress: []networkingv1.NetworkPolicyIngressRule{from(namespaces(&metav1.LabelSelector{
				MatchExpressions: []metav1.LabelSelectorRequirement{{Key: workloads.NamespaceLabel, Operator: metav1.LabelSelectorOpNotIn, Values: []string{"x"}}}}))}})},
		denied: 6 * 4, // within x
		cells: []cell{
			{"x/a", "x/b", tcp80, false, "isolated by [x/not-from-x]"},
			{"y/a", "x/b", tcp80, true, "allowed by x/not-from-x ingress[0]"},
		},
	}, {
		name: "ipBlock with except, on pod IPs",
		policies: []networkingv1.NetworkPolicy{policy("x", "a-from-cidr", podLabel("a"), networkingv1.NetworkPolicySpec{
			Ingress: []networkingv1.NetworkPolicyIngressRule{from(block("10.0.0.0/16", "10.0.1.0/24"))}})},
		denied: 3 * 4, // from y
		cells: []cell{
			{"y/b", "x/a", tcp80, false, "x/a ingress isolated by [x/a-from-cidr], no rule allows y/b -> x/a TCP/80"},
			{"z/a", "x/a", udp80, true, "allowed by x/a-from-cidr ingress[0]"},
			{"x/b", "x/a", tcp81, true, "allowed by x/a-from-cidr ingress[0]"},
		},
	}, {
		name: "ipBlock of another family matches no pod",
		policies: []networkingv1.NetworkPolicy{policy("x", "a-from-v6", podLabel("a"), networkingv1.NetworkPolicySpec{
			Ingress: []networkingv1.NetworkPolicyIngressRule{from(block("::/0"))}})},
		denied: 8 * 4,
		cells:  []cell{{"y/b", "x/a", tcp80, false, "isolated by [x/a-from-v6]"}},
	}, {
		name: "egress to a /32 ipBlock",
		policies: []networkingv1.NetworkPolicy{policy("x", "a-to-zb", podLabel("a"), networkingv1.NetworkPolicySpec{
			PolicyTypes: types(networkingv1.PolicyTypeEgress),
			Egress:      []networkingv1.NetworkPolicyEgressRule{to(block("10.0.2.2/32"))}})},
		denied: 7 * 4,
		cells: []cell{
			{"x/a", "z/b", udp81, true, "x/a egress allowed by x/a-to-zb egress[0]"},
			{"x/a", "z/c", tcp80, false, "x/a egress isolated by [x/a-to-zb], no rule allows x/a -> z/c TCP/80"},
		},
	}, {
		name: "ingress on a named port, protocol defaulted to TCP",
		policies: []networkingv1.NetworkPolicy{policy("x", "a-on-serve-80-tcp", podLabel("a"), networkingv1.NetworkPolicySpec{
			Ingress: []networkingv1.NetworkPolicyIngressRule{{Ports: []networkingv1.NetworkPolicyPort{{Port: named("serve-80-tcp")}}}}})},
		denied: 8 * 3,
		cells: []cell{
			{"y/a", "x/a", tcp80, true, "allowed by x/a-on-serve-80-tcp ingress[0]"},
			{"y/a", "x/a", udp80, false, "no rule allows y/a -> x/a UDP/80"},
			{"y/a", "x/a", tcp81, false, "no rule allows y/a -> x/a TCP/81"},
		},
	}, {
		name: "a named port of another protocol than the rule's matches nothing",
		policies: []networkingv1.NetworkPolicy{policy("x", "a-on-serve-80-udp-tcp", podLabel("a"), networkingv1.NetworkPolicySpec{
			Ingress: []networkingv1.NetworkPolicyIngressRule{{Ports: []networkingv1.NetworkPolicyPort{{Port: named("serve-80-udp")}}}}})},
		denied: 8 * 4,
		cells: []cell{
			{"y/a", "x/a", udp80, false, "no rule allows y/a -> x/a UDP/80"},
			{"y/a", "x/a", tcp80, false, "no rule allows y/a -> x/a TCP/80"},
		},
	}, {
		name: "a named UDP port",
		policies: []networkingv1.NetworkPolicy{policy("x", "a-on-serve-80-udp", podLabel("a"), networkingv1.NetworkPolicySpec{
			Ingress: []networkingv1.NetworkPolicyIngressRule{{Ports: []networkingv1.NetworkPolicyPort{portOf(corev1.ProtocolUDP, named("serve-80-udp"))}}}})},
		denied: 8 * 3,
		cells: []cell{
			{"y/a", "x/a", udp80, true, "allowed by x/a-on-serve-80-udp ingress[0]"},
			{"y/a", "x/a", tcp80, false, "isolated by [x/a-on-serve-80-udp]"},
		},
	}, {
		name: "a named port the pod does not declare matches nothing",
		policies: []networkingv1.NetworkPolicy{policy("x", "a-on-serve-82-tcp", podLabel("a"), networkingv1.NetworkPolicySpec{
			Ingress: []networkingv1.NetworkPolicyIngressRule{{Ports: []networkingv1.NetworkPolicyPort{{Port: named("serve-82-tcp")}}}}})},
		denied: 8 * 4,
		cells:  []cell{{"x/b", "x/a", tcp80, false, "isolated by [x/a-on-serve-82-tcp]"}},
	}, {
		// y/b and x/c declare serve-81-tcp on 80: a name resolves on the
		// destination, in the ingress rule of its own policy and the egress rule of
		// its peer's alike.
		name: "named ports resolve against the destination pod",
		cluster: func(c *netpolmodel.Cluster) {
			for i := range c.Pods {
				if id := c.Pods[i].ID(); id != "y/b" && id != "x/c" {
					continue
				}
				for j := range c.Pods[i].Ports {
					if c.Pods[i].Ports[j].Name == "serve-81-tcp" {
						c.Pods[i].Ports[j].ContainerPort = 80
					}
				}
			}
		},
		policies: []networkingv1.NetworkPolicy{
			policy("x", "a-to-serve-81-tcp", podLabel("a"), networkingv1.NetworkPolicySpec{
				PolicyTypes: types(networkingv1.PolicyTypeEgress),
				Egress:      []networkingv1.NetworkPolicyEgressRule{{Ports: []networkingv1.NetworkPolicyPort{{Port: named("serve-81-tcp")}}}}}),
			policy("x", "c-on-serve-81-tcp", podLabel("c"), networkingv1.NetworkPolicySpec{
				Ingress: []networkingv1.NetworkPolicyIngressRule{{Ports: []networkingv1.NetworkPolicyPort{{Port: named("serve-81-tcp")}}}}}),
		},
		// Out of x/a, 8 destinations on 3 ports each; into x/c, 8 sources on 3
		// ports each; 3 cells (x/a -> x/c on all but TCP/80) are both.
		denied: 8*3 + 8*3 - 3,
		cells: []cell{
			{"x/a", "y/b", tcp80, true, "x/a egress allowed by x/a-to-serve-81-tcp egress[0]"},
			{"x/a", "y/b", tcp81, false, "x/a egress isolated by [x/a-to-serve-81-tcp]"},
			{"x/a", "y/a", tcp81, true, "x/a egress allowed by x/a-to-serve-81-tcp egress[0]"},
			{"y/a", "x/c", tcp80, true, "x/c ingress allowed by x/c-on-serve-81-tcp ingress[0]"},
			{"y/a", "x/c", tcp81, false, "x/c ingress isolated by [x/c-on-serve-81-tcp]"},
			{"x/a", "x/c", tcp80, true, "x/a egress allowed by x/a-to-serve-81-tcp egress[0]; x/c ingress allowed by x/c-on-serve-81-tcp ingress[0]"},
		},
	}, {
		name: "a port range includes both ends",
		policies: []networkingv1.NetworkPolicy{policy("x", "a-on-80-81", podLabel("a"), networkingv1.NetworkPolicySpec{
			Ingress: []networkingv1.NetworkPolicyIngressRule{{Ports: []networkingv1.NetworkPolicyPort{rangeOf(corev1.ProtocolTCP, 80, 81)}}}})},
		denied: 8 * 2,
		cells: []cell{
			{"y/a", "x/a", tcp80, true, "allowed by x/a-on-80-81 ingress[0]"},
			{"y/a", "x/a", tcp81, true, "allowed by x/a-on-80-81 ingress[0]"},
			{"y/a", "x/a", udp81, false, "isolated by [x/a-on-80-81]"},
		},
	}, {
		name: "a port range excludes what is below it",
		policies: []networkingv1.NetworkPolicy{policy("x", "a-on-81-90", podLabel("a"), networkingv1.NetworkPolicySpec{
			Ingress: []networkingv1.NetworkPolicyIngressRule{{Ports: []networkingv1.NetworkPolicyPort{rangeOf(corev1.ProtocolUDP, 81, 90)}}}})},
		denied: 8 * 3,
		cells: []cell{
			{"y/a", "x/a", udp81, true, "allowed by x/a-on-81-90 ingress[0]"},
			{"y/a", "x/a", udp80, false, "isolated by [x/a-on-81-90]"},
			{"y/a", "x/a", netpolmodel.Port{Port: 90, Protocol: corev1.ProtocolUDP}, true, "allowed"},
			{"y/a", "x/a", netpolmodel.Port{Port: 91, Protocol: corev1.ProtocolUDP}, false, "isolated"},
		},
	}, {
		name: "egress to another namespace on one port",
		policies: []networkingv1.NetworkPolicy{policy("x", "to-y-80", all(), networkingv1.NetworkPolicySpec{
			PolicyTypes: types(networkingv1.PolicyTypeEgress),
			Egress: []networkingv1.NetworkPolicyEgressRule{{
				To: []networkingv1.NetworkPolicyPeer{namespaces(nsLabel("y"))}, Ports: []networkingv1.NetworkPolicyPort{portOf(corev1.ProtocolTCP, num(80))}}}})},
		denied: 3 * (8*4 - 3), // each x pod allowed only to y's three on TCP/80
		cells: []cell{
			{"x/b", "y/c", tcp80, true, "x/b egress allowed by x/to-y-80 egress[0]"},
			{"x/b", "y/c", udp80, false, "x/b egress isolated by [x/to-y-80], no rule allows x/b -> y/c UDP/80"},
			{"x/b", "z/c", tcp80, false, "x/b egress isolated by [x/to-y-80]"},
		},
	}, {
		name: "policies selecting a pod allow the union of their rules",
		policies: []networkingv1.NetworkPolicy{
			policy("x", "a-from-b-80", podLabel("a"), networkingv1.NetworkPolicySpec{
				Ingress: []networkingv1.NetworkPolicyIngressRule{{
					From: []networkingv1.NetworkPolicyPeer{pods(podLabel("b"))}, Ports: []networkingv1.NetworkPolicyPort{portOf(corev1.ProtocolTCP, num(80))}}}}),
			policy("x", "a-from-y-udp-81", podLabel("a"), networkingv1.NetworkPolicySpec{
				Ingress: []networkingv1.NetworkPolicyIngressRule{{
					From: []networkingv1.NetworkPolicyPeer{namespaces(nsLabel("y"))}, Ports: []networkingv1.NetworkPolicyPort{portOf(corev1.ProtocolUDP, num(81))}}}}),
		},
		denied: 8*4 - 1 - 3,
		cells: []cell{
			{"x/b", "x/a", tcp80, true, "allowed by x/a-from-b-80 ingress[0]"},
			{"y/a", "x/a", udp81, true, "allowed by x/a-from-y-udp-81 ingress[0]"},
			{"x/b", "x/a", udp81, false, "x/a ingress isolated by [x/a-from-b-80 x/a-from-y-udp-81], no rule allows x/b -> x/a UDP/81"},
			{"y/a", "x/a", tcp80, false, "isolated by [x/a-from-b-80 x/a-from-y-udp-81]"},
		},
	}, {
		name: "deny all, then allow one port",
		policies: []networkingv1.NetworkPolicy{
			policy("x", "deny-all", all(), networkingv1.NetworkPolicySpec{}),
			policy("x", "allow-81", all(), networkingv1.NetworkPolicySpec{
				Ingress: []networkingv1.NetworkPolicyIngressRule{{Ports: []networkingv1.NetworkPolicyPort{portOf(corev1.ProtocolTCP, num(81))}}}}),
		},
		denied: 24 * 3,
		cells: []cell{
			{"z/b", "x/c", tcp81, true, "x/c ingress allowed by x/allow-81 ingress[0]"},
			{"z/b", "x/c", tcp80, false, "x/c ingress isolated by [x/deny-all x/allow-81]"},
		},
	}, {
		name: "both ends isolated must both allow",
		policies: []networkingv1.NetworkPolicy{
			policy("x", "a-to-yb-80", podLabel("a"), networkingv1.NetworkPolicySpec{
				PolicyTypes: types(networkingv1.PolicyTypeEgress),
				Egress: []networkingv1.NetworkPolicyEgressRule{{
					To: []networkingv1.NetworkPolicyPeer{podsIn(nsLabel("y"), podLabel("b"))}, Ports: []networkingv1.NetworkPolicyPort{portOf(corev1.ProtocolTCP, num(80))}}}}),
			policy("y", "b-from-xa", podLabel("b"), networkingv1.NetworkPolicySpec{
				Ingress: []networkingv1.NetworkPolicyIngressRule{from(podsIn(nsLabel("x"), podLabel("a")))}}),
		},
		denied: (8*4 - 1) + 7*4, // out of x/a but TCP/80 to y/b; into y/b from the 7 others
		cells: []cell{
			{"x/a", "y/b", tcp80, true, "x/a egress allowed by x/a-to-yb-80 egress[0]; y/b ingress allowed by y/b-from-xa ingress[0]"},
			{"x/a", "y/b", tcp81, false, "x/a egress isolated by [x/a-to-yb-80], no rule allows x/a -> y/b TCP/81"},
			{"x/b", "y/b", tcp80, false, "y/b ingress isolated by [y/b-from-xa], no rule allows x/b -> y/b TCP/80"},
		},
	}, {
		name: "a rule with ports and no peers allows every peer on them",
		policies: []networkingv1.NetworkPolicy{policy("x", "a-out-udp-81", podLabel("a"), networkingv1.NetworkPolicySpec{
			PolicyTypes: types(networkingv1.PolicyTypeEgress),
			Egress:      []networkingv1.NetworkPolicyEgressRule{{Ports: []networkingv1.NetworkPolicyPort{portOf(corev1.ProtocolUDP, num(81))}}}})},
		denied: 8 * 3,
		cells: []cell{
			{"x/a", "z/c", udp81, true, "x/a egress allowed by x/a-out-udp-81 egress[0]"},
			{"x/a", "z/c", tcp81, false, "x/a egress isolated by [x/a-out-udp-81]"},
		},
	}, {
		name: "a protocol without a port allows all its ports",
		policies: []networkingv1.NetworkPolicy{policy("x", "a-on-udp", podLabel("a"), networkingv1.NetworkPolicySpec{
			Ingress: []networkingv1.NetworkPolicyIngressRule{{Ports: []networkingv1.NetworkPolicyPort{{Protocol: proto(corev1.ProtocolUDP)}}}}})},
		denied: 8 * 2,
		cells: []cell{
			{"y/a", "x/a", udp80, true, "allowed by x/a-on-udp ingress[0]"},
			{"y/a", "x/a", tcp81, false, "isolated by [x/a-on-udp]"},
		},
	}, {
		name: "SCTP like any protocol",
		policies: []networkingv1.NetworkPolicy{policy("x", "a-on-sctp-80", podLabel("a"), networkingv1.NetworkPolicySpec{
			Ingress: []networkingv1.NetworkPolicyIngressRule{{Ports: []networkingv1.NetworkPolicyPort{portOf(corev1.ProtocolSCTP, num(80))}}}})},
		denied: 8 * 4,
		cells: []cell{
			{"y/a", "x/a", sctp80, true, "allowed by x/a-on-sctp-80 ingress[0]"},
			{"y/a", "x/a", tcp80, false, "no rule allows y/a -> x/a TCP/80"},
		},
	}, {
		name: "a port without protocol is TCP",
		policies: []networkingv1.NetworkPolicy{policy("x", "a-on-80", podLabel("a"), networkingv1.NetworkPolicySpec{
			Ingress: []networkingv1.NetworkPolicyIngressRule{{Ports: []networkingv1.NetworkPolicyPort{{Port: num(80)}}}}})},
		denied: 8 * 3,
		cells: []cell{
			{"y/a", "x/a", netpolmodel.Port{Port: 80}, true, "allowed by x/a-on-80 ingress[0]"},
			{"y/a", "x/a", udp80, false, "no rule allows y/a -> x/a UDP/80"},
		},
	}, {
		name: "a policy selects only in its own namespace",
		policies: []networkingv1.NetworkPolicy{policy("y", "deny-a", podLabel("a"), networkingv1.NetworkPolicySpec{
			PolicyTypes: types(networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress)})},
		denied: (8 + 8) * 4, // into and out of y/a
		cells: []cell{
			{"x/b", "x/a", tcp80, true, "not isolated"},
			{"y/a", "y/b", tcp80, false, "y/a egress isolated by [y/deny-a]"},
		},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := fixture()
			if tt.cluster != nil {
				tt.cluster(&c)
			}
			if err := netpolmodel.Validate(tt.policies); err != nil {
				t.Fatalf("the case's policies: %v", err)
			}
			for _, want := range tt.cells {
				src, ok := c.Pod(want.from)
				dst, ok2 := c.Pod(want.to)
				if !ok || !ok2 {
					t.Fatalf("no pod %s or %s", want.from, want.to)
				}
				allowed, reason := c.Allowed(tt.policies, src, dst, want.port)
				if allowed != want.allowed {
					t.Errorf("%s -> %s %s: allowed %v, want %v (%s)", want.from, want.to, want.port, allowed, want.allowed, reason)
				}
				if !strings.Contains(reason, want.reason) {
					t.Errorf("%s -> %s %s: reason %q, want it to contain %q", want.from, want.to, want.port, reason, want.reason)
				}
			}
			m := c.Expected(tt.policies, fixturePorts)
			denied := 0
			for _, port := range m.Ports {
				for _, from := range m.Pods {
					for _, to := range m.Pods {
						if allowed, known := m.Get(from, to, port); known && !allowed {
							denied++
						}
					}
				}
			}
			if denied != tt.denied {
				t.Errorf("%d cells denied, want %d:\n%s", denied, tt.denied, netpolmodel.Render(m, nil))
			}
		})
	}
}

func TestPortString(t *testing.T) {
	for _, tt := range []struct {
		port netpolmodel.Port
		want string
	}{
		{tcp80, "TCP/80"},
		{udp81, "UDP/81"},
		{netpolmodel.Port{Port: 8080}, "TCP/8080"},
	} {
		if got := tt.port.String(); got != tt.want {
			t.Errorf("%#v: %q, want %q", tt.port, got, tt.want)
		}
	}
	got := fmt.Sprint(netpolmodel.Ports([]int32{80, 81}, corev1.ProtocolTCP, corev1.ProtocolUDP))
	if want := "[TCP/80 TCP/81 UDP/80 UDP/81]"; got != want {
		t.Errorf("Ports: %s, want %s", got, want)
	}
}

func TestValidate(t *testing.T) {
	end := int32(79)
	tests := []struct {
		name   string
		policy networkingv1.NetworkPolicy
		want   string // "" for valid
	}{
		{"valid", policy("x", "ok", all(), networkingv1.NetworkPolicySpec{
			Ingress: []networkingv1.NetworkPolicyIngressRule{from(block("10.0.0.0/16", "10.0.1.0/24"))}}), ""},
		{"no namespace", policy("", "p", all(), networkingv1.NetworkPolicySpec{}), "policy p: no namespace"},
		{"empty peer", policy("x", "p", all(), networkingv1.NetworkPolicySpec{
			Ingress: []networkingv1.NetworkPolicyIngressRule{from(networkingv1.NetworkPolicyPeer{})}}), "ingress[0].from[0]: no podSelector"},
		{"ipBlock with a selector", policy("x", "p", all(), networkingv1.NetworkPolicySpec{
			Egress: []networkingv1.NetworkPolicyEgressRule{to(networkingv1.NetworkPolicyPeer{IPBlock: &networkingv1.IPBlock{CIDR: "10.0.0.0/8"}, PodSelector: all()})}}),
			"egress[0].to[0]: ipBlock with a selector"},
		{"bad CIDR", policy("x", "p", all(), networkingv1.NetworkPolicySpec{
			Ingress: []networkingv1.NetworkPolicyIngressRule{from(block("10.0.0.0"))}}), "ingress[0].from[0].ipBlock.cidr"},
		{"except outside", policy("x", "p", all(), networkingv1.NetworkPolicySpec{
			Ingress: []networkingv1.NetworkPolicyIngressRule{from(block("10.0.0.0/16", "10.1.0.0/24"))}}), "not a strict subset"},
		{"endPort below port", policy("x", "p", all(), networkingv1.NetworkPolicySpec{
			Ingress: []networkingv1.NetworkPolicyIngressRule{{Ports: []networkingv1.NetworkPolicyPort{{Port: num(80), EndPort: &end}}}}}), "endPort 79 below port 80"},
		{"endPort with a named port", policy("x", "p", all(), networkingv1.NetworkPolicySpec{
			Ingress: []networkingv1.NetworkPolicyIngressRule{{Ports: []networkingv1.NetworkPolicyPort{{Port: named("serve-80-tcp"), EndPort: &end}}}}}), "endPort with named port"},
		{"bad selector", policy("x", "p", &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "k", Operator: "Near"}}},
			networkingv1.NetworkPolicySpec{}), "podSelector"},
		{"unknown policy type", policy("x", "p", all(), networkingv1.NetworkPolicySpec{PolicyTypes: types("Sideways")}), `unknown type "Sideways"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := netpolmodel.Validate([]networkingv1.NetworkPolicy{tt.policy})
			switch {
			case tt.want == "" && err != nil:
				t.Errorf("error %v, want none", err)
			case tt.want != "" && err == nil:
				t.Errorf("no error, want one containing %q", tt.want)
			case tt.want != "" && !strings.Contains(err.Error(), tt.want):
				t.Errorf("error %q, want it to contain %q", err, tt.want)
			}
		})
	}
}
