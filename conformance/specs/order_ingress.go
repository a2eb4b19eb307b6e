package specs

import (
	"context"
	"fmt"

	"golang.org/x/sync/errgroup"

	"github.com/dpconform/dpconform/conformance"
	"github.com/dpconform/dpconform/fv/matchers"
	"github.com/dpconform/dpconform/fv/probe"
	"github.com/dpconform/dpconform/fv/workloads"
	"github.com/dpconform/dpconform/topologies"
)

func init() {
	conformance.Register(conformance.Spec{
		ID:       "ORDER-NEW-ENDPOINT-INGRESS",
		Profile:  conformance.Policy,
		Features: []conformance.Feature{conformance.FeatureNetworkPolicy, conformance.FeatureUDP},
		Description: "A new pod whose ingress policy admits only friends refuses everyone else from its first packet, " +
			"on every path in: from a pod on its own node and from a pod on the other node, whose packets the node's " +
			"host interface handled first; a friend on the other node reaches it once it is programmed.",
		Transition: "three new servers (app=s: a default deny and an allow for friends) appear one after another on node-a; each is probed until 500 ms after the friend first reaches it, and the next appears then",
		Traffic:    "from each new server's first possible moment (its probes start when CNI has wired it, before its status names its IP): UDP every {connect-interval} from a stranger on node-a and one on node-b, each datagram from a new socket (a new flow each), and from a friend on node-b on one socket",
		Invariant:  "nothing of either stranger's is ever delivered to a new server; the friend reaches each within {policy-programmed}, every datagram from its first delivered one on",
		Budgets:    []string{"connect-interval", "policy-programmed"},
		Origin:     "a forwarded packet taken as already policed because the host interface's programs handled it: a pod is reached from other nodes before its own policy is in place",
		Design:     "The other ORDER specs judge a new pod's traffic from its own node, and what it sends; a packet from another node crosses the host interface's programs first, and a dataplane that accepts what they handled before it asks whether the destination is programmed lets it through. The strangers send from a new socket each time so that every datagram is a flow judged afresh.",
		Catches:    []conformance.FaultCase{{Fault: "host-seen-before-gates", Kinds: []conformance.FailureKind{matchers.KindDelivered}}},
		Body:       newEndpointIngress,
	})
}

// newServers are the new servers of ORDER-NEW-ENDPOINT-INGRESS.
const newServers = 3

// client is a probe an existing pod runs against a new server, from the server's
// first possible moment.
type client struct {
	from topologies.Pod
	name string
	// newSocket sends each datagram from a new socket: a new flow each.
	newSocket bool
}

// newServer is a step that creates server pod name (app=s: the order fixture's
// ingress policy, which admits friends) on node-a and, once CNI has wired it, starts
// its UDP server and each client's probe to it at connect-interval. The clients'
// processes are appended to procs; the server's is not, so that it covers the window.
func newServer(e *conformance.Env, o *orderWorld, name string, clients []client, procs *[]*probe.Process) []conformance.Step {
	return []conformance.Step{
		conformance.Record(EventPodCreating, name),
		conformance.AddPod(topologies.PodSpec{Name: name, Namespace: orderNamespace, Node: o.node.Name(), Labels: map[string]string{"app": "s"},
			OnWired: func(ctx context.Context, p topologies.Pod) error {
				if _, err := e.World.StartProbe(ctx, p, probe.Serve{Name: name, UDP: []int{orderPort}}); err != nil {
					return err
				}
				// The clients start together: one after another, the last would
				// start tens of milliseconds after the first, past the window of a
				// dataplane that programs the pod quickly.
				to := []probe.Destination{{Label: name, Addr: addr(p.IP())}}
				started := make([]*probe.Process, len(clients))
				var g errgroup.Group
				for i, c := range clients {
					g.Go(func() error {
						var err error
						started[i], err = e.World.StartProbe(ctx, c.from, probe.UDP{Name: c.name, To: to, Interval: e.Budgets.ConnectInterval, NewSocket: c.newSocket})
						return err
					})
				}
				err := g.Wait()
				for _, proc := range started {
					if proc != nil {
						*procs = append(*procs, proc)
					}
				}
				return err
			}}, nil),
	}
}

