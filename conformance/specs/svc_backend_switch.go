package specs

import (
	"context"
	"fmt"

	"github.com/dpconform/dpconform/conformance"
	"github.com/dpconform/dpconform/fv/matchers"
	"github.com/dpconform/dpconform/fv/workloads"
	"github.com/dpconform/dpconform/topologies"
)

func init() {
	conformance.Register(conformance.Spec{
		ID:       "SVC-BACKEND-SWITCH",
		Profile:  conformance.Core,
		Features: []conformance.Feature{conformance.FeatureClusterIP},
		Description: fmt.Sprintf("New connections to a Service all succeed while its backend set changes %d times "+
			"(a third backend, serving throughout, put in and taken out in turn): a frontend never points at backends "+
			"not written yet, or at none, even for microseconds.", switches),
		Transition: fmt.Sprintf("%d changes of the Service's backends, one after another: switch-c, which serves throughout, is labelled into the Service and out of it in turn, each change awaited in the EndpointSlices before the next", switches),
		Traffic:    "a pod on each node opens a new TCP connection to the ClusterIP every {order-interval} (each node's dataplane writes the change in its own time)",
		Invariant:  "zero failed new connections over the whole window, each answered by one of the three backends",
		Budgets:    []string{"order-interval", "attempt-timeout"},
		Origin:     "a backend change applied frontends first: the Service's frontends switched to a backend set whose entries are written after them, so a connection in between finds no backend",
		Design: "The window of such a reordering is the dataplane's own write of one Service, tens of microseconds " +
			"(refdp's fault logs it: 10 to 450 µs, median 18). A connection every 250 µs met one node's window about once in " +
			"30 changes: 60 changes from one node caught the fault in 16 of 20 runs. Each node writes the change on its own, " +
			"so a client on each doubles the chances, and many changes make a miss unlikely without widening anything. The backend " +
			"that comes and goes serves throughout, so a connection sent to it, before or after, is answered: only a " +
			"frontend without backends fails one.",
		// Caught in 18 of 20 runs (docs/faults.md): three runs miss about once in 1,000.
		Catches: []conformance.FaultCase{{Fault: "frontends-before-backends", Kinds: []conformance.FailureKind{matchers.KindTimeout}, Runs: 3}},
		Body:    backendSwitch,
	})
}

// switches is how many times SVC-BACKEND-SWITCH changes its Service's backends.
const switches = 100

func backendSwitch(ctx context.Context, e *conformance.Env) error {
	pair, err := deployEndpointPair(ctx, e, "switch")
	if err != nil {
		return err
	}
	// switch-c serves from the start, outside the Service until the transition.
	c, _, err := workloads.AddBackend(ctx, e.World, "switch-c", e.Topo.Nodes()[1].Name(), map[string]string{"app": "switch-idle"})
	if err != nil {
		return err
	}
	clientB, err := e.Topo.AddPod(ctx, topologies.PodSpec{Name: "client-b", Node: e.Topo.Nodes()[1].Name()})
	if err != nil {
		return err
	}
	if err := workloads.WaitAllFlowing(ctx, e.World, e.Warm(), append(pair.flows(),
		workloads.Flow{Name: "direct-" + c.Name(), From: pair.client, Target: workloads.Direct(c), Backend: c.Name()},
		workloads.Flow{Name: "clusterip-b", From: clientB, Target: pair.svc.ClusterIPAddr()})...,
	); err != nil {
		return err
	}
	a, b := pair.keep.Name(), pair.gone.Name()
	var steps []conformance.Step
	for i := range switches {
		if i%2 == 0 {
			steps = append(steps, conformance.Relabel(c, pair.labels, backendAdded), conformance.AwaitReadyEndpoints(pair.svc.Name, a, b, c.Name()))
		} else {
			steps = append(steps, conformance.Relabel(c, map[string]string{"app": "switch-idle"}, backendRemoved), conformance.AwaitReadyEndpoints(pair.svc.Name, a, b))
		}
	}
	fromA := orderConnect(e, "switch-connect-a", pair.svc.ClusterIPAddr())
	fromB := orderConnect(e, "switch-connect-b", pair.svc.ClusterIPAddr())
	probes := matchers.Probes(fromA.Name, fromB.Name)
	return e.Run(ctx, conformance.Scenario{
		Traffic: []conformance.Traffic{{From: pair.client, Probe: fromA}, {From: clientB, Probe: fromB}},
		Preconditions: []conformance.Check{
			{Name: "every new connection succeeds before the changes", Matcher: matchers.HaveNoFailedAttempts(probes, matchers.Backends(a, b))},
		},
		Transition: steps,
		Checks: []conformance.Check{
			{Name: "every new connection succeeds while the backends change", Matcher: matchers.HaveNoFailedAttempts(probes, matchers.Backends(a, b, c.Name()))},
		},
	})
}
