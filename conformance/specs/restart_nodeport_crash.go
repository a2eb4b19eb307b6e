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
		Catches: []conformance.FaultCase{
			{Fault: "eager-service-sync", Kinds: []conformance.FailureKind{matchers.KindReset}},
			{Fault: "flush-nat-on-start", Kinds: []conformance.FailureKind{matchers.KindReset}},
		},
		Body: restartNodePort(true),
	})
}
