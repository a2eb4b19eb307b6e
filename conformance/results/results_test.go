package results

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/dpconform/dpconform/conformance"
	"github.com/dpconform/dpconform/conformance/report"
	_ "github.com/dpconform/dpconform/conformance/specs"
	"github.com/dpconform/dpconform/internal/ledger"
)

// The committed ledger page and the README's generated blocks are what the ledger
// makes (make docs writes them).
func TestCommittedPagesCurrent(t *testing.T) {
	if err := Check(filepath.Join("..", "..", "docs", "results"), filepath.Join("..", "..", "README.md")); err != nil {
		t.Error(err)
	}
}

// ledgerWith makes a ledger of one run whose report has one passed and one failed
// Core spec, with the README both blocks, generated.
func ledgerWith(t *testing.T) (root, readme string) {
	t.Helper()
	dir := t.TempDir()
	root = filepath.Join(dir, "results")
	run := filepath.Join(root, "peer", "v1", "core")
	if err := os.MkdirAll(run, 0o755); err != nil {
		t.Fatal(err)
	}
	budget := 200.0
	rep := report.Report{
		APIVersion: "dpconform.io/v1alpha1", Kind: "ConformanceReport", Topology: "netns",
		Implementation: report.Implementation{Name: "peer", Version: "v1", Profiles: []string{"Core"}},
		Profiles: []report.ProfileReport{{Name: conformance.Core, Claimed: true, Result: conformance.Failed, Specs: []report.SpecReport{
			{ID: "RESTART-ESTABLISHED", Result: conformance.Passed, Checks: []report.CheckReport{{Name: "streams", Figures: []report.FigureReport{
				{Name: "max_gap", Measured: "max gap 12 ms (budget 200 ms)", Value: 12, Budget: &budget, Within: true}}}}},
			{ID: "SVC-ENDPOINT-VANISH", Result: conformance.Failed, Kind: "hang", Checks: []report.CheckReport{{Name: "streams end", Figures: []report.FigureReport{
				{Name: "hung", Measured: "hung 9 of 9 (budget 0)", Value: 9, Budget: new(float64), Within: false}}}}},
		}}},
	}
	path := filepath.Join(run, ledger.ReportFile)
	if err := rep.WriteYAML(path); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(run, ledger.ProvenanceFile), []byte("commit: abc\ntopology: netns\ncommand: make test-peers PEERS=peer\ndate: 2026-01-01T00:00:00Z\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, TimingsFile), []byte("what\tseconds\tcommit\tmachine\tnote\nmake check\t125\tabc\t2 CPUs\twarm\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	readme = filepath.Join(dir, "README.md")
	text := "# x\n<!-- BEGIN GENERATED: matrix headline (x) -->\nold\n<!-- END GENERATED -->\nend\n"
	g, err := Generate(root)
	if err != nil {
		t.Fatal(err)
	}
	out, err := g.ApplyToReadme(text)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(readme, []byte(out), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, PageFile), []byte(g.Page), 0o644); err != nil {
		t.Fatal(err)
	}
	return root, readme
}

// The matrix shows a pass with its figure, a failure with its kind and the figure
// over budget, and a spec the run did not hold as such; the headline counts passes.
func TestMatrixCells(t *testing.T) {
	root, readme := ledgerWith(t)
	page, _ := os.ReadFile(filepath.Join(root, PageFile))
	for _, want := range []string{
		"| RESTART-ESTABLISHED | passed: max gap 12 ms (budget 200 ms) |",
		"| SVC-ENDPOINT-VANISH | **failed** (hang): hung 9 of 9 (budget 0) |",
		"| NODE-ADDRESS-CHANGE | not in this run |",
		"| POLICY-TRUTH-TABLE | not claimed |",
		"**1 of 2**",
		"(peer/v1/core/report.yaml)",
	} {
		if !strings.Contains(string(page), want) {
			t.Errorf("the page lacks %q:\n%s", want, page)
		}
	}
	if !strings.Contains(string(page), "## Time, as measured") || !strings.Contains(string(page), "make check: **2 min 05 s** (2 CPUs, at abc); warm") {
		t.Errorf("the page lacks the timings:\n%s", page)
	}
	text, _ := os.ReadFile(readme)
	if !strings.Contains(string(text), "| [peer v1 (core)](") || strings.Contains(string(text), "old") {
		t.Errorf("README's headline block not generated:\n%s", text)
	}
}

