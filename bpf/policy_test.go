package bpf

import (
	"errors"
	"fmt"
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"
)

// The policy tests run the endpoint programs as endpoint 1 (pod IP
// 10.244.0.5, see setup): tc egress sees the traffic to it, judged by its
// ingress policy; tc ingress the traffic from it, judged by its egress
// policy. Clients outside the node reach it through the host interface.
const (
	pod      = "10.244.0.5:8080" // endpoint 1 as a server
	outsider = "10.201.0.2:50000"
)

// ipset writes the IP set id: prefixes, then excepts.
func ipset(t *testing.T, d *Datapath, id uint32, prefixes []string, excepts ...string) {
	t.Helper()
	for _, p := range prefixes {
		must(t, d.IPSets().Put(IPSetKey{SetID: id, Prefix: netip.MustParsePrefix(p)}, IPSetValue{}))
	}
	for _, p := range excepts {
		must(t, d.IPSets().Put(IPSetKey{SetID: id, Prefix: netip.MustParsePrefix(p)}, IPSetValue{Except: true}))
	}
}

// toPod sends a packet from outside the node to endpoint 1: through the
// host interface, then the endpoint's tc egress, whose verdict it returns.
func toPod(t *testing.T, d *Datapath, p packet) uint32 {
	t.Helper()
	if r := run(t, d.objs.TcHostIngress, p.Bytes(), 0); r.Ret != tcActOK {
		t.Fatalf("%s at host ingress: returned %d", p, r.Ret)
	}
	return run(t, d.objs.TcEpEgress, p.Bytes(), 0).Ret
}

func verdict(ret uint32) string {
	switch ret {
	case tcActOK:
		return "pass"
	case tcActShot:
		return "drop"
	}
	return fmt.Sprintf("verdict %d", ret)
}

func expectVerdict(t *testing.T, what string, got, want uint32) {
	t.Helper()
	if got != want {
		t.Errorf("%s: %s, want %s", what, verdict(got), verdict(want))
	}
}

func TestPolicyIngressIsolatedWithoutRules(t *testing.T) {
	d := setup(t, Options{})
	// Admitted before the endpoint is isolated: a flow from outside, and
	// one the pod opened.
	expectVerdict(t, "SYN before isolation", toPod(t, d, tcp(client, pod, tcpSYN)), tcActOK)
	expectVerdict(t, "pod's SYN out", run(t, d.objs.TcEpIngress, tcp(clientPod, remotePod, tcpSYN).Bytes(), 0).Ret, tcActOK)

	must(t, d.SetEndpointPolicy(testIfindex, EndpointPolicy{IngressIsolated: true}))

	// A new flow is dropped at the pod, in TCP and UDP, and again when
	// retransmitted; the pod cannot answer it either.
	expectVerdict(t, "new SYN", toPod(t, d, tcp(outsider, pod, tcpSYN)), tcActShot)
	expectVerdict(t, "its retransmission", toPod(t, d, tcp(outsider, pod, tcpSYN)), tcActShot)
	expectVerdict(t, "new UDP", toPod(t, d, udp(outsider, pod)), tcActShot)
	expectVerdict(t, "pod answering a denied flow", run(t, d.objs.TcEpIngress, udp(pod, outsider).Bytes(), 0).Ret, tcActShot)

	// The admitted flows carry on, in both directions.
	expectVerdict(t, "ACK of the admitted flow", toPod(t, d, tcp(client, pod, tcpACK)), tcActOK)
	expectVerdict(t, "pod's reply on it", run(t, d.objs.TcEpIngress, tcp(pod, client, tcpSYN|tcpACK).Bytes(), 0).Ret, tcActOK)
	r, _ := runPacket(t, d.objs.TcHostIngress, tcp(remotePod, clientPod, tcpSYN|tcpACK))
	expectVerdict(t, "reply to the pod's flow at host ingress", r.Ret, tcActOK)
	expectVerdict(t, "reply to the pod's flow", run(t, d.objs.TcEpEgress, tcp(remotePod, clientPod, tcpSYN|tcpACK).Bytes(), 0).Ret, tcActOK)

	// Anything the datapath does not parse is left alone.
	icmp := tcp(outsider, pod, 0).Bytes()
	icmp[14+9] = 1
	expectVerdict(t, "ICMP", run(t, d.objs.TcEpEgress, icmp, 0).Ret, tcActOK)
}

