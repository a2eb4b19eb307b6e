package peers

import (
	"context"
	"path/filepath"
	"slices"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/dpconform/dpconform/conformance"
	"github.com/dpconform/dpconform/driver"
	"github.com/dpconform/dpconform/fv/probe"
)

// phaseLog keeps a line per peer run with the time it spent in each phase
// (_output/peers/phases.tsv): where the package's time goes.
var phaseLog = &conformance.PhaseLog{Path: filepath.Join("..", "..", "_output", "peers", "phases.tsv")}

// runPeer runs spec s once against the peer d drives, held to budgets b (zero: the
// catalogue's), with its output under _output/out.
func runPeer(ctx context.Context, d driver.Driver, peer string, s conformance.Spec, b conformance.Budgets, out ...string) conformance.Result {
	GinkgoHelper()
	res, _ := runPeerWith(ctx, d, peer, s, b, out...)
	return res
}

// runPeerWith is runPeer, which also returns the runner, for a run to publish
// (publication.add).
func runPeerWith(ctx context.Context, d driver.Driver, peer string, s conformance.Spec, b conformance.Budgets, out ...string) (conformance.Result, *conformance.Runner) {
	GinkgoHelper()
	prog, err := probe.Self()
	Expect(err).NotTo(HaveOccurred())
	r, err := conformance.NewRunner(ctx, conformance.Config{
		Driver: d, Probe: prog, Budgets: b, ControlPlanes: controlPlanes,
		OutputDir: filepath.Join(append([]string{"..", "..", "_output"}, out...)...),
		Logf:      func(f string, a ...any) { GinkgoWriter.Printf(f+"\n", a...) },
	})
	Expect(err).NotTo(HaveOccurred())
	res := r.Run(ctx, s)
	GinkgoWriter.Printf("%s against %s: %s %s\n", s.ID, peer, res.Result, res.Reason)
	GinkgoWriter.Printf("%s against %s took %s: %s\n", s.ID, peer, res.Duration, conformance.PhasesString(res.Phases))
	if err := phaseLog.Add(peer, res); err != nil {
		GinkgoWriter.Printf("phase log: %v\n", err)
	}
	return res, r
}

// expectPassedOrKnown holds a peer's result to its documentation: it passed, or it
// failed only in the kinds known lists, which doc documents with the evidence.
func expectPassedOrKnown(res conformance.Result, peer, doc string, known []conformance.FailureKind) {
	GinkgoHelper()
	if res.Result == conformance.Failed {
		for _, k := range res.FailedKinds() {
			Expect(known).To(ContainElement(k), "%s failed against %s in a way %s does not document: %s\n%s", res.ID, peer, doc, res.Reason, res.Message)
		}
		AddReportEntry("known "+peer+" behaviour", res.Reason)
		return
	}
	expectPassed(res)
}

// expectPassed holds that res passed, on at least one check beyond its
// preconditions.
func expectPassed(res conformance.Result) {
	GinkgoHelper()
	Expect(res.Result).To(Equal(conformance.Passed), "%s: %s\n%s", res.Result, res.Reason, res.Message)
	Expect(slices.ContainsFunc(res.Checks, func(c conformance.CheckResult) bool { return !c.Pre })).To(BeTrue(), "a pass with no check is no pass")
}

// snatChurnShort are the catalogue's budgets with SVC-SNAT-PRESSURE's churn at 15 s,
// as in the self-test, to keep make test within its time (docs/kube-proxy.md).
func snatChurnShort() conformance.Budgets {
	b := conformance.DefaultBudgets
	b.SNATChurn = 15 * time.Second
	return b
}
