package skel

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestDiagnostics(t *testing.T) {
	src := t.TempDir()
	log := filepath.Join(src, "agent.log")
	if err := os.WriteFile(log, []byte("started\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	d := &Diagnostics{Dir: t.TempDir()}
	d.Copy("agent.log", log)
	d.Copy("absent.log", filepath.Join(src, "absent.log"))
	d.Write("rules.txt", []byte("partial"), errors.New("iptables-save: exit status 1"))
	files, err := d.Files()
	if err != nil {
		t.Fatal(err)
	}
	if len(files) != 2 {
		t.Fatalf("files = %v, want the log and the rules, not the absent file", files)
	}
	got, _ := os.ReadFile(filepath.Join(d.Dir, "rules.txt"))
	if !strings.HasPrefix(string(got), "partial") || !strings.Contains(string(got), "(error: iptables-save: exit status 1)") {
		t.Errorf("rules.txt = %q, want the partial output and the source's error", got)
	}

	// A directory it cannot write into is an error, with no file claimed.
	bad := &Diagnostics{Dir: filepath.Join(log, "not-a-dir")}
	bad.Write("x.txt", []byte("x"), nil)
	if files, err := bad.Files(); err == nil || len(files) != 0 {
		t.Errorf("Files() = %v, %v; want no file and an error", files, err)
	}
}
