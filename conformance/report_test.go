package conformance

import (
	"testing"
	"time"

	"github.com/dpconform/dpconform/fv/driver"
	"github.com/dpconform/dpconform/fv/matchers"
)

func TestMeasured(t *testing.T) {
	zero, two := 0.0, 200.0
	for _, tc := range []struct {
		f    matchers.Figure
		want string
	}{
		{matchers.Figure{Name: "failed_attempts", Value: 0, Unit: "attempts", Of: 4812, Budget: &zero}, "failed attempts 0 of 4,812 (budget 0)"},
		{matchers.Figure{Name: "max_gap", Value: 7.04, Unit: "ms", Budget: &two}, "max gap 7.0 ms (budget 200 ms)"},
		{matchers.Figure{Name: "resets", Value: 3, Unit: "resets", Of: 12, Budget: &zero}, "resets 3 of 12 (budget 0)"},
	} {
		if got := measured(tc.f); got != tc.want {
			t.Errorf("measured(%+v) = %q, want %q", tc.f, got, tc.want)
		}
	}
}

func TestBuildReportProfileResults(t *testing.T) {
	rep := BuildReport(driverInfo(), "d", "netns", []Result{
		{ID: "A", Profile: Core, Result: Passed},
		{ID: "B", Profile: Core, Result: Failed, Reason: "x"},
		{ID: "C", Profile: Policy, Result: Skipped},
	}, zeroTime)
	if len(rep.Profiles) != 2 || rep.Profiles[0].Result != Failed || rep.Profiles[1].Result != Skipped {
		t.Fatalf("profiles %+v", rep.Profiles)
	}
}

var zeroTime = time.Time{}

func driverInfo() driver.Info { return driver.Info{Name: "x", Version: "1", Profiles: []string{Core}} }
