package fuzz

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/dpconform/dpconform/conformance"
	"github.com/dpconform/dpconform/driver"
	"github.com/dpconform/dpconform/fv/harness"
	"github.com/dpconform/dpconform/fv/matchers"
	"github.com/dpconform/dpconform/fv/monotime"
	"github.com/dpconform/dpconform/fv/probe"
	"github.com/dpconform/dpconform/fv/timeline"
	"github.com/dpconform/dpconform/fv/workloads"
	"github.com/dpconform/dpconform/topologies"
)

// Names of the events a round records on its timeline, besides those of the steps.
const (
	// EventStep: a schedule's step starts; its detail is "3: +1.250s crash node 1".
	EventStep = "fuzz-step"
	// EventLabelled: a spare backend's app label is about to change
	// (conformance.Relabel); its detail is "spare-a app=web-local". The model of the
	// Services is built from these.
	EventLabelled = "backend-labelled"
)

// idleApp is the app label of a spare backend that no Service selects.
const idleApp = "fuzz-idle"

// streamsPerFlow is how many long-lived streams a round holds on each service flow.
const streamsPerFlow = 2

// The streams a join of a ready spare opens from the client through its Service's
// ClusterIP, joinStreamsAfter the join: each lands on one of the Service's backends,
// so most joins put some on the spare, and they must outlive its leaving (it still
// serves them) and end once it vanishes. 6 leave a vanishing spare without one in
// one join of 64.
const (
	joinStreams      = 6
	joinStreamsAfter = 500 * time.Millisecond
)

// joinStream is the name of the streams step (counted from 1) opens, a join.
func joinStream(step int) string { return fmt.Sprintf("stream-join-%d", step) }

// Spares are the spare backends of a round's world: each serves throughout, and the
// schedule labels it into and out of the Services. spare-a is on node 1, spare-b on
// node 2; unready-a, on node 1, is never ready, so a Service it is labelled into
// lists it not ready and may send it nothing.
var Spares = []string{"spare-a", "spare-b", unready}

// unready is the spare backend whose Ready condition stays false.
const unready = "unready-a"

// spareNode is the node (counted from 0) each spare backend runs on.
var spareNode = map[string]int{"spare-a": 0, "spare-b": 1, unready: 0}

// Services are the Services of a round's world (the Core fixture's), each with its
// own backend that never leaves it.
var Services = []string{"web-local", "web-remote"}

// Profiles are the profiles whose transitions a schedule composes: the faults their
// specs name are the ones fuzzing should find.
var Profiles = []conformance.Profile{conformance.Core, conformance.Upgrade, conformance.ModeSwitch, conformance.Policy}

// ClaimsOf are the claims a schedule for info may draw on. An implementation of
// NetworkPolicy alone (no Core) has a world of the netpol fixture only: no Service
// to join or to serve on an address, nothing to take over from kube-proxy.
func ClaimsOf(info driver.Info) Claims {
	c := Claims{Nodes: 2, Upgrade: upgrades(info)}
	if serviced(info) {
		c.Spares, c.Services, c.Switch, c.Address, c.Churn = Spares, Services, switches(info), true, true
	}
	if policed(info) {
		c.Policies = PolicyCases()
	}
	return c
}

// Fuzzable reports why info cannot be fuzzed, or nil: a round's world is made of the
// Core profile's Services or the Policy profile's netpol fixture.
func Fuzzable(info driver.Info) error {
	if !serviced(info) && !policed(info) {
		return fmt.Errorf("%s claims neither %s nor %s, whose Services or NetworkPolicies a fuzz round is made of", info.Name, conformance.Core, conformance.Policy)
	}
	return nil
}

// serviced reports whether info serves Services (claims Core).
func serviced(info driver.Info) bool { return info.HasProfile(string(conformance.Core)) }

// udp reports whether info serves UDP Services.
func udp(info driver.Info) bool { return info.HasFeature(string(conformance.FeatureUDP)) }

// policed reports whether info enforces NetworkPolicy.
func policed(info driver.Info) bool { return info.HasProfile(string(conformance.Policy)) }

// switches reports whether info takes a node over from kube-proxy (a hand-over
// judged on the Core fixture's Services).
func switches(info driver.Info) bool {
	return serviced(info) && info.HasProfile(string(conformance.ModeSwitch))
}

// upgrades reports whether info offers a version to upgrade to from the one before.
func upgrades(info driver.Info) bool {
	return info.HasProfile(string(conformance.Upgrade)) && len(info.Versions) >= 2
}

