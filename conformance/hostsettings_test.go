package conformance

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestHostSettingsRestored(t *testing.T) {
	root := t.TempDir()
	oldRoot, oldWrite := sysctlRoot, writeSetting
	sysctlRoot = root
	t.Cleanup(func() { sysctlRoot, writeSetting = oldRoot, oldWrite })
	write := func(k, v string) {
		t.Helper()
		p := filepath.Join(root, k)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(v+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("kernel/timer_migration", "1")
	write("kernel/unprivileged_bpf_disabled", "2")
	write("vm/overcommit_memory", "0")
	snap := snapshotHost()
	if got := snap.restore(); len(got) != 0 {
		t.Fatalf("nothing changed, restore reported %v", got)
	}

	// An agent sets two; one of them cannot be put back, as the kernel refuses to
	// clear unprivileged_bpf_disabled once it is 1.
	write("kernel/timer_migration", "0")
	write("kernel/unprivileged_bpf_disabled", "1")
	writeSetting = func(path, v string) error {
		if filepath.Base(path) == "unprivileged_bpf_disabled" {
			return os.ErrPermission
		}
		return oldWrite(path, v)
	}
	got := snap.restore()
	if len(got) != 2 {
		t.Fatalf("restore reported %v, want the two settings changed", got)
	}
	if got[0].Name != "kernel.unprivileged_bpf_disabled" || got[0].Restored || !strings.Contains(got[0].Note, "no way back") {
		t.Errorf("unprivileged_bpf_disabled: %+v; want not restored, with the reason", got[0])
	}
	if got[1].Name != "kernel.timer_migration" || !got[1].Restored || got[1].String() != "kernel.timer_migration 1 -> 0 (restored)" {
		t.Errorf("timer_migration: %+v (%s); want restored", got[1], got[1])
	}
	if v, _ := os.ReadFile(filepath.Join(root, "kernel/timer_migration")); string(v) != "1" {
		t.Errorf("timer_migration reads %q after restore, want 1", v)
	}
}
