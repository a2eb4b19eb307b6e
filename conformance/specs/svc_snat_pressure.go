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
		ID:      "SVC-SNAT-PRESSURE",
		Profile: conformance.Core,
		Features: []conformance.Feature{
			conformance.FeatureNodePort, conformance.FeatureNodePortRemoteBackend,
		},
		Description: "Long-lived TCP streams from outside through a NodePort to a remote backend survive a minute of short connections on the same path, which churn the node's SNAT source ports: no stream is reset or stalls over budget, and no short connection fails.",
		// A SNAT port allocator that, with its range full, reuses a port without
		// checking that its flow is over steals a live stream's port (refdp's own
		// port reuse had two bugs before this spec).
		Catches: []conformance.FaultCase{
			{Fault: "snat-port-unchecked", Kinds: []conformance.FailureKind{
				matchers.KindGap, matchers.KindNotAlive, matchers.KindReset, matchers.KindTimeout,
			}},
		},
		Body: snatPressure,
	})
}

// pressureStreams is how many long-lived streams share the NodePort path with the
// churn: each is a live flow a defective allocator may rob of its SNAT port, and
// more of them make a robbery within the churn more likely.
const pressureStreams = 8

// churnProbes is how many connect probes churn, each at ConnectInterval: two at 2 ms
// fill refdp's 4,536 SNAT ports within some 9 s (the client reuses its own source
// ports, and a flow on a reused client tuple gets its own SNAT port back, so filling
// takes some 17,000 connections, not 4,536), and reuse every one of them by some 14 s,
// so that the 15 s churn of make test reuses every port too.
const churnProbes = 2

// Names of the transition events of the churn.
const (
	churnStart = "snat-churn-start"
	churnEnd   = "snat-churn-end"
)

// snatPressure runs streams and churnProbes connect probes from the external client to
// node-a's NodePort of the Service whose backend is on node-b (the path a dataplane
// SNATs, so that replies come back through node-a) for the SNATChurn budget. At 2 ms
// each that is 60,000 connections a minute: from some 9 s on, every new flow on a new
// client tuple reuses a SNAT port of refdp's.
func snatPressure(ctx context.Context, e *conformance.Env) error {
	f, err := workloads.DeployCore(ctx, e.World, e.Warm())
	if err != nil {
		return err
	}
	fl := f.ServiceFlows(e.Topo)[3] // nodeport-remote
	streams := "stream-" + fl.Name
	traffic := []conformance.Traffic{{From: fl.From, Probe: e.Stream(streams, fl.Target, pressureStreams)}}
	var churn []string
	for i := range churnProbes {
		name := fmt.Sprintf("%s-%d", fl.Name, i+1)
		churn = append(churn, name)
		traffic = append(traffic, conformance.Traffic{From: fl.From, Probe: e.Connect(name, fl.Target)})
	}
	noneFail := func() matchers.Matcher {
		return matchers.HaveNoFailedAttempts(matchers.Probes(churn...), matchers.Backends(fl.Backend))
	}
	return e.Run(ctx, conformance.Scenario{
		Traffic: traffic,
		Preconditions: []conformance.Check{
			{Name: "every stream carries echoes before the churn", Matcher: matchers.HaveStreamGapsWithin(e.Budgets.StreamMaxGap, matchers.Probes(streams))},
			{Name: "the streams are answered by " + fl.Backend, Matcher: matchers.HaveStreamsOn(fl.Backend)},
			{Name: "new connections reach " + fl.Backend + " through node-a's NodePort", Matcher: noneFail()},
		},
		Transition: []conformance.Step{
			conformance.Record(churnStart, e.Budgets.SNATChurn.String()),
			conformance.Pause(e.Budgets.SNATChurn),
			conformance.Record(churnEnd, ""),
		},
		Checks: []conformance.Check{
			{Name: "no stream reset while the churn reuses SNAT ports", Matcher: matchers.HaveNoResets(matchers.Probes(streams))},
			{Name: "no stream gap over budget while the churn reuses SNAT ports", Matcher: matchers.HaveStreamGapsWithin(e.Budgets.StreamMaxGap, matchers.Probes(streams))},
			{Name: "every stream alive after the churn", Matcher: matchers.BeAliveAtEnd(matchers.Probes(streams))},
			{Name: "no failed short connection through the NodePort during the churn", Matcher: noneFail()},
		},
	})
}
