package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/dpconform/dpconform/fv/driver"
	"github.com/dpconform/dpconform/fv/harness"
	"github.com/dpconform/dpconform/fv/kubeproxy"
	"github.com/dpconform/dpconform/fv/matchers"
	"github.com/dpconform/dpconform/fv/probe"
	"github.com/dpconform/dpconform/fv/timeline"
	"github.com/dpconform/dpconform/fv/workloads"
	"github.com/dpconform/dpconform/internal/privileged"
	"github.com/dpconform/dpconform/reference/faults"
	"github.com/dpconform/dpconform/topologies"
	"github.com/dpconform/dpconform/topologies/controlplane"
	"github.com/dpconform/dpconform/topologies/netns"
)

// target is one way to reach a backend: a client host and an address.
type target struct {
	name    string
	from    topologies.Host
	addr    string
	backend string
}

var _ = Describe("the reference dataplane", Ordered, ContinueOnFailure, func() {
	var (
		topo    *netns.Topology
		w       *harness.World
		nodeA   topologies.Node
		targets []target // ClusterIP and NodePort, local and remote backend
		direct  []target // pod to pod, no service
	)

	BeforeAll(func(ctx SpecContext) {
		clean := newDriver()
		info, err := clean.Info(ctx)
		Expect(err).NotTo(HaveOccurred())
		topo, err = netns.New(ctx, netns.Options{CNIConfig: info.CNI, Logf: func(f string, a ...any) { GinkgoWriter.Printf(f+"\n", a...) }})
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func() {
			id := topo.RunID()
			Expect(topo.Close()).To(Succeed())
			Expect(netns.Leftovers("", id)).To(BeEmpty())
		})
		prog, err := probe.Self()
		Expect(err).NotTo(HaveOccurred())
		w = harness.New(topo, clean, prog)
		w.ProbeStderr = GinkgoWriter
		DeferCleanup(func(ctx SpecContext) { Expect(w.Cleanup(ctx)).To(Succeed()) }, NodeTimeout(time.Minute))
		Expect(w.StartAll(ctx)).To(Succeed())
		f, err := workloads.DeployCore(ctx, w, workloads.DefaultWarm)
		Expect(err).NotTo(HaveOccurred())
		nodeA = f.NodeA
		for _, fl := range f.ServiceFlows(topo) {
			targets = append(targets, target{fl.Name, fl.From, fl.Target, fl.Backend})
		}
		for _, fl := range f.DirectFlows() {
			direct = append(direct, target{fl.Name, fl.From, fl.Target, fl.Backend})
		}
	}, NodeTimeout(3*time.Minute))

	// A failed spec leaves the implementation's diagnostics for a person to read.
	AfterEach(func(ctx SpecContext) {
		if !CurrentSpecReport().Failed() {
			return
		}
		dir := filepath.Join(artifactsDir(), strings.NewReplacer(" ", "_", "/", "_").Replace(CurrentSpecReport().LeafNodeText))
		files, err := w.Collect(ctx, dir)
		AddReportEntry("diagnostics", fmt.Sprintf("%d files in %s (collect error: %v)", len(files), dir, err))
	}, NodeTimeout(time.Minute))

	// connectAll makes n new connections to every target and expects each to reach
	// the right backend.
	connectAll := func(ctx context.Context, n int) {
		GinkgoHelper()
		for _, t := range targets {
			tl := timeline.New()
			p, err := probe.Start(ctx, t.from, w.Probe, probe.Connect{Name: t.name, Target: t.addr, Count: n, Interval: 2 * time.Millisecond}, probe.Options{OnEvent: tl.Add, Stderr: GinkgoWriter})
			Expect(err).NotTo(HaveOccurred())
			Eventually(p.Done()).WithContext(ctx).Should(BeClosed(), "connect probe %s did not finish", t.name)
			Expect(p.Err()).NotTo(HaveOccurred())
			Expect(tl.Whole()).To(matchers.HaveNoFailedAttempts(matchers.Probes(t.name), matchers.Backends(t.backend)))
		}
	}

	It("serves ClusterIP and NodePort with local and remote backends", func(ctx SpecContext) {
		connectAll(ctx, 50)
	}, SpecTimeout(time.Minute))

	It("keeps serving while the agents are stopped, and after they are killed", func(ctx SpecContext) {
		for _, n := range topo.Nodes() {
			Expect(w.Stop(ctx, n)).To(Succeed())
		}
		connectAll(ctx, 50)
		for _, n := range topo.Nodes() {
			Expect(w.Start(ctx, n)).To(Succeed())
			Expect(w.WaitReady(ctx, n)).To(Succeed())
			Expect(w.Kill(ctx, n)).To(Succeed())
		}
		connectAll(ctx, 50)
		Expect(w.StartAll(ctx)).To(Succeed())
	}, SpecTimeout(2*time.Minute))

	// restartUnderTraffic restarts node-a's agent (with drv) while new connections and
	// streams run, and returns the window of the transition.
	restartUnderTraffic := func(ctx context.Context, drv driver.Driver, crash bool) timeline.Window {
		GinkgoHelper()
		w.Timeline = timeline.New()
		for _, t := range append(append([]target{}, targets...), direct...) {
			_, err := w.StartProbe(ctx, t.from, probe.Stream{Name: "stream-" + t.name, Target: t.addr, Streams: 2})
			Expect(err).NotTo(HaveOccurred())
		}
		for _, t := range targets[2:] {
			_, err := w.StartProbe(ctx, t.from, probe.Connect{Name: "connect-" + t.name, Target: t.addr})
			Expect(err).NotTo(HaveOccurred())
		}
		time.Sleep(time.Second)
		if crash {
			Expect(w.Kill(ctx, nodeA)).To(Succeed())
		} else {
			Expect(w.Stop(ctx, nodeA)).To(Succeed())
		}
		w.Driver = drv
		Expect(w.Start(ctx, nodeA)).To(Succeed())
		Expect(w.WaitReady(ctx, nodeA)).To(Succeed())
		time.Sleep(3 * time.Second)
		Expect(w.StopProbes(ctx)).To(Succeed())
		win, err := w.Timeline.TransitionWindow(time.Second, 3*time.Second)
		Expect(err).NotTo(HaveOccurred())
		return win
	}

	for _, crash := range []bool{false, true} {
		how := "a graceful restart"
		if crash {
			how = "a crash and start"
		}
		It("keeps new connections and established streams through "+how, func(ctx SpecContext) {
			win := restartUnderTraffic(ctx, newDriver(), crash)
			Expect(win).To(matchers.HaveNoFailedAttempts())
			Expect(win).To(matchers.HaveNoResets())
			Expect(win).To(matchers.HaveStreamGapsWithin(200 * time.Millisecond))
			Expect(win).To(matchers.BeAliveAtEnd())
		}, SpecTimeout(2*time.Minute))
	}

	Context("with a fault", func() {
		AfterEach(func(ctx SpecContext) {
			// Back to a clean agent for the next spec.
			Expect(w.Stop(ctx, nodeA)).To(Succeed())
			w.Driver = newDriver()
			Expect(w.Start(ctx, nodeA)).To(Succeed())
			Expect(w.WaitReady(ctx, nodeA)).To(Succeed())
		})

		It(faults.EagerServiceSync+" erases NodePort frontends during a restart", func(ctx SpecContext) {
			win := restartUnderTraffic(ctx, newDriver(faults.EagerServiceSync), false)
			Expect(win).NotTo(matchers.HaveNoFailedAttempts(matchers.Probes("connect-nodeport-local", "connect-nodeport-remote")))
		}, SpecTimeout(2*time.Minute))

		It(faults.FlushNATOnStart+" breaks new NodePort connections during a restart", func(ctx SpecContext) {
			win := restartUnderTraffic(ctx, newDriver(faults.FlushNATOnStart), true)
			Expect(win).NotTo(matchers.HaveNoFailedAttempts(matchers.Probes("connect-nodeport-local", "connect-nodeport-remote")))
		}, SpecTimeout(2*time.Minute))

		It(faults.UnpinnedConntrack+" breaks established service streams across a restart", func(ctx SpecContext) {
			win := restartUnderTraffic(ctx, newDriver(faults.UnpinnedConntrack), false)
			Expect(win).NotTo(And(
				matchers.HaveNoResets(matchers.Probes("stream-clusterip-remote", "stream-nodeport-remote")),
				matchers.HaveStreamGapsWithin(200*time.Millisecond, matchers.Probes("stream-clusterip-remote", "stream-nodeport-remote")),
			))
		}, SpecTimeout(2*time.Minute))
	})

	// The take-over from the real kube-proxy: the agent removes kube-proxy's rules as
	// kube-proxy wrote them, and only those. What the switch does to traffic is the
	// ModeSwitch profile's (conformance); here, services keep working after it.
	It("removes a real kube-proxy's rules when it takes a node over", func(ctx SpecContext) {
		bins, _ := controlplane.FindBinaries()
		if err := bins.HasKubeProxy(); err != nil {
			if privileged.Required() {
				Fail(err.Error())
			}
			Skip("SKIPPED: " + err.Error())
		}
		Expect(w.Stop(ctx, nodeA)).To(Succeed())
		Expect(w.Driver.Cleanup(ctx, harness.NodeEnv(nodeA))).To(Succeed())
		DeferCleanup(func(ctx SpecContext) {
			out, err := topologies.Output(ctx, nodeA, "iptables", "-w", "5", "-P", "FORWARD", "ACCEPT")
			Expect(err).NotTo(HaveOccurred(), "FORWARD policy back to ACCEPT: %s", out)
		}, NodeTimeout(time.Minute))
		Expect(w.StartKubeProxy(ctx, nodeA)).To(Succeed())
		f, err := kubeproxy.ForNode(nodeA, kubeproxy.IPTables)
		Expect(err).NotTo(HaveOccurred())
		f.Dir = filepath.Join(f.Dir, harness.KubeProxyDir)
		before, err := f.Rules(ctx)
		Expect(err).NotTo(HaveOccurred())
		Expect(before).To(ContainElements("iptables nat KUBE-SERVICES", "iptables nat KUBE-NODEPORTS", "iptables filter KUBE-FORWARD", HavePrefix("iptables nat KUBE-SVC-"), HavePrefix("iptables nat KUBE-SEP-")))

		Expect(w.Switch(ctx, nodeA)).To(Succeed())
		after, err := f.Rules(ctx)
		Expect(err).NotTo(HaveOccurred())
		// kubelet's chains stay (kube-proxy only duplicates them), and so do the
		// nfacct counters, which are no rules.
		kept := `^(nfacct \S+|ip6?tables \S+ KUBE-(MARK-\S+|FIREWALL|KUBELET-CANARY|IPTABLES-HINT))$`
		for _, r := range after {
			Expect(r).To(MatchRegexp(kept), "left after the take-over (all: %q)", after)
		}
		dump, err := topologies.Output(ctx, nodeA, "iptables-save")
		Expect(err).NotTo(HaveOccurred())
		Expect(string(dump)).To(And(ContainSubstring("-j REFDP-FORWARD"), ContainSubstring(":FORWARD DROP")))
		connectAll(ctx, 20)
	}, SpecTimeout(3*time.Minute))
})
