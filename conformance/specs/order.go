package specs

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/dpconform/dpconform/conformance"
	"github.com/dpconform/dpconform/fv/matchers"
	"github.com/dpconform/dpconform/fv/probe"
	"github.com/dpconform/dpconform/fv/workloads"
	"github.com/dpconform/dpconform/topologies"
)

// The Policy profile's transitions of a new pod and of a policy, on one node (node-a):
// a server S whose ingress policy admits only pods labelled role=friend, a control
// server D with no policy, and a server X that a restricted pod's egress policy
// refuses. Facts: Calico PR 12164 (seed 3: programs attached before the IP sets that
// hold the new pod's IP were written), Calico 6241 (an attach gap that fails open).

// orderPort is the port every server of the order fixture serves, TCP and UDP.
const orderPort = 9000

// orderNamespace holds the order fixture.
const orderNamespace = "order"

// EventPodCreating is recorded just before a new pod is created: its first packets
// may come before pod-added (they start as soon as its sandbox is wired).
const EventPodCreating = "pod-creating"

// EventPodLive is recorded once a new pod of an ordering spec reaches D, the server
// every pod is allowed: it is live on the dataplane.
const EventPodLive = "pod-live"

// Labels of the order fixture.
const (
	roleLabel  = "role"
	friend     = "friend"
	stranger   = "stranger"
	restricted = "restricted"
)

func init() {
	policy := []conformance.Feature{conformance.FeatureNetworkPolicy, conformance.FeatureUDP}
	conformance.Register(conformance.Spec{
		ID:       "ORDER-NEW-ENDPOINT",
		Profile:  conformance.Policy,
		Features: policy,
		Description: "A new pod whose label a same-node server's ingress policy admits is never live before that policy " +
			"knows it: from its first packet it sends to the server and to a control server with no policy, interleaved " +
			"every {order-interval}, and once one datagram to the control server is delivered, every later one to the server is.",
		Transition: "five new pods (role=friend) appear one after another on node-a, where server S admits only friends (a default deny and an allow); each sends until 500 ms after it first reaches D, and the next appears then",
		Traffic:    "from each new pod's first possible packet (its probe starts when CNI has wired it, before its status names its IP), sequence-numbered UDP interleaved every {order-interval} to S and to a control server D with no policy, on one socket",
		Invariant:  "for each new pod, once one of its datagrams to D is delivered, every later one to S is (no moment where it is live but S's policy does not know it); an existing friend reaches S and a stranger does not, before and throughout",
		Budgets:    []string{"order-interval", "policy-programmed"},
		Origin:     "Calico PR 12164: programs for a new workload were attached before the IP sets holding its IP were written, so a peer's policy that selects it denied its first packets",
		Catches:    []conformance.FaultCase{{Fault: "attach-before-ipsets", Kinds: []conformance.FailureKind{matchers.KindLost}}},
		Body:       newEndpoint,
	})
	conformance.Register(conformance.Spec{
		ID:       "ORDER-NEW-ENDPOINT-EGRESS",
		Profile:  conformance.Policy,
		Features: policy,
		Description: "A new pod whose egress policy refuses a server never reaches it, not even with its first packets: " +
			"it sends to that server and to an allowed one from its first possible packet, and none to the refused one is delivered.",
		Transition: "five new pods (role=restricted), whose egress policy allows only D, appear one after another on node-a; each sends until 500 ms after it first reaches D, and the next appears then",
		Traffic:    "from each new pod's first possible packet, UDP every {order-interval} to a server X and to D",
		Invariant:  "nothing any new pod sends to X is ever delivered, and each goes live (it reaches D)",
		Budgets:    []string{"order-interval", "policy-programmed"},
		Origin:     "Calico issue 6241: traffic was redirected to a new workload before its policy programs were attached, an attach gap that fails open",
		Catches:    []conformance.FaultCase{{Fault: "redirect-before-policy", Kinds: []conformance.FailureKind{matchers.KindDelivered}}},
		Body:       newEndpointEgress,
	})
	conformance.Register(conformance.Spec{
		ID:       "ORDER-POLICY-REPLACE",
		Profile:  conformance.Policy,
		Features: []conformance.Feature{conformance.FeatureNetworkPolicy, conformance.FeatureTCP},
		Description: "When the policy that admits a client is replaced in place by one that admits a superset, twelve times " +
			"over, the client's streams see no reset and no gap over budget, and its new connections, one every {order-interval}, all succeed.",
		Transition: "the policy that admits friends to S is updated in place twelve times, 100 ms apart, each time to admit one more role (a superset)",
		Traffic:    "two long-lived TCP streams and a new TCP connection every {order-interval} from a friend to S; a stranger's new connections",
		Invariant:  "no reset, no gap over 200 ms, no failed new connection; the stranger still refused",
		Budgets:    []string{"order-interval", "stream-max-gap", "attempt-timeout"},
		Origin:     "an update handled as the removal of the old policy and the addition of the new one, applied as two batches: for one round the selected pods have only their other policies",
		Catches: []conformance.FaultCase{{Fault: "delete-then-add-policy",
			Kinds: []conformance.FailureKind{matchers.KindTimeout, matchers.KindReset, matchers.KindUnreachable, matchers.KindGap}}},
		Body: policyReplace,
	})
}

