package netns_test

import (
	"context"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/dpconform/dpconform/topologies"
	"github.com/dpconform/dpconform/topologies/netns"
)

// A CustomResourceDefinition, as an implementation registers its own (Cilium's,
// Calico's), and one of its objects.
const (
	crd = `{"apiVersion":"apiextensions.k8s.io/v1","kind":"CustomResourceDefinition",
"metadata":{"name":"widgets.example.dpconform.io"},
"spec":{"group":"example.dpconform.io","scope":"Cluster","names":{"plural":"widgets","singular":"widget","kind":"Widget"},
"versions":[{"name":"v1","served":true,"storage":true,"schema":{"openAPIV3Schema":{"type":"object","x-kubernetes-preserve-unknown-fields":true}}}]}}`
	widget = `{"apiVersion":"example.dpconform.io/v1","kind":"Widget","metadata":{"name":"w1","finalizers":["example.dpconform.io/hold"]}}`
)

var _ = Describe("a pool of control planes", Ordered, func() {
	var pool *netns.ControlPlanes
	logf := func(f string, a ...any) { GinkgoWriter.Printf(f+"\n", a...) }

	BeforeAll(func() {
		pool = netns.NewControlPlanes("", logf)
		DeferCleanup(func() {
			Expect(pool.Close()).To(Succeed())
			for _, id := range pool.Started() {
				Expect(netns.Leftovers("", id)).To(BeEmpty(), "control plane %s", id)
			}
		})
	})

	newTopo := func(ctx context.Context) *netns.Topology {
		GinkgoHelper()
		topo, err := netns.New(ctx, netns.Options{ControlPlanes: pool, Logf: logf})
		Expect(err).NotTo(HaveOccurred())
		return topo
	}
	closeTopo := func(topo *netns.Topology) {
		GinkgoHelper()
		id := topo.RunID()
		Expect(topo.Close()).To(Succeed())
		Expect(netns.Leftovers("", id)).To(BeEmpty())
	}

	var firstAPI string
	It("lends a control plane that the nodes reach, and takes back what a run made", func(ctx SpecContext) {
		topo := newTopo(ctx)
		firstAPI = topo.RESTConfig().Host
		// The nodes reach the borrowed API server through the root namespace.
		name, args := roleCmd("kube", topo.Kubeconfig())
		out, err := topologies.Output(ctx, topo.Node("node-a"), name, args...)
		Expect(err).NotTo(HaveOccurred(), "%s", out)
		Expect(strings.Fields(string(out))).To(ConsistOf("node-a", "node-b"))

		kube := topo.Kube()
		_, err = kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "x"}}, metav1.CreateOptions{})
		Expect(err).NotTo(HaveOccurred())
		_, err = topo.AddPod(ctx, topologies.PodSpec{Name: "web", Namespace: "x", Node: "node-a"})
		Expect(err).NotTo(HaveOccurred())
		_, err = kube.CoreV1().Services("x").Create(ctx, &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: "web"},
			Spec:       corev1.ServiceSpec{Type: corev1.ServiceTypeNodePort, Ports: []corev1.ServicePort{{Port: 80, TargetPort: intstr.FromInt32(8080)}}},
		}, metav1.CreateOptions{})
		Expect(err).NotTo(HaveOccurred())
		rest := kube.CoreV1().RESTClient()
		Expect(rest.Post().AbsPath("/apis/apiextensions.k8s.io/v1/customresourcedefinitions").Body([]byte(crd)).SetHeader("Content-Type", "application/json").Do(ctx).Error()).To(Succeed())
		Eventually(func() error {
			return rest.Post().AbsPath("/apis/example.dpconform.io/v1/widgets").Body([]byte(widget)).SetHeader("Content-Type", "application/json").Do(ctx).Error()
		}).WithTimeout(10 * time.Second).Should(Succeed())
		closeTopo(topo)

		topo = newTopo(ctx)
		defer closeTopo(topo)
		Expect(topo.RESTConfig().Host).To(Equal(firstAPI), "the idle control plane is lent again")
		kube = topo.Kube()
		nss, err := kube.CoreV1().Namespaces().List(ctx, metav1.ListOptions{})
		Expect(err).NotTo(HaveOccurred())
		var names []string
		for _, ns := range nss.Items {
			names = append(names, ns.Name)
		}
		Expect(names).NotTo(ContainElement("x"))
		svcs, err := kube.CoreV1().Services("").List(ctx, metav1.ListOptions{})
		Expect(err).NotTo(HaveOccurred())
		Expect(svcs.Items).To(HaveLen(1)) // default/kubernetes
		pods, err := kube.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
		Expect(err).NotTo(HaveOccurred())
		Expect(pods.Items).To(BeEmpty())
		err = rest.Get().AbsPath("/apis/apiextensions.k8s.io/v1/customresourcedefinitions/widgets.example.dpconform.io").Do(ctx).Error()
		Expect(err).To(HaveOccurred(), "the CRD a run registered is gone")
		nodes, err := kube.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		Expect(err).NotTo(HaveOccurred())
		Expect(nodes.Items).To(HaveLen(2))
		for _, n := range nodes.Items {
			Expect(n.Status.Addresses[0].Address).To(Equal(topo.Node(n.Name).IP().String()), "this run's Node, not the last run's")
		}
	}, SpecTimeout(2*time.Minute))

	It("never lends again a control plane whose state at start a run changed", func(ctx SpecContext) {
		topo := newTopo(ctx)
		Expect(topo.RESTConfig().Host).To(Equal(firstAPI))
		ns, err := topo.Kube().CoreV1().Namespaces().Get(ctx, "default", metav1.GetOptions{})
		Expect(err).NotTo(HaveOccurred())
		ns.Labels = map[string]string{"changed-by": "a-run"}
		_, err = topo.Kube().CoreV1().Namespaces().Update(ctx, ns, metav1.UpdateOptions{})
		Expect(err).NotTo(HaveOccurred())
		closeTopo(topo)

		topo = newTopo(ctx)
		defer closeTopo(topo)
		Expect(topo.RESTConfig().Host).NotTo(Equal(firstAPI), "a fresh control plane, not the changed one")
		ns, err = topo.Kube().CoreV1().Namespaces().Get(ctx, "default", metav1.GetOptions{})
		Expect(err).NotTo(HaveOccurred())
		Expect(ns.Labels).NotTo(HaveKey("changed-by"))
	}, SpecTimeout(2*time.Minute))
})
