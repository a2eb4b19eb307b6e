package conformance

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/dpconform/dpconform/fv/driver"
	"github.com/dpconform/dpconform/fv/harness"
	"github.com/dpconform/dpconform/fv/matchers"
	"github.com/dpconform/dpconform/fv/monotime"
	"github.com/dpconform/dpconform/fv/timeline"
	"github.com/dpconform/dpconform/topologies"
)

// Budgets are the limits a conformant implementation is held to, in one place (the
// Gateway API TimeoutConfig model). The report prints each measured figure next to its
// budget.
type Budgets struct {
	// Lead is how long before the first transition event a window starts.
	Lead time.Duration
	// Settle is how long after ready a window ends.
	Settle time.Duration
	// ConnectInterval is the period of new connections.
	ConnectInterval time.Duration
	// AttemptTimeout is how long an attempt may take before it is a failure.
	AttemptTimeout time.Duration
	// StreamInterval is the period of messages on a stream.
	StreamInterval time.Duration
	// StreamMaxGap is the longest a stream may go without an echo.
	StreamMaxGap time.Duration
	// SteadyState is how long traffic runs before a transition, to prove the
	// preconditions.
	SteadyState time.Duration
	// EndWithin is how soon a stream to a removed backend must end.
	EndWithin time.Duration
	// Ready bounds the wait for an agent to report ready.
	Ready time.Duration
	// Programmed bounds the wait for a new Service to carry traffic once its
	// EndpointSlices list its backends (implementations program asynchronously).
	Programmed time.Duration
}

// DefaultBudgets are the budgets of SPECS.md.
var DefaultBudgets = Budgets{
	Lead:            time.Second,
	Settle:          3 * time.Second,
	ConnectInterval: 2 * time.Millisecond,
	AttemptTimeout:  time.Second,
	StreamInterval:  5 * time.Millisecond,
	StreamMaxGap:    200 * time.Millisecond,
	SteadyState:     time.Second,
	EndWithin:       2 * time.Second,
	Ready:           60 * time.Second,
	Programmed:      10 * time.Second,
}

// Env is what a spec's body works with: the world, the budgets, and the record of
// its checks.
type Env struct {
	World   *harness.World
	Topo    topologies.Topology
	Info    driver.Info
	Budgets Budgets
	Logf    func(format string, args ...any)

	checks []CheckResult
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
}

// errEnvironment marks an error of the environment (a control probe failed, an
// instrument was blind): the implementation is not charged.
var errEnvironment = errors.New("environment error")

// errPrecondition marks a failed precondition: the implementation did not carry the
// traffic the spec needs before its transition.
var errPrecondition = errors.New("precondition failed")

// Check evaluates m on win and records the result under name. It returns whether the
// check passed. A blind instrument is an environment error, returned as such.
func (e *Env) Check(name string, win timeline.Window, m matchers.Matcher) (bool, error) {
	return e.check(name, win, m, false)
}

// Precondition is Check for what must hold in steady state, before the transition; if
// it does not, the spec fails with "precondition: ..." and goes no further.
func (e *Env) Precondition(name string, win timeline.Window, m matchers.Matcher) error {
	ok, err := e.check(name, win, m, true)
	if err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("%w: %s", errPrecondition, name)
	}
	return nil
}

func (e *Env) check(name string, win timeline.Window, m matchers.Matcher, pre bool) (bool, error) {
	ok, err := m.Match(win)
	res := m.Result()
	cr := CheckResult{Name: name, Passed: ok && err == nil, Verdict: res.Verdict, Figures: res.Figures, Window: win.String(), Pre: pre}
	if err != nil {
		cr.Message = err.Error()
		e.checks = append(e.checks, cr)
		if errors.Is(err, matchers.ErrInstrument) {
			return false, fmt.Errorf("%w: check %s: %w", errEnvironment, name, err)
		}
		return false, fmt.Errorf("check %s: %w", name, err)
	}
	if !ok {
		cr.Message = m.FailureMessage(win)
		cr.Kind = classify(res)
		if pre {
			cr.Kind = KindPrecondition
		}
	}
	e.checks = append(e.checks, cr)
	return cr.Passed, nil
}

// Checks returns the checks recorded so far.
func (e *Env) Checks() []CheckResult { return e.checks }

// classify derives a failure kind from what a matcher measured.
func classify(r matchers.Result) FailureKind {
	val := map[string]float64{}
	for _, f := range r.Figures {
		val[f.Name] = f.Value
	}
	switch {
	case r.Verdict == matchers.Precondition:
		return KindPrecondition
	case val["reset_or_refused"] > 0 || val["resets"] > 0:
		return KindReset
	case val["timeouts"] > 0:
		return KindTimeout
	case val["failed_attempts"] > 0:
		return KindWrongBackend
	case val["gaps_over_budget"] > 0 || val["max_gap"] > 0 && hasOverBudget(r, "max_gap"):
		return KindGap
	case val["dead_streams"] > 0:
		return KindNotAlive
	case val["hung_streams"] > 0 || hasOverBudget(r, "latest_end"):
		return KindHang
	case val["delivered"] > 0 || val["lost_after_control"] > 0:
		return KindDelivered
	}
	return KindOther
}

func hasOverBudget(r matchers.Result, name string) bool {
	for _, f := range r.Figures {
		if f.Name == name && !f.Within() {
			return true
		}
	}
	return false
}

// Transition runs fn (the transition: a restart, a crash, a service change) and
// returns the window of the spec: from Lead before the first transition event to
// Settle after the last, once the probes have been stopped and have flushed.
func (e *Env) Transition(ctx context.Context, fn func(ctx context.Context) error) (timeline.Window, error) {
	if err := fn(ctx); err != nil {
		return timeline.Window{}, err
	}
	select {
	case <-time.After(e.Budgets.Settle):
	case <-ctx.Done():
		return timeline.Window{}, ctx.Err()
	}
	if err := e.World.StopProbes(ctx); err != nil {
		return timeline.Window{}, fmt.Errorf("%w: %w", errEnvironment, err)
	}
	return e.World.Timeline.SpanWindow(e.Budgets.Lead, e.Budgets.Settle)
}

// SteadyState lets traffic run for the SteadyState budget and returns the window since
// the probes started, for preconditions.
func (e *Env) SteadyState(ctx context.Context) (timeline.Window, error) {
	start := monotime.Now()
	select {
	case <-time.After(e.Budgets.SteadyState):
	case <-ctx.Done():
		return timeline.Window{}, ctx.Err()
	}
	// Attempts are reported when they end: leave them time to.
	end := monotime.Now()
	select {
	case <-time.After(e.Budgets.AttemptTimeout + 100*time.Millisecond):
	case <-ctx.Done():
		return timeline.Window{}, ctx.Err()
	}
	return e.World.Timeline.Window(start, end), nil
}

func firstLine(s string) string {
	s, _, _ = strings.Cut(strings.TrimSpace(s), "\n")
	return s
}

// PreconditionFailf fails the spec for a precondition the implementation did not meet.
func PreconditionFailf(format string, args ...any) error {
	return fmt.Errorf("%w: %s", errPrecondition, fmt.Sprintf(format, args...))
}
