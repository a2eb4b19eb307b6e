package policy

import (
	"fmt"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/dpconform/dpconform/bpf"
)

// newPod returns a running pod; ports are "name:port[/UDP]".
func newPod(ns, name, ip string, lbls map[string]string, ports ...string) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: lbls},
		Spec:       corev1.PodSpec{NodeName: "node-a", Containers: []corev1.Container{{Name: "c"}}},
		Status:     corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip},
	}
	for _, s := range ports {
		n, rest, _ := strings.Cut(s, ":")
		num, proto, _ := strings.Cut(rest, "/")
		var v int32
		fmt.Sscan(num, &v)
		cp := corev1.ContainerPort{Name: n, ContainerPort: v}
		if proto != "" {
			cp.Protocol = corev1.Protocol(proto)
		}
		p.Spec.Containers[0].Ports = append(p.Spec.Containers[0].Ports, cp)
	}
	return p
}

func newNS(name string, lbls map[string]string) *corev1.Namespace {
	return &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: lbls}}
}

func sel(kv ...string) *metav1.LabelSelector {
	s := &metav1.LabelSelector{MatchLabels: map[string]string{}}
	for i := 0; i+1 < len(kv); i += 2 {
		s.MatchLabels[kv[i]] = kv[i+1]
	}
	return s
}

func newPolicy(ns, name string, podSel *metav1.LabelSelector, spec networkingv1.NetworkPolicySpec) *networkingv1.NetworkPolicy {
	spec.PodSelector = *podSel
	return &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: spec}
}

func tcp(port int) networkingv1.NetworkPolicyPort {
	return networkingv1.NetworkPolicyPort{Port: ptr.To(intstr.FromInt32(int32(port)))}
}

func named(name string, proto corev1.Protocol) networkingv1.NetworkPolicyPort {
	p := networkingv1.NetworkPolicyPort{Port: ptr.To(intstr.FromString(name))}
	if proto != "" {
		p.Protocol = &proto
	}
	return p
}

func from(ports []networkingv1.NetworkPolicyPort, peers ...networkingv1.NetworkPolicyPeer) []networkingv1.NetworkPolicyIngressRule {
	return []networkingv1.NetworkPolicyIngressRule{{Ports: ports, From: peers}}
}

func to(ports []networkingv1.NetworkPolicyPort, peers ...networkingv1.NetworkPolicyPeer) []networkingv1.NetworkPolicyEgressRule {
	return []networkingv1.NetworkPolicyEgressRule{{Ports: ports, To: peers}}
}

func ports(p ...networkingv1.NetworkPolicyPort) []networkingv1.NetworkPolicyPort { return p }

// The cluster of the table: namespaces prod (team=a) and dev (team=b), pods in each.
var (
	testNamespaces = []*corev1.Namespace{newNS("prod", map[string]string{"team": "a"}), newNS("dev", map[string]string{"team": "b"})}
	testPods       = []*corev1.Pod{
		newPod("prod", "web", "10.0.0.1", map[string]string{"app": "web"}, "http:8080", "dns:53/UDP"),
		newPod("prod", "db", "10.0.0.2", map[string]string{"app": "db"}, "http:9090"),
		newPod("prod", "client", "10.0.0.3", map[string]string{"app": "client"}),
		newPod("dev", "client", "10.0.1.3", map[string]string{"app": "client"}, "http:8080"),
		newPod("dev", "web", "10.0.1.1", map[string]string{"app": "web"}, "http:80"),
	}
	// web is the local endpoint the table looks at.
	testEndpoints = map[string]int{"prod/web": 7}
)

