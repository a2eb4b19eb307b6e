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
		Transition:  "graceful restart of node-a's agent from ct-size 65536 to ct-size 32768 (`start --set ct-size=...`)",
		Traffic:     "two long-lived TCP streams each, a message every {stream-interval}, as RESTART-ESTABLISHED's: pod to pod on the same node and across nodes, pod to ClusterIP (local and remote backend), external client to NodePort (local and remote backend)",
		Invariant:   "no reset; no gap over 200 ms on any stream; every stream alive (an echo within 500 ms of the window's end) 3 s after `ready`",
		Budgets:     []string{"stream-interval", "stream-max-gap", "alive-within", "lead", "settle"},
		Origin:      "the review of Calico PR 12164 (SPECS.md, item 3): conntrack entries copied from an old map into a new one of another size must survive the change, or established NATed flows lose their state",
		Catches: []conformance.FaultCase{
			{Fault: "no-ct-migration", Kinds: []conformance.FailureKind{matchers.KindReset, matchers.KindGap, matchers.KindNotAlive}},
		},
		// A smaller table: the one change that a copy may not fit into.
		Setup: conformance.Setup{Start: ctSize("65536"), Upgrade: ctSize("32768")},
		Body:  upgradeStreams,
	})
}
