package conformance

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/dpconform/dpconform/driver"
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
		if got := FigureText(tc.f); got != tc.want {
			t.Errorf("FigureText(%+v) = %q, want %q", tc.f, got, tc.want)
		}
	}
}

func claimsCore(p Profile) bool { return p == Core }

func TestBuildReportProfileResults(t *testing.T) {
	for _, tc := range []struct {
		name    string
		results []Result
		want    ResultKind
	}{
		{"every spec passed", []Result{{ID: "A", Profile: Core, Result: Passed}, {ID: "B", Profile: Core, Result: Passed}}, Passed},
		{"one failed", []Result{{ID: "A", Profile: Core, Result: Passed}, {ID: "B", Profile: Core, Result: Failed, Reason: "why B\nthe timeline"}}, Failed},
		{"one could not be judged", []Result{{ID: "A", Profile: Core, Result: Failed}, {ID: "B", Profile: Core, Result: Errored, Reason: "why B"}}, Errored},
		{"a spec skipped for an optional feature", []Result{{ID: "A", Profile: Core, Result: Passed}, {ID: "B", Profile: Core, Result: Skipped, Optional: true}}, Passed},
		{"a spec not run (focus)", []Result{{ID: "A", Profile: Core, Result: Passed}, {ID: "B", Profile: Core, Result: Skipped}}, Incomplete},
		{"nothing ran", []Result{{ID: "A", Profile: Core, Result: Skipped, Optional: true}}, Incomplete},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rep := BuildReport(driverInfo(), "netns", DefaultBudgets, 1, claimsCore, append(tc.results, Result{ID: "C", Profile: Policy, Result: Skipped}), time.Time{})
			if len(rep.Profiles) != 2 || rep.Profiles[0].Result != tc.want || rep.Profiles[1].Result != Skipped || rep.Profiles[1].Claimed {
				t.Fatalf("profiles %+v, want Core %s and Policy skipped, unclaimed", rep.Profiles, tc.want)
			}
			err := rep.Certified()
			if (err == nil) != (tc.want == Passed) {
				t.Errorf("Certified() = %v with Core %s", err, tc.want)
			}
			// The error is a long log's last line: it names the spec to look at.
			if tc.want == Failed || tc.want == Errored {
				if want := "B " + string(tc.want) + ": why B"; err == nil || !strings.Contains(err.Error(), want) {
					t.Errorf("Certified() = %v, want it to name %q", err, want)
				}
			}
		})
	}
}

// A driver that claims Core and no spec runs must not pass as certified.
func TestCertifiedNeedsAClaimedProfile(t *testing.T) {
	rep := BuildReport(driverInfo(), "netns", DefaultBudgets, 1, func(Profile) bool { return false },
		[]Result{{ID: "A", Profile: Core, Result: Skipped}}, time.Time{})
	if err := rep.Certified(); err == nil || !strings.Contains(err.Error(), "no profile") {
		t.Errorf("Certified() = %v, want an error: nothing claimed was run", err)
	}
}

// A report is published: it must not carry paths of the machine it ran on.
func TestReportCarriesNoMachinePaths(t *testing.T) {
	out := t.TempDir()
	abs := []string{filepath.Join(out, "diagnostics", "A", "node-a", "maps.txt"), "/elsewhere/x.txt"}
	rel := relativeTo(out, abs)
	if len(rel) != 1 || rel[0] != "diagnostics/A/node-a/maps.txt" {
		t.Fatalf("relativeTo = %v, want only the file under the output directory, relative", rel)
	}
	rep := BuildReport(driverInfo(), "netns", DefaultBudgets, 1, claimsCore,
		[]Result{{ID: "A", Profile: Core, Result: Failed, Diagnostics: rel}}, time.Time{})
	path := filepath.Join(out, "report.yaml")
	if err := rep.WriteYAML(path); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(data), out) || strings.Contains(string(data), "driver:") {
		t.Errorf("report.yaml names a path of this machine:\n%s", data)
	}
	for _, want := range []string{"name: x", "version: \"1\"", "- diagnostics/A/node-a/maps.txt", "stream-max-gap: 200ms"} {
		if !strings.Contains(string(data), want) {
			t.Errorf("report.yaml lacks %q:\n%s", want, data)
		}
	}
}

func TestClaimsRequireTheProfilesFeatures(t *testing.T) {
	if err := claims(driver.Info{Name: "x", Profiles: []string{"Core"}, Features: []string{"ClusterIP", "NodePort", "TCP"}}); err != nil {
		t.Errorf("Core with its features: %v", err)
	}
	err := claims(driver.Info{Name: "x", Profiles: []string{"Core"}})
	if err == nil || !strings.Contains(err.Error(), "claims the Core profile without its required features ClusterIP, NodePort, TCP") {
		t.Errorf("Core without features: %v", err)
	}
	if err := claims(driver.Info{Name: "x", Profiles: []string{"Cor"}}); err == nil || !strings.Contains(err.Error(), `unknown profile "Cor"`) {
		t.Errorf("a misspelt profile: %v", err)
	}
}

