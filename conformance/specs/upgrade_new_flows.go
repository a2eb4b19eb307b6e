package specs

import (
	"context"

	"github.com/dpconform/dpconform/conformance"
	"github.com/dpconform/dpconform/fv/matchers"
	"github.com/dpconform/dpconform/fv/workloads"
)

func init() {
	conformance.Register(conformance.Spec{
		ID:      "UPGRADE-NEW-FLOWS-IN-WINDOW",
		Profile: conformance.Upgrade,
		Features: []conformance.Feature{
			conformance.FeatureClusterIP, conformance.FeatureNodePort, conformance.FeatureNodePortRemoteBackend,
		},
		Description: "New TCP connections every {connect-interval} (a pod to each ClusterIP, the outside to each NodePort; local and remote backends) all succeed across a restart of the node's agent with a conntrack table of another size (ct-size 65536, then 131072), and every connection opened before or during it (up to ready), held open, still answers at the end.",
		Transition:  "graceful restart of node-a's agent from ct-size 65536 to ct-size 131072, connections held until `ready`, then released",
		Traffic:     "a new TCP connection every {connect-interval} on each service path: a pod to each ClusterIP, the external client to each NodePort, local and remote backends; each answered connection opened up to `ready` is held open and asked again at the end",
		Invariant:   "zero failed attempts from 1 s before `stop-sent` to 3 s after `ready`, and every held connection answers at the end",
		Budgets:     []string{"connect-interval", "attempt-timeout", "lead", "settle"},
		Origin:      "the review of Calico PR 12164 (SPECS.md, item 3): the copy from the old conntrack map must run after the new programs are attached, or what the old programs write in between is lost; new flows in that window make the race real",
		Catches: []conformance.FaultCase{
			{Fault: "ct-copy-before-attach", Kinds: []conformance.FailureKind{matchers.KindReset, matchers.KindTimeout, matchers.KindNotAlive}},
		},
		Setup: conformance.Setup{Start: ctSize("65536"), Upgrade: ctSize("131072")},
		Body:  upgradeNewFlows,
	})
}

// upgradeNewFlows opens a connection every ConnectInterval on each service flow
// and holds every one that is answered up to ready, to the end. The new
// flows of the upgrade's own window (the old programs still attached while the new
// table exists) write their state where only a migration done in the right order
// carries it over, and it shows when they send again, at the end.
func upgradeNewFlows(ctx context.Context, e *conformance.Env) error {
	f, err := workloads.DeployCore(ctx, e.World, e.Warm())
	if err != nil {
		return err
	}
	sc := conformance.Scenario{
		// Held from the steady state to ready: some 500 connections a second on each
		// path. The settle time's are not: held too they would add as many again, and
		// on the path that a dataplane SNATs (the NodePort to node-b) each takes a
		// SNAT port (refdp has 4,536).
		Transition: []conformance.Step{conformance.UpgradeAgent(f.NodeA, false), conformance.ReleaseHeld()},
	}
	for _, fl := range f.ServiceFlows(e.Topo) {
		noneFail := func() matchers.Matcher {
			return matchers.HaveNoFailedAttempts(matchers.Probes(fl.Name), matchers.Backends(fl.Backend))
		}
		c := e.Connect(fl.Name, fl.Target)
		c.Hold = true
		sc.Traffic = append(sc.Traffic, conformance.Traffic{From: fl.From, Probe: c})
		sc.Preconditions = append(sc.Preconditions, conformance.Check{Name: "new connections reach " + fl.Backend + " on " + fl.Name + " before the upgrade", Matcher: noneFail()})
		sc.Checks = append(sc.Checks,
			conformance.Check{Name: "no failed new connection on " + fl.Name + " across the upgrade", Matcher: noneFail()},
			conformance.Check{Name: "every connection on " + fl.Name + " opened before or during the upgrade still answers at the end", Matcher: matchers.HaveAllHeldAlive(matchers.Probes(fl.Name))},
		)
	}
	return e.Run(ctx, sc)
}
