package main

import (
	"net"
	"os"
	"strconv"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/dpconform/dpconform/fv/harness"
	"github.com/dpconform/dpconform/fv/kubeproxy"
	"github.com/dpconform/dpconform/fv/probe"
	"github.com/dpconform/dpconform/fv/timeline"
	"github.com/dpconform/dpconform/topologies"
	"github.com/dpconform/dpconform/topologies/netns"
)

var _ = Describe("SCRATCH", Ordered, func() {
	mode := kubeproxy.Mode(os.Getenv("SCRATCH_MODE"))
	var (
		topo    *netns.Topology
		w       *harness.World
		nodeA   topologies.Node
		targets []target
	)
	BeforeAll(func(ctx SpecContext) {
		drv := newDriver(EnvMode + "=" + string(mode))
		info, err := drv.Info(ctx)
		Expect(err).NotTo(HaveOccurred())
		topo, err = netns.New(ctx, netns.Options{CNIConfig: info.CNI})
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
		DeferCleanup(func(ctx SpecContext) {
			if os.Getenv("SCRATCH_KEEPLOG") != "" {
				f, _ := kubeproxy.ForNode(nodeA, mode)
				data, _ := os.ReadFile(f.Path(kubeproxy.LogFile))
				os.WriteFile("/tmp/kpx/kp-"+string(mode)+".log", data, 0o644)
			}
			Expect(w.Cleanup(ctx)).To(Succeed())
		}, NodeTimeout(time.Minute))
		nodeA = topo.Nodes()[0]
		nodeB := topo.Nodes()[1]
		pods := map[string]topologies.Pod{}
		for _, spec := range []topologies.PodSpec{
			{Name: "web-a", Node: nodeA.Name(), Labels: map[string]string{"app": "web-a"}},
			{Name: "web-b", Node: nodeB.Name(), Labels: map[string]string{"app": "web-b"}},
			{Name: "client-a", Node: nodeA.Name()},
		} {
			p, err := topo.AddPod(ctx, spec)
			Expect(err).NotTo(HaveOccurred())
			pods[spec.Name] = p
		}
		nodePort := map[string]int32{}
		clusterIP := map[string]string{}
		for _, name := range []string{"web-a", "web-b"} {
			_, err := w.StartProbe(ctx, pods[name], probe.Serve{Name: name, TCP: []int{echoPort}})
			Expect(err).NotTo(HaveOccurred())
			svc, err := topologies.CreateService(ctx, topo.Kube(), &corev1.Service{
				ObjectMeta: metav1.ObjectMeta{Name: name},
				Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeNodePort, Selector: map[string]string{"app": name},
					Ports: []corev1.ServicePort{{Name: "tcp", Port: svcPort, TargetPort: intstr.FromInt32(echoPort), Protocol: corev1.ProtocolTCP}}},
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
		Expect(w.StartAll(ctx)).To(Succeed())
	}, NodeTimeout(2*time.Minute))

	It("steady", func(ctx SpecContext) {
		w.Timeline = timeline.New()
		for _, t := range targets {
			_, err := w.StartProbe(ctx, t.from, probe.Connect{Name: t.name, Target: t.addr, Interval: 2 * time.Millisecond})
			Expect(err).NotTo(HaveOccurred())
		}
		time.Sleep(20 * time.Second)
		Expect(w.StopProbes(ctx)).To(Succeed())
		GinkgoWriter.Printf("STEADY %s:\n%s", mode, figures(w.Timeline.Whole()))
	}, SpecTimeout(time.Minute))

	It("restarts", func(ctx SpecContext) {
		for i := 0; i < 6; i++ {
			crash := i%2 == 1
			w.Timeline = timeline.New()
			for _, t := range targets {
				_, err := w.StartProbe(ctx, t.from, probe.Connect{Name: t.name, Target: t.addr, Interval: 2 * time.Millisecond})
				Expect(err).NotTo(HaveOccurred())
			}
			time.Sleep(time.Second)
			Expect(w.Restart(ctx, nodeA, crash)).To(Succeed())
			time.Sleep(3 * time.Second)
			Expect(w.StopProbes(ctx)).To(Succeed())
			win, err := w.Timeline.TransitionWindow(time.Second, 3*time.Second)
			Expect(err).NotTo(HaveOccurred())
			GinkgoWriter.Printf("RESTART %s crash=%v:\n%s", mode, crash, figures(win))
		}
	}, SpecTimeout(3*time.Minute))
})
