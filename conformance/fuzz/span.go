package fuzz

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/dpconform/dpconform/conformance"
	"github.com/dpconform/dpconform/fv/matchers"
	"github.com/dpconform/dpconform/fv/monotime"
	"github.com/dpconform/dpconform/fv/probe"
	"github.com/dpconform/dpconform/fv/timeline"
	"github.com/dpconform/dpconform/fv/workloads"
	"github.com/dpconform/dpconform/topologies"
)

// spanEvents are the names of the two events that bound the span of a step's
// connect probes (a churn's, a burst's): their detail is the step's number.
type spanEvents struct{ start, end string }

// placed is a probe and the host it runs on.
type placed struct {
	on  topologies.Host
	cfg probe.Config
}

// connects are connect probes on flows, one a flow, named as names says, each
// starting a connection every interval.
func connects(e *conformance.Env, flows []workloads.Flow, names []string, interval time.Duration) []placed {
	out := make([]placed, len(flows))
	for i, fl := range flows {
		c := e.Connect(names[i], fl.Target)
		c.Interval = interval
		out[i] = placed{fl.From, c}
	}
	return out
}

// hold runs probes for a span (probes that run until stopped) of step's, or of
// what step numbers (a policy write's set): they start, all at once; the start is
// recorded, with step as its detail, once they are all ready; then during
// runs (nil: nothing), and the end is recorded d after it returns, before the
// probes are stopped (a probe stops once its attempts in flight have ended), so
// that between the two each probes throughout. When ctx ends, the probes stop,
// with no error; during's error ends the span at once.
func hold(ctx context.Context, e *conformance.Env, ev spanEvents, step int, probes []placed, d time.Duration, during func() error) error {
	ps := make([]*probe.Process, len(probes))
	stop := func() error {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		var errs []error
		for _, p := range ps {
			if p != nil {
				errs = append(errs, p.Stop(sctx))
			}
		}
		return errors.Join(errs...)
	}
	record := func(name string) { e.Record(name, fmt.Sprint(step)) }
	var g errgroup.Group
	for i, p := range probes {
		g.Go(func() (err error) {
			if ps[i], err = e.World.StartProbe(ctx, p.on, p.cfg); err != nil {
				return fmt.Errorf("probe %s: %w", p.cfg.ProbeName(), err)
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		if ctx.Err() != nil {
			return stop()
		}
		return errors.Join(err, stop())
	}
	record(ev.start)
	if during != nil {
		if err := during(); err != nil {
			return errors.Join(err, stop())
		}
	}
	if conformance.Hold(ctx, d) == nil {
		record(ev.end)
	}
	return stop()
}

// spanned is the check of the connect probes a step held (hold) over their span,
// from its start event to its end: the suite's HaveNoResets and HaveNoFailedAttempts
// on them over that span, the latter allowing perMille of the connections judged,
// rounded up (churnAllowance; the resets and refusals failed the first). Their
// instrument rules hold as in a spec: a probe that starts nothing for MaxBlind voids
// the round. Which backend answers is the model of the Services' to judge
// (answersAsModelled).
type spanned struct {
	ev       spanEvents
	step     int
	probes   []string
	perMille int
	defaults []matchers.Option

	decided matchers.Matcher // the check that gave the last Match its result
	res     matchers.Result  // the result when the span did not run to its end
}

func newSpanned(ev spanEvents, step int, probes []string, perMille int) *spanned {
	return &spanned{ev: ev, step: step, probes: probes, perMille: perMille}
}

// WithDefaults hands the suite's defaults (MaxBlind, Context) on to the checks.
func (m *spanned) WithDefaults(opts ...matchers.Option) matchers.Matcher {
	c := *m
	c.defaults = opts
	return &c
}

func (m *spanned) Match(actual any) (bool, error) {
	w, ok := actual.(timeline.Window)
	if !ok {
		return false, fmt.Errorf("fuzz: expected a timeline.Window, got %T", actual)
	}
	m.decided = nil
	var from, to monotime.Time
	for _, tr := range w.Transitions {
		switch {
		case tr.Detail != fmt.Sprint(m.step):
		case tr.Name == m.ev.start:
			from = tr.Time
		case tr.Name == m.ev.end:
			to = tr.Time
		}
	}
	if from == 0 || to == 0 {
		m.res = matchers.Result{Verdict: matchers.Instrument,
			First: fmt.Sprintf("step %d has no %s and %s on the timeline: its span did not run to its end", m.step, m.ev.start, m.ev.end)}
		return false, fmt.Errorf("%w: %s", matchers.ErrInstrument, m.res.First)
	}
	span := w
	span.Start, span.End = from, to
	judged := 0
	for _, e := range span.Inside() {
		if e.Kind == probe.KindAttempt && slices.Contains(m.probes, e.Probe) {
			judged++
		}
	}
	only := matchers.Probes(m.probes...)
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

func (m *spanned) Result() matchers.Result {
	if m.decided == nil {
		return m.res
	}
	return m.decided.Result()
}

func (m *spanned) FailureMessage(actual any) string {
	if m.decided == nil {
		return fmt.Sprintf("Expected step %d's span on the timeline, but: %s", m.step, m.res.First)
	}
	return m.decided.FailureMessage(actual)
}

func (m *spanned) NegatedFailureMessage(actual any) string {
	if m.decided == nil {
		return m.FailureMessage(actual)
	}
	return m.decided.NegatedFailureMessage(actual)
}
