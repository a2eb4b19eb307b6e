package ledger

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// repo makes a git repository with a spec and a doc, committed, and returns its path.
func repo(t *testing.T) string {
	t.Helper()
	if _, err := exec.LookPath("git"); err != nil {
		t.Skipf("SKIPPED: no git: %v", err)
	}
	dir := t.TempDir()
	write(t, dir, "specs/spec.go", "package specs\n")
	write(t, dir, "docs/page.md", "# page\n")
	run(t, dir, "init", "-q")
	commit(t, dir, "first")
	return dir
}

func write(t *testing.T, dir, name, content string) {
	t.Helper()
	path := filepath.Join(dir, name)
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func run(t *testing.T, dir string, args ...string) string {
	t.Helper()
	cmd := exec.Command("git", append([]string{"-C", dir}, args...)...)
	cmd.Env = append(os.Environ(), "GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@t", "GIT_COMMITTER_NAME=t", "GIT_COMMITTER_EMAIL=t@t")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("git %v: %v\n%s", args, err, out)
	}
	return strings.TrimSpace(string(out))
}

func commit(t *testing.T, dir, msg string) string {
	t.Helper()
	run(t, dir, "add", "-A")
	run(t, dir, "commit", "-q", "-m", msg)
	return run(t, dir, "rev-parse", "HEAD")
}

var judgedBy = []string{"specs", ":(exclude,glob)**/*_test.go"}

// A run written at a commit stands until what it is judged by changes, and then
// Stale names the change and the command that runs it again; a change elsewhere (a
// doc, a test file) leaves it standing.
func TestStale(t *testing.T) {
	dir := repo(t)
	head, err := Head(dir)
	if err != nil {
		t.Fatal(err)
	}
	report := filepath.Join(t.TempDir(), "report.yaml")
	write(t, filepath.Dir(report), "report.yaml", "kind: ConformanceReport\n")
	entry := filepath.Join(dir, "results", "peer", "v1", "core")
	p := Provenance{Commit: head, Topology: "netns", Command: "make test-peers", Date: time.Unix(0, 0).UTC()}
	if err := Write(dir, entry, report, p, judgedBy); err != nil {
		t.Fatal(err)
	}
	commit(t, dir, "the run's entry")

	runs, err := Load(filepath.Join(dir, "results"))
	if err != nil {
		t.Fatal(err)
	}
	if len(runs) != 1 || runs[0].Implementation != "peer" || runs[0].Version != "v1" || runs[0].Name != "core" || runs[0].Provenance.Commit != head {
		t.Fatalf("Load = %+v, want the one run written", runs)
	}
	stale := func() string {
		t.Helper()
		why, err := Stale(dir, runs[0], judgedBy)
		if err != nil {
			t.Fatal(err)
		}
		return why
	}
	if why := stale(); why != "" {
		t.Fatalf("stale right after its run: %s", why)
	}

	write(t, dir, "docs/page.md", "# page, edited\n")
	write(t, dir, "specs/spec_test.go", "package specs\n")
	commit(t, dir, "a doc and a test")
	if why := stale(); why != "" {
		t.Errorf("stale after a change to what it is not judged by: %s", why)
	}

	write(t, dir, "specs/spec.go", "package specs // changed\n")
	if why := stale(); !strings.Contains(why, "specs/spec.go") || !strings.Contains(why, "make test-peers") {
		t.Errorf("after an uncommitted change to a spec: %q, want it stale, naming the file and the command", why)
	}
	commit(t, dir, "a spec")
	if why := stale(); !strings.Contains(why, "specs/spec.go") {
		t.Errorf("after a committed change to a spec: %q, want it stale", why)
	}
}

// Write refuses a run of a tree that differs from its commit in what it is judged by,
// an untracked file included: no commit would hold the code that ran.
func TestWriteRefusesADirtyTree(t *testing.T) {
	dir := repo(t)
	head, _ := Head(dir)
	report := filepath.Join(dir, "report.yaml")
	write(t, dir, "report.yaml", "kind: ConformanceReport\n")
	write(t, dir, "specs/new.go", "package specs\n")
	err := Write(dir, filepath.Join(dir, "results", "peer", "v1", "core"), report, Provenance{Commit: head}, judgedBy)
	if err == nil || !strings.Contains(err.Error(), "specs/new.go") {
		t.Fatalf("Write with an untracked spec: %v, want a refusal naming it", err)
	}
}

// A run whose commit the clone lacks (a shallow clone) is an error that says so, never
// a pass; so is a run without its provenance.
func TestMissingCommitOrProvenance(t *testing.T) {
	dir := repo(t)
	r := Run{Dir: "results/peer/v1/core", Provenance: Provenance{Commit: strings.Repeat("ab", 20)}}
	if _, err := Stale(dir, r, judgedBy); err == nil || !strings.Contains(err.Error(), "shallow") {
		t.Errorf("Stale of an unknown commit: %v, want an error about the history", err)
	}
	write(t, dir, "results/peer/v1/core/report.yaml", "kind: ConformanceReport\n")
	if _, err := Load(filepath.Join(dir, "results")); err == nil || !strings.Contains(err.Error(), ProvenanceFile) {
		t.Errorf("Load of a run without provenance: %v, want an error naming %s", err, ProvenanceFile)
	}
}
