package fuzz

import (
	"context"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"

	"github.com/dpconform/dpconform/conformance"
	"github.com/dpconform/dpconform/conformance/specs"
	"github.com/dpconform/dpconform/fv/matchers"
	"github.com/dpconform/dpconform/fv/monotime"
	"github.com/dpconform/dpconform/fv/netpolmodel"
	"github.com/dpconform/dpconform/fv/probe"
	"github.com/dpconform/dpconform/fv/timeline"
	"github.com/dpconform/dpconform/fv/workloads"
	"github.com/dpconform/dpconform/topologies"
)

// EventPolicies: one NetworkPolicy of the round's is about to be written; its detail
// is "3: delete x/allow-a", where 3 numbers the set of policies in force once the
// write is done (policyModel's states).
const EventPolicies = "fuzz-policies"

// Names of the events a policy write's burst records, once its probes all send and
// when they stop: their detail is the number of the set the write makes.
const (
	EventPolicyBurstStart = "policy-burst-start"
	EventPolicyBurstEnd   = "policy-burst-end"
)

var policyBurstEvents = spanEvents{EventPolicyBurstStart, EventPolicyBurstEnd}

// PolicyCases are the names of the cases an OpPolicy step puts in force:
// POLICY-TRUTH-TABLE's, in its order.
func PolicyCases() []string {
	var names []string
	for _, c := range specs.PolicyCases() {
		names = append(names, c.Name)
	}
	return names
}

// policyPair is a pair of the netpol fixture's pods a round with policy steps probes
// with new TCP connections: from, to and to's port. The pairs are those the truth
// table's cases tell apart most (x/a is the pod most of them isolate): an ipBlock
// and its except (y/b, z/c, y/c), a named port (81), egress by port (y/b's 80 and
// 81), and pairs every deny case denies.
type policyPair struct {
	from, to string
	port     int32
	// born is the new pod (OpPod) the pair goes from or to, or empty.
	born string
	// udp: the pair is probed with UDP datagrams, each from a new socket (a new
	// flow each), rather than TCP connections.
	udp bool
}

var policyPairs = []policyPair{
	{from: "x/b", to: "x/a", port: 80}, {from: "x/b", to: "x/a", port: 81}, {from: "y/b", to: "x/a", port: 80}, {from: "z/c", to: "x/a", port: 80}, {from: "y/a", to: "x/a", port: 81},
	{from: "x/a", to: "y/b", port: 80}, {from: "x/a", to: "y/b", port: 81}, {from: "x/a", to: "y/c", port: 80}, {from: "x/a", to: "z/a", port: 80},
}

// name is the pair's probe: "policy-xb-xa-80", "policy-udp-xnew5-xa-80".
func (p policyPair) name() string {
	proto := ""
	if p.udp {
		proto = "udp-"
	}
	return fmt.Sprintf("policy-%s%s-%s-%d", proto, strings.ReplaceAll(p.from, "/", ""), strings.ReplaceAll(p.to, "/", ""), p.port)
}

func (p policyPair) protocol() corev1.Protocol {
	if p.udp {
		return corev1.ProtocolUDP
	}
	return corev1.ProtocolTCP
}

// probe is the pair's probe from its source: a new connection to to's port every
// policyInterval.
func (p policyPair) probe(e *conformance.Env, to netip.Addr) probe.Connect {
	return probe.Connect{Name: p.name(), Target: netip.AddrPortFrom(to, uint16(p.port)).String(), Interval: policyInterval, Timeout: e.Budgets.AttemptTimeout}
}

// birthDatagrams is how many datagrams each of a new pod's UDP pairs sends from its
// first possible packet, one every connect-interval (2 ms): a second's worth. A
// source sends to all its pairs from one probe, in turn, so that they start together
// (one probe after another, the last would start tens of milliseconds after the
// first); each datagram carries its pair's name as its destination's label.
// The window in which a new pod is open before its policy, or closed to a peer
// whose policy admits it (programs attached before the IP sets were written), lasts
// from tens of microseconds to milliseconds, as the ORDER specs measure it: TCP
// connections every policyInterval miss it, and a datagram is a flow of its own,
// judged afresh.
const birthDatagrams = 500

