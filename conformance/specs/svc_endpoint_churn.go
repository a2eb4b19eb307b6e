package specs

import (
	"context"
	"fmt"
	"net"
	"strconv"

	"github.com/dpconform/dpconform/conformance"
	"github.com/dpconform/dpconform/fv/matchers"
	"github.com/dpconform/dpconform/fv/probe"
	"github.com/dpconform/dpconform/topologies"
)

func init() {
	conformance.Register(conformance.Spec{
		ID:          "SVC-ENDPOINT-CHURN",
		Profile:     conformance.Core,
		Features:    []string{conformance.FeatureClusterIP},
		Description: "When a Service gains a backend and loses another, streams to the backend that stays are unaffected, and streams to the removed backend end (RST or FIN) instead of hanging silently.",
		Catches: []conformance.FaultCase{
			{Fault: "rebuild-backends-in-place", Kinds: []conformance.FailureKind{conformance.KindReset, conformance.KindGap, conformance.KindNotAlive}},
		},
		Run: endpointChurn,
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
	keep, err := addBackend(ctx, e, "churn-keep", nodeA.Name(), labels)
	if err != nil {
		return err
	}
	gone, err := e.Topo.AddPod(ctx, topologies.PodSpec{Name: "churn-gone", Node: nodeB.Name(), Labels: labels})
	if err != nil {
		return conformance.Environmentf("add pod churn-gone: %v", err)
	}
	goneServer, err := e.World.StartProbe(ctx, gone, probe.Serve{Name: gone.Name(), TCP: []int{EchoPort}})
	if err != nil {
		return conformance.Environmentf("%v", err)
	}
	client, err := e.Topo.AddPod(ctx, topologies.PodSpec{Name: "client", Node: nodeA.Name()})
	if err != nil {
		return conformance.Environmentf("add pod client: %v", err)
	}
	svc, err := addService(ctx, e, "churn", labels, keep, gone)
	if err != nil {
		return err
	}
	// Both backends must serve through the ClusterIP before streams start.
	for _, b := range []topologies.Pod{keep, gone} {
		direct := net.JoinHostPort(b.IP().String(), strconv.Itoa(EchoPort))
		if err := waitFlowing(ctx, e, client, "direct-"+b.Name(), direct, b.Name()); err != nil {
			return err
		}
	}
	if err := waitFlowing(ctx, e, client, "clusterip", svc.clusterIPAddr(), ""); err != nil {
		return err
	}
	cfg := probe.Stream{Name: "churn", Target: svc.clusterIPAddr(), Streams: churnStreams, Interval: e.Budgets.StreamInterval, DialTimeout: e.Budgets.AttemptTimeout}
	if _, err := e.World.StartProbe(ctx, client, cfg); err != nil {
		return conformance.Environmentf("%v", err)
	}
	steady, err := e.SteadyState(ctx)
	if err != nil {
		return err
	}
	if err := e.Precondition("every stream carries echoes before the change", steady, matchers.HaveStreamGapsWithin(e.Budgets.StreamMaxGap)); err != nil {
		return err
	}
	perBackend := map[string]int{}
	seen := map[int]bool{}
	for _, ev := range steady.Inside() {
		if ev.Kind == probe.KindEcho && ev.Backend != "" && !seen[ev.Stream] {
			seen[ev.Stream] = true
			perBackend[ev.Backend]++
		}
	}
	if perBackend[keep.Name()] == 0 || perBackend[gone.Name()] == 0 {
		return conformance.PreconditionFailf("the Service must spread %d streams over both backends to test them; it put %v", churnStreams, perBackend)
	}

	var newcomer topologies.Pod
	win, err := e.Transition(ctx, func(ctx context.Context) error {
		e.World.Timeline.Record(backendAdded, "churn-new")
		if newcomer, err = addBackend(ctx, e, "churn-new", nodeB.Name(), labels); err != nil {
			return err
		}
		// As a kubelet does: the container stops (its sockets close), then the pod
		// and its network go.
		e.World.Timeline.Record(backendRemoved, gone.Name())
		if err := goneServer.Stop(ctx); err != nil {
			return conformance.Environmentf("stop the server of %s: %v", gone.Name(), err)
		}
		if err := e.Topo.RemovePod(ctx, gone); err != nil {
			return conformance.Environmentf("remove %s: %v", gone.Name(), err)
		}
		if err := topologies.WaitForEndpoints(ctx, e.Topo.Kube(), "default", "churn", keep, newcomer); err != nil {
			return conformance.Environmentf("%v", err)
		}
		e.World.Timeline.Record(endpointsUpdated, "")
		return nil
	})
	if err != nil {
		return err
	}
	onKeep := matchers.OnBackends(keep.Name())
	for _, c := range []struct {
		name string
		m    matchers.Matcher
	}{
		{fmt.Sprintf("no reset on the %d streams to the backend that stays", perBackend[keep.Name()]), matchers.HaveNoResets(onKeep)},
		{"no gap over budget on streams to the backend that stays", matchers.HaveStreamGapsWithin(e.Budgets.StreamMaxGap, onKeep)},
		{"streams to the backend that stays alive at the end", matchers.BeAliveAtEnd(onKeep)},
		{fmt.Sprintf("the %d streams to the removed backend end instead of hanging", perBackend[gone.Name()]),
			matchers.HaveStreamsEndedWithin(backendRemoved, e.Budgets.EndWithin, matchers.OnBackends(gone.Name()))},
	} {
		if _, err := e.Check(c.name, win, c.m); err != nil {
			return err
		}
	}
	return nil
}
