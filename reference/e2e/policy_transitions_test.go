package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/dpconform/dpconform/fv/harness"
	"github.com/dpconform/dpconform/fv/probe"
	"github.com/dpconform/dpconform/fv/workloads"
	"github.com/dpconform/dpconform/reference/faults"
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

// from returns the requests from the probe named sender to the destination labelled
// target ("" for any), in the order of their sequence numbers.
func (l *recvLog) from(sender, target string) []probe.Event {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []probe.Event
	for _, e := range l.evs {
		if e.From == sender && (target == "" || e.Target == target) {
			out = append(out, e)
		}
	}
	slices.SortFunc(out, func(a, b probe.Event) int { return int(a.Seq) - int(b.Seq) })
	return out
}

// describePolicyTransitions registers the specs of the policy faults that act in a
// transition (an agent restart, a new pod, a policy update), each with its clean
// counterpart: what the fault breaks, the clean agent keeps.
func describePolicyTransitions(get func() policyWorld) {
	var pw policyWorld
	BeforeEach(func() { pw = get() })

	// withAgent runs node-a's agent with these faults (none: clean) for the spec.
	withAgent := func(ctx context.Context, fs ...string) {
		GinkgoHelper()
		if len(fs) == 0 {
			return
		}
		Expect(pw.w.Stop(ctx, pw.nodeA)).To(Succeed())
		pw.w.Driver = newDriver(fs...)
		Expect(pw.w.Start(ctx, pw.nodeA)).To(Succeed())
		Expect(pw.w.WaitReady(ctx, pw.nodeA)).To(Succeed())
		DeferCleanup(func(ctx SpecContext) {
			Expect(pw.w.Stop(ctx, pw.nodeA)).To(Succeed())
			pw.w.Driver = newDriver()
			Expect(pw.w.Start(ctx, pw.nodeA)).To(Succeed())
			Expect(pw.w.WaitReady(ctx, pw.nodeA)).To(Succeed())
		}, NodeTimeout(time.Minute))
	}

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

	var addSender func(ctx context.Context, name string, labels map[string]string, cfgs ...probe.Config) topologies.Pod

	reached := func(ctx context.Context, from topologies.Host, t probe.Target) bool {
		evs, err := pw.w.Reach(ctx, from, probe.Reach{Name: "reach-" + from.Name(), Targets: []probe.Target{t}})
		Expect(err).NotTo(HaveOccurred())
		return len(evs) == 1 && evs[0].Outcome == probe.OK
	}

	// RESTART-FAIL-CLOSED: a flow the policy denies, new connections and UDP from new
	// sockets every 2 ms, across a graceful restart and a crash.
	restartDenied := func(ctx context.Context, fs ...string) (tcpOK, udpDelivered int) {
		GinkgoHelper()
		var log recvLog
		sealed := addServer(ctx, "sealed", map[string]string{"app": "sealed"}, &log)
		applyPolicy(ctx, &networkingv1.NetworkPolicy{
			ObjectMeta: metav1.ObjectMeta{Name: "sealed", Namespace: sealed.Namespace()},
			Spec: networkingv1.NetworkPolicySpec{
				PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "sealed"}},
				PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
			},
		})
		addr := workloads.Direct(sealed)
		Eventually(func(ctx context.Context) bool {
			return reached(ctx, pw.client, probe.Target{Label: "sealed", Proto: "tcp", Addr: addr})
		}).WithContext(ctx).Should(BeFalse(), "the deny-all policy does not hold")

		pw.w.NewTimeline()
		conn, err := pw.w.StartProbe(ctx, pw.client, probe.Connect{Name: "denied-tcp", Target: addr, Interval: 2 * time.Millisecond})
		Expect(err).NotTo(HaveOccurred())
		udp, err := pw.w.StartProbe(ctx, pw.client, probe.UDP{Name: "denied-udp", To: []probe.Destination{{Label: "sealed", Addr: addr}}, Interval: 2 * time.Millisecond, NewSocket: true})
		Expect(err).NotTo(HaveOccurred())
		time.Sleep(500 * time.Millisecond)
		for _, crash := range []bool{false, true} {
			if crash {
				Expect(pw.w.Kill(ctx, pw.nodeA)).To(Succeed())
			} else {
				Expect(pw.w.Stop(ctx, pw.nodeA)).To(Succeed())
			}
			pw.w.Driver = newDriver(fs...)
			Expect(pw.w.Start(ctx, pw.nodeA)).To(Succeed())
			Expect(pw.w.WaitReady(ctx, pw.nodeA)).To(Succeed())
			time.Sleep(time.Second)
		}
		Expect(pw.w.StopProbe(ctx, conn)).To(Succeed())
		Expect(pw.w.StopProbe(ctx, udp)).To(Succeed())
		attempts := 0
		for _, e := range pw.w.Timeline().Whole().Inside() {
			if e.Probe == "denied-tcp" && e.Kind == probe.KindAttempt {
				attempts++
				if e.Outcome == probe.OK {
					tcpOK++
				}
			}
		}
		Expect(attempts).To(BeNumerically(">", 500), "the connect probe hardly ran")
		udpDelivered = len(log.from("denied-udp", ""))
		AddReportEntry("delivered", fmt.Sprintf("faults %v: %d of %d connections admitted, %d datagrams delivered", fs, tcpOK, attempts, udpDelivered))
		return tcpOK, udpDelivered
	}

	It("keeps a denied flow denied through a graceful restart and a crash", func(ctx SpecContext) {
		tcpOK, udp := restartDenied(ctx)
		Expect(tcpOK).To(BeZero(), "connections admitted while the agent restarted")
		Expect(udp).To(BeZero(), "datagrams delivered while the agent restarted")
	}, SpecTimeout(3*time.Minute))

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

	// ORDER-NEW-ENDPOINT: a new pod P whose label a same-node peer S's ingress admits
	// sends sequence-numbered UDP from its first possible packet, one socket, every
	// 1 ms, alternately to S and to a peer D without policy. It returns the datagrams
	// to S that were sent after the first one D received and lost, and the time from
	// that first one to the first S received after it.
	newEndpoint := func(ctx context.Context, fs ...string) (lost int, window time.Duration) {
		GinkgoHelper()
		withAgent(ctx, fs...)
		var log recvLog
		s := addServer(ctx, "order-s", map[string]string{"app": "order-s"}, &log)
		d := addServer(ctx, "order-d", nil, &log)
		applyPolicy(ctx, &networkingv1.NetworkPolicy{
			ObjectMeta: metav1.ObjectMeta{Name: "order-s", Namespace: s.Namespace()},
			Spec: networkingv1.NetworkPolicySpec{
				PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "order-s"}},
				Ingress: []networkingv1.NetworkPolicyIngressRule{{
					From: []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"role": "member"}}}},
				}},
			},
		})
		Eventually(func(ctx context.Context) bool {
			return reached(ctx, pw.client, probe.Target{Label: "s", Proto: "udp", Addr: workloads.Direct(s)})
		}).WithContext(ctx).Should(BeFalse(), "S's policy does not hold")

		logStart := len(agentLog(ctx, pw))
		p := addSender(ctx, "order-p", map[string]string{"role": "member"}, probe.UDP{Name: "p-udp", Interval: time.Millisecond,
			To: []probe.Destination{{Label: "s", Addr: workloads.Direct(s)}, {Label: "d", Addr: workloads.Direct(d)}}})
		Eventually(func() []probe.Event { return log.from("p-udp", "d") }).WithContext(ctx).ShouldNot(BeEmpty(), "P never reached D")
		time.Sleep(time.Second)
		toD, toS := log.from("p-udp", "d"), log.from("p-udp", "s")
		Expect(toS).NotTo(BeEmpty(), "S never admitted P")
		first := toD[0]
		got := map[uint64]bool{}
		for _, e := range toS {
			got[e.Seq] = true
		}
		last := toS[len(toS)-1].Seq
		// Datagram seq goes to To[(seq-1)%2]: the odd ones to S.
		for seq := first.Seq + 1; seq <= last; seq++ {
			if seq%2 == 1 && !got[seq] {
				lost++
			}
		}
		for _, e := range toS {
			if e.Seq > first.Seq {
				window = e.Time.Sub(first.Time)
				break
			}
		}
		AddReportEntry("window", fmt.Sprintf("faults %v: %d datagrams to S lost after D's first; S's first after it %v later", fs, lost, window))

		// The order the agent took: P attached (and its gate opened) after S's policy
		// names P's set, or, with the fault, before.
		lines := agentLog(ctx, pw)
		attached := logIndex(lines, logStart, `msg="attached endpoint"`, "pod="+p.Namespace()+"/"+p.Name())
		Expect(attached).To(BeNumerically(">=", 0), "P's attach is not in the log")
		gate := logIndex(lines, attached, `msg="iptables written"`)
		sPolicy := logIndex(lines, logStart, `msg="endpoint policy written"`, "pod="+s.Namespace()+"/"+s.Name())
		Expect(gate).To(BeNumerically(">", attached), "P's gate is not written after its attach")
		Expect(sPolicy).To(BeNumerically(">=", 0), "S's policy is not rewritten for P")
		if slices.Contains(fs, faults.AttachBeforeIPSets) {
			Expect(sPolicy).To(BeNumerically(">", gate), "with the fault, S's policy is written before P's gate opens")
		} else {
			Expect(sPolicy).To(BeNumerically("<", attached), "S's policy is written after P's attach")
		}
		return lost, window
	}

	It("admits a new pod at its peer from its first packet on (ORDER-NEW-ENDPOINT)", func(ctx SpecContext) {
		lost, _ := newEndpoint(ctx)
		Expect(lost).To(BeZero(), "datagrams to S lost while P reached D")
	}, SpecTimeout(2*time.Minute))

	// ORDER-NEW-ENDPOINT-EGRESS: a new pod P whose egress policy admits D only sends
	// UDP from its first possible packet, to X (denied) and D alternately on one
	// socket, and to X from a new socket each time. It returns what X received from
	// each.
	newEndpointEgress := func(ctx context.Context, fs ...string) (oneSocket, newSockets int) {
		GinkgoHelper()
		withAgent(ctx, fs...)
		var log recvLog
		x := addServer(ctx, "egress-x", nil, &log)
		d := addServer(ctx, "egress-d", map[string]string{"role": "egress-control"}, &log)
		applyPolicy(ctx, &networkingv1.NetworkPolicy{
			ObjectMeta: metav1.ObjectMeta{Name: "egress-p", Namespace: x.Namespace()},
			Spec: networkingv1.NetworkPolicySpec{
				PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "egress-p"}},
				PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeEgress},
				Egress: []networkingv1.NetworkPolicyEgressRule{{
					To: []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"role": "egress-control"}}}},
				}},
			},
		})
		addSender(ctx, "egress-p", map[string]string{"app": "egress-p"},
			probe.UDP{Name: "p-one", Interval: time.Millisecond, To: []probe.Destination{{Label: "x", Addr: workloads.Direct(x)}, {Label: "d", Addr: workloads.Direct(d)}}},
			probe.UDP{Name: "p-new", Interval: time.Millisecond, NewSocket: true, To: []probe.Destination{{Label: "x", Addr: workloads.Direct(x)}}})
		Eventually(func() []probe.Event { return log.from("p-one", "d") }).WithContext(ctx).ShouldNot(BeEmpty(), "P never reached D")
		time.Sleep(time.Second)
		oneSocket, newSockets = len(log.from("p-one", "x")), len(log.from("p-new", "x"))
		AddReportEntry("delivered", fmt.Sprintf("faults %v: X received %d datagrams of P's socket, %d from new sockets", fs, oneSocket, newSockets))
		return oneSocket, newSockets
	}

	It("never lets a new pod past its egress policy (ORDER-NEW-ENDPOINT-EGRESS)", func(ctx SpecContext) {
		one, fresh := newEndpointEgress(ctx)
		Expect(one + fresh).To(BeZero())
	}, SpecTimeout(2*time.Minute))

	// ORDER-POLICY-REPLACE: new connections every 2 ms to a pod behind a default
	// deny and a policy that admits them, while that policy is updated to a superset.
	// It returns the failed attempts and how far apart the first and last were.
	replacePolicy := func(ctx context.Context, fs ...string) (failed int, span time.Duration) {
		GinkgoHelper()
		withAgent(ctx, fs...)
		var log recvLog
		r := addServer(ctx, "replaced", map[string]string{"app": "replaced"}, &log)
		sel := metav1.LabelSelector{MatchLabels: map[string]string{"app": "replaced"}}
		applyPolicy(ctx, &networkingv1.NetworkPolicy{
			ObjectMeta: metav1.ObjectMeta{Name: "replaced-deny", Namespace: r.Namespace()},
			Spec:       networkingv1.NetworkPolicySpec{PodSelector: sel, PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}},
		})
		allow := &networkingv1.NetworkPolicy{
			ObjectMeta: metav1.ObjectMeta{Name: "replaced-allow", Namespace: r.Namespace()},
			Spec: networkingv1.NetworkPolicySpec{PodSelector: sel, Ingress: []networkingv1.NetworkPolicyIngressRule{{
				From:  []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{}}},
				Ports: []networkingv1.NetworkPolicyPort{{Port: ptr.To(intstr.FromInt32(workloads.EchoPort))}},
			}}},
		}
		applyPolicy(ctx, allow)
		target := probe.Target{Label: "replaced", Proto: "tcp", Addr: workloads.Direct(r)}
		Eventually(func(ctx context.Context) bool { return reached(ctx, pw.client, target) }).WithContext(ctx).Should(BeTrue())

		pw.w.NewTimeline()
		conn, err := pw.w.StartProbe(ctx, pw.client, probe.Connect{Name: "replace-tcp", Target: target.Addr, Interval: 2 * time.Millisecond})
		Expect(err).NotTo(HaveOccurred())
		time.Sleep(500 * time.Millisecond)
		nps := pw.topo.Kube().NetworkingV1().NetworkPolicies(allow.Namespace)
		logStart := len(agentLog(ctx, pw))
		cur, err := nps.Get(ctx, allow.Name, metav1.GetOptions{})
		Expect(err).NotTo(HaveOccurred())
		cur.Spec.Ingress[0].Ports = append(cur.Spec.Ingress[0].Ports, networkingv1.NetworkPolicyPort{Port: ptr.To(intstr.FromInt32(9999))})
		_, err = nps.Update(ctx, cur, metav1.UpdateOptions{})
		Expect(err).NotTo(HaveOccurred())
		time.Sleep(2 * time.Second)
		Expect(pw.w.StopProbe(ctx, conn)).To(Succeed())
		var firstFail, lastFail time.Time
		attempts := 0
		for _, e := range pw.w.Timeline().Whole().Inside() {
			if e.Probe != "replace-tcp" || e.Kind != probe.KindAttempt {
				continue
			}
			attempts++
			if e.Outcome != probe.OK && e.Outcome != probe.Skipped {
				failed++
				t := time.Unix(0, int64(e.Time))
				if firstFail.IsZero() {
					firstFail = t
				}
				lastFail = t
			}
		}
		Expect(attempts).To(BeNumerically(">", 500), "the connect probe hardly ran")
		span = lastFail.Sub(firstFail)
		// What the agent wrote for the pod: the superset in one update or, with the
		// fault, the default deny alone for a round and then the superset.
		lines := agentLog(ctx, pw)
		var writes []string
		for i := logStart; i >= 0 && i < len(lines); i++ {
			if i = logIndex(lines, i, `msg="endpoint policy written"`, "pod="+r.Namespace()+"/"+r.Name()); i < 0 {
				break
			}
			writes = append(writes, lines[i])
		}
		rules := func(line string) string { return strings.Fields(line[strings.Index(line, " rules="):])[0] }
		if slices.Contains(fs, faults.DeleteThenAddPolicy) {
			Expect(writes).To(HaveLen(2), "the pod's policy is not written twice for one update")
			Expect(rules(writes[0])).To(Equal("rules=0"), "the first write is not the default deny alone")
			Expect(rules(writes[1])).NotTo(Equal("rules=0"))
			AddReportEntry("round", fmt.Sprintf("the default deny alone was live %v (log precision: 1 ms)", logTime(writes[1]).Sub(logTime(writes[0]))))
		} else {
			Expect(writes).To(HaveLen(1), "the pod's policy is not written once for one update")
			Expect(rules(writes[0])).NotTo(Equal("rules=0"))
		}
		AddReportEntry("window", fmt.Sprintf("faults %v: %d of %d connections failed, the first and last %v apart", fs, failed, attempts, span))
		return failed, span
	}

	It("admits what both versions of an updated policy allow (ORDER-POLICY-REPLACE)", func(ctx SpecContext) {
		failed, _ := replacePolicy(ctx)
		Expect(failed).To(BeZero())
	}, SpecTimeout(2*time.Minute))

	// addSender adds a pod on node-a that runs these probes from its first possible
	// packet: they start as soon as CNI has wired it, before the API says where it is.
	addSender = func(ctx context.Context, name string, labels map[string]string, cfgs ...probe.Config) topologies.Pod {
		GinkgoHelper()
		var procs []*probe.Process
		p, err := pw.topo.AddPod(ctx, topologies.PodSpec{Name: name, Node: pw.nodeA.Name(), Labels: labels,
			OnWired: func(ctx context.Context, p topologies.Pod) error {
				for _, cfg := range cfgs {
					pr, err := pw.w.StartProbe(ctx, p, cfg)
					if err != nil {
						return err
					}
					procs = append(procs, pr)
				}
				return nil
			}})
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func(ctx SpecContext) {
			for _, pr := range procs {
				Expect(pw.w.StopProbe(ctx, pr)).To(Succeed())
			}
			Expect(pw.topo.RemovePod(ctx, p)).To(Succeed())
		}, NodeTimeout(time.Minute))
		return p
	}

	Context("with a policy fault", func() {
		It(faults.OpenWhileRestarting+" delivers a denied flow during a restart", func(ctx SpecContext) {
			tcpOK, udp := restartDenied(ctx, faults.OpenWhileRestarting)
			Expect(tcpOK+udp).To(BeNumerically(">", 0), "nothing denied was delivered")
		}, SpecTimeout(3*time.Minute))

		It(faults.AttachBeforeIPSets+" denies a new pod at its peer while it reaches others", func(ctx SpecContext) {
			newEndpoint(ctx, faults.AttachBeforeIPSets)
		}, SpecTimeout(2*time.Minute))

		It(faults.RedirectBeforePolicy+" lets a new pod past its egress policy", func(ctx SpecContext) {
			one, _ := newEndpointEgress(ctx, faults.RedirectBeforePolicy)
			Expect(one).To(BeNumerically(">", 0), "X received nothing of P's socket")
		}, SpecTimeout(2*time.Minute))

		It(faults.DeleteThenAddPolicy+" denies connections both versions allow while a policy is updated", func(ctx SpecContext) {
			replacePolicy(ctx, faults.DeleteThenAddPolicy)
		}, SpecTimeout(2*time.Minute))
	})
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

