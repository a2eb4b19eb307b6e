package specs

import (
	"github.com/dpconform/dpconform/conformance"
	"github.com/dpconform/dpconform/fv/matchers"
)

func init() {
	conformance.Register(conformance.Spec{
		ID:      "RESTART-NODEPORT-CRASH",
		Profile: conformance.Core,
		Features: []conformance.Feature{
			conformance.FeatureNodePort, conformance.FeatureNodePortRemoteBackend,
		},
		Description: "New TCP connections from outside to a NodePort (local and remote backend) all succeed while the node's agent is killed (SIGKILL) and started again.",
		Transition:  "SIGKILL of node-a's agent, then start",
		Traffic:     "the external client opens a new TCP connection every {connect-interval} to node-a's IP:NodePort, for a Service with its backend on node-a and for one with its backend on node-b",
		Invariant:   "zero failed attempts (RST, timeout over 1 s, a wrong backend) from 1 s before `kill-sent` to 3 s after `ready`",
		Budgets:     []string{"connect-interval", "attempt-timeout", "lead", "settle"},
		Origin:      "Calico issue 12192, after a crash; and the simplest form of its class, a restart that rebuilds the NAT state from scratch instead of adopting what the kernel holds",
		Catches: []conformance.FaultCase{
			{Fault: "eager-service-sync", Kinds: []conformance.FailureKind{matchers.KindReset}},
			{Fault: "flush-nat-on-start", Kinds: []conformance.FailureKind{matchers.KindReset}},
		},
		Body: restartNodePort(true),
	})
}
