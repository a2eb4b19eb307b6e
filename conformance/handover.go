package conformance

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/dpconform/dpconform/fv/matchers"
	"github.com/dpconform/dpconform/fv/nodestate"
	"github.com/dpconform/dpconform/topologies"
)

// Handover judges that a switch from kube-proxy (the Switch step) happened: the
// rules kube-proxy held on the node before the switch (its service chains, the jumps
// to them, its nftables tables) are gone once the node has settled. Until they are,
// kube-proxy still carries the node and nothing about the hand-over is shown
// (Calico's seed-2 bug appears only once KUBE-FORWARD is deleted), so every switch
// checks it. Only what was there before counts: an implementation that is itself a
// kube-proxy (nftables mode) owns the table it creates.
type Handover struct {
	Node   topologies.Node
	before []string
}

// Before records kube-proxy's rules on the node, a precondition: it needs some.
func (h *Handover) Before() Check {
	return Check{Name: "kube-proxy has programmed " + h.Node.Name(), State: func(ctx context.Context, e *Env) (StateResult, error) {
		var err error
		if h.before, err = nodestate.KubeProxyRules(ctx, h.Node); err != nil {
			return StateResult{}, err
		}
		if len(h.before) == 0 {
			return StateResult{}, fmt.Errorf("%w: kube-proxy left no service rules on %s before the switch: the hand-over cannot be judged", ErrEnvironment, h.Node.Name())
		}
		return StateResult{Figures: []matchers.Figure{Count("kube_proxy_rules", len(h.before), nil, "rules of kube-proxy's on "+h.Node.Name()+" before the switch")}}, nil
	}}
}

// After judges that none of them is left.
func (h *Handover) After() Check {
	return Check{Name: "kube-proxy's service chains and the jumps to them are gone", State: func(ctx context.Context, e *Env) (StateResult, error) {
		now, err := nodestate.KubeProxyRules(ctx, h.Node)
		if err != nil {
			return StateResult{}, err
		}
		var left []string
		for _, r := range now {
			if slices.Contains(h.before, r) {
				left = append(left, r)
			}
		}
		zero := 0.0
		r := StateResult{Figures: []matchers.Figure{Count("kube_proxy_rules_left", len(left), &zero,
			fmt.Sprintf("of the %d rules of kube-proxy's on %s before the switch left (KUBE-MARK-*, kubelet's KUBE-FIREWALL may stay)", len(h.before), h.Node.Name()))}}
		if len(left) > 0 {
			r.Kind, r.Violation = KindRulesLeft, fmt.Sprintf("%d of kube-proxy's rules are still on %s %s after ready:\n  %s",
				len(left), h.Node.Name(), e.Budgets.SwitchSettle, strings.Join(left, "\n  "))
		}
		return r, nil
	}}
}

// ForwardPolicyDrop proves n's FORWARD policy is DROP before a switch: that is what
// makes kube-proxy's KUBE-FORWARD accept (and, after it, the implementation's)
// matter.
func ForwardPolicyDrop(n topologies.Node) Check {
	return Check{Name: n.Name() + "'s FORWARD policy is DROP", State: func(ctx context.Context, e *Env) (StateResult, error) {
		p, err := nodestate.ForwardPolicy(ctx, n)
		if err != nil {
			return StateResult{}, err
		}
		if p != "DROP" {
			return StateResult{}, fmt.Errorf("%w: %s's FORWARD policy is %s, a switch from kube-proxy needs DROP", ErrEnvironment, n.Name(), p)
		}
		return StateResult{}, nil
	}}
}

// Count is a figure of a state check: n things, with budget (nil: none).
func Count(name string, n int, budget *float64, text string) matchers.Figure {
	return matchers.Figure{Name: name, Value: float64(n), Unit: "count", Budget: budget, Text: fmt.Sprintf("%d %s", n, text)}
}
