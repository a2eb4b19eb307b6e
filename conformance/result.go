package conformance

import (
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/dpconform/dpconform/conformance/report"
)

// Result is the outcome of one spec.
type Result struct {
	ID          string        `json:"id"`
	Profile     Profile       `json:"profile"`
	Description string        `json:"description"`
	Result      ResultKind    `json:"result"`
	Reason      string        `json:"reason,omitempty"`
	Duration    time.Duration `json:"duration"` // void runs (Void) included
	Checks      []CheckResult `json:"checks,omitempty"`
	// Kind is how a spec failed outside its checks (not-ready, precondition).
	Kind FailureKind `json:"kind,omitempty"`
	// Diagnostics are the files the driver collected for a failed spec (of every run),
	// relative to the output directory.
	Diagnostics []string `json:"diagnostics,omitempty"`
	// Runs are the results of each run, in order, when the spec ran more than once
	// (Config.Repeat); the fields above then combine them (combine).
	Runs []Result `json:"runs,omitempty"`
	// ChecksFrom is the run (from 1) whose Checks, Kind and Message the result
	// carries, when it ran more than once.
	ChecksFrom int `json:"checksFrom,omitempty"`
	// Optional is set on a spec skipped only because the implementation does not
	// claim an optional feature it needs: that skip does not keep its profile from
	// passing.
	Optional bool `json:"optional,omitempty"`
	// Message is the full failure message (timelines included) for people.
	Message string `json:"message,omitempty"`
	// HostSettings are the host-wide kernel settings the run changed (of every run),
	// and whether the runner could put them back.
	HostSettings []HostSetting `json:"hostSettings,omitempty"`
	// Starts are the distinct start calls the spec made (of every run), e.g.
	// "start --version v1", "start --version v2": the variants it ran.
	Starts []string `json:"starts,omitempty"`
	// Timeline is the run's raw timeline (TimelineRecord), relative to the output
	// directory; of a spec that ran more than once, the timeline of the run whose
	// checks it carries (each run keeps its own in Runs).
	Timeline string `json:"timeline,omitempty"`
	// Phases is how long the run spent in each phase (of a spec that ran more than
	// once, or whose run was void and ran again, of its runs together): where its time
	// went.
	Phases []PhaseTime `json:"phases,omitempty"`
	// Clocks are the hosts' clocks over the run (a topology whose hosts read clocks
	// of their own; harness.MeasureClocks), of the run whose checks it carries.
	Clocks []report.ClockReport `json:"clocks,omitempty"`
	// Void are the reasons of runs that were void, each run again in a fresh world:
	// a probe was blind (matchers.ErrBlind, the machine did not run it) and no check
	// had failed, or the control flow was blind, so the run measured nothing either
	// way.
	Void []string `json:"void,omitempty"`

	blind bool // void: a blind probe with no other check failed, or a blind control flow
}

// FailedKinds returns the kinds of the spec's failure and of its failed checks.
func (r Result) FailedKinds() []FailureKind {
	var out []FailureKind
	if r.Kind != "" {
		out = append(out, r.Kind)
	}
	for _, c := range r.Checks {
		if !c.Passed && c.Kind != "" && !slices.Contains(out, c.Kind) {
			out = append(out, c.Kind)
		}
	}
	return out
}

// FailedKindsText is FailedKinds for people: "timeout, reset".
func (r Result) FailedKindsText() string {
	var ks []string
	for _, k := range r.FailedKinds() {
		ks = append(ks, string(k))
	}
	return strings.Join(ks, ", ")
}

// Combine folds the runs of a spec into one result: failed if any run failed, error
// if any errored and none failed, passed or skipped only if every run was (a mix of
// passed and skipped runs is a skip that keeps the profile incomplete). It carries the
// checks of the first failed run (else the first errored, else the last) and its
// reason, prefixed with the run.
func Combine(runs []Result) Result {
	res := Result{ID: runs[0].ID, Profile: runs[0].Profile, Description: runs[0].Description, Runs: runs}
	count := map[ResultKind]int{}
	for _, run := range runs {
		count[run.Result]++
		res.Duration += run.Duration
		res.Diagnostics = append(res.Diagnostics, run.Diagnostics...)
		res.HostSettings = append(res.HostSettings, run.HostSettings...)
		res.Void = append(res.Void, run.Void...)
		for _, st := range run.Starts {
			if !slices.Contains(res.Starts, st) {
				res.Starts = append(res.Starts, st)
			}
		}
	}
	res.Phases = sumPhases(runs)
	kept := len(runs) - 1
	switch {
	case count[Failed] > 0:
		res.Result, kept = Failed, firstRun(runs, Failed)
	case count[Errored] > 0:
		res.Result, kept = Errored, firstRun(runs, Errored)
	case count[Passed] == len(runs):
		res.Result = Passed
	case count[Skipped] == len(runs):
		res.Result, res.Reason, res.Optional = Skipped, runs[0].Reason, runs[0].Optional
	default:
		res.Result, kept = Skipped, firstRun(runs, Skipped)
		res.Reason = fmt.Sprintf("skipped in %d of %d runs: %s", count[Skipped], len(runs), runs[kept].Reason)
	}
	k := runs[kept]
	res.ChecksFrom, res.Checks, res.Kind, res.Message, res.Clocks = kept+1, k.Checks, k.Kind, k.Message, k.Clocks
	if res.Result == Failed || res.Result == Errored {
		res.Reason = fmt.Sprintf("run %d: %s", kept+1, k.Reason)
	}
	return res
}

// firstRun returns the index of the first run with result kind.
func firstRun(runs []Result, kind ResultKind) int {
	return slices.IndexFunc(runs, func(r Result) bool { return r.Result == kind })
}

// Passes returns how many of the spec's runs passed, of how many ran: a spec that
// was not repeated ran once, or not at all if skipped.
func (r Result) Passes() (passed, of int) {
	if len(r.Runs) == 0 {
		switch r.Result {
		case Passed:
			return 1, 1
		case Skipped:
			return 0, 0
		}
		return 0, 1
	}
	for _, run := range r.Runs {
		if run.Result == Passed {
			passed++
		}
	}
	return passed, len(r.Runs)
}

// relativeTo returns the files under dir, relative to it; a report names nothing
// outside its own directory.
func relativeTo(dir string, files []string) []string {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil
	}
	var out []string
	for _, f := range files {
		fa, err := filepath.Abs(f)
		if err != nil {
			continue
		}
		if rel, err := filepath.Rel(abs, fa); err == nil && rel != ".." && !strings.HasPrefix(rel, "../") {
			out = append(out, filepath.ToSlash(rel))
		}
	}
	return out
}

// overBudget renders the figures of a failed check that exceed their budgets.
func overBudget(c CheckResult) string {
	var parts []string
	for _, f := range c.Figures {
		if !f.Within() {
			parts = append(parts, FigureText(f))
		}
	}
	if len(parts) == 0 {
		return firstLine(c.Message)
	}
	return strings.Join(parts, "; ")
}
