package kubeproxy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"

	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	"github.com/dpconform/dpconform/driver/innetns"
	"github.com/dpconform/dpconform/driver/skel"
)

// kubeletFirewallChain is the one chain kube-proxy's iptables mode creates (a
// duplicate of kubelet's, with jumps from INPUT and OUTPUT) that `kube-proxy
// --cleanup` deliberately keeps, because on a real node kubelet owns it. A netns node
// has no kubelet, so the fixture removes it.
const kubeletFirewallChain = "KUBE-FIREWALL"

// nftTable is the name of kube-proxy's nftables tables (families ip and ip6).
const nftTable = "kube-proxy"

// iptablesFamilies are the iptables front ends kube-proxy programs (dual-stack when the
// node has IPv6).
var iptablesFamilies = []string{"iptables", "ip6tables"}

// run runs name with args inside the node's network namespace and returns its
// standard output; a failed run's error holds what it said on standard error. A
// missing tool is reported as exec.ErrNotFound.
func (f *Fixture) run(ctx context.Context, stdin []byte, name string, args ...string) ([]byte, error) {
	out, err := innetns.Output(ctx, f.NetNS, stdin, name, args...)
	if notRun := (*exec.Error)(nil); err != nil && !errors.As(err, &notRun) {
		err = fmt.Errorf("%s %s in %s: %w", name, strings.Join(args, " "), f.NetNS, err)
	}
	return out, err
}

// Rules lists what of kube-proxy's is programmed in the node: every KUBE-* chain of
// iptables and ip6tables (any table) as "iptables nat KUBE-SERVICES", kube-proxy's
// nftables tables as "nft ip kube-proxy", and its nfacct counters as "nfacct NAME".
// Empty means kube-proxy left nothing.
func (f *Fixture) Rules(ctx context.Context) ([]string, error) {
	var out []string
	counters, err := f.nfacctLeft()
	errs := []error{err}
	for _, c := range counters {
		out = append(out, "nfacct "+c)
	}
	for _, fam := range iptablesFamilies {
		dump, err := f.run(ctx, nil, fam+"-save")
		if errors.Is(err, exec.ErrNotFound) {
			continue
		}
		if err != nil {
			errs = append(errs, err)
			continue
		}
		for _, c := range kubeChains(dump) {
			out = append(out, fam+" "+c.table+" "+c.chain)
		}
	}
	tables, err := f.run(ctx, nil, "nft", "list", "tables")
	if err != nil && !errors.Is(err, exec.ErrNotFound) {
		errs = append(errs, err)
	}
	for _, line := range strings.Split(string(tables), "\n") {
		if fl := strings.Fields(line); len(fl) == 3 && fl[0] == "table" && fl[2] == nftTable {
			out = append(out, "nft "+fl[1]+" "+fl[2])
		}
	}
	return out, errors.Join(errs...)
}

type tableChain struct{ table, chain string }

// kubeChains returns the KUBE-* chains declared in iptables-save output.
func kubeChains(dump []byte) []tableChain {
	var out []tableChain
	table := ""
	for _, line := range strings.Split(string(dump), "\n") {
		switch {
		case strings.HasPrefix(line, "*"):
			table = line[1:]
		case strings.HasPrefix(line, ":KUBE-"):
			out = append(out, tableChain{table, strings.Fields(line[1:])[0]})
		}
	}
	return out
}

// nfacctCounters are the nfnetlink_acct objects kube-proxy's iptables mode creates
// (for its metrics) and `kube-proxy --cleanup` leaves in the node.
var nfacctCounters = []string{"ct_state_invalid_dropped_pkts", "localhost_nps_accepted_pkts"}

// RemoveLeftovers removes what `kube-proxy --cleanup` keeps on purpose: the
// KUBE-FIREWALL chain of the filter table and the jumps to it, in iptables and
// ip6tables, in one iptables-restore transaction each; and kube-proxy's nfacct
// counters. Run it after --cleanup: a counter that a rule still uses cannot go.
func (f *Fixture) RemoveLeftovers(ctx context.Context) error {
	errs := []error{f.removeNFAcct()}
	for _, fam := range iptablesFamilies {
		dump, err := f.run(ctx, nil, fam+"-save", "-t", "filter")
		if errors.Is(err, exec.ErrNotFound) {
			continue
		}
		if err != nil {
			errs = append(errs, err)
			continue
		}
		var script bytes.Buffer
		found := false
		script.WriteString("*filter\n")
		for _, line := range strings.Split(string(dump), "\n") {
			if strings.HasPrefix(line, ":"+kubeletFirewallChain+" ") {
				found = true
			}
			if strings.HasPrefix(line, "-A ") && strings.HasSuffix(line, " -j "+kubeletFirewallChain) {
				script.WriteString("-D " + line[len("-A "):] + "\n")
			}
		}
		if !found {
			continue
		}
		fmt.Fprintf(&script, "-F %s\n-X %s\nCOMMIT\n", kubeletFirewallChain, kubeletFirewallChain)
		if _, err := f.run(ctx, script.Bytes(), fam+"-restore", "--noflush"); err != nil {
			errs = append(errs, fmt.Errorf("remove %s: %w", kubeletFirewallChain, err))
		}
	}
	return errors.Join(errs...)
}

