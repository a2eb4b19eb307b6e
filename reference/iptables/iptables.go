// Package iptables programs the node's iptables for the reference dataplane, and takes
// the node over from kube-proxy (see RemoveKubeProxy).
//
// refdp owns four chains of the filter table. Two are jumped to by the first rule of
// their built-in chain, and jump to the other two, the workload gates:
//
//	INPUT   -> REFDP-INPUT:   -i P+ -> REFDP-FROM-WL;
//	                          accept SEEN;
//	                          accept FALLTHROUGH if ESTABLISHED,RELATED.
//	FORWARD -> REFDP-FORWARD: add VOUCHED to FALLTHROUGH if ESTABLISHED,RELATED;
//	                          -o P+ -> REFDP-TO-WL; -i P+ -> REFDP-FROM-WL;
//	                          accept SEEN;
//	                          accept -i W and -o W for each workload interface W;
//	                          accept FALLTHROUGH+VOUCHED.
//	REFDP-TO-WL:              return -o W for each workload interface W; drop.
//	REFDP-FROM-WL:            return -i W for each workload interface W; drop.
//
// P is the name prefix of the host-side interfaces of pods (WorkloadPrefix), W the
// workloads whose programs are attached with their policy. The gates make the node
// fail closed, as Calico's workload dispatch does: a pod interface the agent has not
// programmed (a pod created while it is down, or before its first round reaches it)
// passes nothing either way, where plain routing would forward its traffic past every
// policy. The rules stay when the agent stops, and with them the gates.
//
// SEEN marks a packet the datapath tracked (and NATed if needed). FALLTHROUGH marks a
// mid-flow TCP packet the datapath does not know, typically of a flow that predates
// it: the Linux stack's conntrack (and kube-proxy's NAT recorded in it) may know it,
// hence the conntrack match. A forwarded fallthrough packet whose flow Linux conntrack
// knows is marked VOUCHED first thing: the datapath's egress programs drop a
// fallthrough packet without it, so a mid-flow packet that neither conntrack knows
// never leaves by an interface the datapath manages. The layout mirrors Calico's in eBPF mode: a pre-existing
// flow from or to a workload is accepted by the workload dispatch, and only a flow
// that enters and leaves by the host interface (a NodePort flow to a remote backend)
// depends on FORWARD's own fallthrough accept, the one Calico PR 13778 added.
//
// Every change is computed from one iptables-save and applied in one iptables-restore
// --noflush transaction, as kube-proxy does: no packet sees a half-written chain.
package iptables

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"slices"
	"strings"
)

// Chains the reference owns in the filter table.
const (
	InputChain   = "REFDP-INPUT"
	ForwardChain = "REFDP-FORWARD"
	// ToWorkloadChain and FromWorkloadChain are the workload gates: they return for a
	// programmed workload's interface and drop for any other pod interface.
	ToWorkloadChain   = "REFDP-TO-WL"
	FromWorkloadChain = "REFDP-FROM-WL"
	// legacyChain is the single chain earlier versions jumped to from both INPUT and
	// FORWARD; Ensure and Remove delete it so that an upgraded node holds one layout.
	legacyChain = "REFDP-ACCEPT"
)

// parents maps each chain of ours to the built-in chain that jumps to it first.
var parents = []struct{ builtin, chain string }{
	{"INPUT", InputChain},
	{"FORWARD", ForwardChain},
}

// Marks are the datapath's packet marks (bpf.MarkSeen etc.), passed in so that this
// package does not depend on the datapath's.
type Marks struct {
	Seen, Fallthrough, Vouched, Mask uint32
}

// DefaultWorkloadPrefix is the name prefix of pods' host-side interfaces that the
// ptp CNI plugin gives them.
const DefaultWorkloadPrefix = "veth"