// Spec is the spec that runs one schedule in a world of its own: the Core fixture
// (a client pod and a backend on each node, a ClusterIP and NodePort Service for
// each backend) and a spare backend on each node; new connections every
// connect-interval and two long-lived streams on each of the four service paths;
// the schedule's steps; and the model's checks over the whole of it. Where info
// offers versions, the agents start at the one before the newest, which OpUpgrade
// moves them from and back to; they start in the schedule's Mode. A schedule that
// switches a node starts with the real kube-proxy there instead; one with policy
// steps adds the netpol fixture, probed on policyPairs; one with address steps, a
// Service probed on node 1's spare address; where info serves UDP, each Service has
// a UDP twin with flows on it (udpFlows). Where info claims Policy but not Core, the
// world is the netpol fixture alone, and its rounds judge the policies.
func Spec(s Schedule, info driver.Info) conformance.Spec {
	sp := conformance.Spec{
		ID:          fmt.Sprintf("FUZZ-%d-%d", s.Seed, s.Round),
		Description: fmt.Sprintf("Round %d of seed %d: %d steps drawn at random over %s", s.Round, s.Seed, len(s.Actions), s.Span().Round(time.Millisecond)),
		Body:        func(ctx context.Context, e *conformance.Env) error { return runRound(ctx, e, s) },
	}
	if serviced(info) {
		sp.Profile = conformance.Core
		sp.Features = []conformance.Feature{conformance.FeatureClusterIP, conformance.FeatureNodePort, conformance.FeatureNodePortRemoteBackend}
		sp.Description += fmt.Sprintf(", judged from a model of the Services: "+
			"every new connection (one every %s on each path) succeeds and is answered by a backend its Service had, within {endpoint-programmed}; "+
			"no established stream resets or stalls past {stream-max-gap}.", s.interval())
	} else {
		sp.Profile = conformance.Policy
		sp.Description += ", judged from the NetworkPolicy model."
	}
	if serviced(info) && slices.ContainsFunc(s.Actions, func(a Action) bool {
		return a.Op == OpJoin || a.Op == OpLeave || a.Op == OpUpgrade && a.Node == 1
	}) {
		sp.Description += fmt.Sprintf(" Each join, and each leave of a spare in a Service, holds new connections from the client to the Service's ClusterIP, one every {order-interval}, from just before the change to %s after it, and each upgrade of node 1's agent as many from the external client to its NodePort of the Service whose backend is on it: every one succeeds.", burstFor)
	}
	if serviced(info) && udp(info) {
		sp.Features = append(sp.Features, conformance.FeatureUDP)
		sp.Description += fmt.Sprintf(" Each Service has a UDP twin; the client holds a UDP flow (one socket, a datagram every %s) on each twin, and opens %d more on a twin when a ready spare joins its Service: every datagram answered is answered by a backend the Service had, within {udp-repoint}, and no flow goes unanswered for longer than a stream may stall.", udpFlowInterval, udpFlowsPerJoin)
	}
	if netpolWorld(s, info) {
		sp.Features = append(sp.Features, conformance.FeatureNetworkPolicy)
		sp.Description += fmt.Sprintf(" The netpol fixture's pods open new connections on %d pairs (and a new pod's on %d, from its first packet, and %d UDP datagrams on each of them, one every {connect-interval}, each from a new socket), and around each write of a policy send UDP datagrams on each pair until %s after it, one every {order-interval}, each from a new socket: each delivered or not as every set of policies in force {policy-programmed} before says; a pair's burst that sends fewer than half its datagrams, or none on one side of its write, voids the round.", len(policyPairs), len(newPodPairs), birthDatagrams, burstFor)
	}
	if n := len(s.churns()); n > 0 {
		sp.Description += fmt.Sprintf(" %d of its steps churn node 1's SNAT ports (a new connection every {connect-interval} on each of %d probes, from the external client through its NodePort to the remote backend): none reset or refused, at most {snat-retry-per-mille} in 1,000 failed otherwise (timed out).", n, churnProbes)
	}
	if s.HasAddress() {
		sp.Description += fmt.Sprintf(" The external client opens a new connection every %s to a NodePort on node 1's spare address, which must answer from {address-programmed} after the address is added and not from {address-programmed} after it is removed.", s.interval())
	}
	if n := s.Switched(); n > 0 {
		sp.Description += fmt.Sprintf(" Node %d starts under the real kube-proxy and is switched to the implementation: kube-proxy's rules are gone {switch-settle} after, and a stream may stall {switch-max-gap}.", n)
	}
	sp.Setup.Start.Mode, sp.Setup.Upgrade.Mode = s.Mode, s.Mode
	if n := s.Switched(); n > 0 {
		sp.Setup.KubeProxy = []int{n - 1}
	}
	if upgrades(info) {
		sp.Setup.Start.Version, sp.Setup.Upgrade.Version = driver.VersionPrevious, driver.VersionLatest
	}
	return sp
}