// Diagnostics writes what a person needs to understand a failure into dir: kube-proxy's
// configuration and log, /healthz and /metrics, iptables-save and ip6tables-save, the
// nftables ruleset and the conntrack table (with its count). It returns the files
// written; a source that fails leaves its error in its file.
func (f *Fixture) Diagnostics(ctx context.Context, dir string) ([]string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("create diagnostics directory: %w", err)
	}
	d := &skel.Diagnostics{Dir: dir}
	for _, name := range []string{LogFile, ConfigFile} {
		d.Copy(name, f.Path(name))
	}
	st := f.Status(ctx)
	d.Write("status.txt", fmt.Appendf(nil, "pid=%d healthz=%v synced=%v pending=%v ready=%v\n%s\n",
		st.PID, st.Healthz, st.Synced, st.Pending, st.Ready(), st.Detail), nil)
	if cfg, err := f.Config.withDefaults(); err == nil && st.PID != 0 {
		if _, body, err := innetns.HTTPGet(ctx, f.NetNS, cfg.MetricsAddress, "/metrics"); err == nil {
			d.Write("metrics.txt", body, nil)
		}
	}
	for _, c := range []struct {
		file string
		argv []string
	}{
		{"iptables-save.txt", []string{"iptables-save", "-c"}},
		{"ip6tables-save.txt", []string{"ip6tables-save", "-c"}},
		{"nft-ruleset.txt", []string{"nft", "list", "ruleset"}},
		{"conntrack.txt", []string{"conntrack", "-L"}},
		{"addresses.txt", []string{"ip", "addr"}},
		{"routes.txt", []string{"ip", "route"}},
	} {
		out, err := f.run(ctx, nil, c.argv[0], c.argv[1:]...)
		d.Write(c.file, out, err)
	}
	return d.Files()
}

// Messages of linux/netfilter/nfnetlink_acct.h, and its NFACCT_NAME attribute.
const (
	nfnlMsgAcctGet = 1
	nfnlMsgAcctDel = 3
	nfacctName     = 1
)

// nfacct sends one nfnetlink_acct request about the counter name in the node.
func (f *Fixture) nfacct(msg int, name string) error {
	return innetns.Do(f.NetNS, func() error {
		req := nl.NewNetlinkRequest(unix.NFNL_SUBSYS_ACCT<<8|msg, unix.NLM_F_ACK)
		req.AddData(&nl.Nfgenmsg{NfgenFamily: unix.AF_UNSPEC, Version: nl.NFNETLINK_V0})
		req.AddData(nl.NewRtAttr(nfacctName, nl.ZeroTerminated(name)))
		_, err := req.Execute(unix.NETLINK_NETFILTER, 0)
		return err
	})
}

// absent reports an nfacct answer that means "no such counter" (or no nfnetlink_acct
// in this kernel).
func absent(err error) bool {
	return errors.Is(err, unix.ENOENT) || errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.EPROTONOSUPPORT)
}

// nfacctLeft lists kube-proxy's nfacct counters that exist in the node.
func (f *Fixture) nfacctLeft() ([]string, error) {
	var out []string
	var errs []error
	for _, name := range nfacctCounters {
		switch err := f.nfacct(nfnlMsgAcctGet, name); {
		case err == nil:
			out = append(out, name)
		case !absent(err):
			errs = append(errs, fmt.Errorf("look up nfacct counter %s: %w", name, err))
		}
	}
	return out, errors.Join(errs...)
}

// removeNFAcct deletes kube-proxy's nfacct counters in the node.
func (f *Fixture) removeNFAcct() error {
	var errs []error
	for _, name := range nfacctCounters {
		if err := f.nfacct(nfnlMsgAcctDel, name); err != nil && !absent(err) {
			errs = append(errs, fmt.Errorf("delete nfacct counter %s: %w", name, err))
		}
	}
	return errors.Join(errs...)
}
