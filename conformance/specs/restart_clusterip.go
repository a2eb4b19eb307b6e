package specs

import (
	"github.com/dpconform/dpconform/conformance"
	"github.com/dpconform/dpconform/fv/matchers"
)

func init() {
	// A restart that loses ClusterIP frontends is invisible to the NodePort specs,
	// which probe only the node's own addresses.
	catches := []conformance.FaultCase{
		{Fault: "drop-clusterip-frontends-on-start", Kinds: []conformance.FailureKind{matchers.KindUnreachable, matchers.KindTimeout, matchers.KindReset}},
	}
	conformance.Register(conformance.Spec{
		ID:          "RESTART-CLUSTERIP-NEW",
		Profile:     conformance.Core,
		Features:    []conformance.Feature{conformance.FeatureClusterIP},
		Description: "New TCP connections from a pod to a ClusterIP (local and remote backend) all succeed while the node's agent restarts gracefully.",
		Transition:  "graceful restart of node-a's agent: stop, then start",
		Traffic:     "a pod on node-a opens a new TCP connection every {connect-interval} to the ClusterIP of a Service with its backend on node-a and of one with its backend on node-b",
		Invariant:   "zero failed attempts from 1 s before `stop-sent` to 3 s after `ready`",
		Budgets:     []string{"connect-interval", "attempt-timeout", "lead", "settle"},
		Origin:      "a restart that adopts only the state it can attribute to the node (its NodePorts) and drops the ClusterIP frontends until its first complete sync",
		Catches:     catches,
		Body:        restartClusterIP(false),
	})
	conformance.Register(conformance.Spec{
		ID:          "RESTART-CLUSTERIP-CRASH",
		Profile:     conformance.Core,
		Features:    []conformance.Feature{conformance.FeatureClusterIP},
		Description: "New TCP connections from a pod to a ClusterIP (local and remote backend) all succeed while the node's agent is killed (SIGKILL) and started again.",
		Transition:  "SIGKILL of node-a's agent, then start",
		Traffic:     "a pod on node-a opens a new TCP connection every {connect-interval} to the ClusterIP of a Service with its backend on node-a and of one with its backend on node-b",
		Invariant:   "zero failed attempts from 1 s before `kill-sent` to 3 s after `ready`",
		Budgets:     []string{"connect-interval", "attempt-timeout", "lead", "settle"},
		Origin:      "as RESTART-CLUSTERIP-NEW, after a crash",
		Catches:     catches,
		Body:        restartClusterIP(true),
	})
}
