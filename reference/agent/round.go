package agent

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"time"

	"github.com/vishvananda/netlink"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/dpconform/dpconform/bpf"
	"github.com/dpconform/dpconform/reference/faults"
	"github.com/dpconform/dpconform/reference/policy"
)

func (a *Agent) loop(ctx context.Context) error {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			a.log.Info("stopping; the datapath stays in place")
			return nil
		case <-a.kick:
		case <-tick.C:
		}
		if err := a.sync(ctx); err != nil {
			if err.Error() != a.lastSyncError {
				a.log.Error("sync", "err", err)
			}
			a.lastSyncError = err.Error()
		} else {
			a.lastSyncError = ""
		}
		if readded := a.policies.roundDone(); len(readded) > 0 {
			// The add half of updates split by the fault: a round of its own.
			a.log.Warn("fault: updated NetworkPolicies were deleted for a round, now added again", "fault", faults.DeleteThenAddPolicy, "policies", readded)
			a.poke()
		}
	}
}

// syncedPoll is how often pokeWhenSynced looks whether the view is complete.
const syncedPoll = 5 * time.Millisecond

// pokeWhenSynced starts a round as soon as the view is complete. Events poke the loop,
// but the last informer or handler to sync may do so with none left to deliver (the
// handler of an empty list of NetworkPolicies syncs without an event): without this
// the first round, and ready, would wait for the loop's next tick, up to a second.
func (a *Agent) pokeWhenSynced(ctx context.Context) {
	err := wait.PollUntilContextCancel(ctx, syncedPoll, true, func(context.Context) (bool, error) {
		return a.informersSynced(), nil
	})
	if err == nil {
		a.poke()
	}
}

// informersSynced reports whether the datastore view is complete: every informer has
// synced and the node's own Node object is there.
func (a *Agent) informersSynced() bool {
	for _, s := range a.synced {
		if !s() {
			return false
		}
	}
	nodes, err := a.nodeLister.List(labels.Everything())
	return err == nil && len(nodes) > 0
}

// sync applies one round, steps 2 to 9 of the order in the package comment. A step
// that fails ends the round, so that no step runs before those it relies on have
// succeeded.
func (a *Agent) sync(ctx context.Context) error {
	inSync := a.informersSynced()
	a.mu.Lock()
	hostIPs, hostsOK := a.hostIPs, a.hostsOK
	a.mu.Unlock()
	// Nothing is written before the view is complete: datastore in sync AND host IPs
	// known. The fault applies (and deletes) as soon as the datastore is in sync.
	complete := inSync && hostsOK
	if a.cfg.Faults.Has(faults.EagerServiceSync) {
		complete = inSync
	}
	if !complete {
		return nil
	}
	want := a.localEndpoints()
	desired := a.computePolicy(want)
	for _, s := range roundOrder(a.cfg.Faults) {
		var err error
		switch s {
		case stepWriteIPSets:
			err = a.writeIPSets(desired)
		case stepWritePolicies:
			err = a.writeEndpointPolicies(want, desired)
		case stepAttachNew:
			err = a.attachNewEndpoints(want, desired, true)
		case stepAttachNewUnpoliced:
			err = a.attachNewEndpoints(want, desired, false)
		case stepWriteIPTables:
			err = a.syncIPTables(ctx, want)
		case stepDetachGone:
			err = a.detachGoneEndpoints(want)
		case stepDeleteSets:
			err = a.deleteUnreferencedSets(desired)
		}
		if err != nil {
			return err
		}
	}
	if err := a.syncServices(hostIPs, hostsOK); err != nil {
		return err
	}
	if !a.tookOver {
		if err := a.takeOver(ctx); err != nil {
			return err
		}
	}
	if !a.ready {
		a.ready = true
		a.log.Info("ready")
		return a.status.write(true, "programmed and in sync")
	}
	return nil
}

// step is one of the steps 3 to 6 of a round (see the package comment).
type step int

const (
	stepWriteIPSets        step = iota // 3
	stepWritePolicies                  // 4: of the endpoints attached already
	stepAttachNew                      // 5: new endpoints, each with its policy
	stepAttachNewUnpoliced             // 5 without the policy (redirect-before-policy)
	stepWriteIPTables                  // 6
	stepDetachGone                     // 6
	stepDeleteSets                     // 6
)

var stepNames = [...]string{"write-ipsets", "write-policies", "attach-new", "attach-new-unpoliced", "write-iptables", "detach-gone", "delete-sets"}

func (s step) String() string { return stepNames[s] }

