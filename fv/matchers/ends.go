package matchers

import (
	"fmt"
	"strings"
	"time"

	"github.com/dpconform/dpconform/fv/monotime"
	"github.com/dpconform/dpconform/fv/probe"
	"github.com/dpconform/dpconform/fv/timeline"
)

// HaveStreamsEndedWithin succeeds when every selected stream ended (its peer reset or
// closed it) within limit of the first transition event named after: a flow whose
// backend went away must end, not hang silently until a client timeout. A stream
// still silent at that deadline is a violation, whether it ends later in the window
// (the report says when, and how) or not at all. Options: Probes, OnBackends, Context.
func HaveStreamsEndedWithin(after string, limit time.Duration, opts ...Option) Matcher {
	return newMatcher(fmt.Sprintf("every stream ended within %s of %s", fmtMs(limit), after), KindHang, opts, func(w timeline.Window, o options) (outcome, error) {
		limit := limit + o.clock // ClockUncertainty
		var at monotime.Time
		for _, t := range w.Transitions {
			if t.Name == after {
				at = t.Time
				break
			}
		}
		if at == 0 {
			return outcome{}, fmt.Errorf("%w: no %q event on the timeline", ErrInstrument, after)
		}
		deadline := at.Add(limit)
		if deadline > w.End {
			return outcome{}, fmt.Errorf("%w: the window ends %s, before the deadline %s", ErrInstrument, w.Relative(w.End), w.Relative(deadline))
		}
		var streams []*streamState
		for _, s := range streamsOf(w, o) {
			if s.open.Outcome == probe.OK && s.open.Time < at {
				streams = append(streams, s)
			}
		}
		// A stream that ended after the deadline still fails, but the report says
		// when it ended: a dataplane that resets such flows late (on a periodic
		// sweep, say) is not one that leaves them hanging.
		ended := func(s *streamState) bool { return s.end != nil && s.end.Outcome != probe.Stopped }
		var hung []*streamState
		var latest time.Duration
		late := 0
		for _, s := range streams {
			if !ended(s) {
				hung = append(hung, s)
				continue
			}
			latest = max(latest, s.end.Time.Sub(at))
			if s.end.Time > deadline {
				hung = append(hung, s)
				late++
			}
		}
		out := outcome{verdict: Pass, figures: []Figure{
			{Name: "hung_streams", Value: float64(len(hung)), Unit: "streams", Of: len(streams), Budget: budget(0),
				Text: fmt.Sprintf("%d of %d streams still silent %s after %s", len(hung), len(streams), fmtMs(limit), after)},
			{Name: "ended_late", Value: float64(late), Unit: "streams", Of: len(hung),
				Text: fmt.Sprintf("%d of them ended later in the window", late)},
			{Name: "latest_end", Value: msf(latest), Unit: "ms", Budget: budget(msf(limit)),
				Text: fmt.Sprintf("the last stream ended %s after %s (budget %s)", fmtMs(latest), after, fmtMs(limit))},
		}}
		if len(streams) == 0 {
			out.verdict, out.first = Precondition, "no selected stream was open before "+after
			return out, nil
		}
		if len(hung) == 0 {
			return out, nil
		}
		out.verdict, out.at = Violation, deadline
		fate := func(s *streamState) string {
			if ended(s) {
				return fmt.Sprintf("%s %s after %s, over budget", s.end.Outcome, fmtMs(s.end.Time.Sub(at)), after)
			}
			return fmt.Sprintf("nothing since, to the window's end %s after %s", fmtMs(w.End.Sub(at)), after)
		}
		for _, s := range hung {
			end := w.End
			if ended(s) {
				end = s.end.Time
			}
			out.marks = append(out.marks, Mark{Probe: s.probe, Stream: s.id, Time: s.lastEcho(), End: end, Kind: KindHang})
		}
		first := hung[0]
		out.first = fmt.Sprintf("%s did not end within %s: last echo %s, then %s", first, fmtMs(limit), w.Relative(first.lastEcho()), fate(first))
		var b strings.Builder
		b.WriteString("Streams still silent at the deadline:\n")
		for _, s := range hung {
			fmt.Fprintf(&b, "    %s: last echo %s, then %s\n", s, w.Relative(s.lastEcho()), fate(s))
		}
		b.WriteString("Timeline around " + after + ":\n")
		b.WriteString(w.Excerpt(at, o.context, limit, func(e probe.Event) bool { return e.Kind == probe.KindEnd }))
		out.detail = b.String()
		return out, nil
	})
}