// birthPairs are newPodPairs probed with TCP, and again with UDP.
func birthPairs() []policyPair {
	return append(slices.Clone(newPodPairs), udpTwins(newPodPairs)...)
}

// udpTwins are prs probed with UDP.
func udpTwins(prs []policyPair) []policyPair {
	out := slices.Clone(prs)
	for i := range out {
		out[i].udp = true
	}
	return out
}

// newPodPairs are the pairs of a pod that appears (OpPod): x/new-N, labelled as
// x/a or x/b, on node 1, whose connections open from its first packet (topologies'
// OnWired, before the API knows its address), to x/a (which cases isolate and admit
// pod b or namespace x to), y/b and z/c (egress cases), and into it from z/c and
// y/a. "new" stands for the pod.
var newPodPairs = []policyPair{
	{from: "new", to: "x/a", port: 80}, {from: "new", to: "x/a", port: 81}, {from: "new", to: "y/b", port: 80}, {from: "new", to: "z/c", port: 80},
	{from: "z/c", to: "new", port: 80}, {from: "y/a", to: "new", port: 80},
}

// policyInterval is the time between new connections of each policy pair: 20 a
// second each, 180 for the fixed pairs and 120 more for each pod that appears,
// beside the service paths' 200. Every one is a flow in the datapath's conntrack,
// and a round holds them for tens of seconds: at 10 ms (1,500 to 2,100 new flows a
// second) the reference's table of 65,536 entries, two a flow, fills in about 20 s,
// and that is when new NodePort connections of the clean reference timed out
// (docs/results/notes/fuzzing.md): load, likely, rather than transitions. A window in which
// a datapath is open or closed when it should not be (an agent's first round after
// its start, a new pod's wiring) lasts tens of milliseconds on several pairs at once;
// one of a few hundred microseconds is the ORDER specs' to catch, with their finer
// probes.
const policyInterval = 50 * time.Millisecond

// burstFor is how long each fixed pair is probed with UDP datagrams, one every
// order-interval (250 µs), each from a new socket, after each write of policies:
// the burst starts before the write (once its nine probes are all sending) and
// goes on past the moment the implementation takes the change in. A write taken
// in as two (a delete, then the add a round later: ORDER-POLICY-REPLACE's
// delete-then-add) leaves the pods the policy selects with only their other
// policies for one agent round, some hundred microseconds: policyInterval's
// connections, 50 ms apart, pass it by, and a datagram, a flow of its own judged
// afresh, falls in it on a pair about once in two. A burst is at least 400
// datagrams a pair after the write, 3,600 for the nine. A step's next write waits
// for the burst to end, so the writes of one step are at least burstFor apart.
const burstFor = 100 * time.Millisecond

// burstSends is how many datagrams each pair of a write's burst sends in burstFor,
// one every order-interval: it sends as many after the write at least.
func burstSends(b conformance.Budgets) int { return int(burstFor / b.OrderInterval) }

// burstPairs are policyPairs probed with UDP, by probe name: a write's burst.
var burstPairs = func() map[string]policyPair {
	out := map[string]policyPair{}
	for _, pr := range udpTwins(policyPairs) {
		out[pr.name()] = pr
	}
	return out
}()

// policies is a round's netpol fixture and the NetworkPolicies the round has put in
// force: states[0] is none, and every write adds the set in force after it.
type policies struct {
	f       *workloads.Netpol
	cluster netpolmodel.Cluster
	cases   map[string]specs.PolicyCase

	mu      sync.Mutex
	inForce map[string]*networkingv1.NetworkPolicy // "ns/name" -> the policy
	states  [][]networkingv1.NetworkPolicy
	born    map[string]policyPair // the new pods' pairs, by probe
}

func deployPolicies(ctx context.Context, e *conformance.Env) (*policies, error) {
	f, err := workloads.DeployNetpol(ctx, e.World)
	if err != nil {
		return nil, err
	}
	p := &policies{f: f, cases: map[string]specs.PolicyCase{}, inForce: map[string]*networkingv1.NetworkPolicy{}, states: [][]networkingv1.NetworkPolicy{nil}, born: map[string]policyPair{}}
	p.cluster = workloads.NetpolCluster(p.ip)
	for _, c := range specs.PolicyCases() {
		p.cases[c.Name] = c
	}
	return p, nil
}

