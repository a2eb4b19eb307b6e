package agent

import (
	"slices"
	"strings"
	"sync"

	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/client-go/tools/cache"
)

// policyView is the agent's view of the cluster's NetworkPolicies, kept by the
// informer's events. A round compiles its snapshot.
//
// Clean, an update replaces the policy in place: every round sees the old version or
// the new one. With splitUpdates (the delete-then-add-policy fault) an update is taken
// as a delete and then an add, and the add is held back until a round has compiled
// the view without the policy: for that round the pods it selects have only their
// other policies.
type policyView struct {
	splitUpdates bool

	mu     sync.Mutex
	byKey  map[string]*networkingv1.NetworkPolicy
	readds map[string]*readd
}

// readd is the add half of a split update.
type readd struct {
	np *networkingv1.NetworkPolicy
	// deleted: a round has compiled the view without the policy since the delete.
	deleted bool
}

func newPolicyView(splitUpdates bool) *policyView {
	return &policyView{splitUpdates: splitUpdates, byKey: map[string]*networkingv1.NetworkPolicy{}, readds: map[string]*readd{}}
}

func policyKey(np *networkingv1.NetworkPolicy) string { return np.Namespace + "/" + np.Name }

// handler is the informer's event handler; poke wakes the agent's loop.
func (v *policyView) handler(poke func()) cache.ResourceEventHandler {
	return cache.ResourceEventHandlerFuncs{
		AddFunc: func(o any) {
			if np, ok := o.(*networkingv1.NetworkPolicy); ok {
				v.add(np)
				poke()
			}
		},
		UpdateFunc: func(_, o any) {
			if np, ok := o.(*networkingv1.NetworkPolicy); ok {
				v.update(np)
				poke()
			}
		},
		DeleteFunc: func(o any) {
			if d, ok := o.(cache.DeletedFinalStateUnknown); ok {
				o = d.Obj
			}
			if np, ok := o.(*networkingv1.NetworkPolicy); ok {
				v.delete(np)
				poke()
			}
		},
	}
}

func (v *policyView) add(np *networkingv1.NetworkPolicy) {
	v.mu.Lock()
	defer v.mu.Unlock()
	delete(v.readds, policyKey(np))
	v.byKey[policyKey(np)] = np
}

func (v *policyView) update(np *networkingv1.NetworkPolicy) {
	v.mu.Lock()
	defer v.mu.Unlock()
	k := policyKey(np)
	if !v.splitUpdates {
		v.byKey[k] = np
		return
	}
	// The fault: the old version goes now, the new one comes after a round. An
	// update while the add is pending replaces what will be added.
	delete(v.byKey, k)
	if r, ok := v.readds[k]; ok {
		r.np = np
		return
	}
	v.readds[k] = &readd{np: np}
}

func (v *policyView) delete(np *networkingv1.NetworkPolicy) {
	v.mu.Lock()
	defer v.mu.Unlock()
	delete(v.readds, policyKey(np))
	delete(v.byKey, policyKey(np))
}

// snapshot returns the policies a round compiles, in key order.
func (v *policyView) snapshot() []*networkingv1.NetworkPolicy {
	v.mu.Lock()
	defer v.mu.Unlock()
	for _, r := range v.readds {
		r.deleted = true
	}
	out := make([]*networkingv1.NetworkPolicy, 0, len(v.byKey))
	for _, np := range v.byKey {
		out = append(out, np)
	}
	slices.SortFunc(out, func(a, b *networkingv1.NetworkPolicy) int { return strings.Compare(policyKey(a), policyKey(b)) })
	return out
}

// roundDone applies the adds of split updates whose delete a round has compiled, and
// returns their keys: the agent runs the next round for them at once, as it would
// for the add event of its own.
func (v *policyView) roundDone() []string {
	v.mu.Lock()
	defer v.mu.Unlock()
	var keys []string
	for k, r := range v.readds {
		if r.deleted {
			v.byKey[k] = r.np
			delete(v.readds, k)
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	return keys
}
