package fuzz

import (
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	networkingv1 "k8s.io/api/networking/v1"

	"github.com/dpconform/dpconform/conformance/specs"
	"github.com/dpconform/dpconform/fv/matchers"
	"github.com/dpconform/dpconform/fv/netpolmodel"
	"github.com/dpconform/dpconform/fv/probe"
	"github.com/dpconform/dpconform/fv/timeline"
	"github.com/dpconform/dpconform/fv/workloads"
)

// fakePolicies is the netpol fixture at made-up addresses, with the sets of
// policies in force that cases put, in order (states[0] is none).
func fakePolicies(t *testing.T, cases ...string) *policies {
	ips := map[string]netip.Addr{}
	n := byte(1)
	for _, ns := range workloads.NetpolNamespaces {
		for _, name := range workloads.NetpolPods {
			ips[ns+"/"+name] = netip.AddrFrom4([4]byte{10, 0, 0, n})
			n++
		}
	}
	ip := func(id string) netip.Addr { return ips[id] }
	p := &policies{cluster: workloads.NetpolCluster(ip), states: [][]networkingv1.NetworkPolicy{nil}}
	all := specs.PolicyCases()
	for _, name := range cases {
		i := slices.IndexFunc(all, func(c specs.PolicyCase) bool { return c.Name == name })
		if i < 0 {
			t.Fatalf("no policy case %q", name)
		}
		var set []networkingv1.NetworkPolicy
		for _, pol := range all[i].Policies(ip) {
			set = append(set, *pol)
		}
		p.states = append(p.states, set)
	}
	return p
}

// policedWindow is a window from 0 to 4 s of attempts every 10 ms from x/b to x/a's port
// 80, delivered while deliver says; x's ingress is denied (state 1) at 1 s and
// open again (state 2) at 2.4 s, while node-a's agent is down from 2 s to ready at
// 2.5 s.
func policedWindow(deliver func(ms int) bool) (*timeline.Timeline, timeline.Window) {
	tl := timeline.New()
	tl.RecordAt(at(1000), EventPolicies, "1: create x/deny-ingress")
	tl.RecordAt(at(2000), timeline.StopSent, "node-a")
	tl.RecordAt(at(2400), EventPolicies, "2: delete x/deny-ingress")
	tl.RecordAt(at(2500), timeline.Ready, "node-a")
	pr := policyPairs[0]
	tl.Add(probe.Event{Time: at(0), Kind: probe.KindReady, Probe: pr.name(), Role: probe.RoleConnect})
	seq := uint64(0)
	for ms := 0; ms < 4000; ms += 10 {
		seq++
		e := probe.Event{Time: at(ms), Kind: probe.KindAttempt, Probe: pr.name(), Seq: seq, Outcome: probe.Timeout, Target: "10.0.0.1:80"}
		if deliver(ms) {
			e.Outcome, e.Backend = probe.OK, pr.to
		}
		tl.Add(e)
	}
	return tl, tl.Window(at(0), at(4000))
}

