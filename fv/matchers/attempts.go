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

// HaveNoFailedAttempts succeeds when no connect attempt that started inside the
// window failed: refused, reset, timed out, unreachable, got no or a wrong reply, was
// answered by a backend outside Backends, or was skipped by an overloaded probe.
// Options: Probes, Backends, Allow, MaxBlind, Context.
//
// Each connect probe must have reported past the window end and must not have gone
// longer than MaxBlind without starting an attempt, counting from the window start
// and up to its end; otherwise the matcher returns an ErrInstrument error.
func HaveNoFailedAttempts(opts ...Option) Matcher {
	return newMatcher("no failed connection attempt", KindReset, opts, evalAttempts)
}

func wrongBackend(e probe.Event, o options) bool {
	return e.Outcome == probe.OK && len(o.backends) > 0 && !slices.Contains(o.backends, e.Backend)
}

// AttemptKind is the kind of a failed connect attempt: one per outcome the probe can
// record, and wrong-backend only for a reply from a backend outside allowed (any
// backend is allowed when allowed is empty). It is empty for a successful attempt.
func AttemptKind(e probe.Event, allowed []string) Kind {
	switch e.Outcome {
	case probe.OK, probe.Stopped, "":
		if len(allowed) > 0 && !slices.Contains(allowed, e.Backend) {
			return KindWrongBackend
		}
		return ""
	case probe.Refused, probe.Reset:
		return KindReset
	case probe.Timeout:
		return KindTimeout
	case probe.Unreachable:
		return KindUnreachable
	case probe.NoReply:
		return KindNoReply
	case probe.WrongReply:
		return KindWrongReply
	case probe.Skipped:
		return KindSkipped
	case probe.LocalError:
		return KindLocalError
	}
	// Outcomes of streams or processes (closed, killed, crashed) that an attempt does
	// not record today: name them as they are rather than guess.
	return Kind(e.Outcome)
}

// kindCounts renders failures by kind, in a stable order: ": 2 reset, 1 unreachable".
func kindCounts(count map[Kind]int) string {
	if len(count) == 0 {
		return ""
	}
	kinds := make([]string, 0, len(count))
	for k := range count {
		kinds = append(kinds, string(k))
	}
	slices.Sort(kinds)
	parts := make([]string, 0, len(kinds))
	for _, k := range kinds {
		parts = append(parts, fmt.Sprintf("%d %s", count[Kind(k)], k))
	}
	return ": " + strings.Join(parts, ", ")
}

func attemptFailed(e probe.Event, o options) bool { return e.Outcome.Failed() || wrongBackend(e, o) }

func describeAttempt(w timeline.Window, e probe.Event, o options) string {
	how := timeline.Describe(e)
	if wrongBackend(e, o) {
		how = fmt.Sprintf("attempt #%d to %s: WRONG BACKEND %s (expected %s)", e.Seq, e.Target, e.Backend, strings.Join(o.backends, " or "))
	}
	return fmt.Sprintf("probe %s, started %s: %s", e.Probe, w.Relative(e.Time), how)
}