// roundOrder returns the order in which a round runs steps 3 to 6: the package
// comment's, or the one a fault puts in its place.
func roundOrder(f faults.Set) []step {
	attach := stepAttachNew
	if f.Has(faults.RedirectBeforePolicy) {
		attach = stepAttachNewUnpoliced
	}
	var order []step
	if f.Has(faults.AttachBeforeIPSets) {
		// Calico before PR 12164: the new endpoint is live (programs, then iptables)
		// before the sets that hold its IP are written, and its peers switch to
		// those sets only after that.
		order = []step{attach, stepWriteIPTables, stepWriteIPSets, stepWritePolicies}
	} else {
		order = []step{stepWriteIPSets, stepWritePolicies, attach, stepWriteIPTables}
	}
	if attach == stepAttachNewUnpoliced {
		// The policy of the endpoints attached without it, once their gates are open.
		order = append(order, stepWritePolicies)
	}
	return append(order, stepDetachGone, stepDeleteSets)
}

// reattachFromScratch is the fault open-while-restarting: every endpoint found in the
// pinned map is attached again as if new, its state rewritten from pod IP and flags
// alone, without its policy, before the view is complete. The first complete round
// attaches each again with its policy.
func (a *Agent) reattachFromScratch() error {
	type pinned struct {
		ifindex int
		v       bpf.EndpointValue
	}
	var eps []pinned
	if err := a.dp.Endpoints().Iterate(func(k uint32, v bpf.EndpointValue) bool {
		eps = append(eps, pinned{int(k), v})
		return true
	}); err != nil {
		return fmt.Errorf("list pinned endpoints: %w", err)
	}
	n := 0
	for _, ep := range eps {
		if _, err := netlink.LinkByIndex(ep.ifindex); err != nil {
			continue // gone with its pod
		}
		if err := a.dp.SetEndpointPolicy(ep.ifindex, bpf.EndpointPolicy{}); err != nil {
			return fmt.Errorf("reset endpoint ifindex %d: %w", ep.ifindex, err)
		}
		flags := ep.v.Flags &^ (bpf.EndpointIngressIsolated | bpf.EndpointEgressIsolated)
		if err := a.dp.AttachEndpoint(ep.ifindex, ep.v.PodIP, flags); err != nil {
			return fmt.Errorf("re-attach endpoint ifindex %d: %w", ep.ifindex, err)
		}
		n++
	}
	a.log.Warn("fault: re-attached the pinned endpoints from scratch, without their policy, until the first complete round", "fault", faults.OpenWhileRestarting, "endpoints", n)
	return nil
}

// localEndpoints returns the endpoints of this node's pods by the ifindex of their
// host-side interface, found by the route to the pod's IP.
func (a *Agent) localEndpoints() map[int]endpoint {
	want := map[int]endpoint{}
	pods, _ := a.podLister.List(labels.Everything()) // a cache's List never fails
	for _, p := range pods {
		if p.Spec.NodeName != a.cfg.Node || p.Status.PodIP == "" || p.Spec.HostNetwork || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue
		}
		ip, err := netip.ParseAddr(p.Status.PodIP)
		if err != nil || !ip.Is4() {
			continue
		}
		routes, err := netlink.RouteGet(ip.AsSlice())
		if err != nil || len(routes) == 0 || routes[0].LinkIndex == a.hostIdx || routes[0].LinkIndex == 0 {
			continue // not wired on this node (yet)
		}
		ep := endpoint{pod: p.Namespace + "/" + p.Name, ip: ip}
		// Two pods on one interface: a deleted pod's object outlives its sandbox.
		// Either way the same one, whichever order the cache lists them in.
		if cur, ok := want[routes[0].LinkIndex]; ok && cur.pod < ep.pod {
			continue
		}
		want[routes[0].LinkIndex] = ep
	}
	return want
}

// computePolicy compiles the cluster's policies for the endpoints (step 2). What the
// compiler could not compile as written fails closed and is logged, once.
func (a *Agent) computePolicy(want map[int]endpoint) policy.Desired {
	in := policy.Input{Endpoints: make(map[string]int, len(want))}
	for ifindex, ep := range want {
		in.Endpoints[ep.pod] = ifindex
	}
	in.Policies = a.policies.snapshot()
	// A cache's List never fails.
	in.Pods, _ = a.podLister.List(labels.Everything())
	in.Namespaces, _ = a.nsLister.List(labels.Everything())
	d, err := a.compiler.Compile(in)
	msg := ""
	if err != nil {
		msg = err.Error()
	}
	if msg != a.lastPolicyError {
		if err != nil {
			a.log.Error("network policy: failing closed where it cannot be compiled", "err", err)
		} else {
			a.log.Info("network policy compiles cleanly again")
		}
		a.lastPolicyError = msg
	}
	return d
}

