package netpolmodel

import (
	"errors"
	"fmt"
	"net/netip"

	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// Validate returns what in the policies the API server would reject, or that the
// model cannot read, all of it joined; nil if nothing. The model applies such a
// policy as far as it can (what it cannot read matches nothing) while a cluster
// refuses it, so a spec validates its policies before it expects anything of them.
//
// It checks what the model relies on, not everything the API server checks (names
// and label syntax, for one, are the server's business).
func Validate(policies []networkingv1.NetworkPolicy) error {
	var errs []error
	for _, p := range policies {
		id := p.Namespace + "/" + p.Name
		if p.Namespace == "" {
			id = p.Name
			errs = append(errs, fmt.Errorf("policy %s: no namespace", id))
		}
		bad := func(format string, args ...any) {
			errs = append(errs, fmt.Errorf("policy %s: %s", id, fmt.Sprintf(format, args...)))
		}
		if _, err := metav1.LabelSelectorAsSelector(&p.Spec.PodSelector); err != nil {
			bad("podSelector: %v", err)
		}
		for _, t := range p.Spec.PolicyTypes {
			if t != networkingv1.PolicyTypeIngress && t != networkingv1.PolicyTypeEgress {
				bad("policyTypes: unknown type %q", t)
			}
		}
		for i, r := range p.Spec.Ingress {
			validateRule(bad, fmt.Sprintf("ingress[%d]", i), "from", r.From, r.Ports)
		}
		for i, r := range p.Spec.Egress {
			validateRule(bad, fmt.Sprintf("egress[%d]", i), "to", r.To, r.Ports)
		}
	}
	return errors.Join(errs...)
}

func validateRule(bad func(string, ...any), at, peersField string, peers []networkingv1.NetworkPolicyPeer, ports []networkingv1.NetworkPolicyPort) {
	for i, peer := range peers {
		where := fmt.Sprintf("%s.%s[%d]", at, peersField, i)
		switch {
		case peer.IPBlock != nil && (peer.PodSelector != nil || peer.NamespaceSelector != nil):
			bad("%s: ipBlock with a selector", where)
		case peer.IPBlock != nil:
			validateBlock(bad, where, peer.IPBlock)
		case peer.PodSelector == nil && peer.NamespaceSelector == nil:
			bad("%s: no podSelector, namespaceSelector or ipBlock", where)
		}
		if peer.PodSelector != nil {
			if _, err := metav1.LabelSelectorAsSelector(peer.PodSelector); err != nil {
				bad("%s.podSelector: %v", where, err)
			}
		}
		if peer.NamespaceSelector != nil {
			if _, err := metav1.LabelSelectorAsSelector(peer.NamespaceSelector); err != nil {
				bad("%s.namespaceSelector: %v", where, err)
			}
		}
	}
	for i, p := range ports {
		where := fmt.Sprintf("%s.ports[%d]", at, i)
		switch {
		case p.EndPort != nil && p.Port == nil:
			bad("%s: endPort without port", where)
		case p.EndPort != nil && p.Port.Type == intstr.String:
			bad("%s: endPort with named port %q", where, p.Port.StrVal)
		case p.EndPort != nil && *p.EndPort < p.Port.IntVal:
			bad("%s: endPort %d below port %d", where, *p.EndPort, p.Port.IntVal)
		case p.Port != nil && p.Port.Type == intstr.String && p.Port.StrVal == "":
			bad("%s: empty port name", where)
		case p.Port != nil && p.Port.Type == intstr.Int && (p.Port.IntVal < 1 || p.Port.IntVal > 65535):
			bad("%s: port %d out of range", where, p.Port.IntVal)
		}
	}
}

func validateBlock(bad func(string, ...any), where string, b *networkingv1.IPBlock) {
	cidr, err := netip.ParsePrefix(b.CIDR)
	if err != nil {
		bad("%s.ipBlock.cidr: %v", where, err)
		return
	}
	for i, e := range b.Except {
		except, err := netip.ParsePrefix(e)
		if err != nil {
			bad("%s.ipBlock.except[%d]: %v", where, i, err)
			continue
		}
		if except.Addr().Is4() != cidr.Addr().Is4() || except.Bits() <= cidr.Bits() || !cidr.Masked().Contains(except.Addr()) {
			bad("%s.ipBlock.except[%d]: %s is not a strict subset of %s", where, i, e, b.CIDR)
		}
	}
}
