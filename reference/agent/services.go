package agent

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"

	"github.com/dpconform/dpconform/bpf"
	"github.com/dpconform/dpconform/reference/faults"
	"github.com/dpconform/dpconform/reference/services"
	"k8s.io/apimachinery/pkg/labels"
)

// syncServices writes service NAT state (step 7).
func (a *Agent) syncServices(hostIPs []netip.Addr, hostsOK bool) error {
	// A cache's List never fails.
	svcs, _ := a.svcLister.List(labels.Everything())
	epSlices, _ := a.sliceLister.List(labels.Everything())
	complete := true
	if a.cfg.Faults.Has(faults.AdoptWithoutReconcile) && !a.servicesChanged.Load() {
		complete = false
		if !a.warnedAdopt {
			a.warnedAdopt = true
			a.log.Warn("fault: service applies write additions only until a Service or EndpointSlice changes", "fault", faults.AdoptWithoutReconcile)
		}
	}
	desired := services.Compute(svcs, epSlices, hostIPs)
	if a.cfg.Faults.Has(faults.ServeNotReadyEndpoints) {
		desired = services.Listed(svcs, epSlices, hostIPs)
	}
	st, err := a.syncer.Apply(desired, complete)
	a.leftTCP = append(a.leftTCP, st.StaleTCP...)
	if err != nil {
		return err
	}
	a.appliedOnce.Do(func() { close(a.applied) })
	if st.FrontendsWritten+st.FrontendsDeleted+st.BackendsWritten+st.BackendsDeleted > 0 {
		a.log.Info("services applied", "changes", st.String(), "hostIPsKnown", hostsOK)
	}
	if len(st.Rebuilt) > 0 {
		// The fault treats a backend change as delete and re-create, and deleting a
		// service forgets its flows.
		n, err := a.purgeConntrack(st.Rebuilt)
		a.log.Warn("fault: service rebuilt in place, its conntrack entries purged", "fault", faults.RebuildBackendsInPlace, "services", st.Rebuilt, "entries", n, "err", err)
	}
	a.staleUDP = append(a.staleUDP, st.StaleUDP...)
	var tcpErr error
	if complete {
		tcpErr = errors.Join(a.findLeftTCP(), a.endGoneTCP(func() services.Desired { return services.Listed(svcs, epSlices, hostIPs) }))
	}
	return errors.Join(a.forgetStaleUDP(), tcpErr)
}

// endGoneTCP flags the conntrack entries of TCP flows DNATed to backends their
// frontends no longer have, whose endpoints are not listed any more and whose
// address no pod holds (step 7, after the frontends point at their new backends):
// their next packet from a pod is answered with a RST. A backend still listed is
// terminating and may serve its flows to their end, so they wait for its endpoint to
// go; so does a pod that only left the Service (relabelled out of its selector),
// which still runs and answers them, until the pod goes; one back in its frontend's
// backends serves them again. A pod that closed its connections as it stopped has
// ended these flows already; one that vanished without a FIN (a lost sandbox or
// node) has not, and its clients would wait in silence. Only a complete view of the
// EndpointSlices (listed computes it, only when needed) may say an endpoint is gone.
// What could not be flagged is tried again next round.
func (a *Agent) endGoneTCP(listed func() services.Desired) error {
	if len(a.leftTCP) == 0 {
		return nil
	}
	gone, draining := goneTCP(a.leftTCP, a.syncer.TCPBackends(), listed(), a.podAddresses())
	a.leftTCP = draining
	if len(gone) == 0 {
		return nil
	}
	if a.cfg.Faults.Has(faults.KeepFlowsToGoneBackends) {
		a.log.Warn("fault: TCP flows to gone backends are not flagged", "fault", faults.KeepFlowsToGoneBackends, "backends", fmt.Sprint(gone))
		return nil
	}
	n, err := a.dp.MarkDNATFlowsGone(gone)
	if err != nil {
		a.leftTCP = append(a.leftTCP, gone...)
		return fmt.Errorf("flag the conntrack entries of TCP flows to gone backends %v: %w", gone, err)
	}
	a.log.Info("flagged the conntrack entries of TCP flows to gone backends, to be reset", "backends", fmt.Sprint(gone), "entries", n)
	return nil
}

