package netns

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"
)

// A node is more than a network namespace. Real agents hard-code where they live:
// Calico Felix pins under /sys/fs/bpf, Cilium writes /run/cilium whatever its flags
// say, and Cilium's socket load-balancer attaches to "the root cgroup", which on a
// shared host is every process of the machine. So each node also has
//
//   - a mount namespace of its own, a copy of the host's in which /sys/fs/bpf is the
//     node's bpffs, /run is a tmpfs of the node's own (with the host's /run/netns
//     still in it, so that pods' namespaces are seen as they are made), and the
//     cgroup v2 hierarchy is mounted with the node's cgroup as its root;
//   - a cgroup v2 directory of its own, <cgroup2>/dpconform/<run>/<node>, and a
//     cgroup namespace rooted at it; pods run in child cgroups of it, as under a
//     kubelet;
//
// both pinned by bind mounts under the run directory, so that they live as long as
// the run, across the agent's restarts. Node.Start runs a process inside all of the
// node's namespaces and in its cgroup, through nsenter; the suite starts driver calls,
// CNI plugins and node processes that way.

// cgroupParent is the directory under the host's cgroup v2 root that holds every run's
// cgroups.
const cgroupParent = "dpconform"

// cgroup2Root returns where the host mounts the cgroup v2 hierarchy (/sys/fs/cgroup
// on a unified host, /sys/fs/cgroup/unified on a hybrid one), or "" if it does not.
func cgroup2Root() string {
	mounts, err := mountinfo.GetMounts(mountinfo.FSTypeFilter("cgroup2"))
	if err != nil {
		return ""
	}
	var found []string
	for _, m := range mounts {
		found = append(found, m.Mountpoint)
	}
	// The shortest is the host's own; a longer one is a copy made somewhere below.
	sort.Slice(found, func(i, j int) bool { return len(found[i]) < len(found[j]) })
	if len(found) == 0 {
		return ""
	}
	return found[0]
}

// runCgroup is the run's cgroup directory, or "" on a host without cgroup v2.
func runCgroup(id string) string {
	root := cgroup2Root()
	if root == "" {
		return ""
	}
	return filepath.Join(root, cgroupParent, id)
}

// ensureSharedNetnsDir makes the directory of named network namespaces a mount point
// with shared propagation, as `ip netns add` does, so that namespaces made after a
// node's mount namespace are seen inside it. Like iproute2's, the mount stays: it
// changes nothing for anyone else, and other runs may rely on it.
func ensureSharedNetnsDir() error {
	dir, err := filepath.EvalSymlinks(netnsDir)
	if err != nil {
		if !errors.Is(err, os.ErrNotExist) {
			return err
		}
		if err := os.MkdirAll(netnsDir, 0o755); err != nil {
			return err
		}
		if dir, err = filepath.EvalSymlinks(netnsDir); err != nil {
			return err
		}
	}
	shared, mounted := mountPropagation(dir)
	if shared {
		return nil
	}
	if !mounted {
		if err := unix.Mount(dir, dir, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			return fmt.Errorf("bind %s onto itself (as `ip netns add` does): %w", dir, err)
		}
	}
	if err := unix.Mount("", dir, "", unix.MS_SHARED|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("make %s a shared mount (as `ip netns add` does): %w", dir, err)
	}
	return nil
}

// mountPropagation reports whether dir is a mount point, and whether it is shared.
func mountPropagation(dir string) (shared, mounted bool) {
	mounts, err := mountinfo.GetMounts(func(m *mountinfo.Info) (skip, stop bool) { return m.Mountpoint != dir, false })
	if err != nil || len(mounts) == 0 {
		return false, false
	}
	// The last mount on dir is the one seen.
	last := mounts[len(mounts)-1]
	return slices.ContainsFunc(strings.Fields(last.Optional), func(o string) bool { return strings.HasPrefix(o, "shared:") }), true
}

// nsDir is where the run's node namespaces are pinned. It is a bind mount of itself
// with private propagation: a mount namespace can be pinned only on a mount that does
// not propagate into the namespace (hosts with a shared root would refuse it).
func (t *Topology) nsDir() string { return filepath.Join(t.dir, "ns") }

func (t *Topology) prepareNSDir() error {
	dir := t.nsDir()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if err := unix.Mount(dir, dir, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind %s onto itself: %w", dir, err)
	}
	if err := unix.Mount("", dir, "", unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make %s private: %w", dir, err)
	}
	return nil
}

