package conformance

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/dpconform/dpconform/driver"
	"github.com/dpconform/dpconform/fv/harness"
	"github.com/dpconform/dpconform/fv/matchers"
	"github.com/dpconform/dpconform/fv/monotime"
	"github.com/dpconform/dpconform/fv/probe"
	"github.com/dpconform/dpconform/fv/timeline"
	"github.com/dpconform/dpconform/fv/workloads"
	"github.com/dpconform/dpconform/topologies"
)

// Env is what a spec's body works with: the world (topology, implementation, probes,
// one timeline), the implementation's info, the budgets, and the record of the
// checks. A body builds its workloads and runs its scenarios with Run.
type Env struct {
	World   *harness.World
	Topo    topologies.Topology
	Info    driver.Info
	Budgets Budgets
	Logf    func(format string, args ...any)

	checks    []CheckResult
	scenarios []ScenarioRecord
	// upgrade are the spec's Setup.Upgrade options, resolved against Info.
	upgrade driver.StartOptions
	// phase tells the runner's progress which phase the spec is in (may be nil).
	phase func(Phase)
	// clock is how much longer every time after a transition its checks allow, for
	// the hosts' clocks (clock-uncertainty where they read clocks of their own).
	clock time.Duration
}

// Record records the event name, with detail, on the world's timeline now, and
// returns its time: a spec's own marks (a step it took, an object it changed).
func (e *Env) Record(name, detail string) monotime.Time {
	return e.World.Timeline().Record(name, detail)
}

func (e *Env) enter(p Phase) {
	if e.phase != nil {
		e.phase(p)
	}
}

// ScenarioRecord is where one scenario's phases fell on the timeline, for the
// report's chart: traffic from From, the steady state that proved the
// preconditions, the transition's window, and which checks judged it. A scenario
// that ended early (a failed precondition) has only what it reached.
type ScenarioRecord struct {
	From        monotime.Time `json:"from"`
	SteadyStart monotime.Time `json:"steadyStart,omitempty"`
	SteadyEnd   monotime.Time `json:"steadyEnd,omitempty"`
	Start       monotime.Time `json:"start,omitempty"`
	End         monotime.Time `json:"end,omitempty"`
	// Checks are the indices, in the result's checks, of the scenario's
	// preconditions and checks.
	Checks []int `json:"checks,omitempty"`
}

// Traffic is a probe a scenario runs from a host: it starts before the steady state
// and is stopped once the transition has settled.
type Traffic struct {
	From  topologies.Host
	Probe probe.Config
	// Observe, if set, sees each of the probe's events as it is reported, as well as
	// the timeline: a step that waits for traffic to do something (a new address
	// served) waits on it, not on a sleep.
	Observe func(probe.Event)
}

// Check is an invariant a scenario judges: in steady state (a precondition) or
// across the transition. A Matcher judges a window of the timeline; State, instead,
// judges the world at the moment the check runs (the rules a node holds, its
// conntrack table), black-box, from the node.
type Check struct {
	Name    string
	Matcher matchers.Matcher
	State   func(ctx context.Context, e *Env) (StateResult, error)
}

// StateResult is what a State check measured: its figures and, when the invariant
// does not hold, the violation and its kind.
type StateResult struct {
	Figures   []matchers.Figure
	Violation string
	Kind      FailureKind
}

// Scenario is one round of a spec, run by Env.Run in this order: start Traffic; let
// it run for the SteadyState budget and prove Preconditions on that window (the first
// that fails ends the spec as a failed precondition); run the Transition's steps in
// order; let it settle; stop the traffic; judge Checks on the transition's window,
// from Lead before its first event to Settle after its last.
type Scenario struct {
	Traffic       []Traffic
	Preconditions []Check
	Transition    []Step
	Checks        []Check
	// Settle overrides the settle budget for this scenario (e.g. switch-settle).
	Settle time.Duration
	// Verdicts polls the implementation's policy verdicts (the driver's `events`)
	// into the timeline from the start of the traffic to the end of the settle time,
	// for checks such as matchers.HaveNoVerdicts.
	Verdicts bool
}

// CheckResult is the outcome of one check of a spec.
type CheckResult struct {
	Name    string            `json:"name"`
	Passed  bool              `json:"passed"`
	Verdict matchers.Verdict  `json:"verdict"`
	Kind    FailureKind       `json:"kind,omitempty"`
	Figures []matchers.Figure `json:"figures"`
	Message string            `json:"message,omitempty"`
	Window  string            `json:"window,omitempty"`
	Pre     bool              `json:"precondition,omitempty"`
	// At is when the first violation happened (zero when it is an absence, or for a
	// State check); Marks are every moment in breach, for the report's chart (saved
	// with the run's timeline, not in the result), MarksTotal their count.
	At         monotime.Time   `json:"at,omitempty"`
	Marks      []matchers.Mark `json:"-"`
	MarksTotal int             `json:"marksTotal,omitempty"`
}

