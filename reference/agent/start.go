package agent

import (
	"context"
	"fmt"
	"net/netip"
	"os/exec"
	"slices"
	"strings"

	"github.com/vishvananda/netlink"

	"github.com/dpconform/dpconform/bpf"
	"github.com/dpconform/dpconform/reference/faults"
	"github.com/dpconform/dpconform/reference/iptables"
)

// startStep is one of the steps the agent runs once, at start, before its rounds
// (steps 0 and 1 of the package comment).
type startStep int

const (
	startChains  startStep = iota // 0: refdp's chains, with the previous run's workloads
	startAttach                   // 1: the host programs, then this run's on the previous run's endpoints
	startMigrate                  // 1: the previous conntrack map copied into this run's, and dropped
)

var startStepNames = [...]string{"write-chains", "attach", "migrate-conntrack"}

func (s startStep) String() string { return startStepNames[s] }

// startOrder returns the order of the start steps: the package comment's, or with
// the migration first (ct-copy-before-attach), where the previous run's programs
// still run on every hook and go on writing the previous map until the attach: what
// they write after the copy is lost.
func startOrder(f faults.Set) []startStep {
	if f.Has(faults.CTCopyBeforeAttach) {
		return []startStep{startMigrate, startChains, startAttach}
	}
	return []startStep{startChains, startAttach, startMigrate}
}

// writeStartChains writes refdp's chains at start (step 0). They come before the
// programs: the programs drop a fallthrough packet that iptables has not vouched
// for, so the rule that vouches must exist before they are attached, or flows that
// predate the datapath would stall until the first round writes it. The gates keep
// open the workloads a previous run programmed: their programs and policy are still
// attached, and a restart must not cut them. On a node refdp never programmed, the
// pods predate it and ran unfiltered: the gates come with the first round, which
// attaches their programs first.
func (a *Agent) writeStartChains(ctx context.Context) error {
	installed, err := iptables.Installed(ctx)
	if err != nil {
		return err
	}
	prev, err := iptables.Workloads(ctx)
	if err != nil {
		return err
	}
	ungated := !installed
	if installed && a.cfg.Faults.Has(faults.UngatedOnEveryStart) {
		a.log.Warn("fault: chains written without the workload gates on a node refdp programmed before", "fault", faults.UngatedOnEveryStart)
		ungated = true
	}
	return a.writeIPTables(ctx, existingLinks(prev), ungated)
}

// attachAll attaches this run's programs to every hook (step 1): the host
// interface, then the endpoints the previous run attached, their state and policy
// as they are, so that no program of the previous run is left to write a
// previous conntrack map before it is migrated.
func (a *Agent) attachAll() error {
	if err := a.dp.AttachHost(a.hostIdx); err != nil {
		return fmt.Errorf("attach to %s: %w", a.cfg.HostInterface, err)
	}
	if a.cfg.Faults.Has(faults.OpenWhileRestarting) {
		if err := a.reattachFromScratch(); err != nil {
			return err
		}
	}
	n, err := a.dp.ReattachEndpoints()
	if err != nil {
		return err
	}
	a.log.Info("attached this run's programs to the endpoints of the previous run", "endpoints", n)
	return nil
}

// migrateConntrack copies the previous conntrack maps, if any, into the datapath's
// and records what it did in the status file.
func (a *Agent) migrateConntrack() error {
	mig, err := a.dp.MigrateConntrack()
	if err != nil {
		return err
	}
	if len(mig.From) == 0 {
		return nil
	}
	a.log.Info("migrated conntrack", "from", mig.From, "to", a.status.conntrack,
		"copied", mig.Copied, "present", mig.Present, "duration", mig.Duration)
	a.status.migration = &Migration{From: mig.From, Copied: mig.Copied, Present: mig.Present,
		DurationMs: float64(mig.Duration.Microseconds()) / 1000}
	return nil
}

// takeOver removes kube-proxy's rules from the node (see iptables.RemoveKubeProxy).
// Linux conntrack stays: flows that predate the datapath keep their NAT there.
func (a *Agent) takeOver(ctx context.Context) error {
	if a.cfg.Faults.Has(faults.NoKubeProxyCleanup) {
		a.log.Warn("fault: leaving kube-proxy's rules in place", "fault", faults.NoKubeProxyCleanup)
		a.tookOver = true
		return nil
	}
	removed, err := iptables.RemoveKubeProxy(ctx)
	if len(removed) > 0 {
		a.log.Info("removed kube-proxy's rules", "count", len(removed), "removed", removed)
	}
	if err != nil {
		return fmt.Errorf("take over from kube-proxy: %w", err)
	}
	if a.cfg.Faults.Has(faults.FlushConntrackOnTakeover) && len(removed) > 0 {
		out, err := exec.CommandContext(ctx, "conntrack", "-F").CombinedOutput()
		a.log.Warn("fault: flushed the Linux conntrack table", "fault", faults.FlushConntrackOnTakeover, "out", strings.TrimSpace(string(out)), "err", err)
	}
	a.tookOver = true
	return nil
}

// dropClusterIPFrontends is the fault drop-clusterip-frontends-on-start: it keeps the
// frontends on the host interface's addresses (NodePorts) and deletes every other.
func (a *Agent) dropClusterIPFrontends(link netlink.Link) error {
	addrs, err := netlink.AddrList(link, netlink.FAMILY_V4)
	if err != nil {
		return fmt.Errorf("addresses of %s: %w", link.Attrs().Name, err)
	}
	var host []netip.Addr
	for _, a := range addrs {
		if ip, ok := netip.AddrFromSlice(a.IP.To4()); ok {
			host = append(host, ip)
		}
	}
	n, err := a.syncer.DropFrontends(func(k bpf.FrontendKey) bool { return !slices.Contains(host, k.Addr) })
	a.log.Warn("fault: deleted the frontends not on a host IP (ClusterIPs) at start", "fault", faults.DropClusterIPFrontendsOnStart, "deleted", n, "err", err)
	return err
}

// purgeConntrack deletes the conntrack entries of flows of the given services.
func (a *Agent) purgeConntrack(ids []uint32) (int, error) {
	stale := map[uint32]bool{}
	for _, id := range ids {
		stale[id] = true
	}
	var keys []bpf.ConntrackKey
	err := a.dp.Conntrack().Iterate(func(k bpf.ConntrackKey, v bpf.ConntrackValue) bool {
		if stale[v.ServiceID] {
			keys = append(keys, k)
		}
		return true
	})
	for _, k := range keys {
		if derr := a.dp.Conntrack().Delete(k); derr != nil && err == nil {
			err = derr
		}
	}
	return len(keys), err
}
