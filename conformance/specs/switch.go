package specs

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"

	"github.com/dpconform/dpconform/conformance"
	"github.com/dpconform/dpconform/fv/matchers"
	"github.com/dpconform/dpconform/fv/nodestate"
	"github.com/dpconform/dpconform/fv/workloads"
	"github.com/dpconform/dpconform/topologies"
)

// The ModeSwitch profile: node-a runs the real kube-proxy (iptables mode, FORWARD
// policy DROP) and node-b the implementation; flows are opened through kube-proxy,
// then node-a is switched over (kube-proxy stops and leaves its rules and Linux
// conntrack, the implementation starts). Facts: Calico PR 13778.

// switchTransition is the transition of every SWITCH spec, for the catalogue.
const switchTransition = "node-a runs the real kube-proxy (iptables mode, FORWARD policy DROP) first; kube-proxy is stopped, leaving its rules and Linux conntrack, and the implementation is started on node-a"

// switchSetup puts kube-proxy on node-a (the node under switch).
var switchSetup = conformance.Setup{KubeProxy: []int{0}}

// switchStream is one of the four stream specs: which Core service flow it holds.
type switchStream struct {
	id, what string
	flow     string // the Core fixture's flow (workloads.Flow*)
	features []conformance.Feature
	catches  []conformance.FaultCase
}

// survive are the kinds by which a stream shows it did not survive a transition.
var survive = []conformance.FailureKind{matchers.KindReset, matchers.KindGap, matchers.KindNotAlive}

func init() {
	flushCT := conformance.FaultCase{Fault: "flush-conntrack-on-takeover", Kinds: survive}
	for _, s := range []switchStream{
		{"SWITCH-CLUSTERIP-LOCAL", "a pod to a ClusterIP whose backend is on the same node", workloads.FlowClusterIPLocal,
			nil, []conformance.FaultCase{flushCT}},
		{"SWITCH-CLUSTERIP-REMOTE", "a pod to a ClusterIP whose backend is on another node", workloads.FlowClusterIPRemote,
			nil, []conformance.FaultCase{flushCT}},
		{"SWITCH-NODEPORT-LOCAL", "the external client to the node's NodePort, backend on the node", workloads.FlowNodePortLocal,
			nil, []conformance.FaultCase{flushCT}},
		// Seed 2: it enters and leaves on eth0, so no workload accept covers it, and
		// once KUBE-FORWARD is gone only a fallthrough accept in FORWARD does.
		{"SWITCH-NODEPORT-REMOTE", "the external client to the node's NodePort, backend on another node", workloads.FlowNodePortRemote,
			[]conformance.Feature{conformance.FeatureNodePortRemoteBackend},
			[]conformance.FaultCase{{Fault: "no-forward-fallthrough-accept", Kinds: survive}, flushCT}},
	} {
		conformance.Register(conformance.Spec{
			ID:          s.id,
			Profile:     conformance.ModeSwitch,
			Features:    append([]conformance.Feature{conformance.FeatureClusterIP, conformance.FeatureNodePort}, s.features...),
			Description: "A long-lived TCP stream from " + s.what + ", opened through kube-proxy, survives the node's switch from kube-proxy to the implementation: no reset, no gap over budget, alive after.",
			Transition:  switchTransition,
			Traffic:     "two long-lived TCP streams, a message every {stream-interval}, from " + s.what + ", opened through kube-proxy and proven to run through its DNAT (Linux conntrack) before the switch",
			Invariant:   "no reset; no gap over {switch-max-gap}; alive {switch-settle} after `ready`; the rules kube-proxy held before the switch are gone by then",
			Budgets:     []string{"switch-max-gap", "switch-settle", "stream-interval", "alive-within"},
			Origin:      "Calico PR 13778 (in 3.33), whose four specs these are: a flow that predates the eBPF dataplane falls through to Linux conntrack, and a NodePort flow to a remote backend, which enters and leaves by the host interface, lost its accept when kube-proxy's KUBE-FORWARD went (only that one failed without the fix)",
			Catches:     s.catches,
			Setup:       switchSetup,
			Body:        switchStreamBody(s.flow),
		})
	}
	conformance.Register(conformance.Spec{
		ID:          "SWITCH-NEW-CONNECTIONS",
		Profile:     conformance.ModeSwitch,
		Features:    []conformance.Feature{conformance.FeatureClusterIP, conformance.FeatureNodePort, conformance.FeatureNodePortRemoteBackend},
		Description: "New TCP connections every {connect-interval} (outside to the node's NodePorts, a pod to ClusterIPs; local and remote backends) all succeed while the node switches from kube-proxy to the implementation.",
		Transition:  switchTransition,
		Traffic:     "a new TCP connection every {connect-interval} on each of the four paths: the external client to node-a's NodePort (backend on node-a and on node-b), a pod on node-a to the ClusterIP (backend on node-a and on node-b)",
		Invariant:   "zero failed attempts from 1 s before `kube-proxy-stop-sent` to 5 s after `ready`; the rules kube-proxy held before the switch are gone by then",
		Budgets:     []string{"connect-interval", "attempt-timeout", "lead", "switch-settle"},
		Origin:      "a hand-over done in the wrong order: kube-proxy's rules removed before the implementation's datapath and Services are in place",
		Catches: []conformance.FaultCase{
			{Fault: "cleanup-before-attach", Kinds: []conformance.FailureKind{matchers.KindReset, matchers.KindTimeout, matchers.KindUnreachable}},
		},
		Setup: switchSetup,
		Body:  switchNewConnections,
	})
	conformance.Register(conformance.Spec{
		ID:          "SWITCH-CLEANUP",
		Profile:     conformance.ModeSwitch,
		Features:    []conformance.Feature{conformance.FeatureClusterIP, conformance.FeatureNodePort},
		Description: "After the switch from kube-proxy, kube-proxy's service chains and the jumps to them are gone from the node, rules that are not kube-proxy's are untouched, and every Service takes new connections.",
		Transition:  switchTransition,
		Traffic:     "new connections on every path after the switch",
		Invariant:   "kube-proxy's service chains (KUBE-SERVICES, KUBE-NODEPORTS, KUBE-FORWARD, KUBE-SVC-*, KUBE-SEP-*, KUBE-FW-*, KUBE-XLB-*, KUBE-EXT-*, KUBE-EXTERNAL-SERVICES, ...; KUBE-MARK-* may stay), the jumps to them and its nftables tables, as they were before the switch, are gone; rules the suite planted are untouched; every Service takes new connections",
		Budgets:     []string{"switch-settle", "programmed"},
		Origin:      "a dataplane that takes a node over and leaves kube-proxy's chains behind, which go on NATing what the datapath passes to the stack and go stale as Services change",
		Catches: []conformance.FaultCase{
			{Fault: "no-kube-proxy-cleanup", Kinds: []conformance.FailureKind{conformance.KindRulesLeft}},
		},
		Setup: switchSetup,
		Body:  switchCleanup,
	})
}

