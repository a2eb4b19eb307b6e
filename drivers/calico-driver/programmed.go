package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/moby/sys/mount"
	"github.com/vishvananda/netlink"

	"github.com/dpconform/dpconform/driver/innetns"
)

// What Felix leaves in a node, by name (Calico v3.31, eBPF mode):
//
//   - in the node's bpffs: its maps and pinned programs and links (tc/, calico/ and
//     what else it pins at the top);
//   - links: the workloads' host ends (cali + 11 hex digits, which CNI DEL removes
//     with the pod), bpfin.cali/bpfout.cali (the NAT pair of its host-networked
//     service path), vxlan.calico (NodePort forwarding to other nodes);
//   - programs on interfaces: tcx (and, with BPFAttachType=TC, clsact filters);
//   - its connect-time load balancer on the node's cgroup (connect, sendmsg and
//     recvmsg hooks; links pinned in the bpffs), through a cgroup v2 mount of its own
//     at /run/calico/cgroup;
//   - iptables chains named cali-* in every table, which it keeps in eBPF mode too (a
//     few rules for what BPF hands to the host), and ipsets named cali40*.
var (
	calicoLinkPrefixes = []string{"cali", "bpfin.cali", "bpfout.cali", "vxlan.calico"}
	chainPrefix        = "cali-"
	setPrefix          = "cali"
)

// iptablesVariants are the iptables commands whose rules Felix may have written, by
// the prefix of their -save and -restore: Felix picks the legacy or the nft backend by
// what it finds in the node (here legacy: the kernel has the legacy tables), so both
// are read, for IPv4 and IPv6; plain iptables where the variants are not installed.
func iptablesVariants() []string {
	var out []string
	for _, fam := range []string{"iptables", "ip6tables"} {
		found := false
		for _, v := range []string{fam + "-legacy", fam + "-nft"} {
			if _, err := exec.LookPath(v + "-save"); err == nil {
				out = append(out, v)
				found = true
			}
		}
		if !found {
			out = append(out, fam)
		}
	}
	return out
}

// kernelPins are what the kernel itself puts in every bpffs (bpf_preload's iterators):
// no agent's.
var kernelPins = []string{"maps.debug", "progs.debug"}

// agentPins are the entries of a bpffs that an agent made.
func agentPins(bpffs string) ([]string, error) {
	entries, err := os.ReadDir(bpffs)
	var out []string
	for _, e := range entries {
		if !slices.Contains(kernelPins, e.Name()) {
			out = append(out, e.Name())
		}
	}
	return out, err
}

func isCalicoLink(name string) bool {
	return slices.ContainsFunc(calicoLinkPrefixes, func(p string) bool { return strings.HasPrefix(name, p) })
}

// cgroupHooks are the cgroup attach points of Calico's connect-time load balancer.
var cgroupHooks = []struct {
	name string
	typ  ebpf.AttachType
}{
	{"connect4", ebpf.AttachCGroupInet4Connect}, {"sendmsg4", ebpf.AttachCGroupUDP4Sendmsg}, {"recvmsg4", ebpf.AttachCGroupUDP4Recvmsg},
	{"connect6", ebpf.AttachCGroupInet6Connect}, {"sendmsg6", ebpf.AttachCGroupUDP6Sendmsg}, {"recvmsg6", ebpf.AttachCGroupUDP6Recvmsg},
	{"getpeername4", ebpf.AttachCgroupInet4GetPeername}, {"getpeername6", ebpf.AttachCgroupInet6GetPeername},
}

// cgroupPrograms lists the programs attached to the cgroup at dir (not its children):
// "cgroup connect4 prog 42".
func cgroupPrograms(dir string) ([]string, error) {
	f, err := os.Open(dir)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []string
	for _, h := range cgroupHooks {
		res, err := link.QueryPrograms(link.QueryOptions{Target: int(f.Fd()), Attach: h.typ})
		if err != nil {
			return out, fmt.Errorf("%s programs of cgroup %s: %w", h.name, dir, err)
		}
		for _, p := range res.Programs {
			out = append(out, fmt.Sprintf("cgroup %s prog %d", h.name, p.ID))
		}
	}
	return out, nil
}

