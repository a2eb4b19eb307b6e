package fuzz

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/dpconform/dpconform/conformance"
	"github.com/dpconform/dpconform/fv/matchers"
	"github.com/dpconform/dpconform/fv/monotime"
	"github.com/dpconform/dpconform/fv/probe"
	"github.com/dpconform/dpconform/fv/timeline"
	"github.com/dpconform/dpconform/fv/workloads"
)

// churnProbes is how many connect probes a churn runs, each at the catalogue's
// connect-interval: two fill the reference's SNAT ports within some 5 s, as in
// SVC-SNAT-PRESSURE (one would take some 17 s: the client reuses its own source
// ports, and a flow on a tuple whose SNAT port is still its own gets it back).
const churnProbes = 2

// churnStreams is how many long-lived streams a round with a churn holds on the
// path it churns (SVC-SNAT-PRESSURE's 8, not the other paths' streamsPerFlow):
// each is a live flow whose SNAT port a defective allocator may take once the
// range is full, and more of them make a theft within a churn more likely.
const churnStreams = 8

// Names of the events a churn records: its detail is the step's number.
const (
	EventChurnStart = "snat-churn-start"
	EventChurnEnd   = "snat-churn-end"
)

// churnProbe is the name of the k-th (from 1) connect probe of step's churn.
func churnProbe(step, k int) string { return fmt.Sprintf("churn-%d-%d", step, k) }

// churnNames are the names of the connect probes of step's churn.
func churnNames(step int) []string {
	names := make([]string, churnProbes)
	for k := range names {
		names[k] = churnProbe(step, k+1)
	}
	return names
}

// churnPath is the path a churn takes: node 1's NodePort to the Service whose own
// backend is on node 2, from the external client.
func (w *world) churnPath(e *conformance.Env) workloads.Flow {
	return w.core.Flows(e.Topo, workloads.FlowNodePortRemote)[0]
}

// churn runs step's churn for d: its probes start, the start is recorded once they
// are ready, and the end d later, before they are stopped (a probe stops once its
// attempts in flight have ended), so that between the two each starts attempts
// throughout. When ctx ends, the probes stop, with no error.
func (w *world) churn(ctx context.Context, e *conformance.Env, step int, d time.Duration) error {
	fl := w.churnPath(e)
	var ps []*probe.Process
	stop := func() error {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		var errs []error
		for _, p := range ps {
			errs = append(errs, p.Stop(sctx))
		}
		return errors.Join(errs...)
	}
	for _, name := range churnNames(step) {
		p, err := e.World.StartProbe(ctx, fl.From, e.Connect(name, fl.Target))
		if err != nil {
			if ctx.Err() != nil {
				return stop()
			}
			return errors.Join(fmt.Errorf("probe %s: %w", name, err), stop())
		}
		ps = append(ps, p)
	}
	e.Record(EventChurnStart, fmt.Sprint(step))
	if conformance.Hold(ctx, d) == nil {
		e.Record(EventChurnEnd, fmt.Sprint(step))
	}
	return stop()
}

// churnAllowance is how many of n new connections made under a churn may time out:
// snat-retry-per-mille of them, rounded up. At 1,000 new flows a second every SNAT
// port comes round within the backend's TIME_WAIT of its last connection, and now
// and then a SYN gets through only on its retry (budgets.go, SNATRetryPerMille):
// the churn's own connections, and those of the round's probe on the path.
func churnAllowance(n int, perMille int) int { return (n*perMille + 999) / 1000 }

// churned is the check of a churn's connections (SVC-SNAT-PRESSURE's): from its
// start to its end, each of its probes starts an attempt at least every MaxBlind (a
// starved probe is the instrument's failure, never a verdict); none is reset,
// refused or fails otherwise, and at most churnAllowance of them time out. Which
// backend answers is the model of the Services' to judge (answersAsModelled).
type churned struct {
	step    int
	probes  []string
	perMill int
	modelReport
}