// netpolWorld reports whether s's world has the netpol fixture: where s has policy
// steps, or where info serves no Services (so the netpol pods are all there is).
func netpolWorld(s Schedule, info driver.Info) bool { return s.HasPolicies() || !serviced(info) }

// world is a round's fixture.
type world struct {
	core   *workloads.Core
	nodes  []topologies.Node
	spares map[string]topologies.Pod
	// apps are the Services' selectors' app labels; own their backends that never
	// leave.
	apps, own map[string]string
	// svcs are the Services by name.
	svcs map[string]workloads.Service
	// service is the Service of each connect probe.
	service map[string]string
	// pol is the netpol fixture and its policies, where the schedule has policy
	// steps.
	pol *policies
	// addr is node 1's spare address and the Service probed on it, where the
	// schedule has address steps.
	addr *address
	// udp are the Services' UDP twins and the flows on them, where the
	// implementation claims UDP.
	udp *udpFlows
	// vanishes is whether a spare vanishes in the round.
	vanishes bool
}

// deploy builds s's world: the Services and their spares where the implementation
// serves them, then the netpol fixture, node 1's spare address and the UDP twins
// where the world has them.
func deploy(ctx context.Context, e *conformance.Env, s Schedule) (*world, error) {
	w := &world{spares: map[string]topologies.Pod{}, apps: map[string]string{}, own: map[string]string{}, service: map[string]string{},
		svcs: map[string]workloads.Service{}}
	var err error
	if serviced(e.Info) {
		if err := w.deployServices(ctx, e); err != nil {
			return nil, err
		}
	} else if w.nodes = e.Topo.Nodes(); len(w.nodes) < 2 {
		return nil, fmt.Errorf("a fuzz round needs two nodes; the topology has %d", len(w.nodes))
	}
	if netpolWorld(s, e.Info) {
		if w.pol, err = deployPolicies(ctx, e); err != nil {
			return nil, err
		}
	}
	if w.core == nil {
		return w, nil
	}
	if s.HasAddress() {
		if w.addr, err = deployAddress(ctx, e, w.core.NodeA, w.core.Client); err != nil {
			return nil, err
		}
	}
	if udp(e.Info) {
		if w.udp, err = deployUDP(ctx, e, w.core); err != nil {
			return nil, err
		}
	}
	return w, nil
}

// deployServices adds the Core fixture and the spare backends.
func (w *world) deployServices(ctx context.Context, e *conformance.Env) error {
	core, err := workloads.DeployCore(ctx, e.World, e.Warm())
	if err != nil {
		return err
	}
	w.core, w.nodes = core, []topologies.Node{core.NodeA, core.NodeB}
	for _, name := range Spares {
		add := workloads.AddBackend
		if name == unready {
			add = workloads.AddNotReadyBackend
		}
		p, _, err := add(ctx, e.World, name, w.nodes[spareNode[name]].Name(), map[string]string{"app": idleApp})
		if err != nil {
			return err
		}
		w.spares[name] = p
	}
	for _, svc := range []workloads.Service{core.SvcLocal, core.SvcRemote} {
		w.apps[svc.Name] = svc.Name // DeployCore selects app=<the Service's name>
		w.own[svc.Name] = svc.Backends[0].Name()
		w.svcs[svc.Name] = svc
	}
	return nil
}

