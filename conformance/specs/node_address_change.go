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
		ID:      "NODE-ADDRESS-CHANGE",
		Profile: conformance.Core,
		Features: []conformance.Feature{
			conformance.FeatureNodePort, conformance.FeatureNodePortRemoteBackend,
		},
		Description: "A NodePort answers on an address added to the node's interface within a budget and stops answering on it once the address is removed, while new connections to the node's primary address all succeed.",
		// Host-IP discovery, which Calico 12192 raced on restart, exercised on its
		// own: the addresses change while the agent runs.
		Transition: "node-a's spare address (the netns fabric's .200) is added to its eth0, served, then removed; the external client's neighbour entry for it is pinned to node-a's MAC, as a cached entry keeps it, so packets to it reach node-a throughout",
		Traffic:    "the external client opens a new TCP connection every {connect-interval} to node-a's IP:NodePort (backend on node-a and on node-b), and to the spare address's NodePort of a third Service (its own backend on node-a)",
		Invariant:  "nothing answers on the spare address before it is added (a precondition); it is served, {warm-streak} connections in a row, within {address-programmed} of `address-added`; nothing answers there from 1 s after `address-removed` to the window's end (`address-programmed` plus `steady-state`); zero failed attempts on the primary address from 1 s before `address-added` to that end",
		Budgets:    []string{"address-programmed", "steady-state", "connect-interval", "attempt-timeout"},
		Origin:     "host IPs read once at start, the defect class next to Calico issue 12192; and a host-address watcher that acts on additions only",
		Design: "The spare address's probe runs from the start. Before the address is added nothing " +
			"may answer there (a precondition: the address is free, so that an answer later is " +
			"node-a's); once it is added, the NodePort must answer, {warm-streak} connections in a " +
			"row, within {address-programmed}; from `address-programmed` after its removal on, " +
			"nothing may answer again.\n\n" +
			"Removal is only observable if packets still reach node-a. A real client that talked " +
			"to the address goes on sending to node-a's MAC after the address is gone: its " +
			"neighbour entry stays REACHABLE for base_reachable_time (15-45 s) after its last " +
			"confirmation, which its own TCP connections keep giving, and is then STALE and " +
			"probed before it fails. A dataplane that kept the frontend answers those packets. " +
			"Here the entry is pinned permanent (PinNeighbour, before the traffic starts), so " +
			"that the check never depends on how far the client's entry has aged: every SYN to " +
			"the spare address reaches node-a's interface, before the address is added and after " +
			"it is removed, and only node-a decides whether it is answered. Without the address " +
			"and a frontend, node-a forwards the SYN back onto the fabric, where no host holds " +
			"the address (node-a's own ARP for it goes unanswered): nothing answers it.\n\n" +
			"The spare address is probed with a backend on node-a: whether a frontend exists on " +
			"an address is the one thing this spec decides, and with a local backend the answer " +
			"depends on nothing else (node-b, the SNAT of the reply). The remote backend, and the " +
			"SNAT address a dataplane picks among the host's addresses, are exercised on the " +
			"primary address, which must not notice the change. The backend is not the fixture's " +
			"web-local, which the primary address's probe reaches: a dataplane that does not SNAT " +
			"for a local backend (refdp does not) hands it the client's own source ports, and the " +
			"client picks its ports per destination address, so a connection to the spare address " +
			"would now and then arrive with the tuple of one the backend still holds in TIME_WAIT " +
			"from the primary address, and stall for a SYN retry. That is a client connecting to " +
			"two frontends of one backend, not this spec's transition. The Service is shown " +
			"programmed through its ClusterIP from the client pod, whose source address the " +
			"backend never sees from the probes.\n\n" +
			"The spec holds NodePorts to every address of the node's interface, as kube-proxy's " +
			"iptables mode serves them (addrtype LOCAL). An implementation configured to serve " +
			"them on the Node's primary IP alone fails the first check with a reset, as " +
			"kube-proxy's nftables mode does by default (nodePortAddresses \"primary\"; " +
			"docs/kube-proxy.md).",
		Catches: []conformance.FaultCase{
			{Fault: "host-ips-read-once", Kinds: []conformance.FailureKind{matchers.KindReset}},
			{Fault: "host-ip-removals-ignored", Kinds: []conformance.FailureKind{matchers.KindDelivered}},
		},
		Body: nodeAddressChange,
	})
}

// Names of the transition events of an address change.
const (
	addressAdded   = "address-added"
	addressRemoved = "address-removed"
)