func TestPolicyAsModelled(t *testing.T) {
	g := NewWithT(t)
	p := fakePolicies(t, "deny all ingress in x", "no policies: everything reaches everything again")
	for _, c := range []struct {
		what    string
		deliver func(ms int) bool
		kind    matchers.Kind
	}{
		// Denied from 1 s, within 500 ms; open again at 2.4 s, and the agent ready at 2.5 s.
		{"as modelled", func(ms int) bool { return ms < 1300 || ms >= 2500 }, ""},
		{"delivered past the budget", func(ms int) bool { return ms < 1600 || ms >= 2500 }, matchers.KindDelivered},
		{"delivered while the agent is down, once the opening counts", func(ms int) bool { return ms < 1300 || ms >= 2250 }, ""},
		// The deny was shown at 1.32 s: while the agent is down it may not take it back.
		{"delivered while the agent is down, the deny shown", func(ms int) bool { return ms < 1300 || ms >= 2500 || (ms >= 2050 && ms < 2100) }, matchers.KindDelivered},
		{"lost before the change", func(ms int) bool { return ms != 500 && (ms < 1300 || ms >= 2500) }, matchers.KindTimeout},
		{"not open past the budget", func(ms int) bool { return ms < 1300 || ms >= 3100 }, matchers.KindTimeout},
	} {
		tl, w := policedWindow(c.deliver)
		m := &policyModel{tl: tl.Transitions, budget: 500 * time.Millisecond, timeout: 200 * time.Millisecond, p: p}
		chk := newPolicyAsModelled(m)
		chk.pairs = map[string]policyPair{policyPairs[0].name(): policyPairs[0]} // the one pair probed
		ok, err := chk.Match(w)
		g.Expect(err).NotTo(HaveOccurred(), c.what)
		if c.kind == "" {
			g.Expect(ok).To(BeTrue(), "%s: %s", c.what, chk.FailureMessage(nil))
			continue
		}
		g.Expect(ok).To(BeFalse(), c.what)
		g.Expect(chk.Result().Kind).To(Equal(c.kind), c.what)
		t.Logf("%s:\n%s", c.what, chk.FailureMessage(nil))
	}

	// A pair without a single attempt is a blind instrument, not a pass.
	tl, w := policedWindow(func(ms int) bool { return ms < 1300 || ms >= 2500 })
	chk := newPolicyAsModelled(&policyModel{tl: tl.Transitions, budget: 500 * time.Millisecond, p: p})
	_, err := chk.Match(w)
	g.Expect(err).To(MatchError(matchers.ErrInstrument))
	g.Expect(chk.Result().Verdict).To(Equal(matchers.Instrument))
}

// A change is shown on a pair only by attempts no earlier set still in force
// explains: x's ingress denied at 1 s (shown), opened at 1.6 s and denied again at
// 1.7 s. The attempts from 1.7 s that are not delivered may be the first deny
// still in force, the opening never having shown; a delivery after them is the
// opening programmed late, not the second deny taken back.
func TestPolicyAsModelledShownAfterUnshown(t *testing.T) {
	p := fakePolicies(t, "deny all ingress in x", "no policies: everything reaches everything again", "deny all ingress in x")
	for _, c := range []struct {
		what    string
		deliver func(ms int) bool
		kind    matchers.Kind
	}{
		{"the opening programmed after the second deny was written", func(ms int) bool { return ms < 1300 || (ms >= 1800 && ms < 1850) }, ""},
		{"delivered past the second deny's budget", func(ms int) bool { return ms < 1300 || (ms >= 1800 && ms < 1850) || ms == 2300 }, matchers.KindDelivered},
	} {
		g := NewWithT(t)
		tl := timeline.New()
		tl.RecordAt(at(1000), EventPolicies, "1: create x/deny-ingress")
		tl.RecordAt(at(1600), EventPolicies, "2: delete x/deny-ingress")
		tl.RecordAt(at(1700), EventPolicies, "3: create x/deny-ingress")
		pr := policyPairs[0]
		for ms, seq := 0, uint64(1); ms < 3000; ms, seq = ms+10, seq+1 {
			e := probe.Event{Time: at(ms), Kind: probe.KindAttempt, Probe: pr.name(), Seq: seq, Outcome: probe.Timeout}
			if c.deliver(ms) {
				e.Outcome, e.Backend = probe.OK, pr.to
			}
			tl.Add(e)
		}
		m := &policyModel{tl: tl.Transitions, budget: 500 * time.Millisecond, timeout: 200 * time.Millisecond, p: p}
		chk := newPolicyAsModelled(m)
		chk.pairs = map[string]policyPair{pr.name(): pr}
		ok, err := chk.Match(tl.Window(at(0), at(3000)))
		expectKind(g, c.what, chk, ok, err, c.kind)
	}
}