// detachCgroupPrograms detaches every program on the cgroup hooks of dir.
func detachCgroupPrograms(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	var errs []error
	for _, h := range cgroupHooks {
		errs = append(errs, detachAll(int(f.Fd()), h.typ, "cgroup "+dir+" "+h.name))
	}
	return errors.Join(errs...)
}

// detachAll detaches every program attached to target (a cgroup's file descriptor or
// an interface's index) at typ: through its link when it has one, else directly.
// Unpinning Felix's links is not enough on its own: what still holds a link (or a
// program attached without one) keeps it attached.
func detachAll(target int, typ ebpf.AttachType, what string) error {
	res, err := link.QueryPrograms(link.QueryOptions{Target: target, Attach: typ})
	if err != nil {
		return fmt.Errorf("programs of %s: %w", what, err)
	}
	var errs []error
	for _, p := range res.Programs {
		if id, ok := p.LinkID(); ok {
			l, err := link.NewFromID(id)
			if err != nil {
				if !errors.Is(err, os.ErrNotExist) {
					errs = append(errs, fmt.Errorf("link %d of %s: %w", id, what, err))
				}
				continue
			}
			if err := l.Detach(); err != nil {
				errs = append(errs, fmt.Errorf("detach link %d of %s: %w", id, what, err))
			}
			l.Close()
			continue
		}
		prog, err := ebpf.NewProgramFromID(p.ID)
		if err != nil {
			if !errors.Is(err, os.ErrNotExist) {
				errs = append(errs, fmt.Errorf("program %d of %s: %w", p.ID, what, err))
			}
			continue
		}
		err = link.RawDetachProgram(link.RawDetachProgramOptions{Target: target, Program: prog, Attach: typ})
		prog.Close()
		// ENOENT: it went meanwhile, or a link holds it that the kernel is releasing
		// (some kernels report no link ID for cgroup programs): the caller waits for it.
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("detach program %d from %s: %w", p.ID, what, err))
		}
	}
	return errors.Join(errs...)
}

