package specs

import (
	"github.com/dpconform/dpconform/conformance"
)

func init() {
	conformance.Register(conformance.Spec{
		ID:      "RESTART-NODEPORT-CRASH",
		Profile: conformance.Core,
		Features: []string{
			conformance.FeatureNodePort, conformance.FeatureNodePortRemoteBackend,
		},
		Description: "New TCP connections from outside to a NodePort (local and remote backend) all succeed while the node's agent is killed (SIGKILL) and started again.",
		Catches: []conformance.FaultCase{
			{Fault: "eager-service-sync", Kinds: []conformance.FailureKind{conformance.KindReset}},
			{Fault: "flush-nat-on-start", Kinds: []conformance.FailureKind{conformance.KindReset}},
		},
		Run: restartNodePort(true),
	})
}
