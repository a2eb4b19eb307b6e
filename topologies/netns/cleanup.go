package netns

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/moby/sys/mount"
	"github.com/moby/sys/mountinfo"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/dpconform/dpconform/driver/proc"
)

const (
	// RunPrefix starts every run ID; a run ID is RunPrefix and five hex digits, and
	// starts every name the run makes (namespaces, root links, run directory).
	RunPrefix = "dpc"
	// EnvRun marks every process a run starts (DPC_RUN=<run ID>), so that cleanup finds
	// them even outside the run's namespaces.
	EnvRun = "DPC_RUN"
)

var runIDPattern = regexp.MustCompile(`^` + RunPrefix + `[0-9a-f]{5}$`)

// DefaultRunRoot is where run directories are made: $TMPDIR/dpconform.
func DefaultRunRoot() string { return filepath.Join(os.TempDir(), "dpconform") }

type owner struct {
	PID       int    `json:"pid"`
	StartTime uint64 `json:"startTime"` // /proc/PID/stat field 22, to tell a reused PID
}

// newRun picks a run ID and makes its directory under root, owned by this process
// (so that cleanup tells a live run from a killed one).
func newRun(root string) (id, dir string, err error) {
	var b [3]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", "", err
	}
	id = RunPrefix + hex.EncodeToString(b[:])[:5]
	dir = filepath.Join(root, id)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", "", fmt.Errorf("create run directory: %w", err)
	}
	if err := writeOwner(dir); err != nil {
		os.RemoveAll(dir)
		return "", "", err
	}
	return id, dir, nil
}

func writeOwner(dir string) error {
	st, err := proc.StartTime(os.Getpid())
	if err != nil {
		return err
	}
	data, _ := json.Marshal(owner{PID: os.Getpid(), StartTime: st})
	return os.WriteFile(filepath.Join(dir, "owner.json"), data, 0o644)
}

// ownerAlive reports whether the process that made the run in dir still runs.
func ownerAlive(dir string) bool {
	data, err := os.ReadFile(filepath.Join(dir, "owner.json"))
	if err != nil {
		return false
	}
	var o owner
	if json.Unmarshal(data, &o) != nil {
		return false
	}
	st, err := proc.StartTime(o.PID)
	return err == nil && st == o.StartTime
}