// validate says what in s this world cannot run (a replay file written by hand, or
// for another world).
func (w *world) validate(s Schedule, info driver.Info) error {
	var errs []error
	stepped := map[int]bool{} // nodes an earlier step worked on
	for i, a := range s.Actions {
		bad := func(format string, args ...any) {
			errs = append(errs, fmt.Errorf("step %d (%s): %s", i+1, a, fmt.Sprintf(format, args...)))
		}
		switch a.Op {
		case OpRestart, OpCrash, OpUpgrade, OpOutage, OpSwitch:
			if a.Node < 1 || a.Node > len(w.nodes) {
				bad("no node %d: the world has nodes 1 to %d", a.Node, len(w.nodes))
			}
			if a.Op == OpUpgrade && !upgrades(info) {
				bad("%s offers no versions to upgrade between", info.Name)
			}
			if a.Op == OpSwitch && !switches(info) {
				bad("%s does not claim the %s profile: it takes no node over from kube-proxy", info.Name, conformance.ModeSwitch)
			}
			if a.Op == OpSwitch && (stepped[a.Node] || s.Switched() != a.Node) {
				bad("a switch is the first step on its node, and a schedule has one")
			}
			stepped[a.Node] = true
		case OpJoin, OpLeave, OpVanish:
			if w.core == nil {
				bad("%s does not claim the %s profile: the world has no Services", info.Name, conformance.Core)
				continue
			}
			if _, ok := w.spares[a.Backend]; !ok {
				bad("no spare backend %q (the spares are %s)", a.Backend, strings.Join(Spares, ", "))
			}
			if _, ok := w.apps[a.Service]; a.Op == OpJoin && !ok {
				bad("no Service %q (the Services are %s)", a.Service, strings.Join(Services, ", "))
			}
		case OpPolicy, OpPod:
			if !policed(info) {
				bad("%s does not claim the %s profile", info.Name, conformance.Policy)
			}
			if a.Op == OpPolicy && !slices.Contains(PolicyCases(), a.Case) {
				bad("no policy case %q (the cases are POLICY-TRUTH-TABLE's)", a.Case)
			}
			if a.Op == OpPod && !slices.Contains(PodLikes, a.like()) {
				bad("a pod like %q (a new pod is like x/%s)", a.Like, strings.Join(PodLikes, " or x/"))
			}
		case OpAddAddress, OpRemoveAddress:
			if w.core == nil {
				bad("%s does not claim the %s profile: no NodePort answers on node 1's address", info.Name, conformance.Core)
			}
		case OpChurn:
			if w.core == nil {
				bad("%s does not claim the %s profile: the world has no NodePort to churn", info.Name, conformance.Core)
			}
			if a.For <= 0 {
				bad("a churn lasts some time: for is %s", time.Duration(a.For))
			}
		default:
			bad("no step %q (the steps are restart, crash, upgrade, outage, join, leave, vanish, switch, policy, pod, add-address, remove-address, churn)", a.Op)
		}
	}
	return errors.Join(append(errs, vanishOrder(s.Actions))...)
}

// vanishOrder says where actions have a spare vanish that cannot: one in a Service
// (a spare vanishes once it has left), one that left less than vanishAfterLeave
// before, the one never ready (nothing reaches it to be ended), or one already gone;
// and a step on a spare after it vanished.
func vanishOrder(actions []Action) error {
	var errs []error
	member := map[string]string{} // spare -> the Service it is in
	left := map[string]Offset{}   // spare -> when it last left
	vanished := map[string]bool{}
	for i, a := range actions {
		bad := func(format string, args ...any) {
			errs = append(errs, fmt.Errorf("step %d (%s): %s", i+1, a, fmt.Sprintf(format, args...)))
		}
		if a.Op != OpJoin && a.Op != OpLeave && a.Op != OpVanish {
			continue
		}
		leftAt, hasLeft := left[a.Backend]
		switch {
		case vanished[a.Backend]:
			bad("%s vanished at an earlier step", a.Backend)
		case a.Op == OpJoin:
			member[a.Backend] = a.Service
		case a.Op == OpLeave:
			delete(member, a.Backend)
			left[a.Backend] = a.At
		case member[a.Backend] != "":
			bad("%s is in %s: a spare vanishes once it has left its Service", a.Backend, member[a.Backend])
		case a.At < leftAt+Offset(vanishAfterLeave) && hasLeft:
			bad("%s left %s before: a spare vanishes %s or more after its leave, once its UDP flows have moved (udp-repoint)",
				a.Backend, time.Duration(a.At-leftAt), vanishAfterLeave)
		case a.Backend == unready:
			bad("%s is never ready: no connection reaches it to be ended", unready)
		default:
			vanished[a.Backend] = true
		}
	}
	return errors.Join(errs...)
}

func runRound(ctx context.Context, e *conformance.Env, s Schedule) error {
	w, err := deploy(ctx, e, s)
	if err != nil {
		return err
	}
	if err := w.validate(s, e.Info); err != nil {
		return fmt.Errorf("the schedule does not fit the world: %w", err)
	}
	sc := conformance.Scenario{
		Transition: []conformance.Step{conformance.Do(fmt.Sprintf("run the schedule's %d steps", len(s.Actions)), func(ctx context.Context, e *conformance.Env) error {
			return w.execute(ctx, e, s)
		})},
	}
	if w.core != nil {
		w.vanishes = len(s.Vanished()) > 0
		w.judgeServices(e, s, &sc)
	}
	if w.pol != nil {
		tr, err := w.pol.traffic(e)
		if err != nil {
			return err
		}
		sc.Traffic = append(sc.Traffic, tr...)
		pm := &policyModel{tl: e.World.Timeline().Transitions, budget: e.Budgets.PolicyProgrammed, timeout: e.Budgets.AttemptTimeout, p: w.pol,
			burst: burstSends(e.Budgets)}
		sc.Checks = append(sc.Checks, conformance.Check{Name: "every new connection between the netpol pods is delivered or not as the policies in force say, within policy-programmed", Matcher: newPolicyAsModelled(pm)})
	}
	if w.addr != nil {
		sc.Traffic = append(sc.Traffic, w.addr.traffic(e, s.interval()))
		sc.Preconditions = append(sc.Preconditions, conformance.Check{Name: "nothing answers on node 1's spare address before it is added",
			Matcher: matchers.HaveNoServedAttempts(matchers.Probes(addressProbe))})
		am := &addressModel{tl: e.World.Timeline().Transitions, budget: e.Budgets.AddressProgrammed, timeout: e.Budgets.AttemptTimeout, node: w.core.NodeA.Name()}
		sc.Checks = append(sc.Checks, conformance.Check{Name: "the NodePort answers on node 1's spare address from address-programmed after it is added, and not from address-programmed after it is removed", Matcher: newAddressAsModelled(am)})
	}
	sc.Settle = max(sc.Settle, e.Budgets.Settle, judgedAfter(e.Budgets, w)+time.Second)
	return e.Run(ctx, sc)
}

