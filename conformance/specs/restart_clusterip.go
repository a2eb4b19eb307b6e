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
		Catches:     catches,
		Body:        restartClusterIP(false),
	})
	conformance.Register(conformance.Spec{
		ID:          "RESTART-CLUSTERIP-CRASH",
		Profile:     conformance.Core,
		Features:    []conformance.Feature{conformance.FeatureClusterIP},
		Description: "New TCP connections from a pod to a ClusterIP (local and remote backend) all succeed while the node's agent is killed (SIGKILL) and started again.",
		Catches:     catches,
		Body:        restartClusterIP(true),
	})
}