// agentLog returns node-a's agent log as the driver's diagnostics collect it, one
// entry a line.
func agentLog(ctx context.Context, pw policyWorld) []string {
	GinkgoHelper()
	dir := GinkgoT().TempDir()
	_, err := pw.w.Collect(ctx, dir)
	Expect(err).NotTo(HaveOccurred())
	data, err := os.ReadFile(filepath.Join(dir, pw.nodeA.Name(), "refdp.log"))
	Expect(err).NotTo(HaveOccurred())
	return strings.Split(strings.TrimSuffix(string(data), "\n"), "\n")
}

// logIndex returns the index of the first line at or after from that holds every one
// of parts, or -1.
func logIndex(lines []string, from int, parts ...string) int {
	for i := from; i < len(lines); i++ {
		ok := true
		for _, p := range parts {
			ok = ok && strings.Contains(lines[i], p)
		}
		if ok {
			return i
		}
	}
	return -1
}

// logTime returns the time an agent log line was written (ms precision).
func logTime(line string) time.Time {
	GinkgoHelper()
	f := strings.Fields(line)
	Expect(f).NotTo(BeEmpty())
	t, err := time.Parse(time.RFC3339Nano, strings.TrimPrefix(f[0], "time="))
	Expect(err).NotTo(HaveOccurred(), "log line %q", line)
	return t
}