// judgeServices adds to sc the traffic on the Services' paths (new connections,
// streams, UDP flows) and the checks of the Services' model, and, where s switches
// a node from kube-proxy, the hand-over's.
func (w *world) judgeServices(e *conformance.Env, s Schedule, sc *conformance.Scenario) {
	var streams []string
	// Under a churn, the round's own connections on its path reuse SNAT ports at the
	// churn's pace too: as many of them as of the churn's may time out.
	var churning time.Duration
	for _, i := range s.churns() {
		churning += time.Duration(s.Actions[i].For)
	}
	for _, fl := range w.core.ServiceFlows(e.Topo) {
		c, st := "connect-"+fl.Name, "stream-"+fl.Name
		streams = append(streams, st)
		w.service[c] = w.serviceOf(fl.Backend)
		n := streamsPerFlow
		if fl.Name == workloads.FlowNodePortRemote && churning > 0 {
			n = churnStreams
		}
		sc.Traffic = append(sc.Traffic,
			conformance.Traffic{From: fl.From, Probe: probe.Connect{Name: c, Target: fl.Target, Interval: s.interval(), Timeout: e.Budgets.AttemptTimeout}},
			conformance.Traffic{From: fl.From, Probe: e.Stream(st, fl.Target, n)})
		sc.Preconditions = append(sc.Preconditions, conformance.Check{Name: "new connections on " + fl.Name + " succeed before the schedule", Matcher: matchers.HaveNoFailedAttempts(matchers.Probes(c))})
		allow := 0
		if fl.Name == workloads.FlowNodePortRemote {
			allow = churnAllowance(int(churning/s.interval()), e.Budgets.SNATRetryPerMille)
		}
		if allow == 0 {
			sc.Checks = append(sc.Checks, conformance.Check{Name: "every new connection on " + fl.Name + " succeeds", Matcher: matchers.HaveNoFailedAttempts(matchers.Probes(c))})
			continue
		}
		sc.Checks = append(sc.Checks,
			conformance.Check{Name: "no new connection on " + fl.Name + " reset or refused", Matcher: matchers.HaveNoResets(matchers.Probes(c))},
			conformance.Check{Name: fmt.Sprintf("every new connection on %s succeeds, but %d that may time out under the churn (snat-retry-per-mille)", fl.Name, allow),
				Matcher: matchers.HaveNoFailedAttempts(matchers.Probes(c), matchers.Allow(allow))})
	}
	for i := range s.Actions {
		fl, svc, ok := w.burstPath(e, s, i)
		if !ok {
			continue
		}
		name := burstProbe(i + 1)
		w.service[name] = svc
		sc.Checks = append(sc.Checks, conformance.Check{Name: fmt.Sprintf("every new connection of step %d's burst (on %s, one every order-interval) succeeds", i+1, fl.Name),
			Matcher: newSpanned(burstEvents, i+1, []string{name}, 0)})
	}
	for _, i := range s.churns() {
		for _, name := range churnNames(i + 1) {
			w.service[name] = w.serviceOf(w.churnPath(e).Backend)
		}
		sc.Checks = append(sc.Checks, conformance.Check{Name: fmt.Sprintf("no connection of step %d's churn reset or refused, and at most snat-retry-per-mille in 1,000 fail otherwise", i+1),
			Matcher: newChurned(i+1, e.Budgets.SNATRetryPerMille)})
	}
	only := matchers.Probes(streams...)
	sc.Preconditions = append(sc.Preconditions, conformance.Check{Name: "the streams carry echoes before the schedule", Matcher: matchers.HaveStreamGapsWithin(e.Budgets.StreamMaxGap, only)})
	maxGap, gapBudget := e.Budgets.StreamMaxGap, "stream-max-gap"
	var handover *conformance.Handover
	if n := s.Switched(); n > 0 {
		// As the SWITCH specs judge it: the node's FORWARD policy DROP and
		// kube-proxy's rules in place first, gone switch-settle after; a stream may
		// stall switch-max-gap in the round.
		handover = &conformance.Handover{Node: w.nodes[n-1]}
		sc.Preconditions = append(sc.Preconditions, conformance.ForwardPolicyDrop(handover.Node), handover.Before())
		sc.Settle, maxGap, gapBudget = e.Budgets.SwitchSettle, max(maxGap, e.Budgets.SwitchMaxGap), "switch-max-gap"
	}
	m := &model{tl: e.World.Timeline().Transitions, budget: e.Budgets.EndpointProgrammed,
		service: w.service, own: w.own, apps: w.apps, pathNode: w.core.NodeA.Name()}
	answers := "every answer is from a backend its Service had, within endpoint-programmed"
	if w.udp != nil {
		tr, pre := w.udp.traffic(e)
		sc.Traffic, sc.Preconditions = append(sc.Traffic, tr...), append(sc.Preconditions, pre...)
		m.flow, m.udpBudget = w.udp.service, e.Budgets.UDPRepoint
		answers += " (a UDP flow's, within udp-repoint)"
	}
	// The streams a join opens are judged as the others are, but for their gaps
	// (they open during the window) and for those on a spare that vanished, which
	// must end instead.
	joined := s.joinStreams()
	all := []matchers.Option{matchers.Probes(append(streams, joined...)...)}
	but := ""
	if gone := s.Vanished(); len(gone) > 0 {
		var kept []string
		for _, b := range append(slices.Collect(maps.Values(w.own)), Spares...) {
			if !slices.Contains(gone, b) {
				kept = append(kept, b)
			}
		}
		slices.Sort(kept)
		all = append(all, matchers.OnBackends(kept...))
		but = ", but those to " + strings.Join(gone, " and ")
		for _, spare := range gone {
			sc.Checks = append(sc.Checks, conformance.Check{Name: "the streams to " + spare + " end within end-within of its vanishing",
				Matcher: newEndedOnVanish(spare, w.core.NodeA.Name(), e.Budgets.EndWithin, joined)})
		}
	}
	sc.Checks = append(sc.Checks,
		conformance.Check{Name: answers, Matcher: newAnswersAsModelled(m.allowed, m.leaving)},
		conformance.Check{Name: "no established stream reset" + but, Matcher: matchers.HaveNoResets(all...)},
		conformance.Check{Name: "no stream gap over " + gapBudget, Matcher: matchers.HaveStreamGapsWithin(maxGap, only)},
		conformance.Check{Name: "every stream alive at the end" + but, Matcher: matchers.BeAliveAtEnd(all...)},
	)
	if w.udp != nil {
		sc.Checks = append(sc.Checks, conformance.Check{Name: "no UDP flow unanswered for longer than " + gapBudget, Matcher: newFlowGaps(w.udp.service, maxGap, gapBudget)})
	}
	if handover != nil {
		sc.Checks = append(sc.Checks, handover.After())
	}
}

