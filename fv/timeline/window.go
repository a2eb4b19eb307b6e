package timeline

import (
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/dpconform/dpconform/fv/monotime"
	"github.com/dpconform/dpconform/fv/probe"
)

// Window is a snapshot of a Timeline with the bounds an invariant is checked in.
// Events and Transitions hold everything the timeline held, sorted by time, not only
// what falls inside: a matcher also needs to see that a probe was ready before the
// window and reported past its end. It marshals to JSON as it is, for reports.
type Window struct {
	Start       monotime.Time `json:"start"`
	End         monotime.Time `json:"end"`
	Events      []probe.Event `json:"events"`
	Transitions []Transition  `json:"transitions"`
	// Verdicts are the policy verdicts the implementation reported, and
	// VerdictsReported says up to when each node's were polled (empty when no
	// verdicts were polled).
	Verdicts         []Verdict                `json:"verdicts,omitempty"`
	VerdictsReported map[string]monotime.Time `json:"verdictsReported,omitempty"`
}

// Contains reports whether t is inside [Start, End].
func (w Window) Contains(t monotime.Time) bool { return t >= w.Start && t <= w.End }

// Inside returns the events stamped inside the window.
func (w Window) Inside() []probe.Event {
	lo := sort.Search(len(w.Events), func(i int) bool { return w.Events[i].Time >= w.Start })
	hi := sort.Search(len(w.Events), func(i int) bool { return w.Events[i].Time > w.End })
	return w.Events[lo:hi]
}

// Duration is the window's length.
func (w Window) Duration() time.Duration { return w.End.Sub(w.Start) }

// String describes the window relative to the transition events, e.g.
// "window from 1.0 s before stop-sent to 3.0 s after ready (4.9 s)"; a window with no
// transition event in the timeline is described by its length alone.
func (w Window) String() string {
	// The length is a summary: to the tenth of a second, or the tenth of a ms.
	length := w.Duration()
	if length >= time.Second {
		length = length.Round(100 * time.Millisecond)
	}
	if len(w.Transitions) == 0 {
		return "window of " + Duration(length)
	}
	return fmt.Sprintf("window from %s to %s (%s)", w.Relative(w.Start), w.Relative(w.End), Duration(length))
}

// Relative places t relative to the transition events around it, e.g.
// "132.4 ms after stop-sent (18.0 ms before exited)", or "at ready". With no
// transition events it is relative to the window start.
func (w Window) Relative(t monotime.Time) string {
	prev, next := w.around(t)
	switch {
	case prev != nil && prev.Time == t:
		return "at " + prev.Name
	case prev != nil && next != nil:
		return fmt.Sprintf("%s after %s (%s before %s)", Duration(t.Sub(prev.Time)), prev.Name, Duration(next.Time.Sub(t)), next.Name)
	case prev != nil:
		return fmt.Sprintf("%s after %s", Duration(t.Sub(prev.Time)), prev.Name)
	case next != nil:
		return fmt.Sprintf("%s before %s", Duration(next.Time.Sub(t)), next.Name)
	case t == w.Start:
		return "at the window start"
	case t < w.Start:
		return fmt.Sprintf("%s before the window start", Duration(w.Start.Sub(t)))
	}
	return fmt.Sprintf("%s into the window", Duration(t.Sub(w.Start)))
}

// Duration renders a span for people: "18.0 ms" under a second, "3.0 s" or "1.523 s"
// from there (to the millisecond, unless it is a whole tenth).
func Duration(d time.Duration) string {
	if d < 0 {
		return "-" + Duration(-d)
	}
	if d < time.Second {
		return fmt.Sprintf("%.1f ms", float64(d)/1e6)
	}
	if r := d.Round(time.Millisecond); r%(100*time.Millisecond) == 0 {
		return fmt.Sprintf("%.1f s", r.Seconds())
	}
	return fmt.Sprintf("%.3f s", d.Seconds())
}

// around returns the last transition at or before t and the first after it.
func (w Window) around(t monotime.Time) (prev, next *Transition) {
	i := sort.Search(len(w.Transitions), func(i int) bool { return w.Transitions[i].Time > t })
	if i > 0 {
		prev = &w.Transitions[i-1]
	}
	if i < len(w.Transitions) {
		next = &w.Transitions[i]
	}
	return prev, next
}