// Programmed lists what of Calico's is in the node whose network namespace is at
// netnsPath, whose bpffs is at bpffs and whose cgroup is at cgroupDir ("" to leave
// cgroups out): "bpffs tc", "link bpfin.cali", "tcx ingress eth0 prog 42", "cgroup
// connect4 prog 43", "iptables filter cali-FORWARD", "ipset cali40all-ipam-pools".
// Empty means Calico left nothing. It works from inside the node (the driver) and
// from outside it (a test).
func Programmed(ctx context.Context, netnsPath, bpffs, cgroupDir string) ([]string, error) {
	var out []string
	var errs []error
	if cgroupDir != "" {
		progs, err := cgroupPrograms(cgroupDir)
		out = append(out, progs...)
		if err != nil {
			errs = append(errs, err)
		}
	}
	pins, err := agentPins(bpffs)
	if err != nil {
		errs = append(errs, err)
	}
	for _, p := range pins {
		out = append(out, "bpffs "+p)
	}
	err = innetns.Do(netnsPath, func() error {
		links, err := netlink.LinkList()
		if err != nil {
			return err
		}
		for _, l := range links {
			name := l.Attrs().Name
			if isCalicoLink(name) {
				out = append(out, "link "+name)
			}
			for _, at := range []struct {
				name string
				typ  ebpf.AttachType
			}{{"ingress", ebpf.AttachTCXIngress}, {"egress", ebpf.AttachTCXEgress}} {
				res, err := link.QueryPrograms(link.QueryOptions{Target: l.Attrs().Index, Attach: at.typ})
				if err != nil {
					return fmt.Errorf("tcx programs of %s: %w", name, err)
				}
				for _, p := range res.Programs {
					out = append(out, fmt.Sprintf("tcx %s %s prog %d", at.name, name, p.ID))
				}
			}
			for _, parent := range []uint32{netlink.HANDLE_MIN_INGRESS, netlink.HANDLE_MIN_EGRESS} {
				filters, err := netlink.FilterList(l, parent)
				if err != nil {
					continue // no clsact qdisc
				}
				for _, f := range filters {
					if bf, ok := f.(*netlink.BpfFilter); ok {
						out = append(out, fmt.Sprintf("tc %s %s", name, bf.Name))
					}
				}
			}
		}
		return nil
	})
	if err != nil {
		errs = append(errs, err)
	}
	for _, fam := range iptablesVariants() {
		dump, err := innetns.Output(ctx, netnsPath, nil, fam+"-save")
		if err != nil {
			errs = append(errs, fmt.Errorf("%s-save: %w", fam, err))
			continue
		}
		table := ""
		for _, line := range strings.Split(string(dump), "\n") {
			switch {
			case strings.HasPrefix(line, "*"):
				table = line[1:]
			case strings.HasPrefix(line, ":"):
				if c := strings.Fields(line[1:])[0]; strings.HasPrefix(c, chainPrefix) {
					out = append(out, fam+" "+table+" "+c)
				}
			}
		}
	}
	sets, err := innetns.Output(ctx, netnsPath, nil, "ipset", "list", "-n")
	if err != nil {
		errs = append(errs, fmt.Errorf("ipset list: %w", err))
	}
	for _, s := range strings.Fields(string(sets)) {
		if strings.HasPrefix(s, setPrefix) {
			out = append(out, "ipset "+s)
		}
	}
	return out, errors.Join(errs...)
}

// runDir is Felix's runtime directory in the node's own /run: its cgroup v2 mount for
// the connect-time load balancer, its endpoint status files.
const runDir = "/run/calico"

// unprogram removes what Programmed lists, inside the node (the driver runs there):
// Calico's links, then the programs left on others, then its bpffs pins (which
// detaches the tcx and cgroup links pinned there) and what its cgroup holds without
// a link, its iptables chains and its ipsets; and its /run/calico.
func unprogram(ctx context.Context, bpffs, cgroupDir string) error {
	var errs []error
	links, err := netlink.LinkList()
	if err != nil {
		return err
	}
	for _, l := range links {
		if isCalicoLink(l.Attrs().Name) {
			// ENODEV: the peer of a pair deleted just before (bpfin.cali, bpfout.cali).
			if err := netlink.LinkDel(l); err != nil && !errors.Is(err, syscall.ENODEV) {
				errs = append(errs, fmt.Errorf("delete link %s: %w", l.Attrs().Name, err))
			}
			continue
		}
		// Felix attaches to clsact only with BPFAttachType=TC; a qdisc it did not
		// make would be another implementation's, and the node is Calico's alone.
		for _, q := range mustQdiscs(l) {
			if _, ok := q.(*netlink.Clsact); ok {
				if err := netlink.QdiscDel(q); err != nil {
					errs = append(errs, fmt.Errorf("delete clsact of %s: %w", l.Attrs().Name, err))
				}
			}
		}
	}
	pins, _ := agentPins(bpffs)
	for _, p := range pins {
		if err := os.RemoveAll(filepath.Join(bpffs, p)); err != nil {
			errs = append(errs, err)
		}
	}
	if err := detachCgroupPrograms(cgroupDir); err != nil {
		errs = append(errs, err)
	}
	if links, err = netlink.LinkList(); err != nil {
		return err
	}
	for _, l := range links {
		for _, typ := range []ebpf.AttachType{ebpf.AttachTCXIngress, ebpf.AttachTCXEgress} {
			errs = append(errs, detachAll(l.Attrs().Index, typ, "tcx of "+l.Attrs().Name))
		}
	}
	errs = append(errs, removeRunDir())
	for _, fam := range iptablesVariants() {
		if err := removeChains(ctx, fam); err != nil {
			errs = append(errs, err)
		}
	}
	if err := destroySets(ctx); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// removeRunDir unmounts what Felix mounted under /run/calico (its cgroup v2 view) and
// removes the directory.
func removeRunDir() error {
	if err := mount.RecursiveUnmount(runDir); err != nil {
		return fmt.Errorf("unmount what Felix mounted under %s: %w", runDir, err)
	}
	return os.RemoveAll(runDir)
}

func mustQdiscs(l netlink.Link) []netlink.Qdisc {
	qs, _ := netlink.QdiscList(l)
	return qs
}

// removeChains removes Calico's chains from every table of fam, the rules that jump
// to them from other chains first, in one iptables-restore transaction.
func removeChains(ctx context.Context, fam string) error {
	dump, err := exec.CommandContext(ctx, fam+"-save").Output()
	if err != nil {
		return fmt.Errorf("%s-save: %w", fam, err)
	}
	script := removeChainsScript(string(dump))
	if script == "" {
		return nil
	}
	cmd := exec.CommandContext(ctx, fam+"-restore", "--noflush")
	cmd.Stdin = strings.NewReader(script)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("remove Calico's %s chains: %w: %s", fam, err, out)
	}
	return nil
}