// judgedAfter is the longest time after a step of w's that the model gives its
// change to be programmed: a round runs past it, a second at least, or its last
// step would not be judged at all (settle, 3 s, is shorter than policy-programmed).
func judgedAfter(b conformance.Budgets, w *world) time.Duration {
	d := b.EndpointProgrammed
	if w.udp != nil {
		d = max(d, b.UDPRepoint)
	}
	if w.pol != nil {
		d = max(d, b.PolicyProgrammed)
	}
	if w.addr != nil {
		d = max(d, b.AddressProgrammed)
	}
	if w.vanishes {
		d = max(d, b.EndWithin)
	}
	return d
}

// serviceOf is the Service whose own backend is b.
func (w *world) serviceOf(b string) string {
	for svc, own := range w.own {
		if own == b {
			return svc
		}
	}
	return ""
}

// execute runs s's steps, each when it is due, those on one node's agent or one
// backend in order: a step due while the one before it on the same node has not
// ended (a restart waits for readiness) starts when it ends. The first step that
// fails stops the rest and is the error, with its mark (an agent not ready again is
// a verdict).
func (w *world) execute(ctx context.Context, e *conformance.Env, s Schedule) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	upgraded := make([]bool, len(w.nodes))
	// The UDP flows and streams a join opens start while the steps after it run.
	var flows errgroup.Group
	do := func(i int) error {
		a := s.Actions[i]
		e.Record(EventStep, fmt.Sprintf("%d: %s", i+1, a))
		var n topologies.Node
		if a.Node > 0 {
			n = w.nodes[a.Node-1]
		}
		switch a.Op {
		case OpRestart:
			return conformance.Restart(n).Do(ctx, e)
		case OpCrash:
			return conformance.Crash(n).Do(ctx, e)
		case OpUpgrade:
			st := conformance.UpgradeAgent(n, false)
			if upgraded[a.Node-1] {
				st = conformance.RollBackAgent(n)
			}
			upgraded[a.Node-1] = !upgraded[a.Node-1]
			return w.burst(ctx, e, s, i, func() error { return st.Do(ctx, e) })
		case OpSwitch:
			return conformance.Switch(n).Do(ctx, e)
		case OpOutage:
			if err := conformance.Stop(n).Do(ctx, e); err != nil {
				return err
			}
			if err := conformance.Hold(ctx, time.Duration(a.For)); err != nil {
				return err
			}
			return conformance.Start(n).Do(ctx, e)
		case OpJoin:
			if err := w.burst(ctx, e, s, i, func() error { return w.label(ctx, e, a.Backend, w.apps[a.Service]) }); err != nil || a.Backend == unready {
				return err
			}
			flows.Go(func() error { return w.openStreams(ctx, e, i+1, a.Service) })
			if w.udp != nil {
				flows.Go(func() error { return w.udp.open(ctx, e, i+1, a.Service) })
			}
			return nil
		case OpLeave:
			return w.burst(ctx, e, s, i, func() error { return w.label(ctx, e, a.Backend, idleApp) })
		case OpVanish:
			if err := conformance.VanishPod(w.spares[a.Backend]).Do(ctx, e); err != nil {
				return err
			}
			e.Record(vanishedEvent(a.Backend), "")
			return nil
		case OpPolicy:
			return w.pol.put(ctx, e, a.Case)
		case OpPod:
			return w.pol.addPod(ctx, e, fmt.Sprintf("new-%d", i+1), a.like(), w.nodes[0])
		case OpAddAddress, OpRemoveAddress:
			return w.addr.set(ctx, e, a.Op == OpAddAddress)
		case OpChurn:
			return w.churn(ctx, e, i+1, time.Duration(a.For))
		}
		return fmt.Errorf("no step %q", a.Op)
	}
	queues := map[string]chan int{}
	var wg sync.WaitGroup
	start := time.Now()
	for i, a := range s.Actions {
		t := time.NewTimer(time.Until(start.Add(time.Duration(a.At))))
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
		}
		if ctx.Err() != nil {
			break
		}
		q, ok := queues[a.resource()]
		if !ok {
			q = make(chan int, len(s.Actions))
			queues[a.resource()] = q
			wg.Go(func() {
				for i := range q {
					if ctx.Err() != nil {
						continue
					}
					if err := do(i); err != nil {
						cancel(fmt.Errorf("step %d (%s): %w", i+1, s.Actions[i], err))
					}
				}
			})
		}
		q <- i
	}
	for _, q := range queues {
		close(q)
	}
	wg.Wait()
	err := flows.Wait()
	if cause := context.Cause(ctx); cause != nil && ctx.Err() != nil {
		return cause
	}
	return err
}

