package matchers

import (
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/dpconform/dpconform/fv/monotime"
	"github.com/dpconform/dpconform/fv/probe"
	"github.com/dpconform/dpconform/fv/timeline"
)

// streamState is one stream's history on the timeline.
type streamState struct {
	probe  string
	id     int
	open   *probe.Event
	echoes []probe.Event
	gaps   []probe.Event
	stalls []probe.Event // the probe's own lateness on this stream (KindStall)
	// serverStalls are the times the echo server that answers the stream (its
	// backend) did not run (KindServerStall).
	serverStalls []probe.Event
	end          *probe.Event
	backend      string
}

func (s *streamState) String() string {
	if s.backend != "" {
		return fmt.Sprintf("stream %s/%d (answered by %s)", s.probe, s.id, s.backend)
	}
	return fmt.Sprintf("stream %s/%d", s.probe, s.id)
}

// lastEcho is the arrival of the stream's last echo, or the end of its handshake.
func (s *streamState) lastEcho() monotime.Time {
	t := s.open.Time.Add(s.open.Latency)
	for _, e := range s.echoes {
		t = max(t, e.End)
	}
	return t
}

// streamsOf returns the streams of the selected stream probes, by probe and id.
func streamsOf(w timeline.Window, o options) []*streamState {
	m := map[[2]any]*streamState{}
	serverStalls := map[string][]probe.Event{}
	for i := range w.Events {
		e := &w.Events[i]
		switch e.Kind {
		case probe.KindServerStall:
			// Whichever probes are selected: a selected stream's server may be any.
			serverStalls[e.Probe] = append(serverStalls[e.Probe], *e)
			continue
		case probe.KindOpen, probe.KindEcho, probe.KindGap, probe.KindStall, probe.KindEnd:
		default:
			continue
		}
		if !o.selected(e.Probe) {
			continue
		}
		k := [2]any{e.Probe, e.Stream}
		s := m[k]
		if s == nil {
			s = &streamState{probe: e.Probe, id: e.Stream}
			m[k] = s
		}
		switch e.Kind {
		case probe.KindOpen:
			s.open = e
		case probe.KindEcho:
			s.echoes = append(s.echoes, *e)
		case probe.KindGap:
			s.gaps = append(s.gaps, *e)
		case probe.KindStall:
			s.stalls = append(s.stalls, *e)
		case probe.KindEnd:
			s.end = e
		}
		if e.Backend != "" {
			s.backend = e.Backend
		}
	}
	var out []*streamState
	for _, s := range m {
		if s.open != nil && o.streamSelected(s.backend) {
			if s.backend != "" {
				s.serverStalls = serverStalls[s.backend]
			}
			out = append(out, s)
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].probe != out[j].probe {
			return out[i].probe < out[j].probe
		}
		return out[i].id < out[j].id
	})
	return out
}

// streamProbes returns the selected stream probes and checks that they cover the
// window (ready before its start with fromStart) and that none stopped a stream
// before its end.
func streamProbes(w timeline.Window, o options, fromStart bool) ([]*streamState, error) {
	probes := ofRole(probesOf(w), probe.RoleStream, o)
	if len(probes) == 0 {
		return nil, fmt.Errorf("no stream probe on the timeline%s", selection(o))
	}
	for _, p := range probes {
		if err := covers(w, p, fromStart, w.End); err != nil {
			return nil, err
		}
	}
	var streams []*streamState
	for _, s := range streamsOf(w, o) {
		if s.open.Time > w.End {
			continue
		}
		if s.end != nil && s.end.Outcome == probe.Stopped && s.end.Time < w.End {
			return nil, fmt.Errorf("%s was stopped by its probe %s, before the window end", s, w.Relative(s.end.Time))
		}
		streams = append(streams, s)
	}
	if len(streams) == 0 {
		return nil, fmt.Errorf("no stream was opened before the window end%s", selection(o))
	}
	return streams, nil
}

type gap struct {
	s        *streamState
	from, to monotime.Time
	open     bool          // still open at the window end
	net      time.Duration // judged(), computed once by gapsOf
}

func (g gap) length() time.Duration { return g.to.Sub(g.from) }