// removeChainsScript is the iptables-restore --noflush input that removes Calico's
// chains from the tables of an iptables-save dump: per table, the jumps to them from
// other chains, then their rules, then the chains.
func removeChainsScript(dump string) string {
	type edit struct{ deletes, flushes, removes strings.Builder }
	var tables []string
	edits := map[string]*edit{}
	var cur *edit
	for _, line := range strings.Split(dump, "\n") {
		switch {
		case strings.HasPrefix(line, "*"):
			table := strings.TrimSpace(line[1:])
			tables = append(tables, table)
			cur = &edit{}
			edits[table] = cur
		case cur == nil:
		case strings.HasPrefix(line, ":"):
			if c := strings.Fields(line[1:])[0]; strings.HasPrefix(c, chainPrefix) {
				fmt.Fprintf(&cur.flushes, "-F %s\n", c)
				fmt.Fprintf(&cur.removes, "-X %s\n", c)
			}
		case strings.HasPrefix(line, "-A "):
			rest := line[len("-A "):]
			chain, _, _ := strings.Cut(rest, " ")
			if !strings.HasPrefix(chain, chainPrefix) && slices.ContainsFunc(strings.Fields(rest), func(f string) bool { return strings.HasPrefix(f, chainPrefix) }) {
				cur.deletes.WriteString("-D " + rest + "\n")
			}
		}
	}
	var script strings.Builder
	for _, t := range tables {
		e := edits[t]
		if e.removes.Len() == 0 && e.deletes.Len() == 0 {
			continue
		}
		script.WriteString("*" + t + "\n" + e.deletes.String() + e.flushes.String() + e.removes.String() + "COMMIT\n")
	}
	return script.String()
}

// destroySets destroys Calico's ipsets, once no rule refers to them.
func destroySets(ctx context.Context) error {
	sets, err := exec.CommandContext(ctx, "ipset", "list", "-n").Output()
	if err != nil {
		return fmt.Errorf("ipset list: %w", err)
	}
	var errs []error
	for _, s := range strings.Fields(string(sets)) {
		if !strings.HasPrefix(s, setPrefix) {
			continue
		}
		if out, err := exec.CommandContext(ctx, "ipset", "destroy", s).CombinedOutput(); err != nil {
			errs = append(errs, fmt.Errorf("ipset destroy %s: %w: %s", s, err, out))
		}
	}
	return errors.Join(errs...)
}