// Check fails when the page or a README block differs from what the ledger makes, and
// when the README lost a block.
func TestCheckFailsOnDrift(t *testing.T) {
	root, readme := ledgerWith(t)
	if err := Check(root, readme); err != nil {
		t.Fatalf("Check right after generating: %v", err)
	}
	page := filepath.Join(root, PageFile)
	data, _ := os.ReadFile(page)
	os.WriteFile(page, []byte(strings.Replace(string(data), "max gap 12 ms", "max gap 11 ms", 1)), 0o644)
	if err := Check(root, readme); err == nil || !strings.Contains(err.Error(), "make docs") {
		t.Errorf("Check with a hand-edited page: %v, want an error naming make docs", err)
	}
	os.WriteFile(page, data, 0o644)
	text, _ := os.ReadFile(readme)
	os.WriteFile(readme, []byte(strings.Replace(string(text), "**1 of 2**", "**2 of 2**", 1)), 0o644)
	if err := Check(root, readme); err == nil {
		t.Error("Check with a hand-edited README block: nil, want an error")
	}
	os.WriteFile(readme, []byte("# no blocks\n"), 0o644)
	if err := Check(root, readme); err == nil || !strings.Contains(err.Error(), "matrix headline") {
		t.Errorf("Check of a README without its blocks: %v, want an error naming the block", err)
	}
}

// The ledger's page shows each command's newest measurement; timings.tsv keeps them all.
func TestTimingsBlockShowsTheNewest(t *testing.T) {
	got := TimingsBlock([]Timing{
		{What: "make test", Seconds: 1832, Commit: "a", Machine: "m"},
		{What: "make conformance", Seconds: 842, Commit: "b", Machine: "m"},
		{What: "make test", Seconds: 1780, Commit: "c", Machine: "m", Note: "newer"},
	})
	want := "- make test: **29 min 40 s** (m, at c); newer\n- make conformance: **14 min 02 s** (m, at b)\n"
	if got != want {
		t.Errorf("TimingsBlock =\n%s\nwant\n%s", got, want)
	}
}

// A whole-profile run of the reference with faults on measures the specs: it is in the
// matrix, not among the headline's rows.
func TestFaultRunsStayOutOfTheHeadline(t *testing.T) {
	rep := report.Report{Profiles: []report.ProfileReport{{Name: conformance.Core, Claimed: true,
		Specs: []report.SpecReport{{ID: "RESTART-ESTABLISHED", Result: conformance.Passed}}}}}
	if !(Column{Report: rep}).Complete() {
		t.Fatal("a whole profile without faults is not complete")
	}
	if (Column{Report: rep, Provenance: ledger.Provenance{Faults: []string{"unpinned-conntrack"}}}).Complete() {
		t.Error("a run with faults on is among the headline's rows")
	}
}

// The headline has the newest complete run of each implementation and run name.
func TestHeadlineHasTheNewestRun(t *testing.T) {
	whole := report.Report{Implementation: report.Implementation{Name: "refdp"}, Profiles: []report.ProfileReport{{Name: conformance.Core, Claimed: true,
		Specs: []report.SpecReport{{ID: "RESTART-ESTABLISHED", Result: conformance.Passed}}}}}
	at := func(day int) ledger.Provenance {
		return ledger.Provenance{Date: time.Date(2026, 12, day, 0, 0, 0, 0, time.UTC)}
	}
	cols := []Column{
		{Link: "refdp/a/all-profiles/report.yaml", Run: "all-profiles", Report: whole, Provenance: at(5)},
		{Link: "refdp/b/all-profiles/report.yaml", Run: "all-profiles", Report: whole, Provenance: at(1)},
		{Link: "refdp/b/core/report.yaml", Run: "core", Report: whole, Provenance: at(1)},
	}
	var got []string
	for _, c := range Newest(cols) {
		got = append(got, c.Link)
	}
	if want := []string{"refdp/a/all-profiles/report.yaml", "refdp/b/core/report.yaml"}; !slices.Equal(got, want) {
		t.Errorf("Newest = %v, want %v", got, want)
	}
}
