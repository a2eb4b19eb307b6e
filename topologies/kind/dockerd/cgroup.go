package dockerd

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// The daemon's containers (the kind nodes, and in them every pod and probe) share
// one cgroup parent, which the scheduler weighs against the host's other tasks as a
// single one of them. On cgroup v1 a task in the root cgroup, as the suite's own
// threads, its drivers, dockerd and the kernel's workers are, weighs cpu.shares 1024
// (nice 0), as much as that whole parent by default. Through the cluster topology on
// a 3-node kind cluster of this 2-core machine, the probes then waited 250-660 ms on
// the run queue while an agent restarted (their threads' schedstat wait; none was
// blocked in the kernel), the host's tasks taking up to half the machine: RESTART-
// ESTABLISHED's runs were void twice in a row in 12 of 22 runs. The parent is given
// the weight of eight host tasks (4 of 16 then): the nodes, as eight host tasks
// would, take the CPU they need before the host's busy threads do.
const (
	// NodeCPUShares is the parent's cpu.shares on cgroup v1 (a nice-0 task weighs
	// 1024).
	NodeCPUShares = 8 * 1024
	// NodeCPUWeight is the same on cgroup v2 (a nice-0 task weighs 100).
	NodeCPUWeight = 8 * 100
)

// cgroupRoot is where the host mounts its cgroup hierarchies.
const cgroupRoot = "/sys/fs/cgroup"

// weighCgroupParent creates the daemon's cgroup parent in the hierarchy that holds
// the cpu controller and gives it the nodes' CPU weight, before dockerd makes any
// container in it; reap removes it with the rest. A host whose cpu controller is not
// mounted, or not delegated to the root's children on cgroup v2, has no weights to
// set, and its nodes run as they did before.
func weighCgroupParent(name string) error {
	if v1 := filepath.Join(cgroupRoot, "cpu"); isFile(filepath.Join(v1, "cpu.shares")) {
		return writeWeight(filepath.Join(v1, name), "cpu.shares", NodeCPUShares)
	}
	ctrl, err := os.ReadFile(filepath.Join(cgroupRoot, "cgroup.subtree_control"))
	if err != nil || !slices.Contains(strings.Fields(string(ctrl)), "cpu") {
		return nil
	}
	return writeWeight(filepath.Join(cgroupRoot, name), "cpu.weight", NodeCPUWeight)
}

func writeWeight(dir, file string, v int) error {
	if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return fmt.Errorf("create the kind nodes' cgroup %s: %w", dir, err)
	}
	if err := os.WriteFile(filepath.Join(dir, file), []byte(strconv.Itoa(v)), 0o644); err != nil {
		return fmt.Errorf("give the kind nodes' cgroup its CPU weight: %w", err)
	}
	return nil
}

func isFile(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.Mode().IsRegular()
}
