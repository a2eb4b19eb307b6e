// Package daemon runs a node's agent the way the node's container runtime would:
// detached from the driver invocation that starts it, in a session of its own, with
// its output appended to a log, and found again by every later invocation of the
// driver from a PID file in the node's state directory (DPC_STATE_DIR).
//
// A driver is a new process for every verb (docs/driver.md), so what it started lives
// on only in files: the PID file holds the agent's PID and the offset of the log where
// that agent's output begins. A PID alone proves nothing: the process may have exited
// and its PID gone to another, so PID also checks the process's command line for the
// agent's identifying arguments.
package daemon

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/dpconform/dpconform/driver/innetns"
	"github.com/dpconform/dpconform/driver/proc"
)

// Daemon is one agent process of one node.
type Daemon struct {
	// Name names the agent in errors and in the line Start writes to its log.
	Name string
	// Dir is the directory of PIDFile and LogFile: the node's state directory.
	Dir string
	// PIDFile and LogFile are file names in Dir.
	PIDFile, LogFile string
	// Identity are arguments the agent's command line holds, each a whole argument:
	// a live process without them is not this node's agent (a reused PID). Choose
	// ones that name the node (its state directory, its configuration file).
	Identity []string
}

// Path returns the path of name in the daemon's directory.
func (d Daemon) Path(name string) string { return filepath.Join(d.Dir, name) }

// LogPath returns the path of the agent's log.
func (d Daemon) LogPath() string { return d.Path(d.LogFile) }

// InNetNS starts a command in the network namespace at path (DPC_NETNS): the launch
// for an agent that runs in a netns node.
func InNetNS(path string) func(*exec.Cmd) error {
	return func(cmd *exec.Cmd) error { return innetns.Do(path, cmd.Start) }
}

// Start starts cmd as the agent, in its own session (so its own process group: it
// outlives the call that started it and the suite's signals, and Kill takes its
// children with it, as a crashed container's go), with its stdout and stderr appended
// to the log, and records its PID. launch starts cmd where the agent runs (InNetNS);
// nil starts it here. Start does not wait for the agent to be ready, nor check that
// it already runs: call PID first.
func (d Daemon) Start(cmd *exec.Cmd, launch func(*exec.Cmd) error) (int, error) {
	if err := os.MkdirAll(d.Dir, 0o755); err != nil {
		return 0, fmt.Errorf("%s's state directory: %w", d.Name, err)
	}
	log, err := os.OpenFile(d.LogPath(), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return 0, fmt.Errorf("open %s's log: %w", d.Name, err)
	}
	defer log.Close()
	cmd.Stdout, cmd.Stderr = log, log
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Setsid = true
	fmt.Fprintf(log, "---- %s: start %s: %s\n", d.Name, time.Now().Format(time.RFC3339Nano), strings.Join(cmd.Args, " "))
	// What this process logs starts here (LogOffset).
	offset, err := log.Seek(0, io.SeekEnd)
	if err != nil {
		return 0, fmt.Errorf("%s's log: %w", d.Name, err)
	}
	if launch == nil {
		launch = (*exec.Cmd).Start
	}
	if err := launch(cmd); err != nil {
		return 0, fmt.Errorf("start %s (%s): %w", d.Name, cmd.Path, err)
	}
	pid := cmd.Process.Pid
	// Reap it if it exits while this process lives; otherwise init does.
	go func() { _ = cmd.Wait() }()
	if err := os.WriteFile(d.Path(d.PIDFile), fmt.Appendf(nil, "%d %d\n", pid, offset), 0o644); err != nil {
		_ = syscall.Kill(-pid, syscall.SIGKILL)
		return 0, fmt.Errorf("write %s's PID file: %w", d.Name, err)
	}
	return pid, nil
}

// record reads the PID file: the PID and log offset of the last start (0 and 0 when
// there is none; a file of a PID alone has offset 0).
func (d Daemon) record() (pid int, offset int64) {
	data, err := os.ReadFile(d.Path(d.PIDFile))
	if err != nil {
		return 0, 0
	}
	f := strings.Fields(string(data))
	if len(f) == 0 || len(f) > 2 {
		return 0, 0
	}
	pid, _ = strconv.Atoi(f[0])
	if len(f) == 2 {
		offset, _ = strconv.ParseInt(f[1], 10, 64)
	}
	return pid, offset
}

// PID returns the PID of the running agent, or 0. A zombie counts as exited, and a
// process without the daemon's Identity is not the agent.
func (d Daemon) PID() int {
	pid, _ := d.record()
	if pid <= 0 || !proc.Alive(pid) {
		return 0
	}
	args := bytes.Split(bytes.TrimSuffix(proc.Cmdline(pid), []byte{0}), []byte{0})
	for _, want := range d.Identity {
		if !slices.ContainsFunc(args, func(a []byte) bool { return string(a) == want }) {
			return 0
		}
	}
	return pid
}

// LogOffset returns the offset in the log where the output of the agent started
// last begins: readiness read from the log counts only what this process wrote, not
// what an earlier process of the same node did.
func (d Daemon) LogOffset() int64 {
	_, offset := d.record()
	return offset
}

// Stop stops the agent with sig (SIGTERM: gracefully) and returns once it has exited
// and then what was left of its process group (proc.StopGroup). Not running is no
// error; an agent that outlives ctx is, naming the log.
func (d Daemon) Stop(ctx context.Context, sig syscall.Signal) error {
	return proc.StopGroup(ctx, d.Name, d.PID(), sig, d.LogPath())
}

// Signal sends sig to the agent alone, not its group, and returns once it has
// exited (at once if it does not run): for an agent whose children are its own to
// end.
func (d Daemon) Signal(ctx context.Context, sig syscall.Signal) error {
	return proc.Signal(ctx, d.Name, d.PID(), sig, d.LogPath())
}

// Kill crashes the agent: SIGKILL to its process group, as a crashed container's
// processes die together, and returns once none of them runs. A child left running
// (an iptables-restore in the middle of a sync) would write the agent's state after
// the crash.
func (d Daemon) Kill(ctx context.Context) error {
	return proc.SignalGroup(ctx, d.Name, d.PID(), syscall.SIGKILL, d.LogPath())
}

// Remove removes the PID file and the log: what Start left in Dir. Call it after the
// agent has stopped (a driver's cleanup).
func (d Daemon) Remove() error {
	var errs []error
	for _, name := range []string{d.PIDFile, d.LogFile} {
		if err := os.Remove(d.Path(name)); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