// show renders an endpoint's policy with each rule's set spelled out, so that a case
// reads as what it admits, not as IDs.
func show(d Desired, ifindex int) []string {
	ep, ok := d.Endpoints[ifindex]
	if !ok {
		return []string{"no endpoint"}
	}
	var out []string
	if ep.IngressIsolated {
		out = append(out, "ingress isolated")
	}
	if ep.EgressIsolated {
		out = append(out, "egress isolated")
	}
	rule := func(dir string, r bpf.PolicyRule) string {
		peers := "any"
		if r.SetID != 0 {
			var es []string
			for _, e := range d.Sets[r.SetID] {
				if e.Except {
					es = append(es, "!"+e.Prefix.String())
				} else {
					es = append(es, e.Prefix.String())
				}
			}
			peers = "{" + strings.Join(es, " ") + "}"
		}
		port := "any port"
		switch {
		case r.Proto == 0:
		case r.PortMin == 0:
			port = r.Proto.String()
		case r.PortMin == r.PortMax:
			port = fmt.Sprintf("%s %d", r.Proto, r.PortMin)
		default:
			port = fmt.Sprintf("%s %d-%d", r.Proto, r.PortMin, r.PortMax)
		}
		return dir + " " + peers + " " + port
	}
	var rules []string
	for _, r := range ep.Ingress {
		rules = append(rules, rule("from", r))
	}
	for _, r := range ep.Egress {
		rules = append(rules, rule("to", r))
	}
	slices.Sort(rules)
	return append(out, rules...)
}

