package record

import (
	"bytes"
	"cmp"
	_ "embed"
	"fmt"
	"html/template"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/dpconform/dpconform/conformance"
	"github.com/dpconform/dpconform/conformance/report"
	"github.com/dpconform/dpconform/fv/matchers"
	"github.com/dpconform/dpconform/fv/monotime"
	"github.com/dpconform/dpconform/fv/probe"
	"github.com/dpconform/dpconform/fv/timeline"
)

// report.html is one self-contained page: inline CSS, inline SVG charts drawn here
// in Go, no script and nothing fetched, so that it reads the same from a CI
// artifact, a mail attachment or a file:// URL, with scripts disabled, and its
// charts cannot drift from report.yaml: both are made from the same run data
// (RunRecord and the saved timelines). docs/certification.md says why no charting
// library.

//go:embed report.html.tmpl
var reportTemplate string

var pageTemplate = template.Must(template.New("report").Funcs(template.FuncMap{
	"upper": strings.ToUpper,
	"lower": strings.ToLower,
}).Parse(reportTemplate))

type pageView struct {
	Title          string
	Suite          report.SuiteInfo
	Implementation report.Implementation
	Topology       string
	Date           string
	Repeat         int
	Certified      bool
	Verdict        string
	Profiles       []profileView
	Budgets        []budgetView
	Overrides      []string
	Specs          []specView
}

type profileView struct {
	Name    conformance.Profile
	Claimed bool
	Result  conformance.ResultKind
	Summary string
	Specs   []specRow
	// NotRun are the specs skipped, grouped by why.
	NotRun []notRun
}

type notRun struct {
	Reason string
	IDs    []string
}

type specRow struct {
	ID     string
	Result conformance.ResultKind
	Passes string
	Kind   string
	Detail string
	// Link goes to the first violation in the spec's chart, else to the spec.
	Link string
}

type budgetView struct {
	Name, Value string
	Overridden  bool
}

type specView struct {
	ID, Profile, Description string
	Result                   conformance.ResultKind
	Kind, Reason, Duration   string
	Passes                   string
	Open                     bool
	Checks                   []checkView
	ChecksFromRun            int
	Runs                     []runView
	Spread                   []report.FigureSpread
	Charts                   []chartPair
	ChartNote                string
	Message                  string
	Diagnostics              []string
	HostSettings             []string
	Clocks                   []report.ClockReport
	Timeline                 string
}

// runView is one run of a repeated spec.
type runView struct {
	Run                    int
	Result                 conformance.ResultKind
	Kind, Duration, Reason string
}

type checkView struct {
	Num     int // of a failed check, as its chart marks it; 0 for a passed one
	Name    string
	Result  conformance.ResultKind
	Kind    string
	Window  string
	Figures []report.FigureReport
	Link    string
}

type chartPair struct {
	Title    string
	Overview chartView
	Zoom     *chartView
	// Breaches say in words what the chart shows of each failed check.
	Breaches []breachNote
}

type breachNote struct {
	Num  int
	Link string
	Name string
	Text string
}