// orderWorld is the order fixture on node-a.
type orderWorld struct {
	node        topologies.Node
	s, d, x     topologies.Pod
	friend, str topologies.Pod
}

// deployOrder builds the fixture and its policies, and waits until they hold: a friend
// reaches S, a stranger does not, a restricted pod reaches D and not X.
func deployOrder(ctx context.Context, e *conformance.Env) (*orderWorld, error) {
	o := &orderWorld{node: e.Topo.Nodes()[0]}
	add := func(name string, labels map[string]string) (topologies.Pod, error) {
		return e.Topo.AddPod(ctx, topologies.PodSpec{Name: name, Namespace: orderNamespace, Node: o.node.Name(), Labels: labels})
	}
	for _, srv := range []struct {
		into *topologies.Pod
		name string
	}{{&o.s, "s"}, {&o.d, "d"}, {&o.x, "x"}} {
		p, err := add(srv.name, map[string]string{"app": srv.name})
		if err != nil {
			return nil, err
		}
		if _, err := e.World.StartProbe(ctx, p, probe.Serve{Name: srv.name, TCP: []int{orderPort}, UDP: []int{orderPort}, RecordTCP: true}); err != nil {
			return nil, err
		}
		*srv.into = p
	}
	var err error
	if o.friend, err = add("friend", map[string]string{roleLabel: friend}); err != nil {
		return nil, err
	}
	if o.str, err = add("stranger", map[string]string{roleLabel: stranger}); err != nil {
		return nil, err
	}
	for _, p := range orderPolicies(nil) {
		if err := conformance.Apply(p).Do(ctx, e); err != nil {
			return nil, err
		}
	}
	return o, nil
}

// orderPolicies are the fixture's policies: S admits only friends (and the extra
// roles, for a replacement); restricted pods may send only to D.
func orderPolicies(extraRoles []string) []*networkingv1.NetworkPolicy {
	app := func(name string) metav1.LabelSelector {
		return metav1.LabelSelector{MatchLabels: map[string]string{"app": name}}
	}
	friends := &metav1.LabelSelector{MatchLabels: map[string]string{roleLabel: friend}}
	if len(extraRoles) > 0 {
		friends = &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
			{Key: roleLabel, Operator: metav1.LabelSelectorOpIn, Values: append([]string{friend}, extraRoles...)}}}
	}
	ingress := []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}
	egress := []networkingv1.PolicyType{networkingv1.PolicyTypeEgress}
	return []*networkingv1.NetworkPolicy{
		{ObjectMeta: metav1.ObjectMeta{Namespace: orderNamespace, Name: "s-default-deny"},
			Spec: networkingv1.NetworkPolicySpec{PodSelector: app("s"), PolicyTypes: ingress}},
		{ObjectMeta: metav1.ObjectMeta{Namespace: orderNamespace, Name: "s-allow-friends"},
			Spec: networkingv1.NetworkPolicySpec{PodSelector: app("s"), PolicyTypes: ingress,
				Ingress: []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{PodSelector: friends}}}}}},
		{ObjectMeta: metav1.ObjectMeta{Namespace: orderNamespace, Name: "restricted-egress"},
			Spec: networkingv1.NetworkPolicySpec{PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{roleLabel: restricted}},
				PolicyTypes: egress, Egress: []networkingv1.NetworkPolicyEgressRule{{To: []networkingv1.NetworkPolicyPeer{{PodSelector: ptr.To(app("d"))}}}}}},
	}
}

