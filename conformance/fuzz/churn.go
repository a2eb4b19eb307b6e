package fuzz

import (
	"context"
	"fmt"
	"time"

	"github.com/dpconform/dpconform/conformance"
	"github.com/dpconform/dpconform/fv/workloads"
)

// churnProbes is how many connect probes a churn runs, each at the catalogue's
// connect-interval: two fill the reference's SNAT ports within some 5 s, as in
// SVC-SNAT-PRESSURE (one would take some 17 s: the client reuses its own source
// ports, and a flow on a tuple whose SNAT port is still its own gets it back).
const churnProbes = 2

// churnStreams is how many long-lived streams a round with a churn holds on the
// path it churns (SVC-SNAT-PRESSURE's 8, not the other paths' streamsPerFlow):
// each is a live flow whose SNAT port a defective allocator may take once the
// range is full, and more of them make a theft within a churn more likely.
const churnStreams = 8

// Names of the events a churn records: its detail is the step's number.
const (
	EventChurnStart = "snat-churn-start"
	EventChurnEnd   = "snat-churn-end"
)

var churnEvents = spanEvents{EventChurnStart, EventChurnEnd}

// churnProbe is the name of the k-th (from 1) connect probe of step's churn.
func churnProbe(step, k int) string { return fmt.Sprintf("churn-%d-%d", step, k) }

// churnNames are the names of the connect probes of step's churn.
func churnNames(step int) []string {
	names := make([]string, churnProbes)
	for k := range names {
		names[k] = churnProbe(step, k+1)
	}
	return names
}

// churnPath is the path a churn takes: node 1's NodePort to the Service whose own
// backend is on node 2, from the external client.
func (w *world) churnPath(e *conformance.Env) workloads.Flow {
	return w.core.Flows(e.Topo, workloads.FlowNodePortRemote)[0]
}

// churn runs step's churn for d (hold).
func (w *world) churn(ctx context.Context, e *conformance.Env, step int, d time.Duration) error {
	names := churnNames(step)
	flows := make([]workloads.Flow, len(names))
	for k := range flows {
		flows[k] = w.churnPath(e)
	}
	return hold(ctx, e, churnEvents, step, connects(e, flows, names, e.Budgets.ConnectInterval), d, nil)
}

// churnAllowance is how many of n new connections made under a churn may time out:
// snat-retry-per-mille of them, rounded up. At 1,000 new flows a second every SNAT
// port comes round within the backend's TIME_WAIT of its last connection, and now
// and then a SYN gets through only on its retry (budgets.go, SNATRetryPerMille):
// the churn's own connections, and those of the round's probe on the path.
func churnAllowance(n int, perMille int) int { return (n*perMille + 999) / 1000 }

// newChurned is the check of step's churn (SVC-SNAT-PRESSURE's, with its two checks
// over the churn's span): no connection of it reset or refused, and at most
// perMille in 1,000 failing otherwise.
func newChurned(step, perMille int) *spanned {
	return newSpanned(churnEvents, step, churnNames(step), perMille)
}
