// Package peers runs the suite against real implementations that dpconform does not
// own, to keep the suite honest: a spec a mature dataplane fails is either a real
// behaviour of it (documented, with evidence, in docs/) or a defect of the suite.
package peers

import (
	"os"
	"slices"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/dpconform/dpconform/conformance"
	_ "github.com/dpconform/dpconform/conformance/specs"
	"github.com/dpconform/dpconform/driver/drivertest"
	"github.com/dpconform/dpconform/fv/matchers"
	"github.com/dpconform/dpconform/fv/probe"
	"github.com/dpconform/dpconform/internal/privileged"
	"github.com/dpconform/dpconform/internal/specbrief"
	"github.com/dpconform/dpconform/topologies/netns"
)

func TestMain(m *testing.M) {
	probe.RunIfChild()
	os.Exit(m.Run())
}

func TestPeers(t *testing.T) {
	RegisterFailHandler(Fail)
	specbrief.RunSpecs(t, "the suite against real peers")
}

var (
	kubeProxyDriver string
	// controlPlanes serves every run of the package, one after another, reset
	// between them.
	controlPlanes *netns.ControlPlanes
)

var _ = BeforeSuite(func(ctx SpecContext) {
	privileged.Ginkgo(Skip, Fail)
	kubeProxyDriver = drivertest.Build(ctx, "drivers/kube-proxy-driver")
	controlPlanes = netns.NewControlPlanes("", func(f string, a ...any) { GinkgoWriter.Printf(f+"\n", a...) })
	DeferCleanup(func() { Expect(controlPlanes.Close()).To(Succeed()) })
}, NodeTimeout(5*time.Minute))

// knownKubeProxy lists the documented kube-proxy behaviours a Core spec may fail on,
// by the kinds of failure they show (docs/kube-proxy.md, "Behaviour a spec may trip
// on"): with masquerade to one backend at hundreds of new connections a second,
// nf_nat now and then picks a source port whose tuple the backend still holds in
// TIME_WAIT, and that SYN is retried after 1 s: a timeout, never a reset. And the
// streams of a backend that vanished without closing them hang: kube-proxy leaves TCP
// conntrack alone.
//
// In the ModeSwitch profile (iptables mode to nftables mode, docs/kube-proxy.md): the
// nftables mode removes the iptables rules before it programs its own, so new
// connections fail for ~0.5 s, and it cannot accept forwarded NodePort traffic to a
// remote backend past a FORWARD policy DROP, so that flow dies and new ones fail.
var knownKubeProxy = map[string][]conformance.FailureKind{
	"RESTART-NODEPORT-NEW":   {matchers.KindTimeout},
	"RESTART-NODEPORT-CRASH": {matchers.KindTimeout},
	"SWITCH-NEW-CONNECTIONS": {matchers.KindTimeout, matchers.KindReset, matchers.KindUnreachable},
	"SWITCH-NODEPORT-REMOTE": {matchers.KindGap, matchers.KindNotAlive},
	"SWITCH-CLEANUP":         {conformance.KindNotFlowing},
	// The NodePorts on node-a's IP are masqueraded like those of the restart specs.
	// And a SYN to the added address whose tuple the client used before the address
	// was added follows that attempt's conntrack entry, made when the address was
	// not local and so not DNATed, and is refused (docs/kube-proxy.md, 5).
	"NODE-ADDRESS-CHANGE": {matchers.KindTimeout, matchers.KindReset},
	// The same, at 1,000 connections a second to one backend: more SYNs held up than
	// the spec's 1 in 1,000 in some runs.
	"SVC-SNAT-PRESSURE": {matchers.KindTimeout},
	// kube-proxy never ends a TCP flow: those of a backend that vanished without a
	// FIN stay DNATed to it, silent, until the client gives up. Nor does it delete
	// the SYN_SENT entries of the attempts that went to it before its sync, so a new
	// connection that reuses one of their source ports goes to it too
	// (kubernetes/kubernetes#101607).
	"SVC-ENDPOINT-VANISH": {matchers.KindHang, matchers.KindTimeout},
}

// knownKubeProxyIn adds, per mode, the documented behaviours of that mode alone: in
// nftables mode, now and then one new connection to a ClusterIP meets a net
// unreachable (SVC-ENDPOINT-CHURN once in three runs, SVC-BACKEND-SWITCH one of
// 63,281 attempts once): likely a SYN conntrack judged invalid, which nftables mode,
// unlike iptables mode, does not drop, forwarded without DNAT (not shown).
// (Its NodePorts are served on the Node's primary IP only, so never on an address added
// to the node's interface, and the host answers the SYN with a RST: a reset, which
// knownKubeProxy has for both modes.)
var knownKubeProxyIn = map[string]map[string][]conformance.FailureKind{
	"nftables": {
		// One new connection in 8,000 met a net unreachable (cause not established).
		"SVC-ENDPOINT-CHURN": {matchers.KindUnreachable},
		// The same, once: one of 63,281.
		"SVC-BACKEND-SWITCH": {matchers.KindUnreachable},
	},
}

// Each mode's runs are ordered, so that a complete profile can be written into the
// ledger after its last spec (make test-peers PEERS=kube-proxy; ledger_test.go).
var _ = Describe("kube-proxy", Label("kube-proxy"), func() {
	for _, mode := range []string{"iptables", "nftables"} {
		Describe("in "+mode+" mode", Ordered, ContinueOnFailure, func() {
			pubs := map[conformance.Profile]*publication{conformance.Core: newPublication("kube-proxy", mode+"-core")}
			if mode == "nftables" {
				pubs[conformance.ModeSwitch] = newPublication("kube-proxy", "iptables-to-nftables-modeswitch")
			}
			AfterAll(func() {
				for _, p := range []conformance.Profile{conformance.Core, conformance.ModeSwitch} {
					if pubs[p] != nil {
						pubs[p].write()
					}
				}
			})
			for _, s := range conformance.Specs() {
				// Core in both modes; ModeSwitch in nftables mode, the mode a node
				// switches to from kube-proxy's iptables mode.
				if pubs[s.Profile] == nil {
					continue
				}
				It("passes "+s.ID, func(ctx SpecContext) {
					d := drivertest.NewExec(kubeProxyDriver, "DPC_KUBE_PROXY_MODE="+mode)
					res, r := runPeerWith(ctx, d, "kube-proxy-"+mode, s, snatChurnShort(), "kube-proxy", mode, s.ID)
					known := slices.Concat(knownKubeProxy[s.ID], knownKubeProxyIn[mode][s.ID])
					expectPassedOrKnown(res, "kube-proxy", "docs/kube-proxy.md", known)
					pubs[s.Profile].add(res, r) // only a result its documentation accepts
				}, SpecTimeout(6*time.Minute))
			}
		})
	}
})
