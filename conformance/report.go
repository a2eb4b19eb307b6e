package conformance

import (
	"fmt"
	"path/filepath"
	"slices"
	"time"

	"github.com/dpconform/dpconform/conformance/report"
	"github.com/dpconform/dpconform/driver"
	"github.com/dpconform/dpconform/fv/matchers"
)

// SuiteVersion is the version of the spec catalogue this suite implements.
const SuiteVersion = "v0.1.0"

// spread computes the figures' spread over runs, in the order the figures first
// appear. A check is known by its place among the run's checks, which every run of a
// spec records in the same order, not by its name: a name may hold what differs from
// run to run (a NodePort, an address).
func spread(runs []Result) []report.FigureSpread {
	type key struct {
		check  int
		figure string
	}
	var order []key
	values := map[key][]float64{}
	first := map[key]matchers.Figure{}
	names := map[key]string{}
	over := map[key]int{}
	for _, run := range runs {
		for i, c := range run.Checks {
			name := c.Name
			if c.Pre {
				name = "precondition: " + name
			}
			for _, f := range c.Figures {
				k := key{i, f.Name}
				if _, ok := values[k]; !ok {
					order = append(order, k)
					first[k], names[k] = f, name
				}
				values[k] = append(values[k], f.Value)
				if !f.Within() {
					over[k]++
				}
			}
		}
	}
	var out []report.FigureSpread
	for _, k := range order {
		vs := values[k]
		slices.Sort(vs)
		med := vs[len(vs)/2]
		if len(vs)%2 == 0 {
			med = (vs[len(vs)/2-1] + vs[len(vs)/2]) / 2
		}
		f := first[k]
		out = append(out, report.FigureSpread{Check: names[k], Figure: k.figure, Unit: f.Unit, Budget: f.Budget, Runs: len(vs),
			Min: vs[0], Median: med, Max: vs[len(vs)-1], OverBudget: over[k]})
	}
	return out
}

func phaseReports(pts []PhaseTime) []report.PhaseReport {
	var out []report.PhaseReport
	for _, pt := range pts {
		out = append(out, report.PhaseReport{Phase: pt.Phase, Duration: pt.Duration.String()})
	}
	return out
}

// BuildReport assembles a report from results, in registry order. repeat is how many
// times each spec ran (Runner.Repeat); claimed says which profiles the run certifies
// (Runner.Claimed).
func BuildReport(info driver.Info, topology string, budgets Budgets, repeat int, claimed func(Profile) bool, results []Result, now time.Time) report.Report {
	rep := report.Report{
		APIVersion: report.APIVersion,
		Kind:       report.Kind,
		Date:       now.UTC().Format(time.RFC3339),
		Suite:      report.SuiteInfo{Name: "dpconform", Version: SuiteVersion},
		Implementation: report.Implementation{
			Name: info.Name, Version: info.Version,
			Profiles: info.Profiles, Features: info.Features,
			Modes: info.Modes, Versions: info.Versions, Settings: info.Settings,
		},
		Topology:  topology,
		Budgets:   budgets.Values(),
		Overrides: budgets.Overridden(),
		Repeat:    repeat,
	}
	byProfile := map[Profile][]Result{}
	for _, r := range results {
		byProfile[r.Profile] = append(byProfile[r.Profile], r)
	}
	for _, p := range AllProfiles {
		rs := byProfile[p]
		if len(rs) == 0 {
			continue
		}
		pr := report.ProfileReport{Name: p, Claimed: claimed(p)}
		count := map[ResultKind]int{}
		notRun := 0
		for _, r := range rs {
			count[r.Result]++
			if r.Result == Skipped && !r.Optional {
				notRun++
			}
			pr.Specs = append(pr.Specs, r.Report())
		}
		switch {
		case !pr.Claimed:
			pr.Result = Skipped
		case count[Errored] > 0:
			pr.Result = Errored
		case count[Failed] > 0:
			pr.Result = Failed
		case notRun > 0 || count[Passed] == 0:
			pr.Result = Incomplete
		default:
			pr.Result = Passed
		}
		pr.Summary = fmt.Sprintf("%d passed, %d failed, %d skipped, %d error", count[Passed], count[Failed], count[Skipped], count[Errored])
		rep.Profiles = append(rep.Profiles, pr)
	}
	return rep
}

// Report is the result's line in report.yaml.
func (r Result) Report() report.SpecReport {
	sr := report.SpecReport{ID: r.ID, Result: r.Result, Kind: string(r.Kind), Reason: r.Reason, Duration: r.Duration.String(), Diagnostics: r.Diagnostics, Starts: r.Starts, Timeline: filepath.ToSlash(r.Timeline), Void: r.Void, Phases: phaseReports(r.Phases), Clocks: r.Clocks}
	if len(r.Runs) > 0 {
		k, n := r.Passes()
		sr.Passes, sr.ChecksFromRun = fmt.Sprintf("%d of %d", k, n), r.ChecksFrom
		sr.Spread = spread(r.Runs)
	}
	for _, h := range r.HostSettings {
		sr.HostSettings = append(sr.HostSettings, h.String())
	}
	for i, run := range r.Runs {
		sr.Runs = append(sr.Runs, report.RunReport{Run: i + 1, Result: run.Result, Kind: string(run.Kind), Reason: run.Reason, Duration: run.Duration.String()})
	}
	for _, c := range r.Checks {
		cr := report.CheckReport{Name: c.Name, Result: Passed, Window: c.Window}
		if !c.Passed {
			cr.Result, cr.Kind, cr.Message = Failed, string(c.Kind), c.Message
		}
		if c.Pre {
			cr.Name = "precondition: " + c.Name
		}
		for _, f := range c.Figures {
			cr.Figures = append(cr.Figures, figureReport(f))
		}
		sr.Checks = append(sr.Checks, cr)
	}
	return sr
}

func figureReport(f matchers.Figure) report.FigureReport {
	fr := report.FigureReport{Name: f.Name, Value: f.Value, Unit: f.Unit, Of: f.Of, Budget: f.Budget, Within: f.Within()}
	fr.Measured = fr.Text()
	return fr
}

// FigureText renders a figure for people, as the report does: "failed attempts 0 of
// 4,812 (budget 0)".
func FigureText(f matchers.Figure) string { return figureReport(f).Measured }