// reference is the time the lines of an excerpt around t are relative to: the last
// transition at or before t, else the first after it, else the window start.
func (w Window) reference(t monotime.Time) (monotime.Time, string) {
	prev, next := w.around(t)
	switch {
	case prev != nil:
		return prev.Time, prev.Name
	case next != nil:
		return next.Time, next.Name
	}
	return w.Start, "the window start"
}

func signedMs(d time.Duration) string {
	if d < 0 {
		return fmt.Sprintf("-%.3f ms", float64(-d)/1e6)
	}
	return fmt.Sprintf("+%.3f ms", float64(d)/1e6)
}

// Excerpt renders the timeline from before ahead of at to after past it: probe
// events (runs of routine successes collapsed into one line) and transition events,
// each line relative to one reference transition. Events for which highlight
// returns true are marked with "<==" and never collapsed.
func (w Window) Excerpt(at monotime.Time, before, after time.Duration, highlight func(probe.Event) bool) string {
	const maxLines = 48
	from, to := at.Add(-before), at.Add(after)
	ref, refName := w.reference(at)

	type line struct {
		t    monotime.Time
		text string
	}
	var lines []line
	add := func(t monotime.Time, probeName, text string) {
		lines = append(lines, line{t, fmt.Sprintf("  %14s  %-12s %s", signedMs(t.Sub(ref)), probeName, text)})
	}

	// Merge events and transitions in time order. Routine events between two notable
	// ones are grouped by probe, kind and destination, one line per group.
	lo := sort.Search(len(w.Events), func(i int) bool { return w.Events[i].Time >= from })
	evs := w.Events[lo:]
	ti := sort.Search(len(w.Transitions), func(i int) bool { return w.Transitions[i].Time >= from })
	type groupKey struct {
		probe   string
		kind    probe.Kind
		target  string
		outcome probe.Outcome
		backend string // answers only: a run of them is one server's
	}
	groups := map[groupKey][]probe.Event{}
	var order []groupKey
	flush := func() {
		for _, k := range order {
			run := groups[k]
			if len(run) < 3 {
				for _, e := range run {
					add(e.Time, e.Probe, Describe(e))
				}
			} else {
				add(run[0].Time, run[0].Probe, describeRun(run, run[len(run)-1].Time.Sub(run[0].Time)))
			}
			delete(groups, k)
		}
		order = order[:0]
	}
	for i := 0; ; i++ {
		var e *probe.Event
		if i < len(evs) && evs[i].Time <= to {
			e = &evs[i]
		}
		for ti < len(w.Transitions) && w.Transitions[ti].Time <= to && (e == nil || w.Transitions[ti].Time <= e.Time) {
			flush()
			tr := w.Transitions[ti]
			text := "===== " + tr.Name
			if tr.Detail != "" {
				text += " (" + tr.Detail + ")"
			}
			add(tr.Time, "", text+" =====")
			ti++
		}
		if e == nil {
			break
		}
		if e.Kind == probe.KindMark {
			continue
		}
		hl := highlight != nil && highlight(*e)
		if !hl && routine(*e) {
			k := groupKey{e.Probe, e.Kind, e.Target, e.Outcome, ""}
			if e.Kind == probe.KindReply {
				k.backend = e.Backend
			}
			if _, ok := groups[k]; !ok {
				order = append(order, k)
			}
			groups[k] = append(groups[k], *e)
			continue
		}
		flush()
		text := Describe(*e)
		if hl {
			text += "   <=="
		}
		add(e.Time, e.Probe, text)
	}
	flush()
	sort.SliceStable(lines, func(i, j int) bool { return lines[i].t < lines[j].t })

	// Keep the lines nearest to at.
	if len(lines) > maxLines {
		c := sort.Search(len(lines), func(i int) bool { return lines[i].t >= at })
		lo := c - maxLines/2
		if lo < 0 {
			lo = 0
		}
		hi := lo + maxLines
		if hi > len(lines) {
			hi = len(lines)
			lo = hi - maxLines
		}
		lines = lines[lo:hi]
	}
	var b strings.Builder
	fmt.Fprintf(&b, "  (times relative to %s; %s)\n", refName, w.Relative(at))
	for _, l := range lines {
		b.WriteString(l.text)
		b.WriteByte('\n')
	}
	return b.String()
}

