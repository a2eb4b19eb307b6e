package specs

import (
	"context"

	"github.com/dpconform/dpconform/conformance"
	"github.com/dpconform/dpconform/driver"
	"github.com/dpconform/dpconform/fv/matchers"
	"github.com/dpconform/dpconform/fv/workloads"
)

// The Upgrade profile: node-a's agent is restarted as another variant of itself, a
// conntrack table of another size or another version of the implementation, and
// what the old one's datapath held must carry over. Facts: Calico PR 12164's review
// (the copy of conntrack entries into a new map must run after the new programs are
// attached, or what the old programs write in between is lost) and Calico PR 10557
// (the conntrack map moved to LRU with a version bump).

// ctSize is the start option that sizes the conntrack table (`--set ct-size=N`,
// in entries): a key the driver contract names (docs/driver.md).
func ctSize(n string) driver.StartOptions {
	return driver.StartOptions{Set: map[string]string{"ct-size": n}}
}

// upgradeStreams is the body of the upgrade specs of established flows: the streams
// of RESTART-ESTABLISHED, across a graceful stop of node-a's agent and a start with
// the spec's upgrade options.
func upgradeStreams(ctx context.Context, e *conformance.Env) error {
	f, err := workloads.DeployCore(ctx, e.World, e.Warm())
	if err != nil {
		return err
	}
	sc := conformance.Scenario{
		Preconditions: []conformance.Check{
			{Name: "every stream carries echoes before the upgrade", Matcher: matchers.HaveStreamGapsWithin(e.Budgets.StreamMaxGap)},
			{Name: "no stream is reset before the upgrade", Matcher: matchers.HaveNoResets()},
		},
		Transition: []conformance.Step{conformance.UpgradeAgent(f.NodeA, false)},
		Checks: []conformance.Check{
			{Name: "no stream reset across the upgrade", Matcher: matchers.HaveNoResets()},
			{Name: "no stream gap over budget across the upgrade", Matcher: matchers.HaveStreamGapsWithin(e.Budgets.StreamMaxGap)},
			{Name: "every stream alive after the upgrade", Matcher: matchers.BeAliveAtEnd()},
		},
	}
	for _, fl := range establishedFlows(f, e) {
		sc.Traffic = append(sc.Traffic, conformance.Traffic{From: fl.From, Probe: e.Stream(fl.Name, fl.Target, streamsPerFlow)})
	}
	return e.Run(ctx, sc)
}

// establishedFlows are RESTART-ESTABLISHED's: pod to pod on one node and across
// nodes, the client pod to each ClusterIP, the outside to each NodePort.
func establishedFlows(f *workloads.Core, e *conformance.Env) []workloads.Flow {
	out := f.DirectFlows()
	for _, fl := range f.Flows(e.Topo, workloads.FlowClusterIPLocal, workloads.FlowClusterIPRemote) {
		out = append(out, workloads.Flow{Name: "pod-" + fl.Name, From: fl.From, Target: fl.Target})
	}
	for _, fl := range f.Flows(e.Topo, workloads.FlowNodePortLocal, workloads.FlowNodePortRemote) {
		out = append(out, workloads.Flow{Name: "external-" + fl.Name, From: fl.From, Target: fl.Target})
	}
	return out
}