// nodeSetupScript runs as the first process of a node's mount namespace (unshare(1)
// made it with slave propagation: the host's later mounts reach it, its own never
// reach the host). $1... are copies of other runs' and nodes' mounts, dropped so that
// the node holds none of them alive.
const nodeSetupScript = `
mount --bind "$DPC_BPFFS" /sys/fs/bpf
mount --rbind /run/netns "$DPC_HOLD"
mount -t tmpfs -o mode=0755,size=1g dpc-node-run /run
mkdir -p /run/netns
mount --move "$DPC_HOLD" /run/netns
if [ -n "$DPC_CGROUP2" ]; then umount -l "$DPC_CGROUP2" && mount -t cgroup2 cgroup2 "$DPC_CGROUP2"; fi
for m in "$@"; do umount -l "$m" 2>/dev/null || :; done
`

// createNodeNS makes n's cgroup and its mount and cgroup namespaces.
func (t *Topology) createNodeNS(n *node) error {
	unshare, err := exec.LookPath("unshare")
	if err != nil {
		return fmt.Errorf("a node's mount namespace is made with unshare(1): %w (install util-linux)", err)
	}
	if _, err := exec.LookPath("nsenter"); err != nil {
		return fmt.Errorf("processes enter a node with nsenter(1): %w (install util-linux)", err)
	}
	n.mntNS = filepath.Join(t.nsDir(), n.name+"-mnt")
	args := []string{"--mount=" + n.mntNS, "--propagation", "slave"}
	var cg2 string
	if rc := runCgroup(t.runID); rc != "" {
		cg2 = cgroup2Root()
		n.cgroup = filepath.Join(rc, n.name)
		if err := os.MkdirAll(filepath.Join(n.cgroup, "kubepods"), 0o755); err != nil {
			return fmt.Errorf("create the cgroup of %s: %w", n.name, err)
		}
		n.cgroupNS = filepath.Join(t.nsDir(), n.name+"-cgroup")
		args = append(args, "--cgroup="+n.cgroupNS)
	} else {
		t.logf("run %s: this host has no cgroup v2 hierarchy; %s gets no cgroup of its own", t.runID, n.name)
	}
	for _, f := range []string{n.mntNS, n.cgroupNS} {
		if f == "" {
			continue
		}
		if err := os.WriteFile(f, nil, 0o644); err != nil {
			return err
		}
	}
	hold := filepath.Join(t.dir, "nodes", n.name, ".netns")
	if err := os.MkdirAll(hold, 0o755); err != nil {
		return err
	}
	args = append(args, "--", "/bin/sh", "-ec", nodeSetupScript, "sh")
	args = append(args, foreignMounts(filepath.Dir(t.dir), filepath.Join(t.dir, "nodes", n.name))...)
	cmd := exec.Command(unshare, args...)
	cmd.Env = append(os.Environ(), "DPC_BPFFS="+n.bpffs, "DPC_HOLD="+hold, "DPC_CGROUP2="+cg2, EnvRun+"="+t.runID)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	// unshare(1) is started inside the node's cgroup, so that the cgroup namespace it
	// makes is rooted there.
	if err := startInCgroup(n.cgroup, cmd, cmd.Start); err != nil {
		return fmt.Errorf("make the mount namespace of %s: %w", n.name, err)
	}
	if err := cmd.Wait(); err != nil {
		return fmt.Errorf("make the mount namespace of %s: %w: %s", n.name, err, bytes.TrimSpace(out.Bytes()))
	}
	return nil
}

// foreignMounts lists the mount points under runRoot that are not under keep (the
// other runs' and nodes' bpffs mounts and namespace pins), deepest first.
func foreignMounts(runRoot, keep string) []string {
	points, err := mountsUnder(runRoot)
	if err != nil {
		return nil
	}
	var out []string
	for _, mp := range points {
		if mp != runRoot && mp != keep && !strings.HasPrefix(mp, keep+"/") {
			out = append(out, mp)
		}
	}
	return out
}

// startInCgroup calls start (cmd.Start, or one that wraps it) with cmd set to be
// created directly in the cgroup v2 directory cgroup (clone3 CLONE_INTO_CGROUP), so
// that the process never runs a single instruction elsewhere. "" starts it where the
// caller is.
func startInCgroup(cgroup string, cmd *exec.Cmd, start func() error) error {
	if cgroup == "" {
		return start()
	}
	fd, err := unix.Open(cgroup, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open cgroup %s: %w", cgroup, err)
	}
	defer unix.Close(fd)
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.UseCgroupFD = true
	cmd.SysProcAttr.CgroupFD = fd
	return start()
}

