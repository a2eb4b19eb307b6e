package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/dpconform/dpconform/driver/skel"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// What of Cilium's the agent leaves in a node (v1.20.2, with this driver's flags),
// which Cleanup removes, as Cilium's own `cilium-dbg post-uninstall-cleanup` does on a
// real node (that tool is not used: it removes /var/lib/cilium and unmounts
// /run/cilium/cgroupv2 whatever the agent's flags were, and it leaves iptables alone):
//
//   - its devices cilium_host and cilium_net (a veth pair), and pods' lxc* veths;
//   - its programs on eth0 (tcx, through links pinned in bpffs) and its socket
//     load-balancer on the node's cgroup (cgroup links pinned in bpffs);
//   - its pins under the node's bpffs: tc/globals (maps) and cilium/ (links, state);
//   - its iptables chains (CILIUM_*) and the jumps to them;
//   - its runtime directory /var/run/cilium in the node's /run, and its files in the
//     node's state directory.

// bpffsEntries are the top-level entries Cilium makes in a bpffs.
var bpffsEntries = []string{"tc", "cilium"}

// isCiliumLink reports whether a device is Cilium's: its own, or a pod's veth, which
// its CNI plugin names lxc + a hash.
func isCiliumLink(name string) bool {
	return strings.HasPrefix(name, "cilium_") || strings.HasPrefix(name, "lxc")
}

// isCiliumProg reports whether a BPF program is Cilium's: every program it attaches is
// named cil_* (its entry points in bpf/*.c).
func isCiliumProg(name string) bool { return strings.HasPrefix(name, "cil_") }

var iptablesTables = []string{"filter", "nat", "mangle", "raw"}

// Programmed lists what of Cilium's is in the node: "link cilium_host", "tc eth0
// tcx/ingress cil_from_netdev", "cgroup / cgroup_inet4_connect cil_sock4_connect",
// "bpffs /sys/fs/bpf/tc", "iptables nat CILIUM_POST_nat", "dir /var/run/cilium".
// Empty means Cilium left nothing.
func (a *agent) Programmed(ctx context.Context) ([]string, error) {
	var out []string
	var errs []error
	links, err := linkNames(ctx)
	errs = append(errs, err)
	for _, l := range links {
		if isCiliumLink(l) {
			out = append(out, "link "+l)
		}
	}
	tc, err := tcPrograms(ctx)
	errs = append(errs, err)
	for _, p := range tc {
		out = append(out, "tc "+p.String())
	}
	if root, err := cgroup2Mount(); err == nil {
		cg, err := cgroupPrograms(ctx, root)
		errs = append(errs, err)
		for _, p := range cg {
			out = append(out, "cgroup "+p.String())
		}
	} else {
		errs = append(errs, err)
	}
	for _, e := range bpffsEntries {
		if _, err := os.Lstat(filepath.Join(bpfRoot, e)); err == nil {
			out = append(out, "bpffs "+filepath.Join(bpfRoot, e))
		}
	}
	chains, err := iptablesChains(ctx)
	errs = append(errs, err)
	for _, c := range chains {
		out = append(out, "iptables "+c)
	}
	for _, d := range []string{runDir, a.path(LibDir), a.path(wrapperDir), a.path(objectsDir), a.path(PIDFile), a.path(LogFile)} {
		if _, err := os.Lstat(d); err == nil {
			out = append(out, "file "+d)
		}
	}
	return out, errors.Join(errs...)
}

