package main

import (
	"context"
	"fmt"
	"net"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dpconform/dpconform/driver/drivertest"
	"github.com/dpconform/dpconform/fv/harness"
	"github.com/dpconform/dpconform/fv/monotime"
	"github.com/dpconform/dpconform/fv/probe"
	"github.com/dpconform/dpconform/fv/workloads"
	"github.com/dpconform/dpconform/topologies"
	"github.com/dpconform/dpconform/topologies/netns"
)

var _ = Describe("the driver's facts and refusals", func() {
	var good []string
	BeforeEach(func() { good = drivertest.NodeEnv(GinkgoT()) })

	It("claims the Policy profile and leaves the pod network to the topology", func() {
		code, out := drivertest.Call(driverPath, nil, "info")
		Expect(code).To(Equal(0))
		Expect(out).To(HaveKeyWithValue("name", "kube-router"))
		Expect(out).To(HaveKeyWithValue("version", Version))
		Expect(out).To(HaveKeyWithValue("profiles", ConsistOf("Policy")))
		Expect(out).To(HaveKeyWithValue("features", ConsistOf("NetworkPolicy", "TCP", "UDP")))
		// No CNI configuration: the topology's default pod network (ptp and
		// host-local), which is what the agent runs beside (docs/driver.md).
		Expect(out).NotTo(HaveKey("cni"))
	})

	DescribeTable("refuses what cannot work, with the fix in the detail",
		func(env func() []string, args []string, wantErr string, wantDetail ...string) {
			code, out := drivertest.Call(driverPath, env(), args...)
			Expect(code).NotTo(Equal(0))
			Expect(out).To(HaveKeyWithValue("error", wantErr))
			for _, d := range wantDetail {
				Expect(out["detail"]).To(ContainSubstring(d))
			}
		},
		Entry("a kind topology", func() []string { return append(good[:4:4], "DPC_TOPOLOGY=kind") }, []string{"start"}, "unsupported topology", "DPC_TOPOLOGY=kind"),
		Entry("no network namespace", func() []string { return good[2:] }, []string{"start"}, "bad environment", "DPC_NODE, DPC_NETNS not set"),
		Entry("no kube-router binary", func() []string { return append(good, EnvBinary+"=/nonexistent/kube-router") }, []string{"start"}, "missing binary", "/nonexistent/kube-router", "make kube-router"),
		Entry("a mode", func() []string { return good }, []string{"start", "--mode", "ipvs"}, "not offered", `does not offer mode "ipvs"`),
		Entry("events", func() []string { return good }, []string{"events"}, "unsupported", "Observability"),
	)
})

// hostNames lists kube-router's chains and ipsets in the host's own network namespace
// (the test's): there must never be any.
func hostNames(ctx context.Context) []string {
	GinkgoHelper()
	var out []string
	for _, fam := range iptablesFamilies {
		dump, err := exec.CommandContext(ctx, fam+"-save").Output()
		Expect(err).NotTo(HaveOccurred())
		for _, line := range strings.Split(string(dump), "\n") {
			if f := strings.Fields(line); len(f) > 0 && slices.ContainsFunc(f, func(s string) bool { return isChain(strings.TrimPrefix(s, ":")) }) {
				out = append(out, fam+": "+line)
			}
		}
	}
	sets, err := exec.CommandContext(ctx, "ipset", "list", "-n").Output()
	Expect(err).NotTo(HaveOccurred())
	for _, s := range strings.Fields(string(sets)) {
		if isSet(s) {
			out = append(out, "ipset "+s)
		}
	}
	return out
}

// agentOn is the driver's view of kube-router on node n.
func agentOn(n topologies.Node) *agent {
	env := map[string]string{}
	for _, kv := range n.DriverEnv() {
		k, v, _ := strings.Cut(kv, "=")
		env[k] = v
	}
	return &agent{Binary: Binary(), NetNS: env["DPC_NETNS"], Dir: env["DPC_STATE_DIR"], Node: n.Name(), Kubeconfig: env["DPC_KUBECONFIG"]}
}

// The policies of the enforcement test: x/a admits only pods labelled pod=b of its
// own namespace (a podSelector without a namespaceSelector), and everything else in x
// admits nothing.
var (
	allowFromB = &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "allow-from-b", Namespace: "x"},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{workloads.PodLabel: "a"}},
			Ingress: []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{
				PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{workloads.PodLabel: "b"}},
			}}}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
		},
	}
	defaultDeny = &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "default-deny-ingress", Namespace: "x"},
		Spec:       networkingv1.NetworkPolicySpec{PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}},
	}
)