func switchStreamBody(flow string) func(context.Context, *conformance.Env) error {
	return func(ctx context.Context, e *conformance.Env) error {
		f, err := workloads.DeployCore(ctx, e.World, e.Warm())
		if err != nil {
			return err
		}
		fl := f.Flows(e.Topo, flow)[0]
		backend := f.Local
		if fl.Backend == f.Remote.Name() {
			backend = f.Remote
		}
		only := matchers.Probes(fl.Name)
		h := &conformance.Handover{Node: f.NodeA}
		return e.Run(ctx, conformance.Scenario{
			Traffic: []conformance.Traffic{{From: fl.From, Probe: e.Stream(fl.Name, fl.Target, streamsPerFlow)}},
			Preconditions: []conformance.Check{
				{Name: "the streams carry echoes through kube-proxy before the switch", Matcher: matchers.HaveStreamGapsWithin(e.Budgets.StreamMaxGap, only)},
				conformance.ForwardPolicyDrop(f.NodeA),
				throughKubeProxy(f.NodeA, fl, backend, streamsPerFlow),
				h.Before(),
			},
			Transition: []conformance.Step{conformance.Switch(f.NodeA)},
			Settle:     e.Budgets.SwitchSettle,
			Checks: []conformance.Check{
				h.After(),
				{Name: "no stream reset across the switch", Matcher: matchers.HaveNoResets(only)},
				{Name: "no stream gap over budget across the switch", Matcher: matchers.HaveStreamGapsWithin(e.Budgets.SwitchMaxGap, only)},
				{Name: "every stream alive after the switch", Matcher: matchers.BeAliveAtEnd(only)},
			},
		})
	}
}

