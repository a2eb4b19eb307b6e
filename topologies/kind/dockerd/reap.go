package dockerd

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dpconform/dpconform/driver/proc"
	"github.com/moby/sys/mount"
)

// killUnder SIGKILLs every process whose command line names a path under dir (dockerd,
// its containerd and the shims all do) and waits until they are gone.
func killUnder(dir string) error {
	var victims []int
	self := os.Getpid()
	for _, pid := range pids() {
		// Read directly: proc.Cmdline waits on empty command lines, and every
		// kernel thread has one.
		cmdline, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
		if pid != self && bytes.Contains(cmdline, []byte(dir+"/")) {
			victims = append(victims, pid)
		}
	}
	return killAll(victims)
}

// killCgroups SIGKILLs every process in the cgroups under name in every hierarchy
// (the containers of a daemon whose cgroup-parent is name, and what they started:
// a kind node's kubelet and pods), then removes those cgroups, deepest first.
func killCgroups(name string) error {
	var dirs []string
	roots, _ := filepath.Glob("/sys/fs/cgroup/*")
	roots = append(roots, "/sys/fs/cgroup")
	for _, r := range roots {
		d := filepath.Join(r, name)
		if st, err := os.Stat(d); err == nil && st.IsDir() {
			dirs = append(dirs, d)
		}
	}
	if len(dirs) == 0 {
		return nil
	}
	var all []string
	var victims []int
	for _, d := range dirs {
		filepath.WalkDir(d, func(p string, e fs.DirEntry, err error) error {
			if err != nil || !e.IsDir() {
				return nil
			}
			all = append(all, p)
			data, _ := os.ReadFile(filepath.Join(p, "cgroup.procs"))
			for _, f := range strings.Fields(string(data)) {
				if pid, err := strconv.Atoi(f); err == nil {
					victims = append(victims, pid)
				}
			}
			return nil
		})
	}
	err := killAll(victims)
	// Deepest first: a cgroup with children cannot go.
	sort.Slice(all, func(i, j int) bool { return strings.Count(all[i], "/") > strings.Count(all[j], "/") })
	var errs []error
	for _, p := range all {
		if err := unix.Rmdir(p); err != nil && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, fmt.Errorf("remove cgroup %s: %w", p, err))
		}
	}
	return errors.Join(append([]error{err}, errs...)...)
}

func killAll(victims []int) error {
	for _, pid := range victims {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	deadline := time.Now().Add(10 * time.Second)
	for _, pid := range victims {
		for proc.Alive(pid) {
			if time.Now().After(deadline) {
				return fmt.Errorf("process %d (%s) did not exit after SIGKILL", pid, bytes.ReplaceAll(proc.Cmdline(pid), []byte{0}, []byte{' '}))
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	return nil
}

func pids() []int {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var out []int
	for _, e := range entries {
		if pid, err := strconv.Atoi(e.Name()); err == nil {
			out = append(out, pid)
		}
	}
	return out
}

// unmountUnder detaches every mount at or below dir.
func unmountUnder(dir string) error {
	if err := mount.RecursiveUnmount(dir); err != nil {
		return fmt.Errorf("unmount what is mounted under %s: %w", dir, err)
	}
	return nil
}
