package peers

import (
	"time"

	. "github.com/onsi/ginkgo/v2"

	"github.com/dpconform/dpconform/conformance"
	"github.com/dpconform/dpconform/driver/drivertest"
	"github.com/dpconform/dpconform/fv/matchers"
)

// knownKubeRouter lists the documented kube-router behaviours a Policy spec may fail
// on, by the kinds of failure they show (docs/kube-router.md, "Conformance results").
// kube-router v2.1.0 passes POLICY-TRUTH-TABLE; a new pod's traffic is unfiltered,
// both ways and from either node, until kube-router has seen it (and while it is
// down), and a flow begun then stays admitted by its ESTABLISHED accept
// (docs/kube-router.md, with the evidence). A new failure is either
// a real behaviour of kube-router, to be documented here and there, or a defect of the
// suite.
var knownKubeRouter = map[string][]conformance.FailureKind{
	"ORDER-NEW-ENDPOINT":          {matchers.KindLost},
	"ORDER-NEW-ENDPOINT-EGRESS":   {matchers.KindDelivered},
	"ORDER-NEW-ENDPOINT-INGRESS":  {matchers.KindDelivered},
	"RESTART-FAIL-CLOSED-NEW-POD": {matchers.KindDelivered},
}

// The Policy profile against kube-router's network policy controller (v2.1.0, built by
// `make kube-router`), through drivers/kube-router-driver. The driver is built
// only if there is a Policy spec to run. A tier peer (ledger_test.go): `make
// test-peers` runs it and writes the run into the ledger.
var _ = Describe("kube-router", Label("kube-router"), Ordered, func() {
	var kubeRouterDriver string
	pub := newPublication("kube-router", "policy")
	BeforeAll(func(ctx SpecContext) {
		kubeRouterDriver = drivertest.Build(ctx, "drivers/kube-router-driver")
	}, NodeTimeout(5*time.Minute))
	AfterAll(pub.write)

	for _, s := range conformance.Specs() {
		if s.Profile != conformance.Policy {
			continue
		}
		It("passes "+s.ID, func(ctx SpecContext) {
			res, r := runPeerWith(ctx, drivertest.NewExec(kubeRouterDriver), "kube-router", s, conformance.Budgets{}, "kube-router", s.ID)
			expectPassedOrKnown(res, "kube-router", "docs/kube-router.md", knownKubeRouter[s.ID])
			pub.add(res, r) // only a result its documentation accepts
		}, SpecTimeout(15*time.Minute))
	}
})
