package iptables

import (
	"context"
	"errors"
	"fmt"
	"strings"
)

// kubeProxyChains are the chains kube-proxy owns, by exact name; kubeProxyPrefixes are
// the prefixes of its per-service and per-endpoint chains. Neither matches KUBE-MARK-*,
// KUBE-FIREWALL, KUBE-KUBELET-CANARY or KUBE-IPTABLES-HINT: those are kubelet's
// (kube-proxy merely shares or duplicates them), and kubelet keeps using them.
var (
	kubeProxyChains = map[string]bool{
		"KUBE-SERVICES":          true,
		"KUBE-NODEPORTS":         true,
		"KUBE-FORWARD":           true,
		"KUBE-EXTERNAL-SERVICES": true,
		"KUBE-POSTROUTING":       true,
		"KUBE-PROXY-FIREWALL":    true,
		"KUBE-PROXY-CANARY":      true,
		"KUBE-NODE-PORT":         true,
	}
	kubeProxyPrefixes = []string{"KUBE-SVC-", "KUBE-SVL-", "KUBE-SEP-", "KUBE-FW-", "KUBE-XLB-", "KUBE-EXT-"}
)

// kubeProxyOwns reports whether chain is one of kube-proxy's (a built-in chain never
// is).
func (t *table) kubeProxyOwns(chain string) bool {
	if t.builtin[chain] {
		return false
	}
	if kubeProxyChains[chain] {
		return true
	}
	for _, p := range kubeProxyPrefixes {
		if strings.HasPrefix(chain, p) {
			return true
		}
	}
	return false
}

// kubeProxyNFTTable is the name of kube-proxy's nftables tables (families ip and ip6).
const kubeProxyNFTTable = "kube-proxy"

// Removed is what RemoveKubeProxy removed, one entry per chain ("iptables nat
// KUBE-SERVICES"), jump ("iptables filter -A FORWARD -m comment ... -j KUBE-FORWARD")
// and nftables table ("nft ip kube-proxy").
type Removed []string

// RemoveKubeProxy takes the node over from a stopped kube-proxy: it removes the chains
// kube-proxy owns and every rule of any other chain, built-in or not, that jumps to
// one, from every table, and kube-proxy's nftables tables. Everything else stays:
// kubelet's chains, other components' rules, and Linux conntrack, whose entries keep
// the NAT of flows that predate the datapath.
//
// Each iptables family is changed in one iptables-restore --noflush transaction that
// covers all its tables, computed from one iptables-save: a packet sees kube-proxy's
// rules or none of them, never a service half-removed. nftables tables go in one nft
// transaction. A family whose tools are not installed is skipped (kube-proxy cannot
// have used it); so are absent nft and absent tables. With nothing of kube-proxy's on
// the node, it changes nothing.
func RemoveKubeProxy(ctx context.Context) (Removed, error) {
	var removed Removed
	var errs []error
	for _, fam := range []string{"iptables", "ip6tables"} {
		d, err := save(ctx, fam+"-save")
		if errors.Is(err, errNotFound) {
			continue
		}
		if err != nil {
			errs = append(errs, err)
			continue
		}
		script, what := kubeProxyScript(d)
		if script == "" {
			continue
		}
		if err := restore(ctx, fam+"-restore", script); err != nil {
			errs = append(errs, fmt.Errorf("remove kube-proxy's %s rules: %w", fam, err))
			continue
		}
		for _, w := range what {
			removed = append(removed, fam+" "+w)
		}
	}
	tables, err := removeKubeProxyNFT(ctx)
	if err != nil {
		errs = append(errs, err)
	}
	removed = append(removed, tables...)
	return removed, errors.Join(errs...)
}

// kubeProxyScript is RemoveKubeProxy's transaction for one family, computed from its
// dump, and what it removes ("" and nil when there is nothing of kube-proxy's). In
// each table: every owned chain is declared (which, with --noflush, flushes it, and
// with it every jump between owned chains); then every jump to an owned chain from a
// chain that stays is deleted; then, unreferenced, the owned chains are deleted.
func kubeProxyScript(d *dump) (string, []string) {
	var b strings.Builder
	var what []string
	for _, t := range d.tables {
		var owned []string
		for _, c := range t.chains {
			if t.kubeProxyOwns(c) {
				owned = append(owned, c)
			}
		}
		var jumps []rule
		for _, r := range t.rules {
			if t.kubeProxyOwns(r.target) && !t.kubeProxyOwns(r.chain) {
				jumps = append(jumps, r)
			}
		}
		if len(owned) == 0 && len(jumps) == 0 {
			continue
		}
		fmt.Fprintf(&b, "*%s\n", t.name)
		for _, c := range owned {
			fmt.Fprintf(&b, ":%s - [0:0]\n", c)
		}
		for _, r := range jumps {
			fmt.Fprintf(&b, "-D %s %s\n", r.chain, r.spec)
			what = append(what, fmt.Sprintf("%s -A %s %s", t.name, r.chain, r.spec))
		}
		for _, c := range owned {
			fmt.Fprintf(&b, "-X %s\n", c)
			what = append(what, t.name+" "+c)
		}
		b.WriteString("COMMIT\n")
	}
	return b.String(), what
}

// removeKubeProxyNFT deletes kube-proxy's nftables tables, in one transaction.
func removeKubeProxyNFT(ctx context.Context) (Removed, error) {
	out, err := run(ctx, nil, "nft", "list", "tables")
	if errors.Is(err, errNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list nftables tables: %w", err)
	}
	var script strings.Builder
	var removed Removed
	for _, line := range strings.Split(string(out), "\n") {
		// "table ip kube-proxy"
		if f := strings.Fields(line); len(f) == 3 && f[0] == "table" && f[2] == kubeProxyNFTTable {
			fmt.Fprintf(&script, "delete table %s %s\n", f[1], f[2])
			removed = append(removed, "nft "+f[1]+" "+f[2])
		}
	}
	if len(removed) == 0 {
		return nil, nil
	}
	if _, err := run(ctx, []byte(script.String()), "nft", "-f", "-"); err != nil {
		return nil, fmt.Errorf("delete kube-proxy's nftables tables: %w", err)
	}
	return removed, nil
}