// sources are the clients of x/a in the enforcement test, and whether the policies
// admit them. With two nodes the fixture puts x/a, x/c and y/b on node-a, x/b and y/c
// on node-b: each verdict is seen on the same node and across nodes.
var sources = []struct {
	id      string
	allowed bool
}{
	{"x/b", true},  // pod=b in x: admitted (other node)
	{"y/c", false}, // another namespace (other node)
	{"x/c", false}, // the same namespace, not pod=b (same node)
	{"y/b", false}, // pod=b, but of another namespace (same node)
}

var _ = Describe("kube-router through its driver", Ordered, ContinueOnFailure, func() {
	var (
		topo *netns.Topology
		w    *harness.World
		f    *workloads.Netpol
		xa   workloads.NetpolPod
		// Times of the policies' create and delete, and the continuous probes.
		created, deleted monotime.Time
	)

	BeforeAll(func(ctx SpecContext) {
		Expect(hostNames(ctx)).To(BeEmpty(), "the host has kube-router's names before the test")
		drv := drivertest.NewExec(driverPath)
		info, err := drv.Info(ctx)
		Expect(err).NotTo(HaveOccurred())
		topo, err = netns.New(ctx, netns.Options{CNIConfig: info.CNI, CNIDirs: info.CNIDirs(), Logf: func(f string, a ...any) { GinkgoWriter.Printf(f+"\n", a...) }})
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func(ctx SpecContext) {
			id := topo.RunID()
			Expect(topo.Close()).To(Succeed())
			Expect(netns.Leftovers("", id)).To(BeEmpty())
			Expect(hostNames(ctx)).To(BeEmpty(), "kube-router's names on the host after the run")
		}, NodeTimeout(time.Minute))
		prog, err := probe.Self()
		Expect(err).NotTo(HaveOccurred())
		w = harness.New(topo, drv, prog)
		w.ProbeStderr = GinkgoWriter
		DeferCleanup(func(ctx SpecContext) { Expect(w.Cleanup(ctx)).To(Succeed()) }, NodeTimeout(time.Minute))
		begin := time.Now()
		Expect(w.StartAll(ctx)).To(Succeed())
		AddReportEntry("start to ready, every node", time.Since(begin).Round(time.Millisecond).String())
		f, err = workloads.DeployNetpol(ctx, w)
		Expect(err).NotTo(HaveOccurred())
		xa, _ = f.Pod("x", "a")
	}, NodeTimeout(3*time.Minute))

	AfterEach(func(ctx SpecContext) {
		if !CurrentSpecReport().Failed() {
			return
		}
		dir := filepath.Join(drivertest.ArtifactsDir("kube-router-driver"), strings.NewReplacer(" ", "_", "/", "_").Replace(CurrentSpecReport().FullText()))
		files, err := w.Collect(ctx, dir)
		AddReportEntry("diagnostics", fmt.Sprintf("%d files in %s (collect error: %v)", len(files), dir, err))
	}, NodeTimeout(time.Minute))

	pod := func(id string) workloads.NetpolPod {
		GinkgoHelper()
		ns, name, _ := strings.Cut(id, "/")
		p, ok := f.Pod(ns, name)
		Expect(ok).To(BeTrue(), "no pod %s", id)
		return p
	}

	// denials counts how the matrix's denied tries failed, across the test.
	denials := map[probe.Outcome]int{}
	// matrix tries x/a on TCP and UDP port 80 from every source once and returns
	// whether each reached it, "x/b tcp" -> true.
	//
	// kube-router REJECTs what the policies do not admit (ICMP port unreachable), but
	// Linux rate-limits the ICMP errors it sends per destination (net.ipv4.
	// icmp_ratelimit), so under the continuous probes most denied tries see no answer
	// at all: a denial is refused or timeout, and either is "not reached".
	matrix := func(ctx context.Context) map[string]bool {
		GinkgoHelper()
		out := map[string]bool{}
		for _, s := range sources {
			p := pod(s.id)
			var targets []probe.Target
			for _, proto := range []string{"tcp", "udp"} {
				targets = append(targets, probe.Target{Label: s.id + " " + proto, Proto: proto, Addr: net.JoinHostPort(xa.Pod.IP().String(), "80")})
			}
			evs, err := w.Reach(ctx, p.Pod, probe.Reach{Name: "reach-" + strings.ReplaceAll(s.id, "/", "-"), Targets: targets})
			Expect(err).NotTo(HaveOccurred())
			for _, e := range evs {
				Expect(e.Outcome == probe.OK && e.Backend != xa.ID()).To(BeFalse(), "%s answered by %s, not x/a", e.Label, e.Backend)
				out[e.Label] = e.Outcome == probe.OK
				if e.Outcome != probe.OK {
					denials[e.Outcome]++
				}
			}
		}
		return out
	}
	open := func() map[string]bool {
		m := map[string]bool{}
		for _, s := range sources {
			m[s.id+" tcp"], m[s.id+" udp"] = true, true
		}
		return m
	}
	// enforced is the matrix under the policies.
	enforced := func() map[string]bool {
		m := map[string]bool{}
		for _, s := range sources {
			m[s.id+" tcp"], m[s.id+" udp"] = s.allowed, s.allowed
		}
		return m
	}

	It("lets every pod reach x/a before any policy", func(ctx SpecContext) {
		Expect(matrix(ctx)).To(Equal(open()))
	}, SpecTimeout(time.Minute))

	It("enforces default-deny plus an allow from pod=b in x", func(ctx SpecContext) {
		// A new TCP connection every 10 ms from each source, across create, stop,
		// restart and delete: the times of the first refusal and of the last give
		// the enforcement latency.
		for _, s := range sources {
			p := pod(s.id)
			_, err := w.StartProbe(ctx, p.Pod, probe.Connect{Name: "connect-" + s.id, Target: net.JoinHostPort(xa.Pod.IP().String(), "80"), Interval: 10 * time.Millisecond, Timeout: 500 * time.Millisecond})
			Expect(err).NotTo(HaveOccurred())
		}
		time.Sleep(time.Second)
		nps := topo.Kube().NetworkingV1().NetworkPolicies("x")
		created = monotime.Now()
		for _, np := range []*networkingv1.NetworkPolicy{allowFromB, defaultDeny} {
			_, err := nps.Create(ctx, np, metav1.CreateOptions{})
			Expect(err).NotTo(HaveOccurred())
		}
		Eventually(matrix).WithContext(ctx).WithTimeout(30 * time.Second).WithPolling(200 * time.Millisecond).Should(Equal(enforced()))
		time.Sleep(time.Second)
		Expect(matrix(ctx)).To(Equal(enforced()), "the verdicts changed after they settled")
	}, SpecTimeout(2*time.Minute))

	It("keeps enforcing while stopped, and after a restart", func(ctx SpecContext) {
		for _, n := range topo.Nodes() {
			begin := time.Now()
			Expect(w.Stop(ctx, n)).To(Succeed())
			AddReportEntry("stop to exited, "+n.Name(), time.Since(begin).Round(time.Millisecond).String())
			Expect(w.Driver.Status(ctx, harness.NodeEnv(n))).To(HaveField("Running", false))
		}
		Expect(matrix(ctx)).To(Equal(enforced()), "the rules of a stopped kube-router")
		for _, n := range topo.Nodes() {
			before, err := agentOn(n).Programmed(ctx)
			Expect(err).NotTo(HaveOccurred())
			Expect(before).To(ContainElements("iptables filter KUBE-ROUTER-FORWARD", ContainSubstring("KUBE-POD-FW-"), ContainSubstring("ipset KUBE-")))
		}
		begin := time.Now()
		Expect(w.StartAll(ctx)).To(Succeed())
		AddReportEntry("restart: start to ready, every node", time.Since(begin).Round(time.Millisecond).String())
		Expect(matrix(ctx)).To(Equal(enforced()), "after the restart")
	}, SpecTimeout(2*time.Minute))

	It("restores access when the policies are deleted", func(ctx SpecContext) {
		nps := topo.Kube().NetworkingV1().NetworkPolicies("x")
		deleted = monotime.Now()
		for _, np := range []*networkingv1.NetworkPolicy{allowFromB, defaultDeny} {
			Expect(nps.Delete(ctx, np.Name, metav1.DeleteOptions{})).To(Succeed())
		}
		Eventually(matrix).WithContext(ctx).WithTimeout(30 * time.Second).WithPolling(200 * time.Millisecond).Should(Equal(open()))
		time.Sleep(time.Second)
		Expect(w.StopProbes(ctx)).To(Succeed())

		// The continuous probes: an allowed source never failed; a denied one was
		// refused from some attempt after the create until some attempt after the
		// delete, and never in between.
		for _, s := range sources {
			var atts []probe.Event
			for _, e := range w.Timeline().Whole().Events {
				if e.Kind == probe.KindAttempt && e.Probe == "connect-"+s.id {
					atts = append(atts, e)
				}
			}
			slices.SortFunc(atts, func(a, b probe.Event) int { return int(a.Time - b.Time) })
			Expect(atts).NotTo(BeEmpty())
			if s.allowed {
				var failed []string
				for _, e := range atts {
					if e.Outcome != probe.OK {
						failed = append(failed, fmt.Sprintf("%s at %s after the create", e.Outcome, e.Time.Sub(created)))
					}
				}
				Expect(failed).To(BeEmpty(), "attempts from %s, which the policies admit", s.id)
				AddReportEntry("attempts from "+s.id+" (admitted)", fmt.Sprintf("%d, none failed", len(atts)))
				continue
			}
			first, last := -1, -1
			kinds := map[probe.Outcome]int{}
			for i, e := range atts {
				if e.Outcome != probe.OK {
					kinds[e.Outcome]++
					if first < 0 {
						first = i
					}
					last = i
				}
			}
			Expect(first).NotTo(Equal(-1), "no attempt from %s was denied", s.id)
			Expect(atts[first].Time.After(created)).To(BeTrue(), "%s denied before the create", s.id)
			Expect(atts[last].Time.Before(deleted.Add(30 * time.Second))).To(BeTrue())
			for _, e := range atts[first : last+1] {
				Expect(e.Outcome).NotTo(Equal(probe.OK), "%s reached x/a at %s after the create, between the first denied attempt and the last", s.id, e.Time.Sub(created))
			}
			Expect(last+1).To(BeNumerically("<", len(atts)), "%s never reached x/a again after the delete", s.id)
			enforce := atts[first].Time.Sub(created)
			restore := atts[last+1].Time.Sub(deleted)
			AddReportEntry("latency for "+s.id, fmt.Sprintf("create to first denied attempt %s (last admitted attempt started %s after the create); delete to first admitted attempt %s; failed %v",
				enforce.Round(time.Millisecond), atts[first-1].Time.Sub(created).Round(time.Millisecond), restore.Round(time.Millisecond), kinds))
			GinkgoWriter.Printf("%s: enforced %s after the create, restored %s after the delete, %v\n", s.id, enforce, restore, kinds)
		}
		AddReportEntry("how the matrix's denied tries failed", fmt.Sprint(denials))
	}, SpecTimeout(2*time.Minute))

	It("removes its chains and ipsets on cleanup, and never touched the host", func(ctx SpecContext) {
		Expect(hostNames(ctx)).To(BeEmpty())
		// Enforcing again, so that cleanup has something to remove and its effect shows.
		nps := topo.Kube().NetworkingV1().NetworkPolicies("x")
		for _, np := range []*networkingv1.NetworkPolicy{allowFromB, defaultDeny} {
			_, err := nps.Create(ctx, np, metav1.CreateOptions{})
			Expect(err).NotTo(HaveOccurred())
		}
		Eventually(matrix).WithContext(ctx).WithTimeout(30 * time.Second).WithPolling(200 * time.Millisecond).Should(Equal(enforced()))
		for _, n := range topo.Nodes() {
			Expect(w.Driver.Cleanup(ctx, harness.NodeEnv(n))).To(Succeed())
			st, err := w.Driver.Status(ctx, harness.NodeEnv(n))
			Expect(err).NotTo(HaveOccurred())
			Expect(st.Running).To(BeFalse())
			a := agentOn(n)
			Expect(a.Programmed(ctx)).To(BeEmpty())
			for _, cmd := range []string{"iptables-save", "ip6tables-save"} {
				out, err := topologies.Output(ctx, n, cmd)
				Expect(err).NotTo(HaveOccurred())
				for _, p := range chainPrefixes {
					Expect(string(out)).NotTo(ContainSubstring(p))
				}
			}
			for _, name := range []string{PIDFile, LogFile} {
				Expect(a.path(name)).NotTo(BeAnExistingFile())
			}
			// Idempotent.
			Expect(w.Driver.Cleanup(ctx, harness.NodeEnv(n))).To(Succeed())
		}
		// The policies are still there, but nothing enforces them any more.
		Expect(matrix(ctx)).To(Equal(open()))
	}, SpecTimeout(2*time.Minute))
})