// ErrEnvironment marks an error of the environment (a control probe failed, an
// instrument was blind, the world before a transition is not what the spec needs):
// the implementation is not charged. A spec wraps it (fmt.Errorf("%w: ...")) for a
// state of the world it set up and found wrong.
var ErrEnvironment = errors.New("environment error")

// errPrecondition marks a failed precondition: the implementation did not carry the
// traffic the spec needs before its transition.
var errPrecondition = errors.New("precondition failed")

// Run runs one scenario (see Scenario). Errors it returns are already classified:
// a failed precondition, an agent that did not come back ready and a driver error
// each keep their mark; anything else is an error of the run.
func (e *Env) Run(ctx context.Context, sc Scenario) error {
	from := monotime.Now()
	e.scenarios = append(e.scenarios, ScenarioRecord{From: from})
	rec := &e.scenarios[len(e.scenarios)-1]
	first := len(e.checks)
	defer func() {
		for i := first; i < len(e.checks); i++ {
			rec.Checks = append(rec.Checks, i)
		}
	}()
	e.enter(PhaseSteadyState)
	var stopVerdicts func() error
	if sc.Verdicts {
		stopVerdicts = e.World.PollVerdicts(ctx)
		defer func() {
			if stopVerdicts != nil {
				_ = stopVerdicts()
			}
		}()
	}
	for _, t := range sc.Traffic {
		var observe []func(probe.Event)
		if t.Observe != nil {
			observe = append(observe, t.Observe)
		}
		if _, err := e.World.StartProbe(ctx, t.From, t.Probe, observe...); err != nil {
			return err
		}
	}
	steady, err := e.steadyState(ctx, from, sc.Verdicts)
	if err != nil {
		return err
	}
	rec.SteadyStart, rec.SteadyEnd = steady.Start, steady.End
	for _, c := range sc.Preconditions {
		ok, err := e.check(ctx, c, steady, true)
		if err != nil {
			return err
		}
		if !ok {
			return fmt.Errorf("%w: %s", errPrecondition, c.Name)
		}
	}
	e.enter(PhaseTransition)
	for _, st := range sc.Transition {
		e.Logf("step: %s", st.Name)
		if err := st.Do(ctx, e); err != nil {
			return fmt.Errorf("step %q: %w", st.Name, err)
		}
	}
	settle := cmp.Or(sc.Settle, e.Budgets.Settle)
	e.enter(PhaseSettle)
	if err := sleep(ctx, settle); err != nil {
		return err
	}
	if stopVerdicts != nil {
		stop := stopVerdicts
		stopVerdicts = nil
		if err := stop(); err != nil {
			return err
		}
	}
	if err := e.World.StopProbes(ctx); err != nil {
		return fmt.Errorf("%w: %w", ErrEnvironment, err)
	}
	win, err := e.transitionWindow(from, settle)
	if err != nil {
		return err
	}
	// The servers still run: the window is judged on what they reported through its
	// end (the window is a snapshot, so take it again after the wait).
	if err := e.waitReported(ctx, win.End); err != nil {
		return err
	}
	if win, err = e.transitionWindow(from, settle); err != nil {
		return err
	}
	rec.Start, rec.End = win.Start, win.End
	e.enter(PhaseChecks)
	for _, c := range sc.Checks {
		if _, err := e.check(ctx, c, win, false); err != nil {
			return err
		}
	}
	return nil
}

// steadyState lets traffic run for the SteadyState budget and returns its window.
func (e *Env) steadyState(ctx context.Context, from monotime.Time, verdicts bool) (timeline.Window, error) {
	start := monotime.Now()
	if err := sleep(ctx, e.Budgets.SteadyState); err != nil {
		return timeline.Window{}, err
	}
	end := monotime.Now()
	// Attempts are reported when they end, and datagrams when they arrive: wait for
	// every probe's report through the window's end.
	if err := e.waitReported(ctx, end); err != nil {
		return timeline.Window{}, err
	}
	if verdicts {
		wctx, cancel := context.WithTimeout(ctx, e.Budgets.AttemptTimeout+time.Second)
		defer cancel()
		if err := e.World.WaitVerdicts(wctx, end); err != nil {
			return timeline.Window{}, fmt.Errorf("%w: %w", ErrEnvironment, err)
		}
	}
	return e.World.Window(from, start, end), nil
}

// waitReported waits until every probe still running (the servers, once the traffic
// has stopped) has reported through t, for at most an attempt's timeout and a second
// more: a probe that cannot is an instrument that failed.
func (e *Env) waitReported(ctx context.Context, t monotime.Time) error {
	ctx, cancel := context.WithTimeout(ctx, e.Budgets.AttemptTimeout+time.Second)
	defer cancel()
	if err := e.World.WaitReported(ctx, t, matchers.DefaultGrace); err != nil {
		return fmt.Errorf("%w: %w", ErrEnvironment, err)
	}
	return nil
}

