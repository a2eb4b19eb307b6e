package specs

import (
	"context"

	"github.com/dpconform/dpconform/conformance"
	"github.com/dpconform/dpconform/fv/matchers"
	"github.com/dpconform/dpconform/fv/probe"
)

func init() {
	conformance.Register(conformance.Spec{
		ID:       "RESTART-FAIL-CLOSED",
		Profile:  conformance.Policy,
		Features: []conformance.Feature{conformance.FeatureNetworkPolicy, conformance.FeatureTCP, conformance.FeatureUDP},
		Description: "A flow that policy denies stays denied while the agent restarts gracefully and after SIGKILL: " +
			"a new TCP connection and a UDP datagram from a new socket every {connect-interval}, and none delivered from {lead} before the " +
			"stop to 3 s after ready.",
		Transition: "graceful restart, then SIGKILL and start, of node-a's agent",
		Traffic:    "from a stranger, whom the policy on S refuses: a new TCP connection and a UDP datagram from a new socket (a new flow each) every {connect-interval}",
		Invariant:  "nothing delivered from 1 s before the stop to 3 s after the last `ready`",
		Budgets:    []string{"connect-interval", "policy-programmed", "lead", "settle"},
		Origin:     "a restart that re-creates its endpoints instead of adopting them, policy dropped until its first complete round: a dataplane must fail closed while its agent is down or starting",
		Catches:    []conformance.FaultCase{{Fault: "open-while-restarting", Kinds: []conformance.FailureKind{matchers.KindDelivered}}},
		Body:       restartFailClosed,
	})
}

func restartFailClosed(ctx context.Context, e *conformance.Env) error {
	o, err := deployOrder(ctx, e)
	if err != nil {
		return err
	}
	if err := waitCells(ctx, e, cell{o.friend, o.s, "tcp", true}, cell{o.str, o.s, "tcp", false}, cell{o.str, o.s, "udp", false}); err != nil {
		return err
	}
	s := addr(o.s.IP())
	// Each datagram from a new socket is a new flow, judged by policy afresh, as each
	// connection is.
	strangerUDP := probe.UDP{Name: "stranger-udp", To: []probe.Destination{{Label: "s", Addr: s}}, Interval: e.Budgets.ConnectInterval, NewSocket: true}
	return e.Run(ctx, conformance.Scenario{
		Traffic: []conformance.Traffic{
			{From: o.str, Probe: e.Connect("stranger-connect", s)},
			{From: o.str, Probe: strangerUDP},
			{From: o.friend, Probe: udpTo(e, "friend", o.s, o.d)},
		},
		Preconditions: []conformance.Check{
			{Name: "a friend reaches S", Matcher: matchers.DeliverToOnceDeliveredTo("s", "d", matchers.Probes("friend"))},
			{Name: "the stranger does not", Matcher: matchers.HaveZeroDelivered(matchers.Probes("stranger-connect", "stranger-udp"))},
		},
		Transition: []conformance.Step{conformance.Restart(o.node), conformance.Crash(o.node)},
		Checks: []conformance.Check{
			{Name: "nothing of the stranger's reaches S across the restarts", Matcher: matchers.HaveZeroDelivered(matchers.Probes("stranger-connect", "stranger-udp"))},
		},
	})
}