// Config is what the chains are rendered from.
type Config struct {
	Marks Marks
	// WorkloadPrefix is the name prefix of every pod's host-side interface (and of no
	// other interface of the node): traffic from and to an interface with the prefix
	// that is not in Workloads is dropped. Empty: DefaultWorkloadPrefix.
	WorkloadPrefix string
	// Workloads are the host-side interfaces of the workloads the datapath manages,
	// programs and policy attached. FORWARD accepts everything from and to them:
	// their programs police them.
	Workloads []string
	// NoForwardFallthroughAccept leaves FORWARD without its fallthrough accept (the
	// no-forward-fallthrough-accept fault; INPUT keeps its own).
	NoForwardFallthroughAccept bool
	// HostSeenFirst, when set, is the node's host interface: FORWARD accepts what its
	// programs marked SEEN before the gates (the host-seen-before-gates fault), so a
	// packet from another node reaches a pod whose own programs are not there yet.
	HostSeenFirst string
	// Ungated leaves out the jumps to the gates: for the chains an agent writes when it
	// first starts on a node refdp never programmed (Installed is false), whose pods
	// predate it and ran unfiltered (under kube-proxy, say). Closing them before the
	// first round attaches their programs would cut their traffic for that round; the
	// round writes the gates with them in.
	Ungated bool
}

// Rules renders the iptables-restore input that (re)writes the reference's chains.
// Declaring a chain with --noflush flushes it, so the chains end up holding exactly
// these rules. The jumps to them are Ensure's.
func Rules(cfg Config) string {
	var b strings.Builder
	b.WriteString("*filter\n")
	writeChains(&b, cfg)
	b.WriteString("COMMIT\n")
	return b.String()
}

func writeChains(b *strings.Builder, cfg Config) {
	m := cfg.Marks
	seen := func(chain string) {
		fmt.Fprintf(b, "-A %s -m mark --mark %#x/%#x -m comment --comment \"refdp: handled by BPF\" -j ACCEPT\n", chain, m.Seen, m.Mask)
	}
	fallthroughAccept := func(chain string) {
		fmt.Fprintf(b, "-A %s -m mark --mark %#x/%#x -m conntrack --ctstate RELATED,ESTABLISHED -m comment --comment \"refdp: fallthrough of a flow the stack knows\" -j ACCEPT\n", chain, m.Fallthrough, m.Mask)
	}
	prefix := cfg.WorkloadPrefix
	if prefix == "" {
		prefix = DefaultWorkloadPrefix
	}
	ws := workloads(cfg.Workloads)
	fmt.Fprintf(b, ":%s - [0:0]\n:%s - [0:0]\n:%s - [0:0]\n:%s - [0:0]\n", InputChain, ForwardChain, ToWorkloadChain, FromWorkloadChain)

	// A pod's packets to the host pass the gate too: the host is a peer like another.
	if !cfg.Ungated {
		fmt.Fprintf(b, "-A %s -i %s+ -j %s\n", InputChain, prefix, FromWorkloadChain)
	}
	seen(InputChain)
	fallthroughAccept(InputChain)

	// Vouching changes no verdict: it tells the egress programs what Linux conntrack
	// knows, whichever accept below lets the packet through.
	fmt.Fprintf(b, "-A %s -m mark --mark %#x/%#x -m conntrack --ctstate RELATED,ESTABLISHED -m comment --comment \"refdp: the stack knows this fallthrough flow\" -j MARK --set-xmark %#x/%#x\n",
		ForwardChain, m.Fallthrough, m.Mask, m.Vouched, m.Vouched)
	// The gates come before the SEEN accept: the host interface's programs mark
	// SEEN a packet on its way to a workload whose own programs are not there yet.
	if cfg.HostSeenFirst != "" {
		fmt.Fprintf(b, "-A %s -i %s -m mark --mark %#x/%#x -m comment --comment \"refdp: handled by BPF on the host interface\" -j ACCEPT\n",
			ForwardChain, cfg.HostSeenFirst, m.Seen, m.Mask)
	}
	if !cfg.Ungated {
		fmt.Fprintf(b, "-A %s -o %s+ -j %s\n", ForwardChain, prefix, ToWorkloadChain)
		fmt.Fprintf(b, "-A %s -i %s+ -j %s\n", ForwardChain, prefix, FromWorkloadChain)
	}
	seen(ForwardChain)
	// The workload dispatch. It comes before the fallthrough accept, as in Calico: a
	// flow from or to a workload never needs the latter.
	for _, w := range ws {
		fmt.Fprintf(b, "-A %s -i %s -m comment --comment \"refdp: from workload\" -j ACCEPT\n", ForwardChain, w)
		fmt.Fprintf(b, "-A %s -o %s -m comment --comment \"refdp: to workload\" -j ACCEPT\n", ForwardChain, w)
	}
	if !cfg.NoForwardFallthroughAccept {
		fmt.Fprintf(b, "-A %s -m mark --mark %#x/%#x -m comment --comment \"refdp: fallthrough of a flow the stack knows\" -j ACCEPT\n", ForwardChain, m.Fallthrough|m.Vouched, m.Mask)
	}

	for _, w := range ws {
		fmt.Fprintf(b, "-A %s -o %s -j RETURN\n", ToWorkloadChain, w)
	}
	fmt.Fprintf(b, "-A %s -m comment --comment \"refdp: workload not programmed yet\" -j DROP\n", ToWorkloadChain)
	for _, w := range ws {
		fmt.Fprintf(b, "-A %s -i %s -j RETURN\n", FromWorkloadChain, w)
	}
	fmt.Fprintf(b, "-A %s -m comment --comment \"refdp: workload not programmed yet\" -j DROP\n", FromWorkloadChain)
}

