package driver

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Timeouts bound each verb of an exec driver; a conformant driver never needs more.
type Timeouts struct {
	Info, Start, Status, Stop, Kill, Events, Collect, Cleanup time.Duration
}

// DefaultTimeouts are the budgets of the driver contract.
var DefaultTimeouts = Timeouts{
	Info:    10 * time.Second,
	Start:   30 * time.Second,
	Status:  5 * time.Second,
	Stop:    60 * time.Second,
	Kill:    10 * time.Second,
	Events:  10 * time.Second,
	Collect: 60 * time.Second,
	Cleanup: 60 * time.Second,
}

// TimeoutsFor returns the contract's budgets on a topology. On one of real nodes (kind,
// cluster) a start may first have to bring the implementation's image onto the node,
// as refdp's driver loads its image into the node's containerd on its first start
// there: that first start ran past 30 s on 2026-12-03 (2-core machine), so start gets
// 2 minutes there. Every other budget is the same everywhere.
func TimeoutsFor(topology string) Timeouts {
	t := DefaultTimeouts
	if topology == "kind" || topology == "cluster" {
		t.Start = 2 * time.Minute
	}
	return t
}

// maxOutput caps what is kept of a driver's stdout and stderr.
const maxOutput = 4 << 20

// Exec runs a driver executable once per call: `PATH VERB [args]` with the node's
// environment, JSON on stdout, exit 0 on success.
type Exec struct {
	path     string
	timeouts Timeouts
	env      []string
}

var _ Driver = (*Exec)(nil)

// NewExec returns an adapter for the driver executable at path. env is added to every
// call's environment (after this process's own).
func NewExec(path string, timeouts Timeouts, env ...string) (*Exec, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("driver %s: %w (build it, e.g. `make build`, or pass the path of your implementation's driver)", path, err)
	}
	if st.IsDir() || st.Mode()&0o111 == 0 {
		return nil, fmt.Errorf("driver %s is not an executable file (chmod +x it)", path)
	}
	return &Exec{path: path, timeouts: timeouts, env: env}, nil
}

// Path is the driver executable's path.
func (e *Exec) Path() string { return e.path }

// Info implements Driver.
func (e *Exec) Info(ctx context.Context) (Info, error) {
	var info Info
	err := e.call(ctx, e.timeouts.Info, "info", nil, nil, &info)
	if err == nil && info.Name == "" {
		err = &Error{Verb: "info", Kind: "malformed", Message: `reply has no "name"`}
	}
	return info, err
}

// Start implements Driver.
func (e *Exec) Start(ctx context.Context, n Node, opts StartOptions) error {
	var out struct {
		PID int `json:"pid"`
	}
	return e.call(ctx, e.timeouts.Start, "start", &n, opts.Args(), &out)
}

// Status implements Driver.
func (e *Exec) Status(ctx context.Context, n Node) (Status, error) {
	var st struct {
		Running      *bool `json:"running"`
		Ready        *bool `json:"ready"`
		ReadySinceNS int64 `json:"ready_since_ns"`
	}
	if err := e.call(ctx, e.timeouts.Status, "status", &n, nil, &st); err != nil {
		return Status{}, err
	}
	if st.Running == nil || st.Ready == nil {
		return Status{}, &Error{Verb: "status", Node: n.Name, Kind: "malformed", Message: `reply needs boolean "running" and "ready"`}
	}
	if st.ReadySinceNS < 0 || st.ReadySinceNS > 0 && !*st.Ready {
		return Status{}, &Error{Verb: "status", Node: n.Name, Kind: "malformed", Message: fmt.Sprintf(`"ready_since_ns" %d: want the CLOCK_MONOTONIC nanoseconds at which a ready agent became ready, or nothing`, st.ReadySinceNS)}
	}
	return Status{Running: *st.Running, Ready: *st.Ready, ReadySinceNS: st.ReadySinceNS}, nil
}

// Stop implements Driver.
func (e *Exec) Stop(ctx context.Context, n Node) error {
	return e.call(ctx, e.timeouts.Stop, "stop", &n, nil, &struct{}{})
}

// Kill implements Driver.
func (e *Exec) Kill(ctx context.Context, n Node) error {
	return e.call(ctx, e.timeouts.Kill, "kill", &n, nil, &struct{}{})
}

