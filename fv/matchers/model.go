package matchers

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/dpconform/dpconform/fv/monotime"
	"github.com/dpconform/dpconform/fv/probe"
	"github.com/dpconform/dpconform/fv/timeline"
)

// BackendModel says which backends may answer an attempt of the named probe that
// started at t: those a model of the API's state (a Service's endpoints as they
// changed) allowed at some moment from the time a change may take to be programmed
// before t up to t. slack widens that span on both sides by the clocks' uncertainty
// (ClockUncertainty). An empty answer allows any backend.
type BackendModel func(probe string, t monotime.Time, slack time.Duration) []string

// HaveAnswersAsModelled succeeds when every connect attempt that started inside the
// window and was answered was answered by a backend the model allowed then: a
// backend that left a Service gets nothing new once the change had its time to be
// programmed, and one not yet in it nothing before. Failed attempts are another
// check's (HaveNoFailedAttempts). A violation is of kind wrong-backend. Options:
// Probes, MaxBlind, Context, ClockUncertainty.
//
// Its probes must cover the window as for HaveNoFailedAttempts (ErrInstrument
// otherwise).
func HaveAnswersAsModelled(model BackendModel, opts ...Option) Matcher {
	return newMatcher("every answer from a backend the model allowed", KindWrongBackend, opts, func(w timeline.Window, o options) (outcome, error) {
		attempts, blind, err := selectedAttempts(w, o)
		if err != nil {
			return outcome{}, err
		}
		var wrong []probe.Event
		allowed := map[int]string{} // index in wrong -> what was allowed
		answered := 0
		for _, e := range attempts {
			if e.Outcome != probe.OK {
				continue
			}
			answered++
			ok := model(e.Probe, e.Time, o.clock)
			if len(ok) > 0 && !slices.Contains(ok, e.Backend) {
				allowed[len(wrong)] = strings.Join(ok, " or ")
				wrong = append(wrong, e)
			}
		}
		out := outcome{verdict: Pass, figures: []Figure{
			{Name: "unmodelled_answers", Value: float64(len(wrong)), Unit: "attempts", Of: answered, Budget: budget(0),
				Text: fmt.Sprintf("%d of %d answered attempts answered by a backend the model did not allow then (budget 0)", len(wrong), answered)},
			{Name: "max_schedule_gap", Value: msf(blind), Unit: "ms", Budget: budget(msf(o.maxBlind)),
				Text: fmt.Sprintf("longest time without a new attempt %s (instrument limit %s)", fmtMs(blind), fmtMs(o.maxBlind))},
		}}
		if len(wrong) == 0 {
			return out, nil
		}
		out.verdict = Violation
		first := wrong[0]
		out.at = first.Time
		for _, e := range wrong {
			out.marks = append(out.marks, markOf(e, KindWrongBackend))
		}
		out.first = fmt.Sprintf("probe %s, started %s: attempt #%d to %s answered by %s, which the model did not allow then (allowed: %s)",
			first.Probe, w.Relative(first.Time), first.Seq, first.Target, first.Backend, allowed[0])
		var b strings.Builder
		b.WriteString("Timeline around it:\n")
		b.WriteString(w.Excerpt(first.Time, o.context, o.context, func(e probe.Event) bool {
			return e.Kind == probe.KindAttempt && e.Probe == first.Probe && e.Backend == first.Backend
		}))
		b.WriteString("Answers the model did not allow:\n")
		b.WriteString(attemptRuns(w, wrong, func(e probe.Event) string { return "answered by " + e.Backend }))
		out.detail = b.String()
		return out, nil
	})
}
