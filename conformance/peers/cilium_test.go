package peers

import (
	"time"

	. "github.com/onsi/ginkgo/v2"

	"github.com/dpconform/dpconform/conformance"
	"github.com/dpconform/dpconform/driver/drivertest"
	"github.com/dpconform/dpconform/fv/matchers"
)

// knownCilium lists the documented Cilium behaviours a Core spec may fail on, by the
// kinds of failure they show (docs/cilium.md, "Conformance results", with the
// evidence): Cilium v1.20.2 with its defaults serves a NodePort on each device's
// primary address only (--nodeport-addresses unset), so a SYN to an address added to
// the node's interface reaches the host's stack, which resets it; and it terminates
// the sockets connected to a deleted backend for UDP only (TCP too with the hidden
// --lb-sock-terminate-all-protos), so the TCP streams of a backend that vanished
// without closing them hang; and its socket load-balancer fails a connect with "no
// route to host" when it meets a Service's slots while a removed backend is deleted
// before they are rewritten (now and then). A new failure is either a real behaviour
// of Cilium, to be documented here and there, or a defect of the suite.
var knownCilium = map[string][]conformance.FailureKind{
	"NODE-ADDRESS-CHANGE": {matchers.KindReset},
	"SVC-ENDPOINT-VANISH": {matchers.KindHang},
	"SVC-BACKEND-SWITCH":  {matchers.KindUnreachable},
}

// The Core profile against the Cilium agent (v1.20.2, built by `make cilium`) with its
// kube-proxy replacement and CNI plugin, through drivers/cilium-driver. The
// driver is built only if there is a Core spec to run. A tier peer (ledger_test.go):
// `make test-peers` runs it and writes the run into the ledger.
var _ = Describe("cilium", Label("cilium"), Ordered, ContinueOnFailure, func() {
	var ciliumDriver string
	pub := newPublication("cilium", "core")
	BeforeAll(func(ctx SpecContext) {
		ciliumDriver = drivertest.Build(ctx, "drivers/cilium-driver")
	}, NodeTimeout(5*time.Minute))
	AfterAll(pub.write)

	for _, s := range conformance.Specs() {
		if s.Profile != conformance.Core {
			continue
		}
		It("passes "+s.ID, func(ctx SpecContext) {
			res, r := runPeerWith(ctx, drivertest.NewExec(ciliumDriver), "cilium", s, snatChurnShort(), "cilium", s.ID)
			AddReportEntry("duration", res.Duration.Round(time.Second).String())
			expectPassedOrKnown(res, "Cilium", "docs/cilium.md", knownCilium[s.ID])
			pub.add(res, r) // only a result its documentation accepts
		}, SpecTimeout(8*time.Minute))
	}
})
