package fuzz

import (
	"context"
	"fmt"
	"strings"

	"github.com/dpconform/dpconform/conformance"
	"github.com/dpconform/dpconform/fv/workloads"
)

// Names of the events a step's burst records: its detail is the step's number.
const (
	EventBurstStart = "burst-start"
	EventBurstEnd   = "burst-end"
)

var burstEvents = spanEvents{EventBurstStart, EventBurstEnd}

// Some steps hold new connections on one path, one every order-interval (250 µs,
// SVC-BACKEND-SWITCH's and UPGRADE-NEW-FLOWS-IN-WINDOW's), from just before the
// step to burstFor after it: a burst. The round's connections, 20 ms apart, pass by
// a window of microseconds; these are as fine as the catalogue's finest.
//
//   - A join, or the leave of a spare in a Service, changes the Service's backends,
//     and a datapath writes them and the Service's frontends in some order: one that
//     switches the frontends first has, for the moment in between (tens of
//     microseconds in the reference with frontends-before-backends), a frontend with
//     no backends, and drops the SYNs that meet it. The burst goes from the client to
//     the Service's ClusterIP (not to the NodePorts, whose SNAT ports would come
//     round within the backends' TIME_WAIT: DefaultConnectInterval).
//   - An upgrade of node 1's agent replaces each interface's two programs one after
//     the other: where the conntrack table is migrated meanwhile, a SYN the new
//     ingress program NATs has its answer meet the old egress program, which must
//     find the flow too (the reference with no-ct-mirror loses it). The burst goes
//     from the external client to node 1's NodePort of the Service whose backend is
//     on node 1 (no SNAT), through the host interface, from before the agent stops
//     to burstFor after it is ready.

// burstProbe is the name of step's burst.
func burstProbe(step int) string { return fmt.Sprintf("burst-%d", step) }

// burstPath is the path of the burst of s's step i, and the Service it goes to;
// false if the step has none, or the world no Services (a Policy-only world).
func (w *world) burstPath(e *conformance.Env, s Schedule, i int) (workloads.Flow, string, bool) {
	if w.core == nil {
		return workloads.Flow{}, "", false
	}
	a := s.Actions[i]
	var svc, path string
	switch {
	case a.Op == OpJoin:
		svc, path = a.Service, "clusterip-"
	case a.Op == OpLeave:
		svc, path = s.leftService(i), "clusterip-"
	case a.Op == OpUpgrade && a.Node == 1:
		fl := w.core.Flows(e.Topo, workloads.FlowNodePortLocal)[0]
		return fl, w.serviceOf(fl.Backend), true
	}
	if svc == "" {
		return workloads.Flow{}, "", false
	}
	for _, fl := range w.core.ServiceFlows(e.Topo) {
		if strings.HasPrefix(fl.Name, path) && w.serviceOf(fl.Backend) == svc {
			return fl, svc, true
		}
	}
	return workloads.Flow{}, "", false
}

// burst does step i of s (do) inside its burst (hold), if it has one.
func (w *world) burst(ctx context.Context, e *conformance.Env, s Schedule, i int, do func() error) error {
	fl, _, ok := w.burstPath(e, s, i)
	if !ok {
		return do()
	}
	return hold(ctx, e, burstEvents, i+1, connects(e, []workloads.Flow{fl}, []string{burstProbe(i + 1)}, e.Budgets.OrderInterval), burstFor, do)
}