func TestCompile(t *testing.T) {
	web := sel("app", "web")
	for _, tc := range []struct {
		name     string
		policies []*networkingv1.NetworkPolicy
		opts     Options
		want     []string
	}{
		{
			name: "no policy: not isolated",
		},
		{
			name:     "a policy with no rules isolates ingress only",
			policies: []*networkingv1.NetworkPolicy{newPolicy("prod", "deny", sel(), networkingv1.NetworkPolicySpec{})},
			want:     []string{"ingress isolated"},
		},
		{
			name:     "a policy of another namespace does not apply",
			policies: []*networkingv1.NetworkPolicy{newPolicy("dev", "deny", sel(), networkingv1.NetworkPolicySpec{})},
		},
		{
			name:     "a podSelector that does not match does not apply",
			policies: []*networkingv1.NetworkPolicy{newPolicy("prod", "deny", sel("app", "db"), networkingv1.NetworkPolicySpec{})},
		},
		{
			name: "policyTypes defaulted: egress rules make it Egress too",
			policies: []*networkingv1.NetworkPolicy{newPolicy("prod", "p", web, networkingv1.NetworkPolicySpec{
				Egress: to(nil),
			})},
			want: []string{"ingress isolated", "egress isolated", "to any any port"},
		},
		{
			name: "policyTypes Egress only: ingress stays open",
			policies: []*networkingv1.NetworkPolicy{newPolicy("prod", "p", web, networkingv1.NetworkPolicySpec{
				PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeEgress},
				Ingress:     from(nil),
			})},
			want: []string{"egress isolated"},
		},
		{
			name: "a rule with no peers and no ports admits anything",
			policies: []*networkingv1.NetworkPolicy{newPolicy("prod", "p", web, networkingv1.NetworkPolicySpec{
				Ingress: from(nil),
			})},
			want: []string{"ingress isolated", "from any any port"},
		},
		{
			name: "podSelector peer: pods of the policy's namespace only",
			policies: []*networkingv1.NetworkPolicy{newPolicy("prod", "p", web, networkingv1.NetworkPolicySpec{
				Ingress: from(ports(tcp(8080)), networkingv1.NetworkPolicyPeer{PodSelector: sel("app", "client")}),
			})},
			want: []string{"ingress isolated", "from {10.0.0.3/32} TCP 8080"},
		},
		{
			name: "empty podSelector peer: every pod of the namespace, the endpoint's own included",
			policies: []*networkingv1.NetworkPolicy{newPolicy("prod", "p", web, networkingv1.NetworkPolicySpec{
				Ingress: from(nil, networkingv1.NetworkPolicyPeer{PodSelector: sel()}),
			})},
			want: []string{"ingress isolated", "from {10.0.0.1/32 10.0.0.2/32 10.0.0.3/32} any port"},
		},
		{
			name: "namespaceSelector peer: every pod of the namespaces",
			policies: []*networkingv1.NetworkPolicy{newPolicy("prod", "p", web, networkingv1.NetworkPolicySpec{
				Ingress: from(nil, networkingv1.NetworkPolicyPeer{NamespaceSelector: sel("team", "b")}),
			})},
			want: []string{"ingress isolated", "from {10.0.1.1/32 10.0.1.3/32} any port"},
		},
		{
			name: "namespaceSelector by kubernetes.io/metadata.name, which the Namespace need not carry",
			policies: []*networkingv1.NetworkPolicy{newPolicy("prod", "p", web, networkingv1.NetworkPolicySpec{
				Ingress: from(nil, networkingv1.NetworkPolicyPeer{NamespaceSelector: sel("kubernetes.io/metadata.name", "dev")}),
			})},
			want: []string{"ingress isolated", "from {10.0.1.1/32 10.0.1.3/32} any port"},
		},
		{
			name: "podSelector and namespaceSelector in one peer: both must match",
			policies: []*networkingv1.NetworkPolicy{newPolicy("prod", "p", web, networkingv1.NetworkPolicySpec{
				Ingress: from(nil, networkingv1.NetworkPolicyPeer{NamespaceSelector: sel(), PodSelector: sel("app", "client")}),
			})},
			want: []string{"ingress isolated", "from {10.0.0.3/32 10.0.1.3/32} any port"},
		},
		{
			name: "selector peers of one rule share one set, ipBlocks have one each",
			policies: []*networkingv1.NetworkPolicy{newPolicy("prod", "p", web, networkingv1.NetworkPolicySpec{
				Ingress: from(ports(tcp(80)),
					networkingv1.NetworkPolicyPeer{PodSelector: sel("app", "db")},
					networkingv1.NetworkPolicyPeer{NamespaceSelector: sel("team", "b"), PodSelector: sel("app", "client")},
					networkingv1.NetworkPolicyPeer{IPBlock: &networkingv1.IPBlock{CIDR: "192.0.2.0/24"}},
					networkingv1.NetworkPolicyPeer{IPBlock: &networkingv1.IPBlock{CIDR: "198.51.100.7/32"}},
				),
			})},
			want: []string{"ingress isolated", "from {10.0.0.2/32 10.0.1.3/32} TCP 80", "from {192.0.2.0/24} TCP 80", "from {198.51.100.7/32} TCP 80"},
		},
		{
			name: "a selector that matches no pod admits nothing",
			policies: []*networkingv1.NetworkPolicy{newPolicy("prod", "p", web, networkingv1.NetworkPolicySpec{
				Ingress: from(nil, networkingv1.NetworkPolicyPeer{PodSelector: sel("app", "nobody")}),
			})},
			want: []string{"ingress isolated"},
		},
		{
			name: "ipBlock with except, a cidr not in canonical form",
			policies: []*networkingv1.NetworkPolicy{newPolicy("prod", "p", web, networkingv1.NetworkPolicySpec{
				Ingress: from(nil, networkingv1.NetworkPolicyPeer{IPBlock: &networkingv1.IPBlock{CIDR: "10.0.0.7/16", Except: []string{"10.0.1.0/24", "10.0.0.3/32"}}}),
			})},
			want: []string{"ingress isolated", "from {10.0.0.0/16 !10.0.0.3/32 !10.0.1.0/24} any port"},
		},
		{
			name: "ipBlock except ignored (fault ignore-ipblock-except)",
			opts: Options{IgnoreIPBlockExcept: true},
			policies: []*networkingv1.NetworkPolicy{newPolicy("prod", "p", web, networkingv1.NetworkPolicySpec{
				Ingress: from(nil, networkingv1.NetworkPolicyPeer{IPBlock: &networkingv1.IPBlock{CIDR: "10.0.0.0/16", Except: []string{"10.0.1.0/24"}}}),
			})},
			want: []string{"ingress isolated", "from {10.0.0.0/16} any port"},
		},
		{
			name: "an IPv6 ipBlock matches no IPv4 peer",
			policies: []*networkingv1.NetworkPolicy{newPolicy("prod", "p", web, networkingv1.NetworkPolicySpec{
				Ingress: from(nil, networkingv1.NetworkPolicyPeer{IPBlock: &networkingv1.IPBlock{CIDR: "2001:db8::/64"}}),
			})},
			want: []string{"ingress isolated"},
		},
		{
			name: "ports: number, protocol, range, protocol alone",
			policies: []*networkingv1.NetworkPolicy{newPolicy("prod", "p", web, networkingv1.NetworkPolicySpec{
				Ingress: from(ports(
					tcp(80),
					networkingv1.NetworkPolicyPort{Protocol: ptr.To(corev1.ProtocolUDP), Port: ptr.To(intstr.FromInt32(53))},
					networkingv1.NetworkPolicyPort{Port: ptr.To(intstr.FromInt32(9000)), EndPort: ptr.To[int32](9100)},
					networkingv1.NetworkPolicyPort{Protocol: ptr.To(corev1.ProtocolSCTP)},
				)),
			})},
			want: []string{"ingress isolated", "from any SCTP", "from any TCP 80", "from any TCP 9000-9100", "from any UDP 53"},
		},
		{
			name: "ingress named ports resolve against the endpoint's own containers, protocol included",
			policies: []*networkingv1.NetworkPolicy{newPolicy("prod", "p", web, networkingv1.NetworkPolicySpec{
				Ingress: from(ports(named("http", ""), named("dns", corev1.ProtocolUDP), named("dns", corev1.ProtocolTCP), named("nope", ""))),
			})},
			want: []string{"ingress isolated", "from any TCP 8080", "from any UDP 53"},
		},
		{
			name: "named ports unresolved (fault named-ports-unresolved)",
			opts: Options{NamedPortsUnresolved: true},
			policies: []*networkingv1.NetworkPolicy{newPolicy("prod", "p", web, networkingv1.NetworkPolicySpec{
				Ingress: from(ports(named("http", ""), tcp(81))),
			})},
			want: []string{"ingress isolated", "from any TCP 81"},
		},
		{
			name: "egress named port: one rule per resolved port, with the peers that declare it",
			policies: []*networkingv1.NetworkPolicy{newPolicy("prod", "p", web, networkingv1.NetworkPolicySpec{
				PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeEgress},
				Egress:      to(ports(named("http", "")), networkingv1.NetworkPolicyPeer{NamespaceSelector: sel()}),
			})},
			want: []string{"egress isolated", "to {10.0.0.1/32 10.0.1.3/32} TCP 8080", "to {10.0.0.2/32} TCP 9090", "to {10.0.1.1/32} TCP 80"},
		},
		{
			name: "egress named port to an ipBlock: the pods in the block",
			policies: []*networkingv1.NetworkPolicy{newPolicy("prod", "p", web, networkingv1.NetworkPolicySpec{
				PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeEgress},
				Egress: to(ports(named("http", ""), tcp(443)),
					networkingv1.NetworkPolicyPeer{IPBlock: &networkingv1.IPBlock{CIDR: "10.0.0.0/16", Except: []string{"10.0.0.0/24"}}}),
			})},
			want: []string{"egress isolated", "to {10.0.0.0/16 !10.0.0.0/24} TCP 443", "to {10.0.1.1/32} TCP 80", "to {10.0.1.3/32} TCP 8080"},
		},
		{
			name: "egress named port to any peer: every pod that declares it",
			policies: []*networkingv1.NetworkPolicy{newPolicy("prod", "p", web, networkingv1.NetworkPolicySpec{
				PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeEgress},
				Egress:      to(ports(named("dns", corev1.ProtocolUDP))),
			})},
			want: []string{"egress isolated", "to {10.0.0.1/32} UDP 53"},
		},
		{
			name: "egress without its ports (fault egress-ignores-ports)",
			opts: Options{EgressIgnoresPorts: true},
			policies: []*networkingv1.NetworkPolicy{newPolicy("prod", "p", web, networkingv1.NetworkPolicySpec{
				Ingress: from(ports(tcp(80))),
				Egress:  to(ports(tcp(5432), named("http", "")), networkingv1.NetworkPolicyPeer{PodSelector: sel("app", "db")}),
			})},
			want: []string{"ingress isolated", "egress isolated", "from any TCP 80", "to {10.0.0.2/32} any port"},
		},
		{
			name: "the rules of all selecting policies add up, duplicates once",
			policies: []*networkingv1.NetworkPolicy{
				newPolicy("prod", "a", web, networkingv1.NetworkPolicySpec{Ingress: from(ports(tcp(80)), networkingv1.NetworkPolicyPeer{PodSelector: sel("app", "db")})}),
				newPolicy("prod", "b", sel(), networkingv1.NetworkPolicySpec{Ingress: from(ports(tcp(80), tcp(443)), networkingv1.NetworkPolicyPeer{PodSelector: sel("app", "db")})}),
				newPolicy("prod", "c", sel(), networkingv1.NetworkPolicySpec{PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeEgress}}),
			},
			want: []string{"ingress isolated", "egress isolated", "from {10.0.0.2/32} TCP 443", "from {10.0.0.2/32} TCP 80"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, err := NewCompiler(tc.opts).Compile(Input{Policies: tc.policies, Pods: testPods, Namespaces: testNamespaces, Endpoints: testEndpoints})
			if err != nil {
				t.Fatal(err)
			}
			if got := show(d, 7); !reflect.DeepEqual(got, tc.want) && !(len(got) == 0 && len(tc.want) == 0) {
				t.Errorf("compiled\n  %s\nwant\n  %s", strings.Join(got, "\n  "), strings.Join(tc.want, "\n  "))
			}
		})
	}
}

