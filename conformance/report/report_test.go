package report

import (
	"bytes"
	"strings"
	"testing"
)

func budget(v float64) *float64 { return &v }

func TestFigureText(t *testing.T) {
	for _, c := range []struct {
		f    FigureReport
		want string
	}{
		{FigureReport{Name: "failed_attempts", Value: 0, Of: 4812, Budget: budget(0)}, "failed attempts 0 of 4,812 (budget 0)"},
		{FigureReport{Name: "max_gap", Value: 12.34, Unit: "ms", Budget: budget(200)}, "max gap 12.3 ms (budget 200 ms)"},
		{FigureReport{Name: "resets", Value: 1234567}, "resets 1,234,567"},
	} {
		if got := c.f.Text(); got != c.want {
			t.Errorf("Text() = %q, want %q", got, c.want)
		}
	}
}

func TestCertified(t *testing.T) {
	failed := Report{Profiles: []ProfileReport{
		{Name: Core, Claimed: true, Result: Failed, Summary: "10 of 11 passed", Specs: []SpecReport{
			{ID: "RESTART-NODEPORT-NEW", Result: Failed, Reason: "new connections refused\nmore"},
			{ID: "RESTART-ESTABLISHED", Result: Passed},
		}},
		{Name: Policy, Claimed: false, Result: Skipped},
	}}
	err := failed.Certified()
	if err == nil || !strings.Contains(err.Error(), "Core FAILED") || !strings.Contains(err.Error(), "RESTART-NODEPORT-NEW failed: new connections refused") || strings.Contains(err.Error(), "more") {
		t.Errorf("Certified() = %v, want the failed profile and its spec's first line", err)
	}
	none := Report{Profiles: []ProfileReport{{Name: Core, Result: Skipped}}}
	if err := none.Certified(); err == nil || !strings.Contains(err.Error(), "no profile") {
		t.Errorf("Certified() of a run that claimed nothing = %v, want an error", err)
	}
	passed := Report{Profiles: []ProfileReport{{Name: Core, Claimed: true, Result: Passed}}}
	if err := passed.Certified(); err != nil {
		t.Errorf("Certified() = %v, want nil", err)
	}
}

func TestPrintSummary(t *testing.T) {
	rep := Report{Suite: SuiteInfo{Version: "v0.1.0"}, Implementation: Implementation{Name: "mydp", Version: "1.2.0"},
		Profiles: []ProfileReport{{Name: Core, Claimed: true, Result: Passed, Summary: "1 of 1 passed", Specs: []SpecReport{
			{ID: "RESTART-ESTABLISHED", Result: Passed, Passes: "3 of 3", Void: []string{"blind"}, Checks: []CheckReport{
				{Name: "streams", Figures: []FigureReport{{Name: "resets", Measured: "resets 0 of 12 (budget 0)", Budget: budget(0)}}},
			}},
		}}}}
	var b bytes.Buffer
	rep.PrintSummary(&b)
	for _, want := range []string{"dpconform v0.1.0: mydp 1.2.0", "Core", "PASSED", "RESTART-ESTABLISHED", "passed 3/3", "resets 0 of 12 (budget 0)", "[1 void run run again"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("summary lacks %q:\n%s", want, b.String())
		}
	}
}
