package netns_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os/exec"
	"regexp"
	"strings"
	"syscall"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/dpconform/dpconform/topologies"
	"github.com/dpconform/dpconform/topologies/netns"
)

// serve starts an echo server that answers with its host's name on port 8080 of h.
func serve(h topologies.Host) *exec.Cmd {
	name, args := roleCmd("echo", ":8080", h.Name())
	cmd := exec.Command(name, args...)
	out, err := cmd.StdoutPipe()
	Expect(err).NotTo(HaveOccurred())
	Expect(h.Start(cmd)).To(Succeed())
	DeferCleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	Eventually(lines(out)).WithTimeout(5 * time.Second).Should(Receive(Equal("listening")))
	return cmd
}

// dial connects from h to addr:8080 and returns who answered.
func dial(ctx context.Context, from topologies.Host, to string) (string, error) {
	name, args := roleCmd("dial", net.JoinHostPort(to, "8080"))
	out, err := topologies.Output(ctx, from, name, args...)
	return string(out), err
}

var _ = Describe("a 2-node netns topology", Ordered, func() {
	var (
		topo *netns.Topology
		pods []topologies.Pod
		ctx  context.Context
	)

	BeforeAll(func(sctx SpecContext) {
		var err error
		topo, err = netns.New(sctx, netns.Options{Logf: func(f string, a ...any) { GinkgoWriter.Printf(f+"\n", a...) }})
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func() {
			id, dir := topo.RunID(), topo.Dir()
			Expect(topo.Close()).To(Succeed())
			Expect(netns.Leftovers("", id)).To(BeEmpty(), "run directory was %s", dir)
		})
		for i, n := range []string{"node-a", "node-a", "node-b", "node-b"} {
			p, err := topo.AddPod(sctx, topologies.PodSpec{Name: fmt.Sprintf("web-%d", i), Node: n, Labels: map[string]string{"app": "web"}})
			Expect(err).NotTo(HaveOccurred())
			pods = append(pods, p)
		}
	}, NodeTimeout(90*time.Second))

	BeforeEach(func() {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(context.Background(), 30*time.Second)
		DeferCleanup(cancel)
	})

	It("gives pods addresses from their node's pod CIDR", func() {
		for _, p := range pods {
			Expect(topo.Node(p.NodeName()).PodCIDR().Contains(p.IP())).To(BeTrue(), "%s has %s", p.Name(), p.IP())
		}
	})

	It("routes pod to pod on one node and across nodes, and the external client to a node", func() {
		serve(pods[1])
		serve(pods[2])
		serve(topo.Nodes()[1])
		Expect(dial(ctx, pods[0], pods[1].IP().String())).To(Equal("web-1"), "same node")
		Expect(dial(ctx, pods[0], pods[2].IP().String())).To(Equal("web-2"), "across nodes")
		Expect(dial(ctx, pods[3], pods[1].IP().String())).To(Equal("web-1"), "across nodes, the other way")
		Expect(dial(ctx, topo.External(), topo.Nodes()[1].IP().String())).To(Equal("node-b"), "external to node")
	})

	It("keeps the external client out of the pod network", func() {
		serve(pods[0])
		_, err := dial(ctx, topo.External(), pods[0].IP().String())
		Expect(err).To(HaveOccurred(), "the external client has no route to pods; only the dataplane's NodePorts reach them")
	})

	It("registers Nodes and Pods with the right IPs", func() {
		nodes, err := topo.Kube().CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		Expect(err).NotTo(HaveOccurred())
		Expect(nodes.Items).To(HaveLen(2))
		for _, n := range nodes.Items {
			tn := topo.Node(n.Name)
			Expect(tn).NotTo(BeNil())
			Expect(n.Spec.PodCIDR).To(Equal(tn.PodCIDR().String()))
			Expect(n.Status.Addresses).To(ContainElement(corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: tn.IP().String()}))
		}
		list, err := topo.Kube().CoreV1().Pods("default").List(ctx, metav1.ListOptions{})
		Expect(err).NotTo(HaveOccurred())
		Expect(list.Items).To(HaveLen(len(pods)))
		for _, p := range pods {
			obj, err := topo.Kube().CoreV1().Pods("default").Get(ctx, p.Name(), metav1.GetOptions{})
			Expect(err).NotTo(HaveOccurred())
			Expect(obj.Spec.NodeName).To(Equal(p.NodeName()))
			Expect(obj.Status.PodIP).To(Equal(p.IP().String()))
			Expect(obj.Status.Conditions).To(ContainElement(HaveField("Type", corev1.PodReady)))
		}
	})

	It("lists ready pods in a Service's EndpointSlices, through the real controller", func() {
		svc, err := topologies.CreateService(ctx, topo.Kube(), &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: "web"},
			Spec: corev1.ServiceSpec{
				Selector: map[string]string{"app": "web"},
				Type:     corev1.ServiceTypeNodePort,
				Ports:    []corev1.ServicePort{{Port: 80, TargetPort: intstr.FromInt32(8080), Protocol: corev1.ProtocolTCP}},
			},
		})
		Expect(err).NotTo(HaveOccurred())
		Expect(svc.Spec.ClusterIP).NotTo(BeEmpty())
		Expect(svc.Spec.Ports[0].NodePort).NotTo(BeZero())
		Expect(topologies.WaitForEndpoints(ctx, topo.Kube(), "default", "web", pods...)).To(Succeed())

		By("removing a pod, which leaves the Service's endpoints")
		Expect(topo.RemovePod(ctx, pods[3])).To(Succeed())
		Expect(topologies.WaitForEndpoints(ctx, topo.Kube(), "default", "web", pods[:3]...)).To(Succeed())
		pods = pods[:3]
	})

	// How a removed pod's connections end is what SVC-ENDPOINT-VANISH judges a
	// dataplane by: RemovePod closes them (FIN), VanishPod leaves them silent.
	It("ends a removed pod's connections with a FIN, and a vanished pod's with nothing", func() {
		watch := func(server topologies.Pod) (<-chan string, func()) {
			name, args := roleCmd("hold", ":8080")
			hold := exec.Command(name, args...)
			out, err := hold.StdoutPipe()
			Expect(err).NotTo(HaveOccurred())
			Expect(server.Start(hold)).To(Succeed())
			DeferCleanup(func() { hold.Process.Kill(); hold.Wait() })
			said := lines(out)
			Eventually(said).WithTimeout(5 * time.Second).Should(Receive(Equal("listening")))
			name, args = roleCmd("watch", net.JoinHostPort(server.IP().String(), "8080"))
			cli := exec.Command(name, args...)
			cout, err := cli.StdoutPipe()
			Expect(err).NotTo(HaveOccurred())
			Expect(pods[0].Start(cli)).To(Succeed())
			DeferCleanup(func() { cli.Process.Kill(); cli.Wait() })
			got := lines(cout)
			Eventually(got).WithTimeout(5 * time.Second).Should(Receive(Equal("connected")))
			// The client's connect returns when the handshake does, before the server's
			// Accept; a server killed with the connection still queued resets it.
			Eventually(said).WithTimeout(5 * time.Second).Should(Receive(Equal("held")))
			return got, func() { cli.Process.Kill() }
		}
		for _, vanish := range []bool{false, true} {
			p, err := topo.AddPod(ctx, topologies.PodSpec{Name: fmt.Sprintf("held-%v", vanish), Node: "node-b"})
			Expect(err).NotTo(HaveOccurred())
			ended, _ := watch(p)
			if !vanish {
				Expect(topo.RemovePod(ctx, p)).To(Succeed())
				Eventually(ended).WithTimeout(2 * time.Second).Should(Receive(Equal("fin")))
				continue
			}
			Expect(topo.VanishPod(ctx, p)).To(Succeed())
			Consistently(ended).WithTimeout(time.Second).ShouldNot(Receive(), "the client heard from a pod that vanished")
			_, err = topo.Kube().CoreV1().Pods("default").Get(ctx, p.Name(), metav1.GetOptions{})
			Expect(apierrors.IsNotFound(err)).To(BeTrue(), "the vanished pod's object is left: %v", err)
		}
	})

	It("starts a pod's container (OnWired) once it is wired, before its status names its IP", func() {
		serve(pods[1])
		var ranWith, dialled string
		p, err := topo.AddPod(ctx, topologies.PodSpec{Name: "early", Namespace: "wired", Node: "node-a",
			OnWired: func(ctx context.Context, p topologies.Pod) error {
				obj, err := topo.Kube().CoreV1().Pods("wired").Get(ctx, "early", metav1.GetOptions{})
				if err != nil {
					return err
				}
				ranWith = obj.Status.PodIP
				dialled, err = dial(ctx, p, pods[1].IP().String())
				return err
			}})
		Expect(err).NotTo(HaveOccurred())
		Expect(ranWith).To(BeEmpty(), "the status named the pod's IP before its container started")
		Expect(dialled).To(Equal("web-1"), "the pod's network works from its first moment")
		obj, err := topo.Kube().CoreV1().Pods("wired").Get(ctx, "early", metav1.GetOptions{})
		Expect(err).NotTo(HaveOccurred())
		Expect(obj.Status.PodIP).To(Equal(p.IP().String()))

		By("failing AddPod, and leaving nothing, when the container fails to start")
		_, err = topo.AddPod(ctx, topologies.PodSpec{Name: "broken", Namespace: "wired", Node: "node-a",
			OnWired: func(context.Context, topologies.Pod) error { return errors.New("container exited") }})
		Expect(err).To(MatchError(ContainSubstring("container exited")))
		_, err = topo.Kube().CoreV1().Pods("wired").Get(ctx, "broken", metav1.GetOptions{})
		Expect(apierrors.IsNotFound(err)).To(BeTrue(), "the failed pod's object is left: %v", err)
	})

	It("adds a node's spare address and removes it, and pins a client's neighbour entry for it", func() {
		n, other, ext := topo.Nodes()[0], topo.Nodes()[1], topo.External()
		addr := n.SpareAddress()
		Expect(addr).NotTo(BeElementOf(n.IP(), other.IP(), ext.IP(), other.SpareAddress()))
		Expect(n.AddAddress(ctx, other.IP())).To(MatchError(ContainSubstring("node-b's IP")))
		addrs := func(h topologies.Host) []string {
			out, err := topologies.Output(ctx, h, "ip", "-4", "-o", "addr", "show", "dev", "eth0")
			Expect(err).NotTo(HaveOccurred())
			var got []string
			for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
				f := strings.Fields(l) // 2: eth0    inet 10.213.1.10/24 ...
				got = append(got, strings.Split(f[3], "/")[0])
			}
			return got
		}

		Expect(n.AddAddress(ctx, addr)).To(Succeed())
		Expect(other.AddAddress(ctx, addr)).To(MatchError(ContainSubstring("already added to node-a")))
		Expect(addrs(n)).To(Equal([]string{n.IP().String(), addr.String()}), "the node's IP stays its primary address")
		serve(n)
		Expect(dial(ctx, ext, addr.String())).To(Equal("node-a"), "the external client reaches the node on its new address")

		By("pinning the external client's entry for the address, which outlives the address")
		Expect(topo.PinNeighbour(ctx, ext, addr, n)).To(Succeed())
		Expect(n.RemoveAddress(ctx, addr)).To(Succeed())
		Expect(addrs(n)).To(Equal([]string{n.IP().String()}))
		link, err := topologies.Output(ctx, n, "ip", "-o", "link", "show", "dev", "eth0")
		Expect(err).NotTo(HaveOccurred())
		mac := regexp.MustCompile(`link/ether ([0-9a-f:]{17})`).FindStringSubmatch(string(link))
		Expect(mac).To(HaveLen(2), "no MAC in %s", link)
		neigh, err := topologies.Output(ctx, ext, "ip", "neigh", "show", addr.String())
		Expect(err).NotTo(HaveOccurred())
		Expect(strings.Fields(string(neigh))).To(Equal([]string{addr.String(), "dev", "eth0", "lladdr", mac[1], "PERMANENT"}))

		Expect(n.RemoveAddress(ctx, addr)).To(MatchError(ContainSubstring("did not add it")))
		Expect(topo.PinNeighbour(ctx, pods[0], addr, n)).To(MatchError(ContainSubstring("not a host on the fabric")))
	})

	It("gives each node its own bpffs at /sys/fs/bpf, its own /run and its own cgroup, and pods cgroups below it", func() {
		a, b := topo.Nodes()[0], topo.Nodes()[1]
		env := map[string]string{}
		for _, kv := range a.DriverEnv() {
			k, v, _ := strings.Cut(kv, "=")
			env[k] = v
		}
		sh := func(h topologies.Host, script string) string {
			GinkgoHelper()
			out, err := topologies.Output(ctx, h, "/bin/sh", "-ec", script)
			Expect(err).NotTo(HaveOccurred())
			return strings.TrimSpace(string(out))
		}
		// A pin under /sys/fs/bpf in node-a is in DPC_BPFFS, and node-b does not see it.
		sh(a, "mkdir /sys/fs/bpf/dpc-test && touch /run/dpc-test")
		Expect(env["DPC_BPFFS"] + "/dpc-test").To(BeADirectory())
		Expect(sh(b, "ls /sys/fs/bpf; ls /run")).NotTo(ContainSubstring("dpc-test"))
		Expect("/run/dpc-test").NotTo(BeAnExistingFile(), "node-a's /run leaked onto the host")
		Expect(sh(a, "ls /run")).To(ContainSubstring("dpc-test"))
		// Its processes run in its cgroup, which is the root of the cgroup namespace
		// they see; nothing of the host's hierarchy is visible.
		Expect(sh(a, "cat /proc/self/cgroup | grep '^0::'")).To(Equal("0::/"))
		Expect(sh(a, "ls /sys/fs/cgroup/unified 2>/dev/null || ls /sys/fs/cgroup")).NotTo(ContainSubstring("dpconform"))
		// A pod's processes are in a child cgroup of its node's, as under a kubelet.
		var onA topologies.Pod
		for _, p := range pods {
			if p.NodeName() == "node-a" {
				onA = p
			}
		}
		out, err := topologies.Output(ctx, onA, "cat", "/proc/self/cgroup")
		Expect(err).NotTo(HaveOccurred())
		Expect(string(out)).To(MatchRegexp(`0::/dpconform/` + topo.RunID() + `/node-a/kubepods/\S+`))
		// A pod made after the node is still visible in the node's /run/netns, as CNI
		// plugins need it to be.
		Expect(sh(a, "ls /run/netns")).To(ContainSubstring(topo.RunID() + "-pod-"))
	})

	It("writes a kubeconfig that works from inside a node", func() {
		n := topo.Nodes()[0]
		env := map[string]string{}
		for _, kv := range n.DriverEnv() {
			k, v, _ := strings.Cut(kv, "=")
			env[k] = v
		}
		Expect(env).To(HaveKeyWithValue("DPC_NODE", "node-a"))
		Expect(env).To(HaveKeyWithValue("DPC_TOPOLOGY", "netns"))
		Expect(env["DPC_KUBECONFIG"]).To(BeAnExistingFile())
		// The API server listens on the fabric: list Nodes with client-go from inside
		// the node, as an agent would.
		name, args := roleCmd("kube", env["DPC_KUBECONFIG"])
		out, err := topologies.Output(ctx, n, name, args...)
		Expect(err).NotTo(HaveOccurred())
		Expect(strings.Fields(string(out))).To(ConsistOf("node-a", "node-b"))
	})
})