// TestPeers checks which pods are peers: those with an IPv4 pod IP that run in the
// pod network.
func TestPeers(t *testing.T) {
	hostNet := newPod("prod", "host", "192.168.0.10", map[string]string{"app": "client"})
	hostNet.Spec.HostNetwork = true
	done := newPod("prod", "done", "10.0.0.9", map[string]string{"app": "client"})
	done.Status.Phase = corev1.PodSucceeded
	pods := append(slices.Clone(testPods), hostNet, done,
		newPod("prod", "pending", "", map[string]string{"app": "client"}),
		newPod("prod", "v6", "fd00::1", map[string]string{"app": "client"}))
	np := newPolicy("prod", "p", sel("app", "web"), networkingv1.NetworkPolicySpec{
		Ingress: from(nil, networkingv1.NetworkPolicyPeer{PodSelector: sel("app", "client")}),
	})
	d, err := NewCompiler(Options{}).Compile(Input{Policies: []*networkingv1.NetworkPolicy{np}, Pods: pods, Namespaces: testNamespaces, Endpoints: testEndpoints})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := show(d, 7), []string{"ingress isolated", "from {10.0.0.3/32} any port"}; !reflect.DeepEqual(got, want) {
		t.Errorf("compiled %q, want %q", got, want)
	}
}

