package specs

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dpconform/dpconform/conformance"
	"github.com/dpconform/dpconform/fv/matchers"
	"github.com/dpconform/dpconform/fv/timeline"
	"github.com/dpconform/dpconform/fv/workloads"
	"github.com/dpconform/dpconform/topologies"
)

func init() {
	conformance.Register(conformance.Spec{
		ID:       "RESTART-RECONCILE",
		Profile:  conformance.Core,
		Features: []conformance.Feature{conformance.FeatureClusterIP},
		Description: "While node-a's agent is stopped a Service loses a backend and gains one, a Service is created and " +
			"another deleted; from ready on, new connections from a pod on node-a reach only the current backends, " +
			"the new Service answers, the deleted one answers nothing, and within 1 s of ready none fails.",
		Transition: "node-a's agent stopped gracefully; while it is down Service s1 loses a backend (taken out by its labels: the pod keeps serving, and records what reaches it) and gains one, Service s2 is created and s3 deleted; the EndpointSlices settle; the agent is started",
		Traffic:    "a pod on node-a opens a new TCP connection every {connect-interval} to the ClusterIPs of s1 and s3 (from the steady state on) and of s2 (from its creation)",
		Invariant:  "from `ready`: nothing of s1's reaches the backend it lost, the backend it gained answers, s2 answers every connection, nothing sent to s3's old ClusterIP is answered or reaches its backend; from {reconcile-within} after `ready` no connection to s1 fails",
		Budgets:    []string{"reconcile-within", "connect-interval", "attempt-timeout", "settle"},
		Origin:     "ready that means running, not programmed (kube-proxy's own /healthz counts a proxier healthy while it starts), and deletions that follow delete events, which an agent that was not watching never sees (Cilium removes the Services it restored from its maps only once its watchers have synced)",
		Design: "The backend s1 loses is taken out of the Service by its labels, not deleted: its " +
			"EndpointSlice entry goes as it would if the pod went, but the pod and its server " +
			"stay. A dataplane still programmed from before then sends it connections and it " +
			"answers them under its own name (and records each request), which is evidence no " +
			"other failure looks like; a deleted pod's address would only time out, as a Service " +
			"with no frontend does. For the same reason s3's backend stays: a stale frontend of " +
			"the deleted Service is seen as a request it received. The backend s1 gains, and the " +
			"one s2 is created with, exist and serve before the stop (proven directly), so that " +
			"from ready on what they fail to answer is the dataplane's.\n\n" +
			"From ready ({reconcile-within} after it, for failures on s1):\n" +
			"- nothing of s1's reaches s1-leaves, and s1-joins answers some;\n" +
			"- s2 answers every new connection, from s2-backend;\n" +
			"- nothing of s3's is answered or reaches s3-backend: with no frontend its ClusterIP " +
			"is an address the node has no route for, and the attempt fails (unreachable or a " +
			"timeout), whichever; what matters is that nothing arrives;\n" +
			"- from {reconcile-within} after ready, no new connection to s1 fails at all. The grace " +
			"is for failures only: a dataplane that switches s1 to its new backends " +
			"delete-then-add refuses a few (SVC-ENDPOINT-CHURN judges that switch), but it must " +
			"not send one to a backend the API no longer lists.\n\n" +
			"Every probe runs from before the agent starts again: s1 and s3 from the steady state " +
			"on, s2 from its creation.",
		Catches: []conformance.FaultCase{
			// Ready while the datapath still holds what it had when the agent stopped:
			// the removed backend and the deleted Service answer, the new one does not.
			{Fault: "ready-before-first-apply", Kinds: []conformance.FailureKind{
				matchers.KindDelivered, matchers.KindTimeout, matchers.KindUnreachable}},
			// Additions written, deletions of what went while it was down never:
			// the deleted Service keeps answering.
			{Fault: "adopt-without-reconcile", Kinds: []conformance.FailureKind{matchers.KindDelivered}},
		},
		Body: restartReconcile,
	})
}

// Labels of the RESTART-RECONCILE workloads: s1 selects app=s1, s2 app=s2, s3 app=s3.
var (
	reconcileS1  = map[string]string{"app": "s1"}
	reconcileOut = map[string]string{"app": "s1-out"} // a pod no Service selects
	reconcileS2  = map[string]string{"app": "s2"}
	reconcileS3  = map[string]string{"app": "s3"}
)