// addPod adds the new pod name (OpPod), labelled as x/like, on node, starting its
// server and its pairs' probes as soon as it is wired.
func (p *policies) addPod(ctx context.Context, e *conformance.Env, name, like string, node topologies.Node) error {
	id := "x/" + name
	spec := workloads.NetpolPodSpec("x", name, node.Name())
	spec.Labels = map[string]string{workloads.PodLabel: like}
	spec.OnWired = func(ctx context.Context, pod topologies.Pod) error {
		p.mu.Lock()
		ports := p.cluster.Pods[0].Ports
		p.cluster.Pods = append(p.cluster.Pods, netpolmodel.Pod{Namespace: "x", Name: name, Labels: spec.Labels, IP: pod.IP(), Ports: ports})
		p.mu.Unlock()
		if _, err := e.World.StartProbe(ctx, pod, workloads.NetpolServe(id)); err != nil {
			return fmt.Errorf("serve on %s: %w", id, err)
		}
		// Every pair's probe starts at once: one after another, the last would
		// start tens of milliseconds after the first, past the window of a
		// dataplane that programs the pod quickly (as ORDER-NEW-ENDPOINT-INGRESS
		// starts its clients).
		type started struct {
			from topologies.Pod
			cfg  probe.Config
		}
		var probes []started
		births := map[string]int{} // a source's UDP probe, by its index in probes
		for _, pr := range birthPairs() {
			pr.born = id
			from, to := pod, pod
			pr.from, pr.to = strings.Replace(pr.from, "new", id, 1), strings.Replace(pr.to, "new", id, 1)
			if pr.from != id {
				f, _ := p.pod(pr.from)
				from = f.Pod
			}
			if pr.to != id {
				t, _ := p.pod(pr.to)
				to = t.Pod
			}
			p.mu.Lock()
			p.born[pr.name()] = pr
			p.mu.Unlock()
			if !pr.udp {
				probes = append(probes, started{from, pr.probe(e, to.IP())})
				continue
			}
			i, ok := births[pr.from]
			if !ok {
				i, births[pr.from] = len(probes), len(probes)
				probes = append(probes, started{from, probe.UDP{Name: "birth-" + strings.ReplaceAll(pr.from, "/", "") + "-" + name, NewSocket: true}})
			}
			b := probes[i].cfg.(probe.UDP)
			b.To = append(b.To, probe.Destination{Label: pr.name(), Addr: netip.AddrPortFrom(to.IP(), uint16(pr.port)).String()})
			b.Interval, b.Count = e.Budgets.ConnectInterval/time.Duration(len(b.To)), birthDatagrams*len(b.To)
			probes[i].cfg = b
		}
		var g errgroup.Group
		for _, s := range probes {
			g.Go(func() error {
				if _, err := e.World.StartProbe(ctx, s.from, s.cfg); err != nil {
					return fmt.Errorf("probe %s: %w", s.cfg.ProbeName(), err)
				}
				return nil
			})
		}
		return g.Wait()
	}
	e.Record(specs.EventPodCreating, id)
	return conformance.AddPod(spec, nil).Do(ctx, e)
}

func (p *policies) ip(id string) netip.Addr {
	if pod, ok := p.pod(id); ok {
		return pod.Pod.IP()
	}
	return netip.Addr{}
}