// ORDER-POLICY-REPLACE replaces its policy this many times, this far apart.
const (
	replacements = 12
	replaceEvery = 100 * time.Millisecond
)

// orderConnect is a connect probe at the ordering specs' interval: delete-then-add
// style windows last a round of the agent, a millisecond or two.
func orderConnect(e *conformance.Env, name, target string) probe.Connect {
	c := e.Connect(name, target)
	c.Interval = e.Budgets.OrderInterval
	return c
}

// cell is one flow whose verdict a spec needs before its transition.
type cell struct {
	from  topologies.Pod
	to    topologies.Pod
	proto string
	reach bool
}

func (c cell) String() string {
	verb := "reaches"
	if !c.reach {
		verb = "is refused by"
	}
	return fmt.Sprintf("%s %s %s on %s/%d", c.from.Name(), verb, c.to.Name(), strings.ToUpper(c.proto), orderPort)
}

// waitCells waits, within the policy-programmed budget, until every cell is as it
// must be on two probe rounds in a row: the policies are programmed. Not holding by
// then is a failed precondition.
func waitCells(ctx context.Context, e *conformance.Env, cells ...cell) error {
	deadline := time.Now().Add(e.Budgets.PolicyProgrammed)
	streak := 0
	for round := 1; ; round++ {
		var wrong []string
		for i, c := range cells {
			evs, err := e.World.Reach(ctx, c.from, probe.Reach{Name: fmt.Sprintf("wait-%s-%d-%d", c.from.Name(), round, i),
				Timeout: e.Budgets.ReachTimeout,
				Targets: []probe.Target{{Label: c.to.Name(), Proto: c.proto, Addr: fmt.Sprintf("%s:%d", c.to.IP(), orderPort)}}})
			if err != nil {
				return fmt.Errorf("%w: %w", conformance.ErrEnvironment, err)
			}
			ok, err := reached(evs[0], c.to.Name())
			if err != nil {
				return fmt.Errorf("%w: %s: %w", conformance.ErrEnvironment, c, err)
			}
			if ok != c.reach {
				wrong = append(wrong, c.String())
			}
		}
		if len(wrong) == 0 {
			if streak++; streak == 2 {
				return nil
			}
			continue
		}
		streak = 0
		if time.Now().After(deadline) {
			return fmt.Errorf("%w: the policies were not in force %s after they were written: not true that %s",
				workloads.ErrNotFlowing, e.Budgets.PolicyProgrammed, strings.Join(wrong, "; "))
		}
	}
}

// udpTo is a UDP probe from name to the given servers, interleaved at the ordering
// specs' interval (order-interval), on one socket.
func udpTo(e *conformance.Env, name string, to ...topologies.Pod) probe.UDP {
	u := probe.UDP{Name: name, Interval: e.Budgets.OrderInterval}
	for _, p := range to {
		u.To = append(u.To, probe.Destination{Label: p.Name(), Addr: addr(p.IP())})
	}
	return u
}

func addr(ip netip.Addr) string { return fmt.Sprintf("%s:%d", ip, orderPort) }

