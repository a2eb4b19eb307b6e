package proc

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestAlive(t *testing.T) {
	if !Alive(os.Getpid()) {
		t.Fatal("this process is not alive")
	}
	cmd := exec.Command("sleep", "10")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pid := cmd.Process.Pid
	if !Alive(pid) {
		t.Fatal("a running child is not alive")
	}
	cmd.Process.Kill()
	// Not reaped yet: a zombie, which is not alive.
	for i := 0; i < 1000 && Alive(pid); i++ {
		st, _ := field(pid, 0)
		if st == "Z" {
			break
		}
	}
	if Alive(pid) {
		t.Fatal("a killed, unreaped child counts as alive")
	}
	cmd.Wait()
	if Alive(pid) {
		t.Fatal("a reaped child counts as alive")
	}
	if a, err := StartTime(os.Getpid()); err != nil || a == 0 {
		t.Fatalf("StartTime: %d, %v", a, err)
	}
}

func TestSignal(t *testing.T) {
	if err := Signal(context.Background(), "nothing", 0, syscall.SIGTERM, "no log"); err != nil {
		t.Fatalf("signalling no process: %v", err)
	}
	start := func(script string) *exec.Cmd {
		cmd := exec.Command("sh", "-c", script)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		// Reap it as soon as it exits, as a driver's parent would not: Alive must
		// see an exit either way.
		go cmd.Wait()
		return cmd
	}
	cmd := start("sleep 10")
	if err := Signal(context.Background(), "sleeper", cmd.Process.Pid, syscall.SIGTERM, "sleeper.log"); err != nil {
		t.Fatalf("a process that exits on SIGTERM: %v", err)
	}
	if Alive(cmd.Process.Pid) {
		t.Fatal("Signal returned before the process exited")
	}

	stubborn := exec.Command("sh", "-c", `trap "" TERM; echo trapped; while :; do sleep 0.05; done`)
	out, err := stubborn.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := stubborn.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { stubborn.Process.Kill(); stubborn.Wait() }()
	if line, err := bufio.NewReader(out).ReadString('\n'); err != nil || line != "trapped\n" {
		t.Fatalf("the stubborn shell did not set its trap: %q, %v", line, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	err = Signal(ctx, "stubborn", stubborn.Process.Pid, syscall.SIGTERM, "stubborn.log")
	if err == nil || !strings.Contains(err.Error(), "stubborn") || !strings.Contains(err.Error(), "stubborn.log") || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a process that ignores SIGTERM: got %v, want an error naming it and its log", err)
	}
}

// TestSignalGroup: SIGKILL to an agent's process group takes its children with it,
// as a crash in a container does, and returns only once none of them runs; a child
// left behind would go on writing the agent's rules.
func TestSignalGroup(t *testing.T) {
	if err := SignalGroup(context.Background(), "nothing", 0, syscall.SIGKILL, "no log"); err != nil {
		t.Fatalf("signalling no group: %v", err)
	}
	// A leader in a session of its own, with a child in the background, as an agent
	// with an iptables-restore running.
	leader, _, child := leaderWithChild(t, `sleep 30 & echo $!; wait`)
	if err := SignalGroup(context.Background(), "agent", leader.Process.Pid, syscall.SIGKILL, "agent.log"); err != nil {
		t.Fatal(err)
	}
	if Alive(leader.Process.Pid) {
		t.Error("the group's leader outlived SignalGroup")
	}
	if Alive(child) {
		t.Error("the leader's child outlived SignalGroup: a crash would leave it writing rules")
	}
}

// TestStopGroup: a graceful stop whose leader exits on the signal and leaves a child
// running returns only once the child is gone too.
func TestStopGroup(t *testing.T) {
	leader, exited, child := leaderWithChild(t, `trap 'exit 0' TERM; sleep 30 & echo $!; wait`)
	if err := StopGroup(context.Background(), "agent", leader.Process.Pid, syscall.SIGTERM, "agent.log"); err != nil {
		t.Fatal(err)
	}
	// The leader exited by its trap, not by the group's SIGKILL.
	if err := <-exited; err != nil {
		t.Errorf("the leader did not exit on SIGTERM by its own trap: %v", err)
	}
	if Alive(child) {
		t.Error("the leader's child outlived StopGroup: it would go on writing the agent's rules")
	}
}

// leaderWithChild starts script in a session of its own (so leading its process
// group, as the drivers start agents); the script starts a child in the background
// and prints its PID. It returns the leader, its exit, and the child's PID, which
// the test kills at its end whatever happened.
func leaderWithChild(t *testing.T, script string) (*exec.Cmd, <-chan error, int) {
	t.Helper()
	leader := exec.Command("sh", "-c", script)
	leader.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	out, err := leader.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := leader.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- leader.Wait() }()
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	child, err := strconv.Atoi(strings.TrimSpace(line))
	if err != nil {
		t.Fatalf("the child's PID: %q", line)
	}
	t.Cleanup(func() { syscall.Kill(child, syscall.SIGKILL) })
	return leader, exited, child
}

// TestCmdline: a process is known by its arguments from the moment Start returns,
// even when it is caught in its exec, and a PID that does not run has none.
func TestCmdline(t *testing.T) {
	for range 200 {
		cmd := exec.Command("sleep", "30")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		got := Cmdline(cmd.Process.Pid)
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if !bytes.Equal(got, []byte("sleep\x0030\x00")) {
			t.Fatalf("Cmdline right after Start = %q, want \"sleep\\x0030\\x00\"", got)
		}
		if got := Cmdline(cmd.Process.Pid); got != nil {
			t.Fatalf("Cmdline of a reaped process = %q, want nil", got)
		}
	}
}

func TestParseTimensOffsets(t *testing.T) {
	got, err := parseTimensOffsets([]byte("monotonic        1000       250\nboottime            0         0\n"))
	if err != nil || got != 1000*time.Second+250 {
		t.Fatalf("got %v, %v; want 1000.00000025s", got, err)
	}
	got, err = parseTimensOffsets([]byte("monotonic       -5         0\nboottime 0 0\n"))
	if err != nil || got != -5*time.Second {
		t.Fatalf("got %v, %v; want -5s", got, err)
	}
	if _, err := parseTimensOffsets([]byte("boottime 0 0\n")); err == nil {
		t.Fatal("no monotonic line: want an error")
	}
	if off, err := MonotonicOffset(); err != nil || off != 0 {
		t.Fatalf("this test's own offset: %v, %v; want 0 outside a time namespace", off, err)
	}
}
