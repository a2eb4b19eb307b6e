package conformance

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/dpconform/dpconform/driver"
	"github.com/dpconform/dpconform/fv/matchers"
)

// SuiteVersion is the version of the spec catalogue this suite implements.
const SuiteVersion = "v0.1.0"

// Report is the ConformanceReport a vendor can publish (report.yaml).
type Report struct {
	APIVersion     string         `json:"apiVersion"`
	Kind           string         `json:"kind"`
	Date           string         `json:"date"`
	Suite          SuiteInfo      `json:"suite"`
	Implementation Implementation `json:"implementation"`
	Topology       string         `json:"topology"`
	// Budgets are the budgets the run held the implementation to; Overrides lists
	// those that differ from the catalogue's defaults.
	Budgets   map[string]string `json:"budgets"`
	Overrides []string          `json:"budgetOverrides,omitempty"`
	// Repeat is how many times each spec ran (--repeat), each in a fresh world.
	Repeat   int             `json:"repeat"`
	Profiles []ProfileReport `json:"profiles"`
}

// SuiteInfo identifies the suite.
type SuiteInfo struct {
	Name    string `json:"name"`
	Version string `json:"version"`
}

// Implementation is what the driver's info said. The report names the driver by the
// implementation's name and version, never by a path on the machine it ran on.
type Implementation struct {
	Name     string   `json:"name"`
	Version  string   `json:"version"`
	Profiles []string `json:"profiles"`
	Features []string `json:"features"`
	// Modes, Versions and Settings are the variants its driver's `start` offers
	// (--mode, --version oldest first, and the keys of --set).
	Modes    []string `json:"modes,omitempty"`
	Versions []string `json:"versions,omitempty"`
	Settings []string `json:"settings,omitempty"`
}

// ProfileReport is the result of one profile.
type ProfileReport struct {
	Name Profile `json:"name"`
	// Claimed is whether the implementation claims the profile and the run selected
	// it: only a claimed profile can be certified.
	Claimed bool `json:"claimed"`
	// Result of a claimed profile is passed (every spec passed, or was skipped only
	// for an optional feature the implementation does not claim), failed (one
	// failed), error (one could not be judged) or incomplete (a spec did not run for
	// another reason); of a profile not claimed, skipped.
	Result  ResultKind   `json:"result"`
	Summary string       `json:"summary"`
	Specs   []SpecReport `json:"specs"`
}

// SpecReport is one spec's line in the report.
type SpecReport struct {
	ID       string     `json:"id"`
	Result   ResultKind `json:"result"`
	Kind     string     `json:"kind,omitempty"`
	Reason   string     `json:"reason,omitempty"`
	Duration string     `json:"duration"`
	// Phases is where that time went: the time in each phase of the run (of every
	// run together, for a spec that ran more than once): the topology's set-up, the
	// implementation's start until ready, the workloads, and each scenario's phases.
	Phases []PhaseReport `json:"phases,omitempty"`
	// Passes is "k of N" for a spec that ran N > 1 times: it passed only if all did.
	Passes string `json:"passes,omitempty"`
	// Runs are each run's result, in order, for a spec that ran more than once.
	Runs []RunReport `json:"runs,omitempty"`
	// Spread is, for a spec that ran more than once, each figure's smallest, median
	// and largest value over the runs that measured it: a vendor tells a flaky
	// implementation from a broken one by it.
	Spread []FigureSpread `json:"spread,omitempty"`
	// ChecksFromRun is the run whose checks the report carries (the first failed,
	// else the first errored, else the last), for a spec that ran more than once.
	ChecksFromRun int           `json:"checksFromRun,omitempty"`
	Checks        []CheckReport `json:"checks,omitempty"`
	// Diagnostics are the files the driver collected (of every run, each in a
	// directory of its own), relative to the report.
	Diagnostics []string `json:"diagnostics,omitempty"`
	// HostSettings are the host-wide kernel settings the implementation changed
	// during the spec, e.g. "kernel.timer_migration 1 -> 0 (restored)".
	HostSettings []string `json:"hostSettings,omitempty"`
	// Void are the reasons of runs that measured nothing (a probe was blind: the
	// machine did not run it) and were run again in a fresh world.
	Void []string `json:"void,omitempty"`
	// Starts are the start calls the spec made, one per variant, in order, e.g.
	// "start --version v1", "start --version v2" for an upgrade.
	Starts []string `json:"starts,omitempty"`
	// Timeline is the raw timeline of the run the checks are from (gzipped JSON,
	// relative to the report), from which report.html draws its charts.
	Timeline string `json:"timeline,omitempty"`
}

