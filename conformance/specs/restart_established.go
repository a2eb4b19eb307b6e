package specs

import (
	"context"
	"net"
	"strconv"

	"github.com/dpconform/dpconform/conformance"
	"github.com/dpconform/dpconform/fv/matchers"
	"github.com/dpconform/dpconform/fv/probe"
	"github.com/dpconform/dpconform/fv/timeline"
	"github.com/dpconform/dpconform/topologies"
)

func init() {
	conformance.Register(conformance.Spec{
		ID:      "RESTART-ESTABLISHED",
		Profile: conformance.Core,
		Features: []string{
			conformance.FeatureClusterIP, conformance.FeatureNodePort, conformance.FeatureNodePortRemoteBackend,
		},
		Description: "Long-lived TCP streams (pod to pod on one node and across nodes, pod to ClusterIP and outside to NodePort with local and remote backends) survive a graceful restart and a SIGKILL of the node's agent: no reset, no gap over budget, all alive after.",
		Catches: []conformance.FaultCase{
			{Fault: "unpinned-conntrack", Kinds: []conformance.FailureKind{conformance.KindReset, conformance.KindGap, conformance.KindNotAlive}},
		},
		Run: restartEstablished,
	})
}

// streamsPerFlow is how many connections each kind of flow holds.
const streamsPerFlow = 2

func restartEstablished(ctx context.Context, e *conformance.Env) error {
	f, err := deploy(ctx, e)
	if err != nil {
		return err
	}
	direct := func(p topologies.Pod) string { return net.JoinHostPort(p.IP().String(), strconv.Itoa(EchoPort)) }
	flows := []struct {
		name   string
		from   topologies.Host
		target string
	}{
		{"pod-pod-same-node", f.client, direct(f.local)},
		{"pod-pod-cross-node", f.client, direct(f.remote)},
		{"pod-clusterip-local", f.client, f.svcLocal.clusterIPAddr()},
		{"pod-clusterip-remote", f.client, f.svcRemote.clusterIPAddr()},
		{"external-nodeport-local", e.Topo.External(), f.svcLocal.nodePortAddr(f.nodeA)},
		{"external-nodeport-remote", e.Topo.External(), f.svcRemote.nodePortAddr(f.nodeA)},
	}
	for _, crash := range []bool{false, true} {
		// Each transition gets fresh streams and a timeline of its own.
		e.World.Timeline = timeline.New()
		for _, fl := range flows {
			cfg := probe.Stream{Name: fl.name, Target: fl.target, Streams: streamsPerFlow, Interval: e.Budgets.StreamInterval, DialTimeout: e.Budgets.AttemptTimeout}
			if _, err := e.World.StartProbe(ctx, fl.from, cfg); err != nil {
				return conformance.Environmentf("%v", err)
			}
		}
		steady, err := e.SteadyState(ctx)
		if err != nil {
			return err
		}
		if err := e.Precondition("every stream carries echoes before the "+how(crash), steady,
			matchers.HaveStreamGapsWithin(e.Budgets.StreamMaxGap)); err != nil {
			return err
		}
		if err := e.Precondition("no stream is reset before the "+how(crash), steady, matchers.HaveNoResets()); err != nil {
			return err
		}
		win, err := e.Transition(ctx, func(ctx context.Context) error { return restart(ctx, e, f.nodeA, crash) })
		if err != nil {
			return err
		}
		for _, c := range []struct {
			name string
			m    matchers.Matcher
		}{
			{"no stream reset across a " + how(crash), matchers.HaveNoResets()},
			{"no stream gap over budget across a " + how(crash), matchers.HaveStreamGapsWithin(e.Budgets.StreamMaxGap)},
			{"every stream alive after a " + how(crash), matchers.BeAliveAtEnd()},
		} {
			if _, err := e.Check(c.name, win, c.m); err != nil {
				return err
			}
		}
	}
	return nil
}
