package selftest

import (
	"context"
	"slices"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/dpconform/dpconform/conformance"
	"github.com/dpconform/dpconform/topologies/netns"
)

// skew is how far apart the hosts' clocks are set below: node-a's 1000 s ahead of
// the suite's, node-b's 2000 s, the external client's 1000 s behind.
const skew = 1000 * time.Second

// skewedCases are the specs, each with a fault it catches, that make test runs with
// every host on a clock of its own: one for each way a host's time meets the suite's.
// The whole self-test runs so with `make selftest CLOCK_SKEW=1000s`.
var skewedCases = []struct{ spec, fault, why string }{
	{"RESTART-NODEPORT-NEW", "eager-service-sync", "the external client's attempts, judged in a window around the agent's restart, its ready time the node's (ready_since_ns)"},
	{"RESTART-RECONCILE", "ready-before-first-apply", "checks that start at ready"},
	{"SVC-ENDPOINT-VANISH", "keep-flows-to-gone-backends", "a deadline after a transition for streams to end; the agent's conntrack ages from the kernel's clock"},
	{"SVC-UDP-ENDPOINT-CHANGE", "keep-udp-conntrack-on-backend-removal", "datagrams stamped by a pod, answered by servers on both nodes"},
	{"NODE-ADDRESS-CHANGE", "host-ips-read-once", "a time to serve after an address is added"},
	{"ORDER-NO-DENY-EVENTS", "attach-before-ipsets", "policy verdicts, stamped by the node's datapath"},
	{"SWITCH-NODEPORT-REMOTE", "no-forward-fallthrough-accept", "the real kube-proxy on a node of its own clock, then the switch"},
}

// runSkewed runs s against the reference (with faults) on hosts of skewed clocks,
// aligned or not.
func runSkewed(ctx context.Context, s conformance.Spec, name string, aligned bool, faults ...string) conformance.Result {
	GinkgoHelper()
	res, err := runConfig(ctx, s, bins["refdp-driver"], name, conformance.Config{Budgets: testBudgets(), ClockSkew: skew, ClockAlignmentOff: !aligned}, faultEnv(faults)...)
	Expect(err).NotTo(HaveOccurred())
	return res
}

var _ = Describe("hosts of clocks of their own", func() {
	for _, c := range skewedCases {
		s := lookup(c.spec)
		It(c.spec+" passes against the clean reference on skewed clocks, which it measures as they were set ("+c.why+")", func(ctx SpecContext) {
			res := runSkewed(ctx, s, "skewed-clean", true)
			Expect(res.Result).To(Equal(conformance.Passed), "%s: %s\n%s", res.Result, res.Reason, res.Message)
			Expect(res.Clocks).To(HaveLen(3), "node-a, node-b and the external client")
			for _, hc := range res.Clocks {
				set, ok := netns.SkewedClock(skew, hc.Host)
				Expect(ok).To(BeTrue(), "a clock of host %q, which the topology does not have", hc.Host)
				offset, err := time.ParseDuration(hc.Offset)
				Expect(err).NotTo(HaveOccurred())
				bound, err := time.ParseDuration(hc.Uncertainty)
				Expect(err).NotTo(HaveOccurred())
				Expect(offset-set).To(And(BeNumerically(">=", -bound), BeNumerically("<=", bound)),
					"%s's clock was set %v from the suite's and measured %s ±%s", hc.Host, set, hc.Offset, hc.Uncertainty)
			}
		}, SpecTimeout(6*time.Minute))

		i := slices.IndexFunc(s.Catches, func(fc conformance.FaultCase) bool { return fc.Fault == c.fault })
		if i < 0 {
			panic("skewedCases: " + c.spec + " does not catch " + c.fault)
		}
		It(c.spec+" catches the fault "+c.fault+" on skewed clocks", func(ctx SpecContext) {
			expectCaught(runSkewed(ctx, s, "skewed-"+c.fault, true, c.fault), s.Catches[i])
		}, SpecTimeout(6*time.Minute))
	}

	It("without the alignment, a run on skewed clocks does not pass", func(ctx SpecContext) {
		s := lookup("RESTART-NODEPORT-NEW")
		res := runSkewed(ctx, s, "skewed-unaligned", false)
		// The external client's clock is 1000 s behind: its watermarks never reach the
		// end of the steady state on the suite's clock, and the run cannot judge.
		Expect(res.Result).To(BeElementOf(conformance.Failed, conformance.Errored),
			"the probes' times were left on their hosts' clocks, 1000 s from the transitions, yet: %s %s", res.Result, res.Reason)
		GinkgoWriter.Printf("unaligned: %s %s\n", res.Result, res.Reason)
	}, SpecTimeout(6*time.Minute))
})

// lookup is the spec of that ID in the registry.
func lookup(id string) conformance.Spec {
	for _, s := range conformance.Specs() {
		if s.ID == id {
			return s
		}
	}
	panic("no spec " + id + " in the registry")
}
