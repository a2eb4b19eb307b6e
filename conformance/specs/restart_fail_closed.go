package specs

import (
	"context"
	"fmt"
	"time"

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

func init() {
	conformance.Register(conformance.Spec{
		ID:       "RESTART-FAIL-CLOSED-NEW-POD",
		Profile:  conformance.Policy,
		Features: []conformance.Feature{conformance.FeatureNetworkPolicy, conformance.FeatureUDP},
		Description: "A pod the agent has never seen, created while the agent is down, passes nothing its policy refuses, " +
			"in either direction, from its first packet until the agent has programmed it, and then gets exactly its policy; " +
			"once after a graceful stop and once after SIGKILL.",
		Transition: "node-a's agent stopped (gracefully, then in a second round killed); while it is down two pods are created on node-a: one whose egress policy allows only D, and a server whose ingress policy admits only friends; the agent is started again; each round's probes stop 500 ms after its pods have their policy",
		Traffic:    "from each new pod's first possible packet (its probes start when CNI has wired it): the restricted pod sends UDP every {connect-interval} to X, which its policy refuses, and to D; a stranger sends UDP to the new server from a new socket each time (a new flow each), and a friend from one socket, every {connect-interval}",
		Invariant:  "nothing the restricted pod sends to X and nothing of the stranger's is ever delivered; once programmed (within {policy-programmed} of ready) the restricted pod reaches D and the friend the new server, every datagram from its first delivered one on",
		Budgets:    []string{"connect-interval", "policy-programmed", "lead", "settle"},
		Origin:     "an agent that knows a node's pods only by what it programmed: a pod whose interface it has never seen is left to plain routing, unpoliced, while the agent is down or until its first complete round after a start",
		Design:     "The pods are created while the agent is down because that is when no program of it can know them; the spec then has no say in how long the agent takes to start, only in what passes meanwhile. The stranger sends from a new socket each time so that every datagram is a new flow that policy must judge; a flow admitted once may legitimately stay admitted.",
		Catches:    []conformance.FaultCase{{Fault: "ungated-on-every-start", Kinds: []conformance.FailureKind{matchers.KindDelivered}}},
		Body:       restartFailClosedNewPod,
	})
}

// EventPodProgrammed is recorded once a pod created while the agent was down has
// been given its policy: the restricted one reaches D, the friend the new server.
const EventPodProgrammed = "pod-programmed"

// latePods are the pods one round of RESTART-FAIL-CLOSED-NEW-POD creates while the
// agent is down, and their probes' names.
type latePods struct {
	restricted, server string // the pods, and the labels of what they serve or send
	stranger, friend   string // the probes from the existing stranger and friend to server
	// The probes the round starts, stopped newcomerLive after the pods are programmed:
	// the next round's restart is judged on its own pods.
	procs *[]*probe.Process
}

func newLatePods(round int) latePods {
	return latePods{
		restricted: fmt.Sprintf("late-%d-restricted", round),
		server:     fmt.Sprintf("late-%d-s", round),
		stranger:   fmt.Sprintf("stranger-to-late-%d", round),
		friend:     fmt.Sprintf("friend-to-late-%d", round),
		procs:      new([]*probe.Process),
	}
}

// steps creates the round's pods (the agent is down): the restricted pod's probe
// starts when it is wired; the server's, and the stranger's and friend's probes to
// it, when the server is wired.
func (l latePods) steps(e *conformance.Env, o *orderWorld) []conformance.Step {
	restrictedProbe := probe.UDP{Name: l.restricted, Interval: e.Budgets.ConnectInterval, To: []probe.Destination{
		{Label: o.x.Name(), Addr: addr(o.x.IP())}, {Label: o.d.Name(), Addr: addr(o.d.IP())}}}
	steps := newcomer(e, o, l.restricted, map[string]string{roleLabel: restricted}, restrictedProbe, l.procs)
	return append(steps, newServer(e, o, l.server, []client{{from: o.str, name: l.stranger, newSocket: true}, {from: o.friend, name: l.friend}}, l.procs)...)
}

// programmed waits until the round's pods have their policy (the restricted pod
// reaches D and the friend the new server, each within policy-programmed of ready),
// then stops their probes.
func (l latePods) programmed(o *orderWorld) conformance.Step {
	what := "wait until " + l.restricted + " reaches D and the friend " + l.server + ", then stop their probes"
	return reachedThenStop(what, EventPodProgrammed, what,
		"a pod created while the agent was down never got its policy", [][2]string{{l.restricted, o.d.Name()}, {l.friend, l.server}}, l.procs)
}

func restartFailClosedNewPod(ctx context.Context, e *conformance.Env) error {
	o, err := deployOrder(ctx, e)
	if err != nil {
		return err
	}
	if err := waitCells(ctx, e, cell{o.friend, o.s, "udp", true}, cell{o.str, o.s, "udp", false}); err != nil {
		return err
	}
	var steps []conformance.Step
	var checks []conformance.Check
	for round, stop := range []conformance.Step{conformance.Stop(o.node), conformance.Kill(o.node)} {
		l := newLatePods(round + 1)
		steps = append(steps, stop)
		steps = append(steps, l.steps(e, o)...)
		// The pods' probes run a while with the agent down: that is the state judged.
		steps = append(steps, conformance.Pause(time.Second), conformance.Start(o.node), l.programmed(o))
		checks = append(checks,
			conformance.Check{Name: l.restricted + " never reaches X", Matcher: matchers.HaveZeroDelivered(matchers.Probes(l.restricted), matchers.To(o.x.Name()), matchers.SendersMayStop())},
			conformance.Check{Name: "nothing of the stranger's reaches " + l.server, Matcher: matchers.HaveZeroDelivered(matchers.Probes(l.stranger), matchers.SendersMayStop())},
			conformance.Check{Name: l.restricted + " reaches D once programmed, and from then on",
				Matcher: matchers.DeliverToOnceDeliveredTo(o.d.Name(), o.d.Name(), matchers.Probes(l.restricted), matchers.SendersMayStop())},
			conformance.Check{Name: "the friend reaches " + l.server + " once it is programmed, and from then on",
				Matcher: matchers.DeliverToOnceDeliveredTo(l.server, l.server, matchers.Probes(l.friend), matchers.SendersMayStop())},
		)
	}
	return e.Run(ctx, conformance.Scenario{
		Traffic: []conformance.Traffic{
			{From: o.friend, Probe: probe.UDP{Name: "friend", Interval: e.Budgets.ConnectInterval,
				To: []probe.Destination{{Label: o.s.Name(), Addr: addr(o.s.IP())}, {Label: o.d.Name(), Addr: addr(o.d.IP())}}}},
			{From: o.str, Probe: probe.UDP{Name: "stranger", Interval: e.Budgets.ConnectInterval, NewSocket: true,
				To: []probe.Destination{{Label: o.s.Name(), Addr: addr(o.s.IP())}}}},
		},
		Preconditions: []conformance.Check{
			{Name: "a friend reaches S", Matcher: matchers.DeliverToOnceDeliveredTo(o.s.Name(), o.d.Name(), matchers.Probes("friend"))},
			{Name: "the stranger does not", Matcher: matchers.HaveZeroDelivered(matchers.Probes("stranger"))},
		},
		Transition: steps,
		Checks:     checks,
	})
}
