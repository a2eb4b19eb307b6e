package fuzz

import (
	"fmt"
	"time"

	"github.com/dpconform/dpconform/fv/matchers"
	"github.com/dpconform/dpconform/fv/monotime"
	"github.com/dpconform/dpconform/fv/timeline"
)

// endedOnVanish is the check that the streams a spare held when it vanished end
// within limit of its vanishing (matchers.HaveStreamsEndedWithin, SVC-ENDPOINT-
// VANISH's rule): nothing of the spare's closes them, so only the datapath can, and
// the agent of node, whose datapath holds the client's flows, must be up to tell
// it. Where that agent was down in the time limit gave it, the streams have limit
// from its ready (RESTART-RECONCILE's rule: it has caught up then). The streams land
// where the datapath sends them; in a round where none had reached the spare there
// is nothing to end, which passes with a figure that says so, where the matcher
// alone would call it a failed precondition.
type endedOnVanish struct {
	spare, node string
	limit       time.Duration
	streams     []string
	defaults    []matchers.Option

	inner matchers.Matcher
	res   matchers.Result
}

func newEndedOnVanish(spare, node string, limit time.Duration, streams []string) *endedOnVanish {
	return &endedOnVanish{spare: spare, node: node, limit: limit, streams: streams}
}

// budget is the time from the spare's vanishing, at, that its streams have to end:
// limit, or limit past the ready of node's agent where it was down in that time.
func (m *endedOnVanish) budget(trs []timeline.Transition, at monotime.Time) time.Duration {
	limit := m.limit
	for _, d := range downs(trs, m.node) {
		if d.to != 0 && d.to >= at && d.from <= at.Add(limit) {
			limit = max(limit, d.to.Sub(at)+m.limit)
		}
	}
	return limit
}

func (m *endedOnVanish) Match(actual any) (bool, error) {
	w, ok := actual.(timeline.Window)
	if !ok {
		return false, fmt.Errorf("fuzz: expected a timeline.Window, got %T", actual)
	}
	limit := m.limit
	for _, tr := range w.Transitions {
		if tr.Name == vanishedEvent(m.spare) {
			limit = m.budget(w.Transitions, tr.Time)
			break
		}
	}
	m.inner = matchers.HaveStreamsEndedWithin(vanishedEvent(m.spare), limit, matchers.Probes(m.streams...), matchers.OnBackends(m.spare)).WithDefaults(m.defaults...)
	ok, err := m.inner.Match(actual)
	m.res = m.inner.Result()
	if err == nil && !ok && m.res.Verdict == matchers.Precondition {
		m.res = matchers.Result{Verdict: matchers.Pass, Window: m.res.Window, Figures: []matchers.Figure{{Name: "hung_streams", Unit: "streams",
			Text: fmt.Sprintf("no stream had reached %s before it vanished: none to end", m.spare)}}}
		return true, nil
	}
	return ok, err
}

func (m *endedOnVanish) Result() matchers.Result { return m.res }

func (m *endedOnVanish) FailureMessage(actual any) string { return m.inner.FailureMessage(actual) }

func (m *endedOnVanish) NegatedFailureMessage(actual any) string {
	return m.inner.NegatedFailureMessage(actual)
}

// WithDefaults keeps the suite's defaults (the clocks' uncertainty) for the matcher
// each Match makes.
func (m *endedOnVanish) WithDefaults(opts ...matchers.Option) matchers.Matcher {
	c := *m
	c.defaults = append(c.defaults, opts...)
	return &c
}