// judged is the part of the gap that the path is answerable for: its length less the
// time the instrument itself did not run, during which nothing was in flight for the
// path to lose or no echo could be sent: the stream's probe late to send (stalls)
// and its echo server not running (serverStalls). Where the two overlap, as they do
// when the whole machine is starved, the time is taken off once.
func (g gap) judged() time.Duration {
	d := g.length()
	if g.s == nil || len(g.s.stalls)+len(g.s.serverStalls) == 0 {
		return d
	}
	type span struct{ lo, hi monotime.Time }
	var spans []span
	for _, stalls := range [][]probe.Event{g.s.stalls, g.s.serverStalls} {
		for _, st := range stalls {
			if lo, hi := max(g.from, st.Time), min(g.to, st.End); hi > lo {
				spans = append(spans, span{lo, hi})
			}
		}
	}
	sort.Slice(spans, func(i, j int) bool { return spans[i].lo < spans[j].lo })
	var covered monotime.Time // the end of the spans taken off so far
	for _, sp := range spans {
		lo := max(sp.lo, covered)
		if sp.hi > lo {
			d -= sp.hi.Sub(lo)
		}
		covered = max(covered, sp.hi)
	}
	return d
}

// blindness returns the longest time inside the window that the stream's probe or
// its echo server did not run, and an error when one is longer than the instrument
// limit: the instrument was not running long enough for the dataplane to have
// failed unseen.
func blindness(w timeline.Window, s *streamState, o options) (time.Duration, error) {
	var longest time.Duration
	for _, stalls := range [][]probe.Event{s.stalls, s.serverStalls} {
		for _, st := range stalls {
			if st.End <= w.Start || st.Time >= w.End {
				continue
			}
			d := st.End.Sub(st.Time)
			if d > o.maxBlind {
				who := "its probe did not send"
				if st.Kind == probe.KindServerStall {
					who = "its echo server " + st.Probe + " did not run"
				}
				return d, fmt.Errorf("%s: %s for %s, from %s: %w (starved or stopped), %s is the limit",
					s, who, fmtMs(d), w.Relative(st.Time), ErrBlind, fmtMs(o.maxBlind))
			}
			longest = max(longest, d)
		}
	}
	return longest, nil
}

// gapsOf returns the stream's gaps between echoes that overlap the window, each at its
// full length (and the part of it judged); a gap still open at the window end counts
// up to the end.
func gapsOf(w timeline.Window, s *streamState) []gap {
	var gs []gap
	addGap := func(from, to monotime.Time, open bool) {
		if to > from && from < w.End && to > w.Start {
			gs = append(gs, gap{s: s, from: from, to: to, open: open})
		}
	}
	for i, e := range s.echoes {
		if i > 0 {
			addGap(s.echoes[i-1].End, e.Time, false)
		}
		if e.Gap > 0 {
			addGap(e.GapAt, e.GapAt.Add(e.Gap), false)
		}
	}
	for _, e := range s.gaps {
		addGap(e.Time, e.End, false)
	}
	if last := s.lastEcho(); last < w.End {
		addGap(last, w.End, true)
	}
	// The same gap shows in several forms (between summaries, inside one, as a gap
	// event): keep the longest per start.
	sort.Slice(gs, func(i, j int) bool {
		if gs[i].from != gs[j].from {
			return gs[i].from < gs[j].from
		}
		return gs[i].to > gs[j].to
	})
	out := gs[:0]
	for _, g := range gs {
		if len(out) > 0 && out[len(out)-1].from == g.from {
			continue
		}
		g.net = g.judged()
		out = append(out, g)
	}
	return out
}

