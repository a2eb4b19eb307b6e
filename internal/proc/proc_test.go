package proc

import (
	"os"
	"os/exec"
	"testing"
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
