package main

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"sort"
	"strings"

	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"
)

// Nothing of Cilium may touch the host: it runs inside a node (docs/driver.md), whose
// network, mount and cgroup namespaces take its devices, programs, pins, /run and
// socket load-balancer. Two of the settings it writes exist once per machine, whatever
// namespace writes them (pkg/datapath/loader/base.go, v1.20.2):
//
//   - kernel.unprivileged_bpf_disabled=1, which the kernel allows no way back from
//     before a reboot (a host at 2, Debian's default, also keeps unprivileged BPF off,
//     but an administrator may still turn it on);
//   - kernel.timer_migration=0.
//
// Cilium writes both with IgnoreErr: a write that fails is logged ("Failed to write
// sysctl setting") and the agent carries on. So each node sees these two files
// read-only: a read-only bind mount of each over itself, in the node's mount
// namespace, where it stays until the run ends. The host keeps its values; the agent
// runs as it would on a node whose administrator set them (docs/cilium.md).
var hostSysctls = []string{
	"/proc/sys/kernel/unprivileged_bpf_disabled",
	"/proc/sys/kernel/timer_migration",
}

// inNode checks that this process runs inside a netns topology's node, not in the
// host's namespaces: in a mount and a cgroup namespace other than init's, with the
// node's bpffs (bpffs, as the host sees it) on /sys/fs/bpf. The suite runs every node
// verb there; run anywhere else, the agent would change the host.
func inNode(bpffs string) error {
	for _, ns := range []string{"mnt", "cgroup"} {
		self, err := os.Readlink("/proc/self/ns/" + ns)
		if err != nil {
			return fmt.Errorf("cannot tell whether this runs inside a node: %w", err)
		}
		host, err := hostNamespace(ns)
		if err != nil {
			return fmt.Errorf("cannot tell whether this runs inside a node: %w", err)
		}
		if self == host {
			return fmt.Errorf("not inside a node: this process is in the host's %s namespace (%s); the suite runs every verb but info inside the node (docs/driver.md), and run here Cilium would change the host", ns, self)
		}
	}
	if bpffs == "" {
		return errors.New("DPC_BPFFS is not set: a node's agent needs the node's own bpffs")
	}
	var node, root unix.Stat_t
	if err := unix.Stat(bpffs, &node); err != nil {
		return fmt.Errorf("DPC_BPFFS=%s: %w", bpffs, err)
	}
	if err := unix.Stat(bpfRoot, &root); err != nil {
		return fmt.Errorf("%s: %w", bpfRoot, err)
	}
	if node.Dev != root.Dev {
		return fmt.Errorf("%s inside the node is not its bpffs DPC_BPFFS=%s (devices %d and %d)", bpfRoot, bpffs, root.Dev, node.Dev)
	}
	return nil
}

// hostNamespace names the host's namespace of type ns: init's, or where init's cannot be
// read (a VM's init may deny it), kthreadd's, which as a kernel thread is always in
// the initial namespaces.
func hostNamespace(ns string) (string, error) {
	var errs []error
	for _, pid := range []string{"1", "2"} {
		link, err := os.Readlink("/proc/" + pid + "/ns/" + ns)
		if err == nil {
			return link, nil
		}
		errs = append(errs, err)
	}
	return "", errors.Join(errs...)
}

// guardHost makes the host-wide sysctls Cilium writes read-only in this (the node's)
// mount namespace, unless they already are, and checks that a write now fails.
func guardHost() error {
	mounts, err := mountinfo.GetMounts(nil)
	if err != nil {
		return err
	}
	for _, p := range hostSysctls {
		if _, err := os.Stat(p); err != nil {
			continue // a kernel without it: nothing to guard
		}
		if !readOnlyMount(mounts, p) {
			if err := unix.Mount(p, p, "", unix.MS_BIND, ""); err != nil {
				return fmt.Errorf("bind %s onto itself: %w", p, err)
			}
			if err := unix.Mount("", p, "", unix.MS_REMOUNT|unix.MS_BIND|unix.MS_RDONLY, ""); err != nil {
				_ = unix.Unmount(p, unix.MNT_DETACH)
				return fmt.Errorf("make %s read-only in the node: %w", p, err)
			}
		}
		f, err := os.OpenFile(p, os.O_WRONLY, 0)
		if err == nil {
			f.Close()
			return fmt.Errorf("%s is still writable in the node: Cilium would change the host's value", p)
		}
		if !errors.Is(err, unix.EROFS) {
			return fmt.Errorf("%s: want a read-only file system, got %w", p, err)
		}
	}
	return nil
}

// unguardHost removes what guardHost mounted.
func unguardHost() error {
	mounts, err := mountinfo.GetMounts(nil)
	if err != nil {
		return err
	}
	var errs []error
	for _, p := range hostSysctls {
		for readOnlyMount(mounts, p) {
			if err := unix.Unmount(p, unix.MNT_DETACH); err != nil {
				errs = append(errs, fmt.Errorf("unmount %s: %w", p, err))
				break
			}
			if mounts, err = mountinfo.GetMounts(nil); err != nil {
				return err
			}
		}
	}
	return errors.Join(errs...)
}

// readOnlyMount reports whether the last mount on p is a read-only one.
func readOnlyMount(mounts []*mountinfo.Info, p string) bool {
	ro := false
	for _, m := range mounts {
		if m.Mountpoint == p {
			ro = slices.Contains(strings.Split(m.Options, ","), "ro")
		}
	}
	return ro
}

// cgroup2Mount returns where the cgroup v2 hierarchy is mounted in the node: there the
// node's cgroup is its root (docs/driver.md), and the agent attaches its socket
// load-balancer to it.
func cgroup2Mount() (string, error) {
	mounts, err := mountinfo.GetMounts(mountinfo.FSTypeFilter("cgroup2"))
	if err != nil {
		return "", err
	}
	var found []string
	for _, m := range mounts {
		found = append(found, m.Mountpoint)
	}
	if len(found) == 0 {
		return "", errors.New("no cgroup v2 hierarchy is mounted in the node: Cilium's socket load-balancer needs one")
	}
	sort.Slice(found, func(i, j int) bool { return len(found[i]) < len(found[j]) })
	return found[0], nil
}