// Events implements Driver.
func (e *Exec) Events(ctx context.Context, n Node, cursor string) (Events, error) {
	var ev Events
	var args []string
	if cursor != "" {
		args = []string{"--cursor", cursor}
	}
	err := e.call(ctx, e.timeouts.Events, "events", &n, args, &ev)
	return ev, err
}

// Collect implements Driver.
func (e *Exec) Collect(ctx context.Context, n Node, dir string) ([]string, error) {
	var out struct {
		Files []string `json:"files"`
	}
	err := e.call(ctx, e.timeouts.Collect, "collect", &n, []string{"--dir", dir}, &out)
	return out.Files, err
}

// Cleanup implements Driver.
func (e *Exec) Cleanup(ctx context.Context, n Node) error {
	return e.call(ctx, e.timeouts.Cleanup, "cleanup", &n, nil, &struct{}{})
}

// limitedBuffer keeps the first max bytes written and discards the rest.
type limitedBuffer struct {
	bytes.Buffer
	max int
}

func (b *limitedBuffer) Write(p []byte) (int, error) {
	if room := b.max - b.Len(); room > 0 {
		b.Buffer.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}

func (e *Exec) call(ctx context.Context, timeout time.Duration, verb string, n *Node, args []string, out any) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, e.path, append([]string{verb}, args...)...)
	cmd.Env = append(os.Environ(), e.env...)
	node := ""
	if n != nil {
		cmd.Env = append(cmd.Env, n.Env...)
		node = n.Name
	}
	stdout := &limitedBuffer{max: maxOutput}
	stderr := &limitedBuffer{max: maxOutput}
	cmd.Stdout, cmd.Stderr = stdout, stderr
	cmd.Stdin = nil
	// A hung driver is killed with everything it started in its process group.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	// A process the driver leaves behind holding its stdout must not hang the suite.
	cmd.WaitDelay = min(2*time.Second, timeout/2)
	var runErr error
	if n != nil && n.Start != nil {
		runErr = n.Start(cmd)
	} else {
		runErr = cmd.Start()
	}
	if runErr == nil {
		runErr = cmd.Wait()
	}
	fail := func(kind string, err error) *Error {
		de := &Error{Verb: verb, Node: node, Kind: kind, Stderr: strings.TrimSpace(stderr.String()), Err: err}
		var reply struct{ Error, Detail string }
		if json.Unmarshal(stdout.Bytes(), &reply) == nil {
			de.Message, de.Detail = reply.Error, reply.Detail
		}
		return de
	}
	switch {
	case errors.Is(runErr, exec.ErrWaitDelay):
		return fail("exec", errors.New("the driver exited but a process it started still holds its stdout or stderr; redirect the agent's output (e.g. to a log file in DPC_STATE_DIR)"))
	case ctx.Err() != nil && errors.Is(ctx.Err(), context.DeadlineExceeded):
		return fail("timeout", fmt.Errorf("no answer within %s; the driver was killed", timeout))
	case runErr != nil:
		var ee *exec.ExitError
		if errors.As(runErr, &ee) {
			return fail("exit", exitReason(ee))
		}
		return fail("exec", runErr)
	}
	dec := json.NewDecoder(bytes.NewReader(stdout.Bytes()))
	if err := dec.Decode(out); err != nil {
		got := stdout.String()
		if len(got) > 200 {
			got = got[:200] + "..."
		}
		return fail("malformed", fmt.Errorf("stdout is not the JSON object the contract asks for (%v); got %q", err, got))
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return fail("malformed", errors.New("stdout has more than one JSON value"))
	}
	return nil
}

// exitReason says how a driver that failed ended. A driver killed by a signal has no
// exit status (ExitCode is -1); its signal is what the report must show: a SIGKILL
// from the OOM killer or a SIGSEGV reads very differently from "exit status -1".
func exitReason(ee *exec.ExitError) error {
	if ws, ok := ee.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		sig := ws.Signal()
		name := unix.SignalName(sig)
		if name == "" {
			name = fmt.Sprintf("signal %d", int(sig))
		}
		if ws.CoreDump() {
			return fmt.Errorf("killed by signal %s (core dumped)", name)
		}
		return fmt.Errorf("killed by signal %s", name)
	}
	return fmt.Errorf("exit status %d", ee.ExitCode())
}
