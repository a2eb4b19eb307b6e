package e2e

import (
	"context"
	"strings"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dpconform/dpconform/fv/harness"
	"github.com/dpconform/dpconform/fv/probe"
	"github.com/dpconform/dpconform/fv/workloads"
	"github.com/dpconform/dpconform/topologies"
	"github.com/dpconform/dpconform/topologies/netns"
)

// policyWorld is what the policy transition specs need of the suite's world.
type policyWorld struct {
	w      *harness.World
	topo   *netns.Topology
	nodeA  topologies.Node
	client topologies.Host // the Core fixture's client pod on node-a: no label
}

// recvLog keeps the requests servers received, by sending probe.
type recvLog struct {
	mu  sync.Mutex
	evs []probe.Event
}

func (l *recvLog) add(e probe.Event) {
	if e.Kind != probe.KindRecv {
		return
	}
	l.mu.Lock()
	l.evs = append(l.evs, e)
	l.mu.Unlock()
}

// describePolicyTransitions registers what the reference's policy keeps across a
// restart that the catalogue does not judge: a pod whose policy changed while the
// agent was down, and a pod gone meanwhile. (The transitions the catalogue judges,
// with the faults that break them, are the self-test's: RESTART-FAIL-CLOSED and the
// ORDER specs.)
func describePolicyTransitions(get func() policyWorld) {
	var pw policyWorld
	BeforeEach(func() { pw = get() })

	// addServer adds a pod on node-a that answers TCP and UDP on EchoPort, its
	// requests logged to log.
	addServer := func(ctx context.Context, name string, labels map[string]string, log *recvLog) topologies.Pod {
		GinkgoHelper()
		p, err := pw.topo.AddPod(ctx, topologies.PodSpec{Name: name, Node: pw.nodeA.Name(), Labels: labels})
		Expect(err).NotTo(HaveOccurred())
		srv, err := pw.w.StartProbe(ctx, p, probe.Serve{Name: name, TCP: []int{workloads.EchoPort}, UDP: []int{workloads.EchoPort}, RecordTCP: true}, log.add)
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func(ctx SpecContext) {
			Expect(pw.w.StopProbe(ctx, srv)).To(Succeed())
			Expect(pw.topo.RemovePod(ctx, p)).To(Succeed())
		}, NodeTimeout(time.Minute))
		return p
	}

	applyPolicy := func(ctx context.Context, np *networkingv1.NetworkPolicy) {
		GinkgoHelper()
		nps := pw.topo.Kube().NetworkingV1().NetworkPolicies(np.Namespace)
		_, err := nps.Create(ctx, np, metav1.CreateOptions{})
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func(ctx SpecContext) { Expect(nps.Delete(ctx, np.Name, metav1.DeleteOptions{})).To(Succeed()) }, NodeTimeout(time.Minute))
	}

	reached := func(ctx context.Context, from topologies.Host, t probe.Target) bool {
		evs, err := pw.w.Reach(ctx, from, probe.Reach{Name: "reach-" + from.Name(), Targets: []probe.Target{t}})
		Expect(err).NotTo(HaveOccurred())
		return len(evs) == 1 && evs[0].Outcome == probe.OK
	}

	It("keeps the policy of a pod whose policy changed while the agent was down, and closes a pod gone meanwhile", func(ctx SpecContext) {
		var log recvLog
		kept := addServer(ctx, "kept", map[string]string{"app": "kept"}, &log)
		target := probe.Target{Label: "kept", Proto: "tcp", Addr: workloads.Direct(kept)}
		Eventually(func(ctx context.Context) bool { return reached(ctx, pw.client, target) }).WithContext(ctx).Should(BeTrue())
		gone, err := pw.topo.AddPod(ctx, topologies.PodSpec{Name: "gone", Node: pw.nodeA.Name()})
		Expect(err).NotTo(HaveOccurred())
		goneTarget := probe.Target{Label: "gone", Proto: "tcp", Addr: workloads.Direct(gone)}

		Expect(pw.w.Stop(ctx, pw.nodeA)).To(Succeed())
		restarted := false
		DeferCleanup(func(ctx SpecContext) {
			if !restarted {
				Expect(pw.w.Start(ctx, pw.nodeA)).To(Succeed())
				Expect(pw.w.WaitReady(ctx, pw.nodeA)).To(Succeed())
			}
		}, NodeTimeout(time.Minute))
		// While the agent is down: a deny-all for kept, and gone's pod removed.
		applyPolicy(ctx, &networkingv1.NetworkPolicy{
			ObjectMeta: metav1.ObjectMeta{Name: "kept", Namespace: kept.Namespace()},
			Spec: networkingv1.NetworkPolicySpec{
				PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "kept"}},
				PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
			},
		})
		Expect(pw.topo.RemovePod(ctx, gone)).To(Succeed())
		// The datapath of the previous run still enforces what it was given.
		Expect(reached(ctx, pw.client, target)).To(BeTrue(), "kept's old policy is not enforced while the agent is down")

		Expect(pw.w.Start(ctx, pw.nodeA)).To(Succeed())
		Expect(pw.w.WaitReady(ctx, pw.nodeA)).To(Succeed())
		restarted = true
		Expect(reached(ctx, pw.client, target)).To(BeFalse(), "ready, and the policy written while it was down is not enforced")
		Expect(reached(ctx, pw.client, goneTarget)).To(BeFalse())
		dump, err := topologies.Output(ctx, pw.nodeA, "iptables-save", "-t", "filter")
		Expect(err).NotTo(HaveOccurred())
		Expect(strings.Count(string(dump), "refdp: from workload")).To(Equal(countPods(ctx, pw)), "the gates are not open for exactly the node's pods:\n%s", dump)
	}, SpecTimeout(3*time.Minute))
}

// countPods returns the number of node-a's pods that the agent programs.
func countPods(ctx context.Context, pw policyWorld) int {
	GinkgoHelper()
	pods, err := pw.topo.Kube().CoreV1().Pods("").List(ctx, metav1.ListOptions{})
	Expect(err).NotTo(HaveOccurred())
	n := 0
	for _, p := range pods.Items {
		if p.Spec.NodeName == pw.nodeA.Name() && p.Status.PodIP != "" && !p.Spec.HostNetwork {
			n++
		}
	}
	return n
}