// withNewPod is fakePolicies with pod x/<name> (pod=b) appeared, and pr its pair.
func withNewPod(t *testing.T, policy, name string, pr policyPair) *policies {
	p := fakePolicies(t, policy)
	p.cluster.Pods = append(p.cluster.Pods, netpolmodel.Pod{Namespace: "x", Name: name, Labels: map[string]string{workloads.PodLabel: "b"},
		IP: netip.MustParseAddr("10.0.1.1"), Ports: p.cluster.Pods[0].Ports})
	p.born = map[string]policyPair{pr.name(): pr}
	return p
}

// datagram adds to tl datagram seq of pr, sent by sender at ms from the source
// address from, and its receipt, if it was received.
func datagram(tl *timeline.Timeline, sender string, pr policyPair, ms int, seq uint64, received bool, from string) {
	tl.Add(probe.Event{Time: at(ms), Kind: probe.KindSent, Probe: sender, Seq: seq, Outcome: probe.OK, Target: pr.name(), Peer: from})
	if received {
		tl.Add(probe.Event{Time: at(ms), End: at(ms + 1), Kind: probe.KindRecv, Probe: pr.to, From: sender, Seq: seq, Backend: pr.to, Target: pr.name(), Peer: from})
	}
}

// expectKind expects the check to have passed (kind empty) or failed with kind.
func expectKind(g Gomega, what string, chk *policyAsModelled, ok bool, err error, kind matchers.Kind) {
	g.Expect(err).NotTo(HaveOccurred(), what)
	g.Expect(ok).To(Equal(kind == ""), "%s: %s", what, chk.FailureMessage(nil))
	g.Expect(chk.Result().Kind).To(Equal(kind), what)
}

// matchPolicies runs the policy check on tl's window from -1 s to 1 s, fixed being
// the pairs whose probes must have attempts in it (the new pods' are p's).
func matchPolicies(p *policies, tl *timeline.Timeline, fixed ...policyPair) (*policyAsModelled, bool, error) {
	chk := newPolicyAsModelled(&policyModel{tl: tl.Transitions, budget: time.Second, timeout: 200 * time.Millisecond, p: p})
	chk.pairs = map[string]policyPair{}
	for _, pr := range fixed {
		chk.pairs[pr.name()] = pr
	}
	ok, err := chk.Match(tl.Window(at(-1000), at(1000)))
	return chk, ok, err
}

// A new pod's allowed pairs are held once it is wired (its first delivery), its
// denied ones from its first packet; its UDP pairs' datagrams as its TCP pairs'
// connections, a datagram no server received being lost.
func TestPolicyAsModelledNewPod(t *testing.T) {
	const admits, denies = "allow ingress to x/a from pod b of its own namespace", "deny all ingress in x"
	for _, c := range []struct {
		what, policy string
		udp          bool
		deliver      func(ms int) bool
		kind         matchers.Kind
	}{
		{"admitted, lost before it is wired", admits, false, func(ms int) bool { return ms >= 50 }, ""},
		{"admitted, lost once wired", admits, false, func(ms int) bool { return ms >= 50 && ms != 300 }, matchers.KindTimeout},
		{"denied, not delivered", denies, false, func(int) bool { return false }, ""},
		{"denied, delivered at its first packet", denies, false, func(ms int) bool { return ms == 0 }, matchers.KindDelivered},
		{"UDP: admitted, lost before it is wired", admits, true, func(ms int) bool { return ms >= 50 }, ""},
		{"UDP: admitted, a datagram lost once wired", admits, true, func(ms int) bool { return ms >= 50 && ms != 300 }, matchers.KindLost},
		{"UDP: denied, the first datagram delivered", denies, true, func(ms int) bool { return ms == 0 }, matchers.KindDelivered},
	} {
		g := NewWithT(t)
		pr := policyPair{from: "x/new-3", to: "x/a", port: 80, born: "x/new-3", udp: c.udp}
		p := withNewPod(t, c.policy, "new-3", pr)
		tl := timeline.New()
		tl.RecordAt(at(-10000), EventPolicies, "1: create")
		for ms, seq := 0, uint64(1); ms < 500; ms, seq = ms+2, seq+1 {
			if c.udp {
				datagram(tl, "birth-xnew3", pr, ms, seq, c.deliver(ms), peer(seq))
				continue
			}
			e := probe.Event{Time: at(ms), Kind: probe.KindAttempt, Probe: pr.name(), Seq: seq, Outcome: probe.Timeout}
			if c.deliver(ms) {
				e.Outcome, e.Backend = probe.OK, pr.to
			}
			tl.Add(e)
		}
		chk, ok, err := matchPolicies(p, tl)
		expectKind(g, c.what, chk, ok, err, c.kind)
	}
}

