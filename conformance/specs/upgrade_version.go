package specs

import (
	"github.com/dpconform/dpconform/conformance"
	"github.com/dpconform/dpconform/fv/driver"
	"github.com/dpconform/dpconform/fv/matchers"
)

func init() {
	conformance.Register(conformance.Spec{
		ID:      "UPGRADE-VERSION",
		Profile: conformance.Upgrade,
		Features: []conformance.Feature{
			conformance.FeatureClusterIP, conformance.FeatureNodePort, conformance.FeatureNodePortRemoteBackend,
		},
		Description: "The long-lived TCP streams of RESTART-ESTABLISHED survive a restart of the node's agent from the version before the newest the implementation offers to the newest: no reset, no gap over budget, all alive after.",
		Catches: []conformance.FaultCase{
			{Fault: "no-ct-migration", Kinds: []conformance.FailureKind{matchers.KindReset, matchers.KindGap, matchers.KindNotAlive}},
		},
		// By their place in info's versions (oldest first): the implementation's
		// names for them are its own.
		Setup: conformance.Setup{
			Start:   driver.StartOptions{Version: driver.VersionPrevious},
			Upgrade: driver.StartOptions{Version: driver.VersionLatest},
		},
		Body: upgradeStreams,
	})
}