func TestTooManyRulesFailsClosed(t *testing.T) {
	var ps []networkingv1.NetworkPolicyPort
	for i := range 5 {
		ps = append(ps, tcp(1000+i))
	}
	np := newPolicy("prod", "p", sel("app", "web"), networkingv1.NetworkPolicySpec{
		Ingress: from(ps),
		Egress:  to(ports(tcp(53))),
	})
	d, err := NewCompiler(Options{MaxRules: 4}).Compile(Input{Policies: []*networkingv1.NetworkPolicy{np}, Pods: testPods, Namespaces: testNamespaces, Endpoints: testEndpoints})
	if err == nil || !strings.Contains(err.Error(), "pod prod/web") || !strings.Contains(err.Error(), "ingress") {
		t.Errorf("error %v does not name the pod and direction", err)
	}
	if got, want := show(d, 7), []string{"ingress isolated", "egress isolated", "to any TCP 53"}; !reflect.DeepEqual(got, want) {
		t.Errorf("compiled %q, want %q: ingress isolated with no rule", got, want)
	}
}

func TestInvalidPolicyFailsClosed(t *testing.T) {
	bad := &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "app", Operator: "Bogus"}}}
	policies := []*networkingv1.NetworkPolicy{
		newPolicy("prod", "bad-peer", sel("app", "web"), networkingv1.NetworkPolicySpec{
			Ingress: from(nil, networkingv1.NetworkPolicyPeer{PodSelector: bad}, networkingv1.NetworkPolicyPeer{IPBlock: &networkingv1.IPBlock{CIDR: "nonsense"}}),
		}),
	}
	d, err := NewCompiler(Options{}).Compile(Input{Policies: policies, Pods: testPods, Namespaces: testNamespaces, Endpoints: testEndpoints})
	if err == nil || !strings.Contains(err.Error(), "prod/bad-peer") {
		t.Errorf("error %v does not name the policy", err)
	}
	if got, want := show(d, 7), []string{"ingress isolated"}; !reflect.DeepEqual(got, want) {
		t.Errorf("compiled %q, want %q", got, want)
	}
}