// A policy written shortly before a pod appears is not yet due (policy-programmed),
// but once the datapath has shown it on a fixed pair before the pod was created, the
// new pod's pairs are held to it from their first packet.
func TestPolicyAsModelledShownBeforeBirth(t *testing.T) {
	for _, c := range []struct {
		what  string
		shown bool
		kind  matchers.Kind
	}{
		{"not yet shown anywhere: not judged", false, ""},
		{"shown on x/b to x/a before the pod was created", true, matchers.KindDelivered},
	} {
		g := NewWithT(t)
		born := policyPair{from: "y/a", to: "x/new-3", port: 80, born: "x/new-3", udp: true}
		p := withNewPod(t, "deny all ingress in x", "new-3", born)
		fixed := policyPairs[0]
		tl := timeline.New()
		tl.RecordAt(at(-500), EventPolicies, "1: create x/deny-ingress")
		tl.RecordAt(at(-100), specs.EventPodCreating, "x/new-3")
		seq := uint64(0)
		for ms := -1000; ms < 500; ms += 10 {
			seq++
			e := probe.Event{Time: at(ms), Kind: probe.KindAttempt, Probe: fixed.name(), Seq: seq, Outcome: probe.OK, Backend: fixed.to}
			if c.shown && ms >= -450 || !c.shown && ms >= 300 {
				e.Outcome, e.Backend = probe.Timeout, ""
			}
			tl.Add(e)
		}
		// y/a's first datagrams to the new pod are delivered.
		for ms, seq := 0, uint64(1); ms < 500; ms, seq = ms+2, seq+1 {
			datagram(tl, "birth-ya-new-3", born, ms, seq, ms < 20, peer(seq))
		}
		chk, ok, err := matchPolicies(p, tl, fixed)
		expectKind(g, c.what, chk, ok, err, c.kind)
		if !ok {
			t.Logf("%s:\n%s", c.what, chk.FailureMessage(nil))
		}
	}
}

// A new pod's datagrams lost before it is wired show nothing of the policies: a deny
// written as it appears, still within policy-programmed when it is wired, does not
// yet hold its pairs (the clean reference, seed 20261207's round 7).
func TestPolicyAsModelledNotShownBeforeWired(t *testing.T) {
	g := NewWithT(t)
	pr := policyPair{from: "x/new-1", to: "x/a", port: 80, born: "x/new-1", udp: true}
	p := withNewPod(t, "deny all ingress in x", "new-1", pr)
	tl := timeline.New()
	tl.RecordAt(at(0), specs.EventPodCreating, "x/new-1")
	tl.RecordAt(at(100), EventPolicies, "1: create x/deny-ingress")
	for ms, seq := 50, uint64(1); ms < 500; ms, seq = ms+2, seq+1 {
		datagram(tl, "birth-xnew1", pr, ms, seq, ms >= 200, peer(seq))
	}
	chk, ok, err := matchPolicies(p, tl)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(ok).To(BeTrue(), chk.FailureMessage(nil))
}