// RenderHTML renders the page of a recorded run whose timelines are saved in dir.
func RenderHTML(rec RunRecord, dir string) ([]byte, error) {
	rep := rec.Report()
	pv := pageView{
		Title:          fmt.Sprintf("dpconform %s: %s %s", rep.Suite.Version, rep.Implementation.Name, rep.Implementation.Version),
		Suite:          rep.Suite,
		Implementation: rep.Implementation,
		Topology:       rep.Topology,
		Date:           rep.Date,
		Repeat:         rep.Repeat,
		Overrides:      rep.Overrides,
	}
	if err := rep.Certified(); err != nil {
		pv.Verdict = err.Error()
	} else {
		pv.Certified = true
		var names []string
		for _, p := range rep.Profiles {
			if p.Claimed {
				names = append(names, string(p.Name))
			}
		}
		pv.Verdict = "certified: " + strings.Join(names, ", ")
	}
	overridden := map[string]bool{}
	for _, o := range rep.Overrides {
		name, _, _ := strings.Cut(o, "=")
		overridden[name] = true
	}
	for _, name := range conformance.BudgetNames() {
		pv.Budgets = append(pv.Budgets, budgetView{Name: name, Value: rep.Budgets[name], Overridden: overridden[name]})
	}
	byID := map[string]conformance.Result{}
	for _, r := range rec.Results {
		byID[r.ID] = r
	}
	for _, p := range rep.Profiles {
		prv := profileView{Name: p.Name, Claimed: p.Claimed, Result: p.Result, Summary: p.Summary}
		for _, s := range p.Specs {
			if s.Result == conformance.Skipped {
				i := slices.IndexFunc(prv.NotRun, func(n notRun) bool { return n.Reason == s.Reason })
				if i < 0 {
					prv.NotRun = append(prv.NotRun, notRun{Reason: s.Reason})
					i = len(prv.NotRun) - 1
				}
				prv.NotRun[i].IDs = append(prv.NotRun[i].IDs, s.ID)
				continue
			}
			sv := specPage(s, byID[s.ID], dir)
			row := specRow{ID: s.ID, Result: s.Result, Passes: s.Passes, Kind: sv.Kind, Detail: s.Reason, Link: "#" + s.ID}
			switch {
			case s.Result == conformance.Passed && len(s.Spread) > 0:
				row.Detail = s.KeySpread()
			case s.Result == conformance.Passed:
				row.Detail = s.KeyFigures()
			}
			for _, c := range sv.Checks {
				if c.Num > 0 && c.Link != "" {
					row.Link = c.Link
					break
				}
			}
			prv.Specs = append(prv.Specs, row)
			pv.Specs = append(pv.Specs, sv)
		}
		pv.Profiles = append(pv.Profiles, prv)
	}
	var b bytes.Buffer
	if err := pageTemplate.Execute(&b, pv); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// specPage is the section of one spec: its checks, runs and the charts of the run
// its checks are from.
func specPage(s report.SpecReport, r conformance.Result, dir string) specView {
	sv := specView{ID: s.ID, Profile: string(r.Profile), Description: r.Description, Result: s.Result, Kind: r.FailedKindsText(), Reason: s.Reason,
		Duration: seconds(r.Duration), Passes: s.Passes, Open: s.Result == conformance.Failed || s.Result == conformance.Errored, ChecksFromRun: s.ChecksFromRun,
		Spread: s.Spread, Message: r.Message, Diagnostics: s.Diagnostics, HostSettings: s.HostSettings, Clocks: s.Clocks, Timeline: s.Timeline}
	for i, run := range r.Runs {
		sv.Runs = append(sv.Runs, runView{Run: i + 1, Result: run.Result, Kind: run.FailedKindsText(), Duration: seconds(run.Duration), Reason: run.Reason})
	}
	failed := 0
	for i, c := range s.Checks {
		cv := checkView{Name: c.Name, Result: c.Result, Kind: c.Kind, Window: c.Window, Figures: c.Figures}
		if c.Result != conformance.Passed && i < len(r.Checks) {
			failed++
			cv.Num = failed
		}
		sv.Checks = append(sv.Checks, cv)
	}
	if s.Result == conformance.Skipped {
		return sv
	}
	if r.Timeline == "" {
		sv.ChartNote = "No timeline was saved for this run, so there is no chart."
		return sv
	}
	tr, err := conformance.ReadTimeline(filepath.Join(dir, r.Timeline))
	if err != nil {
		sv.ChartNote = "The timeline of this run could not be read, so there is no chart: " + err.Error()
		return sv
	}
	if len(tr.Scenarios) == 0 {
		sv.ChartNote = "This spec judges the state of the nodes, not traffic across a transition: it has no timeline chart."
		return sv
	}
	for i, sc := range tr.Scenarios {
		var checks []chartCheck
		for _, ci := range sc.Checks {
			if ci >= len(r.Checks) || r.Checks[ci].Passed {
				continue
			}
			c := r.Checks[ci]
			checks = append(checks, chartCheck{Num: sv.Checks[ci].Num, Name: sv.Checks[ci].Name, Kind: c.Kind, At: c.At, Marks: tr.Marks[ci], Total: c.MarksTotal})
		}
		x0, x1 := sc.From, scenarioEnd(&tr, sc)
		if x1 <= x0 {
			continue
		}
		id := fmt.Sprintf("%s-s%d", s.ID, i+1)
		title := "The scenario, from its traffic's start to the end of its checked window"
		if len(tr.Scenarios) > 1 {
			title = fmt.Sprintf("Round %d of %d, from its traffic's start to the end of its checked window", i+1, len(tr.Scenarios))
		}
		cp := chartPair{Title: title, Overview: buildChart(id, "overview", title, &tr, sc, checks, x0, x1)}
		rel := scenarioWindow(&tr, sc)
		if z0, z1, ok := zoomRange(checks, sc, x0, x1, &tr); ok {
			zt := fmt.Sprintf("Close up, around the first violation: %s to %s", rel.Relative(z0), rel.Relative(z1))
			z := buildChart(id+"-zoom", "zoom", zt, &tr, sc, checks, z0, z1)
			cp.Zoom = &z
		}
		for _, c := range checks {
			cp.Breaches = append(cp.Breaches, breachNote{Num: c.Num, Name: c.Name, Link: fmt.Sprintf("#%s-first-%d", id, c.Num), Text: breachText(c, rel)})
		}
		for _, f := range cp.Overview.Firsts {
			for j := range sv.Checks {
				if sv.Checks[j].Num == f.Num && sv.Checks[j].Link == "" {
					sv.Checks[j].Link = "#" + f.ID
				}
			}
		}
		sv.Charts = append(sv.Charts, cp)
	}
	return sv
}

// scenarioWindow is the window the scenario's moments are told relative to: its
// transition events, none from an earlier scenario.
func scenarioWindow(tr *conformance.TimelineRecord, sc conformance.ScenarioRecord) timeline.Window {
	var trans []timeline.Transition
	for _, t := range tr.Transitions {
		if t.Time >= sc.From {
			trans = append(trans, t)
		}
	}
	return timeline.Window{Start: cmp.Or(sc.Start, sc.SteadyStart, sc.From), End: sc.End, Transitions: trans}
}

// breachText says what a failed check's marks show: "192 reset, from 995.6 ms after
// start-sent to 263.0 ms after ready".
func breachText(c chartCheck, rel timeline.Window) string {
	if len(c.Marks) == 0 {
		if c.At != 0 {
			return fmt.Sprintf("%s, %s", c.Kind, rel.Relative(c.At))
		}
		return string(c.Kind) + " (an absence: nothing to point at on the timeline)"
	}
	count := map[matchers.Kind]int{}
	var kinds []string
	first, last := c.Marks[0].Time, c.Marks[0].Time
	for _, m := range c.Marks {
		if count[m.Kind] == 0 {
			kinds = append(kinds, string(m.Kind))
		}
		count[m.Kind]++
		first, last = min(first, m.Time), max(last, m.Time, m.End)
	}
	var parts []string
	for _, k := range kinds {
		parts = append(parts, fmt.Sprintf("%d %s", count[matchers.Kind(k)], k))
	}
	s := strings.Join(parts, ", ")
	if c.Total > len(c.Marks) {
		s = fmt.Sprintf("%d in all; the first %d: %s", c.Total, len(c.Marks), s)
	}
	if first == last {
		return s + ", " + rel.Relative(first)
	}
	return fmt.Sprintf("%s, from %s to %s", s, rel.Relative(first), rel.Relative(last))
}

// scenarioEnd is the end of a scenario's window, or, for one that ended early, the
// last thing its traffic reported.
func scenarioEnd(tr *conformance.TimelineRecord, sc conformance.ScenarioRecord) monotime.Time {
	if sc.End != 0 {
		return sc.End
	}
	last := sc.SteadyEnd
	for _, e := range tr.Events {
		if e.Time < sc.From {
			continue
		}
		switch e.Kind {
		case probe.KindAttempt, probe.KindOpen, probe.KindEcho, probe.KindEnd, probe.KindSent, probe.KindReply, probe.KindRecv:
			last = max(last, e.Time, e.End)
		}
	}
	for _, t := range tr.Transitions {
		if t.Time >= sc.From {
			last = max(last, t.Time)
		}
	}
	return last
}

// zoomRange is the stretch around the first violation of the scenario: the first
// run of breaches (marks less than 100 ms apart), with the transition event just
// before it, padded. It is worth a chart of its own only when it is much shorter than
// the whole.
func zoomRange(checks []chartCheck, sc conformance.ScenarioRecord, x0, x1 monotime.Time, tr *conformance.TimelineRecord) (monotime.Time, monotime.Time, bool) {
	var at monotime.Time
	var c *chartCheck
	for i := range checks {
		if a := checks[i].At; a >= x0 && a <= x1 && (at == 0 || a < at) {
			at, c = a, &checks[i]
		}
	}
	if c == nil {
		return 0, 0, false
	}
	end := at
	for _, m := range c.Marks {
		if m.Time < at {
			continue
		}
		if m.Time-end > monotime.Time(100*time.Millisecond) || m.Time > at.Add(2*time.Second) {
			break
		}
		end = max(end, min(max(m.Time, m.End), at.Add(2*time.Second)))
	}
	pad := max(50*time.Millisecond, end.Sub(at)/5)
	z0, z1 := at.Add(-pad), end.Add(pad)
	for _, t := range tr.Transitions {
		if t.Time >= sc.From && t.Time <= at && at.Sub(t.Time) < 600*time.Millisecond {
			z0 = min(z0, t.Time.Add(-20*time.Millisecond))
			break
		}
	}
	z0, z1 = max(z0, x0), min(z1, x1)
	if z1 <= z0 || z1.Sub(z0)*3 > x1.Sub(x0) {
		return 0, 0, false
	}
	return z0, z1, true
}

func seconds(d time.Duration) string { return fmt.Sprintf("%.1f s", d.Seconds()) }
