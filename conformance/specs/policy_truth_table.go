package specs

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dpconform/dpconform/conformance"
	"github.com/dpconform/dpconform/fv/matchers"
	"github.com/dpconform/dpconform/fv/netpolmodel"
	"github.com/dpconform/dpconform/fv/probe"
	"github.com/dpconform/dpconform/fv/workloads"
)

// The Policy profile's steady state: a truth table, as the upstream NetworkPolicy e2e
// tests and Cyclonus build one. Transitions of policy mean nothing if the steady state
// is wrong.

func init() {
	tooOpen := []conformance.FailureKind{matchers.KindDelivered}
	conformance.Register(conformance.Spec{
		ID:       "POLICY-TRUTH-TABLE",
		Profile:  conformance.Policy,
		Features: []conformance.Feature{conformance.FeatureNetworkPolicy, conformance.FeatureTCP, conformance.FeatureUDP},
		Description: fmt.Sprintf("For each of %d sets of NetworkPolicies applied in turn, every ordered pair of nine pods "+
			"(namespaces x, y, z; pods a, b, c) reaches, or fails to reach, the other on TCP and UDP ports 80 and 81 exactly "+
			"as a model of the NetworkPolicy API computes from the policies.", len(policyCases)),
		Transition: "none: a steady state per case; the sets of NetworkPolicies of the cases applied in turn (created, updated in place, deleted)",
		Traffic:    "from each of nine pods (namespaces x, y, z labelled `ns`; pods a, b, c labelled `pod`, on both nodes), one attempt to every other pod on TCP and UDP 80 and 81: 288 cells, all pods at once, {reach-timeout} per try, UDP up to 2 tries from new sockets",
		Invariant:  "within {policy-programmed} of the policies being written, the observed matrix equals the one the suite's model (fv/netpolmodel) computes from the policies as the API server stores them; with no policy, every cell is reached (a precondition)",
		Budgets:    []string{"policy-programmed", "reach-timeout"},
		Origin:     "the upstream NetworkPolicy e2e tests and Cyclonus: each case one construct of networking.k8s.io/v1 that real policy compilers have got wrong",
		Catches: []conformance.FaultCase{
			{Fault: "ignore-ipblock-except", Kinds: tooOpen},
			{Fault: "named-ports-unresolved", Kinds: []conformance.FailureKind{matchers.KindLost, matchers.KindDelivered}},
			{Fault: "egress-ignores-ports", Kinds: tooOpen},
		},
		Body: truthTable,
	})
}

// truthUDPTries is how many datagrams, each from a new socket, a UDP cell gets in one
// round: a denied cell costs them all, and a lost datagram of an allowed one is
// probed again in the next round anyway.
const truthUDPTries = 2

// truthPorts are the ports every cell is probed on.
var truthPorts = []netpolmodel.Port{
	{Port: 80, Protocol: corev1.ProtocolTCP}, {Port: 81, Protocol: corev1.ProtocolTCP},
	{Port: 80, Protocol: corev1.ProtocolUDP}, {Port: 81, Protocol: corev1.ProtocolUDP},
}

func truthTable(ctx context.Context, e *conformance.Env) error {
	f, err := workloads.DeployNetpol(ctx, e.World)
	if err != nil {
		return err
	}
	t := newTable(e, f)
	// Proven first: with no policy, every pod reaches every other on every port.
	if err := e.Judge(ctx, true, t.check("with no NetworkPolicy, every pod reaches every other", nil)); err != nil {
		return err
	}
	for i, c := range policyCases {
		if err := t.apply(ctx, e, c.policies(t.ip)); err != nil {
			return err
		}
		stored, err := t.stored(ctx, e)
		if err != nil {
			return err
		}
		if err := e.Judge(ctx, false, t.check(caseLabel(i, c), stored)); err != nil {
			return err
		}
	}
	return nil
}

