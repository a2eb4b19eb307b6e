package specs

import (
	"context"

	"github.com/dpconform/dpconform/conformance"
	"github.com/dpconform/dpconform/fv/matchers"
	"github.com/dpconform/dpconform/fv/workloads"
	"github.com/dpconform/dpconform/topologies"
)

func init() {
	conformance.Register(conformance.Spec{
		ID:          "SVC-ENDPOINT-CHURN",
		Profile:     conformance.Core,
		Features:    []conformance.Feature{conformance.FeatureClusterIP},
		Description: "When a Service gains a backend and loses another, streams to the backend that stays are unaffected, and streams to the removed backend end (RST or FIN) instead of hanging silently.",
		Catches: []conformance.FaultCase{
			{Fault: "rebuild-backends-in-place", Kinds: []conformance.FailureKind{matchers.KindReset, matchers.KindGap, matchers.KindNotAlive}},
		},
		Body: endpointChurn,
	})
}

// churnStreams is enough streams that the Service's load balancing puts some on
// each of the two backends (a precondition checks that it did).
const churnStreams = 16

// Names of the transition events of an endpoint change.
const (
	backendAdded     = "backend-added"
	backendRemoved   = "backend-removed"
	endpointsUpdated = "endpoints-updated"
)

func endpointChurn(ctx context.Context, e *conformance.Env) error {
	nodes := e.Topo.Nodes()
	nodeA, nodeB := nodes[0], nodes[1]
	labels := map[string]string{"app": "churn"}
	keep, _, err := workloads.AddBackend(ctx, e.World, "churn-keep", nodeA.Name(), labels)
	if err != nil {
		return err
	}
	gone, goneServer, err := workloads.AddBackend(ctx, e.World, "churn-gone", nodeB.Name(), labels)
	if err != nil {
		return err
	}
	client, err := e.Topo.AddPod(ctx, topologies.PodSpec{Name: "client", Node: nodeA.Name()})
	if err != nil {
		return err
	}
	svc, err := workloads.AddService(ctx, e.World, "churn", labels, keep, gone)
	if err != nil {
		return err
	}
	// Both backends must serve, directly and through the ClusterIP, before streams start.
	if err := workloads.WaitAllFlowing(ctx, e.World, e.Warm(),
		workloads.Flow{Name: "direct-" + keep.Name(), From: client, Target: workloads.Direct(keep), Backend: keep.Name()},
		workloads.Flow{Name: "direct-" + gone.Name(), From: client, Target: workloads.Direct(gone), Backend: gone.Name()},
		workloads.Flow{Name: "clusterip", From: client, Target: svc.ClusterIPAddr()},
	); err != nil {
		return err
	}

	var newcomer topologies.Pod
	onKeep := matchers.OnBackends(keep.Name())
	return e.Run(ctx, conformance.Scenario{
		Traffic: []conformance.Traffic{{From: client, Probe: e.Stream("churn", svc.ClusterIPAddr(), churnStreams)}},
		Preconditions: []conformance.Check{
			{Name: "every stream carries echoes before the change", Matcher: matchers.HaveStreamGapsWithin(e.Budgets.StreamMaxGap)},
			{Name: "the Service spreads the streams over both backends", Matcher: matchers.HaveStreamsOn(keep.Name(), gone.Name())},
		},
		Transition: []conformance.Step{
			conformance.Record(backendAdded, "churn-new"),
			conformance.Do("add the backend churn-new", func(ctx context.Context, e *conformance.Env) error {
				newcomer, _, err = workloads.AddBackend(ctx, e.World, "churn-new", nodeB.Name(), labels)
				return err
			}),
			// As a kubelet does: the container stops (its sockets close), then the pod
			// and its network go.
			conformance.Record(backendRemoved, gone.Name()),
			conformance.StopServer(goneServer),
			conformance.RemovePod(gone),
			conformance.Do("wait until the EndpointSlices list churn-keep and churn-new", func(ctx context.Context, e *conformance.Env) error {
				return topologies.WaitForEndpoints(ctx, e.Topo.Kube(), "default", svc.Name, keep, newcomer)
			}),
			conformance.Record(endpointsUpdated, ""),
		},
		Checks: []conformance.Check{
			{Name: "no reset on the streams to the backend that stays", Matcher: matchers.HaveNoResets(onKeep)},
			{Name: "no gap over budget on streams to the backend that stays", Matcher: matchers.HaveStreamGapsWithin(e.Budgets.StreamMaxGap, onKeep)},
			{Name: "streams to the backend that stays alive at the end", Matcher: matchers.BeAliveAtEnd(onKeep)},
			{Name: "the streams to the removed backend end instead of hanging",
				Matcher: matchers.HaveStreamsEndedWithin(backendRemoved, e.Budgets.EndWithin, matchers.OnBackends(gone.Name()))},
		},
	})
}