// newcomer is a step that creates pod name with labels on node-a and starts probe cfg
// in it as soon as its sandbox is wired, before the API tells anyone its IP. The
// probe's process is stored in proc.
func newcomer(e *conformance.Env, o *orderWorld, name string, labels map[string]string, cfg probe.Config, procs *[]*probe.Process) []conformance.Step {
	return []conformance.Step{
		conformance.Record(EventPodCreating, name),
		conformance.AddPod(topologies.PodSpec{Name: name, Namespace: orderNamespace, Node: o.node.Name(), Labels: labels,
			OnWired: func(ctx context.Context, p topologies.Pod) error {
				proc, err := e.World.StartProbe(ctx, p, cfg)
				if err == nil {
					*procs = append(*procs, proc)
				}
				return err
			}}, nil),
	}
}

// Pods that appear one after another in ORDER-NEW-ENDPOINT, ORDER-NEW-ENDPOINT-EGRESS
// and ORDER-NO-DENY-EVENTS. Under attach-before-ipsets a new pod's window (its gate
// open, S's policy not yet switched to the set that holds it) is often a few hundred
// µs: a new pod saw it in 58-83% of its arrivals (2026-12-03, docs/faults.md), and a
// CI run with one new pod missed the fault. Each new pod is its own agent round and
// its own chance: with five, a run misses about once in 80 at the lowest rate measured.
//
// One at a time: a pod's probe is stopped newcomerLive after its first datagram
// reaches D, and the next pod is created then. Five senders at order-interval at once
// (and D's server, which heard them all) loaded the two cores so that the fifth pod's
// first datagram reached D seconds after its pod-added, once past the window's end.
const (
	newcomers    = 5
	newcomerLive = 500 * time.Millisecond
)

// arrivals are the steps that add newcomers pods with the role label role one after
// another, each with a probe like udpTo's to to; each waits until the pod reaches D
// (the control every new pod is allowed), records pod-live, and stops the pod's probe
// newcomerLive later. It returns the steps and the probes' names; their checks take
// SendersMayStop.
func arrivals(e *conformance.Env, o *orderWorld, role string, to ...topologies.Pod) ([]conformance.Step, []string) {
	var steps []conformance.Step
	var names []string
	for i := range newcomers {
		name := fmt.Sprintf("newcomer-%d", i+1)
		procs := new([]*probe.Process)
		steps = append(steps, newcomer(e, o, name, map[string]string{roleLabel: role}, udpTo(e, name, to...), procs)...)
		// D's server records the pod's datagrams: no other probe adds to the load.
		steps = append(steps, reachedThenStop("wait until "+name+" reaches D, then stop its probe", EventPodLive, name,
			"its pod was never wired, or never allowed to D", [][2]string{{name, o.d.Name()}}, procs))
		names = append(names, name)
	}
	return steps, names
}

func newEndpoint(ctx context.Context, e *conformance.Env) error {
	o, err := deployOrder(ctx, e)
	if err != nil {
		return err
	}
	if err := waitCells(ctx, e, cell{o.friend, o.s, "udp", true}, cell{o.str, o.s, "udp", false}, cell{o.str, o.d, "udp", true}); err != nil {
		return err
	}
	arrive, names := arrivals(e, o, friend, o.s, o.d)
	return e.Run(ctx, conformance.Scenario{
		Traffic: []conformance.Traffic{
			{From: o.friend, Probe: udpTo(e, "friend", o.s, o.d)},
			{From: o.str, Probe: udpTo(e, "stranger", o.s, o.d)},
		},
		Preconditions: []conformance.Check{
			{Name: "an existing friend reaches S", Matcher: matchers.DeliverToOnceDeliveredTo("s", "d", matchers.Probes("friend"))},
			{Name: "a stranger does not reach S", Matcher: matchers.HaveZeroDelivered(matchers.Probes("stranger"), matchers.To("s"))},
		},
		Transition: arrive,
		Checks: []conformance.Check{
			{Name: "each new friend reaches S from its first datagram that reaches D",
				Matcher: matchers.DeliverToOnceDeliveredTo("s", "d", matchers.Probes(names...), matchers.SendersMayStop())},
			{Name: "the stranger still does not reach S", Matcher: matchers.HaveZeroDelivered(matchers.Probes("stranger"), matchers.To("s"))},
		},
	})
}