// peer is the source a server saw datagram seq come from: a new port each.
func peer(seq uint64) string { return fmt.Sprintf("10.0.1.1:%d", 40000+seq) }

// A datagram from a port an earlier datagram of its pair was sent from belongs to
// that flow: the kernel reused the port for a new socket, and a datapath may pass
// the flow it admitted before the policies changed (or admitted on the way, to a
// receiver that never saw it). It is not judged; the same delivery from a new port
// is, and so is one on the port of a flow that was denied and never delivered.
// Where the sender does not name its ports, the receiver's view of them does.
func TestPolicyAsModelledReusedPort(t *testing.T) {
	for _, c := range []struct {
		what       string
		reuse      uint64 // the datagram whose port #200 reuses, or 0
		lost       uint64 // a datagram before the deny that was not received, or 0
		senderSays bool
		kind       matchers.Kind
	}{
		{"from the port of a datagram received before the deny", 3, 0, true, ""},
		{"from the port of a datagram sent before the deny, not received", 10, 10, true, ""},
		{"from the port of a datagram sent after the deny, not received", 100, 0, true, matchers.KindDelivered},
		{"from the port of a datagram received before the deny, seen by the receiver", 3, 0, false, ""},
		{"from a new port", 0, 0, true, matchers.KindDelivered},
	} {
		g := NewWithT(t)
		pr := policyPair{from: "x/new-1", to: "x/a", port: 80, born: "x/new-1", udp: true}
		p := withNewPod(t, "deny all ingress in x", "new-1", pr)
		tl := timeline.New()
		tl.RecordAt(at(0), specs.EventPodCreating, "x/new-1")
		tl.RecordAt(at(100), EventPolicies, "1: create x/deny-ingress")
		// Delivered until the deny holds at 150 ms, then not; datagram #200 (at
		// 448 ms) delivered again.
		for ms, seq := 50, uint64(1); ms < 500; ms, seq = ms+2, seq+1 {
			from := peer(seq)
			if seq == 200 && c.reuse != 0 {
				from = peer(c.reuse)
			}
			received := (ms < 150 && seq != c.lost) || seq == 200
			if c.senderSays {
				datagram(tl, "birth-xnew1", pr, ms, seq, received, from)
				continue
			}
			tl.Add(probe.Event{Time: at(ms), Kind: probe.KindSent, Probe: "birth-xnew1", Seq: seq, Outcome: probe.OK, Target: pr.name()})
			if received {
				tl.Add(probe.Event{Time: at(ms), End: at(ms + 1), Kind: probe.KindRecv, Probe: pr.to, From: "birth-xnew1", Seq: seq,
					Backend: pr.to, Target: pr.name(), Peer: from})
			}
		}
		chk, ok, err := matchPolicies(p, tl)
		expectKind(g, c.what, chk, ok, err, c.kind)
	}
}