// put makes the case's policies the ones in force, as the truth table does: those it
// does not name are deleted, then the others created or updated in place, each write
// recorded first with the set it makes, inside a burst of datagrams on the fixed
// pairs (burst).
func (p *policies) put(ctx context.Context, e *conformance.Env, name string) error {
	c, ok := p.cases[name]
	if !ok {
		return fmt.Errorf("no policy case %q", name)
	}
	want := c.Policies(p.ip)
	keep := map[string]bool{}
	for _, pol := range want {
		keep[key(pol)] = true
	}
	for _, k := range slices.Sorted(maps.Keys(p.inForce)) {
		if keep[k] {
			continue
		}
		pol := p.inForce[k]
		if err := p.burst(ctx, e, func() error {
			p.write(e, "delete "+k, func(m map[string]*networkingv1.NetworkPolicy) { delete(m, k) })
			return conformance.Delete(pol).Do(ctx, e)
		}); err != nil {
			return err
		}
	}
	for _, pol := range want {
		verb := "create "
		if _, ok := p.inForce[key(pol)]; ok {
			verb = "update "
		}
		if err := p.burst(ctx, e, func() error {
			p.write(e, verb+key(pol), func(m map[string]*networkingv1.NetworkPolicy) { m[key(pol)] = pol.DeepCopy() })
			return conformance.Apply(pol).Do(ctx, e)
		}); err != nil {
			return err
		}
	}
	return nil
}

// burst holds a burst of datagrams on the fixed pairs (burstPairs) around write:
// one probe a pair (a probe sends no finer than every 100 µs), a new socket each
// datagram, one every order-interval, all started at once; once every one is
// sending, it does write, and the probes go on for burstFor after it (hold). They
// are named by the set the write makes (policyBurstProbe), and so is their span
// (policyBurstEvents).
func (p *policies) burst(ctx context.Context, e *conformance.Env, write func() error) error {
	p.mu.Lock()
	n := len(p.states)
	p.mu.Unlock()
	var probes []placed
	for _, name := range slices.Sorted(maps.Keys(burstPairs)) {
		pr := burstPairs[name]
		from, _ := p.pod(pr.from)
		to, _ := p.pod(pr.to)
		probes = append(probes, placed{from.Pod, probe.UDP{Name: policyBurstProbe(strconv.Itoa(n), name), NewSocket: true,
			To:       []probe.Destination{{Label: name, Addr: netip.AddrPortFrom(to.Pod.IP(), uint16(pr.port)).String()}},
			Interval: e.Budgets.OrderInterval}})
	}
	return hold(ctx, e, policyBurstEvents, n, probes, burstFor, write)
}

// policyBurstProbe is the probe of pair (by name) in the burst around the write that
// makes set n: "policy-burst-3-xb-xa-80".
func policyBurstProbe(n, pair string) string {
	return "policy-burst-" + n + "-" + strings.TrimPrefix(pair, "policy-udp-")
}

// write changes the policies in force with change and records the new set's number.
func (p *policies) write(e *conformance.Env, what string, change func(map[string]*networkingv1.NetworkPolicy)) {
	p.mu.Lock()
	defer p.mu.Unlock()
	change(p.inForce)
	var set []networkingv1.NetworkPolicy
	for _, k := range slices.Sorted(maps.Keys(p.inForce)) {
		set = append(set, *p.inForce[k])
	}
	p.states = append(p.states, set)
	e.Record(EventPolicies, fmt.Sprintf("%d: %s", len(p.states)-1, what))
}

func (p *policies) state(i int) []networkingv1.NetworkPolicy {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.states[i]
}

func key(pol *networkingv1.NetworkPolicy) string { return pol.Namespace + "/" + pol.Name }

// traffic are the policy pairs' probes, each from its pod.
func (p *policies) traffic(e *conformance.Env) ([]conformance.Traffic, error) {
	var out []conformance.Traffic
	for _, pr := range policyPairs {
		from, ok := p.pod(pr.from)
		to, ok2 := p.pod(pr.to)
		if !ok || !ok2 {
			return nil, fmt.Errorf("the netpol fixture has no pod %s or %s", pr.from, pr.to)
		}
		out = append(out, conformance.Traffic{From: from.Pod, Probe: pr.probe(e, to.Pod.IP())})
	}
	return out, nil
}

func (p *policies) pod(id string) (workloads.NetpolPod, bool) {
	ns, name, _ := strings.Cut(id, "/")
	return p.f.Pod(ns, name)
}

