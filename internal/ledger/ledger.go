// Package ledger keeps the results ledger (docs/results): the published runs of the
// suite against each implementation, as data. A run is a directory
// <implementation>/<version>/<run>/ holding the run's unmodified report.yaml and a
// provenance.yaml that says what produced it: the dpconform commit, the topology, the
// command.
//
// A run that make test does not repeat (a peer whose full profile takes too long to
// run in every CI) is guarded instead: Stale reports whether anything the run was
// judged by (the specs, the instrument, the topology, the peer's driver and build)
// changed since the commit it ran at, so that nobody can change what a peer is judged
// by without running it again.
package ledger

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"
	"sigs.k8s.io/yaml"
)

// The files of a run in the ledger.
const (
	ReportFile     = "report.yaml"
	ProvenanceFile = "provenance.yaml"
)

// Provenance says what produced a run in the ledger.
type Provenance struct {
	// Commit is the dpconform commit the run ran at, with a tree that did not differ
	// from it in anything the run is judged by.
	Commit string `json:"commit"`
	// Topology is the topology the run ran on (netns, kind, cluster).
	Topology string `json:"topology"`
	// Command is how to run it again.
	Command string `json:"command"`
	// Date is when the run ended.
	Date time.Time `json:"date"`
	// Machine describes where it ran, for timings read from it.
	Machine string `json:"machine,omitempty"`
	// Faults are the reference's faults the run had on (DPC_REFDP_FAULTS): such a
	// run is a measurement of the specs (a detection rate, a blind spot), not a
	// result of the implementation.
	Faults []string `json:"faults,omitempty"`
}

// Run is one run in the ledger.
type Run struct {
	// Dir is the run's directory, Implementation, Version and Name the three parts of
	// its path under the ledger's root.
	Dir, Implementation, Version, Name string
	Provenance                         Provenance
}

// Load reads every run under root (docs/results), in path order. A run directory
// without its two files is an error that names it.
func Load(root string) ([]Run, error) {
	dirs, err := filepath.Glob(filepath.Join(root, "*", "*", "*"))
	if err != nil {
		return nil, err
	}
	slices.Sort(dirs)
	var runs []Run
	for _, dir := range dirs {
		if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
			continue
		}
		r, err := LoadRun(dir)
		if err != nil {
			return nil, err
		}
		runs = append(runs, r)
	}
	return runs, nil
}

// LoadRun reads the run in dir, <root>/<implementation>/<version>/<run>.
func LoadRun(dir string) (Run, error) {
	r := Run{Dir: dir, Name: filepath.Base(dir)}
	r.Version = filepath.Base(filepath.Dir(dir))
	r.Implementation = filepath.Base(filepath.Dir(filepath.Dir(dir)))
	if _, err := os.Stat(filepath.Join(dir, ReportFile)); err != nil {
		return r, fmt.Errorf("ledger run %s: no %s: %w", dir, ReportFile, err)
	}
	data, err := os.ReadFile(filepath.Join(dir, ProvenanceFile))
	if err != nil {
		return r, fmt.Errorf("ledger run %s: %w", dir, err)
	}
	if err := yaml.UnmarshalStrict(data, &r.Provenance); err != nil {
		return r, fmt.Errorf("ledger run %s: %s: %w", dir, ProvenanceFile, err)
	}
	if r.Provenance.Commit == "" {
		return r, fmt.Errorf("ledger run %s: %s names no commit", dir, ProvenanceFile)
	}
	return r, nil
}

// Write puts a run into the ledger: report (the run's report.yaml, copied unmodified)
// and p, in dir. It refuses when repo's work tree differs from p.Commit in any of the
// paths the run is judged by (git pathspecs), since the run would then be of code that
// no commit holds.
func Write(repo, dir, report string, p Provenance, judgedBy []string) error {
	changed, err := diff(repo, p.Commit, true, judgedBy)
	if err != nil {
		return err
	}
	if len(changed) > 0 {
		return fmt.Errorf("not writing %s to the ledger: the work tree differs from %s in what the run is judged by (%s); commit, then run again",
			dir, short(p.Commit), strings.Join(changed, ", "))
	}
	data, err := os.ReadFile(report)
	if err != nil {
		return err
	}
	prov, err := yaml.Marshal(p)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	return errors.Join(
		os.WriteFile(filepath.Join(dir, ReportFile), data, 0o644),
		os.WriteFile(filepath.Join(dir, ProvenanceFile), prov, 0o644))
}

// Stale reports why run r no longer stands for what repo's work tree would judge, or
// "" when it still does: the paths it is judged by (git pathspecs) are the same in the
// work tree as at the commit it ran at.
func Stale(repo string, r Run, judgedBy []string) (string, error) {
	changed, err := diff(repo, r.Provenance.Commit, false, judgedBy)
	if err != nil {
		return "", fmt.Errorf("ledger run %s: %w", r.Dir, err)
	}
	if len(changed) == 0 {
		return "", nil
	}
	const most = 10
	list := changed
	if len(list) > most {
		list = append(slices.Clone(list[:most]), fmt.Sprintf("and %d more", len(changed)-most))
	}
	return fmt.Sprintf("%s ran at %s, and what it is judged by has changed since: %s; run it again (%s) and commit its new entry",
		r.Dir, short(r.Provenance.Commit), strings.Join(list, ", "), r.Provenance.Command), nil
}

// Machine describes this machine for a provenance: its CPUs and kernel.
func Machine() string {
	var u unix.Utsname
	kernel := "unknown kernel"
	if unix.Uname(&u) == nil {
		kernel = "Linux " + unix.ByteSliceToString(u.Release[:])
	}
	return fmt.Sprintf("%d CPUs, %s", runtime.NumCPU(), kernel)
}

// Head returns repo's current commit.
func Head(repo string) (string, error) {
	out, err := git(repo, "rev-parse", "HEAD")
	return strings.TrimSpace(out), err
}

// Files lists the files of repo's index that pathspecs take in: what a run judged by
// them is judged by.
func Files(repo string, pathspecs []string) ([]string, error) {
	out, err := git(repo, append([]string{"ls-files", "--"}, pathspecs...)...)
	return strings.Fields(out), err
}

// diff lists the files among pathspecs whose content in repo's work tree differs from
// commit (with untracked files too, when untracked).
func diff(repo, commit string, untracked bool, pathspecs []string) ([]string, error) {
	if _, err := git(repo, "cat-file", "-e", commit+"^{commit}"); err != nil {
		return nil, fmt.Errorf("commit %s is not in the repository at %s (a shallow clone? fetch its full history): %w", short(commit), repo, err)
	}
	out, err := git(repo, append([]string{"diff", "--name-only", commit, "--"}, pathspecs...)...)
	if err != nil {
		return nil, err
	}
	changed := strings.Fields(out)
	if untracked {
		out, err := git(repo, append([]string{"ls-files", "--others", "--exclude-standard", "--"}, pathspecs...)...)
		if err != nil {
			return nil, err
		}
		changed = append(changed, strings.Fields(out)...)
	}
	return changed, nil
}

func git(repo string, args ...string) (string, error) {
	cmd := exec.Command("git", append([]string{"-C", repo}, args...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("git %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return string(out), nil
}

func short(commit string) string {
	if len(commit) > 12 {
		return commit[:12]
	}
	return commit
}
