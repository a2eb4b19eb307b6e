package specs

import (
	"context"

	"github.com/dpconform/dpconform/conformance"
	"github.com/dpconform/dpconform/fv/matchers"
	"github.com/dpconform/dpconform/fv/workloads"
)

// restartNodePort is the body of RESTART-NODEPORT-NEW and -CRASH: the external client
// opens a new TCP connection to node-a's NodePort every ConnectInterval, for a Service
// with a local and one with a remote backend, while node-a's agent restarts. Every
// attempt must succeed and reach the right backend, from Lead before the stop to
// Settle after ready.
func restartNodePort(crash bool) func(context.Context, *conformance.Env) error {
	return restartNewConnections(crash, "node-a's NodePort", workloads.FlowNodePortLocal, workloads.FlowNodePortRemote)
}

// restartClusterIP is the body of RESTART-CLUSTERIP-NEW and -CRASH: as restartNodePort,
// from the client pod on node-a to each Service's ClusterIP.
func restartClusterIP(crash bool) func(context.Context, *conformance.Env) error {
	return restartNewConnections(crash, "its ClusterIP", workloads.FlowClusterIPLocal, workloads.FlowClusterIPRemote)
}

// restartNewConnections runs new connections on the Core fixture's service flows of
// those names across a restart of node-a's agent.
func restartNewConnections(crash bool, via string, flows ...string) func(context.Context, *conformance.Env) error {
	return func(ctx context.Context, e *conformance.Env) error {
		f, err := workloads.DeployCore(ctx, e.World, e.Warm())
		if err != nil {
			return err
		}
		sc := conformance.Scenario{Transition: []conformance.Step{restart(f.NodeA, crash)}}
		for _, fl := range f.Flows(e.Topo, flows...) {
			noneFail := func() matchers.Matcher {
				return matchers.HaveNoFailedAttempts(matchers.Probes(fl.Name), matchers.Backends(fl.Backend))
			}
			sc.Traffic = append(sc.Traffic, conformance.Traffic{From: fl.From, Probe: e.Connect(fl.Name, fl.Target)})
			sc.Preconditions = append(sc.Preconditions, conformance.Check{
				Name: "new connections reach " + fl.Backend + " through " + via + " before the restart", Matcher: noneFail()})
			sc.Checks = append(sc.Checks, conformance.Check{
				Name: "no failed new connection to " + fl.Name + " across a " + how(crash), Matcher: noneFail()})
		}
		return e.Run(ctx, sc)
	}
}
