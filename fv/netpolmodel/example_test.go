package netpolmodel_test

import (
	"fmt"
	"net/netip"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dpconform/dpconform/fv/netpolmodel"
)

// A spec computes what the policies allow, probes every cell, and compares; on a
// difference, it fails with the rendered matrices.
func ExampleRender() {
	c := netpolmodel.Cluster{
		Namespaces: []netpolmodel.Namespace{{Name: "x"}, {Name: "y"}},
		Pods: []netpolmodel.Pod{
			{Namespace: "x", Name: "a", Labels: map[string]string{"pod": "a"}, IP: netip.MustParseAddr("10.0.0.1")},
			{Namespace: "x", Name: "b", Labels: map[string]string{"pod": "b"}, IP: netip.MustParseAddr("10.0.0.2")},
			{Namespace: "y", Name: "a", Labels: map[string]string{"pod": "a"}, IP: netip.MustParseAddr("10.0.1.1")},
		},
	}
	// x/a admits only pods of its own namespace.
	policies := []networkingv1.NetworkPolicy{{
		ObjectMeta: metav1.ObjectMeta{Namespace: "x", Name: "a-from-x"},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"pod": "a"}},
			Ingress: []networkingv1.NetworkPolicyIngressRule{{
				From: []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{}}},
			}},
		},
	}}
	tcp80 := netpolmodel.Port{Port: 80, Protocol: corev1.ProtocolTCP}
	expected := c.Expected(policies, []netpolmodel.Port{tcp80})

	// What the probes saw: the dataplane let y/a in.
	observed := netpolmodel.NewMatrix(expected.Pods, expected.Ports)
	for _, from := range c.IDs() {
		for _, to := range c.IDs() {
			if from != to {
				observed.Set(from, to, tcp80, true)
			}
		}
	}
	if wrong, _, _ := netpolmodel.Compare(expected, observed); len(wrong) > 0 {
		fmt.Print(netpolmodel.Render(expected, observed))
	}
	// Output:
	// Reachability, rows from, columns to: . allowed, X denied, - self, ? no value.
	// A wrong cell shows what was observed, marked !: X! denied but expected allowed, .! allowed but expected denied, ?! not observed.
	//
	// TCP/80: 1 of 6 wrong
	// from\to  x/a  x/b  y/a
	// x/a      -    .    .
	// x/b      .    -    .
	// y/a      .!   .    -
	//
	// 5 of 6 cells right; wrong:
	//   y/a -> x/a TCP/80: expected denied, observed allowed (model: x/a ingress isolated by [x/a-from-x], no rule allows y/a -> x/a TCP/80)
}