func TestPolicyIngressRules(t *testing.T) {
	d := setup(t, Options{})
	ipset(t, d, 5, []string{"10.200.0.0/24"}, "10.200.0.3/32")
	ipset(t, d, 6, []string{"10.203.0.9/32"})
	must(t, d.SetEndpointPolicy(testIfindex, EndpointPolicy{IngressIsolated: true, Ingress: []PolicyRule{
		{SetID: 5}, // an ipBlock with except, any port
		{SetID: 6, Proto: TCP, PortMin: 8000, PortMax: 8100}, // a port range
		{Proto: UDP, PortMin: 53, PortMax: 53},               // any peer, one port
	}}))

	for _, tc := range []struct {
		name string
		p    packet
		want uint32
	}{
		{"member of the block", tcp("10.200.0.2:40000", pod, tcpSYN), tcActOK},
		{"its neighbour", tcp("10.200.0.4:40000", pod, tcpSYN), tcActOK},
		{"the except", tcp("10.200.0.3:40000", pod, tcpSYN), tcActShot},
		{"the except, UDP", udp("10.200.0.3:40000", pod), tcActShot},
		{"outside the block", tcp("10.200.1.2:40000", pod, tcpSYN), tcActShot},
		{"port range, low end", tcp("10.203.0.9:40000", "10.244.0.5:8000", tcpSYN), tcActOK},
		{"port range, high end", tcp("10.203.0.9:40001", "10.244.0.5:8100", tcpSYN), tcActOK},
		{"past the port range", tcp("10.203.0.9:40002", "10.244.0.5:8101", tcpSYN), tcActShot},
		{"below the port range", tcp("10.203.0.9:40003", "10.244.0.5:7999", tcpSYN), tcActShot},
		{"port range, other protocol", udp("10.203.0.9:40004", "10.244.0.5:8080"), tcActShot},
		{"any peer, its port", udp(outsider, "10.244.0.5:53"), tcActOK},
		{"any peer, its port, other protocol", tcp(outsider, "10.244.0.5:53", tcpSYN), tcActShot},
	} {
		t.Run(tc.name, func(t *testing.T) {
			expectVerdict(t, tc.p.String(), toPod(t, d, tc.p), tc.want)
		})
	}
}

// An admitted flow is noted in conntrack (both entries), and not judged
// again: neither by a change of policy nor by the pod's replies. A bare SYN
// that restarts its tuple is judged afresh.
func TestPolicyIngressOK(t *testing.T) {
	d := setup(t, Options{})
	ipset(t, d, 5, []string{"10.200.0.0/24"})
	must(t, d.SetEndpointPolicy(testIfindex, EndpointPolicy{IngressIsolated: true, Ingress: []PolicyRule{{SetID: 5}}}))

	expectVerdict(t, "SYN of a member", toPod(t, d, tcp(client, pod, tcpSYN)), tcActOK)
	if v := ctEntry(t, d, client, pod, TCP); v.Flags != ConntrackHostIngress|ConntrackIngressOK {
		t.Errorf("original entry flags %#x, want ConntrackHostIngress|ConntrackIngressOK", v.Flags)
	}
	if v := ctEntry(t, d, pod, client, TCP); v.Flags != ConntrackHostIngress|ConntrackReply|ConntrackIngressOK {
		t.Errorf("reply entry flags %#x, want ConntrackHostIngress|ConntrackReply|ConntrackIngressOK", v.Flags)
	}

	// The member leaves the set: the flow carries on, a new one is dropped.
	must(t, d.IPSets().Delete(IPSetKey{SetID: 5, Prefix: netip.MustParsePrefix("10.200.0.0/24")}))
	expectVerdict(t, "ACK after the change", toPod(t, d, tcp(client, pod, tcpACK)), tcActOK)
	expectVerdict(t, "reply after the change", run(t, d.objs.TcEpIngress, tcp(pod, client, tcpACK).Bytes(), 0).Ret, tcActOK)
	expectVerdict(t, "another flow of the client", toPod(t, d, tcp("10.200.0.2:50001", pod, tcpSYN)), tcActShot)

	// The tuple restarts: judged again, denied, and no longer noted.
	expectVerdict(t, "SYN restarting the tuple", toPod(t, d, tcp(client, pod, tcpSYN)), tcActShot)
	if v := ctEntry(t, d, client, pod, TCP); v.Flags&ConntrackIngressOK != 0 {
		t.Errorf("original entry flags %#x after the restart", v.Flags)
	}
	if v := ctEntry(t, d, pod, client, TCP); v.Flags&ConntrackIngressOK != 0 {
		t.Errorf("reply entry flags %#x after the restart", v.Flags)
	}
	expectVerdict(t, "reply to the restarted flow", run(t, d.objs.TcEpIngress, tcp(pod, client, tcpSYN|tcpACK).Bytes(), 0).Ret, tcActShot)
}

