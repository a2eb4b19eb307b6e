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
		Catches: []conformance.FaultCase{
			{Fault: "eager-service-sync", Kinds: []conformance.FailureKind{matchers.KindReset}},
		},
		Body: restartNodePort(false),
	})
}