// policyModel says what the policies allowed a pair at a time, read from the
// timeline's EventPolicies events: a write may take budget to be programmed, so
// every set in force from budget before an attempt's start to its timeout after
// counts; while an agent is down (stop-sent, kill-sent or kube-proxy-stop-sent to
// ready), every set since budget before it went down.
type policyModel struct {
	tl      func() []timeline.Transition
	budget  time.Duration
	timeout time.Duration
	p       *policies
	// burst is how many datagrams each pair of a write's burst sends (burstFor at
	// order-interval); zero where the writes have no bursts.
	burst int

	once    sync.Once
	changes []policyChange
	downs   []span
	created map[string]monotime.Time // a new pod's pod-creating, by pod
	said    map[said]verdict         // what each set said of each pair, once asked
}

type said struct {
	pr    policyPair
	state int
}

type verdict struct {
	allowed bool
	why     string
}

type policyChange struct {
	at    monotime.Time
	state int
}

func (m *policyModel) build() {
	trs := m.tl()
	m.downs = downs(trs, "")
	m.created = map[string]monotime.Time{}
	for _, tr := range trs {
		if tr.Name == specs.EventPodCreating {
			m.created[tr.Detail] = tr.Time
		}
		if tr.Name != EventPolicies {
			continue
		}
		n, _, _ := strings.Cut(tr.Detail, ":")
		if i, err := strconv.Atoi(n); err == nil {
			m.changes = append(m.changes, policyChange{tr.Time, i})
		}
	}
}

// shownAfter is how many attempts in a row must go as a change of policies says
// (delivered where it allows a pair the set before denied, not where it denies)
// for the datapath to have shown the change on that pair.
const shownAfter = 3

// allowed is what the set of policies states[s] says of pr. The check asks it for
// every attempt; it is worked out once per pair and set.
func (m *policyModel) allowed(pr policyPair, s int) (bool, string) {
	if v, ok := m.said[said{pr, s}]; ok {
		return v.allowed, v.why
	}
	m.p.mu.Lock()
	cluster := m.p.cluster
	m.p.mu.Unlock()
	src, _ := cluster.Pod(pr.from)
	dst, _ := cluster.Pod(pr.to)
	ok, why := cluster.Allowed(m.p.state(s), src, dst, netpolmodel.Port{Port: pr.port, Protocol: pr.protocol()})
	if m.said == nil {
		m.said = map[said]verdict{}
	}
	m.said[said{pr, s}] = verdict{ok, why}
	return ok, why
}

// shown is when the datapath showed each of the round's policy changes on pr: the
// start of the shownAfter-th attempt in a row that went as the change says, all
// made while it was the last; a change that says of pr what the one before said is
// shown when that one was. Zero: never. A change that turns back a verdict whose
// own change was never shown is never shown either: the set before that one says
// what it says and may still be in force, so no attempt tells them apart (x/a's
// ingress denied, opened, denied again within the budget: the opening programmed
// late is not the second deny taken back). attempts are pr's, in time order.
func (m *policyModel) shown(pr policyPair, attempts []probe.Event) []monotime.Time {
	m.once.Do(m.build)
	out := make([]monotime.Time, len(m.changes))
	prev, prevShown := 0, monotime.Time(1) // the round starts with none, as shown
	for j, c := range m.changes {
		was, _ := m.allowed(pr, prev)
		now, _ := m.allowed(pr, c.state)
		prev = c.state
		if was == now || prevShown == 0 {
			out[j] = prevShown
			continue
		}
		end := monotime.Time(0)
		if j+1 < len(m.changes) {
			end = m.changes[j+1].at
		}
		run := 0
		for _, e := range attempts {
			if e.Time < c.at || (end != 0 && e.Time.Add(m.timeout) >= end) {
				continue
			}
			if (e.Outcome == probe.OK && e.Backend == pr.to) != now {
				run = 0
				continue
			}
			if run++; run == shownAfter {
				out[j] = e.Time
				break
			}
		}
		prevShown = out[j]
	}
	return out
}

