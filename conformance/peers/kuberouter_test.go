package peers

import (
	"path/filepath"
	"slices"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/dpconform/dpconform/conformance"
	"github.com/dpconform/dpconform/fv/driver/drivertest"
	"github.com/dpconform/dpconform/fv/matchers"
	"github.com/dpconform/dpconform/fv/probe"
)

// knownKubeRouter lists the documented kube-router behaviours a Policy spec may fail
// on, by the kinds of failure they show (docs/kube-router.md, "Conformance results").
// kube-router v2.1.0 passes POLICY-TRUTH-TABLE; a new pod's traffic is unfiltered
// until kube-router has seen it, and a flow begun then stays admitted by its
// ESTABLISHED accept (docs/kube-router.md, with the evidence). A new failure is either
// a real behaviour of kube-router, to be documented here and there, or a defect of the
// suite.
var knownKubeRouter = map[string][]conformance.FailureKind{
	"ORDER-NEW-ENDPOINT":        {matchers.KindLost},
	"ORDER-NEW-ENDPOINT-EGRESS": {matchers.KindDelivered},
}

// The Policy profile against kube-router's network policy controller (v2.1.0, built by
// `make kube-router`), through conformance/cmd/kube-router-driver. The driver is built
// only if there is a Policy spec to run.
var _ = Describe("kube-router", Ordered, func() {
	var kubeRouterDriver string
	BeforeAll(func(ctx SpecContext) {
		kubeRouterDriver = drivertest.Build(ctx, "conformance/cmd/kube-router-driver")
	}, NodeTimeout(5*time.Minute))

	for _, s := range conformance.Specs() {
		if s.Profile != conformance.Policy {
			continue
		}
		It("passes "+s.ID, func(ctx SpecContext) {
			d := drivertest.NewExec(kubeRouterDriver)
			prog, err := probe.Self()
			Expect(err).NotTo(HaveOccurred())
			r, err := conformance.NewRunner(ctx, conformance.Config{
				Driver: d, Probe: prog, ControlPlanes: controlPlanes,
				OutputDir: filepath.Join("..", "..", "_output", "kube-router", s.ID),
				Logf:      func(f string, a ...any) { GinkgoWriter.Printf(f+"\n", a...) },
			})
			Expect(err).NotTo(HaveOccurred())
			res := r.Run(ctx, s)
			GinkgoWriter.Printf("%s against kube-router: %s %s\n", s.ID, res.Result, res.Reason)
			if res.Result == conformance.Failed {
				known := knownKubeRouter[s.ID]
				for _, k := range res.FailedKinds() {
					Expect(known).To(ContainElement(k), "%s failed against kube-router in a way docs/kube-router.md does not document: %s\n%s", s.ID, res.Reason, res.Message)
				}
				AddReportEntry("known kube-router behaviour", res.Reason)
				return
			}
			Expect(res.Result).To(Equal(conformance.Passed), "%s: %s\n%s", res.Result, res.Reason, res.Message)
			Expect(slices.ContainsFunc(res.Checks, func(c conformance.CheckResult) bool { return !c.Pre })).To(BeTrue(), "a pass with no check is no pass")
		}, SpecTimeout(15*time.Minute))
	}
})
