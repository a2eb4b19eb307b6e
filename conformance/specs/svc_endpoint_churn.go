package specs

import (
	"context"
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/dpconform/dpconform/conformance"
	"github.com/dpconform/dpconform/fv/matchers"
	"github.com/dpconform/dpconform/fv/probe"
	"github.com/dpconform/dpconform/fv/workloads"
	"github.com/dpconform/dpconform/topologies"
)

func init() {
	conformance.Register(conformance.Spec{
		ID:       "SVC-ENDPOINT-CHURN",
		Profile:  conformance.Core,
		Features: []conformance.Feature{conformance.FeatureClusterIP},
		Description: "When a Service gains a backend and loses another, streams to the backend that stays are unaffected, streams to the removed backend end (RST or FIN) instead of hanging silently, " +
			"and new connections all succeed, reach the added backend and stop reaching the removed one within endpoint-programmed.",
		Transition: "a Service gains a backend and loses another, as a rollout does: churn-new, proven to serve first, is labelled into the Service (`backend-added`) and listed (`backend-listed`); churn-gone's deletion begins with a grace period (`backend-removed`: terminating, not ready, still serving, as with a preStop hook); once the EndpointSlices list only churn-keep and churn-new as ready (`endpoints-updated`) and 100 new connections in a row have missed churn-gone (at most `endpoint-programmed`), its process stops (`backend-stopped`: its sockets close) and its pod goes",
		Traffic:    "16 streams from a pod through the ClusterIP, spread over both backends; the same pod opens a new TCP connection every {connect-interval} to the ClusterIP",
		Invariant:  "streams to the backend that stays: no reset, no gap over 200 ms, alive at the end; streams to the removed backend end (RST or FIN) within 2 s of `backend-stopped` instead of hanging; zero failed new connections over the whole window, each answered by one of the three; churn-new answers one within {endpoint-programmed} of `backend-listed`; none reaches churn-gone from 2 s after `endpoints-updated`",
		Budgets:    []string{"stream-max-gap", "alive-within", "end-within", "endpoint-programmed", "connect-interval"},
		Origin:     "a backend change applied delete-then-add, which empties a Service's backends under its live flows; and load balancers that read an EndpointSlice's addresses and not its ready condition (ovn-kubernetes PR 3240, KEDA http-add-on issue 1344)",
		Catches: []conformance.FaultCase{
			{Fault: "rebuild-backends-in-place", Kinds: []conformance.FailureKind{matchers.KindReset, matchers.KindGap, matchers.KindNotAlive}},
			// The connections sent to churn-gone after its server stopped are
			// refused by its kernel; in about 1 run in 10 the one or two that went
			// there timed out instead (one 14 ms after the stop, 42 ms before its
			// pod went; docs/faults.md): the fault either way, as the clean
			// reference sends churn-gone nothing by then.
			{Fault: "serve-not-ready-endpoints", Kinds: []conformance.FailureKind{matchers.KindReset, matchers.KindWrongBackend, matchers.KindTimeout}},
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
	backendListed    = "backend-listed"
	backendRemoved   = "backend-removed"
	endpointsUpdated = "endpoints-updated"
	backendStopped   = "backend-stopped"
)

// drainStreak is how many new connections in a row must miss churn-gone before its
// server stops: while the dataplane still has it, a third of them reach it, and a
// streak this long by chance ((2/3)^100, 2e-18 per attempt) does not happen, where
// warm-streak's 20 (3e-4 per attempt, a run of them somewhere in a second of
// kube-proxy's minSyncPeriod one time in ten or so) does.
const drainStreak = 100

// churnConnect is the connect probe of SVC-ENDPOINT-CHURN; churnNew the backend it
// adds (the checks name it before it exists).
const (
	churnConnect = "churn-connect"
	churnNew     = "churn-new"
)

func endpointChurn(ctx context.Context, e *conformance.Env) error {
	pair, err := deployEndpointPair(ctx, e, "churn")
	if err != nil {
		return err
	}
	keep, gone, goneServer, client, svc, labels := pair.keep, pair.gone, pair.goneServer, pair.client, pair.svc, pair.labels
	// The backend that will be added is outside the Service until then: the
	// topology's pods are ready as soon as they have a network, so it is proven to
	// serve first, as a readiness probe would.
	newcomer, _, err := workloads.AddBackend(ctx, e.World, churnNew, e.Topo.Nodes()[1].Name(), nil)
	if err != nil {
		return err
	}
	// Every backend must serve, directly (and the two first through the ClusterIP),
	// before streams start.
	if err := workloads.WaitAllFlowing(ctx, e.World, e.Warm(), append(pair.flows(),
		workloads.Flow{Name: "direct-" + churnNew, From: client, Target: workloads.Direct(newcomer), Backend: churnNew})...,
	); err != nil {
		return err
	}

	onKeep := matchers.OnBackends(keep.Name())
	budget := e.Budgets.EndpointProgrammed
	// The step that stops churn-gone's server waits until new connections have left it
	// (or the budget is spent): the checks judge whether they did in time.
	drained := conformance.NewStreak(churnConnect, drainStreak, keep.Name(), churnNew)
	// Every new connection succeeds, answered by a backend the Service lists (or, until
	// its removal is programmed, still serves: churn-gone).
	allBackends := matchers.Backends(keep.Name(), gone.Name(), churnNew)
	return e.Run(ctx, conformance.Scenario{
		Traffic: []conformance.Traffic{
			{From: client, Probe: e.Stream("churn", svc.ClusterIPAddr(), churnStreams)},
			{From: client, Probe: e.Connect(churnConnect, svc.ClusterIPAddr()), Observe: drained.Observe},
		},
		Preconditions: []conformance.Check{
			{Name: "every stream carries echoes before the change", Matcher: matchers.HaveStreamGapsWithin(e.Budgets.StreamMaxGap)},
			{Name: "the Service spreads the streams over both backends", Matcher: matchers.HaveStreamsOn(keep.Name(), gone.Name())},
			{Name: "every new connection succeeds before the change",
				Matcher: matchers.HaveNoFailedAttempts(matchers.Probes(churnConnect), matchers.Backends(keep.Name(), gone.Name()))},
		},
		Transition: []conformance.Step{
			// As a Deployment's rollout does: the new pod serves (its readiness probe
			// passes) and is listed before the old one's deletion begins.
			conformance.Relabel(newcomer, labels, backendAdded),
			conformance.AwaitReadyEndpoints(svc.Name, keep.Name(), gone.Name(), churnNew),
			conformance.Record(backendListed, churnNew),
			// As a kubelet does with a pod whose deletion has a grace period (a preStop
			// hook that waits): the pod is terminating, no longer ready, and serves on
			// until new connections have left it; then its process stops (its sockets
			// close), and the pod and its network go.
			conformance.Record(backendRemoved, gone.Name()),
			conformance.Do("begin churn-gone's deletion, with a grace period", func(ctx context.Context, e *conformance.Env) error {
				return e.Topo.Kube().CoreV1().Pods(gone.Namespace()).Delete(ctx, gone.Name(), metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](30)})
			}),
			conformance.AwaitReadyEndpoints(svc.Name, keep.Name(), churnNew),
			drained.Record(endpointsUpdated, ""),
			drained.Await(budget),
			conformance.Record(backendStopped, gone.Name()),
			conformance.StopServer(goneServer),
			conformance.RemovePod(gone),
		},
		Checks: []conformance.Check{
			{Name: "no reset on the streams to the backend that stays", Matcher: matchers.HaveNoResets(onKeep)},
			{Name: "no gap over budget on streams to the backend that stays", Matcher: matchers.HaveStreamGapsWithin(e.Budgets.StreamMaxGap, onKeep)},
			{Name: "streams to the backend that stays alive at the end", Matcher: matchers.BeAliveAtEnd(onKeep)},
			{Name: "the streams to the removed backend end instead of hanging",
				Matcher: matchers.HaveStreamsEndedWithin(backendStopped, e.Budgets.EndWithin, matchers.OnBackends(gone.Name()))},
			{Name: "every new connection succeeds throughout", Matcher: matchers.HaveNoFailedAttempts(matchers.Probes(churnConnect), allBackends)},
			{Name: fmt.Sprintf("new connections reach churn-new within %s of its listing", budget),
				Matcher: matchers.HaveServedWithin(backendListed, budget, 1, matchers.Probes(churnConnect), matchers.Backends(churnNew))},
			{Name: fmt.Sprintf("no new connection reaches churn-gone from %s after the EndpointSlices stop listing it as ready", budget),
				Matcher: matchers.HaveNoFailedAttempts(matchers.Probes(churnConnect), matchers.Backends(keep.Name(), churnNew), matchers.From(endpointsUpdated, budget))},
		},
	})
}

// endpointPair is the fixture of the endpoint specs: a Service app over two
// backends, app-keep on node-a and app-gone on node-b, and a client pod on node-a.
type endpointPair struct {
	labels     map[string]string
	keep, gone topologies.Pod
	goneServer *probe.Process
	client     topologies.Pod
	svc        workloads.Service
}

func deployEndpointPair(ctx context.Context, e *conformance.Env, app string) (*endpointPair, error) {
	nodes := e.Topo.Nodes()
	p := &endpointPair{labels: map[string]string{"app": app}}
	var err error
	if p.keep, _, err = workloads.AddBackend(ctx, e.World, app+"-keep", nodes[0].Name(), p.labels); err != nil {
		return nil, err
	}
	if p.gone, p.goneServer, err = workloads.AddBackend(ctx, e.World, app+"-gone", nodes[1].Name(), p.labels); err != nil {
		return nil, err
	}
	if p.client, err = e.Topo.AddPod(ctx, topologies.PodSpec{Name: "client", Node: nodes[0].Name()}); err != nil {
		return nil, err
	}
	if p.svc, err = workloads.AddService(ctx, e.World, app, p.labels, p.keep, p.gone); err != nil {
		return nil, err
	}
	return p, nil
}

// flows are what must carry new connections before the streams start: each backend
// directly, and the Service.
func (p *endpointPair) flows() []workloads.Flow {
	return []workloads.Flow{
		{Name: "direct-" + p.keep.Name(), From: p.client, Target: workloads.Direct(p.keep), Backend: p.keep.Name()},
		{Name: "direct-" + p.gone.Name(), From: p.client, Target: workloads.Direct(p.gone), Backend: p.gone.Name()},
		{Name: "clusterip", From: p.client, Target: p.svc.ClusterIPAddr()},
	}
}