// shownBefore narrows, for the pairs of the pods that appeared, which changes count
// as shown: a change the datapath had shown on any fixed pair whose verdict it
// changes, before the pod was created, is shown for the pod's pairs too, from their
// first packet. The agent had the policies then, and a pod it programs after is
// never open (or closed) to what they say otherwise: that is what holds a new pod to
// a policy written seconds before it, inside policy-programmed. shown is by probe,
// as policyAsModelled works it out, and is changed in place.
func (m *policyModel) shownBefore(pairs map[string]policyPair, shown map[string][]monotime.Time) {
	m.once.Do(m.build)
	anywhere := make([]monotime.Time, len(m.changes))
	prev := 0
	for j, c := range m.changes {
		for name, pr := range pairs {
			if pr.born != "" || shown[name] == nil {
				continue
			}
			was, _ := m.allowed(pr, prev)
			now, _ := m.allowed(pr, c.state)
			if t := shown[name][j]; was != now && t != 0 && (anywhere[j] == 0 || t < anywhere[j]) {
				anywhere[j] = t
			}
		}
		prev = c.state
	}
	for name, pr := range pairs {
		created, ok := m.created[pr.born]
		if !ok || shown[name] == nil {
			continue
		}
		for j, t := range anywhere {
			if t != 0 && t <= created && (shown[name][j] == 0 || t < shown[name][j]) {
				shown[name][j] = t
			}
		}
	}
}

// verdicts are what the sets that count for an attempt of pr started at t say: all
// allow, all deny, or both (then the attempt is not judged). Every set in force from
// budget before t (from budget before an agent went down, while it is down) to the
// attempt's timeout after counts, but none from before a change the datapath had
// shown on pr by t (shown): a datapath that has shown a policy does not go back on
// it, not even while its agent restarts.
func (m *policyModel) verdicts(pr policyPair, t monotime.Time, shown []monotime.Time) (allow, deny bool, why string) {
	m.once.Do(m.build)
	lo, hi := t.Add(-m.budget), t.Add(m.timeout)
	for _, d := range m.downs {
		if t >= d.from && (d.to == 0 || t <= d.to) {
			lo = min(lo, d.from.Add(-m.budget))
		}
	}
	states := []int{0}
	for j, c := range m.changes {
		if c.at > hi {
			break
		}
		if c.at <= lo || (shown[j] != 0 && shown[j] <= t) {
			states = []int{c.state}
			continue
		}
		states = append(states, c.state)
	}
	for _, s := range states {
		ok, reason := m.allowed(pr, s)
		if ok {
			allow = true
		} else {
			deny = true
		}
		why = reason
	}
	return allow, deny, why
}

// pairAttempts are the attempts of pairs' probes among events, in time order: a TCP
// pair's connect attempts as they are, and each datagram sent on a UDP pair (whose
// name is its destination's label) as an attempt of the pair answered (OK) by the
// server that received it, if one did, or not (timeout). A datagram the probe could
// not send is no attempt. A datagram sent from the source address and port of
// earlier datagrams of its pair (the kernel gave the new socket a port it had used)
// belongs to their flow: prior holds them, by the datagram's index in attempts. The
// sender names the port (the sent event's Peer); where it does not, the receiver's
// view of it is used, which knows only the datagrams that arrived.
func pairAttempts(events []probe.Event, pairs map[string]policyPair) (attempts []probe.Event, prior map[int][]probe.Event) {
	type datagram struct {
		pair, sender string
		seq          uint64
	}
	got := map[datagram]probe.Event{} // the server's receipt
	for _, e := range events {
		if e.Kind == probe.KindRecv && pairs[e.Target].udp {
			got[datagram{e.Target, e.From, e.Seq}] = e
		}
	}
	type flow struct{ pair, source string }
	flows := map[flow][]probe.Event{}
	prior = map[int][]probe.Event{}
	for _, e := range events {
		switch {
		case e.Kind == probe.KindAttempt && !pairs[e.Probe].udp:
			if _, ok := pairs[e.Probe]; ok {
				attempts = append(attempts, e)
			}
		case e.Kind == probe.KindSent && pairs[e.Target].udp && e.Outcome == probe.OK:
			recv, ok := got[datagram{e.Target, e.Probe, e.Seq}]
			source := e.Peer
			if source == "" && ok {
				source = recv.Peer
			}
			e.Kind, e.Probe, e.Outcome = probe.KindAttempt, e.Target, probe.Timeout
			if ok {
				e.Outcome, e.Backend = probe.OK, recv.Backend
			}
			if source != "" {
				f := flow{e.Probe, source}
				if len(flows[f]) > 0 {
					prior[len(attempts)] = flows[f]
				}
				flows[f] = append(flows[f], e)
			}
			attempts = append(attempts, e)
		}
	}
	return attempts, prior
}