// workloads returns names sorted and without duplicates, so that the same set always
// renders the same rules.
func workloads(names []string) []string {
	out := slices.Clone(names)
	slices.Sort(out)
	return slices.Compact(out)
}

// Ensure writes the reference's chains and makes the jump to each the first rule of
// its built-in chain, removing chains of earlier versions, in one transaction.
func Ensure(ctx context.Context, cfg Config) error {
	for _, w := range cfg.Workloads {
		if w == "" || strings.ContainsAny(w, " \t\"\\") {
			return fmt.Errorf("iptables: bad workload interface name %q", w)
		}
	}
	if strings.ContainsAny(cfg.WorkloadPrefix, " \t\"\\+") {
		return fmt.Errorf("iptables: bad workload interface prefix %q", cfg.WorkloadPrefix)
	}
	d, err := save(ctx, "iptables-save", "-t", "filter")
	if err != nil {
		return err
	}
	if err := restore(ctx, "iptables-restore", ensureScript(d, cfg)); err != nil {
		return fmt.Errorf("write refdp's iptables chains: %w", err)
	}
	return nil
}

// ensureScript is Ensure's transaction, computed from the filter table d holds.
func ensureScript(d *dump, cfg Config) string {
	filter := d.table("filter")
	if filter == nil {
		filter = &table{name: "filter"}
	}
	var b strings.Builder
	b.WriteString("*filter\n")
	if filter.has(legacyChain) {
		fmt.Fprintf(&b, ":%s - [0:0]\n", legacyChain)
	}
	writeChains(&b, cfg)
	for _, p := range parents {
		rules := filter.rulesOf(p.builtin)
		jumps := 0
		for _, r := range rules {
			if r.target == p.chain {
				jumps++
			}
		}
		if jumps == 1 && rules[0].spec == "-j "+p.chain {
			continue // in place
		}
		for _, r := range rules {
			if r.target == p.chain {
				fmt.Fprintf(&b, "-D %s %s\n", r.chain, r.spec)
			}
		}
		fmt.Fprintf(&b, "-I %s 1 -j %s\n", p.builtin, p.chain)
	}
	if filter.has(legacyChain) {
		deleteJumps(&b, filter, legacyChain)
		fmt.Fprintf(&b, "-X %s\n", legacyChain)
	}
	b.WriteString("COMMIT\n")
	return b.String()
}

// Installed reports whether refdp's chains are on the node: whether refdp has
// programmed it before.
func Installed(ctx context.Context) (bool, error) {
	d, err := save(ctx, "iptables-save", "-t", "filter")
	if err != nil {
		return false, err
	}
	filter := d.table("filter")
	return filter != nil && filter.has(ForwardChain), nil
}

