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
		Description: "Long-lived TCP streams from outside through a NodePort to a remote backend survive a minute of short connections on the same path, which churn the node's SNAT source ports: no stream is reset or stalls over budget, no short connection is reset, and at most 1 in 1,000 waits for its SYN's retry.",
		// A SNAT port allocator that, with its range full, reuses a port without
		// checking that its flow is over steals a live stream's port (refdp's own
		// port reuse had two bugs before this spec).
		Transition: "a minute (`snat-churn`) of short connections through node-a's NodePort to a backend on node-b, a path the dataplane SNATs, churning its SNAT source ports (refdp's 4,536 are all taken within some 5 s and reused from then on)",
		Traffic:    "8 long-lived TCP streams (a message every {stream-interval}) and two connect probes (a new connection every {connect-interval} each) from the external client to node-a's IP:NodePort of the Service whose backend is on node-b",
		Invariant:  "no stream reset; no gap over 200 ms on any stream; every stream alive at the end; no short connection reset or refused, and at most {snat-retry-per-mille} in 1,000 timed out (over 1 s: a SYN that the backend's TIME_WAIT of the port's previous connection held up until its retry), all answered by the backend on node-b; from 1 s before `snat-churn-start` to 3 s after `snat-churn-end`",
		Budgets:    []string{"snat-churn", "snat-retry-per-mille", "stream-max-gap", "alive-within", "connect-interval", "attempt-timeout"},
		Origin:     "a NAT port allocator that trusts its hash once its range is full, the in-use check (Linux nf_nat's nf_nat_used_tuple) left out of the path that runs only under pressure; refdp's own SNAT reuse had two bugs of this family before (docs/faults.md)",
		Catches: []conformance.FaultCase{
			{Fault: "snat-port-unchecked", Kinds: []conformance.FailureKind{matchers.KindGap, matchers.KindNotAlive}},
		},
		Body: snatPressure,
	})
}

// pressureStreams is how many long-lived streams share the NodePort path with the
// churn: each is a live flow a defective allocator may rob of its SNAT port, and
// more of them make a robbery within the churn more likely.
const pressureStreams = 8

// churnProbes is how many connect probes churn, each at ConnectInterval. The client
// reuses its own source ports within seconds, and a new flow on a client tuple whose
// SNAT port is still its own gets that port back, so one probe at 2 ms fills refdp's
// 4,536 SNAT ports only after some 17 s (9,000 connections); two fill them within
// some 5 s, and by the end of make test's 15 s churn all but a few dozen of them have
// been taken over by a new flow since (docs/faults.md).
const churnProbes = 2

// Names of the transition events of the churn.
const (
	churnStart = "snat-churn-start"
	churnEnd   = "snat-churn-end"
)

// snatPressure runs streams and churnProbes connect probes from the external client to
// node-a's NodePort of the Service whose backend is on node-b (the path a dataplane
// SNATs, so that replies come back through node-a) for the SNATChurn budget: 60,000
// connections a minute, while the streams must keep their ports.
func snatPressure(ctx context.Context, e *conformance.Env) error {
	f, err := workloads.DeployCore(ctx, e.World, e.Warm())
	if err != nil {
		return err
	}
	fl := f.Flows(e.Topo, workloads.FlowNodePortRemote)[0]
	streams := "stream-" + fl.Name
	traffic := []conformance.Traffic{{From: fl.From, Probe: e.Stream(streams, fl.Target, pressureStreams)}}
	var churn []string
	for i := range churnProbes {
		name := fmt.Sprintf("%s-%d", fl.Name, i+1)
		churn = append(churn, name)
		traffic = append(traffic, conformance.Traffic{From: fl.From, Probe: e.Connect(name, fl.Target)})
	}
	noneFail := matchers.HaveNoFailedAttempts(matchers.Probes(churn...), matchers.Backends(fl.Backend))
	// The churn's window, Lead before its start to Settle after its end, holds about
	// this many attempts; snat-retry-per-mille of them may time out (a SYN that the
	// backend's TIME_WAIT of the port's previous connection held up until its retry).
	window := e.Budgets.Lead + e.Budgets.SNATChurn + e.Budgets.Settle
	retries := int(window/e.Budgets.ConnectInterval) * churnProbes * e.Budgets.SNATRetryPerMille / 1000
	return e.Run(ctx, conformance.Scenario{
		Traffic: traffic,
		Preconditions: []conformance.Check{
			{Name: "every stream carries echoes before the churn", Matcher: matchers.HaveStreamGapsWithin(e.Budgets.StreamMaxGap, matchers.Probes(streams))},
			{Name: "the streams are answered by " + fl.Backend, Matcher: matchers.HaveStreamsOn(fl.Backend)},
			{Name: "new connections reach " + fl.Backend + " through node-a's NodePort", Matcher: noneFail},
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
			{Name: "no short connection reset or refused during the churn", Matcher: matchers.HaveNoResets(matchers.Probes(churn...))},
			{Name: fmt.Sprintf("at most %d short connections (%d per 1,000) time out during the churn, and every other one reaches %s", retries, e.Budgets.SNATRetryPerMille, fl.Backend),
				Matcher: matchers.HaveNoFailedAttempts(matchers.Probes(churn...), matchers.Backends(fl.Backend), matchers.Allow(retries))},
		},
	})
}