// nodeAddressChange is the body of NODE-ADDRESS-CHANGE. Node-a's spare address is
// added to its interface, served, then removed, while the external client opens a
// new connection every ConnectInterval to the NodePort on node-a's IP (for the Core
// fixture's local and remote backend: nothing on the primary address may fail) and
// to the NodePort of a third Service, with a backend of its own on node-a, on the
// spare address.
func nodeAddressChange(ctx context.Context, e *conformance.Env) error {
	f, err := workloads.DeployCore(ctx, e.World, e.Warm())
	if err != nil {
		return err
	}
	ext, spare := e.Topo.External(), f.NodeA.SpareAddress()
	if err := e.Topo.PinNeighbour(ctx, ext, spare, f.NodeA); err != nil {
		return fmt.Errorf("%w: %w", conformance.ErrEnvironment, err)
	}
	// The added address's Service has a backend of its own (see above).
	labels := map[string]string{"app": "web-added"}
	backend, _, err := workloads.AddBackend(ctx, e.World, "web-added", f.NodeA.Name(), labels)
	if err != nil {
		return err
	}
	svc, err := workloads.AddService(ctx, e.World, "web-added", labels, backend)
	if err != nil {
		return err
	}
	if err := workloads.WaitFlowing(ctx, e.World,
		workloads.Flow{Name: "clusterip-added", From: f.Client, Target: svc.ClusterIPAddr(), Backend: backend.Name()}, e.Warm()); err != nil {
		return err
	}
	onSpare := workloads.Flow{Name: "nodeport-added-address", From: ext, Target: svc.NodePortAt(spare), Backend: backend.Name()}
	served := conformance.NewStreak(onSpare.Name, e.Budgets.WarmStreak, onSpare.Backend)
	budget := e.Budgets.AddressProgrammed
	sc := conformance.Scenario{
		Traffic: []conformance.Traffic{{From: ext, Probe: e.Connect(onSpare.Name, onSpare.Target), Observe: served.Observe}},
		Preconditions: []conformance.Check{{
			Name:    fmt.Sprintf("nothing answers on %s before it is added", onSpare.Target),
			Matcher: matchers.HaveNoServedAttempts(matchers.Probes(onSpare.Name)),
		}},
		Transition: []conformance.Step{
			conformance.Do(fmt.Sprintf("add %s to %s's %s", spare, f.NodeA.Name(), f.NodeA.Interface()), func(ctx context.Context, e *conformance.Env) error {
				if err := f.NodeA.AddAddress(ctx, spare); err != nil {
					return err
				}
				served.Arm(e.Record(addressAdded, spare.String()))
				return nil
			}),
			// Served or not within the budget, the address goes next: the checks judge
			// whether it was.
			served.Await(budget),
			conformance.Do(fmt.Sprintf("remove %s from %s's %s", spare, f.NodeA.Name(), f.NodeA.Interface()), func(ctx context.Context, e *conformance.Env) error {
				if err := f.NodeA.RemoveAddress(ctx, spare); err != nil {
					return err
				}
				e.Record(addressRemoved, spare.String())
				return nil
			}),
		},
		Checks: []conformance.Check{
			{Name: fmt.Sprintf("the NodePort answers on %s within %s of its addition", spare, budget),
				Matcher: matchers.HaveServedWithin(addressAdded, budget, e.Budgets.WarmStreak, matchers.Probes(onSpare.Name), matchers.Backends(onSpare.Backend))},
			{Name: fmt.Sprintf("nothing answers on %s from %s after its removal", spare, budget),
				Matcher: matchers.HaveNoServedAttempts(matchers.Probes(onSpare.Name), matchers.From(addressRemoved, budget))},
		},
		// The removed address is watched for a steady state past its budget (the
		// window ends there, the primary address's too).
		Settle: budget + e.Budgets.SteadyState,
	}
	for _, fl := range f.Flows(e.Topo, workloads.FlowNodePortLocal, workloads.FlowNodePortRemote) { // on node-a's IP
		noneFail := func() matchers.Matcher {
			return matchers.HaveNoFailedAttempts(matchers.Probes(fl.Name), matchers.Backends(fl.Backend))
		}
		sc.Traffic = append(sc.Traffic, conformance.Traffic{From: fl.From, Probe: e.Connect(fl.Name, fl.Target)})
		sc.Preconditions = append(sc.Preconditions, conformance.Check{
			Name: "new connections reach " + fl.Backend + " through node-a's NodePort before the change", Matcher: noneFail()})
		sc.Checks = append(sc.Checks, conformance.Check{
			Name: "no failed new connection to " + fl.Name + " on node-a's IP while an address comes and goes", Matcher: noneFail()})
	}
	return e.Run(ctx, sc)
}
