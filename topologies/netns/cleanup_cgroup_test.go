package netns

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"testing"

	"github.com/dpconform/dpconform/internal/privileged"
)

// A run whose cleanup was cut short can leave its cgroup alone, with a process in it
// that is still exiting: cleanup finds the run by its cgroup, kills what is in it and
// waits for it to empty before removing it.
func TestCleanupRemovesALeftoverCgroup(t *testing.T) {
	privileged.Require(t)
	id := RunPrefix + "ffff0"
	rc := runCgroup(id)
	if rc == "" {
		t.Skip("no cgroup2 hierarchy on this machine: the netns topology makes no cgroups here")
	}
	leaf := filepath.Join(rc, "node-a", "kubepods", "pod")
	if err := os.MkdirAll(leaf, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = removeCgroupTree(rc) })
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	reaped := make(chan error, 1)
	go func() { reaped <- cmd.Wait() }() // as init reaps a killed run's orphans
	if err := os.WriteFile(filepath.Join(leaf, "cgroup.procs"), []byte(strconv.Itoa(cmd.Process.Pid)), 0o644); err != nil {
		_ = cmd.Process.Kill()
		t.Fatal(err)
	}

	if ids := leftoverRunIDs(t.TempDir()); !slices.Contains(ids, id) {
		t.Errorf("leftover runs %v: the run known only by its cgroup %s is missing", ids, rc)
	}
	removed, err := Cleanup(CleanupOptions{RunRoot: t.TempDir(), RunIDs: []string{id}})
	if err != nil {
		t.Fatalf("Cleanup: %v", err)
	}
	if !slices.Contains(removed, id) {
		t.Errorf("Cleanup removed %v, want %s", removed, id)
	}
	if _, err := os.Stat(rc); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the run's cgroup %s is still there (%v)", rc, err)
	}
	if err := <-reaped; err == nil {
		t.Errorf("the process in the run's cgroup exited cleanly: want it killed")
	}
}