// label sets a spare backend's app label, recording the change first.
func (w *world) label(ctx context.Context, e *conformance.Env, backend, app string) error {
	return conformance.Relabel(w.spares[backend], map[string]string{"app": app}, EventLabelled).Do(ctx, e)
}

// openStreams opens the streams of step (a join of a ready spare to svc),
// joinStreamsAfter it; it stops early, with no error, when ctx ends.
func (w *world) openStreams(ctx context.Context, e *conformance.Env, step int, svc string) error {
	if conformance.Hold(ctx, joinStreamsAfter) != nil {
		return nil
	}
	name := joinStream(step)
	if _, err := e.World.StartProbe(ctx, w.core.Client, e.Stream(name, w.svcs[svc].ClusterIPAddr(), joinStreams)); err != nil && ctx.Err() == nil {
		return fmt.Errorf("probe %s: %w", name, err)
	}
	return nil
}

// vanishedEvent is the event a round records once spare has vanished.
func vanishedEvent(spare string) string { return "vanished " + spare }

// model is the Services' ready endpoints as the round changed them, read from the
// timeline's EventLabelled events: a Service's own backend always, and each spare
// that is ready from the moment it was labelled in to the moment it was labelled
// out; the spare that is never ready, never. A change may take budget to be
// programmed; while the agent of the node that programs the probes' paths is down
// (stop-sent, kill-sent or kube-proxy-stop-sent to ready), the datapath may keep
// what it had before, but once that agent is ready it has caught up on what changed
// meanwhile (RESTART-RECONCILE's rule: nothing to a backend that left, from ready).
type model struct {
	tl      func() []timeline.Transition
	budget  time.Duration     // a TCP Service's: endpoint-programmed
	service map[string]string // connect probe -> Service
	// flow is the Service of a UDP flow (udpFlows.service), whose budget is
	// udpBudget (udp-repoint); nil where the round has none.
	flow      func(probe string) (string, bool)
	udpBudget time.Duration
	own       map[string]string // Service -> its own backend
	apps      map[string]string // Service -> its selector's app label
	pathNode  string            // the node whose agent programs every probe's path

	once    sync.Once
	changes map[string][]change // spare -> its label's changes, in time order
	downs   []span              // pathNode's agent not ready
}