func newEndpointEgress(ctx context.Context, e *conformance.Env) error {
	o, err := deployOrder(ctx, e)
	if err != nil {
		return err
	}
	old, err := e.Topo.AddPod(ctx, topologies.PodSpec{Name: "restricted", Namespace: orderNamespace, Node: o.node.Name(),
		Labels: map[string]string{roleLabel: restricted}})
	if err != nil {
		return err
	}
	if err := waitCells(ctx, e, cell{old, o.x, "udp", false}, cell{old, o.d, "udp", true}); err != nil {
		return err
	}
	arrive, names := arrivals(e, o, restricted, o.x, o.d)
	return e.Run(ctx, conformance.Scenario{
		Traffic: []conformance.Traffic{{From: old, Probe: udpTo(e, "restricted", o.x, o.d)}},
		Preconditions: []conformance.Check{
			{Name: "an existing restricted pod reaches D", Matcher: matchers.DeliverToOnceDeliveredTo("d", "d", matchers.Probes("restricted"))},
			{Name: "an existing restricted pod does not reach X", Matcher: matchers.HaveZeroDelivered(matchers.Probes("restricted"), matchers.To("x"))},
		},
		Transition: arrive,
		Checks: []conformance.Check{
			{Name: "no new restricted pod ever reaches X", Matcher: matchers.HaveZeroDelivered(matchers.Probes(names...), matchers.To("x"), matchers.SendersMayStop())},
			// Else the zero above could be that of pods that never went live.
			{Name: "each new restricted pod goes live: it reaches D", Matcher: matchers.DeliverToOnceDeliveredTo("d", "d", matchers.Probes(names...), matchers.SendersMayStop())},
		},
	})
}

func policyReplace(ctx context.Context, e *conformance.Env) error {
	o, err := deployOrder(ctx, e)
	if err != nil {
		return err
	}
	if err := waitCells(ctx, e, cell{o.friend, o.s, "tcp", true}, cell{o.str, o.s, "tcp", false}); err != nil {
		return err
	}
	s := addr(o.s.IP())
	// Twelve replacements, each admitting one more role: a replacement's window can be
	// shorter than the probe's period, and each is another chance to fall in it (five
	// caught delete-then-add-policy in 26 of 27 runs: about one chance in two each).
	var replace []conformance.Step
	roles := []string{}
	for i := range replacements {
		roles = append(roles, fmt.Sprintf("guest-%d", i+1))
		if i > 0 {
			replace = append(replace, conformance.Pause(replaceEvery))
		}
		replace = append(replace, conformance.Apply(orderPolicies(slices.Clone(roles))[1]))
	}
	return e.Run(ctx, conformance.Scenario{
		Traffic: []conformance.Traffic{
			{From: o.friend, Probe: e.Stream("friend-streams", s, 2)},
			{From: o.friend, Probe: orderConnect(e, "friend-connect", s)},
			{From: o.str, Probe: e.Connect("stranger-connect", s)},
		},
		Preconditions: []conformance.Check{
			{Name: "the friend's streams carry echoes", Matcher: matchers.HaveStreamGapsWithin(e.Budgets.StreamMaxGap, matchers.Probes("friend-streams"))},
			{Name: "the friend's new connections succeed", Matcher: matchers.HaveNoFailedAttempts(matchers.Probes("friend-connect"))},
			{Name: "the stranger's do not", Matcher: matchers.HaveZeroDelivered(matchers.Probes("stranger-connect"))},
		},
		Transition: replace,
		Checks: []conformance.Check{
			{Name: "no reset on the friend's streams", Matcher: matchers.HaveNoResets(matchers.Probes("friend-streams"))},
			{Name: "no gap over budget on the friend's streams", Matcher: matchers.HaveStreamGapsWithin(e.Budgets.StreamMaxGap, matchers.Probes("friend-streams"))},
			{Name: "every new connection of the friend succeeds", Matcher: matchers.HaveNoFailedAttempts(matchers.Probes("friend-connect"))},
			{Name: "the stranger is still refused", Matcher: matchers.HaveZeroDelivered(matchers.Probes("stranger-connect"))},
		},
	})
}