// FigureSpread is one figure of a check over the runs of a repeated spec.
type FigureSpread struct {
	Check  string   `json:"check"`
	Figure string   `json:"figure"`
	Unit   string   `json:"unit,omitempty"`
	Budget *float64 `json:"budget,omitempty"`
	// Runs is how many runs measured it (a run that ended early measured less).
	Runs   int     `json:"runs"`
	Min    float64 `json:"min"`
	Median float64 `json:"median"`
	Max    float64 `json:"max"`
	// OverBudget counts the runs in which it exceeded its budget.
	OverBudget int `json:"overBudget,omitempty"`
}

// String renders the spread for people: "failed attempts 0 / 0 / 14 (min / median /
// max of 20 runs; budget 0; over it in 1)".
func (f FigureSpread) String() string {
	unit := ""
	if f.Unit == "ms" {
		unit = " ms"
	}
	s := fmt.Sprintf("%s %s / %s / %s%s (min / median / max of %d runs", strings.ReplaceAll(f.Figure, "_", " "), num(f.Min), num(f.Median), num(f.Max), unit, f.Runs)
	if f.Budget != nil {
		s += "; budget " + num(*f.Budget) + unit
		if f.OverBudget > 0 {
			s += fmt.Sprintf("; over it in %d", f.OverBudget)
		}
	}
	return s + ")"
}

// spread computes the figures' spread over runs, in the order the figures first
// appear. A check is known by its place among the run's checks, which every run of a
// spec records in the same order, not by its name: a name may hold what differs from
// run to run (a NodePort, an address).
func spread(runs []Result) []FigureSpread {
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
	var out []FigureSpread
	for _, k := range order {
		vs := values[k]
		slices.Sort(vs)
		med := vs[len(vs)/2]
		if len(vs)%2 == 0 {
			med = (vs[len(vs)/2-1] + vs[len(vs)/2]) / 2
		}
		f := first[k]
		out = append(out, FigureSpread{Check: names[k], Figure: k.figure, Unit: f.Unit, Budget: f.Budget, Runs: len(vs),
			Min: vs[0], Median: med, Max: vs[len(vs)-1], OverBudget: over[k]})
	}
	return out
}

// PhaseReport is the time a spec spent in one phase.
type PhaseReport struct {
	Phase    Phase  `json:"phase"`
	Duration string `json:"duration"`
}

func phaseReports(pts []PhaseTime) []PhaseReport {
	var out []PhaseReport
	for _, pt := range pts {
		out = append(out, PhaseReport{Phase: pt.Phase, Duration: pt.Duration.String()})
	}
	return out
}

// RunReport is one run of a repeated spec, without its checks.
type RunReport struct {
	Run      int        `json:"run"`
	Result   ResultKind `json:"result"`
	Kind     string     `json:"kind,omitempty"`
	Reason   string     `json:"reason,omitempty"`
	Duration string     `json:"duration"`
}

// CheckReport is one check, with every figure next to its budget.
type CheckReport struct {
	Name    string         `json:"name"`
	Result  ResultKind     `json:"result"`
	Kind    string         `json:"kind,omitempty"`
	Window  string         `json:"window,omitempty"`
	Figures []FigureReport `json:"figures"`
	// Message explains a failed check: the timeline around its first violation.
	Message string `json:"message,omitempty"`
}

// FigureReport is a measured figure and its budget, in words and numbers.
type FigureReport struct {
	Name     string   `json:"name"`
	Measured string   `json:"measured"`
	Value    float64  `json:"value"`
	Unit     string   `json:"unit,omitempty"`
	Of       int      `json:"of,omitempty"`
	Budget   *float64 `json:"budget,omitempty"`
	Within   bool     `json:"withinBudget"`
}