// reachedThenStop is a step (named what) that waits until each flow's sender reaches
// its destination (a KindRecv from that probe at that label), within
// policy-programmed, records event with detail, holds newcomerLive and stops procs.
// why says what a flow that never arrives means.
func reachedThenStop(what, event, detail, why string, flows [][2]string, procs *[]*probe.Process) conformance.Step {
	return conformance.Do(what, func(ctx context.Context, e *conformance.Env) error {
		for _, f := range flows {
			wctx, cancel := context.WithTimeout(ctx, e.Budgets.PolicyProgrammed)
			_, err := e.World.Timeline().Await(wctx, func(ev probe.Event) bool {
				return ev.Kind == probe.KindRecv && ev.From == f[0] && ev.Target == f[1]
			})
			cancel()
			if err != nil {
				if ctx.Err() != nil {
					return ctx.Err()
				}
				return fmt.Errorf("%w: nothing of %s reached %s within %s: %s", workloads.ErrNotFlowing, f[0], f[1], e.Budgets.PolicyProgrammed, why)
			}
		}
		e.Record(event, detail)
		if err := conformance.Hold(ctx, newcomerLive); err != nil {
			return err
		}
		for _, p := range *procs {
			if err := e.World.StopProbe(ctx, p); err != nil {
				return fmt.Errorf("%w: stop a probe: %w", conformance.ErrEnvironment, err)
			}
		}
		return nil
	})
}

func newEndpointIngress(ctx context.Context, e *conformance.Env) error {
	o, err := deployOrder(ctx, e)
	if err != nil {
		return err
	}
	other := e.Topo.Nodes()[1].Name()
	strB, err := e.Topo.AddPod(ctx, topologies.PodSpec{Name: "stranger-b", Namespace: orderNamespace, Node: other, Labels: map[string]string{roleLabel: stranger}})
	if err != nil {
		return err
	}
	friendB, err := e.Topo.AddPod(ctx, topologies.PodSpec{Name: "friend-b", Namespace: orderNamespace, Node: other, Labels: map[string]string{roleLabel: friend}})
	if err != nil {
		return err
	}
	if err := waitCells(ctx, e, cell{friendB, o.s, "udp", true}, cell{strB, o.s, "udp", false}, cell{o.str, o.s, "udp", false}); err != nil {
		return err
	}
	var steps []conformance.Step
	var strangers []string
	var checks []conformance.Check
	for i := range newServers {
		name := fmt.Sprintf("new-s-%d", i+1)
		c := []client{
			{from: o.str, name: fmt.Sprintf("stranger-a-to-%d", i+1), newSocket: true},
			{from: strB, name: fmt.Sprintf("stranger-b-to-%d", i+1), newSocket: true},
			{from: friendB, name: fmt.Sprintf("friend-b-to-%d", i+1)},
		}
		procs := new([]*probe.Process)
		steps = append(steps, newServer(e, o, name, c, procs)...)
		what := "wait until the friend on " + other + " reaches " + name + ", then stop its clients"
		steps = append(steps, reachedThenStop(what, EventPodLive, what,
			"the new server never got its policy", [][2]string{{c[2].name, name}}, procs))
		strangers = append(strangers, c[0].name, c[1].name)
		checks = append(checks, conformance.Check{Name: "the friend on " + other + " reaches " + name + " once it is programmed, and from then on",
			Matcher: matchers.DeliverToOnceDeliveredTo(name, name, matchers.Probes(c[2].name), matchers.SendersMayStop())})
	}
	checks = append([]conformance.Check{{Name: "nothing of either stranger's reaches a new server",
		Matcher: matchers.HaveZeroDelivered(matchers.Probes(strangers...), matchers.SendersMayStop())}}, checks...)
	return e.Run(ctx, conformance.Scenario{
		Traffic: []conformance.Traffic{
			{From: friendB, Probe: probe.UDP{Name: "friend-b", Interval: e.Budgets.ConnectInterval,
				To: []probe.Destination{{Label: o.s.Name(), Addr: addr(o.s.IP())}}}},
			{From: strB, Probe: probe.UDP{Name: "stranger-b", Interval: e.Budgets.ConnectInterval, NewSocket: true,
				To: []probe.Destination{{Label: o.s.Name(), Addr: addr(o.s.IP())}}}},
		},
		Preconditions: []conformance.Check{
			{Name: "a friend on " + other + " reaches S", Matcher: matchers.DeliverToOnceDeliveredTo(o.s.Name(), o.s.Name(), matchers.Probes("friend-b"))},
			{Name: "a stranger on " + other + " does not", Matcher: matchers.HaveZeroDelivered(matchers.Probes("stranger-b"))},
		},
		Transition: steps,
		Checks:     checks,
	})
}
