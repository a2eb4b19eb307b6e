package specs

import (
	"context"

	"github.com/dpconform/dpconform/conformance"
	"github.com/dpconform/dpconform/fv/matchers"
	"github.com/dpconform/dpconform/fv/workloads"
)

func init() {
	conformance.Register(conformance.Spec{
		ID:      "RESTART-ESTABLISHED",
		Profile: conformance.Core,
		Features: []conformance.Feature{
			conformance.FeatureClusterIP, conformance.FeatureNodePort, conformance.FeatureNodePortRemoteBackend,
		},
		Description: "Long-lived TCP streams (pod to pod on one node and across nodes, pod to ClusterIP and outside to NodePort with local and remote backends) survive a graceful restart and a SIGKILL of the node's agent: no reset, no gap over budget, all alive after.",
		Transition:  "graceful restart, then SIGKILL and start, of node-a's agent (two rounds)",
		Traffic:     "two long-lived TCP streams each, a message every {stream-interval}: pod to pod on the same node and across nodes, pod to ClusterIP (local and remote backend), external client to NodePort (local and remote backend)",
		Invariant:   "in each round: no reset; no gap over 200 ms on any stream; every stream alive (an echo within 500 ms of the window's end) 3 s after `ready`",
		Budgets:     []string{"stream-interval", "stream-max-gap", "alive-within", "lead", "settle"},
		Origin:      "state that must outlive the agent kept where a restart loses it: long-lived NATed flows survive a restart only if their conntrack state does (Calico and Cilium pin theirs)",
		Catches: []conformance.FaultCase{
			{Fault: "unpinned-conntrack", Kinds: []conformance.FailureKind{matchers.KindReset, matchers.KindGap, matchers.KindNotAlive}},
		},
		Body: restartEstablished,
	})
}

// streamsPerFlow is how many connections each kind of flow holds.
const streamsPerFlow = 2

func restartEstablished(ctx context.Context, e *conformance.Env) error {
	f, err := workloads.DeployCore(ctx, e.World, e.Warm())
	if err != nil {
		return err
	}
	flows := establishedFlows(f, e)
	// Each transition gets fresh streams: a round judges only its own.
	for _, crash := range []bool{false, true} {
		sc := conformance.Scenario{
			Preconditions: []conformance.Check{
				{Name: "every stream carries echoes before the " + how(crash), Matcher: matchers.HaveStreamGapsWithin(e.Budgets.StreamMaxGap)},
				{Name: "no stream is reset before the " + how(crash), Matcher: matchers.HaveNoResets()},
			},
			Transition: []conformance.Step{restart(f.NodeA, crash)},
			Checks: []conformance.Check{
				{Name: "no stream reset across a " + how(crash), Matcher: matchers.HaveNoResets()},
				{Name: "no stream gap over budget across a " + how(crash), Matcher: matchers.HaveStreamGapsWithin(e.Budgets.StreamMaxGap)},
				{Name: "every stream alive after a " + how(crash), Matcher: matchers.BeAliveAtEnd()},
			},
		}
		for _, fl := range flows {
			sc.Traffic = append(sc.Traffic, conformance.Traffic{From: fl.From, Probe: e.Stream(fl.Name, fl.Target, streamsPerFlow)})
		}
		if err := e.Run(ctx, sc); err != nil {
			return err
		}
	}
	return nil
}