// restartReconcile changes the world while node-a's agent is stopped, then judges
// node-a's dataplane from the moment it is ready again.
func restartReconcile(ctx context.Context, e *conformance.Env) error {
	nodes := e.Topo.Nodes()
	nodeA, nodeB := nodes[0], nodes[1]
	client, err := e.Topo.AddPod(ctx, topologies.PodSpec{Name: "client", Node: nodeA.Name()})
	if err != nil {
		return fmt.Errorf("add pod client: %w", err)
	}
	stays, _, err := workloads.AddBackend(ctx, e.World, "s1-stays", nodeA.Name(), reconcileS1)
	if err != nil {
		return err
	}
	leaves, _, err := workloads.AddRecordingBackend(ctx, e.World, "s1-leaves", nodeB.Name(), reconcileS1)
	if err != nil {
		return err
	}
	joins, _, err := workloads.AddBackend(ctx, e.World, "s1-joins", nodeB.Name(), reconcileOut)
	if err != nil {
		return err
	}
	s2b, _, err := workloads.AddBackend(ctx, e.World, "s2-backend", nodeB.Name(), reconcileS2)
	if err != nil {
		return err
	}
	s3b, _, err := workloads.AddRecordingBackend(ctx, e.World, "s3-backend", nodeA.Name(), reconcileS3)
	if err != nil {
		return err
	}
	s1, err := workloads.AddService(ctx, e.World, "s1", reconcileS1, stays, leaves)
	if err != nil {
		return err
	}
	s3, err := workloads.AddService(ctx, e.World, "s3", reconcileS3, s3b)
	if err != nil {
		return err
	}
	if err := workloads.WaitAllFlowing(ctx, e.World, e.Warm(),
		workloads.Flow{Name: "s1", From: client, Target: s1.ClusterIPAddr()},
		workloads.Flow{Name: "s3", From: client, Target: s3.ClusterIPAddr(), Backend: s3b.Name()},
		workloads.Flow{Name: "direct-" + joins.Name(), From: client, Target: workloads.Direct(joins), Backend: joins.Name()},
		workloads.Flow{Name: "direct-" + s2b.Name(), From: client, Target: workloads.Direct(s2b), Backend: s2b.Name()},
	); err != nil {
		return err
	}

	fromReady := matchers.From(timeline.Ready, 0)
	settled := matchers.From(timeline.Ready, e.Budgets.ReconcileWithin)
	return e.Run(ctx, conformance.Scenario{
		Traffic: []conformance.Traffic{
			{From: client, Probe: e.Connect("s1", s1.ClusterIPAddr())},
			{From: client, Probe: e.Connect("s3", s3.ClusterIPAddr())},
		},
		Preconditions: []conformance.Check{
			{Name: "new connections to s1 reach s1-stays or s1-leaves before the stop",
				Matcher: matchers.HaveNoFailedAttempts(matchers.Probes("s1"), matchers.Backends(stays.Name(), leaves.Name()))},
			{Name: "s1 spreads them over both", Matcher: matchers.HaveAttemptsOn([]string{stays.Name(), leaves.Name()}, matchers.Probes("s1"))},
			{Name: "new connections to s3 reach s3-backend before the stop",
				Matcher: matchers.HaveNoFailedAttempts(matchers.Probes("s3"), matchers.Backends(s3b.Name()))},
		},
		Transition: []conformance.Step{
			conformance.Stop(nodeA),
			conformance.Relabel(leaves, reconcileOut, backendRemoved),
			conformance.Relabel(joins, reconcileS1, backendAdded),
			// Created before s3 is deleted, so that s2 cannot be given s3's ClusterIP.
			conformance.Do("create the Service s2 and probe it", func(ctx context.Context, e *conformance.Env) error {
				wctx, cancel := context.WithTimeout(ctx, e.Budgets.Programmed)
				defer cancel()
				s2, err := workloads.AddService(wctx, e.World, "s2", reconcileS2, s2b)
				if err != nil {
					return fmt.Errorf("%w: %w", conformance.ErrEnvironment, err)
				}
				e.Record(conformance.EventObjectChange, "created Service default/s2")
				_, err = e.World.StartProbe(ctx, client, e.Connect("s2", s2.ClusterIPAddr()))
				return err
			}),
			conformance.Delete(&corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: s3.Namespace, Name: s3.Name}}),
			conformance.AwaitReadyEndpoints(s1.Name, stays.Name(), joins.Name()),
			conformance.Record(endpointsUpdated, s1.Name),
			conformance.Start(nodeA),
		},
		Checks: []conformance.Check{
			{Name: "from ready, nothing of s1's reaches s1-leaves, which it no longer selects",
				Matcher: matchers.HaveZeroDelivered(matchers.Probes("s1"), matchers.OnBackends(leaves.Name()), fromReady)},
			{Name: "from ready, s1-joins, which s1 now selects, answers new connections to s1",
				Matcher: matchers.HaveAttemptsOn([]string{joins.Name()}, matchers.Probes("s1"), fromReady)},
			{Name: fmt.Sprintf("from %s after ready, no new connection to s1 fails or reaches another backend", e.Budgets.ReconcileWithin),
				Matcher: matchers.HaveNoFailedAttempts(matchers.Probes("s1"), matchers.Backends(stays.Name(), joins.Name()), settled)},
			{Name: "from ready, the Service s2 created meanwhile answers every new connection",
				Matcher: matchers.HaveNoFailedAttempts(matchers.Probes("s2"), matchers.Backends(s2b.Name()), fromReady)},
			{Name: "from ready, nothing sent to the deleted Service s3's ClusterIP is answered or reaches s3-backend",
				Matcher: matchers.HaveZeroDelivered(matchers.Probes("s3"), fromReady)},
		},
	})
}