// HaveStreamGapsWithin succeeds when no stream went longer than budget without an
// echo inside the window. Gaps are measured between the arrivals of consecutive echoes
// and count at their full length when they overlap the window; a stream that stopped
// echoing (or died) has a gap up to the window end. Options: Probes, Context.
func HaveStreamGapsWithin(limit time.Duration, opts ...Option) Matcher {
	return newMatcher(fmt.Sprintf("every stream's gaps within %s", fmtMs(limit)), KindGap, opts, func(w timeline.Window, o options) (outcome, error) {
		streams, err := streamProbes(w, o, true)
		if err != nil {
			return outcome{}, err
		}
		var worst gap
		var over []gap
		var blind time.Duration
		for _, s := range streams {
			b, err := blindness(w, s, o)
			if err != nil {
				return outcome{}, err
			}
			blind = max(blind, b)
			for _, g := range gapsOf(w, s) {
				if g.net > worst.net {
					worst = g
				}
				if g.net > limit {
					over = append(over, g)
				}
			}
		}
		where := ""
		if worst.s != nil {
			where = " on " + worst.s.String()
			if stalled := worst.length() - worst.net; stalled > 0 {
				where += fmt.Sprintf(" (%s long, %s of it the instrument's own stall)", fmtMs(worst.length()), fmtMs(stalled))
			}
		}
		out := outcome{verdict: Pass, figures: []Figure{
			{Name: "max_gap", Value: msf(worst.net), Unit: "ms", Budget: budget(msf(limit)),
				Text: fmt.Sprintf("max gap %s%s, over %d %s (budget %s)", fmtMs(worst.net), where, len(streams), plural(len(streams), "stream", "streams"), fmtMs(limit))},
			{Name: "gaps_over_budget", Value: float64(len(over)), Unit: "gaps", Text: fmt.Sprintf("%d %s over budget", len(over), plural(len(over), "gap", "gaps"))},
			{Name: "max_schedule_gap", Value: msf(blind), Unit: "ms", Budget: budget(msf(o.maxBlind)),
				Text: fmt.Sprintf("longest stall of the probes or echo servers themselves %s (instrument limit %s)", fmtMs(blind), fmtMs(o.maxBlind))},
		}}
		if len(over) == 0 {
			return out, nil
		}
		sort.Slice(over, func(i, j int) bool { return over[i].from < over[j].from })
		g := over[0]
		out.verdict, out.at = Violation, g.from
		for _, g := range over {
			out.marks = append(out.marks, Mark{Probe: g.s.probe, Stream: g.s.id, Time: g.from, End: g.to, Kind: KindGap})
		}
		if g.open {
			out.first = fmt.Sprintf("%s had no echo from %s to the window end (%s)", g.s, w.Relative(g.from), fmtMs(g.length()))
		} else {
			out.first = fmt.Sprintf("%s went %s without an echo, from %s to %s", g.s, fmtMs(g.length()), w.Relative(g.from), w.Relative(g.to))
		}
		if stalled := g.length() - g.net; stalled > 0 {
			out.first += fmt.Sprintf(" (%s of it the instrument's own stall, not counted)", fmtMs(stalled))
		}
		switch {
		case g.s.open.Outcome != probe.OK:
			out.first += fmt.Sprintf("; it never opened: %s (%s)", strings.ToUpper(string(g.s.open.Outcome)), g.s.open.Err)
		case g.s.end != nil && g.s.end.Time <= g.to:
			out.first += "; it " + endText(w, g.s.end)
		}
		var b strings.Builder
		b.WriteString("Timeline around it:\n")
		b.WriteString(w.Excerpt(g.from, o.context, min(g.length(), time.Second)+o.context, func(e probe.Event) bool {
			return e.Probe == g.s.probe && e.Stream == g.s.id && (e.Kind == probe.KindGap || e.Kind == probe.KindStall || e.Kind == probe.KindEnd) ||
				e.Kind == probe.KindServerStall && e.Probe == g.s.backend
		}))
		if len(over) > 1 {
			b.WriteString("Other gaps over budget:\n")
			for i, g := range over[1:] {
				if i == 12 {
					fmt.Fprintf(&b, "  ... and %d more\n", len(over)-13)
					break
				}
				fmt.Fprintf(&b, "  %s: %s from %s\n", g.s, fmtMs(g.length()), w.Relative(g.from))
			}
		}
		out.detail = b.String()
		return out, nil
	})
}

func endText(w timeline.Window, e *probe.Event) string {
	return fmt.Sprintf("ended %s: %s (%s)", w.Relative(e.Time), strings.ToUpper(string(e.Outcome)), e.Err)
}

