package matchers

import (
	"cmp"
	"fmt"
	"strings"
	"time"

	"github.com/dpconform/dpconform/fv/monotime"
	"github.com/dpconform/dpconform/fv/probe"
	"github.com/dpconform/dpconform/fv/timeline"
)

// HaveNoServedAttempts succeeds when no connect attempt that started inside the
// window was answered, by any server: an address nothing may serve (one that no
// host holds, or one a node gave up) must not take connections. Attempts that were
// refused, timed out or were unreachable are what it expects. A served attempt is a
// violation of kind delivered. Options: Probes, From, MaxBlind, Context.
//
// Its probes must cover the window as for HaveNoFailedAttempts (ErrInstrument
// otherwise): an attempt never made was not refused either.
func HaveNoServedAttempts(opts ...Option) Matcher {
	return newMatcher("no connection attempt answered", KindDelivered, opts, func(w timeline.Window, o options) (outcome, error) {
		attempts, blind, err := selectedAttempts(w, o)
		if err != nil {
			return outcome{}, err
		}
		var served []probe.Event
		count := map[Kind]int{}
		for _, e := range attempts {
			if e.Outcome == probe.OK {
				served = append(served, e)
			} else if k := AttemptKind(e, nil); k != "" {
				count[k]++
			}
		}
		out := outcome{verdict: Pass, figures: []Figure{
			{Name: "served_attempts", Value: float64(len(served)), Unit: "attempts", Of: len(attempts), Budget: budget(0),
				Text: fmt.Sprintf("%d of %d attempts answered (budget 0); the others%s", len(served), len(attempts), orNone(kindCounts(count)))},
			{Name: "max_schedule_gap", Value: msf(blind), Unit: "ms", Budget: budget(msf(o.maxBlind)),
				Text: fmt.Sprintf("longest time without a new attempt %s (instrument limit %s)", fmtMs(blind), fmtMs(o.maxBlind))},
		}}
		if len(served) == 0 {
			return out, nil
		}
		out.verdict = Violation
		first := served[0]
		out.at = first.Time
		for _, e := range served {
			out.marks = append(out.marks, markOf(e, KindDelivered))
		}
		out.first = fmt.Sprintf("probe %s, started %s: %s", first.Probe, w.Relative(first.Time), timeline.Describe(first))
		var b strings.Builder
		b.WriteString("Timeline around it:\n")
		b.WriteString(w.Excerpt(first.Time, o.context, o.context, func(e probe.Event) bool {
			return e.Kind == probe.KindAttempt && o.selected(e.Probe) && e.Outcome == probe.OK
		}))
		b.WriteString("Answered attempts:\n")
		b.WriteString(attemptRuns(w, served, func(e probe.Event) string { return "ANSWERED by " + e.Backend }))
		out.detail = b.String()
		return out, nil
	})
}

func orNone(counts string) string {
	if counts == "" {
		return ": none"
	}
	return counts
}

