package conformance

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/dpconform/dpconform/fv/matchers"
	"github.com/dpconform/dpconform/topologies"
)

// TestJudgeUnsupportedSetUp: a set-up the topology cannot serve (topologies.
// ErrUnsupported, however wrapped) skips the spec with the topology's reason; it is
// neither a verdict on the implementation nor an error of the run.
func TestJudgeUnsupportedSetUp(t *testing.T) {
	r := &Runner{}
	unsupported := fmt.Errorf("%w: on kind the kubelet writes a pod's status", topologies.ErrUnsupported)
	for _, c := range []struct {
		name string
		err  error
		want ResultKind
	}{
		{"from a step", fmt.Errorf("step %q: %w", "add pod", unsupported), Skipped},
		{"from the set-up, as an environment error", fmt.Errorf("%w: %w", ErrEnvironment, unsupported), Skipped},
		{"an environment error", fmt.Errorf("%w: no space", ErrEnvironment), Errored},
		{"anything else", errors.New("boom"), Errored},
	} {
		var res Result
		r.judge(&res, c.err, nil)
		if res.Result != c.want {
			t.Errorf("%s: %s (%s), want %s", c.name, res.Result, res.Reason, c.want)
		}
		if c.want == Skipped && res.Reason != c.err.Error() {
			t.Errorf("%s: reason %q, want the topology's %q", c.name, res.Reason, c.err)
		}
	}
}

// A run whose only trouble was a blind probe measured nothing: it is run once more,
// and the report keeps why. A failed check is a verdict, never run again.
func TestVoidRunsRunAgain(t *testing.T) {
	blind := fmt.Errorf("%w: check streams: %w: probe st did not send for 330 ms: %w", ErrEnvironment, matchers.ErrInstrument, matchers.ErrBlind)
	r := &Runner{cfg: Config{Logf: t.Logf}}
	controlBlind := fmt.Errorf("probe control did not try for 1.2 s: %w", matchers.ErrBlind)
	for _, c := range []struct {
		name    string
		checks  []CheckResult
		err     error
		control error
		blind   bool
	}{
		{"blind, every other check passed", []CheckResult{{Passed: true}, {Verdict: matchers.Instrument}}, blind, nil, true},
		{"blind after a failed check", []CheckResult{{Passed: false, Verdict: matchers.Violation}, {Verdict: matchers.Instrument}}, blind, nil, false},
		{"another environment error", nil, fmt.Errorf("%w: no space", ErrEnvironment), nil, false},
		{"control flow blind", []CheckResult{{Passed: false, Verdict: matchers.Violation}}, nil, controlBlind, true},
		{"control flow failed", nil, nil, errors.New("3 failed attempts of probe control"), false},
	} {
		res := Result{Checks: c.checks}
		r.judge(&res, c.err, c.control)
		if res.Result != Errored || res.blind != c.blind {
			t.Errorf("%s: %s, void %v; want an error, void %v", c.name, res.Result, res.blind, c.blind)
		}
	}

	seq := func(results ...Result) (func() Result, *int) {
		n := 0
		return func() Result { n++; return results[n-1] }, &n
	}
	void := Result{Result: Errored, Reason: "blind", blind: true, Duration: 2 * time.Second,
		Phases: []PhaseTime{{PhaseTopology, time.Second}, {PhaseChecks, time.Second}}}
	for _, c := range []struct {
		name  string
		runs  []Result
		want  ResultKind
		calls int
	}{
		{"void, then passed", []Result{void, {Result: Passed}}, Passed, 2},
		{"void twice", []Result{void, void}, Errored, 2},
		{"failed", []Result{{Result: Failed}}, Failed, 1},
		{"passed", []Result{{Result: Passed}}, Passed, 1},
	} {
		once, calls := seq(c.runs...)
		got := r.unlessVoid(context.Background(), "A", once)
		if got.Result != c.want || *calls != c.calls {
			t.Errorf("%s: %s after %d runs, want %s after %d", c.name, got.Result, *calls, c.want, c.calls)
		}
		if wantVoid := c.calls - 1; len(got.Void) != wantVoid {
			t.Errorf("%s: void %q, want %d reasons", c.name, got.Void, wantVoid)
		}
	}
	// A void run's time is spent on the spec: where the time went counts it.
	once, _ := seq(void, Result{Result: Passed, Duration: 3 * time.Second,
		Phases: []PhaseTime{{PhaseTopology, time.Second}, {PhaseSettle, 2 * time.Second}}})
	got := r.unlessVoid(context.Background(), "A", once)
	if got.Duration != 5*time.Second {
		t.Errorf("duration with a void run = %s, want 5s (2s void, 3s the run again)", got.Duration)
	}
	if got, want := PhasesString(got.Phases), "topology 2s, settle 2s, checks 1s"; got != want {
		t.Errorf("phases with a void run = %q, want %q", got, want)
	}
}