// A write's burst: datagrams every 250 µs on the fixed pairs as UDP, judged as every
// attempt is. An update of x/allow-a from namespace y to "pod b, or namespace y"
// denies z/c both before and after it, and allows y/b: a datapath that applies the
// update as a delete and an add leaves x/a open for one round in between, and a
// datagram from z/c delivered then is a violation; so is one from y/b lost.
func TestPolicyAsModelledBurst(t *testing.T) {
	zc := burstPairs[policyPair{from: "z/c", to: "x/a", port: 80, udp: true}.name()]
	yb := burstPairs[policyPair{from: "y/b", to: "x/a", port: 80, udp: true}.name()]
	g := NewWithT(t)
	g.Expect(zc.udp && yb.udp).To(BeTrue(), "the burst's pairs are the fixed pairs as UDP")
	for _, c := range []struct {
		what string
		// open is the datagram (index, every 250 µs from the update) of each pair
		// that goes against what both versions say, or -1.
		zcDelivered, ybLost int
		kind                matchers.Kind
	}{
		{"both versions held throughout", -1, -1, ""},
		{"z/c delivered 3 ms after the update (x/a open for a round)", 12, -1, matchers.KindDelivered},
		{"y/b lost 3 ms after the update", -1, 12, matchers.KindLost},
	} {
		p := fakePolicies(t, "allow ingress to x/a from namespace y", "allow ingress to x/a from pod b, or from namespace y (two peers)")
		tl := timeline.New()
		tl.RecordAt(at(-10000), EventPolicies, "1: create x/allow-a")
		tl.RecordAt(at(0), EventPolicies, "2: update x/allow-a")
		for i := range 400 {
			t := at(0).Add(time.Duration(i) * 250 * time.Microsecond)
			for k, pr := range []policyPair{zc, yb} {
				seq := uint64(2*i + k + 1)
				delivered := pr == yb && i != c.ybLost || pr == zc && i == c.zcDelivered
				tl.Add(probe.Event{Time: t, Kind: probe.KindSent, Probe: "burst-2-" + pr.from, Seq: seq, Outcome: probe.OK, Target: pr.name()})
				if delivered {
					tl.Add(probe.Event{Time: t, End: t.Add(time.Millisecond), Kind: probe.KindRecv, Probe: pr.to, From: "burst-2-" + pr.from, Seq: seq,
						Backend: pr.to, Target: pr.name(), Peer: peer(seq)})
				}
			}
		}
		chk, ok, err := matchPolicies(p, tl)
		expectKind(g, c.what, chk, ok, err, c.kind)
		if !ok {
			t.Logf("%s:\n%s", c.what, chk.FailureMessage(nil))
		}
	}
}

// A write's burst that goes quiet on a pair (sends too few datagrams, or none on one
// side of the write) judged nothing of the moment the write was taken in: the round
// is void, not passed.
func TestPolicyAsModelledQuietBurst(t *testing.T) {
	const n = 400 // every 250 µs, from 5 ms before the write
	quiet := policyPair{from: "y/b", to: "x/a", port: 80, udp: true}.name()
	for _, c := range []struct {
		what string
		sent func(i int) bool // whether the quiet pair's datagram i was sent
		void bool
	}{
		{"every pair sent throughout", func(int) bool { return true }, false},
		{"y/b's probe sent nothing", func(int) bool { return false }, true},
		{"y/b's probe stopped before the write", func(i int) bool { return i < 16 }, true},
		{"y/b's probe started after the write", func(i int) bool { return i > 24 }, true},
		{"y/b's probe sent a third of its datagrams", func(i int) bool { return i%3 == 0 }, true},
		{"y/b's probe starved for 40 ms across the write, but sent", func(i int) bool { return i < 10 || i > 170 }, false},
	} {
		g := NewWithT(t)
		p := fakePolicies(t, "no policies: everything reaches everything again")
		tl := timeline.New()
		tl.RecordAt(at(0), EventPolicies, "1: delete x/none")
		seq := uint64(0)
		for _, pair := range slices.Sorted(maps.Keys(burstPairs)) {
			pr, name := burstPairs[pair], policyBurstProbe("1", pair)
			for i := range n {
				if pair == quiet && !c.sent(i) {
					continue
				}
				seq++
				datagram(tl, name, pr, -5+i/4, seq, true, peer(seq))
			}
		}
		chk := newPolicyAsModelled(&policyModel{tl: tl.Transitions, budget: time.Second, timeout: 200 * time.Millisecond, p: p, burst: n})
		chk.pairs = map[string]policyPair{}
		ok, err := chk.Match(tl.Window(at(-1000), at(1000)))
		if !c.void {
			expectKind(g, c.what, chk, ok, err, "")
			continue
		}
		g.Expect(err).To(MatchError(matchers.ErrInstrument), c.what)
		g.Expect(chk.Result().Verdict).To(Equal(matchers.Instrument), c.what)
		t.Logf("%s: %s", c.what, chk.Result().First)
	}
}