// routine events are grouped in an excerpt unless highlighted.
func routine(e probe.Event) bool {
	switch e.Kind {
	case probe.KindAttempt, probe.KindSent, probe.KindReply, probe.KindRecv:
		return true
	}
	return false
}

func describeRun(run []probe.Event, span time.Duration) string {
	first, last := run[0], run[len(run)-1]
	backends := map[string]bool{}
	var names []string
	minLat, maxLat := first.Latency, first.Latency
	for _, e := range run {
		if e.Backend != "" && !backends[e.Backend] {
			backends[e.Backend] = true
			names = append(names, e.Backend)
		}
		minLat, maxLat = min(minLat, e.Latency), max(maxLat, e.Latency)
	}
	fail := strings.ToUpper(string(first.Outcome))
	seqs := fmt.Sprintf("#%d..#%d", first.Seq, last.Seq)
	n := fmt.Sprintf("%d over %s", len(run), Duration(span))
	lat := fmt.Sprintf("latency %.2f-%.2f ms", float64(minLat)/1e6, float64(maxLat)/1e6)
	switch {
	case first.Kind == probe.KindAttempt && first.Outcome != probe.OK:
		return fmt.Sprintf("attempts %s to %s: %s (%s%s)", seqs, target(first), fail, n, semi(first.Err))
	case first.Kind == probe.KindSent && first.Outcome != probe.OK:
		return fmt.Sprintf("datagrams %s to %s NOT SENT: %s (%s%s)", seqs, target(first), fail, n, semi(first.Err))
	case first.Kind == probe.KindAttempt:
		by := "answered by " + strings.Join(names, ",")
		if len(names) == 0 {
			by = unnamedServer
		}
		return fmt.Sprintf("attempts %s ok (%s; %s; %s)", seqs, n, lat, by)
	case first.Kind == probe.KindSent:
		return fmt.Sprintf("datagrams %s to %s sent (%s)", seqs, target(first), n)
	case first.Kind == probe.KindReply && first.Outcome != probe.OK:
		return fmt.Sprintf("datagrams %s to %s %s: %s (%s%s)", seqs, target(first), answeredBy(first), fail, n, semi(first.Err))
	case first.Kind == probe.KindReply:
		return fmt.Sprintf("datagrams %s to %s %s (%s; %s)", seqs, target(first), answeredBy(first), n, lat)
	default:
		to := ""
		if first.Target != "" {
			to = ", to " + first.Target
		}
		return fmt.Sprintf("received %d requests from %s (%s%s) over %s", len(run), or(first.From, "an unnamed sender"), seqs, to, Duration(span))
	}
}

// unnamedServer stands for a server's name where a reply carried none: a message
// never prints an empty name.
const unnamedServer = "answered by a server that gave no name"

// or returns s, or none when s is empty.
func or(s, none string) string {
	if s == "" {
		return none
	}
	return s
}

func target(e probe.Event) string { return or(e.Target, "an unnamed destination") }

func answeredBy(e probe.Event) string {
	if e.Backend == "" {
		return unnamedServer
	}
	return "answered by " + e.Backend
}

// paren is " (why)", or nothing without a why.
func paren(why string) string {
	if why == "" {
		return ""
	}
	return " (" + why + ")"
}

// semi is "; why", or nothing without a why.
func semi(why string) string {
	if why == "" {
		return ""
	}
	return "; " + why
}

