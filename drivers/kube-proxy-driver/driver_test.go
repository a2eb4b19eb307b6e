package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/dpconform/dpconform/driver"
	"github.com/dpconform/dpconform/driver/drivertest"
	"github.com/dpconform/dpconform/drivers/kubeproxy"
	"github.com/dpconform/dpconform/fv/harness"
	"github.com/dpconform/dpconform/fv/matchers"
	"github.com/dpconform/dpconform/fv/probe"
	"github.com/dpconform/dpconform/fv/timeline"
	"github.com/dpconform/dpconform/fv/workloads"
	"github.com/dpconform/dpconform/topologies"
	"github.com/dpconform/dpconform/topologies/netns"
)

// target is one way to reach a backend: a client host and an address.
type target struct {
	name    string
	from    topologies.Host
	addr    string
	backend string
}

var _ = Describe("the driver's arguments and environment", func() {
	// A well-formed node environment, pointing at files that exist but are no node.
	var good []string
	BeforeEach(func() { good = drivertest.NodeEnv(GinkgoT()) })
	with := func(env []string, kv ...string) []string {
		out := env
		for _, s := range kv {
			k, _, _ := strings.Cut(s, "=")
			out = append(filterOut(out, k), s)
		}
		return out
	}

	It("answers info with kube-proxy's facts, leaving the pod network to the topology", func() {
		code, out := drivertest.Call(driverPath, nil, "info")
		Expect(code).To(Equal(0))
		Expect(out).To(HaveKeyWithValue("name", "kube-proxy"))
		Expect(out).To(HaveKeyWithValue("version", "v1.37.2"))
		Expect(out).To(HaveKeyWithValue("profiles", ConsistOf("Core")))
		Expect(out).To(HaveKeyWithValue("features", ContainElements("ClusterIP", "NodePort", "NodePortRemoteBackend", "TCP")))
		// No CNI configuration: the topology's default pod network (ptp and
		// host-local), which is what the agent runs beside (docs/driver.md).
		Expect(out).NotTo(HaveKey("cni"))

		code, out = drivertest.Call(driverPath, []string{EnvMode + "=nftables"}, "info")
		Expect(code).To(Equal(0))
		Expect(out).To(HaveKeyWithValue("profiles", ConsistOf("Core", "ModeSwitch")), "in nftables mode kube-proxy is what a node switches to")
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
		Entry("no verb", func() []string { return good }, nil, "usage", "verbs: info start"),
		Entry("an unknown verb", func() []string { return good }, []string{"restart"}, "unknown verb", `"restart"`),
		Entry("no node environment", func() []string { return nil }, []string{"status"}, "bad environment", "DPC_NODE, DPC_NETNS, DPC_KUBECONFIG, DPC_STATE_DIR not set"),
		Entry("a kind topology", func() []string { return with(good, "DPC_TOPOLOGY=kind") }, []string{"start"}, "unsupported topology", "DPC_TOPOLOGY=kind", "DaemonSet"),
		Entry("a state directory that is not one", func() []string { return with(good, "DPC_STATE_DIR=/nonexistent/state") }, []string{"status"}, "bad environment", "DPC_STATE_DIR=/nonexistent/state is not a directory"),
		Entry("a network namespace that is gone", func() []string { return with(good, "DPC_NETNS=/run/netns/nonexistent") }, []string{"stop"}, "bad environment", "DPC_NETNS=/run/netns/nonexistent"),
		Entry("no kube-proxy binary", func() []string { return with(good, "DPC_KUBE_PROXY=/nonexistent/kube-proxy") }, []string{"start"}, "missing binary", "/nonexistent/kube-proxy", "make control-plane", "DPC_KUBE_PROXY"),
		Entry("an unknown --mode", func() []string { return good }, []string{"start", "--mode", "ipvs"}, "not offered", `kube-proxy does not offer mode "ipvs"`, "modes: iptables, nftables"),
		Entry("an unknown DPC_KUBE_PROXY_MODE", func() []string { return with(good, "DPC_KUBE_PROXY_MODE=userspace") }, []string{"start"}, "bad arguments", `DPC_KUBE_PROXY_MODE: unknown kube-proxy mode "userspace"`),
		Entry("stray arguments", func() []string { return good }, []string{"status", "--verbose"}, "bad arguments", "--verbose"),
		Entry("collect without --dir", func() []string { return good }, []string{"collect"}, "bad arguments", "collect --dir DIR"),
		Entry("events", func() []string { return good }, []string{"events"}, "unsupported", "Observability"),
	)
})

func filterOut(env []string, key string) []string {
	var out []string
	for _, kv := range env {
		if !strings.HasPrefix(kv, key+"=") {
			out = append(out, kv)
		}
	}
	return out
}

// hostSettings are the host-global knobs kube-proxy would change with its default
// configuration, and the node's own conntrack timeouts.
func hostSettings(ctx context.Context, node topologies.Node) map[string]string {
	GinkgoHelper()
	out := map[string]string{}
	for _, p := range []string{
		"/proc/sys/net/netfilter/nf_conntrack_max",
		"/sys/module/nf_conntrack/parameters/hashsize",
		"/proc/sys/net/netfilter/nf_conntrack_tcp_timeout_established",
		"/proc/sys/net/netfilter/nf_conntrack_tcp_timeout_close_wait",
	} {
		data, err := os.ReadFile(p)
		out["host "+p] = strings.TrimSpace(string(data)) + errText(err)
	}
	for _, p := range []string{
		"/proc/sys/net/netfilter/nf_conntrack_tcp_timeout_established",
		"/proc/sys/net/netfilter/nf_conntrack_tcp_timeout_close_wait",
		"/proc/sys/net/netfilter/nf_conntrack_tcp_be_liberal",
	} {
		data, err := topologies.Output(ctx, node, "cat", p)
		out[node.Name()+" "+p] = strings.TrimSpace(string(data)) + errText(err)
	}
	_, err := os.Stat("/sys/module/ip_vs")
	out["host ip_vs module loaded"] = strconv.FormatBool(err == nil)
	return out
}

func errText(err error) string {
	if err != nil {
		return " (" + err.Error() + ")"
	}
	return ""
}

var _ = Describe("kube-proxy through its driver", func() {
	for _, mode := range kubeproxy.Modes {
		Describe(string(mode)+" mode", Ordered, ContinueOnFailure, func() {
			var (
				topo     *netns.Topology
				w        *harness.World
				nodeA    topologies.Node
				targets  []target // ClusterIP and NodePort, local and remote backend
				settings map[string]string
			)

			BeforeAll(func(ctx SpecContext) {
				drv := drivertest.NewExec(driverPath, EnvMode+"="+string(mode))
				info, err := drv.Info(ctx)
				Expect(err).NotTo(HaveOccurred())
				topo, err = netns.New(ctx, netns.Options{CNIConfig: info.CNI, CNIDirs: info.CNIDirs(), Logf: func(f string, a ...any) { GinkgoWriter.Printf(f+"\n", a...) }})
				Expect(err).NotTo(HaveOccurred())
				DeferCleanup(func() {
					id := topo.RunID()
					Expect(topo.Close()).To(Succeed())
					Expect(netns.Leftovers("", id)).To(BeEmpty())
				})
				prog, err := probe.Self()
				Expect(err).NotTo(HaveOccurred())
				w = harness.New(topo, drv, prog)
				w.ProbeStderr = GinkgoWriter
				DeferCleanup(func(ctx SpecContext) { Expect(w.Cleanup(ctx)).To(Succeed()) }, NodeTimeout(time.Minute))
				nodeA = topo.Nodes()[0]
				settings = hostSettings(ctx, nodeA)
				Expect(w.StartAll(ctx)).To(Succeed())
				f, err := workloads.DeployCore(ctx, w, workloads.DefaultWarm)
				Expect(err).NotTo(HaveOccurred())
				for _, fl := range f.ServiceFlows(topo) {
					targets = append(targets, target{fl.Name, fl.From, fl.Target, fl.Backend})
				}
			}, NodeTimeout(2*time.Minute))

			AfterEach(func(ctx SpecContext) {
				if !CurrentSpecReport().Failed() {
					return
				}
				dir := filepath.Join(drivertest.ArtifactsDir("kube-proxy-driver"), strings.NewReplacer(" ", "_", "/", "_").Replace(CurrentSpecReport().FullText()))
				files, err := w.Collect(ctx, dir)
				AddReportEntry("diagnostics", fmt.Sprintf("%d files in %s (collect error: %v)", len(files), dir, err))
			}, NodeTimeout(time.Minute))

			// connectAll makes n new connections to every target and expects each to
			// reach the right backend.
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

			// rules lists kube-proxy's chains and tables on node n.
			rules := func(ctx context.Context, n topologies.Node) []string {
				GinkgoHelper()
				f, err := harness.KubeProxyFor(n, mode)
				Expect(err).NotTo(HaveOccurred())
				r, err := f.Rules(ctx)
				Expect(err).NotTo(HaveOccurred())
				return r
			}

			It("serves ClusterIP and NodePort with local and remote backends", func(ctx SpecContext) {
				connectAll(ctx, 50)
			}, SpecTimeout(time.Minute))

			It("programs the node in its mode only, and leaves the host's settings alone", func(ctx SpecContext) {
				r := rules(ctx, nodeA)
				if mode == kubeproxy.IPTables {
					Expect(r).To(ContainElements("iptables nat KUBE-SERVICES", "iptables nat KUBE-NODEPORTS"))
					Expect(r).NotTo(ContainElement(HavePrefix("nft ")))
				} else {
					Expect(r).To(ContainElement("nft ip kube-proxy"))
					Expect(r).NotTo(ContainElement(HavePrefix("iptables ")))
				}
				Expect(hostSettings(ctx, nodeA)).To(Equal(settings))
			}, SpecTimeout(time.Minute))

			It("refuses to start in another mode while it runs", func(ctx SpecContext) {
				other := kubeproxy.NFTables
				if mode == kubeproxy.NFTables {
					other = kubeproxy.IPTables
				}
				err := w.Driver.Start(ctx, harness.NodeEnv(nodeA), driver.StartOptions{Mode: string(other)})
				Expect(err).To(MatchError(And(ContainSubstring("already running"), ContainSubstring("in "+string(mode)+" mode"))))
				// The same mode is a no-op.
				Expect(w.Driver.Start(ctx, harness.NodeEnv(nodeA), driver.StartOptions{Mode: string(mode)})).To(Succeed())
			}, SpecTimeout(time.Minute))

			It("keeps serving while stopped, its rules left in place", func(ctx SpecContext) {
				before := rules(ctx, nodeA)
				for _, n := range topo.Nodes() {
					Expect(w.Stop(ctx, n)).To(Succeed())
					st, err := w.Driver.Status(ctx, harness.NodeEnv(n))
					Expect(err).NotTo(HaveOccurred())
					Expect(st).To(Equal(driver.Status{Running: false, Ready: false}))
				}
				Expect(rules(ctx, nodeA)).To(Equal(before))
				connectAll(ctx, 50)
				Expect(w.StartAll(ctx)).To(Succeed())
			}, SpecTimeout(2*time.Minute))

			It("removes every KUBE-* chain and its nftables table on cleanup", func(ctx SpecContext) {
				for _, n := range topo.Nodes() {
					Expect(w.Driver.Cleanup(ctx, harness.NodeEnv(n))).To(Succeed())
					st, err := w.Driver.Status(ctx, harness.NodeEnv(n))
					Expect(err).NotTo(HaveOccurred())
					Expect(st.Running).To(BeFalse())
					Expect(rules(ctx, n)).To(BeEmpty())
					// Not even a jump to a KUBE-* chain remains.
					for _, cmd := range []string{"iptables-save", "ip6tables-save"} {
						out, err := topologies.Output(ctx, n, cmd)
						Expect(err).NotTo(HaveOccurred())
						Expect(string(out)).NotTo(ContainSubstring("KUBE-"))
					}
					out, err := topologies.Output(ctx, n, "nft", "list", "ruleset")
					Expect(err).NotTo(HaveOccurred())
					Expect(string(out)).NotTo(ContainSubstring("kube-proxy"))
					// Its files are gone from the node's state directory.
					f, err := harness.KubeProxyFor(n, mode)
					Expect(err).NotTo(HaveOccurred())
					for _, name := range []string{kubeproxy.ConfigFile, kubeproxy.PIDFile, kubeproxy.LogFile} {
						Expect(f.Path(name)).NotTo(BeAnExistingFile())
					}
				}
				// With the rules gone, nothing answers on the NodePort any more.
				tl := timeline.New()
				p, err := probe.Start(ctx, topo.External(), w.Probe, probe.Connect{Name: "after-cleanup", Target: targets[2].addr, Count: 5, Interval: 10 * time.Millisecond}, probe.Options{OnEvent: tl.Add, Stderr: GinkgoWriter})
				Expect(err).NotTo(HaveOccurred())
				Eventually(p.Done()).WithContext(ctx).Should(BeClosed())
				Expect(tl.Whole()).NotTo(matchers.HaveNoFailedAttempts())
				Expect(hostSettings(ctx, nodeA)).To(Equal(settings))
			}, SpecTimeout(time.Minute))
		})
	}
})
