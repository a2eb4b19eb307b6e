package specs

import (
	"context"
	"fmt"

	"github.com/dpconform/dpconform/conformance"
	"github.com/dpconform/dpconform/fv/matchers"
	"github.com/dpconform/dpconform/fv/workloads"
)

func init() {
	conformance.Register(conformance.Spec{
		ID:       "SVC-ENDPOINT-VANISH",
		Profile:  conformance.Core,
		Features: []conformance.Feature{conformance.FeatureClusterIP},
		Description: "When a Service's backend vanishes without closing its connections (its network goes first, no FIN), streams to the backend that stays are unaffected, " +
			"streams to the vanished one end (the dataplane resets them) instead of hanging silently, and new connections stop going to it.",
		Transition: "a Service's backend on node-b vanishes without closing its connections (`backend-vanished`): its network goes first (CNI DEL), then its processes are killed, so no FIN or RST leaves it, then its pod object goes; the suite waits until the EndpointSlices' only ready endpoint is the backend that stays (`endpoint-unready`), then until they list no other endpoint, ready or not (`endpoints-updated`: until then the vanished endpoint may be listed as not ready or terminating, whose flows a dataplane rightly leaves to end on their own)",
		Traffic:    "16 streams from a pod through the ClusterIP, spread over both backends; the same pod opens a new TCP connection every {connect-interval} to the ClusterIP",
		Invariant:  "streams to the backend that stays: no reset, no gap over 200 ms, alive at the end; every stream to the vanished backend ends within {end-within} of `endpoints-updated` (only the dataplane can end it: the dataplane resets it, or the client hangs; the client's retransmissions come at least every second, so the reset shows within a second of the dataplane's); zero failed new connections, all answered by the backend that stays, from {endpoint-programmed} after `endpoint-unready`",
		Budgets:    []string{"stream-max-gap", "alive-within", "end-within", "endpoint-programmed", "connect-interval"},
		Origin:     "a backend lost with its node or sandbox, which closes nothing: a dataplane that leaves ending its flows to the backend (kube-proxy does, docs/kube-proxy.md) leaves their clients retransmitting into silence",
		Catches: []conformance.FaultCase{
			{Fault: "keep-flows-to-gone-backends", Kinds: []conformance.FailureKind{matchers.KindHang}},
		},
		Body: endpointVanish,
	})
}

const (
	backendVanished = "backend-vanished"
	// endpointUnready is when the EndpointSlices stop calling the vanished endpoint
	// ready, which is when new connections must stop going to it; it stays listed
	// (not ready, or terminating) until its pod object is gone, and only then is it
	// gone for a dataplane, which may end its flows (endpointsUpdated). A real
	// kubelet marks it not ready as soon as its containers die, a second or more
	// before the object goes (kind); the netns control plane removes both at once.
	endpointUnready = "endpoint-unready"
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
			conformance.AwaitReadyEndpoints(svc.Name, keep.Name()),
			conformance.Record(endpointUnready, gone.Name()),
			conformance.AwaitListedEndpoints(svc.Name, keep.Name()),
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
			{Name: fmt.Sprintf("every new connection succeeds, on vanish-keep, from %s after the EndpointSlices stop calling vanish-gone ready", budget),
				Matcher: matchers.HaveNoFailedAttempts(matchers.Probes(vanishConnect), matchers.Backends(keep.Name()), matchers.From(endpointUnready, budget))},
		},
	})
}
