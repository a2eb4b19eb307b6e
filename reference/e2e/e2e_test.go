package e2e

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/dpconform/dpconform/fv/driver"
	"github.com/dpconform/dpconform/fv/harness"
	"github.com/dpconform/dpconform/fv/matchers"
	"github.com/dpconform/dpconform/fv/probe"
	"github.com/dpconform/dpconform/fv/timeline"
	"github.com/dpconform/dpconform/reference/faults"
	"github.com/dpconform/dpconform/topologies"
	"github.com/dpconform/dpconform/topologies/netns"
)

const (
	echoPort = 8080
	svcPort  = 80
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
		nodeA = topo.Nodes()[0]
		nodeB := topo.Nodes()[1]

		pods := map[string]topologies.Pod{}
		for _, spec := range []topologies.PodSpec{
			{Name: "web-a", Node: nodeA.Name(), Labels: map[string]string{"app": "web-a"}},
			{Name: "web-b", Node: nodeB.Name(), Labels: map[string]string{"app": "web-b"}},
			{Name: "client-a", Node: nodeA.Name()},
			{Name: "client-b", Node: nodeB.Name()},
		} {
			p, err := topo.AddPod(ctx, spec)
			Expect(err).NotTo(HaveOccurred())
			pods[spec.Name] = p
		}
		for _, name := range []string{"web-a", "web-b"} {
			_, err := w.StartProbe(ctx, pods[name], probe.Serve{Name: name, TCP: []int{echoPort}})
			Expect(err).NotTo(HaveOccurred())
		}
		nodePort := map[string]int32{}
		clusterIP := map[string]string{}
		for _, name := range []string{"web-a", "web-b"} {
			svc, err := topologies.CreateService(ctx, topo.Kube(), &corev1.Service{
				ObjectMeta: metav1.ObjectMeta{Name: name},
				Spec: corev1.ServiceSpec{
					Type:     corev1.ServiceTypeNodePort,
					Selector: map[string]string{"app": name},
					Ports:    []corev1.ServicePort{{Name: "tcp", Port: svcPort, TargetPort: intstr.FromInt32(echoPort), Protocol: corev1.ProtocolTCP}},
				},
			})
			Expect(err).NotTo(HaveOccurred())
			Expect(topologies.WaitForEndpoints(ctx, topo.Kube(), "default", name, pods[name])).To(Succeed())
			nodePort[name] = svc.Spec.Ports[0].NodePort
			clusterIP[name] = svc.Spec.ClusterIP
		}
		hp := func(ip string, port int32) string { return net.JoinHostPort(ip, strconv.Itoa(int(port))) }
		targets = []target{
			{"clusterip-local", pods["client-a"], hp(clusterIP["web-a"], svcPort), "web-a"},
			{"clusterip-remote", pods["client-a"], hp(clusterIP["web-b"], svcPort), "web-b"},
			{"nodeport-local", topo.External(), hp(nodeA.IP().String(), nodePort["web-a"]), "web-a"},
			{"nodeport-remote", topo.External(), hp(nodeA.IP().String(), nodePort["web-b"]), "web-b"},
		}
		direct = []target{
			{"pod-pod-same-node", pods["client-a"], hp(pods["web-a"].IP().String(), echoPort), "web-a"},
			{"pod-pod-cross-node", pods["client-a"], hp(pods["web-b"].IP().String(), echoPort), "web-b"},
		}
		Expect(w.StartAll(ctx)).To(Succeed())
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
})
