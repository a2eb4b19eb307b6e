package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/dpconform/dpconform/driver"
	"github.com/dpconform/dpconform/driver/drivertest"
	"github.com/dpconform/dpconform/driver/skel"
	"github.com/dpconform/dpconform/fv/harness"
	"github.com/dpconform/dpconform/fv/matchers"
	"github.com/dpconform/dpconform/fv/probe"
	"github.com/dpconform/dpconform/fv/timeline"
	"github.com/dpconform/dpconform/fv/workloads"
	"github.com/dpconform/dpconform/topologies"
	"github.com/dpconform/dpconform/topologies/netns"
)

// skelNode is a node environment for what needs one but no node.
func skelNode() skel.Node { return skel.Node{Name: "none"} }

var _ = Describe("the driver's facts and refusals", func() {
	// A well-formed node environment, pointing at files that exist but are no node.
	var good []string
	BeforeEach(func() { good = drivertest.NodeEnv(GinkgoT(), "DPC_BPFFS") })

	It("claims the Core profile with Cilium's own CNI plugin", func() {
		code, out := drivertest.Call(driverPath, nil, "info")
		Expect(code).To(Equal(0))
		Expect(out).To(HaveKeyWithValue("name", "cilium"))
		Expect(out).To(HaveKeyWithValue("version", Version))
		Expect(out).To(HaveKeyWithValue("profiles", ConsistOf("Core")))
		Expect(out).To(HaveKeyWithValue("features", ConsistOf("ClusterIP", "NodePort", "NodePortRemoteBackend", "TCP", "UDP")))
		Expect(out).To(HaveKeyWithValue("cni_dir", filepath.Join(Dir(), "cni")))
		cni, err := json.Marshal(out["cni"])
		Expect(err).NotTo(HaveOccurred())
		Expect(string(cni)).To(And(ContainSubstring(`"type":"cilium-cni"`), ContainSubstring("${STATE_DIR}")))
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
		Entry("no install", func() []string { return append(good, EnvDir+"=/nonexistent/cilium") }, []string{"start"}, "missing binary", "/nonexistent/cilium/cilium-agent", "make cilium"),
		Entry("no clang", func() []string { return append(good, EnvClang+"=/nonexistent/clang") }, []string{"start"}, "missing binary", "/nonexistent/clang", "make cilium"),
		// The suite runs node verbs inside the node; run in the host's namespaces,
		// the agent would change the host, and the driver refuses before it does
		// anything.
		Entry("a start outside a node", func() []string { return good }, []string{"start"}, "start failed", "not inside a node", "host's mnt namespace"),
		Entry("a cleanup outside a node", func() []string { return good }, []string{"cleanup"}, "cleanup failed", "not inside a node"),
		Entry("a mode", func() []string { return good }, []string{"start", "--mode", "iptables"}, "not offered", `does not offer mode "iptables"`),
		Entry("events", func() []string { return good }, []string{"events"}, "unsupported", "Observability"),
	)
})

// hostState is what of the host Cilium could change if it escaped its node: the two
// host-wide sysctls it writes, its pins in the host's bpffs, its runtime directory,
// its programs on a cgroup outside the run's nodes, its devices and chains in the
// host's network namespace. It must be the same before, during and after a run.
func hostState(ctx context.Context) map[string]string {
	GinkgoHelper()
	out := map[string]string{}
	for _, p := range hostSysctls {
		data, err := os.ReadFile(p)
		Expect(err).NotTo(HaveOccurred())
		out[p] = strings.TrimSpace(string(data))
	}
	for _, p := range []string{"/sys/fs/bpf/tc", "/sys/fs/bpf/cilium", "/run/cilium", "/var/lib/cilium"} {
		_, err := os.Lstat(p)
		out[p] = fmt.Sprint("exists: ", err == nil)
	}
	root, err := cgroup2Mount()
	Expect(err).NotTo(HaveOccurred())
	progs, err := cgroupPrograms(ctx, root)
	Expect(err).NotTo(HaveOccurred())
	var outside []string
	for _, p := range progs {
		// The run's nodes are dpconform/<run>/<node>; anything else is the host's.
		if !strings.HasPrefix(p.Cgroup, "/dpconform/") && !strings.HasPrefix(p.Cgroup, "dpconform/") {
			outside = append(outside, p.String())
		}
	}
	out["cgroup programs outside the nodes"] = strings.Join(outside, ", ")
	links, err := linkNames(ctx)
	Expect(err).NotTo(HaveOccurred())
	out["host links"] = strings.Join(slices.DeleteFunc(links, func(l string) bool { return !isCiliumLink(l) }), ", ")
	chains, err := iptablesChains(ctx)
	Expect(err).NotTo(HaveOccurred())
	out["host chains"] = strings.Join(chains, ", ")
	return out
}

// envProgrammed makes the test binary, run inside a node, print what Programmed finds
// there (as JSON) and exit: the driver's own code, where the driver runs it.
const envProgrammed = "CILIUM_DRIVER_TEST_PROGRAMMED"

func init() {
	if os.Getenv(envProgrammed) == "" {
		return
	}
	a := newAgent(Dir(), Clang(), skel.Node{StateDir: os.Getenv("DPC_STATE_DIR"), BPFFS: os.Getenv("DPC_BPFFS")})
	prog, err := a.Programmed(context.Background())
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	_ = json.NewEncoder(os.Stdout).Encode(prog)
	os.Exit(0)
}

// programmed lists what of Cilium's is in node n, seen from inside it.
func programmed(ctx context.Context, n topologies.Node) []string {
	GinkgoHelper()
	cmd := exec.CommandContext(ctx, os.Args[0])
	cmd.Env = append(append(os.Environ(), n.DriverEnv()...), envProgrammed+"=1")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	Expect(n.Start(cmd)).To(Succeed())
	Expect(cmd.Wait()).To(Succeed(), "Programmed in %s: %s", n.Name(), stderr.String())
	var out []string
	Expect(json.Unmarshal(stdout.Bytes(), &out)).To(Succeed())
	return out
}

// target is one way to reach a backend: a client host and an address.
type target struct {
	name    string
	from    topologies.Host
	addr    string
	backend string
}

var _ = Describe("Cilium through its driver", Ordered, ContinueOnFailure, func() {
	var (
		topo    *netns.Topology
		w       *harness.World
		targets []target // ClusterIP and NodePort, local and remote backend
		before  map[string]string
	)

	BeforeAll(func(ctx SpecContext) {
		before = hostState(ctx)
		drv := drivertest.NewExec(driverPath)
		info, err := drv.Info(ctx)
		Expect(err).NotTo(HaveOccurred())
		topo, err = netns.New(ctx, netns.Options{CNIConfig: info.CNI, CNIDirs: info.CNIDirs(), Logf: func(f string, a ...any) { GinkgoWriter.Printf(f+"\n", a...) }})
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func(ctx SpecContext) {
			id := topo.RunID()
			Expect(topo.Close()).To(Succeed())
			Expect(netns.Leftovers("", id)).To(BeEmpty())
			Expect(hostState(ctx)).To(Equal(before), "the host after the run")
		}, NodeTimeout(time.Minute))
		prog, err := probe.Self()
		Expect(err).NotTo(HaveOccurred())
		w = harness.New(topo, drv, prog)
		w.ProbeStderr = GinkgoWriter
		DeferCleanup(func(ctx SpecContext) { Expect(w.Cleanup(ctx)).To(Succeed()) }, NodeTimeout(2*time.Minute))
		begin := time.Now()
		Expect(w.StartAll(ctx)).To(Succeed())
		AddReportEntry("start to ready, every node", time.Since(begin).Round(time.Millisecond).String())
		f, err := workloads.DeployCore(ctx, w, workloads.DefaultWarm)
		Expect(err).NotTo(HaveOccurred())
		for _, fl := range f.ServiceFlows(topo) {
			targets = append(targets, target{fl.Name, fl.From, fl.Target, fl.Backend})
		}
	}, NodeTimeout(3*time.Minute))

	AfterEach(func(ctx SpecContext) {
		if !CurrentSpecReport().Failed() {
			return
		}
		dir := filepath.Join(drivertest.ArtifactsDir("cilium-driver"), strings.NewReplacer(" ", "_", "/", "_").Replace(CurrentSpecReport().FullText()))
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

	It("programs its nodes from eBPF, and never the host", func(ctx SpecContext) {
		for _, n := range topo.Nodes() {
			Expect(programmed(ctx, n)).To(ContainElements(
				"link cilium_host",
				"tc eth0 tcx/ingress cil_from_netdev",
				// The socket load-balancer, on the node's own cgroup (its root).
				"cgroup / cgroup_inet4_connect cil_sock4_connect",
				"bpffs /sys/fs/bpf/tc",
			), "on %s", n.Name())
			// The two host-wide sysctls are read-only inside the node, and the agent
			// said that it could not write them.
			_, err := topologies.Output(ctx, n, "sh", "-c", "echo 0 > /proc/sys/kernel/timer_migration")
			Expect(err).To(MatchError(ContainSubstring("Read-only file system")))
			log, err := os.ReadFile(filepath.Join(stateDir(n), LogFile))
			Expect(err).NotTo(HaveOccurred())
			Expect(string(log)).To(ContainSubstring("Failed to write sysctl setting"))
		}
		Expect(hostState(ctx)).To(Equal(before), "the host while Cilium runs")
	}, SpecTimeout(time.Minute))

	It("keeps serving while stopped, and is ready again after a restart", func(ctx SpecContext) {
		for _, n := range topo.Nodes() {
			Expect(w.Stop(ctx, n)).To(Succeed())
			st, err := w.Driver.Status(ctx, harness.NodeEnv(n))
			Expect(err).NotTo(HaveOccurred())
			Expect(st).To(Equal(driver.Status{Running: false, Ready: false}))
		}
		connectAll(ctx, 50)
		begin := time.Now()
		Expect(w.StartAll(ctx)).To(Succeed())
		AddReportEntry("restart: start to ready, every node", time.Since(begin).Round(time.Millisecond).String())
		connectAll(ctx, 50)
	}, SpecTimeout(3*time.Minute))

	It("removes everything of Cilium's on cleanup", func(ctx SpecContext) {
		// The harness's clean-up: probes, then pods (their CNI DEL needs the agent),
		// then the driver's cleanup on every node.
		Expect(w.Cleanup(ctx)).To(Succeed())
		for _, n := range topo.Nodes() {
			st, err := w.Driver.Status(ctx, harness.NodeEnv(n))
			Expect(err).NotTo(HaveOccurred())
			Expect(st.Running).To(BeFalse())
			Expect(programmed(ctx, n)).To(BeEmpty(), "on %s", n.Name())
			// Idempotent.
			Expect(w.Driver.Cleanup(ctx, harness.NodeEnv(n))).To(Succeed())
		}
		Expect(hostState(ctx)).To(Equal(before), "the host after cleanup")
	}, SpecTimeout(3*time.Minute))
})

// stateDir is node n's state directory, as its driver sees it.
func stateDir(n topologies.Node) string {
	for _, kv := range n.DriverEnv() {
		if v, ok := strings.CutPrefix(kv, "DPC_STATE_DIR="); ok {
			return v
		}
	}
	return ""
}
