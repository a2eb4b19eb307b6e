package main

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"

	"github.com/dpconform/dpconform/driver/proc"
	"github.com/moby/sys/mountinfo"
)

// Felix hard-codes two paths outside the node's own /run and /sys/fs/bpf: it loads its
// BPF programs from /usr/lib/calico/bpf (calico-node's image ships them there) and
// keeps files that must outlive it in /var/lib/calico (the MTU it detected, the size
// of its conntrack map). Inside the node (its own mount namespace, docs/driver.md) the
// driver binds the build's objects and a directory of the node's state over them; the
// host sees none of it.
//
// A bind needs its mount point, a directory on the host's file system. Where it is
// missing the driver creates it, with a marker file in each directory it made, and the
// node's cleanup removes those directories again once no Felix runs on the machine
// (removing one while another node's mount is on it would take that mount away).

// markerFile marks a directory the driver made as a mount point.
const markerFile = ".dpconform-calico-driver"

// bind is a directory bound over a path Felix hard-codes.
type bind struct {
	Target, Source string
	ReadOnly       bool
}

func (f *felix) binds() []bind {
	return []bind{
		{Target: "/usr/lib/calico/bpf", Source: f.Build.ObjectDir(), ReadOnly: true},
		{Target: "/var/lib/calico", Source: f.path("var-lib")},
	}
}

// ensureBinds makes each bind that is not in place yet.
func ensureBinds(binds []bind) error {
	for _, b := range binds {
		mounted, err := isMountPoint(b.Target)
		if err != nil {
			return err
		}
		if mounted {
			continue
		}
		if err := mkdirMarked(b.Target); err != nil {
			return fmt.Errorf("make the mount point %s: %w", b.Target, err)
		}
		if err := unix.Mount(b.Source, b.Target, "", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("bind %s over %s: %w", b.Source, b.Target, err)
		}
		if b.ReadOnly {
			if err := unix.Mount("", b.Target, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY, ""); err != nil {
				return fmt.Errorf("make %s read-only: %w", b.Target, err)
			}
		}
	}
	return nil
}

// removeBinds undoes ensureBinds in the node, and removes the mount points the driver
// made once no Felix runs on the machine.
func removeBinds(binds []bind) error {
	var errs []error
	for _, b := range binds {
		for {
			mounted, err := isMountPoint(b.Target)
			if err != nil {
				errs = append(errs, err)
				break
			}
			if !mounted {
				break
			}
			if err := unix.Unmount(b.Target, unix.MNT_DETACH); err != nil {
				errs = append(errs, fmt.Errorf("unmount %s: %w", b.Target, err))
				break
			}
		}
	}
	if felixRuns() {
		return errors.Join(errs...)
	}
	for _, b := range binds {
		errs = append(errs, removeMarked(b.Target))
	}
	return errors.Join(errs...)
}

// mkdirMarked creates dir and its missing parents, each with a marker file.
func mkdirMarked(dir string) error {
	var missing []string
	for d := dir; ; d = filepath.Dir(d) {
		if _, err := os.Stat(d); err == nil {
			break
		} else if !errors.Is(err, os.ErrNotExist) {
			return err
		}
		missing = append(missing, d)
	}
	for i := len(missing) - 1; i >= 0; i-- {
		if err := os.Mkdir(missing[i], 0o755); err != nil && !errors.Is(err, os.ErrExist) {
			return err
		}
		if err := os.WriteFile(filepath.Join(missing[i], markerFile), nil, 0o644); err != nil {
			return err
		}
	}
	return nil
}

// removeMarked removes dir and its parents as long as each holds nothing but the
// marker file: those the driver made and nothing else uses.
func removeMarked(dir string) error {
	for d := dir; d != "/"; d = filepath.Dir(d) {
		entries, err := os.ReadDir(d)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return err
		}
		if len(entries) != 1 || entries[0].Name() != markerFile {
			return nil
		}
		if err := os.Remove(filepath.Join(d, markerFile)); err != nil {
			return err
		}
		if err := os.Remove(d); err != nil {
			return err
		}
	}
	return nil
}

// isMountPoint reports whether something is mounted on path in this mount namespace.
func isMountPoint(path string) (bool, error) {
	mounts, err := mountinfo.GetMounts(mountinfo.SingleEntryFilter(path))
	if err != nil {
		return false, err
	}
	return len(mounts) > 0, nil
}

// cgroup2Dir is where this mount namespace sees the cgroup v2 hierarchy: inside a node,
// whose cgroup namespace is rooted at the node's cgroup, that is the node's cgroup.
func cgroup2Dir() (string, error) {
	mounts, err := mountinfo.GetMounts(mountinfo.FSTypeFilter("cgroup2"))
	if err != nil {
		return "", err
	}
	if len(mounts) == 0 {
		return "", errors.New("no cgroup v2 hierarchy is mounted")
	}
	return mounts[0].Mountpoint, nil
}

// felixRuns reports whether any calico-felix process runs on the machine.
func felixRuns() bool {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return true // cannot tell: keep the mount points
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		argv0, _, _ := bytes.Cut(procCmdline(pid), []byte{0})
		if filepath.Base(string(argv0)) == "calico-felix" && proc.Alive(pid) {
			return true
		}
	}
	return false
}

func procCmdline(pid int) []byte {
	data, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	return data
}