// Ingress of a DNAT flow: the pod is a NodePort backend; the flow is judged
// by its client's address, the backend's port, and noted on the reply entry.
func TestPolicyIngressNodePort(t *testing.T) {
	d := setup(t, Options{})
	service(t, d, nodePort, TCP, 3, pod)
	ipset(t, d, 5, []string{"10.200.0.2/32"})
	must(t, d.SetEndpointPolicy(testIfindex, EndpointPolicy{IngressIsolated: true, Ingress: []PolicyRule{{SetID: 5, Proto: TCP, PortMin: 8080, PortMax: 8080}}}))

	for _, tc := range []struct {
		client string
		want   uint32
	}{{client, tcActOK}, {"10.200.0.3:50000", tcActShot}} {
		r, got := runPacket(t, d.objs.TcHostIngress, tcp(tc.client, nodePort, tcpSYN))
		expect(t, "SYN at host ingress", r, got, tcActOK, MarkSeen, tc.client, pod)
		expectVerdict(t, "SYN from "+tc.client+" at the backend", run(t, d.objs.TcEpEgress, got.Bytes(), 0).Ret, tc.want)
		reply := run(t, d.objs.TcEpIngress, tcp(pod, tc.client, tcpSYN|tcpACK).Bytes(), 0).Ret
		expectVerdict(t, "the backend's reply to "+tc.client, reply, tc.want)
	}
	if v := ctEntry(t, d, pod, client, TCP); v.Flags != ConntrackReply|ConntrackDNAT|ConntrackHostIngress|ConntrackIngressOK {
		t.Errorf("reply entry flags %#x", v.Flags)
	}
}

// Egress is judged after service DNAT: by the backend, not the frontend. A
// denied flow leaves no conntrack entry.
func TestPolicyEgressAfterDNAT(t *testing.T) {
	d := setup(t, Options{})
	service(t, d, clusterIP, TCP, 1, remotePod)
	service(t, d, "10.96.0.11:80", TCP, 2, remotePod2)
	ipset(t, d, 7, []string{"10.244.1.10/32", "10.96.0.11/32"}) // remotePod and the second frontend
	must(t, d.SetEndpointPolicy(testIfindex, EndpointPolicy{EgressIsolated: true, Egress: []PolicyRule{{SetID: 7}}}))

	r, got := runPacket(t, d.objs.TcEpIngress, tcp(clientPod, clusterIP, tcpSYN))
	expect(t, "SYN to a frontend whose backend is allowed", r, got, tcActOK, MarkSeen, clientPod, remotePod)
	r, got = runPacket(t, d.objs.TcEpIngress, tcp(clientPod, clusterIP, tcpACK))
	expect(t, "the rest of its flow", r, got, tcActOK, MarkSeen, clientPod, remotePod)

	for _, tc := range []struct {
		name string
		p    packet
	}{
		{"an allowed frontend whose backend is not", tcp("10.244.0.5:40001", "10.96.0.11:80", tcpSYN)},
		{"UDP to a pod not allowed", udp("10.244.0.5:40002", remotePod2)},
		{"TCP to a pod not allowed", tcp("10.244.0.5:40003", remotePod2, tcpSYN)},
	} {
		expectVerdict(t, tc.name, run(t, d.objs.TcEpIngress, tc.p.Bytes(), 0).Ret, tcActShot)
		k := ConntrackKey{Src: tc.p.Src.Addr(), Dst: tc.p.Dst.Addr(), SrcPort: tc.p.Src.Port(), DstPort: tc.p.Dst.Port(), Proto: tc.p.Proto}
		if _, err := d.Conntrack().Lookup(k); !errors.Is(err, ebpf.ErrKeyNotExist) {
			t.Errorf("%s: denied flow left a conntrack entry (%v)", tc.name, err)
		}
	}
	expectVerdict(t, "TCP to an allowed pod directly", run(t, d.objs.TcEpIngress, tcp("10.244.0.5:40004", remotePod, tcpSYN).Bytes(), 0).Ret, tcActOK)

	// Replies to the pod's own flows pass; a new flow to the pod is not
	// egress's business.
	expectVerdict(t, "reply to the pod", run(t, d.objs.TcEpEgress, tcp(remotePod, clientPod, tcpSYN|tcpACK).Bytes(), 0).Ret, tcActOK)
	expectVerdict(t, "new flow to the pod", toPod(t, d, tcp(outsider, pod, tcpSYN)), tcActOK)
	expectVerdict(t, "pod's reply on it", run(t, d.objs.TcEpIngress, tcp(pod, outsider, tcpSYN|tcpACK).Bytes(), 0).Ret, tcActOK)
}