// BuildReport assembles a report from results, in registry order. repeat is how many
// times each spec ran (Runner.Repeat); claimed says which profiles the run certifies
// (Runner.Claimed).
func BuildReport(info driver.Info, topology string, budgets Budgets, repeat int, claimed func(Profile) bool, results []Result, now time.Time) Report {
	rep := Report{
		APIVersion: "dpconform.io/v1alpha1",
		Kind:       "ConformanceReport",
		Date:       now.UTC().Format(time.RFC3339),
		Suite:      SuiteInfo{Name: "dpconform", Version: SuiteVersion},
		Implementation: Implementation{
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
		pr := ProfileReport{Name: p, Claimed: claimed(p)}
		count := map[ResultKind]int{}
		notRun := 0
		for _, r := range rs {
			count[r.Result]++
			if r.Result == Skipped && !r.Optional {
				notRun++
			}
			pr.Specs = append(pr.Specs, specReport(r))
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

// Certified returns nil when every claimed profile passed, and otherwise an error
// naming the profiles that did not: a run that certified nothing must not look like
// one that passed.
func (rep Report) Certified() error {
	var bad []string
	claimed := 0
	for _, p := range rep.Profiles {
		if !p.Claimed {
			continue
		}
		claimed++
		if p.Result != Passed {
			bad = append(bad, fmt.Sprintf("%s %s (%s)%s", p.Name, strings.ToUpper(string(p.Result)), p.Summary, notPassed(p)))
		}
	}
	switch {
	case len(bad) > 0:
		return fmt.Errorf("not certified: %s", strings.Join(bad, "; "))
	case claimed == 0:
		return errors.New("not certified: the run covered no profile the implementation claims")
	}
	return nil
}

// notPassed names a profile's specs that failed or could not be judged, each with the
// first line of its reason, so that the last line of a long log says which spec to
// look at.
func notPassed(p ProfileReport) string {
	var specs []string
	for _, s := range p.Specs {
		if s.Result != Failed && s.Result != Errored {
			continue
		}
		reason, _, _ := strings.Cut(s.Reason, "\n")
		if len(reason) > 160 {
			reason = reason[:157] + "..."
		}
		specs = append(specs, fmt.Sprintf("%s %s: %s", s.ID, s.Result, reason))
	}
	if len(specs) == 0 {
		return ""
	}
	return ": " + strings.Join(specs, ", ")
}

func specReport(r Result) SpecReport {
	sr := SpecReport{ID: r.ID, Result: r.Result, Kind: string(r.Kind), Reason: r.Reason, Duration: r.Duration.String(), Diagnostics: r.Diagnostics, Starts: r.Starts, Timeline: filepath.ToSlash(r.Timeline), Void: r.Void, Phases: phaseReports(r.Phases)}
	if len(r.Runs) > 0 {
		k, n := r.Passes()
		sr.Passes, sr.ChecksFromRun = fmt.Sprintf("%d of %d", k, n), r.ChecksFrom
		sr.Spread = spread(r.Runs)
	}
	for _, h := range r.HostSettings {
		sr.HostSettings = append(sr.HostSettings, h.String())
	}
	for i, run := range r.Runs {
		sr.Runs = append(sr.Runs, RunReport{Run: i + 1, Result: run.Result, Kind: string(run.Kind), Reason: run.Reason, Duration: run.Duration.String()})
	}
	for _, c := range r.Checks {
		cr := CheckReport{Name: c.Name, Result: Passed, Window: c.Window}
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

func figureReport(f matchers.Figure) FigureReport {
	return FigureReport{Name: f.Name, Measured: measured(f), Value: f.Value, Unit: f.Unit, Of: f.Of, Budget: f.Budget, Within: f.Within()}
}

// measured renders a figure for people: "failed attempts 0 of 4,812 (budget 0)".
func measured(f matchers.Figure) string {
	s := strings.ReplaceAll(f.Name, "_", " ") + " " + num(f.Value)
	if f.Of > 0 {
		s += " of " + thousands(f.Of)
	}
	// Counts are named by their figure ("resets 0 of 12"); only times need a unit.
	if f.Unit == "ms" {
		s += " ms"
	}
	if f.Budget != nil {
		s += " (budget " + num(*f.Budget)
		if f.Unit == "ms" {
			s += " ms"
		}
		s += ")"
	}
	return s
}

func num(v float64) string {
	if v == float64(int64(v)) {
		return thousands(int(v))
	}
	return strconv.FormatFloat(v, 'f', 1, 64)
}

func thousands(n int) string {
	s := strconv.Itoa(n)
	if n < 0 || len(s) <= 3 {
		return s
	}
	var b strings.Builder
	pre := len(s) % 3
	b.WriteString(s[:pre])
	for i := pre; i < len(s); i += 3 {
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		b.WriteString(s[i : i+3])
	}
	return b.String()
}

// WriteYAML writes the report to path, creating its directory.
func (rep Report) WriteYAML(path string) error {
	data, err := yaml.Marshal(rep)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return os.WriteFile(path, data, 0o644)
}

// PrintSummary writes a table of the results for people.
func (rep Report) PrintSummary(out io.Writer) {
	fmt.Fprintf(out, "\ndpconform %s: %s %s\n", rep.Suite.Version, rep.Implementation.Name, rep.Implementation.Version)
	if len(rep.Overrides) > 0 {
		fmt.Fprintf(out, "budgets overridden: %s\n", strings.Join(rep.Overrides, ", "))
	}
	tw := tabwriter.NewWriter(out, 2, 4, 2, ' ', 0)
	for _, p := range rep.Profiles {
		fmt.Fprintf(tw, "\n%s\t%s\t%s\n", p.Name, strings.ToUpper(string(p.Result)), p.Summary)
		for _, s := range p.Specs {
			detail := s.Reason
			switch {
			case s.Result == Passed && len(s.Spread) > 0:
				detail = keySpread(s)
			case s.Result == Passed:
				detail = keyFigures(s)
			}
			if n := len(s.Void); n > 0 {
				detail += fmt.Sprintf(" [%d void %s run again: a probe was blind]", n, plural(n, "run", "runs"))
			}
			fmt.Fprintf(tw, "  %s\t%s\t%s\n", s.ID, s.resultColumn(), detail)
		}
	}
	tw.Flush()
}

// resultColumn is the spec's result, with "k/N" runs passed when it ran N > 1 times.
func (s SpecReport) resultColumn() string {
	if s.Passes == "" {
		return string(s.Result)
	}
	return string(s.Result) + " " + strings.Replace(s.Passes, " of ", "/", 1)
}

// keyFigure names the figures a passed spec's summary line shows, when they have a
// budget: failed new connections, stream resets and gaps, a UDP flow's unanswered
// datagrams and how late after its change the last one was sent.
var keyFigure = map[string]bool{"failed_attempts": true, "max_gap": true, "resets": true, "unanswered": true, "last_unanswered": true}

// keySpread is keyFigures for a repeated spec: each key figure's spread over the runs.
func keySpread(s SpecReport) string {
	var parts []string
	seen := map[string]bool{}
	for _, f := range s.Spread {
		if f.Budget != nil && !seen[f.Figure] && keyFigure[f.Figure] && !strings.HasPrefix(f.Check, "precondition: ") {
			seen[f.Figure] = true
			unit := ""
			if f.Unit == "ms" {
				unit = " ms"
			}
			parts = append(parts, fmt.Sprintf("%s %s/%s/%s%s", strings.ReplaceAll(f.Figure, "_", " "), num(f.Min), num(f.Median), num(f.Max), unit))
		}
	}
	if len(parts) == 0 {
		return ""
	}
	return strings.Join(parts, "; ") + " (min/median/max)"
}

// keyFigures picks the figures with budgets, for a passed spec's summary line.
func keyFigures(s SpecReport) string {
	var parts []string
	seen := map[string]bool{}
	for _, c := range s.Checks {
		if strings.HasPrefix(c.Name, "precondition: ") {
			continue
		}
		for _, f := range c.Figures {
			if f.Budget != nil && !seen[f.Name] && keyFigure[f.Name] {
				seen[f.Name] = true
				parts = append(parts, f.Measured)
			}
		}
	}
	return strings.Join(parts, "; ")
}
