package agent

import (
	"context"
	"slices"

	"github.com/vishvananda/netlink"

	"github.com/dpconform/dpconform/bpf"
	"github.com/dpconform/dpconform/reference/faults"
	"github.com/dpconform/dpconform/reference/iptables"
)

// syncIPTables (re)writes refdp's iptables chains when they were not written yet or
// the set of workload interfaces changed since (step 6). The workloads are those
// attached that stay: an endpoint about to be detached is closed first.
func (a *Agent) syncIPTables(ctx context.Context, want map[int]endpoint) error {
	ifindexes := make([]int, 0, len(a.attached))
	for ifindex := range a.attached {
		if _, ok := want[ifindex]; ok {
			ifindexes = append(ifindexes, ifindex)
		}
	}
	slices.Sort(ifindexes)
	if a.iptablesFor != nil && slices.Equal(ifindexes, a.iptablesFor) {
		return nil
	}
	var names []string
	for _, idx := range ifindexes {
		l, err := netlink.LinkByIndex(idx)
		if err != nil {
			// Gone with its pod: the next round detaches it, and the set changes.
			continue
		}
		names = append(names, l.Attrs().Name)
	}
	if err := a.writeIPTables(ctx, names, false); err != nil {
		return err
	}
	a.iptablesFor = ifindexes
	return nil
}

// writeIPTables writes refdp's chains for these workload interfaces (ungated: see
// iptables.Config.Ungated).
func (a *Agent) writeIPTables(ctx context.Context, workloads []string, ungated bool) error {
	cfg := iptables.Config{
		Marks:                      iptables.Marks{Seen: bpf.MarkSeen, Fallthrough: bpf.MarkFallthrough, Vouched: bpf.MarkVouched, Mask: bpf.MarkMask},
		WorkloadPrefix:             a.cfg.WorkloadInterfacePrefix,
		Workloads:                  workloads,
		NoForwardFallthroughAccept: a.cfg.Faults.Has(faults.NoForwardFallthroughAccept),
		Ungated:                    ungated,
	}
	if a.cfg.Faults.Has(faults.HostSeenBeforeGates) {
		cfg.HostSeenFirst = a.cfg.HostInterface
		if a.iptablesFor == nil {
			a.log.Warn("fault: FORWARD accepts the host interface's handled packets before the gates", "fault", faults.HostSeenBeforeGates)
		}
	}
	if cfg.NoForwardFallthroughAccept && a.iptablesFor == nil {
		a.log.Warn("fault: FORWARD has no accept for fallthrough packets", "fault", faults.NoForwardFallthroughAccept)
	}
	if err := iptables.Ensure(ctx, cfg); err != nil {
		return err
	}
	a.log.Info("iptables written", "workloadInterfaces", workloads)
	return nil
}

// existingLinks returns the interfaces of names that exist.
func existingLinks(names []string) []string {
	var out []string
	for _, n := range names {
		if _, err := netlink.LinkByName(n); err == nil {
			out = append(out, n)
		}
	}
	return out
}