// findLeftTCP adds to leftTCP, at this run's first complete round, the TCP flows
// in conntrack whose backend their frontend no longer has: a backend removed by an
// earlier run (a spare relabelled out of its Service, still running) whose flows
// waited for its pod to go when that run stopped or was killed. Without it a pod
// that vanishes after the agent's restart leaves those flows hanging, as
// keep-flows-to-gone-backends does. What it cannot read is tried again next round.
func (a *Agent) findLeftTCP() error {
	if a.leftFound {
		return nil
	}
	flows, err := a.dp.TCPDNATFlows()
	if err != nil {
		return err
	}
	a.leftFound = true
	inMaps := a.syncer.TCPBackends()
	var left []bpf.DNATFlows
	for _, f := range flows {
		if !slices.Contains(inMaps[f.Frontend], f.Backend) {
			left = append(left, f)
		}
	}
	if len(left) > 0 {
		a.log.Info("found TCP flows to backends their frontends no longer have, to be ended once their pods go", "flows", fmt.Sprint(left))
		a.leftTCP = append(a.leftTCP, left...)
	}
	return nil
}

// forgetStaleUDP deletes the conntrack entries of UDP flows DNATed to backends their
// frontends no longer have (step 7, once the frontends point at their new backends):
// a UDP client that keeps its 5-tuple has no handshake that would pick a backend
// again, so its flow would go to the removed backend for as long as the entry lives.
// TCP flows are not deleted: the removed backend's RST or FIN ends them (endGoneTCP
// makes sure of it), and a new SYN on their tuple picks a backend again. This is
// kube-proxy's conntrack cleanup.
// What could not be deleted is tried again next round.
func (a *Agent) forgetStaleUDP() error {
	stale := a.staleUDP
	if len(stale) == 0 {
		return nil
	}
	if a.cfg.Faults.Has(faults.KeepUDPConntrackOnBackendRemoval) {
		a.log.Warn("fault: UDP flows to removed backends keep their conntrack entries", "fault", faults.KeepUDPConntrackOnBackendRemoval, "backends", fmt.Sprint(stale))
		a.staleUDP = nil
		return nil
	}
	n, err := a.dp.DeleteDNATFlows(stale)
	if err != nil {
		return fmt.Errorf("delete the conntrack entries of UDP flows to removed backends %v: %w", stale, err)
	}
	a.log.Info("deleted the conntrack entries of UDP flows to removed backends", "backends", fmt.Sprint(stale), "entries", n)
	a.staleUDP = nil
	return nil
}

// goneTCP sorts the TCP backends removed from their frontends (left, duplicates
// allowed) into those whose endpoints are gone (not listed) and those still draining
// (listed, terminating); one back in its frontend's backends (inMaps) is neither.
func goneTCP(left []bpf.DNATFlows, inMaps map[bpf.FrontendKey][]bpf.BackendValue, listed services.Desired, pods map[netip.Addr]bool) (gone, draining []bpf.DNATFlows) {
	isListed := map[bpf.DNATFlows]bool{}
	for _, sp := range listed {
		for _, f := range sp.Frontends {
			for _, b := range sp.Backends {
				isListed[bpf.DNATFlows{Frontend: f, Backend: b}] = true
			}
		}
	}
	seen := map[bpf.DNATFlows]bool{}
	for _, f := range left {
		switch {
		case seen[f]:
		case slices.Contains(inMaps[f.Frontend], f.Backend):
		case isListed[f], pods[f.Backend.Addr]:
			draining = append(draining, f)
		default:
			gone = append(gone, f)
		}
		seen[f] = true
	}
	return gone, draining
}

// podAddresses returns the addresses of the pods that hold one and are not being
// deleted: a backend at such an address still runs, whatever Service it left.
func (a *Agent) podAddresses() map[netip.Addr]bool {
	pods, _ := a.podLister.List(labels.Everything())
	out := map[netip.Addr]bool{}
	for _, p := range pods {
		if p.DeletionTimestamp != nil {
			continue
		}
		for _, ip := range p.Status.PodIPs {
			if addr, err := netip.ParseAddr(ip.IP); err == nil {
				out[addr] = true
			}
		}
	}
	return out
}
