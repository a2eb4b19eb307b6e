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
// still silent at that deadline is a violation. Options: Probes, OnBackends, Context.
func HaveStreamsEndedWithin(after string, limit time.Duration, opts ...Option) Matcher {
	return newMatcher(fmt.Sprintf("every stream ended within %s of %s", fmtMs(limit), after), KindHang, opts, func(w timeline.Window, o options) (outcome, error) {
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
		figures := func(ended int, latest time.Duration) []Figure {
			return []Figure{
				{Name: "hung_streams", Value: float64(len(streams) - ended), Unit: "streams", Of: len(streams), Budget: budget(0),
					Text: fmt.Sprintf("%d of %d streams still silent %s after %s", len(streams)-ended, len(streams), fmtMs(limit), after)},
				{Name: "latest_end", Value: msf(latest), Unit: "ms", Budget: budget(msf(limit)),
					Text: fmt.Sprintf("the last stream ended %s after %s (budget %s)", fmtMs(latest), after, fmtMs(limit))},
			}
		}
		if len(streams) == 0 {
			return outcome{verdict: Precondition, figures: figures(0, 0),
				first: "no selected stream was open before " + after}, nil
		}
		var hung []*streamState
		var latest time.Duration
		for _, s := range streams {
			if s.end != nil && s.end.Outcome != probe.Stopped && s.end.Time <= deadline {
				if d := s.end.Time.Sub(at); d > latest {
					latest = d
				}
				continue
			}
			hung = append(hung, s)
		}
		out := outcome{verdict: Pass, figures: figures(len(streams)-len(hung), latest)}
		if len(hung) == 0 {
			return out, nil
		}
		out.verdict, out.at = Violation, deadline
		for _, s := range hung {
			out.marks = append(out.marks, Mark{Probe: s.probe, Stream: s.id, Time: s.lastEcho(), End: w.End, Kind: KindHang})
		}
		first := hung[0]
		out.first = fmt.Sprintf("%s did not end: last echo %s, and nothing since", first, w.Relative(first.lastEcho()))
		var b strings.Builder
		b.WriteString("Streams that hang:\n")
		for _, s := range hung {
			fmt.Fprintf(&b, "    %s: last echo %s\n", s, w.Relative(s.lastEcho()))
		}
		b.WriteString("Timeline around " + after + ":\n")
		b.WriteString(w.Excerpt(at, o.context, limit, func(e probe.Event) bool { return e.Kind == probe.KindEnd }))
		out.detail = b.String()
		return out, nil
	})
}