// Rules written to the slot that is not live take effect only with the flip;
// stale rules beyond the live count are ignored.
func TestPolicySlotFlip(t *testing.T) {
	d := setup(t, Options{})
	ipset(t, d, 5, []string{"10.200.0.0/24"})
	must(t, d.SetEndpointPolicy(testIfindex, EndpointPolicy{IngressIsolated: true}))
	ep, err := d.Endpoints().Lookup(testIfindex)
	must(t, err)
	live := ep.PolicySlot
	if ep.Flags != EndpointIngressIsolated || ep.IngressRules != 0 {
		t.Errorf("endpoint %+v", ep)
	}

	// A rule in the other slot, and one beyond the live count: not live.
	must(t, d.Policy().Put(PolicyKey{Ifindex: testIfindex, Dir: Ingress, Slot: live ^ 1}, PolicyRule{SetID: 5}))
	must(t, d.Policy().Put(PolicyKey{Ifindex: testIfindex, Dir: Ingress, Slot: live}, PolicyRule{}))
	expectVerdict(t, "before the flip", toPod(t, d, tcp("10.200.0.2:40000", pod, tcpSYN)), tcActShot)

	must(t, d.SetEndpointPolicy(testIfindex, EndpointPolicy{IngressIsolated: true, Ingress: []PolicyRule{{SetID: 5}}}))
	ep, err = d.Endpoints().Lookup(testIfindex)
	must(t, err)
	if ep.PolicySlot != live^1 || ep.IngressRules != 1 || ep.PodIP != ip("10.244.0.5") {
		t.Errorf("endpoint after the flip %+v, want slot %d and 1 rule", ep, live^1)
	}
	expectVerdict(t, "member after the flip", toPod(t, d, tcp("10.200.0.2:40001", pod, tcpSYN)), tcActOK)
	expectVerdict(t, "non-member after the flip", toPod(t, d, tcp(outsider, pod, tcpSYN)), tcActShot)

	// Flipping back writes the old slot anew, without its stale rule.
	must(t, d.SetEndpointPolicy(testIfindex, EndpointPolicy{IngressIsolated: true, Ingress: []PolicyRule{{SetID: 6}}}))
	if _, err := d.Policy().Lookup(PolicyKey{Ifindex: testIfindex, Dir: Ingress, Slot: live, Index: 0}); err != nil {
		t.Errorf("rule 0 of slot %d: %v", live, err)
	}
	expectVerdict(t, "member of the old set after flipping back", toPod(t, d, tcp("10.200.0.2:40002", pod, tcpSYN)), tcActShot)
}