// Workloads returns the workload interfaces that refdp's chains accept now, as an
// earlier run of the agent wrote them (none if there are no chains). An agent that
// starts writes its chains with these until its first round knows better: their
// programs and policy are still attached, and an agent restart must not close them.
func Workloads(ctx context.Context) ([]string, error) {
	d, err := save(ctx, "iptables-save", "-t", "filter")
	if err != nil {
		return nil, err
	}
	return workloadsOf(d), nil
}

// workloadsOf returns the workloads of the FORWARD dispatch in d (which earlier
// layouts, without the gates, had too).
func workloadsOf(d *dump) []string {
	filter := d.table("filter")
	if filter == nil {
		return nil
	}
	var out []string
	for _, r := range filter.rulesOf(ForwardChain) {
		t, err := tokens(r.spec)
		if err != nil || r.target != "ACCEPT" || !slices.Contains(t, "refdp: from workload") {
			continue
		}
		if i := slices.Index(t, "-i"); i >= 0 && i+1 < len(t) {
			out = append(out, t[i+1])
		}
	}
	return workloads(out)
}

// Remove deletes the reference's chains and every jump to them, in one transaction.
// It is idempotent.
func Remove(ctx context.Context) error {
	d, err := save(ctx, "iptables-save", "-t", "filter")
	if err != nil {
		return err
	}
	script := removeScript(d)
	if script == "" {
		return nil
	}
	if err := restore(ctx, "iptables-restore", script); err != nil {
		return fmt.Errorf("remove refdp's iptables chains: %w", err)
	}
	return nil
}

// removeScript is Remove's transaction ("" when there is nothing to remove).
func removeScript(d *dump) string {
	filter := d.table("filter")
	if filter == nil {
		return ""
	}
	var ours []string
	for _, c := range []string{InputChain, ForwardChain, ToWorkloadChain, FromWorkloadChain, legacyChain} {
		if filter.has(c) {
			ours = append(ours, c)
		}
	}
	if len(ours) == 0 {
		return ""
	}
	var b strings.Builder
	b.WriteString("*filter\n")
	for _, c := range ours {
		fmt.Fprintf(&b, ":%s - [0:0]\n", c)
	}
	for _, c := range ours {
		// The jumps from our own chains go with their flush above.
		for _, r := range filter.rules {
			if r.target == c && !slices.Contains(ours, r.chain) {
				fmt.Fprintf(&b, "-D %s %s\n", r.chain, r.spec)
			}
		}
	}
	for _, c := range ours {
		fmt.Fprintf(&b, "-X %s\n", c)
	}
	b.WriteString("COMMIT\n")
	return b.String()
}

// deleteJumps writes a -D for every rule of t that jumps to chain from another chain
// (the chain's own rules go with its flush).
func deleteJumps(b *strings.Builder, t *table, chain string) {
	for _, r := range t.rules {
		if r.target == chain && r.chain != chain {
			fmt.Fprintf(b, "-D %s %s\n", r.chain, r.spec)
		}
	}
}

// save runs an iptables-save and parses its output.
func save(ctx context.Context, name string, args ...string) (*dump, error) {
	out, err := run(ctx, nil, name, args...)
	if err != nil {
		return nil, err
	}
	d, err := parseSave(string(out))
	if err != nil {
		return nil, fmt.Errorf("parse %s output: %w", name, err)
	}
	return d, nil
}

// restore applies script with an iptables-restore that leaves every table and chain
// the script does not name alone.
func restore(ctx context.Context, name, script string) error {
	_, err := run(ctx, []byte(script), name, "--noflush", "-w", "5")
	if err != nil {
		return fmt.Errorf("%w\ninput:\n%s", err, script)
	}
	return nil
}

// errNotFound is returned, wrapped, when a tool is not installed.
var errNotFound = errors.New("not found")

// run runs name and returns its standard output; its standard error goes into the
// error (iptables-nft-save warns there about legacy tables, for one).
func run(ctx context.Context, stdin []byte, name string, args ...string) ([]byte, error) {
	if _, err := exec.LookPath(name); err != nil {
		return nil, fmt.Errorf("%s %w: install iptables and nftables (`make deps`)", name, errNotFound)
	}
	cmd := exec.CommandContext(ctx, name, args...)
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, bytes.TrimSpace(stderr.Bytes()))
	}
	return stdout.Bytes(), nil
}