func TestBudgets(t *testing.T) {
	b := DefaultBudgets
	for _, ok := range []string{"ready=90s", "warm-streak=50", "stream-max-gap=300ms"} {
		if err := b.Set(ok); err != nil {
			t.Errorf("Set(%q): %v", ok, err)
		}
	}
	if b.Ready != 90*time.Second || b.WarmStreak != 50 || b.StreamMaxGap != 300*time.Millisecond {
		t.Errorf("budgets not set: %+v", b)
	}
	if got := strings.Join(b.Overridden(), " "); got != "ready=1m30s stream-max-gap=300ms warm-streak=50" {
		t.Errorf("Overridden() = %q", got)
	}
	for bad, want := range map[string]string{
		"ready":           "want name=value",
		"redy=1s":         `unknown budget "redy"`,
		"ready=soon":      "want a positive duration",
		"warm-streak=-1":  "want a positive whole number",
		"max-blind=-10ms": "want a positive duration",
		// Found here, not after a spec's world was set up and its first probe started.
		"order-interval=50us": "budget order-interval=50µs: a probe's schedule cannot be shorter than 100µs; set it to 100µs or more",
	} {
		if err := b.Set(bad); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Set(%q) = %v, want %q", bad, err, want)
		}
	}
	if b.OrderInterval != DefaultBudgets.OrderInterval {
		t.Errorf("a refused budget was set: order-interval=%s", b.OrderInterval)
	}
	if err := DefaultBudgets.Validate(); err != nil {
		t.Errorf("the catalogue's budgets: %v", err)
	}
	if n := len(DefaultBudgets.Values()); n != len(BudgetNames()) || n < 16 {
		t.Errorf("%d budgets in the report, %d named", n, len(BudgetNames()))
	}
	for _, name := range BudgetNames() {
		if name == "" {
			t.Error("a budget without a name tag")
		}
	}
}

func driverInfo() driver.Info {
	return driver.Info{Name: "x", Version: "1", Profiles: []string{"Core"}, Features: []string{"ClusterIP", "NodePort", "TCP"}}
}

// The report says which variants the implementation offers and which ones each
// spec started, so that an upgrade's result names the versions it ran.
func TestReportRecordsStarts(t *testing.T) {
	info := driverInfo()
	info.Versions, info.Settings = []string{"v1", "v2"}, []string{"ct-size"}
	rep := BuildReport(info, "netns", DefaultBudgets, 1, claimsCore,
		[]Result{{ID: "A", Profile: Core, Result: Passed, Starts: []string{"start --version v1", "start --version v2"}}}, time.Time{})
	path := filepath.Join(t.TempDir(), "report.yaml")
	if err := rep.WriteYAML(path); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"versions:\n  - v1\n  - v2", "settings:\n  - ct-size", "starts:\n    - start --version v1\n    - start --version v2"} {
		if !strings.Contains(string(data), want) {
			t.Errorf("report.yaml lacks %q:\n%s", want, data)
		}
	}
	combined := Combine([]Result{{ID: "A", Result: Passed, Starts: []string{"start", "start --set ct-size=8"}}, {ID: "A", Result: Passed, Starts: []string{"start", "start --set ct-size=8"}}})
	if strings.Join(combined.Starts, "|") != "start|start --set ct-size=8" {
		t.Errorf("the starts of two runs combine to %q", combined.Starts)
	}
}

// A spec whose upgrade the implementation cannot make is skipped, with the reason,
// as one whose start it cannot make is.
func TestSelectedChecksTheUpgrade(t *testing.T) {
	info := driver.Info{Name: "x", Profiles: []string{"Upgrade"}, Features: []string{"ClusterIP", "NodePort", "TCP"}, Versions: []string{"v1"}, Settings: []string{"ct-size"}}
	r := &Runner{info: info}
	body := func(context.Context, *Env) error { return nil }
	for _, tc := range []struct {
		setup Setup
		why   string
	}{
		{Setup{Start: driver.StartOptions{Set: map[string]string{"ct-size": "1"}}, Upgrade: driver.StartOptions{Set: map[string]string{"ct-size": "2"}}}, ""},
		{Setup{Start: driver.StartOptions{Version: driver.VersionPrevious}, Upgrade: driver.StartOptions{Version: driver.VersionLatest}}, "x offers one version (v1): @previous needs 2"},
		{Setup{Upgrade: driver.StartOptions{Set: map[string]string{"ct-max": "2"}}}, `x does not offer setting "ct-max" (settings: ct-size)`},
	} {
		ok, why, _ := r.Selected(Spec{ID: "U", Profile: Upgrade, Setup: tc.setup, Body: body})
		if ok != (tc.why == "") || !strings.Contains(why, tc.why) {
			t.Errorf("Selected(%+v) = %v %q, want %q", tc.setup, ok, why, tc.why)
		}
	}
}