// HaveNoResets succeeds when no probe saw a RST inside the window: no stream ended
// or failed to open with a reset or refusal, and no connect attempt was reset or
// refused. Options: Probes, Context.
func HaveNoResets(opts ...Option) Matcher {
	return newMatcher("no reset", KindReset, opts, func(w timeline.Window, o options) (outcome, error) {
		ps := probesOf(w)
		probes := append(ofRole(ps, probe.RoleStream, o), ofRole(ps, probe.RoleConnect, o)...)
		if len(probes) == 0 {
			return outcome{}, fmt.Errorf("no stream or connect probe on the timeline%s", selection(o))
		}
		for _, p := range probes {
			if err := covers(w, p, false, w.End); err != nil {
				return outcome{}, err
			}
		}
		var resets []probe.Event
		streams, attempts := 0, 0
		backendOf := map[[2]any]string{}
		if len(o.onBackends) > 0 {
			for _, s := range streamsOf(w, options{probes: o.probes}) {
				backendOf[[2]any{s.probe, s.id}] = s.backend
			}
		}
		for _, e := range w.Inside() {
			if !o.selected(e.Probe) {
				continue
			}
			if len(o.onBackends) > 0 {
				if e.Kind == probe.KindAttempt || !o.streamSelected(backendOf[[2]any{e.Probe, e.Stream}]) {
					continue
				}
			}
			switch e.Kind {
			case probe.KindOpen:
				streams++
			case probe.KindAttempt:
				attempts++
			case probe.KindEnd:
			default:
				continue
			}
			if e.Outcome.IsResetOrRefused() {
				resets = append(resets, e)
			}
		}
		for _, s := range streamsOf(w, o) {
			if s.open.Time < w.Start {
				streams++
			}
		}
		out := outcome{verdict: Pass, figures: []Figure{
			{Name: "resets", Value: float64(len(resets)), Unit: "resets", Of: streams + attempts, Budget: budget(0),
				Text: fmt.Sprintf("%d %s (RST) over %d streams and %d attempts (budget 0)", len(resets), plural(len(resets), "reset", "resets"), streams, attempts)},
		}}
		if len(resets) == 0 {
			return out, nil
		}
		first := resets[0]
		out.verdict, out.at = Violation, first.Time
		for _, e := range resets {
			out.marks = append(out.marks, markOf(e, KindReset))
		}
		out.first = fmt.Sprintf("probe %s %s: %s", first.Probe, w.Relative(first.Time), timeline.Describe(first))
		var b strings.Builder
		b.WriteString("Timeline around it:\n")
		b.WriteString(w.Excerpt(first.Time, o.context, o.context, func(e probe.Event) bool {
			return o.selected(e.Probe) && e.Outcome.IsResetOrRefused()
		}))
		out.detail = b.String()
		return out, nil
	})
}

// BeAliveAtEnd succeeds when every stream opened before the window end is still up at
// the end: it has not ended, and its last echo arrived within Within (default
// 500 ms) of the end. Options: Probes, Within, Context.
func BeAliveAtEnd(opts ...Option) Matcher {
	return newMatcher("every stream alive at the end", KindNotAlive, opts, func(w timeline.Window, o options) (outcome, error) {
		streams, err := streamProbes(w, o, false)
		if err != nil {
			return outcome{}, err
		}
		type dead struct {
			s   *streamState
			why string
			at  monotime.Time
		}
		var deads []dead
		for _, s := range streams {
			switch last := s.lastEcho(); {
			case s.open.Outcome != probe.OK:
				deads = append(deads, dead{s, fmt.Sprintf("never opened: %s (%s)", strings.ToUpper(string(s.open.Outcome)), s.open.Err), s.open.Time})
			case s.end != nil && s.end.Time <= w.End:
				deads = append(deads, dead{s, endText(w, s.end), s.end.Time})
			case w.End.Sub(last) > o.within+o.clock:
				deads = append(deads, dead{s, fmt.Sprintf("has had no echo since %s (%s before the end)", w.Relative(last), fmtMs(w.End.Sub(last))), last})
			}
		}
		out := outcome{verdict: Pass, figures: []Figure{
			{Name: "dead_streams", Value: float64(len(deads)), Unit: "streams", Of: len(streams), Budget: budget(0),
				Text: fmt.Sprintf("%d of %d streams dead at the window end (alive: an echo within %s of the end)", len(deads), len(streams), fmtMs(o.within))},
		}}
		if len(deads) == 0 {
			return out, nil
		}
		sort.Slice(deads, func(i, j int) bool { return deads[i].at < deads[j].at })
		d := deads[0]
		out.verdict, out.at = Violation, d.at
		for _, d := range deads {
			out.marks = append(out.marks, Mark{Probe: d.s.probe, Stream: d.s.id, Time: d.at, End: w.End, Kind: KindNotAlive})
		}
		out.first = fmt.Sprintf("%s %s", d.s, d.why)
		var b strings.Builder
		b.WriteString("Timeline around it:\n")
		b.WriteString(w.Excerpt(d.at, o.context, o.context, func(e probe.Event) bool {
			return e.Probe == d.s.probe && e.Stream == d.s.id && (e.Kind == probe.KindEnd || e.Kind == probe.KindGap || e.Kind == probe.KindOpen && e.Outcome != probe.OK)
		}))
		if len(deads) > 1 {
			b.WriteString("Other dead streams:\n")
			for _, d := range deads[1:] {
				fmt.Fprintf(&b, "  %s %s\n", d.s, d.why)
			}
		}
		out.detail = b.String()
		return out, nil
	})
}
