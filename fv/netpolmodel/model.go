// Package netpolmodel is the suite's own model of Kubernetes NetworkPolicy
// (networking.k8s.io/v1): from the policies and the pods and namespaces they apply
// to, it computes which pod-to-pod connections a conformant dataplane allows, as the
// upstream NetworkPolicy e2e tests (their truth tables) and Cyclonus do.
//
// It is deliberately independent of the reference dataplane's policy compiler, so
// that a misreading of the API in one is caught by the other: keep it that way, and
// keep it a literal reading of the API's documentation rather than an optimised one.
//
// The model covers pod-to-pod traffic only: ipBlock peers are applied to pod IPs,
// and the exceptions the API grants the pod's own node, and a pod's traffic to
// itself, are out of its scope.
package netpolmodel

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// Pod is what the model knows of a pod.
type Pod struct {
	Namespace, Name string
	Labels          map[string]string
	IP              netip.Addr
	// Ports are the pod's declared container ports, which named ports in policies
	// resolve against (Name, ContainerPort and Protocol; an empty Protocol is TCP).
	Ports []corev1.ContainerPort
}

// ID is the pod's name in matrices and reasons: "ns/name".
func (p Pod) ID() string { return p.Namespace + "/" + p.Name }

// Namespace is what the model knows of a namespace.
type Namespace struct {
	Name   string
	Labels map[string]string
}

// Cluster is the world the policies apply to. A namespace that pods refer to but
// Namespaces does not list is taken to have no labels but its name.
type Cluster struct {
	Namespaces []Namespace
	Pods       []Pod
}

// IDs returns the IDs of the cluster's pods, in order: the rows and columns of its
// matrices.
func (c Cluster) IDs() []string {
	ids := make([]string, len(c.Pods))
	for i, p := range c.Pods {
		ids[i] = p.ID()
	}
	return ids
}

// Pod returns the pod with the ID "ns/name", or false.
func (c Cluster) Pod(id string) (Pod, bool) {
	for _, p := range c.Pods {
		if p.ID() == id {
			return p, true
		}
	}
	return Pod{}, false
}

// Port is a destination port and protocol, as probed. An empty Protocol is TCP.
type Port struct {
	Port     int32
	Protocol corev1.Protocol
}

// String returns "TCP/80".
func (p Port) String() string { return fmt.Sprintf("%s/%d", p.normal().Protocol, p.Port) }

func (p Port) normal() Port {
	if p.Protocol == "" {
		p.Protocol = corev1.ProtocolTCP
	}
	return p
}

// Ports returns every combination of the protocols and port numbers, protocol by
// protocol: Ports([]int32{80, 81}, TCP, UDP) is TCP/80, TCP/81, UDP/80, UDP/81.
func Ports(numbers []int32, protocols ...corev1.Protocol) []Port {
	ports := make([]Port, 0, len(numbers)*len(protocols))
	for _, proto := range protocols {
		for _, n := range numbers {
			ports = append(ports, Port{Port: n, Protocol: proto})
		}
	}
	return ports
}

// metadataNameLabel is the label the API server puts on every namespace, with its
// name; policies select namespaces by name with it.
const metadataNameLabel = "kubernetes.io/metadata.name"

// Allowed reports whether a new connection from pod src to pod dst on port is
// allowed: src's egress admits it and dst's ingress admits it. The reason says why,
// for a person: which policies isolate the pod and that no rule allows the
// connection, or which rule of which policy allows it.
//
// Policies must carry their namespace. A policy the API server would reject (see
// Validate) is applied as far as it can be read: a selector, CIDR or port that
// cannot be read matches nothing.
func (c Cluster) Allowed(policies []networkingv1.NetworkPolicy, src, dst Pod, port Port) (bool, string) {
	port = port.normal()
	out, outWhy := c.admits(policies, networkingv1.PolicyTypeEgress, src, dst, port)
	in, inWhy := c.admits(policies, networkingv1.PolicyTypeIngress, src, dst, port)
	switch {
	case out && in:
		return true, outWhy + "; " + inWhy
	case !out && !in:
		return false, outWhy + "; " + inWhy
	case !out:
		return false, outWhy
	default:
		return false, inWhy
	}
}

// admits reports whether one end of the connection, src for egress and dst for
// ingress, admits it.
func (c Cluster) admits(policies []networkingv1.NetworkPolicy, dir networkingv1.PolicyType, src, dst Pod, port Port) (bool, string) {
	subject, peer := dst, src
	if dir == networkingv1.PolicyTypeEgress {
		subject, peer = src, dst
	}
	what := subject.ID() + " " + strings.ToLower(string(dir))
	var isolating []string
	for _, p := range policies {
		if p.Namespace != subject.Namespace || !matches(&p.Spec.PodSelector, subject.Labels) || !slices.Contains(policyTypes(p.Spec), dir) {
			continue
		}
		isolating = append(isolating, p.Namespace+"/"+p.Name)
		if dir == networkingv1.PolicyTypeIngress {
			for i, r := range p.Spec.Ingress {
				if c.peersMatch(p.Namespace, r.From, peer) && portsMatch(r.Ports, dst, port) {
					return true, fmt.Sprintf("%s allowed by %s/%s ingress[%d]", what, p.Namespace, p.Name, i)
				}
			}
			continue
		}
		for i, r := range p.Spec.Egress {
			if c.peersMatch(p.Namespace, r.To, peer) && portsMatch(r.Ports, dst, port) {
				return true, fmt.Sprintf("%s allowed by %s/%s egress[%d]", what, p.Namespace, p.Name, i)
			}
		}
	}
	if len(isolating) == 0 {
		return true, what + " not isolated"
	}
	return false, fmt.Sprintf("%s isolated by [%s], no rule allows %s -> %s %s",
		what, strings.Join(isolating, " "), src.ID(), dst.ID(), port)
}