func evalAttempts(w timeline.Window, o options) (outcome, error) {
	attempts, blind, err := selectedAttempts(w, o)
	if err != nil {
		return outcome{}, err
	}
	total := len(attempts)
	var failed []probe.Event
	var maxLat time.Duration
	for _, e := range attempts {
		if attemptFailed(e, o) {
			failed = append(failed, e)
		} else {
			maxLat = max(maxLat, e.Latency)
		}
	}

	count := map[Kind]int{}
	for _, e := range failed {
		count[AttemptKind(e, o.backends)]++
	}
	resets, timeouts := count[KindReset], count[KindTimeout]
	out := outcome{verdict: Pass, figures: []Figure{
		{Name: "failed_attempts", Value: float64(len(failed)), Unit: "attempts", Of: total, Budget: budget(float64(o.allow)),
			Text: fmt.Sprintf("failed %d of %d attempts (budget %d)%s", len(failed), total, o.allow, kindCounts(count))},
		{Name: "reset_or_refused", Value: float64(resets), Unit: "attempts", Of: total, Text: fmt.Sprintf("%d reset or refused (RST)", resets)},
		{Name: "timeouts", Value: float64(timeouts), Unit: "attempts", Of: total, Text: fmt.Sprintf("%d timed out", timeouts)},
		{Name: "max_latency", Value: msf(maxLat), Unit: "ms", Text: fmt.Sprintf("slowest successful attempt %s", fmtMs(maxLat))},
		{Name: "max_schedule_gap", Value: msf(blind), Unit: "ms", Budget: budget(msf(o.maxBlind)),
			Text: fmt.Sprintf("longest time without a new attempt %s (instrument limit %s)", fmtMs(blind), fmtMs(o.maxBlind))},
	}}
	if len(failed) <= o.allow {
		return out, nil
	}
	out.verdict = Violation
	first := failed[0]
	// A RST is the sharpest evidence, then a timeout; otherwise how the first failed.
	switch {
	case resets > 0:
		out.kind = KindReset
	case timeouts > 0:
		out.kind = KindTimeout
	default:
		out.kind = AttemptKind(first, o.backends)
	}
	out.first, out.at = describeAttempt(w, first, o), first.Time
	for _, e := range failed {
		out.marks = append(out.marks, markOf(e, AttemptKind(e, o.backends)))
	}
	var b strings.Builder
	b.WriteString("Timeline around it:\n")
	b.WriteString(w.Excerpt(first.Time, o.context, o.context, func(e probe.Event) bool {
		return e.Kind == probe.KindAttempt && o.selected(e.Probe) && attemptFailed(e, o)
	}))
	b.WriteString("Failed attempts:\n")
	b.WriteString(failureRuns(w, failed, o))
	out.detail = b.String()
	return out, nil
}

// selectedAttempts returns the attempts of the selected connect probes that started
// inside the window, in the order they started, and the longest any of the probes
// went without starting one. It is an error when there is no such probe, or one of
// them did not report through the window's end or went longer than MaxBlind without
// an attempt, counting from the window start and up to its end.
func selectedAttempts(w timeline.Window, o options) ([]probe.Event, time.Duration, error) {
	probes := ofRole(probesOf(w), probe.RoleConnect, o)
	if len(probes) == 0 {
		return nil, 0, fmt.Errorf("no connect probe on the timeline%s", selection(o))
	}
	starts := map[string][]monotime.Time{}
	var attempts []probe.Event
	for _, e := range w.Inside() {
		if e.Kind != probe.KindAttempt || !o.selected(e.Probe) {
			continue
		}
		starts[e.Probe] = append(starts[e.Probe], e.Time)
		attempts = append(attempts, e)
	}
	var blind time.Duration
	for _, p := range probes {
		if err := covers(w, p, false, w.End); err != nil {
			return nil, 0, err
		}
		gap, at := longestGap(w, starts[p.name])
		if gap > o.maxBlind {
			return nil, 0, fmt.Errorf("probe %s started no attempt for %s, from %s: %w (starved or stopped), %s is the limit",
				p.name, fmtMs(gap), w.Relative(at), ErrBlind, fmtMs(o.maxBlind))
		}
		blind = max(blind, gap)
	}
	return attempts, blind, nil
}

// longestGap is the longest stretch of the window without a start time.
func longestGap(w timeline.Window, ts []monotime.Time) (time.Duration, monotime.Time) {
	prev := w.Start
	var gap time.Duration
	at := w.Start
	for _, t := range append(ts, w.End) {
		if d := t.Sub(prev); d > gap {
			gap, at = d, prev
		}
		prev = t
	}
	return gap, at
}

// failureRuns lists failures grouped into runs of consecutive attempts of one probe
// that failed the same way.
func failureRuns(w timeline.Window, failed []probe.Event, o options) string {
	return attemptRuns(w, failed, func(e probe.Event) string {
		if wrongBackend(e, o) {
			return "wrong backend " + e.Backend
		}
		return strings.ToUpper(string(e.Outcome))
	})
}

// fmtMs renders a duration as the timeline does: "18.0 ms", "1.0 s".
func fmtMs(d time.Duration) string { return timeline.Duration(d) }

func selection(o options) string {
	if len(o.probes) == 0 {
		return ""
	}
	return " among " + strings.Join(o.probes, ", ")
}