// Describe renders one probe event for a person. A field the event lacks is said to
// be missing, never printed empty.
func Describe(e probe.Event) string {
	fail := strings.ToUpper(string(e.Outcome))
	switch e.Kind {
	case probe.KindReady:
		return fmt.Sprintf("probe ready (%s, pid %d)", or(string(e.Role), "role not given"), e.PID)
	case probe.KindAttempt:
		if e.Outcome == probe.OK {
			return fmt.Sprintf("attempt #%d to %s: ok in %.2f ms, %s", e.Seq, target(e), float64(e.Latency)/1e6, answeredBy(e))
		}
		return fmt.Sprintf("attempt #%d to %s: %s after %s%s", e.Seq, target(e), fail, Duration(e.Latency), paren(e.Err))
	case probe.KindHeld:
		held := Duration(e.End.Sub(e.Time))
		if e.Outcome == probe.OK {
			return fmt.Sprintf("held connection #%d to %s: still %s after %s", e.Seq, target(e), answeredBy(e), held)
		}
		return fmt.Sprintf("held connection #%d to %s: LOST, checked after %s: %s%s", e.Seq, target(e), held, fail, paren(e.Err))
	case probe.KindOpen:
		if e.Outcome == probe.OK {
			return fmt.Sprintf("stream %d opened to %s in %.2f ms", e.Stream, target(e), float64(e.Latency)/1e6)
		}
		return fmt.Sprintf("stream %d to %s failed to open: %s after %s%s", e.Stream, target(e), fail, Duration(e.Latency), paren(e.Err))
	case probe.KindEcho:
		return fmt.Sprintf("stream %d: %d %s from %s up to #%d over %s, largest gap %s", e.Stream, e.Count, plural(e.Count, "echo", "echoes"),
			or(e.Backend, "a server that gave no name"), e.Seq, Duration(e.End.Sub(e.Time)), Duration(e.Gap))
	case probe.KindGap:
		return fmt.Sprintf("stream %d: GAP of %s without an echo (ended by echo #%d)", e.Stream, Duration(e.Gap), e.Seq)
	case probe.KindStall:
		return fmt.Sprintf("stream %d: the probe itself did not run for %s from here (a send was due)", e.Stream, Duration(e.Gap))
	case probe.KindServerStall:
		return fmt.Sprintf("the echo server itself did not run for %s from here (its heartbeat was due)", Duration(e.Gap))
	case probe.KindEnd:
		if e.Outcome == probe.Stopped {
			return fmt.Sprintf("stream %d stopped by the probe", e.Stream)
		}
		by := ""
		if e.Backend != "" {
			by = " (answered by " + e.Backend + ")"
		}
		return fmt.Sprintf("stream %d%s ENDED: %s%s", e.Stream, by, fail, paren(e.Err))
	case probe.KindSent:
		if e.Outcome == probe.OK {
			return fmt.Sprintf("datagram #%d to %s sent", e.Seq, target(e))
		}
		return fmt.Sprintf("datagram #%d to %s NOT SENT: %s%s", e.Seq, target(e), fail, paren(e.Err))
	case probe.KindReply:
		if e.Outcome == probe.OK {
			return fmt.Sprintf("datagram #%d to %s %s after %s", e.Seq, target(e), answeredBy(e), Duration(e.Latency))
		}
		return fmt.Sprintf("datagram #%d to %s %s after %s: %s%s", e.Seq, target(e), answeredBy(e), Duration(e.Latency), fail, paren(e.Err))
	case probe.KindRecv:
		to := ""
		if e.Target != "" {
			to = " (to " + e.Target + ")"
		}
		return fmt.Sprintf("received %s #%d from %s%s after %s", or(e.Proto, "a request"), e.Seq, or(e.From, "an unnamed sender"), to, Duration(e.End.Sub(e.Time)))
	case probe.KindReach:
		tries := ""
		if e.Count > 1 {
			tries = fmt.Sprintf(" (try %d)", e.Count)
		}
		what := fmt.Sprintf("reach %q (%s %s)", e.Label, or(e.Proto, "protocol not given"), target(e))
		if e.Outcome == probe.OK {
			return fmt.Sprintf("%s: ok in %.2f ms%s, %s", what, float64(e.Latency)/1e6, tries, answeredBy(e))
		}
		return fmt.Sprintf("%s: %s after %s%s%s", what, fail, Duration(e.Latency), tries, paren(e.Err))
	case probe.KindMark:
		return "watermark"
	case probe.KindError:
		return "PROBE ERROR: " + or(e.Err, "no detail given")
	case probe.KindDone:
		return fmt.Sprintf("probe stopped cleanly (%d made)", e.Count)
	case probe.KindExit:
		if e.Outcome == probe.OK {
			return "probe process exited"
		}
		if e.Err == "" {
			return "probe process " + fail
		}
		return fmt.Sprintf("probe process %s: %s", fail, e.Err)
	}
	return fmt.Sprintf("%s %+v", e.Kind, e)
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}
