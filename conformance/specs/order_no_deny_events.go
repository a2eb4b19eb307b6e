package specs

import (
	"context"

	"github.com/dpconform/dpconform/conformance"
	"github.com/dpconform/dpconform/fv/matchers"
	"github.com/dpconform/dpconform/topologies"
)

func init() {
	conformance.Register(conformance.Spec{
		ID:       "ORDER-NO-DENY-EVENTS",
		Profile:  conformance.Observability,
		Features: []conformance.Feature{conformance.FeatureNetworkPolicy, conformance.FeaturePolicyVerdicts, conformance.FeatureUDP},
		Description: "A new pod whose label a same-node server's ingress policy admits is never reported denied on its way " +
			"to that server, not even for its first packets (the flow logs of ORDER-NEW-ENDPOINT's transition).",
		Transition: "as ORDER-NEW-ENDPOINT: five new pods (role=friend) appear one after another on node-a, where server S admits only friends; each sends until 500 ms after it first reaches D, and the next appears then",
		Traffic:    "sequence-numbered UDP every {order-interval} from an existing friend and from each new pod (from its first possible packet) to S and to the control server D; a restricted pod's UDP to X, which its egress policy denies",
		Invariant:  "the implementation's policy verdicts (the driver's `events`, drained to the timeline) report no deny on any flow to S, from before the first new pod appears to the window's end; each new pod goes live (once it reaches D, it reaches S); preconditions: the friend reaches S, and the restricted pod's flow to X is reported denied (the flow log works)",
		Budgets:    []string{"order-interval", "policy-programmed"},
		Origin:     "Calico PR 12164, seen in its flow logs: the new workload's first packets were reported denied by a peer whose IP sets did not hold it yet",
		Catches:    []conformance.FaultCase{{Fault: "attach-before-ipsets", Kinds: []conformance.FailureKind{matchers.KindVerdict}}},
		Body:       noDenyEvents,
	})
}

func noDenyEvents(ctx context.Context, e *conformance.Env) error {
	o, err := deployOrder(ctx, e)
	if err != nil {
		return err
	}
	r, err := e.Topo.AddPod(ctx, topologies.PodSpec{Name: "restricted", Namespace: orderNamespace, Node: o.node.Name(),
		Labels: map[string]string{roleLabel: restricted}})
	if err != nil {
		return err
	}
	if err := waitCells(ctx, e, cell{o.friend, o.s, "udp", true}, cell{r, o.x, "udp", false}); err != nil {
		return err
	}
	arrive, names := arrivals(e, o, friend, o.s, o.d)
	return e.Run(ctx, conformance.Scenario{
		Verdicts: true,
		Traffic: []conformance.Traffic{
			{From: o.friend, Probe: udpTo(e, "friend", o.s, o.d)},
			// Denied by its egress policy, to another server than S: it proves the flow
			// log, and no verdict of it is on a flow to S.
			{From: r, Probe: udpTo(e, "restricted", o.x)},
		},
		Preconditions: []conformance.Check{
			{Name: "a friend reaches S", Matcher: matchers.DeliverToOnceDeliveredTo("s", "d", matchers.Probes("friend"))},
			{Name: "a denied flow is reported denied", Matcher: matchers.HaveVerdicts("deny", matchers.Between(r.IP().String(), o.x.IP().String()))},
		},
		Transition: arrive,
		Checks: []conformance.Check{
			{Name: "no flow to S is reported denied", Matcher: matchers.HaveNoVerdicts("deny", matchers.Between("", o.s.IP().String()))},
			// Else "no deny" could be that of pods that never went live.
			{Name: "each new friend goes live: it reaches S", Matcher: matchers.DeliverToOnceDeliveredTo("s", "d", matchers.Probes(names...), matchers.SendersMayStop())},
		},
	})
}