// policyAsModelled is the round's check that every new connection between the
// policy pairs went as the model says: delivered (answered by its destination)
// where every set of policies that counts allows it, not delivered where every one
// denies it. A new pod's pairs are held to that from its first packet where they are
// denied (a pod is never open before its policy is in place); where they are
// allowed, once the pod is wired (its first connection delivered) for those from
// it, as ORDER-NEW-ENDPOINT holds them, and policy-programmed after that for those
// into it. A UDP pair's datagrams (a new pod's, and a write's burst on the fixed
// pairs) are judged as attempts (pairAttempts). A violation is of kind delivered,
// lost (a datagram), or of the failed attempt's kind.
type policyAsModelled struct {
	m     *policyModel
	pairs map[string]policyPair
	modelReport
}

func newPolicyAsModelled(m *policyModel) *policyAsModelled {
	pairs := map[string]policyPair{}
	for _, pr := range policyPairs {
		pairs[pr.name()] = pr
	}
	return &policyAsModelled{m: m, pairs: pairs, modelReport: modelReport{
		expected: "every attempt between the netpol pods as the policies in force say", negated: "an attempt between the netpol pods not as modelled"}}
}

// WithDefaults keeps the matcher as it is: its options are its own.
func (c *policyAsModelled) WithDefaults(...matchers.Option) matchers.Matcher { return c }

func (c *policyAsModelled) Match(actual any) (bool, error) {
	w, err := c.window(actual)
	if err != nil {
		return false, err
	}
	pairs := maps.Clone(c.pairs)
	maps.Copy(pairs, burstPairs)
	c.m.p.mu.Lock()
	maps.Copy(pairs, c.m.p.born)
	c.m.p.mu.Unlock()
	attempts, prior := pairAttempts(w.Inside(), pairs)
	// New flows' attempts: a known flow's says nothing of when a pod was wired or a
	// change shown.
	var fresh []probe.Event
	for i, e := range attempts {
		if _, ok := prior[i]; !ok {
			fresh = append(fresh, e)
		}
	}
	wired := map[string]monotime.Time{} // a new pod's first delivery
	for _, e := range fresh {
		if pr := pairs[e.Probe]; pr.born != "" && pr.from == pr.born && e.Outcome == probe.OK && e.Backend == pr.to {
			if t, ok := wired[pr.born]; !ok || e.Time < t {
				wired[pr.born] = e.Time
			}
		}
	}
	// live reports whether a new pod was wired at t for pr: from its first delivery
	// for the pairs from it, policy-programmed after that for those into it.
	// Before, nothing it sends or is sent says anything of the policies.
	live := func(pr policyPair, t monotime.Time) bool {
		from, ok := wired[pr.born]
		if pr.to == pr.born {
			from = from.Add(c.m.budget)
		}
		return ok && t >= from
	}
	byProbe := map[string][]probe.Event{}
	for _, e := range fresh {
		if pr := pairs[e.Probe]; pr.born == "" || live(pr, e.Time) {
			byProbe[e.Probe] = append(byProbe[e.Probe], e)
		} else if _, ok := byProbe[e.Probe]; !ok {
			byProbe[e.Probe] = nil // a pair no change has been shown on yet
		}
	}
	shown := map[string][]monotime.Time{}
	for name, es := range byProbe {
		shown[name] = c.m.shown(pairs[name], es)
	}
	c.m.shownBefore(pairs, shown)
	var wrong []wrongAttempt
	judged, seen := 0, map[string]int{}
	for i, e := range attempts {
		pr := pairs[e.Probe]
		seen[e.Probe]++
		if e.Outcome == probe.Stopped {
			continue // the round's end cut it short
		}
		allow, deny, why := c.m.verdicts(pr, e.Time, shown[e.Probe])
		delivered := e.Outcome == probe.OK && e.Backend == pr.to
		if pr.born != "" && allow && !deny && !live(pr, e.Time) {
			continue
		}
		if earlier, ok := prior[i]; ok {
			// A known flow's verdict stands: a datapath need not judge an admitted
			// flow again when policies change. Only a flow that was never admitted
			// (every earlier datagram denied by every set, and none delivered) is
			// still held to a deny.
			if c.admitted(pr, earlier, shown[e.Probe]) || !deny || allow {
				continue
			}
		}
		switch {
		case allow && deny:
			continue
		case allow && !delivered:
			kind := matchers.AttemptKind(e, []string{pr.to})
			if pr.udp {
				kind = matchers.KindLost
			}
			wrong = append(wrong, wrongAttempt{e, kind, "was allowed (" + why + ") but not delivered"})
		case deny && delivered:
			wrong = append(wrong, wrongAttempt{e, matchers.KindDelivered, "was denied (" + why + ") but delivered"})
		}
		judged++
	}
	passed := c.judge(w, "unmodelled_policy_outcomes", "judged attempts between the netpol pods not as the policies in force say", judged, wrong)
	for _, name := range slices.Sorted(maps.Keys(c.pairs)) {
		if seen[name] == 0 {
			c.blind("probe " + name + " made no attempt in the window")
			return false, fmt.Errorf("%w: %s: the round cannot judge its pair", matchers.ErrInstrument, c.res.First)
		}
	}
	if quiet := c.quietBurst(w); quiet != "" {
		c.blind(quiet)
		return false, fmt.Errorf("%w: %s: the round cannot judge the moment the write was taken in", matchers.ErrInstrument, quiet)
	}
	return passed, nil
}

