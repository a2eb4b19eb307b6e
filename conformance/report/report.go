package report

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"text/tabwriter"

	"sigs.k8s.io/yaml"
)

// APIVersion and Kind identify a report of this package's format (report.yaml).
const (
	APIVersion = "dpconform.io/v1alpha1"
	Kind       = "ConformanceReport"
)

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
	// Clocks are, on a topology whose hosts read clocks of their own (a cluster of
	// separate machines), each host's clock against the suite's over the run the
	// checks are from: the offset every time it stamped was converted with, and how
	// far such a time may be from where the suite placed it.
	Clocks []ClockReport `json:"clocks,omitempty"`
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

// ClockReport is one host's CLOCK_MONOTONIC against the suite's, measured NTP-style
// over the control channel of a probe on the host, at the run's start and its end.
type ClockReport struct {
	Host string `json:"host"`
	// Offset is the host's clock minus the suite's, at the start (e.g. "+16m40.000021s").
	Offset string `json:"offset"`
	// Uncertainty bounds how far any time the host stamped during the run may be from
	// where the suite placed it: half the least round trip of an exchange, and the
	// drift over the run.
	Uncertainty string `json:"uncertainty"`
	// Drift is how far the offset moved from the start to the end.
	Drift string `json:"drift"`
	// RTT is the least round trip of the exchanges at the start, of Samples.
	RTT     string `json:"rtt"`
	Samples int    `json:"samples"`
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

// PhaseReport is the time a spec spent in one phase.
type PhaseReport struct {
	Phase    Phase  `json:"phase"`
	Duration string `json:"duration"`
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

// Text renders the figure for people, as its Measured field has it: "failed
// attempts 0 of 4,812 (budget 0)".
func (f FigureReport) Text() string {
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
				detail = s.KeySpread()
			case s.Result == Passed:
				detail = s.KeyFigures()
			}
			if n := len(s.Void); n == 1 {
				detail += " [1 void run run again: a probe was blind]"
			} else if n > 1 {
				detail += fmt.Sprintf(" [%d void runs run again: a probe was blind]", n)
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

// KeySpread is KeyFigures for a repeated spec: each key figure's spread over the runs.
func (s SpecReport) KeySpread() string {
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

// KeyFigures picks the figures with budgets, for a passed spec's summary line.
func (s SpecReport) KeyFigures() string {
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