// lockRunRoot serialises the choice of a fabric subnet between concurrent runs.
func lockRunRoot(root string) (func(), error) {
	if err := os.MkdirAll(root, 0o755); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(filepath.Join(root, ".lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, err
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
		f.Close()
		return nil, fmt.Errorf("lock %s: %w", f.Name(), err)
	}
	return func() { unix.Flock(int(f.Fd()), unix.LOCK_UN); f.Close() }, nil
}

// CleanupOptions select what Cleanup removes.
type CleanupOptions struct {
	// RunRoot is where run directories live (default DefaultRunRoot()).
	RunRoot string
	// RunIDs, when set, names the runs to remove, alive or not. Otherwise Cleanup
	// removes every run whose owning process is gone.
	RunIDs []string
	// Logf reports what is removed; nil discards it.
	Logf func(format string, args ...any)
}

// Cleanup removes what killed runs left: processes, namespaces, root links, bpffs
// mounts and run directories. It is idempotent, and it leaves runs whose owner is still
// alive alone unless they are named. It returns the run IDs it removed.
func Cleanup(opts CleanupOptions) ([]string, error) {
	if opts.RunRoot == "" {
		opts.RunRoot = DefaultRunRoot()
	}
	logf := opts.Logf
	if logf == nil {
		logf = func(string, ...any) {}
	}
	candidates := map[string]bool{}
	for _, id := range opts.RunIDs {
		if !runIDPattern.MatchString(id) {
			return nil, fmt.Errorf("%q is not a run ID (want %s and five hex digits, e.g. %s1a2b3)", id, RunPrefix, RunPrefix)
		}
		candidates[id] = true
	}
	if len(opts.RunIDs) == 0 {
		for _, id := range leftoverRunIDs(opts.RunRoot) {
			if !ownerAlive(filepath.Join(opts.RunRoot, id)) {
				candidates[id] = true
			}
		}
	}
	ids := make([]string, 0, len(candidates))
	for id := range candidates {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	var errs []error
	for _, id := range ids {
		logf("removing run %s", id)
		if err := removeRun(id, filepath.Join(opts.RunRoot, id)); err != nil {
			errs = append(errs, fmt.Errorf("run %s: %w", id, err))
		}
	}
	return ids, errors.Join(errs...)
}

// leftoverRunIDs finds run IDs in every place a run leaves a trace.
func leftoverRunIDs(root string) []string {
	seen := map[string]bool{}
	add := func(name string) {
		if i := strings.IndexByte(name, '-'); i > 0 {
			name = name[:i]
		}
		if runIDPattern.MatchString(name) {
			seen[name] = true
		}
	}
	if entries, err := os.ReadDir(root); err == nil {
		for _, e := range entries {
			add(e.Name())
		}
	}
	if entries, err := os.ReadDir(netnsDir); err == nil {
		for _, e := range entries {
			add(e.Name())
		}
	}
	if links, err := netlink.LinkList(); err == nil {
		for _, l := range links {
			add(l.Attrs().Name)
		}
	}
	for _, pid := range procPIDs() {
		if id := envOf(pid, EnvRun); id != "" {
			add(id)
		}
	}
	// A run's cgroup, the last trace of a run whose cleanup was cut short.
	if rc := runCgroup(RunPrefix + "00000"); rc != "" {
		if entries, err := os.ReadDir(filepath.Dir(rc)); err == nil {
			for _, e := range entries {
				if e.IsDir() {
					add(e.Name())
				}
			}
		}
	}
	out := make([]string, 0, len(seen))
	for id := range seen {
		out = append(out, id)
	}
	return out
}

// removeRun removes everything of one run. Each step goes on past errors.
func removeRun(id, dir string) error {
	var errs []error
	var nsNames []string
	if entries, err := os.ReadDir(netnsDir); err == nil {
		for _, e := range entries {
			if strings.HasPrefix(e.Name(), id+"-") {
				nsNames = append(nsNames, e.Name())
			}
		}
	}
	paths := make([]string, len(nsNames))
	for i, n := range nsNames {
		paths[i] = netnsPath(n)
	}
	if err := killRunProcesses(id, paths); err != nil {
		errs = append(errs, err)
	}
	// What is left in the run's cgroups (a process that shed DPC_RUN and left the
	// namespaces) goes with them.
	if err := removeCgroupTree(runCgroup(id)); err != nil {
		errs = append(errs, err)
	}
	if rc := runCgroup(id); rc != "" {
		_ = unix.Rmdir(filepath.Dir(rc)) // the parent, once no run uses it
	}
	for _, n := range nsNames {
		if err := deleteNamedNS(n); err != nil {
			errs = append(errs, err)
		}
	}
	if l, err := netlink.LinkByName(id + "-h"); err == nil {
		if err := netlink.LinkDel(l); err != nil {
			errs = append(errs, fmt.Errorf("delete link %s: %w", id+"-h", err))
		}
	}
	if err := unmountUnder(dir); err != nil {
		errs = append(errs, err)
	}
	if err := os.RemoveAll(dir); err != nil {
		errs = append(errs, fmt.Errorf("remove %s: %w", dir, err))
	}
	// Remove the run root too once the last run is gone (a lone lock file remains
	// otherwise); a concurrent run recreates it.
	root := filepath.Dir(dir)
	if entries, err := os.ReadDir(root); err == nil {
		empty := true
		for _, e := range entries {
			if e.Name() != ".lock" {
				empty = false
			}
		}
		if empty {
			os.Remove(filepath.Join(root, ".lock"))
			os.Remove(root)
		}
	}
	return errors.Join(errs...)
}

// killNetNSProcesses SIGKILLs every process in the given namespaces and waits for them.
func killNetNSProcesses(paths []string) error { return killRunProcesses("", paths) }

// killRunProcesses SIGKILLs every process that carries DPC_RUN=id (when id is set) or
// lives in one of the namespaces at paths, and waits until they are gone.
func killRunProcesses(id string, paths []string) error {
	inodes := map[uint64]bool{}
	for _, p := range paths {
		var st unix.Stat_t
		if err := unix.Stat(p, &st); err == nil {
			inodes[st.Ino] = true
		}
	}
	self := os.Getpid()
	var victims []int
	for _, pid := range procPIDs() {
		if pid == self {
			continue
		}
		match := id != "" && envOf(pid, EnvRun) == id
		if !match && len(inodes) > 0 {
			var st unix.Stat_t
			if unix.Stat(fmt.Sprintf("/proc/%d/ns/net", pid), &st) == nil && inodes[st.Ino] {
				match = true
			}
		}
		if match {
			victims = append(victims, pid)
		}
	}
	return killPIDs(victims)
}

// killPIDs SIGKILLs the processes and waits until they are gone.
func killPIDs(victims []int) error {
	for _, pid := range victims {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	deadline := time.Now().Add(10 * time.Second)
	for _, pid := range victims {
		for {
			// A killed child of ours stays a zombie until reaped; its Wait goroutine
			// does that, and a zombie holds no namespace.
			if !proc.Alive(pid) {
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("process %d of the run did not exit after SIGKILL", pid)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	return nil
}

func procPIDs() []int {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var pids []int
	for _, e := range entries {
		if pid, err := strconv.Atoi(e.Name()); err == nil {
			pids = append(pids, pid)
		}
	}
	return pids
}

func envOf(pid int, key string) string {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
	if err != nil {
		return ""
	}
	prefix := []byte(key + "=")
	for _, kv := range bytes.Split(data, []byte{0}) {
		if bytes.HasPrefix(kv, prefix) {
			return string(kv[len(prefix):])
		}
	}
	return ""
}

// mountsUnder lists the mount points at or below dir, deepest first, so that a mount
// goes before the one it sits on.
func mountsUnder(dir string) ([]string, error) {
	mounts, err := mountinfo.GetMounts(mountinfo.PrefixFilter(dir))
	if err != nil {
		return nil, err
	}
	points := make([]string, 0, len(mounts))
	for _, m := range mounts {
		points = append(points, m.Mountpoint)
	}
	sort.Slice(points, func(i, j int) bool { return len(points[i]) > len(points[j]) })
	return points, nil
}

// unmountUnder detaches every mount at or below dir.
func unmountUnder(dir string) error {
	if err := mount.RecursiveUnmount(dir); err != nil {
		return fmt.Errorf("unmount what is mounted under %s: %w", dir, err)
	}
	return nil
}

// Leftovers lists what of run id remains on this host: network namespaces, root links,
// mounts, processes and the run directory under runRoot ("" for the default). An empty
// list means the run left nothing behind.
func Leftovers(runRoot, id string) []string {
	if runRoot == "" {
		runRoot = DefaultRunRoot()
	}
	dir := filepath.Join(runRoot, id)
	var out []string
	if entries, err := os.ReadDir(netnsDir); err == nil {
		for _, e := range entries {
			if strings.HasPrefix(e.Name(), id+"-") {
				out = append(out, "network namespace "+e.Name())
			}
		}
	}
	if links, err := netlink.LinkList(); err == nil {
		for _, l := range links {
			if strings.HasPrefix(l.Attrs().Name, id+"-") {
				out = append(out, "link "+l.Attrs().Name)
			}
		}
	}
	if mounts, err := mountinfo.GetMounts(nil); err == nil {
		for _, m := range mounts {
			if strings.Contains(m.Mountpoint, id) {
				out = append(out, "mount "+m.Mountpoint)
			}
		}
	}
	for _, pid := range procPIDs() {
		if envOf(pid, EnvRun) == id && proc.Alive(pid) {
			cmd, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
			out = append(out, fmt.Sprintf("process %d (%s)", pid, bytes.ReplaceAll(bytes.TrimRight(cmd, "\x00"), []byte{0}, []byte{' '})))
		}
	}
	if _, err := os.Stat(dir); err == nil {
		out = append(out, "directory "+dir)
	}
	if rc := runCgroup(id); rc != "" {
		if _, err := os.Stat(rc); err == nil {
			out = append(out, "cgroup "+rc)
		}
	}
	return out
}
