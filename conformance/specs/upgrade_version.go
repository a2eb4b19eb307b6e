package specs

import (
	"github.com/dpconform/dpconform/conformance"
	"github.com/dpconform/dpconform/driver"
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
		Transition:  "graceful restart of node-a's agent from the version before the newest the implementation offers to the newest (`start --version ...`)",
		Traffic:     "two long-lived TCP streams each, a message every {stream-interval}, as RESTART-ESTABLISHED's: pod to pod on the same node and across nodes, pod to ClusterIP (local and remote backend), external client to NodePort (local and remote backend)",
		Invariant:   "no reset; no gap over 200 ms on any stream; every stream alive (an echo within 500 ms of the window's end) 3 s after `ready`",
		Budgets:     []string{"stream-interval", "stream-max-gap", "alive-within", "lead", "settle"},
		Origin:      "Calico moving its conntrack map to LRU with a version bump (SPECS.md, item 4): a format change of the conntrack table between versions must be converted on upgrade, not dropped",
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
