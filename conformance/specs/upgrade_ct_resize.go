package specs

import (
	"github.com/dpconform/dpconform/conformance"
	"github.com/dpconform/dpconform/fv/matchers"
)

func init() {
	conformance.Register(conformance.Spec{
		ID:      "UPGRADE-CT-RESIZE",
		Profile: conformance.Upgrade,
		Features: []conformance.Feature{
			conformance.FeatureClusterIP, conformance.FeatureNodePort, conformance.FeatureNodePortRemoteBackend,
		},
		Description: "The long-lived TCP streams of RESTART-ESTABLISHED survive a restart of the node's agent with a conntrack table of another size (ct-size 65536, then 32768): no reset, no gap over budget, all alive after.",
		Catches: []conformance.FaultCase{
			{Fault: "no-ct-migration", Kinds: []conformance.FailureKind{matchers.KindReset, matchers.KindGap, matchers.KindNotAlive}},
		},
		// A smaller table: the one change that a copy may not fit into.
		Setup: conformance.Setup{Start: ctSize("65536"), Upgrade: ctSize("32768")},
		Body:  upgradeStreams,
	})
}
