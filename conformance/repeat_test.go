package conformance

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/dpconform/dpconform/conformance/report"
	"github.com/dpconform/dpconform/fv/matchers"
)

// run is one run of spec A with a check named after the run, so a test sees which
// run's checks a combined result kept.
func run(n int, kind ResultKind) Result {
	r := Result{ID: "A", Profile: Core, Result: kind, Duration: time.Second, Checks: []CheckResult{{Name: "run" + string(rune('0'+n)), Passed: kind == Passed}}}
	switch kind {
	case Failed:
		r.Kind, r.Reason, r.Message = matchers.KindReset, "new-connections: reset", "timeline"
		r.Diagnostics = []string{diagnosticsDir("A", n, 3) + "/node-a/maps.txt"}
	case Errored:
		r.Reason = "environment: topology: no space"
	case Skipped:
		r.Reason = "not claimed"
	}
	return r
}

func TestCombineRuns(t *testing.T) {
	for _, tc := range []struct {
		name       string
		runs       []Result
		want       ResultKind
		reason     string
		checksFrom int
		passes     int
	}{
		{"every run passed", []Result{run(1, Passed), run(2, Passed), run(3, Passed)}, Passed, "", 3, 3},
		{"one run failed", []Result{run(1, Passed), run(2, Failed), run(3, Passed)}, Failed, "run 2: new-connections: reset", 2, 2},
		{"a failure outweighs an error", []Result{run(1, Errored), run(2, Passed), run(3, Failed)}, Failed, "run 3: new-connections: reset", 3, 1},
		{"an error and no failure", []Result{run(1, Passed), run(2, Errored), run(3, Errored)}, Errored, "run 2: environment: topology: no space", 2, 1},
		{"every run skipped", []Result{run(1, Skipped), run(2, Skipped), run(3, Skipped)}, Skipped, "not claimed", 3, 0},
		{"passed and skipped runs", []Result{run(1, Passed), run(2, Skipped), run(3, Passed)}, Skipped, "skipped in 1 of 3 runs: not claimed", 2, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := Combine(tc.runs)
			if got.Result != tc.want || got.Reason != tc.reason {
				t.Errorf("combine = %s %q, want %s %q", got.Result, got.Reason, tc.want, tc.reason)
			}
			if got.ChecksFrom != tc.checksFrom || len(got.Checks) != 1 || got.Checks[0].Name != "run"+string(rune('0'+tc.checksFrom)) {
				t.Errorf("checks from run %d (%+v), want run %d's", got.ChecksFrom, got.Checks, tc.checksFrom)
			}
			if k, n := got.Passes(); k != tc.passes || n != 3 {
				t.Errorf("Passes() = %d of %d, want %d of 3", k, n, tc.passes)
			}
			if got.Duration != 3*time.Second || len(got.Runs) != 3 {
				t.Errorf("duration %s, %d runs: want the three runs' total and each run", got.Duration, len(got.Runs))
			}
		})
	}
}

func TestPassesOfASingleRun(t *testing.T) {
	for kind, want := range map[ResultKind][2]int{Passed: {1, 1}, Failed: {0, 1}, Errored: {0, 1}, Skipped: {0, 0}} {
		if k, n := (Result{Result: kind}).Passes(); k != want[0] || n != want[1] {
			t.Errorf("%s: Passes() = %d of %d, want %d of %d", kind, k, n, want[0], want[1])
		}
	}
}

// Runs of a repeated spec keep their diagnostics apart; a single run keeps the layout
// it always had.
func TestDiagnosticsDir(t *testing.T) {
	for _, tc := range []struct {
		i, n int
		want string
	}{{1, 1, "diagnostics/A"}, {1, 3, "diagnostics/A/run-1"}, {3, 3, "diagnostics/A/run-3"}} {
		if got := filepath.ToSlash(diagnosticsDir("A", tc.i, tc.n)); got != tc.want {
			t.Errorf("diagnosticsDir(A, %d, %d) = %q, want %q", tc.i, tc.n, got, tc.want)
		}
	}
}