// table is the truth table's state: the fixture, the model's view of it, and the
// policies in force.
type table struct {
	e       *conformance.Env
	f       *workloads.Netpol
	cluster netpolmodel.Cluster
	ids     []string
	applied map[string]*networkingv1.NetworkPolicy // ns/name -> policy in force
	round   int
	mu      sync.Mutex
}

func newTable(e *conformance.Env, f *workloads.Netpol) *table {
	t := &table{e: e, f: f, applied: map[string]*networkingv1.NetworkPolicy{}}
	t.cluster = workloads.NetpolCluster(t.ip)
	for _, p := range f.Pods {
		t.ids = append(t.ids, p.ID())
	}
	return t
}

func (t *table) ip(id string) netip.Addr {
	for _, p := range t.f.Pods {
		if p.ID() == id {
			return p.Pod.IP()
		}
	}
	panic("truth table: no pod " + id)
}

// apply makes want the policies in force: those in force that want does not name are
// deleted, the others created or updated.
func (t *table) apply(ctx context.Context, e *conformance.Env, want []*networkingv1.NetworkPolicy) error {
	keep := map[string]bool{}
	for _, p := range want {
		keep[p.Namespace+"/"+p.Name] = true
	}
	for key, p := range t.applied {
		if keep[key] {
			continue
		}
		if err := conformance.Delete(p).Do(ctx, e); err != nil {
			return err
		}
		delete(t.applied, key)
	}
	for _, p := range want {
		if err := conformance.Apply(p).Do(ctx, e); err != nil {
			return err
		}
		t.applied[p.Namespace+"/"+p.Name] = p
	}
	return nil
}

// stored returns the policies in force as the API server stores them (defaults
// filled in): the model judges what the implementation is given.
func (t *table) stored(ctx context.Context, e *conformance.Env) ([]networkingv1.NetworkPolicy, error) {
	var out []networkingv1.NetworkPolicy
	for _, ns := range workloads.NetpolNamespaces {
		l, err := e.Topo.Kube().NetworkingV1().NetworkPolicies(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return nil, fmt.Errorf("list NetworkPolicies in %s: %w", ns, err)
		}
		out = append(out, l.Items...)
	}
	if len(out) != len(t.applied) {
		return nil, fmt.Errorf("%w: %d NetworkPolicies are stored in x, y and z, the truth table wrote %d", conformance.ErrEnvironment, len(out), len(t.applied))
	}
	return out, nil
}

// check is the case's check: it probes the whole matrix until it matches the model's,
// or the policy-programmed budget since the policies were written is over, and then
// reports the last matrix it observed.
func (t *table) check(name string, policies []networkingv1.NetworkPolicy) conformance.Check {
	written := time.Now()
	return conformance.Check{Name: name, State: func(ctx context.Context, e *conformance.Env) (conformance.StateResult, error) {
		want := t.cluster.Expected(policies, truthPorts)
		budget := e.Budgets.PolicyProgrammed
		for {
			got, err := t.observe(ctx, e)
			if err != nil {
				return conformance.StateResult{}, err
			}
			wrong, right, total := netpolmodel.Compare(want, got)
			took := time.Since(written)
			if len(wrong) == 0 || took > budget {
				return t.result(want, got, wrong, right, total, took, policies), nil
			}
		}
	}}
}