// enter rewrites cmd to run inside all of n's namespaces (network, mount, cgroup)
// through nsenter(1), in n's cgroup, in the same working directory.
func (n *node) enter(cmd *exec.Cmd) error {
	if cmd.Err != nil {
		return cmd.Err
	}
	if cmd.Process != nil {
		return errors.New("exec: already started")
	}
	nsenter, err := exec.LookPath("nsenter")
	if err != nil {
		return fmt.Errorf("processes enter a node with nsenter(1): %w (install util-linux)", err)
	}
	// Entering a mount namespace moves the process to its root directory, so the
	// program's path and the working directory are made absolute and kept.
	wd := cmd.Dir
	if wd == "" {
		if wd, err = os.Getwd(); err != nil {
			return err
		}
	}
	if !filepath.IsAbs(wd) {
		if wd, err = filepath.Abs(wd); err != nil {
			return err
		}
	}
	path := cmd.Path
	if !filepath.IsAbs(path) {
		path = filepath.Join(wd, path)
	}
	args := []string{"nsenter", "--net=" + n.NetNSPath(), "--mount=" + n.mntNS, "--wd=" + wd}
	if n.cgroupNS != "" {
		args = append(args, "--cgroup="+n.cgroupNS)
	}
	if n.timeNS != "" {
		args = append(args, "--time="+n.timeNS)
	}
	args = append(args, "--", path)
	cmd.Args = append(args, cmd.Args[1:]...)
	cmd.Path = nsenter
	return nil
}

// Start implements topologies.Host for a node: cmd runs inside the node's network,
// mount and cgroup namespaces and in its cgroup. Unless the caller set SysProcAttr,
// the process gets SIGKILL when this one dies.
func (n *node) Start(cmd *exec.Cmd) error {
	if err := n.enter(cmd); err != nil {
		return err
	}
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	}
	return startInCgroup(n.cgroup, cmd, cmd.Start)
}

// StartDriver implements topologies.Node: on the netns topology a driver call runs
// inside the node, so that what it starts is on the node.
func (n *node) StartDriver(cmd *exec.Cmd) error { return n.Start(cmd) }

// podCgroup is the cgroup of a pod on n: kubepods/<pod> under the node's, as a kubelet
// makes it, or "" if the node has none.
func (n *node) podCgroup(p *pod) string {
	if n.cgroup == "" {
		return ""
	}
	return filepath.Join(n.cgroup, "kubepods", p.containerID)
}

// removeCgroupTree kills what is left in the cgroup directory dir and below, and
// removes the directories deepest first. A missing dir is not an error.
func removeCgroupTree(dir string) error {
	if dir == "" {
		return nil
	}
	if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	var dirs []string
	var pids []int
	_ = filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return nil
		}
		dirs = append(dirs, p)
		pids = append(pids, cgroupPIDs(p)...)
		return nil
	})
	var errs []error
	if len(pids) > 0 {
		if err := killPIDs(pids); err != nil {
			errs = append(errs, err)
		}
	}
	sort.Slice(dirs, func(i, j int) bool { return len(dirs[i]) > len(dirs[j]) })
	// A killed process leaves its cgroup only once it has exited and been reaped
	// (by init, for a run whose owner is gone): until then rmdir says EBUSY.
	deadline := time.Now().Add(cgroupEmptyTimeout)
	for _, d := range dirs {
		for {
			err := unix.Rmdir(d)
			if err == nil || errors.Is(err, unix.ENOENT) {
				break
			}
			if !errors.Is(err, unix.EBUSY) || time.Now().After(deadline) {
				errs = append(errs, fmt.Errorf("remove cgroup %s: %w (processes left: %v)", d, err, cgroupPIDs(d)))
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	return errors.Join(errs...)
}

// cgroupEmptyTimeout is how long a cgroup whose processes were killed may take to
// empty before its removal fails.
const cgroupEmptyTimeout = 10 * time.Second

// cgroupPIDs lists the processes in the cgroup directory dir itself.
func cgroupPIDs(dir string) []int {
	data, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
	if err != nil {
		return nil
	}
	var pids []int
	for _, f := range strings.Fields(string(data)) {
		var pid int
		if _, err := fmt.Sscan(f, &pid); err == nil {
			pids = append(pids, pid)
		}
	}
	return pids
}

// runInNode runs a CNI plugin inside node n (invoke.RawExec's contract: stdin in,
// stdout out, a CNI error object on stdout when it fails).
func runInNode(ctx context.Context, n *node, pluginPath string, stdin []byte, environ []string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, pluginPath)
	cmd.Env = environ
	cmd.Stdin = bytes.NewReader(stdin)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := n.Start(cmd); err != nil {
		return nil, fmt.Errorf("start CNI plugin %s in %s: %w", pluginPath, n.name, err)
	}
	if err := cmd.Wait(); err != nil {
		var cniErr types.Error
		if json.Unmarshal(stdout.Bytes(), &cniErr) == nil && (cniErr.Code != 0 || cniErr.Msg != "") {
			return nil, &cniErr
		}
		return nil, fmt.Errorf("CNI plugin %s: %w (stderr: %s)", filepath.Base(pluginPath), err, bytes.TrimSpace(stderr.Bytes()))
	}
	return stdout.Bytes(), nil
}
