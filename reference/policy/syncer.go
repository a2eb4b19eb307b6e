package policy

import (
	"fmt"
	"slices"

	"github.com/dpconform/dpconform/bpf"
	"github.com/dpconform/dpconform/reference/cachingmap"
)

// Endpoints is the datapath's side of endpoints' policies (*bpf.Datapath).
type Endpoints interface {
	SetEndpointPolicy(ifindex int, p bpf.EndpointPolicy) error
}

// Syncer writes a Desired state to the datapath, in three steps that the agent runs
// in order, each only after the one before succeeded:
//
//  1. WriteIPSets: every desired set's entries, new ones first and then the stale
//     ones deleted, so that a member that stays is never missing;
//  2. the endpoints' policies (WriteEndpointPolicy for an endpoint that exists, or
//     the attach of a new one with its policy, then Written);
//  3. DeleteUnreferencedSets: the sets that no live policy refers to any more.
//
// Since a set's content never changes under its ID (see Compiler), a change of peers
// is make-before-break: the new set is complete before any endpoint refers to it,
// and the old one goes only once none does.
//
// It adopts the sets the map holds (a previous run's, pinned) and deletes none of
// them before step 3 of a round.
type Syncer struct {
	sets *cachingmap.Map[bpf.IPSetKey, bpf.IPSetValue]
	eps  Endpoints
	// live is the policy each endpoint was last written with.
	live map[int]bpf.EndpointPolicy
}

// NewSyncer adopts what the IP set map holds.
func NewSyncer(ipsets cachingmap.Backend[bpf.IPSetKey, bpf.IPSetValue], eps Endpoints) (*Syncer, error) {
	s := &Syncer{sets: cachingmap.New("ipsets", ipsets), eps: eps, live: map[int]bpf.EndpointPolicy{}}
	if err := s.sets.Load(); err != nil {
		return nil, err
	}
	return s, nil
}

// Sets returns the sets the map holds, for Compiler.Adopt.
func (s *Syncer) Sets() map[uint32]Set {
	out := map[uint32]Set{}
	s.sets.View(func(m map[bpf.IPSetKey]bpf.IPSetValue) {
		for k, v := range m {
			out[k.SetID] = append(out[k.SetID], Entry{Prefix: k.Prefix, Except: v.Except})
		}
	})
	for id, set := range out {
		out[id] = canonical(set)
	}
	return out
}

// WriteIPSets writes the sets of d (step 1) and returns how many entries it wrote and
// deleted. Sets that d does not hold stay as they are.
func (s *Syncer) WriteIPSets(d Desired) (written, deleted int, err error) {
	s.sets.TakeDesired(s.entries(d, func(id uint32) bool { return true }))
	if written, err = s.sets.ApplyUpdates(); err != nil {
		return written, 0, err
	}
	deleted, err = s.sets.ApplyDeletions()
	return written, deleted, err
}

// WriteEndpointPolicy writes the policy of an endpoint that exists, if it differs from
// what it was last written with (step 2), and reports whether it wrote it.
func (s *Syncer) WriteEndpointPolicy(ifindex int, p bpf.EndpointPolicy) (bool, error) {
	if cur, ok := s.live[ifindex]; ok && samePolicy(cur, p) {
		return false, nil
	}
	if err := s.eps.SetEndpointPolicy(ifindex, p); err != nil {
		return false, fmt.Errorf("endpoint ifindex %d: %w", ifindex, err)
	}
	s.live[ifindex] = p
	return true, nil
}

// Written records that an endpoint was attached with policy p (step 2).
func (s *Syncer) Written(ifindex int, p bpf.EndpointPolicy) { s.live[ifindex] = p }

// Forget records that an endpoint was detached: its rules are gone with it.
func (s *Syncer) Forget(ifindex int) { delete(s.live, ifindex) }

// DeleteUnreferencedSets deletes every set that neither d nor a live policy refers to
// (step 3), and returns how many entries it deleted.
func (s *Syncer) DeleteUnreferencedSets(d Desired) (int, error) {
	ref := map[uint32]bool{}
	for _, p := range s.live {
		for _, rules := range [][]bpf.PolicyRule{p.Ingress, p.Egress} {
			for _, r := range rules {
				ref[r.SetID] = true
			}
		}
	}
	s.sets.TakeDesired(s.entries(d, func(id uint32) bool { return ref[id] }))
	return s.sets.ApplyDeletions()
}

// entries returns the entries of d's sets and, as the map holds them, those of the
// other sets for which keep returns true.
func (s *Syncer) entries(d Desired, keep func(id uint32) bool) map[bpf.IPSetKey]bpf.IPSetValue {
	out := map[bpf.IPSetKey]bpf.IPSetValue{}
	s.sets.View(func(m map[bpf.IPSetKey]bpf.IPSetValue) {
		for k, v := range m {
			if _, ok := d.Sets[k.SetID]; !ok && keep(k.SetID) {
				out[k] = v
			}
		}
	})
	for id, set := range d.Sets {
		for _, e := range set {
			out[bpf.IPSetKey{SetID: id, Prefix: e.Prefix}] = bpf.IPSetValue{Except: e.Except}
		}
	}
	return out
}

// samePolicy reports whether a and b admit the same (nil and empty rules alike).
func samePolicy(a, b bpf.EndpointPolicy) bool {
	return a.IngressIsolated == b.IngressIsolated && a.EgressIsolated == b.EgressIsolated &&
		equalRules(a.Ingress, b.Ingress) && equalRules(a.Egress, b.Egress)
}

func equalRules(a, b []bpf.PolicyRule) bool { return slices.Equal(a, b) }
