package specs

import (
	"github.com/dpconform/dpconform/conformance"
	"github.com/dpconform/dpconform/fv/matchers"
)

func init() {
	conformance.Register(conformance.Spec{
		ID:      "RESTART-NODEPORT-NEW",
		Profile: conformance.Core,
		Features: []conformance.Feature{
			conformance.FeatureNodePort, conformance.FeatureNodePortRemoteBackend,
		},
		Description: "New TCP connections from outside to a NodePort (local and remote backend) all succeed while the node's agent restarts gracefully.",
		// Calico 12192: the restarted agent synced services before it knew the host
		// IPs and erased the NodePort frontends for ~0.5 s; new connections got RSTs.
		Transition: "graceful restart of node-a's agent: stop, then start",
		Traffic:    "the external client opens a new TCP connection every {connect-interval} to node-a's IP:NodePort, for a Service with its backend on node-a and for one with its backend on node-b",
		Invariant:  "zero failed attempts (RST, timeout over 1 s, a wrong backend) from 1 s before `stop-sent` to 3 s after `ready`",
		Budgets:    []string{"connect-interval", "attempt-timeout", "lead", "settle"},
		Origin:     "Calico issue 12192 (fixed by PR 12667): the restarted agent synced Services before it knew the node's host IPs and erased the NodePort frontends the previous run had left; new connections were refused for some 0.5 s (up to 5 s reported)",
		Catches: []conformance.FaultCase{
			{Fault: "eager-service-sync", Kinds: []conformance.FailureKind{matchers.KindReset}},
		},
		Body: restartNodePort(false),
	})
}