// policyTypes returns the spec's policy types, defaulted as the API server defaults
// them: Ingress always, and Egress if there are egress rules.
func policyTypes(spec networkingv1.NetworkPolicySpec) []networkingv1.PolicyType {
	if len(spec.PolicyTypes) > 0 {
		return spec.PolicyTypes
	}
	types := []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}
	if len(spec.Egress) > 0 {
		types = append(types, networkingv1.PolicyTypeEgress)
	}
	return types
}

// peersMatch reports whether a rule's peers, of a policy in namespace ns, include
// pod. No peers means every peer.
func (c Cluster) peersMatch(ns string, peers []networkingv1.NetworkPolicyPeer, pod Pod) bool {
	if len(peers) == 0 {
		return true
	}
	for _, peer := range peers {
		if c.peerMatches(ns, peer, pod) {
			return true
		}
	}
	return false
}

func (c Cluster) peerMatches(ns string, peer networkingv1.NetworkPolicyPeer, pod Pod) bool {
	if peer.IPBlock != nil {
		return inBlock(peer.IPBlock, pod.IP)
	}
	if peer.PodSelector == nil && peer.NamespaceSelector == nil {
		return false // rejected by the API server: a peer must say something
	}
	if peer.NamespaceSelector != nil {
		if !matches(peer.NamespaceSelector, c.namespaceLabels(pod.Namespace)) {
			return false
		}
	} else if pod.Namespace != ns {
		return false
	}
	return peer.PodSelector == nil || matches(peer.PodSelector, pod.Labels)
}

// namespaceLabels returns the labels of namespace name, with the name label the API
// server adds.
func (c Cluster) namespaceLabels(name string) labels.Set {
	set := labels.Set{}
	for _, ns := range c.Namespaces {
		if ns.Name == name {
			for k, v := range ns.Labels {
				set[k] = v
			}
		}
	}
	set[metadataNameLabel] = name
	return set
}

// matches reports whether sel selects a set of labels; a selector that cannot be
// read selects nothing.
func matches(sel *metav1.LabelSelector, set map[string]string) bool {
	s, err := metav1.LabelSelectorAsSelector(sel)
	if err != nil {
		return false
	}
	return s.Matches(labels.Set(set))
}

// inBlock reports whether ip is in the block's CIDR and in none of its exceptions.
func inBlock(b *networkingv1.IPBlock, ip netip.Addr) bool {
	ip = ip.Unmap()
	cidr, err := netip.ParsePrefix(b.CIDR)
	if err != nil || !cidr.Masked().Contains(ip) {
		return false
	}
	for _, e := range b.Except {
		except, err := netip.ParsePrefix(e)
		if err != nil || except.Masked().Contains(ip) {
			// An exception that cannot be read might have excluded ip: deny
			// rather than guess.
			return false
		}
	}
	return true
}

// portsMatch reports whether a rule's ports include port on pod dst, against whose
// container ports named ports resolve (the rule's own pod for ingress, the peer for
// egress). No ports means every port of every protocol.
func portsMatch(ports []networkingv1.NetworkPolicyPort, dst Pod, port Port) bool {
	if len(ports) == 0 {
		return true
	}
	for _, p := range ports {
		if portMatches(p, dst, port) {
			return true
		}
	}
	return false
}

func portMatches(p networkingv1.NetworkPolicyPort, dst Pod, port Port) bool {
	proto := corev1.ProtocolTCP
	if p.Protocol != nil {
		proto = *p.Protocol
	}
	if proto != port.Protocol {
		return false
	}
	switch {
	case p.Port == nil:
		return true
	case p.Port.Type == intstr.String:
		// A named port is the container port of that name and the rule's
		// protocol; one the pod does not declare matches nothing.
		for _, cp := range dst.Ports {
			if cp.Name == p.Port.StrVal && containerProtocol(cp) == proto && cp.ContainerPort == port.Port {
				return true
			}
		}
		return false
	case p.EndPort != nil:
		return p.Port.IntVal <= port.Port && port.Port <= *p.EndPort
	default:
		return p.Port.IntVal == port.Port
	}
}

func containerProtocol(cp corev1.ContainerPort) corev1.Protocol {
	if cp.Protocol == "" {
		return corev1.ProtocolTCP
	}
	return cp.Protocol
}