// writeIPSets writes the IP sets the policies name (step 3).
func (a *Agent) writeIPSets(d policy.Desired) error {
	written, deleted, err := a.policy.WriteIPSets(d)
	if written+deleted > 0 {
		a.log.Info("IP sets written", "sets", len(d.Sets), "entriesWritten", written, "entriesDeleted", deleted)
	}
	if err != nil {
		return fmt.Errorf("write IP sets: %w", err)
	}
	return nil
}

// writeEndpointPolicies writes the policy of each endpoint that is attached already
// and stays, where it changed (step 4).
func (a *Agent) writeEndpointPolicies(want map[int]endpoint, d policy.Desired) error {
	var errs []error
	for ifindex, ep := range want {
		if cur, ok := a.attached[ifindex]; !ok || cur != ep {
			continue // new: attached with its policy in the next step
		}
		changed, err := a.policy.WriteEndpointPolicy(ifindex, d.Endpoints[ifindex])
		if err != nil {
			errs = append(errs, fmt.Errorf("pod %s: %w", ep.pod, err))
			continue
		}
		if changed {
			p := d.Endpoints[ifindex]
			a.log.Info("endpoint policy written", "pod", ep.pod, "ifindex", ifindex,
				"ingressIsolated", p.IngressIsolated, "egressIsolated", p.EgressIsolated, "rules", len(p.Ingress)+len(p.Egress))
		}
	}
	return errors.Join(errs...)
}

// attachNewEndpoints attaches the endpoint programs of each new endpoint together with
// its policy (step 5). Without withPolicy (the redirect-before-policy fault) a new
// endpoint is attached as it is, with no policy if it had none, and its policy is left
// to the next writeEndpointPolicies.
func (a *Agent) attachNewEndpoints(want map[int]endpoint, d policy.Desired, withPolicy bool) error {
	var errs []error
	for ifindex, ep := range want {
		if cur, ok := a.attached[ifindex]; ok && cur == ep {
			continue
		}
		p := d.Endpoints[ifindex]
		if !withPolicy {
			if err := a.dp.AttachEndpoint(ifindex, ep.ip, bpf.EndpointFlags(0)); err != nil {
				errs = append(errs, fmt.Errorf("pod %s: %w", ep.pod, err))
				continue
			}
			a.policy.Forget(ifindex) // written by writeEndpointPolicies, later
			a.log.Warn("fault: attached endpoint without its policy", "fault", faults.RedirectBeforePolicy, "pod", ep.pod, "ifindex", ifindex, "ip", ep.ip)
			a.attached[ifindex] = ep
			continue
		}
		if err := a.dp.AttachEndpointWithPolicy(ifindex, ep.ip, bpf.EndpointFlags(0), p); err != nil {
			errs = append(errs, fmt.Errorf("pod %s: %w", ep.pod, err))
			continue
		}
		a.policy.Written(ifindex, p)
		a.log.Info("attached endpoint", "pod", ep.pod, "ifindex", ifindex, "ip", ep.ip,
			"ingressIsolated", p.IngressIsolated, "egressIsolated", p.EgressIsolated, "rules", len(p.Ingress)+len(p.Egress))
		if a.cfg.Faults.Has(faults.AttachBeforeIPSets) {
			a.log.Warn("fault: endpoint attached before the IP sets that hold its IP", "fault", faults.AttachBeforeIPSets, "pod", ep.pod)
		}
		a.attached[ifindex] = ep
	}
	return errors.Join(errs...)
}

// detachGoneEndpoints detaches the programs of endpoints whose pods are gone (step 6,
// after the chains no longer accept their interfaces).
func (a *Agent) detachGoneEndpoints(want map[int]endpoint) error {
	var errs []error
	for ifindex, ep := range a.attached {
		if _, ok := want[ifindex]; ok {
			continue
		}
		if err := a.dp.DetachEndpoint(ifindex); err != nil {
			errs = append(errs, fmt.Errorf("pod %s: %w", ep.pod, err))
			continue
		}
		a.policy.Forget(ifindex)
		a.log.Info("detached endpoint", "pod", ep.pod, "ifindex", ifindex)
		delete(a.attached, ifindex)
	}
	return errors.Join(errs...)
}

// deleteUnreferencedSets deletes the IP sets no policy names any more (step 6).
func (a *Agent) deleteUnreferencedSets(d policy.Desired) error {
	n, err := a.policy.DeleteUnreferencedSets(d)
	if n > 0 {
		a.log.Info("IP sets deleted", "entries", n)
	}
	if err != nil {
		return fmt.Errorf("delete IP sets: %w", err)
	}
	return nil
}