func TestNewRunnerRefusesANegativeRepeat(t *testing.T) {
	_, err := NewRunner(context.Background(), Config{Repeat: -1})
	if err == nil || !strings.Contains(err.Error(), "repeat -1") {
		t.Errorf("NewRunner(Repeat: -1) = %v, want an error naming the repeat", err)
	}
}

func TestReportOfRepeatedSpecs(t *testing.T) {
	flaky := Combine([]Result{run(1, Passed), run(2, Failed), run(3, Passed)})
	steady := Combine([]Result{run(1, Passed), run(2, Passed), run(3, Passed)})
	steady.ID = "B"
	rep := BuildReport(driverInfo(), "netns", DefaultBudgets, 3, claimsCore, []Result{flaky, steady}, time.Time{})
	if p := rep.Profiles[0]; p.Result != Failed || p.Summary != "1 passed, 1 failed, 0 skipped, 0 error" {
		t.Errorf("Core %s (%s), want failed: a spec passed 2 of 3", p.Result, p.Summary)
	}
	if err := rep.Certified(); err == nil {
		t.Error("certified with a spec that passed 2 of 3 runs")
	}
	path := filepath.Join(t.TempDir(), "report.yaml")
	if err := rep.WriteYAML(path); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"repeat: 3",
		"passes: 2 of 3",
		"passes: 3 of 3",
		"checksFromRun: 2",
		"reason: 'run 2: new-connections: reset'",
		"- duration: 1s\n      kind: reset\n      reason: 'new-connections: reset'\n      result: failed\n      run: 2\n",
		"- diagnostics/A/run-2/node-a/maps.txt",
		"name: run2",
	} {
		if !strings.Contains(string(data), want) {
			t.Errorf("report.yaml lacks %q:\n%s", want, data)
		}
	}
	var out bytes.Buffer
	rep.PrintSummary(&out)
	summary := strings.Join(strings.Fields(out.String()), " ")
	for _, want := range []string{"A failed 2/3 run 2: new-connections: reset", "B passed 3/3"} {
		if !strings.Contains(summary, want) {
			t.Errorf("summary lacks %q:\n%s", want, out.String())
		}
	}

	all := BuildReport(driverInfo(), "netns", DefaultBudgets, 3, claimsCore, []Result{steady}, time.Time{})
	if err := all.Certified(); err != nil {
		t.Errorf("a spec that passed 3 of 3: %v", err)
	}
}

// A single run reports as it always did: no passes, no runs.
func TestReportOfASingleRun(t *testing.T) {
	rep := BuildReport(driverInfo(), "netns", DefaultBudgets, 1, claimsCore, []Result{run(1, Passed)}, time.Time{})
	s := rep.Profiles[0].Specs[0]
	if s.Passes != "" || s.Runs != nil || s.ChecksFromRun != 0 || s.Result != Passed {
		t.Errorf("single run reported as %+v", s)
	}
}