// admitted reports whether a datapath may have admitted the flow of the datagrams
// earlier of pair pr: one was delivered, or a set of policies that counted when it
// was sent allowed it.
func (c *policyAsModelled) admitted(pr policyPair, earlier []probe.Event, shown []monotime.Time) bool {
	for _, e := range earlier {
		if allow, _, _ := c.m.verdicts(pr, e.Time, shown); allow || (e.Outcome == probe.OK && e.Backend == pr.to) {
			return true
		}
	}
	return false
}

// quietBurst says which pair's probe of a write's burst, the first, went quiet: sent
// fewer than half its datagrams, or none at or before the write, or none at or
// after it. Its datagrams passed the moment the write was taken in by, and judged
// nothing of it: the round is void rather than passed. Empty: none went quiet.
func (c *policyAsModelled) quietBurst(w timeline.Window) string {
	if c.m.burst == 0 {
		return ""
	}
	type sends struct {
		n           int
		first, last monotime.Time
	}
	by := map[string]*sends{}
	for _, e := range w.Events {
		if e.Kind != probe.KindSent || e.Outcome != probe.OK || !strings.HasPrefix(e.Probe, "policy-burst-") {
			continue
		}
		s := by[e.Probe]
		if s == nil {
			s = &sends{first: e.Time}
			by[e.Probe] = s
		}
		s.n, s.last = s.n+1, e.Time
	}
	for _, tr := range w.Transitions {
		if tr.Name != EventPolicies || !w.Contains(tr.Time) {
			continue
		}
		n, _, _ := strings.Cut(tr.Detail, ":")
		for _, pair := range slices.Sorted(maps.Keys(burstPairs)) {
			name := policyBurstProbe(n, pair)
			s := by[name]
			if s == nil {
				return fmt.Sprintf("probe %s sent no datagram around policy write %q", name, tr.Detail)
			}
			if s.n < c.m.burst/2 || s.first > tr.Time || s.last < tr.Time {
				return fmt.Sprintf("probe %s sent %d of %d datagrams, from %s to %s, around policy write %q",
					name, s.n, c.m.burst, w.Relative(s.first), w.Relative(s.last), tr.Detail)
			}
		}
	}
	return ""
}