// transitionWindow spans the scenario's transition events: from Lead before the
// first to Settle after the last.
func (e *Env) transitionWindow(from monotime.Time, settle time.Duration) (timeline.Window, error) {
	var first, last monotime.Time
	for _, t := range e.World.Timeline().Transitions() {
		if t.Time < from {
			continue
		}
		if first == 0 {
			first = t.Time
		}
		last = t.Time
	}
	if first == 0 {
		return timeline.Window{}, errors.New("the transition recorded no event on the timeline: a scenario needs at least one step that records one")
	}
	return e.World.Window(from, first.Add(-e.Budgets.Lead), last.Add(settle)), nil
}

// check evaluates c on win with the budgets as the matcher's defaults and records the
// result. A blind instrument is an environment error, returned as such.
func (e *Env) check(ctx context.Context, c Check, win timeline.Window, pre bool) (bool, error) {
	if c.State != nil {
		return e.checkState(ctx, c, pre)
	}
	m := c.Matcher.WithDefaults(matchers.MaxBlind(e.Budgets.MaxBlind), matchers.Within(e.Budgets.AliveWithin), matchers.ClockUncertainty(e.clock))
	ok, err := m.Match(win)
	res := m.Result()
	window := cmp.Or(res.Window, win.String())
	if pre && res.Window == "" {
		// The steady state holds no transition event yet: say what it is.
		window = "steady state of " + timeline.Duration(win.Duration().Round(100*time.Millisecond)) + ", before the transition"
	}
	cr := CheckResult{Name: c.Name, Passed: ok && err == nil, Verdict: res.Verdict, Figures: res.Figures, Window: window, Pre: pre,
		At: res.At, Marks: res.Marks, MarksTotal: res.MarksTotal}
	if err != nil {
		cr.Message = err.Error()
		e.checks = append(e.checks, cr)
		if errors.Is(err, matchers.ErrInstrument) {
			return false, fmt.Errorf("%w: check %s: %w", ErrEnvironment, c.Name, err)
		}
		return false, fmt.Errorf("check %s: %w", c.Name, err)
	}
	if !ok {
		cr.Message = m.FailureMessage(win)
		cr.Kind = res.Kind
		if pre {
			cr.Kind = matchers.KindPrecondition
		}
	}
	e.checks = append(e.checks, cr)
	return cr.Passed, nil
}

// checkState runs a State check and records its result.
func (e *Env) checkState(ctx context.Context, c Check, pre bool) (bool, error) {
	r, err := c.State(ctx, e)
	if err != nil {
		return false, fmt.Errorf("check %s: %w", c.Name, err)
	}
	cr := CheckResult{Name: c.Name, Passed: r.Violation == "", Verdict: matchers.Pass, Figures: r.Figures, Pre: pre, Window: "at " + time.Now().UTC().Format("15:04:05.000")}
	if !cr.Passed {
		cr.Verdict, cr.Kind, cr.Message = matchers.Violation, r.Kind, r.Violation
		if pre {
			cr.Kind = matchers.KindPrecondition
		}
	}
	e.checks = append(e.checks, cr)
	return cr.Passed, nil
}

// Judge runs State checks now, outside any scenario, and records their results: a
// spec of a steady state (a truth table) is a sequence of them, with no transition to
// bracket. With pre, the first check that fails ends the spec as a failed
// precondition; otherwise a failed check is recorded and judging goes on.
func (e *Env) Judge(ctx context.Context, pre bool, checks ...Check) error {
	e.enter(PhaseChecks)
	for _, c := range checks {
		if c.State == nil {
			return fmt.Errorf("check %s: Judge runs State checks; a Matcher judges a scenario's window", c.Name)
		}
		ok, err := e.checkState(ctx, c, pre)
		if err != nil {
			return err
		}
		if !ok && pre {
			return fmt.Errorf("%w: %s", errPrecondition, c.Name)
		}
	}
	return nil
}

// Checks returns the checks recorded so far.
func (e *Env) Checks() []CheckResult { return e.checks }

// Warm is the budgets' rule for a flow to count as programmed.
func (e *Env) Warm() workloads.Warm {
	return workloads.Warm{Streak: e.Budgets.WarmStreak, Interval: e.Budgets.WarmInterval, Within: e.Budgets.Programmed}
}

// Connect is a connect probe at the budgets' rate and timeout.
func (e *Env) Connect(name, target string) probe.Connect {
	return probe.Connect{Name: name, Target: target, Interval: e.Budgets.ConnectInterval, Timeout: e.Budgets.AttemptTimeout}
}

// Stream is a stream probe holding n streams at the budgets' message interval.
func (e *Env) Stream(name, target string, n int) probe.Stream {
	return probe.Stream{Name: name, Target: target, Streams: n, Interval: e.Budgets.StreamInterval, DialTimeout: e.Budgets.AttemptTimeout}
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func firstLine(s string) string {
	s, _, _ = strings.Cut(strings.TrimSpace(s), "\n")
	return s
}
