package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/dpconform/dpconform/driver/drivertest"
	"github.com/dpconform/dpconform/fv/harness"
	"github.com/dpconform/dpconform/fv/probe"
	"github.com/dpconform/dpconform/fv/workloads"
	"github.com/dpconform/dpconform/topologies"
	"github.com/dpconform/dpconform/topologies/netns"
)

// envMap is a driver environment, KEY=value strings, as a map.
func envMap(kvs []string) map[string]string {
	env := map[string]string{}
	for _, kv := range kvs {
		k, v, _ := strings.Cut(kv, "=")
		env[k] = v
	}
	return env
}

// nodeEnv is a node's driver environment as a map.
func nodeEnv(n topologies.Node) map[string]string { return envMap(n.DriverEnv()) }

// programmedOn is what of Calico's is on node n, seen from outside it. The node's
// cgroup is <cgroup2>/dpconform/<run>/<node> (docs/driver.md, Where a call runs).
func programmedOn(ctx context.Context, n topologies.Node) []string {
	GinkgoHelper()
	env := nodeEnv(n)
	root, err := cgroup2Dir()
	Expect(err).NotTo(HaveOccurred())
	cgroup := filepath.Join(root, "dpconform", env["DPC_RUN"], n.Name())
	Expect(cgroup).To(BeADirectory())
	out, err := Programmed(ctx, env["DPC_NETNS"], env["DPC_BPFFS"], cgroup)
	Expect(err).NotTo(HaveOccurred())
	return out
}

var _ = Describe("Calico Felix through its driver", Ordered, ContinueOnFailure, func() {
	var (
		topo *netns.Topology
		w    *harness.World
		f    *workloads.Core
	)
	flows := func() []workloads.Flow { return append(f.ServiceFlows(topo), f.DirectFlows()...) }

	BeforeAll(func(ctx SpecContext) {
		// The mount points the driver makes (and a killed run may have left, marked as
		// the driver's) must be gone at the end; a Calico installed on the host would
		// keep them.
		for _, p := range []string{"/usr/lib/calico", "/var/lib/calico"} {
			if _, err := os.Stat(p); err == nil {
				if _, err := os.Stat(filepath.Join(p, markerFile)); err != nil {
					Skip(p + " exists on this host and is not the driver's (Calico is installed?): the test checks that the driver leaves the host as it found it")
				}
			}
		}
		drv := drivertest.NewExec(driverPath)
		info, err := drv.Info(ctx)
		Expect(err).NotTo(HaveOccurred())
		topo, err = netns.New(ctx, netns.Options{CNIConfig: info.CNI, CNIDirs: info.CNIDirs(), Logf: func(f string, a ...any) { GinkgoWriter.Printf(f+"\n", a...) }})
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func(ctx SpecContext) {
			id := topo.RunID()
			Expect(topo.Close()).To(Succeed())
			Expect(netns.Leftovers("", id)).To(BeEmpty())
			for _, p := range []string{"/usr/lib/calico", "/var/lib/calico"} {
				Expect(p).NotTo(BeAnExistingFile(), "the driver's mount point on the host after the run")
			}
		}, NodeTimeout(time.Minute))
		for _, n := range topo.Nodes() {
			Expect(programmedOn(ctx, n)).To(BeEmpty(), "a fresh node holds something of Calico's")
		}
		prog, err := probe.Self()
		Expect(err).NotTo(HaveOccurred())
		w = harness.New(topo, drv, prog)
		w.ProbeStderr = GinkgoWriter
		DeferCleanup(func(ctx SpecContext) { Expect(w.Cleanup(ctx)).To(Succeed()) }, NodeTimeout(2*time.Minute))
		begin := time.Now()
		Expect(w.StartAll(ctx)).To(Succeed())
		AddReportEntry("start to ready, every node", time.Since(begin).Round(time.Millisecond).String())
	}, NodeTimeout(3*time.Minute))

	AfterEach(func(ctx SpecContext) {
		if !CurrentSpecReport().Failed() || w == nil {
			return
		}
		dir := filepath.Join(drivertest.ArtifactsDir("calico-driver"), strings.NewReplacer(" ", "_", "/", "_").Replace(CurrentSpecReport().FullText()))
		files, err := w.Collect(ctx, dir)
		AddReportEntry("diagnostics", fmt.Sprintf("%d files in %s (collect error: %v)", len(files), dir, err))
	}, NodeTimeout(time.Minute))

	It("serves ClusterIPs, NodePorts (local and remote backend) and pod-to-pod from eBPF", func(ctx SpecContext) {
		var err error
		f, err = workloads.DeployCore(ctx, w, workloads.DefaultWarm)
		Expect(err).NotTo(HaveOccurred())
		Expect(workloads.WaitAllFlowing(ctx, w, workloads.DefaultWarm, f.DirectFlows()...)).To(Succeed())
		for _, n := range topo.Nodes() {
			Expect(programmedOn(ctx, n)).To(ContainElements(
				HavePrefix("tcx ingress eth0 "), HavePrefix("tcx egress eth0 "), HavePrefix("link cali"), HavePrefix("bpffs "),
				HavePrefix("cgroup connect4 "), MatchRegexp(`^ip6?tables(-legacy|-nft)? filter cali-`)),
				"Felix's programs on %s", n.Name())
		}
	}, SpecTimeout(3*time.Minute))

	It("stops, is killed and starts again, and keeps serving", func(ctx SpecContext) {
		n := topo.Nodes()[0]
		begin := time.Now()
		Expect(w.Stop(ctx, n)).To(Succeed())
		AddReportEntry("stop to exited", time.Since(begin).Round(time.Millisecond).String())
		st, err := w.Driver.Status(ctx, harness.NodeEnv(n))
		Expect(err).NotTo(HaveOccurred())
		Expect(st.Running).To(BeFalse())
		Expect(w.StartOn(ctx, []topologies.Node{n})).To(Succeed())
		Expect(w.Driver.Kill(ctx, harness.NodeEnv(n))).To(Succeed())
		st, err = w.Driver.Status(ctx, harness.NodeEnv(n))
		Expect(err).NotTo(HaveOccurred())
		Expect(st.Running).To(BeFalse())
		begin = time.Now()
		Expect(w.StartOn(ctx, []topologies.Node{n})).To(Succeed())
		AddReportEntry("after a kill: start to ready", time.Since(begin).Round(time.Millisecond).String())
		Expect(workloads.WaitAllFlowing(ctx, w, workloads.DefaultWarm, flows()...)).To(Succeed())
	}, SpecTimeout(3*time.Minute))

	It("removes everything of Calico's from the node on cleanup, and again", func(ctx SpecContext) {
		// As a run ends: the probes and servers stop, the pods go (their CNI DEL asks
		// the API server), then the driver cleans every node up.
		Expect(w.Cleanup(ctx)).To(Succeed())
		for _, n := range topo.Nodes() {
			st, err := w.Driver.Status(ctx, harness.NodeEnv(n))
			Expect(err).NotTo(HaveOccurred())
			Expect(st.Running).To(BeFalse())
			Expect(programmedOn(ctx, n)).To(BeEmpty())
			Expect(filepath.Join(nodeEnv(n)["DPC_STATE_DIR"], "calico")).NotTo(BeAnExistingFile())
			Expect(w.Driver.Cleanup(ctx, harness.NodeEnv(n))).To(Succeed(), "a second cleanup")
		}
		for _, p := range []string{"/usr/lib/calico", "/var/lib/calico"} {
			Expect(p).NotTo(BeAnExistingFile(), "the driver's mount point on the host, once no Felix runs")
		}
	}, SpecTimeout(3*time.Minute))
})