// TestSetsShared checks that sets are shared by content across endpoints and policies,
// keep their IDs across rounds while unchanged, and that only referenced sets are
// desired.
func TestSetsShared(t *testing.T) {
	peer := networkingv1.NetworkPolicyPeer{PodSelector: sel("app", "client")}
	policies := []*networkingv1.NetworkPolicy{
		newPolicy("prod", "a", sel("app", "web"), networkingv1.NetworkPolicySpec{Ingress: from(ports(tcp(80)), peer)}),
		newPolicy("prod", "b", sel("app", "db"), networkingv1.NetworkPolicySpec{Ingress: from(ports(tcp(5432)), peer)}),
		newPolicy("prod", "unused", sel("app", "nobody"), networkingv1.NetworkPolicySpec{Ingress: from(nil, networkingv1.NetworkPolicyPeer{IPBlock: &networkingv1.IPBlock{CIDR: "192.0.2.0/24"}})}),
	}
	in := Input{Policies: policies, Pods: testPods, Namespaces: testNamespaces, Endpoints: map[string]int{"prod/web": 7, "prod/db": 8}}
	c := NewCompiler(Options{})
	d1, err := c.Compile(in)
	if err != nil {
		t.Fatal(err)
	}
	if len(d1.Sets) != 1 {
		t.Fatalf("sets %v, want one shared set", d1.Sets)
	}
	id := d1.Endpoints[7].Ingress[0].SetID
	if d1.Endpoints[8].Ingress[0].SetID != id {
		t.Errorf("endpoints do not share the set: %+v", d1.Endpoints)
	}
	d2, _ := c.Compile(in)
	if !reflect.DeepEqual(d1, d2) {
		t.Errorf("a second round of the same input differs:\n%+v\n%+v", d1, d2)
	}

	// A new client: new content, new ID.
	in.Pods = append(slices.Clone(testPods), newPod("prod", "client-2", "10.0.0.4", map[string]string{"app": "client"}))
	d3, _ := c.Compile(in)
	id3 := d3.Endpoints[7].Ingress[0].SetID
	if id3 == id || len(d3.Sets) != 1 || len(d3.Sets[id3]) != 2 {
		t.Errorf("after a new peer: set %d (was %d), sets %v", id3, id, d3.Sets)
	}

	// A restarted agent adopts the sets of the maps and reuses their IDs.
	c2 := NewCompiler(Options{})
	c2.Adopt(map[uint32]Set{id3: d3.Sets[id3], 40: {{Prefix: netip.MustParsePrefix("192.0.2.0/24")}}})
	d4, _ := c2.Compile(in)
	if !reflect.DeepEqual(d4, d3) {
		t.Errorf("after adoption:\n%+v\nwant\n%+v", d4, d3)
	}
	// IDs are not reused: the next new set gets one above every adopted ID.
	in.Pods = testPods
	d5, _ := c2.Compile(in)
	if id5 := d5.Endpoints[7].Ingress[0].SetID; id5 <= 40 {
		t.Errorf("new set got ID %d, want > 40", id5)
	}
}

func TestEndpointWithoutPod(t *testing.T) {
	d, err := NewCompiler(Options{}).Compile(Input{Endpoints: map[string]int{"prod/gone": 3}})
	if err != nil {
		t.Fatal(err)
	}
	if ep, ok := d.Endpoints[3]; !ok || !reflect.DeepEqual(ep, bpf.EndpointPolicy{}) {
		t.Errorf("endpoint of an unknown pod: %+v, %v; want an open policy", ep, ok)
	}
}
