package controlplane

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Process is a child process whose output goes to a log file. It is killed when the
// process that started it dies (Pdeathsig), so a killed run leaves no server behind.
type Process struct {
	Name string
	Log  string
	cmd  *exec.Cmd
	done chan struct{}
	mu   sync.Mutex
	err  error
}

// StartProcess starts path with args, env added to this process's environment, and
// stdout and stderr appended to logPath.
func StartProcess(ctx context.Context, name, path string, args, env []string, logPath string) (*Process, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	if err := executable(path); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	log, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	cmd := exec.Command(path, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	if err := cmd.Start(); err != nil {
		log.Close()
		return nil, fmt.Errorf("start %s (%s): %w", name, path, err)
	}
	p := &Process{Name: name, Log: logPath, cmd: cmd, done: make(chan struct{})}
	go func() {
		err := cmd.Wait()
		log.Close()
		p.mu.Lock()
		p.err = err
		p.mu.Unlock()
		close(p.done)
	}()
	return p, nil
}

// Pid is the process ID.
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// Exited reports whether the process has exited.
func (p *Process) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Err is how the process exited (nil while it runs or after a clean exit).
func (p *Process) Err() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.err
}

// Stop sends SIGTERM to the process group, waits up to grace, then SIGKILLs it; a
// zero grace kills it at once.
func (p *Process) Stop(grace time.Duration) error {
	if p.Exited() {
		return nil
	}
	if grace > 0 {
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGTERM)
		select {
		case <-p.done:
			return nil
		case <-time.After(grace):
		}
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	select {
	case <-p.done:
		return nil
	case <-time.After(5 * time.Second):
		return fmt.Errorf("%s (pid %d) did not exit after SIGKILL", p.Name, p.Pid())
	}
}

// LogTail returns the last n lines of the process's log, indented, for error messages.
func (p *Process) LogTail(n int) string {
	data, err := os.ReadFile(p.Log)
	if err != nil {
		return "  (no log: " + err.Error() + ")"
	}
	lines := strings.Split(string(bytes.TrimRight(data, "\n")), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return "  " + p.Log + ":\n    " + strings.Join(lines, "\n    ")
}