func (t *table) result(want, got *netpolmodel.Matrix, wrong []netpolmodel.Cell, right, total int, took time.Duration,
	policies []networkingv1.NetworkPolicy) conformance.StateResult {
	zero := 0.0
	budgetMS := float64(t.e.Budgets.PolicyProgrammed.Milliseconds())
	r := conformance.StateResult{Figures: []matchers.Figure{
		{Name: "cells_right", Value: float64(right), Of: total, Unit: "count",
			Text: fmt.Sprintf("%d of %d cells (ordered pod pair, port) as the model expects", right, total)},
		{Name: "cells_wrong", Value: float64(len(wrong)), Unit: "count", Budget: &zero,
			Text: fmt.Sprintf("%d cells wrong", len(wrong))},
	}}
	if len(wrong) == 0 {
		r.Figures = append(r.Figures, matchers.Figure{Name: "matched_after", Value: float64(took.Milliseconds()), Unit: "ms", Budget: &budgetMS,
			Text: fmt.Sprintf("matched %s after the policies were written", took.Round(time.Millisecond))})
		return r
	}
	r.Kind = matchers.KindLost
	var open, closed int
	for _, c := range wrong {
		if c.Observed {
			open++
		} else {
			closed++
		}
	}
	if open > 0 {
		r.Kind = matchers.KindDelivered
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%d of %d cells wrong %s after the policies were written: %d reached that must not, %d did not that must.\n",
		len(wrong), total, took.Round(time.Millisecond), open, closed)
	b.WriteString("Policies in force:\n")
	for _, p := range policies {
		fmt.Fprintf(&b, "  %s/%s\n", p.Namespace, p.Name)
	}
	if len(policies) == 0 {
		b.WriteString("  none\n")
	}
	b.WriteString(netpolmodel.Render(want, got))
	r.Violation = b.String()
	return r
}

// observe probes every cell once: from each pod, concurrently, one attempt to every
// other pod on every port. A cell is reached when the destination's own server
// answers.
func (t *table) observe(ctx context.Context, e *conformance.Env) (*netpolmodel.Matrix, error) {
	t.mu.Lock()
	t.round++
	round := t.round
	t.mu.Unlock()
	m := netpolmodel.NewMatrix(t.ids, truthPorts)
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
	)
	for _, src := range t.f.Pods {
		var targets []probe.Target
		for _, dst := range t.f.Pods {
			if dst.ID() == src.ID() {
				continue
			}
			for _, port := range truthPorts {
				targets = append(targets, probe.Target{Label: cellLabel(dst.ID(), port), Proto: strings.ToLower(string(port.Protocol)),
					Addr: fmt.Sprintf("%s:%d", dst.Pod.IP(), port.Port)})
			}
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			evs, err := e.World.Reach(ctx, src.Pod, probe.Reach{Name: fmt.Sprintf("reach-%s-%s-%d", src.Namespace, src.Name, round),
				Targets: targets, Timeout: e.Budgets.ReachTimeout, Tries: truthUDPTries})
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, fmt.Errorf("%w: probe the matrix from %s: %w", conformance.ErrEnvironment, src.ID(), err))
				return
			}
			for _, ev := range evs {
				dst, port, ok := parseCellLabel(ev.Label)
				if !ok {
					errs = append(errs, fmt.Errorf("probe from %s reported an unknown cell %q", src.ID(), ev.Label))
					continue
				}
				ok, err := reached(ev, dst)
				if err != nil {
					errs = append(errs, fmt.Errorf("%w: probe from %s to %s: %w", conformance.ErrEnvironment, src.ID(), ev.Label, err))
					continue
				}
				m.Set(src.ID(), dst, port, ok)
			}
		}()
	}
	wg.Wait()
	if len(errs) > 0 {
		return nil, errs[0]
	}
	return m, nil
}

// reached reports whether a reach attempt was answered by dst's own server. An
// attempt the probe could not even make is the environment's failure, not a cell.
func reached(ev probe.Event, dst string) (bool, error) {
	switch ev.Outcome {
	case probe.OK:
		return ev.Backend == dst, nil
	case probe.Skipped, probe.LocalError:
		return false, fmt.Errorf("%s: %s", ev.Outcome, ev.Err)
	}
	return false, nil
}

func cellLabel(dst string, port netpolmodel.Port) string { return dst + " " + port.String() }

func parseCellLabel(l string) (string, netpolmodel.Port, bool) {
	dst, ps, ok := strings.Cut(l, " ")
	if !ok {
		return "", netpolmodel.Port{}, false
	}
	for _, p := range truthPorts {
		if p.String() == ps {
			return dst, p, true
		}
	}
	return "", netpolmodel.Port{}, false
}
