package netns

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// With Options.ClockSkew, each node (its processes and its pods') and the external
// client read a CLOCK_MONOTONIC of their own, as the machines of a real cluster do:
// each is put in a time namespace (time_namespaces(7)) whose monotonic offset is set
// when it is made, node i at (i+1) skews ahead of the suite's and the external client
// one skew behind. The namespace is made by unshare(1) and pinned under the run's
// namespace directory; every process of the host enters it through nsenter(1), since
// a Go process, having threads, cannot join one itself. Only what userspace reads is
// moved: the kernel's own clock (a BPF program's bpf_ktime_get_ns, a socket's
// timestamps) is the machine's, as it is on every machine.

// clockOffset is the monotonic offset of host i (a node's index; -1 for the external
// client) under skew.
func clockOffset(skew time.Duration, i int) time.Duration {
	if i < 0 {
		return -skew
	}
	return time.Duration(i+1) * skew
}

// checkClockSkew refuses a skew time namespaces cannot give: their offsets are whole
// seconds here (unshare's --monotonic), and no clock may be set below zero, so the
// external client's, one skew behind, needs a machine up for longer than the skew.
func checkClockSkew(skew time.Duration) error {
	if skew == 0 {
		return nil
	}
	if skew < 0 || skew%time.Second != 0 {
		return fmt.Errorf("clock skew %v: want a positive whole number of seconds, e.g. 1000s", skew)
	}
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		return err
	}
	if up := time.Duration(ts.Nano()); up <= skew+time.Minute {
		return fmt.Errorf("clock skew %v: the external client's clock is set one skew behind this machine's, whose CLOCK_MONOTONIC reads only %v; choose a skew under %v", skew, up.Round(time.Second), (up - time.Minute).Truncate(time.Second))
	}
	if _, err := os.Stat("/proc/self/timens_offsets"); err != nil {
		return fmt.Errorf("clock skew: this kernel has no time namespaces (CONFIG_TIME_NS; /proc/self/timens_offsets: %w)", err)
	}
	return nil
}

// createTimeNS makes host h's time namespace with CLOCK_MONOTONIC offset off, pinned
// at <ns dir>/<name>-time.
func (t *Topology) createTimeNS(h *host, off time.Duration) error {
	unshare, err := exec.LookPath("unshare")
	if err != nil {
		return fmt.Errorf("a host's time namespace is made with unshare(1): %w (install util-linux)", err)
	}
	pin := filepath.Join(t.nsDir(), h.name+"-time")
	if err := os.WriteFile(pin, nil, 0o644); err != nil {
		return err
	}
	cmd := exec.Command(unshare, "--time="+pin, "--monotonic="+strconv.FormatInt(int64(off/time.Second), 10), "true")
	cmd.Env = append(os.Environ(), EnvRun+"="+t.runID)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("make the time namespace of %s (monotonic %+v): %w: %s", h.name, off, err, bytes.TrimSpace(out))
	}
	h.timeNS = pin
	t.logf("run %s: %s reads CLOCK_MONOTONIC %+v from this machine's", t.runID, h.name, off)
	return nil
}

// OwnClocks implements topologies.OwnClocks: true when the hosts were given clocks of
// their own (Options.ClockSkew).
func (t *Topology) OwnClocks() bool { return t.skew != 0 }

// SkewedClock is the CLOCK_MONOTONIC offset, from the suite's, that a topology with
// ClockSkew skew gives the host of that name (a node, by its name, or "external"),
// and whether such a host exists in a topology of up to 26 nodes.
func SkewedClock(skew time.Duration, host string) (time.Duration, bool) {
	if host == "external" {
		return clockOffset(skew, -1), true
	}
	for i := range 26 {
		if nodeName(i) == host {
			return clockOffset(skew, i), true
		}
	}
	return 0, false
}

// inTime rewrites cmd, unless h reads the suite's clock, to enter h's time namespace
// first through nsenter(1).
func (h *host) inTime(cmd *exec.Cmd) error {
	if h.timeNS == "" {
		return nil
	}
	nsenter, err := exec.LookPath("nsenter")
	if err != nil {
		return fmt.Errorf("processes enter a host's time namespace with nsenter(1): %w (install util-linux)", err)
	}
	path := cmd.Path
	if !filepath.IsAbs(path) {
		if path, err = filepath.Abs(path); err != nil {
			return err
		}
	}
	cmd.Args = append([]string{"nsenter", "--time=" + h.timeNS, "--", path}, cmd.Args[1:]...)
	cmd.Path = nsenter
	return nil
}