// HaveServedWithin succeeds when every selected connect probe, counting from the
// first transition event named after, made streak attempts in a row that reached
// Backends (any backend without it), the first of them started within limit of
// after: what the event made servable (an address added, a Service created) was
// served within its budget. Attempts that started before the event are not judged,
// and failures between the event and the streak are allowed: they are the
// implementation's programming time. A probe served late, or never, is a violation
// with the kind of the failures it met meanwhile (a RST first, then a timeout), or
// unserved if it met none. Options: Probes, Backends, MaxBlind, Context.
//
// Each probe must cover the window from after to its end (ErrInstrument otherwise),
// and the window must reach limit after the event unless every probe was served.
func HaveServedWithin(after string, limit time.Duration, streak int, opts ...Option) Matcher {
	what := fmt.Sprintf("served (%d connections in a row) within %s of %s", streak, fmtMs(limit), after)
	return newMatcher(what, KindUnserved, opts, func(w timeline.Window, o options) (outcome, error) {
		limit := limit + o.clock // ClockUncertainty
		at, ok := transition(w, after)
		if !ok {
			return outcome{}, fmt.Errorf("no %q event on the timeline", after)
		}
		if at > w.End {
			return outcome{}, fmt.Errorf("%s is after the window's end, %s", after, w.Relative(w.End))
		}
		deadline := at.Add(limit)
		from := w
		from.Start = max(w.Start, at)
		attempts, blind, err := selectedAttempts(from, o)
		if err != nil {
			return outcome{}, err
		}
		byProbe := map[string][]probe.Event{}
		var names []string
		for _, e := range attempts {
			if _, ok := byProbe[e.Probe]; !ok {
				names = append(names, e.Probe)
			}
			byProbe[e.Probe] = append(byProbe[e.Probe], e)
		}
		for _, p := range ofRole(probesOf(w), probe.RoleConnect, o) {
			if _, ok := byProbe[p.name]; !ok {
				names = append(names, p.name)
			}
		}
		var (
			latest   time.Duration
			before   int
			late     []string
			never    bool
			failures []probe.Event
			count    = map[Kind]int{}
		)
		for _, name := range names {
			servedAt, failed := firstStreak(byProbe[name], streak, o)
			before += len(failed)
			if servedAt == 0 || servedAt.Sub(at) > limit {
				if servedAt == 0 && w.End < deadline {
					return outcome{}, fmt.Errorf("probe %s was not served by the window's end, %s, before the deadline %s", name, w.Relative(w.End), w.Relative(deadline))
				}
				late = append(late, name)
				// What it met within its budget says why it was not served.
				for _, e := range failed {
					if e.Time <= deadline {
						failures = append(failures, e)
						count[AttemptKind(e, o.backends)]++
					}
				}
				if servedAt == 0 {
					never = true
					latest = max(latest, w.End.Sub(at))
					continue
				}
			}
			latest = max(latest, servedAt.Sub(at))
		}
		out := outcome{verdict: Pass, figures: []Figure{
			{Name: "time_to_serve", Value: msf(latest), Unit: "ms", Budget: budget(msf(limit)),
				Text: servedText(latest, never, after, limit)},
			{Name: "failed_before_served", Value: float64(before), Unit: "attempts",
				Text: fmt.Sprintf("%d attempts failed between %s and the first of %d in a row that succeeded", before, after, streak)},
			{Name: "max_schedule_gap", Value: msf(blind), Unit: "ms", Budget: budget(msf(o.maxBlind)),
				Text: fmt.Sprintf("longest time without a new attempt %s (instrument limit %s)", fmtMs(blind), fmtMs(o.maxBlind))},
		}}
		if len(late) == 0 {
			return out, nil
		}
		out.verdict = Violation
		switch {
		case count[KindReset] > 0:
			out.kind = KindReset
		case count[KindTimeout] > 0:
			out.kind = KindTimeout
		case len(failures) > 0:
			out.kind = AttemptKind(failures[0], o.backends)
		}
		out.first, out.at = fmt.Sprintf("%s not served within %s of %s", strings.Join(late, ", "), fmtMs(limit), after), deadline
		for _, name := range late {
			servedAt, _ := firstStreak(byProbe[name], streak, o)
			out.marks = append(out.marks, Mark{Probe: name, Time: at, End: cmp.Or(servedAt, w.End), Kind: KindUnserved})
		}
		for _, e := range failures {
			out.marks = append(out.marks, markOf(e, AttemptKind(e, o.backends)))
		}
		if len(failures) == 0 {
			out.first += ": no attempt failed in that time either"
			return out, nil
		}
		out.first += fmt.Sprintf("; %d attempts failed in that time%s", len(failures), kindCounts(count))
		first := failures[0]
		var b strings.Builder
		fmt.Fprintf(&b, "First failed attempt: probe %s, started %s: %s\n", first.Probe, w.Relative(first.Time), timeline.Describe(first))
		b.WriteString("Timeline around " + after + ":\n")
		b.WriteString(w.Excerpt(at, o.context, o.context, func(e probe.Event) bool {
			return e.Kind == probe.KindAttempt && e.Time >= at && o.selected(e.Probe) && attemptFailed(e, o)
		}))
		b.WriteString("Failed attempts:\n")
		b.WriteString(failureRuns(w, failures, o))
		out.detail = b.String()
		return out, nil
	})
}

func servedText(latest time.Duration, never bool, after string, limit time.Duration) string {
	if never {
		return fmt.Sprintf("not served in the %s after %s (budget %s)", fmtMs(latest), after, fmtMs(limit))
	}
	return fmt.Sprintf("served %s after %s (budget %s)", fmtMs(latest), after, fmtMs(limit))
}

// firstStreak finds the first run of n attempts in a row (of one probe, in the order
// they started) that succeeded, and returns when its first started (zero without
// one) and the attempts that failed before it.
func firstStreak(attempts []probe.Event, n int, o options) (monotime.Time, []probe.Event) {
	var failed []probe.Event
	run := 0
	for i, e := range attempts {
		if attemptFailed(e, o) {
			failed = append(failed, e)
			run = 0
			continue
		}
		if run++; run == n {
			return attempts[i-n+1].Time, failed
		}
	}
	return 0, failed
}

// attemptRuns lists attempts grouped into runs of consecutive attempts of one probe
// that key renders alike.
func attemptRuns(w timeline.Window, events []probe.Event, key func(probe.Event) string) string {
	const maxRuns = 12
	type run struct{ first, last probe.Event }
	var runs []run
	last := map[string]int{}
	for _, e := range events {
		if i, ok := last[e.Probe]; ok && runs[i].last.Seq+1 == e.Seq && key(runs[i].last) == key(e) {
			runs[i].last = e
			continue
		}
		runs = append(runs, run{e, e})
		last[e.Probe] = len(runs) - 1
	}
	var b strings.Builder
	for i, r := range runs {
		if i == maxRuns {
			fmt.Fprintf(&b, "  ... and %d more runs\n", len(runs)-maxRuns)
			break
		}
		if r.first.Seq == r.last.Seq {
			fmt.Fprintf(&b, "  %s #%d %s, started %s\n", r.first.Probe, r.first.Seq, key(r.first), w.Relative(r.first.Time))
			continue
		}
		fmt.Fprintf(&b, "  %s #%d..#%d %s (%d), started from %s to %s\n", r.first.Probe, r.first.Seq, r.last.Seq, key(r.first),
			r.last.Seq-r.first.Seq+1, w.Relative(r.first.Time), w.Relative(r.last.Time))
	}
	return b.String()
}