func newChurned(step, perMille int) *churned {
	return &churned{step: step, probes: churnNames(step), perMill: perMille, modelReport: modelReport{
		expected: fmt.Sprintf("no failed connection of step %d's churn, but timeouts within snat-retry-per-mille", step),
		negated:  fmt.Sprintf("a failed connection of step %d's churn", step)}}
}

// WithDefaults keeps the matcher as it is: a round's hosts share the suite's clock.
func (m *churned) WithDefaults(...matchers.Option) matchers.Matcher { return m }

func (m *churned) Match(actual any) (bool, error) {
	w, err := m.window(actual)
	if err != nil {
		return false, err
	}
	var from, to monotime.Time
	for _, tr := range w.Transitions {
		switch {
		case tr.Detail != fmt.Sprint(m.step):
		case tr.Name == EventChurnStart:
			from = tr.Time
		case tr.Name == EventChurnEnd:
			to = tr.Time
		}
	}
	if from == 0 || to == 0 {
		m.judge(w, "churn_failed", "connections of the churn that failed", 0, nil)
		m.blind(fmt.Sprintf("step %d's churn has no %s and %s on the timeline: it did not run to its end", m.step, EventChurnStart, EventChurnEnd))
		return false, fmt.Errorf("%w: %s", matchers.ErrInstrument, m.res.First)
	}
	starts := map[string][]monotime.Time{}
	var judged int
	var timeouts, wrong []wrongAttempt
	for _, e := range w.Inside() {
		if e.Kind != probe.KindAttempt || !slices.Contains(m.probes, e.Probe) {
			continue
		}
		starts[e.Probe] = append(starts[e.Probe], e.Time)
		if e.Time < from || e.Time > to {
			continue
		}
		judged++
		switch kind := matchers.AttemptKind(e, nil); {
		case kind == matchers.KindTimeout:
			timeouts = append(timeouts, wrongAttempt{e, kind, "timed out"})
		case e.Outcome.Failed():
			wrong = append(wrong, wrongAttempt{e, kind, "failed: " + timeline.Describe(e)})
		}
	}
	allow := churnAllowance(judged, m.perMill)
	if len(timeouts) > allow {
		wrong = append(wrong, timeouts...)
		slices.SortFunc(wrong, func(a, b wrongAttempt) int { return cmp.Compare(a.e.Time, b.e.Time) })
	}
	passed := m.judge(w, "churn_failed", "connections of the churn that failed, but timeouts within snat-retry-per-mille", judged, wrong)
	budget := float64(allow)
	m.res.Figures = append(m.res.Figures, matchers.Figure{Name: "churn_timeouts", Value: float64(len(timeouts)), Unit: "attempts", Of: judged, Budget: &budget,
		Text: fmt.Sprintf("%d of %d connections of the churn timed out (budget %d: %d per 1,000, rounded up)", len(timeouts), judged, allow, m.perMill)})
	for _, name := range m.probes {
		if gap, at := longestGap(starts[name], from, to); gap > matchers.DefaultMaxBlind {
			m.blind(fmt.Sprintf("probe %s started no attempt for %s, from %s (starved or stopped), %s is the limit",
				name, gap.Round(time.Millisecond), w.Relative(at), matchers.DefaultMaxBlind))
			return false, fmt.Errorf("%w: %w: %s: the round cannot judge its churn", matchers.ErrInstrument, matchers.ErrBlind, m.res.First)
		}
	}
	return passed, nil
}

// longestGap is the longest stretch of [from, to] without one of starts (in time
// order), and where it begins.
func longestGap(starts []monotime.Time, from, to monotime.Time) (time.Duration, monotime.Time) {
	var gap time.Duration
	at, last := from, from
	step := func(t monotime.Time) {
		if d := t.Sub(last); d > gap {
			gap, at = d, last
		}
		last = max(last, t)
	}
	for _, t := range starts {
		if t >= from && t <= to {
			step(t)
		}
	}
	step(to)
	return gap, at
}
