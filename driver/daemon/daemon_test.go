package daemon

import (
	"context"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dpconform/dpconform/driver/proc"
)

func newDaemon(t *testing.T, identity ...string) Daemon {
	t.Helper()
	return Daemon{Name: "test-agent", Dir: t.TempDir(), PIDFile: "agent.pid", LogFile: "agent.log", Identity: identity}
}

func shell(script string) *exec.Cmd { return exec.Command("/bin/sh", "-c", script, "agent") }

func TestStartFindStop(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	d := newDaemon(t, "agent")
	if pid := d.PID(); pid != 0 {
		t.Fatalf("PID before any start = %d, want 0", pid)
	}
	// A first agent writes a line and exits; the second one's log starts after it.
	if _, err := d.Start(shell("echo first"), nil); err != nil {
		t.Fatal(err)
	}
	waitExit(t, d)
	pid, err := d.Start(shell("echo second; sleep 60"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := d.PID(); got != pid {
		t.Fatalf("PID = %d, want %d, the agent just started", got, pid)
	}
	if pgid, _ := syscall.Getpgid(pid); pgid != pid {
		t.Errorf("the agent's process group is %d, want its own (%d)", pgid, pid)
	}
	since := func() string {
		b, _ := os.ReadFile(d.LogPath())
		return string(b[min(d.LogOffset(), int64(len(b))):])
	}
	waitFor(t, func() bool { return strings.Contains(since(), "second") })
	if strings.Contains(since(), "first") {
		t.Errorf("the log from LogOffset, %q, holds the earlier agent's output", since())
	}
	if err := d.Stop(ctx, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if got := d.PID(); got != 0 {
		t.Errorf("PID after Stop = %d, want 0", got)
	}
	if err := d.Stop(ctx, syscall.SIGTERM); err != nil {
		t.Errorf("Stop of an agent that does not run: %v, want nil", err)
	}
	log, _ := os.ReadFile(d.LogPath())
	if !strings.Contains(string(log), "---- test-agent: start ") || !strings.Contains(string(log), "first") {
		t.Errorf("log = %q, want both starts and both outputs", log)
	}
	if err := d.Remove(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(d.LogPath()); !os.IsNotExist(err) {
		t.Errorf("log after Remove: %v, want gone", err)
	}
}

// A live process whose command line lacks the identity is not the agent: its PID
// was reused.
func TestPIDRefusesAnotherProcess(t *testing.T) {
	d := newDaemon(t, "--state-dir=/node-a")
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	if err := os.WriteFile(d.Path(d.PIDFile), []byte(strconv.Itoa(cmd.Process.Pid)+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got := d.PID(); got != 0 {
		t.Errorf("PID = %d for a process without the identity, want 0", got)
	}
	d.Identity = []string{"60"}
	if got := d.PID(); got != cmd.Process.Pid {
		t.Errorf("PID = %d, want %d: its command line holds the identity", got, cmd.Process.Pid)
	}
	// A prefix of an argument is not the argument.
	d.Identity = []string{"6"}
	if got := d.PID(); got != 0 {
		t.Errorf("PID = %d for an identity that is only a prefix of an argument, want 0", got)
	}
}

// Kill takes the agent's children with it.
func TestKillTakesTheGroup(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	d := newDaemon(t)
	child := d.Path("child.pid")
	if _, err := d.Start(shell("sleep 60 & echo $! > "+child+"; wait"), nil); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { b, _ := os.ReadFile(child); return len(b) > 0 && b[len(b)-1] == '\n' })
	b, _ := os.ReadFile(child)
	childPID, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Kill(ctx); err != nil {
		t.Fatal(err)
	}
	if proc.Alive(childPID) {
		t.Error("the agent's child outlived Kill")
	}
}

func TestStartFailure(t *testing.T) {
	d := newDaemon(t)
	_, err := d.Start(exec.Command("/nonexistent/agent"), nil)
	if err == nil || !strings.Contains(err.Error(), "start test-agent") {
		t.Fatalf("Start of a missing binary: %v, want an error naming the agent", err)
	}
	if got := d.PID(); got != 0 {
		t.Errorf("PID after a failed start = %d, want 0", got)
	}
}

func waitExit(t *testing.T, d Daemon) {
	t.Helper()
	waitFor(t, func() bool { return d.PID() == 0 })
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 5s")
		}
		time.Sleep(5 * time.Millisecond)
	}
}
