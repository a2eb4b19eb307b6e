package matchers

import (
	"fmt"
	"slices"
	"strings"

	"github.com/dpconform/dpconform/fv/monotime"
	"github.com/dpconform/dpconform/fv/probe"
	"github.com/dpconform/dpconform/fv/timeline"
)

// HaveAllHeldAlive succeeds when every connection that a connect probe with Hold
// opened inside the window, and that was answered, still answered when the probe
// stopped (those opened after the probe was told to release, Process.Release, are
// not held, and not judged): no flow opened before or during a transition was lost by it (its state,
// a conntrack entry, dropped), however long after the transition the loss shows.
// An attempt that failed is HaveNoFailedAttempts' business, not this matcher's.
// Options: Probes, Context.
//
// Held connections are checked when their probe stops: take the window once the
// probes have stopped. A selected connect probe that did not stop cleanly, or that
// did not report one of its answered connections as held (it was not started with
// Hold), makes the matcher return an ErrInstrument error.
func HaveAllHeldAlive(opts ...Option) Matcher {
	return newMatcher("every held connection alive at the end", KindNotAlive, opts, evalHeld)
}

func evalHeld(w timeline.Window, o options) (outcome, error) {
	probes := ofRole(probesOf(w), probe.RoleConnect, o)
	if len(probes) == 0 {
		return outcome{}, fmt.Errorf("no connect probe on the timeline%s", selection(o))
	}
	type id struct {
		probe string
		seq   uint64
	}
	held := map[id]probe.Event{}
	done := map[string]bool{}
	released := map[string]monotime.Time{}
	for _, e := range w.Events {
		switch {
		case !o.selected(e.Probe):
		case e.Kind == probe.KindHeld:
			held[id{e.Probe, e.Seq}] = e
		case e.Kind == probe.KindDone:
			done[e.Probe] = true
		case e.Kind == probe.KindReleased:
			released[e.Probe] = e.Time
		}
	}
	for _, p := range probes {
		if !done[p.name] {
			return outcome{}, fmt.Errorf("probe %s did not stop cleanly, so it did not check its held connections: stop it before judging them", p.name)
		}
	}
	var answered int
	var lost []probe.Event
	count := map[Kind]int{}
	for _, e := range w.Inside() {
		if e.Kind != probe.KindAttempt || !o.selected(e.Probe) || e.Outcome != probe.OK {
			continue
		}
		h, ok := held[id{e.Probe, e.Seq}]
		if rt, r := released[e.Probe]; !ok && r && e.Time >= rt {
			continue // opened once the probe held no more
		}
		if !ok {
			return outcome{}, fmt.Errorf("probe %s reported no held connection for its answered attempt #%d: start it with Hold", e.Probe, e.Seq)
		}
		answered++
		if h.Outcome.Failed() {
			lost = append(lost, h)
			count[AttemptKind(h, nil)]++
		}
	}
	resets, timeouts := count[KindReset], count[KindTimeout]
	out := outcome{verdict: Pass, figures: []Figure{
		{Name: "held_lost", Value: float64(len(lost)), Unit: "connections", Of: answered, Budget: budget(0),
			Text: fmt.Sprintf("lost %d of %d connections held from their opening to the end%s", len(lost), answered, kindCounts(count))},
		{Name: "held_reset", Value: float64(resets), Unit: "connections", Of: answered, Text: fmt.Sprintf("%d reset when checked", resets)},
		{Name: "held_timeouts", Value: float64(timeouts), Unit: "connections", Of: answered, Text: fmt.Sprintf("%d unanswered when checked", timeouts)},
	}}
	if len(lost) == 0 {
		if answered == 0 {
			out.verdict, out.kind = Precondition, KindPrecondition
			out.first = "no connection was answered inside the window, so none was held"
		}
		return out, nil
	}
	out.verdict = Violation
	switch {
	case resets > 0:
		out.kind = KindReset
	case timeouts > 0:
		out.kind = KindTimeout
	default:
		out.kind = AttemptKind(lost[0], nil)
	}
	// By when the flows were opened: that is what places them against the
	// transition (they are all checked at the end).
	slices.SortFunc(lost, func(a, b probe.Event) int { return int(a.Time - b.Time) })
	first := lost[0]
	out.first = fmt.Sprintf("probe %s, opened %s: %s", first.Probe, w.Relative(first.Time), timeline.Describe(first))
	var b strings.Builder
	fmt.Fprintf(&b, "The lost connections were opened from %s to %s.\n", w.Relative(first.Time), w.Relative(lost[len(lost)-1].Time))
	b.WriteString("Timeline around the opening of the first:\n")
	b.WriteString(w.Excerpt(first.Time, o.context, o.context, func(e probe.Event) bool {
		return e.Kind == probe.KindHeld && o.selected(e.Probe) && e.Outcome.Failed()
	}))
	b.WriteString("Lost connections, by when they were opened:\n")
	b.WriteString(attemptRuns(w, lost, func(e probe.Event) string { return strings.ToUpper(string(e.Outcome)) + " when checked" }))
	out.detail = b.String()
	return out, nil
}
