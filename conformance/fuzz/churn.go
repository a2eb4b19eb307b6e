package fuzz

import (
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

// churned is the check of a churn's connections (SVC-SNAT-PRESSURE's), from its
// start to its end: the suite's HaveNoResets and HaveNoFailedAttempts on its probes
// over that span, the latter allowing churnAllowance of the connections judged (the
// resets and refusals failed the first). Their instrument rules hold as in a spec: a
// probe that starts nothing for MaxBlind voids the round. Which backend answers is
// the model of the Services' to judge (answersAsModelled).
type churned struct {
	step     int
	perMille int
	defaults []matchers.Option

	decided matchers.Matcher // the check that gave the last Match its result
	res     matchers.Result  // the result when the churn did not run to its end
}

func newChurned(step, perMille int) *churned {
	return &churned{step: step, perMille: perMille}
}

// WithDefaults hands the suite's defaults (MaxBlind, Context) on to the checks.
func (m *churned) WithDefaults(opts ...matchers.Option) matchers.Matcher {
	c := *m
	c.defaults = opts
	return &c
}

func (m *churned) Match(actual any) (bool, error) {
	w, ok := actual.(timeline.Window)
	if !ok {
		return false, fmt.Errorf("fuzz: expected a timeline.Window, got %T", actual)
	}
	m.decided = nil
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
		m.res = matchers.Result{Verdict: matchers.Instrument,
			First: fmt.Sprintf("step %d's churn has no %s and %s on the timeline: it did not run to its end", m.step, EventChurnStart, EventChurnEnd)}
		return false, fmt.Errorf("%w: %s", matchers.ErrInstrument, m.res.First)
	}
	span := w
	span.Start, span.End = from, to
	names := churnNames(m.step)
	judged := 0
	for _, e := range span.Inside() {
		if e.Kind == probe.KindAttempt && slices.Contains(names, e.Probe) {
			judged++
		}
	}
	only := matchers.Probes(names...)
	for _, c := range []matchers.Matcher{
		matchers.HaveNoResets(only),
		matchers.HaveNoFailedAttempts(only, matchers.Allow(churnAllowance(judged, m.perMille))),
	} {
		m.decided = c.WithDefaults(m.defaults...)
		if ok, err := m.decided.Match(span); !ok || err != nil {
			return ok, err
		}
	}
	return true, nil
}

func (m *churned) Result() matchers.Result {
	if m.decided == nil {
		return m.res
	}
	return m.decided.Result()
}

func (m *churned) FailureMessage(actual any) string {
	if m.decided == nil {
		return fmt.Sprintf("Expected step %d's churn on the timeline, but: %s", m.step, m.res.First)
	}
	return m.decided.FailureMessage(actual)
}

func (m *churned) NegatedFailureMessage(actual any) string {
	if m.decided == nil {
		return m.FailureMessage(actual)
	}
	return m.decided.NegatedFailureMessage(actual)
}
