// Package proc reads what the suite and the dataplanes need to know of processes
// from /proc.
package proc

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Alive reports whether pid runs. A zombie does not: an agent that exited after its
// parent (a driver) did is reparented to pid 1, which may never reap it.
func Alive(pid int) bool {
	state, err := field(pid, 0)
	return err == nil && state != "Z" && state != "X"
}

// Cmdline returns the arguments of a live process, NUL-separated, as
// /proc/PID/cmdline has them, or nil if pid does not run.
//
// A process that has just been started can be caught in its exec: its parent's
// Start has returned, its new binary is mapped, but the kernel has not yet laid out
// its arguments, and /proc/PID/cmdline reads empty for some microseconds. Matching
// that against the arguments it is started with says "not ours" (a kube-proxy that
// "does not run" right after it started). Cmdline waits that out, up to 100 ms; a
// process whose cmdline stays empty (a kernel thread that took a reused PID) returns
// empty.
func Cmdline(pid int) []byte {
	deadline := time.Now().Add(100 * time.Millisecond)
	for {
		data, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if err != nil || !Alive(pid) {
			return nil
		}
		if len(data) > 0 || time.Now().After(deadline) {
			return data
		}
		time.Sleep(time.Millisecond)
	}
}

// StartTime is the process's start time in clock ticks since boot (/proc/PID/stat
// field 22), which tells a process apart from a later one with the same PID.
func StartTime(pid int) (uint64, error) {
	s, err := field(pid, 19)
	if err != nil {
		return 0, err
	}
	return strconv.ParseUint(s, 10, 64)
}

// field returns field i of /proc/PID/stat counted from the state (field 3).
func field(pid, i int) (string, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return "", err
	}
	// The command name (field 2) may hold spaces and parentheses; what follows its
	// last ')' is plain.
	j := bytes.LastIndexByte(data, ')')
	if j < 0 {
		return "", fmt.Errorf("unreadable /proc/%d/stat", pid)
	}
	f := strings.Fields(string(data[j+1:]))
	if len(f) <= i {
		return "", fmt.Errorf("unreadable /proc/%d/stat", pid)
	}
	return f[i], nil
}

// Signal sends sig to pid, the process called name, and returns once it has exited
// (at once if it is not running). A process that outlives ctx is an error naming
// hint, where to look for why (its log).
func Signal(ctx context.Context, name string, pid int, sig syscall.Signal, hint string) error {
	if pid == 0 {
		return nil
	}
	if err := syscall.Kill(pid, sig); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("send %s to %s (pid %d): %w", sig, name, pid, err)
	}
	for Alive(pid) {
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s (pid %d) has not exited after %s: %w; see %s", name, pid, sig, ctx.Err(), hint)
		case <-time.After(5 * time.Millisecond):
		}
	}
	return nil
}

// SignalGroup sends sig to the process group pgid (a process started with Setsid or
// Setpgid leads its own, whose ID is its PID) and returns once no live process of the
// group remains. An agent's crash is SIGKILL to its group: in a container its
// children die with it (the PID namespace goes), and a child left running on its own
// (an iptables-restore in the middle of a sync) would write the agent's rules after
// the crash, or after a clean-up that removed them.
func SignalGroup(ctx context.Context, name string, pgid int, sig syscall.Signal, hint string) error {
	if pgid == 0 {
		return nil
	}
	if err := syscall.Kill(-pgid, sig); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("send %s to %s's process group (pgid %d): %w", sig, name, pgid, err)
	}
	for {
		left := groupMembers(pgid)
		if len(left) == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s's process group (pgid %d) has not exited after %s, processes %v remain: %w; see %s", name, pgid, sig, left, ctx.Err(), hint)
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// StopGroup sends sig to pid, the leader of its own process group, waits for it to
// exit, then SIGKILLs what is left of its group and waits for that too: the leader's
// exit ends its group, as the exit of a container's first process ends every process
// in its PID namespace. A child a graceful stop left running (an iptables-restore of
// a sync in progress) would write the agent's rules after a clean-up removed them.
// The kernel allocates no PID that is still a group's ID, so the group signalled
// after the leader's exit is still the leader's.
func StopGroup(ctx context.Context, name string, pid int, sig syscall.Signal, hint string) error {
	if err := Signal(ctx, name, pid, sig, hint); err != nil {
		return err
	}
	return SignalGroup(ctx, name, pid, syscall.SIGKILL, hint)
}

// groupMembers lists the live processes of process group pgid.
func groupMembers(pgid int) []int {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	want := strconv.Itoa(pgid)
	var out []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if g, err := field(pid, 2); err == nil && g == want && Alive(pid) {
			out = append(out, pid)
		}
	}
	return out
}

// OfContainer finds, in this PID namespace, a process of the container with the given
// ID whose command line starts with cmdline (any process of it for an empty cmdline):
// the container's cgroup paths carry its ID whatever the cgroup driver.
func OfContainer(id string, cmdline []byte) (int, error) {
	if len(id) < 12 {
		return 0, fmt.Errorf("container ID %q is too short", id)
	}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0, err
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cg, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cgroup"))
		if err != nil || !bytes.Contains(cg, []byte(id)) {
			continue
		}
		if len(cmdline) == 0 || bytes.HasPrefix(Cmdline(pid), cmdline) {
			return pid, nil
		}
	}
	if len(cmdline) == 0 {
		return 0, fmt.Errorf("no process of container %s", id)
	}
	return 0, fmt.Errorf("no process of container %s runs %q", id, bytes.ReplaceAll(cmdline, []byte{0}, []byte{' '}))
}

// MonotonicOffset is how far CLOCK_MONOTONIC as this process reads it is ahead of
// the kernel's own, from the offsets of its time namespace (time_namespaces(7);
// /proc/self/timens_offsets): zero outside one, or on a kernel without them. A BPF
// program's bpf_ktime_get_ns reads the kernel's clock, whatever namespace the
// program's loader was in; a driver that reports such a time as its node's
// CLOCK_MONOTONIC (the events verb's time_ns) adds this.
func MonotonicOffset() (time.Duration, error) {
	b, err := os.ReadFile("/proc/self/timens_offsets")
	if errors.Is(err, os.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	return parseTimensOffsets(b)
}

// parseTimensOffsets reads the monotonic line of /proc/PID/timens_offsets,
// "monotonic <seconds> <nanoseconds>".
func parseTimensOffsets(b []byte) (time.Duration, error) {
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) != 3 || (f[0] != "monotonic" && f[0] != "1") {
			continue
		}
		sec, err1 := strconv.ParseInt(f[1], 10, 64)
		nsec, err2 := strconv.ParseInt(f[2], 10, 64)
		if err1 != nil || err2 != nil {
			return 0, fmt.Errorf("timens_offsets: bad line %q", line)
		}
		return time.Duration(sec)*time.Second + time.Duration(nsec), nil
	}
	return 0, fmt.Errorf("timens_offsets: no monotonic line in %q", b)
}
