package nodestate

import (
	"reflect"
	"testing"
)

func TestParseConntrack(t *testing.T) {
	out := `tcp      6 431999 ESTABLISHED src=10.213.1.100 dst=10.213.1.10 sport=40000 dport=30080 src=10.244.1.2 dst=10.213.1.10 sport=8080 dport=40000 [ASSURED] mark=0 use=1
tcp      6 431999 ESTABLISHED src=10.244.0.3 dst=10.244.0.2 sport=1 dport=8080 src=10.244.0.2 dst=10.244.0.3 sport=8080 dport=1 [ASSURED] mark=0 use=1
conntrack v1.4.7 (conntrack-tools): 2 flow entries have been shown.
`
	got := parseConntrack(out)
	want := []Flow{
		{State: "ESTABLISHED", OrigDst: "10.213.1.10:30080", ReplySrc: "10.244.1.2:8080"},
		{State: "ESTABLISHED", OrigDst: "10.244.0.2:8080", ReplySrc: "10.244.0.2:8080"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("parseConntrack = %+v, want %+v", got, want)
	}
	if !got[0].NATed() || got[1].NATed() {
		t.Errorf("NATed: %v %v, want true false", got[0].NATed(), got[1].NATed())
	}
}

// A dump in the shape kube-proxy's iptables mode leaves it, with the suite's planted
// rules and what kubelet may keep.
const dump = `*filter
:INPUT ACCEPT [0:0]
:FORWARD DROP [0:0]
:DPC-PLANTED - [0:0]
:KUBE-FORWARD - [0:0]
:KUBE-FIREWALL - [0:0]
:KUBE-PROXY-FIREWALL - [0:0]
-A INPUT -m conntrack --ctstate NEW -m comment --comment "kubernetes load balancer firewall" -j KUBE-PROXY-FIREWALL
-A INPUT -j KUBE-FIREWALL
-A FORWARD -m comment --comment "kubernetes forwarding rules" -j KUBE-FORWARD
-A FORWARD -s 192.0.2.2/32 -m comment --comment dpconform-planted -j DROP
-A DPC-PLANTED -s 192.0.2.1/32 -m comment --comment dpconform-planted -j DROP
-A KUBE-FORWARD -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT
COMMIT
*nat
:PREROUTING ACCEPT [0:0]
:DPC-PLANTED-NAT - [0:0]
:KUBE-MARK-MASQ - [0:0]
:KUBE-SERVICES - [0:0]
:KUBE-SVC-ABCDEF - [0:0]
:KUBE-SEP-123456 - [0:0]
-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A PREROUTING -s 192.0.2.3/32 -m comment --comment dpconform-planted -j DPC-PLANTED-NAT
-A DPC-PLANTED-NAT -s 192.0.2.3/32 -m comment --comment dpconform-planted -j RETURN
-A KUBE-SERVICES -d 10.96.0.10/32 -p tcp -j KUBE-SVC-ABCDEF
-A KUBE-SVC-ABCDEF -j KUBE-SEP-123456
-A KUBE-SEP-123456 -j KUBE-MARK-MASQ
COMMIT
`

func TestKubeProxyRules(t *testing.T) {
	got := kubeProxyRules(dump)
	want := []string{
		"filter KUBE-FORWARD", "filter KUBE-PROXY-FIREWALL",
		"filter INPUT -j KUBE-PROXY-FIREWALL", "filter FORWARD -j KUBE-FORWARD",
		"nat KUBE-SERVICES", "nat KUBE-SVC-ABCDEF", "nat KUBE-SEP-123456",
		"nat PREROUTING -j KUBE-SERVICES",
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("kubeProxyRules =\n%q\nwant\n%q", got, want)
	}
	if left := kubeProxyRules("*filter\n:KUBE-FIREWALL - [0:0]\n:KUBE-MARK-DROP - [0:0]\n-A INPUT -j KUBE-FIREWALL\nCOMMIT\n"); len(left) != 0 {
		t.Errorf("kubelet's chains count as kube-proxy's: %q", left)
	}
}

func TestMissingPlanted(t *testing.T) {
	if m := missingPlanted(dump); len(m) != 0 {
		t.Errorf("every planted rule is in the dump, but missing: %q", m)
	}
	if m := missingPlanted("*filter\n-A FORWARD -s 192.0.2.2/32 -m comment --comment dpconform-planted -j DROP\nCOMMIT\n"); len(m) != 3 {
		t.Errorf("a dump with one planted rule is missing %d of them, want 3: %q", len(m), m)
	}
}