func TestSpreadOverRuns(t *testing.T) {
	zero := 0.0
	fig := func(name string, v float64, b *float64) matchers.Figure {
		return matchers.Figure{Name: name, Value: v, Unit: "attempts", Budget: b}
	}
	// Each run's check names the port its run used: the spread still puts them
	// together, under the first run's name.
	port := 30000
	runWith := func(kind ResultKind, figs ...matchers.Figure) Result {
		port++
		return Result{ID: "A", Profile: Core, Result: kind, Checks: []CheckResult{{Name: fmt.Sprintf("no failed attempt to :%d", port), Passed: kind == Passed, Figures: figs}}}
	}
	runs := []Result{
		runWith(Passed, fig("failed_attempts", 0, &zero), fig("max_latency", 3, nil)),
		runWith(Failed, fig("failed_attempts", 14, &zero), fig("max_latency", 9, nil)),
		runWith(Passed, fig("failed_attempts", 0, &zero), fig("max_latency", 4, nil)),
		runWith(Passed, fig("failed_attempts", 0, &zero), fig("max_latency", 5, nil)),
		// A run that ended before its checks measured nothing.
		{ID: "A", Profile: Core, Result: Errored, Reason: "environment: topology: no space"},
	}
	got := spread(runs)
	want := []report.FigureSpread{
		{Check: "no failed attempt to :30001", Figure: "failed_attempts", Unit: "attempts", Budget: &zero, Runs: 4, Min: 0, Median: 0, Max: 14, OverBudget: 1},
		{Check: "no failed attempt to :30001", Figure: "max_latency", Unit: "attempts", Runs: 4, Min: 3, Median: 4.5, Max: 9},
	}
	if len(got) != len(want) {
		t.Fatalf("spread = %+v, want %+v", got, want)
	}
	for i := range want {
		g, w := got[i], want[i]
		if g.Check != w.Check || g.Figure != w.Figure || g.Runs != w.Runs || g.Min != w.Min || g.Median != w.Median || g.Max != w.Max || g.OverBudget != w.OverBudget || (g.Budget == nil) != (w.Budget == nil) {
			t.Errorf("spread[%d] = %+v, want %+v", i, g, w)
		}
	}
	if s := got[0].String(); s != "failed attempts 0 / 0 / 14 (min / median / max of 4 runs; budget 0; over it in 1)" {
		t.Errorf("String() = %q", s)
	}

	rep := BuildReport(driverInfo(), "netns", DefaultBudgets, 5, claimsCore, []Result{Combine(runs)}, time.Time{})
	if sp := rep.Profiles[0].Specs[0].Spread; len(sp) != 2 {
		t.Errorf("the report's spread: %+v", sp)
	}
	var out bytes.Buffer
	steady := Combine([]Result{runs[0], runs[2], runs[3]})
	BuildReport(driverInfo(), "netns", DefaultBudgets, 3, claimsCore, []Result{steady}, time.Time{}).PrintSummary(&out)
	if !strings.Contains(out.String(), "failed attempts 0/0/0 (min/median/max)") {
		t.Errorf("the summary of a repeated spec that passed gives its key figures' spread:\n%s", out.String())
	}
}

// Of a repeated spec, the timelines of the runs that did not pass are kept, and of
// those that passed only the one whose checks the result carries.
func TestKeepTimelines(t *testing.T) {
	dir := t.TempDir()
	runs := []Result{run(1, Passed), run(2, Failed), run(3, Passed)}
	for i := range runs {
		runs[i].Timeline = timelineFile("A", i+1, 3)
		p := filepath.Join(dir, runs[i].Timeline)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	r := &Runner{cfg: Config{OutputDir: dir, Logf: t.Logf}}
	res := Combine(runs)
	r.keepTimelines(&res)
	for i, want := range []bool{false, true, false} {
		_, err := os.Stat(filepath.Join(dir, timelineFile("A", i+1, 3)))
		if (err == nil) != want {
			t.Errorf("run %d's timeline kept: %v, want %v", i+1, err == nil, want)
		}
	}
	if res.Timeline != timelineFile("A", 2, 3) {
		t.Errorf("the result's timeline is %q, want the failed run's", res.Timeline)
	}

	clean := Combine([]Result{run(1, Passed), run(2, Passed)})
	clean.Runs[0].Timeline, clean.Runs[1].Timeline = "t1", "t2"
	r.keepTimelines(&clean)
	if clean.Timeline != "t2" || clean.Runs[0].Timeline != "" {
		t.Errorf("of clean runs, the last one's timeline is kept: %q, runs %q %q", clean.Timeline, clean.Runs[0].Timeline, clean.Runs[1].Timeline)
	}
}