func TestPolicyNotIsolated(t *testing.T) {
	d := setup(t, Options{})
	// Rules without isolation are stored but not consulted.
	must(t, d.SetEndpointPolicy(testIfindex, EndpointPolicy{Ingress: []PolicyRule{{SetID: 99}}, Egress: []PolicyRule{{SetID: 99}}}))
	expectVerdict(t, "new flow to the pod", toPod(t, d, tcp(outsider, pod, tcpSYN)), tcActOK)
	expectVerdict(t, "new flow from the pod", run(t, d.objs.TcEpIngress, udp(clientPod, remotePod).Bytes(), 0).Ret, tcActOK)
	// Admitted all the same, so that isolating the pod later cuts no flow.
	if v := ctEntry(t, d, outsider, pod, TCP); v.Flags != ConntrackHostIngress|ConntrackIngressOK {
		t.Errorf("original entry flags %#x", v.Flags)
	}
	must(t, d.SetEndpointPolicy(testIfindex, EndpointPolicy{IngressIsolated: true, EgressIsolated: true}))
	expectVerdict(t, "the flow to the pod, once isolated", toPod(t, d, tcp(outsider, pod, tcpACK)), tcActOK)
	expectVerdict(t, "the pod's reply, once isolated", run(t, d.objs.TcEpIngress, tcp(pod, outsider, tcpACK).Bytes(), 0).Ret, tcActOK)
	expectVerdict(t, "the flow from the pod, once isolated", run(t, d.objs.TcEpIngress, udp(clientPod, remotePod).Bytes(), 0).Ret, tcActOK)
}

// The verifier accepts the programs, and they search all of the
// MaxPolicyRules rules of a direction.
func TestPolicyMaxRules(t *testing.T) {
	d := setup(t, Options{})
	ipset(t, d, 5, []string{"10.200.0.2/32"})
	rules := make([]PolicyRule, MaxPolicyRules)
	for i := range rules {
		rules[i] = PolicyRule{SetID: uint32(1000 + i)} // empty sets
	}
	rules[MaxPolicyRules-1] = PolicyRule{SetID: 5}
	must(t, d.SetEndpointPolicy(testIfindex, EndpointPolicy{IngressIsolated: true, Ingress: rules, EgressIsolated: true, Egress: rules}))
	expectVerdict(t, "matching the last rule", toPod(t, d, tcp(client, pod, tcpSYN)), tcActOK)
	expectVerdict(t, "matching none", toPod(t, d, tcp(outsider, pod, tcpSYN)), tcActShot)
	expectVerdict(t, "egress, matching the last rule", run(t, d.objs.TcEpIngress, udp(clientPod, "10.200.0.2:53").Bytes(), 0).Ret, tcActOK)

	err := d.SetEndpointPolicy(testIfindex, EndpointPolicy{IngressIsolated: true, Ingress: append(rules, PolicyRule{})})
	if err == nil {
		t.Errorf("%d rules accepted", MaxPolicyRules+1)
	}
}