var _ = Describe("cleaning up", func() {
	upLine := regexp.MustCompile(`run (dpc[0-9a-f]{5}): (.*)`)

	// startUp runs a topology in a subprocess and returns it with its progress lines.
	startUp := func() (*exec.Cmd, <-chan string) {
		name, args := roleCmd("up", "2", "4")
		cmd := exec.Command(name, args...)
		out, err := cmd.StdoutPipe()
		Expect(err).NotTo(HaveOccurred())
		cmd.Stderr = GinkgoWriter
		Expect(cmd.Start()).To(Succeed())
		DeferCleanup(func() { cmd.Process.Kill(); cmd.Wait() })
		return cmd, lines(out)
	}

	// waitFor reads progress until a line contains want and returns the run ID.
	waitFor := func(progress <-chan string, want string) string {
		id := ""
		deadline := time.After(60 * time.Second)
		for {
			select {
			case l, ok := <-progress:
				Expect(ok).To(BeTrue(), "the run ended before %q", want)
				GinkgoWriter.Println(l)
				if m := upLine.FindStringSubmatch(l); m != nil {
					id = m[1]
				}
				if strings.Contains(l, want) {
					Expect(id).NotTo(BeEmpty())
					return id
				}
			case <-deadline:
				Fail("no " + want + " within 60 s")
			}
		}
	}

	It("removes everything when a run gets SIGINT halfway through set-up", func() {
		cmd, progress := startUp()
		id := waitFor(progress, "creating node-b")
		Expect(cmd.Process.Signal(syscall.SIGINT)).To(Succeed())
		for range progress {
		}
		Expect(cmd.Wait()).To(HaveOccurred(), "an interrupted set-up is a failed set-up")
		Expect(netns.Leftovers("", id)).To(BeEmpty())
	})

	It("removes everything when a ready run gets SIGTERM", func() {
		cmd, progress := startUp()
		id := waitFor(progress, "ready")
		Eventually(progress).WithTimeout(60 * time.Second).Should(Receive(HavePrefix("UP")))
		Expect(cmd.Process.Signal(syscall.SIGTERM)).To(Succeed())
		for range progress {
		}
		Expect(cmd.Wait()).To(Succeed())
		Expect(netns.Leftovers("", id)).To(BeEmpty())
	})

	It("reaps a killed run with Cleanup, idempotently, and spares live runs", func() {
		live, liveProgress := startUp()
		liveID := waitFor(liveProgress, "ready")
		Eventually(liveProgress).WithTimeout(60 * time.Second).Should(Receive(HavePrefix("UP")))

		cmd, progress := startUp()
		id := waitFor(progress, "ready")
		Eventually(progress).WithTimeout(60 * time.Second).Should(Receive(HavePrefix("UP")))
		Expect(cmd.Process.Signal(syscall.SIGKILL)).To(Succeed())
		cmd.Wait()
		Expect(netns.Leftovers("", id)).NotTo(BeEmpty(), "a SIGKILLed run cannot clean up after itself")

		removed, err := netns.Cleanup(netns.CleanupOptions{})
		Expect(err).NotTo(HaveOccurred())
		Expect(removed).To(ContainElement(id))
		Expect(removed).NotTo(ContainElement(liveID), "the live run's owner is alive")
		Expect(netns.Leftovers("", id)).To(BeEmpty())
		Expect(netns.Leftovers("", liveID)).NotTo(BeEmpty())

		removed, err = netns.Cleanup(netns.CleanupOptions{})
		Expect(err).NotTo(HaveOccurred())
		Expect(removed).NotTo(ContainElement(id))

		Expect(live.Process.Signal(syscall.SIGTERM)).To(Succeed())
		for range liveProgress {
		}
		Expect(live.Wait()).To(Succeed())
		Expect(netns.Leftovers("", liveID)).To(BeEmpty())
	})
})