// span is a time the agent was not ready, from to to (zero: to the end).
type span struct{ from, to monotime.Time }

type change struct {
	at  monotime.Time
	app string
}

// allowed are the backends that may answer an attempt of probe (a connection or a
// UDP flow's datagram) started at start and answered at answered: the Service's
// own, and every ready spare that was in it at some moment from budget before the
// start to the answer, or, while the agent was down, from budget before it went
// down. The answer, not the start, bounds a join: a client starved of the CPU
// sends its SYN or datagram well after the probe stamps the start, and a spare
// that joined before it was sent may rightly answer it. A probe of no Service
// allows any.
func (m *model) allowed(probe string, start, answered monotime.Time) []string {
	m.once.Do(m.build)
	svc, budget, ok := m.serviceOf(probe)
	if !ok {
		return nil
	}
	out := []string{m.own[svc]}
	lo, hi := start.Add(-budget), max(start, answered)
	for _, d := range m.downs {
		if hi >= d.from && (d.to == 0 || start <= d.to) {
			lo = min(lo, d.from.Add(-budget))
		}
	}
	for _, spare := range Spares {
		if spare != unready && m.inDuring(spare, m.apps[svc], lo, hi) {
			out = append(out, spare)
		}
	}
	return out
}

// leaving reports whether backend may answer an attempt of probe started at t only
// because it left the Service within the budget before t: a reply of its to a
// UDP flow may then cross the deletion of the flow's conntrack entry and arrive
// not translated back, from the backend's own address (as it does from Linux
// conntrack), since the spares go on serving after they leave.
func (m *model) leaving(probe string, t monotime.Time, backend string) bool {
	svc, _, ok := m.serviceOf(probe)
	return ok && slices.Contains(m.allowed(probe, t, t), backend) && backend != m.own[svc] && !m.inDuring(backend, m.apps[svc], t, t)
}

// serviceOf is the Service probe reaches (a connect probe's, or the one whose UDP
// twin a flow sends to) and the budget a change of its endpoints has; ok is false
// for a probe of no Service.
func (m *model) serviceOf(probe string) (svc string, budget time.Duration, ok bool) {
	if svc := m.service[probe]; svc != "" {
		return svc, m.budget, true
	}
	if m.flow != nil {
		if svc, _ := m.flow(probe); svc != "" {
			return svc, m.udpBudget, true
		}
	}
	return "", 0, false
}

func (m *model) build() {
	m.changes = map[string][]change{}
	trs := m.tl()
	m.downs = downs(trs, m.pathNode)
	for _, tr := range trs {
		if tr.Name != EventLabelled {
			continue
		}
		backend, app, ok := strings.Cut(tr.Detail, " app=")
		if !ok {
			continue
		}
		m.changes[backend] = append(m.changes[backend], change{tr.Time, app})
	}
}

// downs are the times the agent of node (of any node, if empty) was down: from its
// stop, kill, or kube-proxy's stop in a switch, to its ready (zero: not ready again
// by the end).
func downs(trs []timeline.Transition, node string) []span {
	var out []span
	down := map[string]monotime.Time{}
	for _, tr := range trs {
		if node != "" && tr.Detail != node {
			continue
		}
		switch tr.Name {
		case timeline.StopSent, timeline.KillSent, harness.KubeProxyStopSent:
			if down[tr.Detail] == 0 {
				down[tr.Detail] = tr.Time
			}
		case timeline.Ready:
			if from := down[tr.Detail]; from != 0 {
				out = append(out, span{from, tr.Time})
				delete(down, tr.Detail)
			}
		}
	}
	for _, n := range slices.Sorted(maps.Keys(down)) {
		out = append(out, span{from: down[n]})
	}
	return out
}

// inDuring reports whether spare's app label was app at some moment in [lo, hi]: at
// lo, or set so inside.
func (m *model) inDuring(spare, app string, lo, hi monotime.Time) bool {
	cur := idleApp
	for _, c := range m.changes[spare] {
		if c.at > hi {
			break
		}
		if c.at <= lo {
			cur = c.app
			continue
		}
		if c.app == app {
			return true
		}
	}
	return cur == app
}