func switchNewConnections(ctx context.Context, e *conformance.Env) error {
	f, err := workloads.DeployCore(ctx, e.World, e.Warm())
	if err != nil {
		return err
	}
	h := &conformance.Handover{Node: f.NodeA}
	sc := conformance.Scenario{
		Preconditions: []conformance.Check{conformance.ForwardPolicyDrop(f.NodeA), h.Before()},
		Transition:    []conformance.Step{conformance.Switch(f.NodeA)},
		Settle:        e.Budgets.SwitchSettle,
	}
	for _, fl := range f.ServiceFlows(e.Topo) {
		noneFail := func() matchers.Matcher {
			return matchers.HaveNoFailedAttempts(matchers.Probes(fl.Name), matchers.Backends(fl.Backend))
		}
		sc.Traffic = append(sc.Traffic, conformance.Traffic{From: fl.From, Probe: e.Connect(fl.Name, fl.Target)})
		sc.Preconditions = append(sc.Preconditions, conformance.Check{Name: "new connections reach " + fl.Backend + " on " + fl.Name + " through kube-proxy", Matcher: noneFail()})
		sc.Checks = append(sc.Checks, conformance.Check{Name: "no failed new connection on " + fl.Name + " across the switch", Matcher: noneFail()})
	}
	sc.Checks = append(sc.Checks, h.After())
	return e.Run(ctx, sc)
}

func switchCleanup(ctx context.Context, e *conformance.Env) error {
	f, err := workloads.DeployCore(ctx, e.World, e.Warm())
	if err != nil {
		return err
	}
	if err := nodestate.Plant(ctx, f.NodeA); err != nil {
		return err
	}
	h := &conformance.Handover{Node: f.NodeA}
	return e.Run(ctx, conformance.Scenario{
		Preconditions: []conformance.Check{
			conformance.ForwardPolicyDrop(f.NodeA),
			h.Before(),
		},
		Transition: []conformance.Step{conformance.Switch(f.NodeA)},
		Settle:     e.Budgets.SwitchSettle,
		Checks: []conformance.Check{
			h.After(),
			{Name: "rules that are not kube-proxy's are untouched", State: func(ctx context.Context, e *conformance.Env) (conformance.StateResult, error) {
				missing, err := nodestate.MissingPlanted(ctx, f.NodeA)
				if err != nil {
					return conformance.StateResult{}, err
				}
				r := conformance.StateResult{Figures: []matchers.Figure{conformance.Count("planted_rules_removed", len(missing), budgetZero(), fmt.Sprintf("of %d rules the suite planted, removed", len(nodestate.Planted)))}}
				if len(missing) > 0 {
					r.Kind, r.Violation = conformance.KindRulesRemoved, "the switch removed rules that are not kube-proxy's:\n  "+strings.Join(missing, "\n  ")
				}
				return r, nil
			}},
			{Name: "every Service takes new connections after the switch", State: func(ctx context.Context, e *conformance.Env) (conformance.StateResult, error) {
				var failed []string
				for _, fl := range f.ServiceFlows(e.Topo) {
					fl.Name = "after-switch-" + fl.Name
					if err := workloads.WaitFlowing(ctx, e.World, fl, e.Warm()); err != nil {
						failed = append(failed, err.Error())
					}
				}
				r := conformance.StateResult{Figures: []matchers.Figure{conformance.Count("services_not_flowing", len(failed), budgetZero(), "of 4 service flows, not carrying new connections")}}
				if len(failed) > 0 {
					r.Kind, r.Violation = conformance.KindNotFlowing, strings.Join(failed, "\n")
				}
				return r, nil
			}},
		},
	})
}

// throughKubeProxy proves the flows run through kube-proxy's DNAT: Linux conntrack on
// the node holds at least want established flows to the flow's target whose replies
// come from the backend.
func throughKubeProxy(n topologies.Node, fl workloads.Flow, backend topologies.Pod, want int) conformance.Check {
	return conformance.Check{Name: "the streams run through kube-proxy's DNAT on " + n.Name(), State: func(ctx context.Context, e *conformance.Env) (conformance.StateResult, error) {
		host, port, err := net.SplitHostPort(fl.Target)
		if err != nil {
			return conformance.StateResult{}, err
		}
		p, _ := strconv.Atoi(port)
		to := net.JoinHostPort(backend.IP().String(), strconv.Itoa(workloads.EchoPort))
		flows, err := nodestate.ConntrackTo(ctx, n, host, p)
		if err != nil {
			return conformance.StateResult{}, err
		}
		nated := 0
		for _, c := range flows {
			if c.State == "ESTABLISHED" && c.ReplySrc == to {
				nated++
			}
		}
		if nated < want {
			return conformance.StateResult{}, fmt.Errorf("%w: Linux conntrack on %s holds %d established flows to %s answered by %s, want %d: the streams do not run through kube-proxy", conformance.ErrEnvironment, n.Name(), nated, fl.Target, to, want)
		}
		return conformance.StateResult{Figures: []matchers.Figure{conformance.Count("kube_proxy_flows", nated, nil, "established flows NATed by kube-proxy in Linux conntrack")}}, nil
	}}
}

func budgetZero() *float64 { z := 0.0; return &z }
