package specs

import (
	"context"

	"github.com/dpconform/dpconform/conformance"
	"github.com/dpconform/dpconform/fv/matchers"
	"github.com/dpconform/dpconform/fv/probe"
	"github.com/dpconform/dpconform/fv/workloads"
	"github.com/dpconform/dpconform/topologies"
)

// A UDP client that never rebinds keeps one 5-tuple, so a dataplane that remembers
// the flow's backend in conntrack sends it to that backend for as long as the
// entry lives: after the backend is gone, into a blackhole (kubernetes issue 59368,
// "UDP conntrack data not removed on endpoint changes"). kube-proxy deletes the
// conntrack entries of UDP flows DNATed to an endpoint that is no longer one, after
// each sync (its conntrack reconciler since 1.32: issue 126130, PR 127318).
func init() {
	conformance.Register(conformance.Spec{
		ID:       "SVC-UDP-ENDPOINT-CHANGE",
		Profile:  conformance.Core,
		Features: []conformance.Feature{conformance.FeatureClusterIP, conformance.FeatureUDP},
		Description: "A UDP flow on one 5-tuple to a ClusterIP whose only backend is replaced reaches the new backend, " +
			"and no other, within budget of the EndpointSlice update that lists only the new one.",
		Transition: "a UDP Service's only backend is replaced: a new backend on node-a added, the old one on node-b removed (its server stops, then its pod goes)",
		Traffic:    "a pod on node-a sends a datagram every {connect-interval} on one socket (one 5-tuple, never rebinding) to the ClusterIP; every answer is recorded with the server that sent it and its source address",
		Invariant:  "before: every datagram answered by the old backend, through the ClusterIP; from {udp-repoint} after the EndpointSlices list only the new backend (the old endpoint gone, not merely terminating), every datagram answered by the new one, through the ClusterIP, and by no other; the longest run without an answer is measured",
		Budgets:    []string{"udp-repoint", "connect-interval"},
		Origin:     "Kubernetes issue 59368 (UDP conntrack not removed on endpoint changes), which kube-proxy fixed and fixed again (issue 126130, PR 127318; issue 139628 and PR 141371 for the cases it still missed)",
		Catches: []conformance.FaultCase{
			{Fault: "keep-udp-conntrack-on-backend-removal", Kinds: []conformance.FailureKind{matchers.KindLost}},
		},
		Body: udpEndpointChange,
	})
}

// The flow's probe: one socket, so one 5-tuple, for the whole spec.
const udpFlow = "udp-flow"

func udpEndpointChange(ctx context.Context, e *conformance.Env) error {
	nodes := e.Topo.Nodes()
	nodeA, nodeB := nodes[0], nodes[1]
	labels := map[string]string{"app": "udp"}
	// The flow moves from a backend across nodes to one on the client's node.
	old, oldServer, err := workloads.AddBackend(ctx, e.World, "udp-old", nodeB.Name(), labels)
	if err != nil {
		return err
	}
	client, err := e.Topo.AddPod(ctx, topologies.PodSpec{Name: "udp-client", Node: nodeA.Name()})
	if err != nil {
		return err
	}
	svc, err := workloads.AddUDPService(ctx, e.World, "udp", labels, old)
	if err != nil {
		return err
	}
	if err := workloads.WaitUDPFlowing(ctx, e.World, workloads.Flow{Name: "clusterip-udp", From: client, Target: svc.ClusterIPAddr(), Backend: old.Name()}, e.Warm()); err != nil {
		return err
	}

	flow := probe.UDP{Name: udpFlow, To: []probe.Destination{{Label: "svc", Addr: svc.ClusterIPAddr()}},
		Interval: e.Budgets.ConnectInterval, Replies: true, Timeout: e.Budgets.AttemptTimeout}
	return e.Run(ctx, conformance.Scenario{
		Traffic: []conformance.Traffic{{From: client, Probe: flow}},
		Preconditions: []conformance.Check{
			{Name: "the flow's datagrams are answered by udp-old, through the ClusterIP",
				Matcher: matchers.HaveDatagramsAnswered(matchers.Probes(udpFlow), matchers.Backends(old.Name()))},
		},
		Transition: []conformance.Step{
			conformance.Record(backendAdded, "udp-new"),
			conformance.Do("add the backend udp-new", func(ctx context.Context, e *conformance.Env) error {
				_, _, err := workloads.AddBackend(ctx, e.World, "udp-new", nodeA.Name(), labels)
				return err
			}),
			// As a kubelet does: the container stops (its socket closes), then the pod
			// and its network go.
			conformance.Record(backendRemoved, old.Name()),
			conformance.StopServer(oldServer),
			conformance.RemovePod(old),
			// Listed at all, not only ready: a dataplane may keep the flows of an
			// endpoint that is terminating but still serving (kube-proxy does, as for
			// TCP), and the old one is listed so for a moment after its pod's deletion.
			conformance.AwaitListedEndpoints(svc.Name, "udp-new"),
			conformance.Record(endpointsUpdated, "udp-new only"),
		},
		Checks: []conformance.Check{
			{Name: "the flow is answered by udp-new, and only by it, from udp-repoint after the EndpointSlices list only udp-new",
				Matcher: matchers.HaveDatagramsAnsweredWithin(endpointsUpdated, e.Budgets.UDPRepoint, matchers.Probes(udpFlow), matchers.Backends("udp-new"))},
		},
	})
}