// Cleanup kills the agent and removes everything of Cilium's from the node (above),
// then checks that nothing remains. It runs inside the node, like every verb.
func (a *agent) Cleanup(ctx context.Context) error {
	if err := inNode(a.BPFFS); err != nil {
		return err
	}
	if err := a.Kill(ctx); err != nil {
		return err
	}
	var errs []error
	// Unpinning the links detaches the programs on eth0 and the node's cgroup; what
	// was attached without a link is detached below.
	for _, e := range bpffsEntries {
		if err := os.RemoveAll(filepath.Join(bpfRoot, e)); err != nil {
			errs = append(errs, err)
		}
	}
	links, err := linkNames(ctx)
	errs = append(errs, err)
	for _, l := range links {
		// Deleting one end of a veth deletes the other: cilium_net may be gone.
		if isCiliumLink(l) {
			if dev, err := netlink.LinkByName(l); err == nil {
				if err := netlink.LinkDel(dev); err != nil && !errors.Is(err, unix.ENODEV) {
					errs = append(errs, fmt.Errorf("delete %s: %w", l, err))
				}
			}
		}
	}
	errs = append(errs, removeChains(ctx))
	for _, p := range []string{runDir, a.path(LibDir), a.path(wrapperDir), a.path(objectsDir), a.path(PIDFile), a.path(LogFile)} {
		errs = append(errs, os.RemoveAll(p))
	}
	errs = append(errs, unguardHost())
	if err := errors.Join(errs...); err != nil {
		return err
	}
	// A link whose last reference was its pin is released by the kernel shortly
	// after the unpin, and until then its program is still listed on its hook; a
	// program still attached after that was attached without a link, and is
	// detached here.
	if left := a.settle(ctx, 2*time.Second); len(left) == 0 {
		return nil
	}
	tc, err := tcPrograms(ctx)
	errs = append(errs, err)
	for _, p := range tc {
		errs = append(errs, p.detach(ctx))
	}
	if root, err := cgroup2Mount(); err == nil {
		cg, err := cgroupPrograms(ctx, root)
		errs = append(errs, err)
		for _, p := range cg {
			errs = append(errs, p.detach(ctx, root))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	left := a.settle(ctx, 2*time.Second)
	if len(left) > 0 {
		return fmt.Errorf("state of Cilium's remains after cleanup: %s", strings.Join(left, ", "))
	}
	return nil
}

// settle waits up to d, or ctx, until nothing of Cilium's is left in the node, and
// returns what is left.
func (a *agent) settle(ctx context.Context, d time.Duration) []string {
	deadline := time.Now().Add(d)
	for {
		left, err := a.Programmed(ctx)
		if err != nil {
			left = append(left, "(error: "+err.Error()+")")
		}
		if len(left) == 0 || time.Now().After(deadline) {
			return left
		}
		select {
		case <-ctx.Done():
			return left
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// linkNames lists the node's network devices.
func linkNames(context.Context) ([]string, error) {
	links, err := netlink.LinkList()
	if err != nil {
		return nil, fmt.Errorf("list the node's devices: %w", err)
	}
	var names []string
	for _, l := range links {
		names = append(names, l.Attrs().Name)
	}
	return names, nil
}

// tcProgram is a Cilium program attached to a device's traffic control hooks.
type tcProgram struct {
	Dev     string
	Ifindex int
	Kind    string // tcx/ingress, tcx/egress, tc/ingress, tc/egress
	Name    string
	ID      ebpf.ProgramID
	LinkID  link.ID // the tcx link it is attached by; 0 if none
}

func (p tcProgram) String() string { return p.Dev + " " + p.Kind + " " + p.Name }

// tcxAttach are the tcx hooks, by the name of their direction.
var tcxAttach = map[string]ebpf.AttachType{"ingress": ebpf.AttachTCXIngress, "egress": ebpf.AttachTCXEgress}

// detach removes p from its device: a tcx program by its link or, if it has none,
// by BPF_PROG_DETACH; a classic tc filter by removing the device's clsact qdisc with
// every filter on it.
func (p tcProgram) detach(context.Context) error {
	dir, ok := strings.CutPrefix(p.Kind, "tcx/")
	if !ok {
		l, err := netlink.LinkByIndex(p.Ifindex)
		if err != nil {
			return err
		}
		err = netlink.QdiscDel(&netlink.GenericQdisc{QdiscAttrs: netlink.QdiscAttrs{LinkIndex: l.Attrs().Index, Handle: netlink.MakeHandle(0xffff, 0), Parent: netlink.HANDLE_CLSACT}, QdiscType: "clsact"})
		if err != nil && !errors.Is(err, unix.ENOENT) && !errors.Is(err, unix.EINVAL) {
			return fmt.Errorf("remove clsact from %s: %w", p.Dev, err)
		}
		return nil
	}
	if p.LinkID != 0 {
		l, err := link.NewFromID(p.LinkID)
		if errors.Is(err, os.ErrNotExist) {
			return nil // its pin was its last reference: the kernel is releasing it
		}
		if err != nil {
			return fmt.Errorf("tcx link %d of %s: %w", p.LinkID, p, err)
		}
		defer l.Close()
		if err := l.Detach(); err != nil {
			return fmt.Errorf("detach %s: %w", p, err)
		}
		return nil
	}
	prog, err := ebpf.NewProgramFromID(p.ID)
	if err != nil {
		return fmt.Errorf("program %d of %s: %w", p.ID, p, err)
	}
	defer prog.Close()
	if err := link.RawDetachProgram(link.RawDetachProgramOptions{Target: p.Ifindex, Program: prog, Attach: tcxAttach[dir]}); err != nil {
		return fmt.Errorf("detach %s: %w", p, err)
	}
	return nil
}

// tcPrograms lists Cilium's programs on the node's devices: on their tcx hooks, where
// v1.20 attaches on a kernel that has them, and as classic tc filters, where it
// attaches on one that does not.
func tcPrograms(context.Context) ([]tcProgram, error) {
	links, err := netlink.LinkList()
	if err != nil {
		return nil, fmt.Errorf("list the node's devices: %w", err)
	}
	var progs []tcProgram
	var errs []error
	for _, l := range links {
		dev, ifindex := l.Attrs().Name, l.Attrs().Index
		for _, dir := range []string{"ingress", "egress"} {
			res, err := link.QueryPrograms(link.QueryOptions{Target: ifindex, Attach: tcxAttach[dir]})
			if err != nil {
				errs = append(errs, fmt.Errorf("query tcx %s of %s: %w", dir, dev, err))
				continue
			}
			for _, ap := range res.Programs {
				name := programName(ap.ID)
				if !isCiliumProg(name) {
					continue
				}
				lid, _ := ap.LinkID()
				progs = append(progs, tcProgram{Dev: dev, Ifindex: ifindex, Kind: "tcx/" + dir, Name: name, ID: ap.ID, LinkID: lid})
			}
			parent := uint32(netlink.HANDLE_MIN_INGRESS)
			if dir == "egress" {
				parent = netlink.HANDLE_MIN_EGRESS
			}
			filters, err := netlink.FilterList(l, parent)
			if err != nil {
				continue // no clsact qdisc: no classic filter either
			}
			for _, f := range filters {
				if bf, ok := f.(*netlink.BpfFilter); ok && isCiliumProg(bf.Name) {
					progs = append(progs, tcProgram{Dev: dev, Ifindex: ifindex, Kind: "tc/" + dir, Name: bf.Name, ID: ebpf.ProgramID(bf.Id)})
				}
			}
		}
	}
	return progs, errors.Join(errs...)
}

// programName is the name of the program with id, or "" if it is gone.
func programName(id ebpf.ProgramID) string {
	prog, err := ebpf.NewProgramFromID(id)
	if err != nil {
		return ""
	}
	defer prog.Close()
	info, err := prog.Info()
	if err != nil {
		return ""
	}
	return info.Name
}

// cgroupProgram is a Cilium program attached to a cgroup.
type cgroupProgram struct {
	Cgroup     string // relative to the cgroup v2 mount
	AttachType string
	Name       string
	ID         int
}

func (p cgroupProgram) String() string { return "/" + p.Cgroup + " " + p.AttachType + " " + p.Name }

func (p cgroupProgram) detach(ctx context.Context, root string) error {
	_, err := run(ctx, nil, "bpftool", "cgroup", "detach", filepath.Join(root, p.Cgroup), p.AttachType, "id", fmt.Sprint(p.ID))
	return err
}

// cgroupPrograms lists Cilium's programs on the cgroups under root (the node's
// cgroup, mounted as its root in the node).
func cgroupPrograms(ctx context.Context, root string) ([]cgroupProgram, error) {
	out, err := run(ctx, nil, "bpftool", "-j", "cgroup", "tree", root)
	if err != nil {
		return nil, err
	}
	var tree []struct {
		Cgroup   string `json:"cgroup"`
		Programs []struct {
			ID         int    `json:"id"`
			AttachType string `json:"attach_type"`
			Name       string `json:"name"`
		} `json:"programs"`
	}
	if err := json.Unmarshal(out, &tree); err != nil {
		return nil, fmt.Errorf("bpftool cgroup tree %s: %w", root, err)
	}
	var progs []cgroupProgram
	for _, c := range tree {
		rel, err := filepath.Rel(root, c.Cgroup)
		if err != nil || strings.HasPrefix(rel, "..") {
			rel = c.Cgroup
		}
		for _, p := range c.Programs {
			if isCiliumProg(p.Name) {
				progs = append(progs, cgroupProgram{Cgroup: strings.TrimPrefix(rel, "."), AttachType: p.AttachType, Name: p.Name, ID: p.ID})
			}
		}
	}
	return progs, nil
}

// iptablesChains lists Cilium's chains in the node, "nat CILIUM_POST_nat".
func iptablesChains(ctx context.Context) ([]string, error) {
	var out []string
	var errs []error
	for _, t := range iptablesTables {
		dump, err := run(ctx, nil, "iptables-save", "-t", t)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		for _, line := range strings.Split(string(dump), "\n") {
			if rest, ok := strings.CutPrefix(line, ":"); ok {
				if c := strings.Fields(rest)[0]; strings.HasPrefix(c, "CILIUM_") {
					out = append(out, t+" "+c)
				}
			}
		}
	}
	return out, errors.Join(errs...)
}

// removeChains removes Cilium's chains from every table: the jumps to them from other
// chains, then their rules, then the chains, in one iptables-restore transaction per
// table.
func removeChains(ctx context.Context) error {
	var errs []error
	for _, t := range iptablesTables {
		dump, err := run(ctx, nil, "iptables-save", "-t", t)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		var deletes, flushes, removes strings.Builder
		for _, line := range strings.Split(string(dump), "\n") {
			if rest, ok := strings.CutPrefix(line, ":"); ok {
				if c := strings.Fields(rest)[0]; strings.HasPrefix(c, "CILIUM_") {
					fmt.Fprintf(&flushes, "-F %s\n", c)
					fmt.Fprintf(&removes, "-X %s\n", c)
				}
				continue
			}
			rest, ok := strings.CutPrefix(line, "-A ")
			if !ok {
				continue
			}
			chain, _, _ := strings.Cut(rest, " ")
			if strings.HasPrefix(chain, "CILIUM_") {
				continue // flushed with its chain
			}
			if slices.ContainsFunc(strings.Fields(rest), func(f string) bool { return strings.HasPrefix(f, "CILIUM_") }) {
				deletes.WriteString("-D " + rest + "\n")
			}
		}
		if removes.Len() == 0 && deletes.Len() == 0 {
			continue
		}
		script := "*" + t + "\n" + deletes.String() + flushes.String() + removes.String() + "COMMIT\n"
		if _, err := run(ctx, []byte(script), "iptables-restore", "--noflush"); err != nil {
			errs = append(errs, fmt.Errorf("remove Cilium's chains from %s: %w", t, err))
		}
	}
	return errors.Join(errs...)
}

// Diagnostics writes what explains a failed spec into dir and returns the files'
// names: the agent's and its CNI plugin's logs, its status and what it reports of
// itself (status, endpoints, its load-balancing tables), and the node's programs,
// rules, addresses and routes.
func (a *agent) Diagnostics(ctx context.Context, dir string) ([]string, error) {
	d := &skel.Diagnostics{Dir: dir}
	for _, name := range []string{LogFile, "cilium-cni.log"} {
		d.Copy(name, a.path(name))
	}
	d.Write("status.txt", []byte(a.Status(ctx).String()+"\n"), nil)
	if a.PID() != 0 {
		api := apiClient(socketPath)
		for _, q := range []struct{ file, path string }{
			{"healthz.json", "/v1/healthz"},
			{"endpoints.json", "/v1/endpoint"},
			{"statedb-frontends.json", "/statedb/dump/frontends"},
			{"statedb-backends.json", "/statedb/dump/backends"},
			{"statedb-services.json", "/statedb/dump/services"},
			{"statedb-node-addresses.json", "/statedb/dump/node-addresses"},
			{"statedb-devices.json", "/statedb/dump/devices"},
		} {
			body, err := get(ctx, api, q.path)
			d.Write(q.file, body, err)
		}
	}
	prog, err := a.Programmed(ctx)
	d.Write("programmed.txt", []byte(strings.Join(prog, "\n")+"\n"), err)
	root, _ := cgroup2Mount()
	for _, c := range []struct {
		file string
		cmd  []string
	}{
		{"bpftool-links.txt", []string{"bpftool", "link", "show"}},
		{"bpftool-cgroup.txt", []string{"bpftool", "cgroup", "tree", root}},
		{"iptables-save.txt", []string{"iptables-save", "-c"}},
		{"addresses.txt", []string{"ip", "address"}},
		{"routes.txt", []string{"ip", "route", "show", "table", "all"}},
		{"rules.txt", []string{"ip", "rule"}},
	} {
		out, err := run(ctx, nil, c.cmd[0], c.cmd[1:]...)
		d.Write(c.file, out, err)
	}
	return d.Files()
}

// run runs name with args in the node (where the driver runs) and returns its
// output; an error carries the output.
func run(ctx context.Context, stdin []byte, name string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	if stdin != nil {
		cmd.Stdin = strings.NewReader(string(stdin))
	}
	out, err := cmd.Output()
	if err != nil {
		var stderr []byte
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = ee.Stderr
		}
		return out, fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(string(stderr)))
	}
	return out, nil
}