func TestEndpointPolicyAPI(t *testing.T) {
	requireBPF(t)
	enterNewNetns(t)
	d := open(t, bpffs(t), Options{})
	a, b := addVeth(t, "dpc-pol0", "dpc-pol1")
	podIP := ip("10.244.0.9")
	isolated := EndpointPolicy{IngressIsolated: true, Ingress: []PolicyRule{{SetID: 5}, {SetID: 6}}, Egress: []PolicyRule{{Proto: UDP, PortMin: 53, PortMax: 53}}}

	if err := d.SetEndpointPolicy(a, isolated); !errors.Is(err, ErrUnknownEndpoint) {
		t.Errorf("policy of an unknown endpoint: %v, want ErrUnknownEndpoint", err)
	}
	if err := d.AttachEndpoint(a, podIP, EndpointIngressIsolated); err == nil {
		t.Error("AttachEndpoint took an isolation flag")
	}

	// A new endpoint has no policy; a re-attach keeps the policy it got.
	must(t, d.AttachEndpoint(a, podIP, EndpointAntiSpoof))
	if ep, err := d.Endpoints().Lookup(uint32(a)); err != nil || ep != (EndpointValue{PodIP: podIP, Flags: EndpointAntiSpoof}) {
		t.Errorf("new endpoint %+v (%v)", ep, err)
	}
	must(t, d.SetEndpointPolicy(a, isolated))
	must(t, d.AttachEndpoint(a, podIP, 0))
	ep, err := d.Endpoints().Lookup(uint32(a))
	must(t, err)
	if ep.Flags != EndpointIngressIsolated || ep.IngressRules != 2 || ep.EgressRules != 1 {
		t.Errorf("re-attached endpoint %+v, want its policy kept", ep)
	}

	// With its policy, in one write.
	must(t, d.AttachEndpointWithPolicy(b, podIP, EndpointAntiSpoof, isolated))
	if ep, err := d.Endpoints().Lookup(uint32(b)); err != nil || ep != (EndpointValue{PodIP: podIP, Flags: EndpointAntiSpoof | EndpointIngressIsolated, IngressRules: 2, EgressRules: 1}) {
		t.Errorf("endpoint attached with policy %+v (%v)", ep, err)
	}
	if r, err := d.Policy().Lookup(PolicyKey{Ifindex: uint32(b), Dir: Ingress, Slot: 0, Index: 1}); err != nil || r != (PolicyRule{SetID: 6}) {
		t.Errorf("rule 1: %+v (%v)", r, err)
	}

	// Detaching forgets the endpoint's rules, in both slots.
	must(t, d.DetachEndpoint(a))
	must(t, d.DetachEndpoint(b))
	all, err := d.Policy().All()
	must(t, err)
	if len(all) != 0 {
		t.Errorf("rules left after detach: %v", all)
	}
	if _, err := d.Endpoints().Lookup(uint32(a)); !errors.Is(err, ebpf.ErrKeyNotExist) {
		t.Errorf("endpoint left after detach: %v", err)
	}
}

// A flow whose first packets reached an isolated pod before the pod's programs
// were attached (a pod that predates the datapath, as after a switch from
// kube-proxy) was never judged by the pod's ingress. The pod's reply has it
// judged: an admitted flow goes on, with one allow for the flow, as if its first
// packet had met the programs; a denied one is dropped, each reply reported as a
// reply on a flow not admitted.
func TestReplyJudgesAFlowThatPredatesThePodsPrograms(t *testing.T) {
	d := setup(t, Options{})
	r := verdicts(t, d)
	ipset(t, d, 5, []string{"10.200.0.2/32"}) // client
	must(t, d.SetEndpointPolicy(testIfindex, EndpointPolicy{IngressIsolated: true, Ingress: []PolicyRule{{SetID: 5}}}))

	t0 := monotonicNow(t)
	member, nonMember := tcp(client, pod, tcpSYN), tcp(outsider, pod, tcpSYN)
	for _, p := range []packet{member, nonMember} {
		// Through the host interface only: the pod's programs are not there yet.
		if res := run(t, d.objs.TcHostIngress, p.Bytes(), 0); res.Ret != tcActOK {
			t.Fatalf("%s at host ingress: returned %d", p, res.Ret)
		}
	}
	admitted, notAdmitted := tcp(pod, client, tcpSYN|tcpACK), tcp(pod, outsider, tcpSYN|tcpACK)
	expectVerdict(t, "the pod's SYN-ACK to the member", run(t, d.objs.TcEpIngress, admitted.Bytes(), 0).Ret, tcActOK)
	expectVerdict(t, "the pod's SYN-ACK to the non-member", run(t, d.objs.TcEpIngress, notAdmitted.Bytes(), 0).Ret, tcActShot)
	expectVerdicts(t, "the replies", r, t0, allow(Ingress, member), deny(Ingress, ReasonNotAdmitted, notAdmitted))

	// The admitted flow goes on both ways, not judged again; the other does not.
	t0 = monotonicNow(t)
	expectVerdict(t, "the member's ACK", toPod(t, d, tcp(client, pod, tcpACK)), tcActOK)
	expectVerdict(t, "the pod's next reply to the member", run(t, d.objs.TcEpIngress, tcp(pod, client, tcpACK).Bytes(), 0).Ret, tcActOK)
	expectVerdict(t, "the pod's next reply to the non-member", run(t, d.objs.TcEpIngress, notAdmitted.Bytes(), 0).Ret, tcActShot)
	expectVerdicts(t, "the rest of the flows", r, t0, deny(Ingress, ReasonNotAdmitted, notAdmitted))
}
