package policy

import (
	"fmt"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
)

// scaleInput is a cluster of 1,000 pods in 10 namespaces and 1,000 policies, every pod
// a local endpoint (the worst case of a node: each policy selects some of them).
func scaleInput() Input {
	in := Input{Endpoints: map[string]int{}}
	for n := range 10 {
		in.Namespaces = append(in.Namespaces, newNS(fmt.Sprintf("ns-%d", n), map[string]string{"team": fmt.Sprintf("t%d", n%3)}))
	}
	for i := range 1000 {
		ns := fmt.Sprintf("ns-%d", i%10)
		name := fmt.Sprintf("pod-%d", i)
		in.Pods = append(in.Pods, newPod(ns, name, fmt.Sprintf("10.%d.%d.%d", i/65536, i/256%256, i%256+1),
			map[string]string{"app": fmt.Sprintf("a%d", i%20), "tier": fmt.Sprintf("t%d", i%4)}, "http:8080", "metrics:9090"))
		in.Endpoints[ns+"/"+name] = i + 1
	}
	for i := range 1000 {
		in.Policies = append(in.Policies, newPolicy(fmt.Sprintf("ns-%d", i%10), fmt.Sprintf("p-%d", i), sel("app", fmt.Sprintf("a%d", i%20)), networkingv1.NetworkPolicySpec{
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress},
			Ingress: []networkingv1.NetworkPolicyIngressRule{{
				Ports: ports(tcp(80+i%7), named("http", "")),
				From: []networkingv1.NetworkPolicyPeer{
					{PodSelector: sel("app", fmt.Sprintf("a%d", (i+1)%20))},
					{NamespaceSelector: sel("team", fmt.Sprintf("t%d", i%3)), PodSelector: sel("tier", fmt.Sprintf("t%d", i%4))},
				},
			}},
			Egress: []networkingv1.NetworkPolicyEgressRule{
				{Ports: ports(named("metrics", "")), To: []networkingv1.NetworkPolicyPeer{{NamespaceSelector: sel()}}},
				{Ports: ports(networkingv1.NetworkPolicyPort{Protocol: ptrProto(corev1.ProtocolUDP)}), To: []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: "10.0.0.0/8", Except: []string{fmt.Sprintf("10.0.%d.0/24", i%4)}}}}},
			},
		}))
	}
	return in
}

func ptrProto(p corev1.Protocol) *corev1.Protocol { return &p }

// BenchmarkCompile compiles 1,000 policies over 1,000 pods, rounds after the first
// (the agent's steady state: set IDs known).
func BenchmarkCompile(b *testing.B) {
	in := scaleInput()
	c := NewCompiler(Options{})
	d, err := c.Compile(in)
	if err != nil {
		b.Fatal(err)
	}
	rules := 0
	for _, ep := range d.Endpoints {
		rules += len(ep.Ingress) + len(ep.Egress)
	}
	for b.Loop() {
		if _, err := c.Compile(in); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(len(d.Sets)), "sets")
	b.ReportMetric(float64(rules), "rules")
}
