package bpf

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/cilium/ebpf"
)

// ErrUnknownEndpoint is returned when the datapath has no state for an
// endpoint that an operation needs (e.g. SetEndpointPolicy before
// AttachEndpoint).
var ErrUnknownEndpoint = errors.New("unknown endpoint")

// EndpointPolicy is the network policy of one endpoint, as the programs
// enforce it. An isolated direction passes a new flow only if one of its
// rules matches; a direction that is not isolated passes everything, and its
// rules are stored but not consulted. Replies of an admitted flow always pass,
// and flows admitted before a change of policy stay admitted.
type EndpointPolicy struct {
	IngressIsolated, EgressIsolated bool
	// Ingress rules match the source of traffic to the workload, Egress
	// rules the destination of traffic from it. At most MaxPolicyRules each.
	Ingress, Egress []PolicyRule
}

func (p *EndpointPolicy) check() error {
	if len(p.Ingress) > MaxPolicyRules || len(p.Egress) > MaxPolicyRules {
		return fmt.Errorf("%d ingress and %d egress rules, at most %d each", len(p.Ingress), len(p.Egress), MaxPolicyRules)
	}
	return nil
}

func (p *EndpointPolicy) flags() EndpointFlags {
	var f EndpointFlags
	if p.IngressIsolated {
		f |= EndpointIngressIsolated
	}
	if p.EgressIsolated {
		f |= EndpointEgressIsolated
	}
	return f
}

// SetEndpointPolicy replaces the policy of the endpoint with this ifindex,
// atomically: the programs see either its old rules or its new ones, never a
// mix. It writes the rules into the endpoint's slot that is not live, then
// flips the slot, the rule counts and the isolation flags in one update of
// the endpoint's value. New flows see the new policy; admitted flows are not
// judged again. The IP sets the rules name must be written first.
//
// The error wraps ErrUnknownEndpoint if the endpoint has not been attached.
func (d *Datapath) SetEndpointPolicy(ifindex int, p EndpointPolicy) error {
	if err := p.check(); err != nil {
		return fmt.Errorf("set policy of endpoint ifindex %d: %w", ifindex, err)
	}
	d.epMu.Lock()
	defer d.epMu.Unlock()
	cur, err := d.endpoints.Lookup(uint32(ifindex))
	if errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("set policy of endpoint ifindex %d: %w", ifindex, ErrUnknownEndpoint)
	}
	if err != nil {
		return fmt.Errorf("set policy of endpoint ifindex %d: %w", ifindex, err)
	}
	next, err := d.writeRules(uint32(ifindex), &cur, &p)
	if err != nil {
		return fmt.Errorf("set policy of endpoint ifindex %d: %w", ifindex, err)
	}
	if err := d.endpoints.Put(uint32(ifindex), next); err != nil {
		return fmt.Errorf("set policy of endpoint ifindex %d: %w", ifindex, err)
	}
	return nil
}

// writeRules writes the rules of p into the slot of the endpoint that is not
// live (cur: its value, nil for a new endpoint, which starts on slot 0) and
// returns cur with that slot live, its counts and p's isolation flags. It
// does not write the endpoint: that is the flip. The caller holds epMu.
func (d *Datapath) writeRules(ifindex uint32, cur *EndpointValue, p *EndpointPolicy) (EndpointValue, error) {
	next := EndpointValue{}
	if cur != nil {
		next = *cur
		next.PolicySlot ^= 1
	}
	next.PolicySlot &= 1
	for _, dir := range []struct {
		dir   Direction
		rules []PolicyRule
	}{{Ingress, p.Ingress}, {Egress, p.Egress}} {
		for i, r := range dir.rules {
			k := PolicyKey{Ifindex: ifindex, Dir: dir.dir, Slot: next.PolicySlot, Index: uint16(i)}
			if err := d.policy.Put(k, r); err != nil {
				return next, err
			}
		}
		// What an earlier use of the slot left beyond the count is ignored
		// by the programs; removed, so that the map holds only what may
		// become live again.
		if err := d.deleteRules(ifindex, dir.dir, next.PolicySlot, len(dir.rules)); err != nil {
			return next, err
		}
	}
	next.Flags = next.Flags&^policyFlags | p.flags()
	next.IngressRules = uint16(len(p.Ingress))
	next.EgressRules = uint16(len(p.Egress))
	return next, nil
}

// deleteRules deletes the rules of an endpoint's direction and slot from
// index from on. Rules are written from index 0 up, so they end at the
// first index that has none.
func (d *Datapath) deleteRules(ifindex uint32, dir Direction, slot uint8, from int) error {
	for i := from; i < MaxPolicyRules; i++ {
		k := PolicyKey{Ifindex: ifindex, Dir: dir, Slot: slot, Index: uint16(i)}
		err := d.policy.Raw().Delete(k)
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("delete %v from %s: %w", k, PolicyMapName, err)
		}
	}
	return nil
}

// deleteEndpointRules deletes every rule of an endpoint, in both slots.
func (d *Datapath) deleteEndpointRules(ifindex uint32) error {
	var errs []error
	for _, dir := range []Direction{Ingress, Egress} {
		for slot := uint8(0); slot < 2; slot++ {
			errs = append(errs, d.deleteRules(ifindex, dir, slot, 0))
		}
	}
	return errors.Join(errs...)
}

// putEndpoint records an endpoint's pod IP and flags. With p, it writes p's
// rules first and flips to them in the same update; without, an endpoint
// that exists keeps its policy and a new one has none.
func (d *Datapath) putEndpoint(ifindex int, podIP netip.Addr, flags EndpointFlags, p *EndpointPolicy) error {
	if flags&policyFlags != 0 {
		return fmt.Errorf("flags %#x: isolation is set by the endpoint's policy", uint32(flags))
	}
	if p != nil {
		if err := p.check(); err != nil {
			return err
		}
	}
	d.epMu.Lock()
	defer d.epMu.Unlock()
	var cur *EndpointValue
	v, err := d.endpoints.Lookup(uint32(ifindex))
	switch {
	case err == nil:
		cur = &v
	case !errors.Is(err, ebpf.ErrKeyNotExist):
		return err
	}
	var next EndpointValue
	switch {
	case p != nil:
		if next, err = d.writeRules(uint32(ifindex), cur, p); err != nil {
			return err
		}
	case cur != nil:
		next = *cur
	}
	next.PodIP = podIP
	next.Flags = flags | next.Flags&policyFlags
	return d.endpoints.Put(uint32(ifindex), next)
}

// forgetEndpoint deletes an endpoint's state and then its rules.
func (d *Datapath) forgetEndpoint(ifindex int) error {
	d.epMu.Lock()
	defer d.epMu.Unlock()
	if err := d.endpoints.Delete(uint32(ifindex)); err != nil {
		return err
	}
	return d.deleteEndpointRules(uint32(ifindex))
}
