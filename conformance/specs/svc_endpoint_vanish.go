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
		ID:       "SVC-ENDPOINT-VANISH",
		Profile:  conformance.Core,
		Features: []conformance.Feature{conformance.FeatureClusterIP},
		Description: "When a Service's backend vanishes without closing its connections (its network goes first, no FIN), streams to the backend that stays are unaffected, " +
			"streams to the vanished one end (the dataplane resets them) instead of hanging silently, and new connections stop going to it.",
		Catches: []conformance.FaultCase{
			{Fault: "keep-flows-to-gone-backends", Kinds: []conformance.FailureKind{matchers.KindHang}},
		},
		Body: endpointVanish,
	})
}

const (
	backendVanished = "backend-vanished"
	vanishConnect   = "vanish-connect"
)

func endpointVanish(ctx context.Context, e *conformance.Env) error {
	pair, err := deployEndpointPair(ctx, e, "vanish")
	if err != nil {
		return err
	}
	if err := workloads.WaitAllFlowing(ctx, e.World, e.Warm(), pair.flows()...); err != nil {
		return err
	}
	keep, gone, client, svc := pair.keep, pair.gone, pair.client, pair.svc
	onKeep := matchers.OnBackends(keep.Name())
	budget := e.Budgets.EndpointProgrammed
	return e.Run(ctx, conformance.Scenario{
		Traffic: []conformance.Traffic{
			{From: client, Probe: e.Stream("vanish", svc.ClusterIPAddr(), churnStreams)},
			{From: client, Probe: e.Connect(vanishConnect, svc.ClusterIPAddr())},
		},
		Preconditions: []conformance.Check{
			{Name: "every stream carries echoes before the change", Matcher: matchers.HaveStreamGapsWithin(e.Budgets.StreamMaxGap)},
			{Name: "the Service spreads the streams over both backends", Matcher: matchers.HaveStreamsOn(keep.Name(), gone.Name())},
			{Name: "every new connection succeeds before the change",
				Matcher: matchers.HaveNoFailedAttempts(matchers.Probes(vanishConnect), matchers.Backends(keep.Name(), gone.Name()))},
		},
		Transition: []conformance.Step{
			conformance.Record(backendVanished, gone.Name()),
			conformance.VanishPod(gone),
			conformance.Do("wait until the EndpointSlices list only vanish-keep", func(ctx context.Context, e *conformance.Env) error {
				return topologies.WaitForEndpoints(ctx, e.Topo.Kube(), "default", svc.Name, keep)
			}),
			conformance.Record(endpointsUpdated, ""),
		},
		Checks: []conformance.Check{
			{Name: "no reset on the streams to the backend that stays", Matcher: matchers.HaveNoResets(onKeep)},
			{Name: "no gap over budget on streams to the backend that stays", Matcher: matchers.HaveStreamGapsWithin(e.Budgets.StreamMaxGap, onKeep)},
			{Name: "streams to the backend that stays alive at the end", Matcher: matchers.BeAliveAtEnd(onKeep)},
			// The vanished pod sends nothing: only the dataplane, told by the
			// EndpointSlices, can end its flows.
			{Name: "the streams to the vanished backend end instead of hanging",
				Matcher: matchers.HaveStreamsEndedWithin(endpointsUpdated, e.Budgets.EndWithin, matchers.OnBackends(gone.Name()))},
			// Until then the vanished backend's connections time out: it is gone.
			{Name: fmt.Sprintf("every new connection succeeds, on vanish-keep, from %s after the EndpointSlices stop listing vanish-gone", budget),
				Matcher: matchers.HaveNoFailedAttempts(matchers.Probes(vanishConnect), matchers.Backends(keep.Name()), matchers.From(endpointsUpdated, budget))},
		},
	})
}
