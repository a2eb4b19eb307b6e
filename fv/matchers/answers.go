package matchers

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/dpconform/dpconform/fv/monotime"
	"github.com/dpconform/dpconform/fv/probe"
	"github.com/dpconform/dpconform/fv/timeline"
)

// HaveDatagramsAnswered succeeds when every datagram the selected udp probes sent
// inside the window was answered in time, from the address it was sent to, by one of
// Backends (by any server, without the option). The probes must run with Replies: an
// answer is their KindReply. It is the steady state of a UDP flow through a Service,
// e.g. "the flow is served by the old backend" before that backend is replaced.
// Options: Probes (the udp senders), Backends, MaxBlind, Context.
func HaveDatagramsAnswered(opts ...Option) Matcher {
	return newMatcher("every datagram answered", KindLost, opts, func(w timeline.Window, o options) (outcome, error) {
		return evalAnswers(w, o, nil)
	})
}

// HaveDatagramsAnsweredWithin succeeds when every datagram sent from limit after the
// first transition event named after to the window's end was answered in time, from
// the address it was sent to, by one of Backends: a UDP flow that a dataplane must
// move to a Service's new backend (its conntrack entry to the old one deleted) is
// served by it within limit of the change, and by no other server after that. What
// happens between the event and the deadline is measured (how soon the flow moved)
// but not judged. Options: Probes (the udp senders, with Replies), Backends,
// MaxBlind, Context.
func HaveDatagramsAnsweredWithin(after string, limit time.Duration, opts ...Option) Matcher {
	what := fmt.Sprintf("every datagram answered from %s after %s", fmtMs(limit), after)
	return newMatcher(what, KindLost, opts, func(w timeline.Window, o options) (outcome, error) {
		return evalAnswers(w, o, &deadline{after: after, limit: limit + o.clock})
	})
}

// probeSeq names one datagram: its sender and sequence number.
type probeSeq struct {
	probe string
	seq   uint64
}

// deadline is when HaveDatagramsAnsweredWithin starts judging.
type deadline struct {
	after string
	limit time.Duration
	at    monotime.Time // the event's time
}

// datagram is one datagram of a udp probe and what became of it.
type datagram struct {
	sent  probe.Event
	reply *probe.Event // its answer (KindReply), if one came in time
	recv  []string     // the servers that reported receiving it
	kind  Kind         // how it failed; empty when answered as it must be
}

// how says for a person what became of a datagram that failed.
func (d datagram) how(o options) string {
	switch {
	case d.sent.Outcome != probe.OK:
		return fmt.Sprintf("NOT SENT: %s (%s)", strings.ToUpper(string(d.sent.Outcome)), d.sent.Err)
	case d.kind == KindWrongBackend:
		by := ""
		if d.reply != nil {
			by = d.reply.Backend
		} else {
			by = strings.Join(d.recv, ", ")
		}
		return fmt.Sprintf("reached %s, expected %s", by, strings.Join(o.backends, " or "))
	case d.kind == KindWrongReply:
		return fmt.Sprintf("answered by %s, but %s", d.reply.Backend, d.reply.Err)
	case len(d.recv) > 0:
		return fmt.Sprintf("delivered to %s, whose answer never came back", strings.Join(d.recv, ", "))
	}
	return "never answered"
}

func evalAnswers(w timeline.Window, o options, dl *deadline) (outcome, error) {
	from, err := senders(w, o, probe.RoleUDP)
	if err != nil {
		return outcome{}, err
	}
	judged := w.Start
	if dl != nil {
		at, ok := transition(w, dl.after)
		if !ok {
			return outcome{}, fmt.Errorf("no %q event on the timeline", dl.after)
		}
		dl.at = at
		judged = dl.at.Add(dl.limit)
		if judged >= w.End {
			return outcome{}, fmt.Errorf("the window ends %s, before the deadline %s", w.Relative(w.End), w.Relative(judged))
		}
	}
	replies := map[probeSeq]*probe.Event{}
	recvs := map[probeSeq][]string{}
	for i := range w.Events {
		e := &w.Events[i]
		switch {
		case e.Kind == probe.KindReply && from[e.Probe]:
			replies[probeSeq{e.Probe, e.Seq}] = e
		case e.Kind == probe.KindRecv && e.Proto == "udp" && from[e.From]:
			k := probeSeq{e.From, e.Seq}
			recvs[k] = append(recvs[k], e.Backend)
		}
	}
	allowed := func(b string) bool { return len(o.backends) == 0 || slices.Contains(o.backends, b) }

	// Every datagram from the event on (or the window's start) is measured; those
	// sent before the deadline are not judged.
	measured := w.Start
	if dl != nil {
		measured = max(w.Start, dl.at)
	}
	var all []datagram
	sends := map[string][]monotime.Time{}
	for _, e := range w.Inside() {
		if e.Kind != probe.KindSent || !from[e.Probe] || e.Time < measured {
			continue
		}
		k := probeSeq{e.Probe, e.Seq}
		d := datagram{sent: e, reply: replies[k], recv: recvs[k]}
		wrong := slices.ContainsFunc(d.recv, func(b string) bool { return !allowed(b) })
		switch {
		case e.Outcome != probe.OK:
			d.kind = KindLost
		case d.reply != nil && !allowed(d.reply.Backend), wrong:
			d.kind = KindWrongBackend
		case d.reply != nil && d.reply.Outcome != probe.OK:
			d.kind = KindWrongReply
		case d.reply == nil:
			d.kind = KindLost
		}
		all = append(all, d)
		if e.Time >= judged {
			sends[e.Probe] = append(sends[e.Probe], e.Time)
		}
	}
	var blind time.Duration
	for name := range from {
		gap, at := longestGapIn(judged, w.End, sends[name])
		if gap > o.maxBlind {
			return outcome{}, fmt.Errorf("probe %s sent no datagram for %s, from %s: %w (starved or stopped), %s is the limit",
				name, fmtMs(gap), w.Relative(at), ErrBlind, fmtMs(o.maxBlind))
		}
		blind = max(blind, gap)
	}

	var failed []datagram
	count := map[Kind]int{}
	per := map[string]int{}
	total := 0
	var maxLat time.Duration
	var lastBad, firstGood *datagram
	for i := range all {
		d := &all[i]
		if d.kind != "" && (lastBad == nil || d.sent.Time > lastBad.sent.Time) {
			lastBad = d
		}
		if d.kind == "" && (firstGood == nil || d.sent.Time < firstGood.sent.Time) {
			firstGood = d
		}
		if d.sent.Time < judged {
			continue
		}
		total++
		if d.reply != nil {
			per[d.reply.Backend]++
		} else {
			per[""]++
		}
		if d.kind != "" {
			failed = append(failed, *d)
			count[d.kind]++
		} else {
			maxLat = max(maxLat, d.reply.Latency)
		}
	}
	if total == 0 {
		return outcome{}, fmt.Errorf("the senders sent no datagram from %s to the window's end", w.Relative(judged))
	}
	by := "any server"
	if len(o.backends) > 0 {
		by = strings.Join(o.backends, " or ")
	}
	since := "inside the window"
	if dl != nil {
		since = fmt.Sprintf("from %s after %s", fmtMs(dl.limit), dl.after)
	}
	out := outcome{verdict: Pass, figures: []Figure{
		{Name: "unanswered", Value: float64(len(failed)), Unit: "datagrams", Of: total, Budget: budget(0),
			Text: fmt.Sprintf("%d of %d datagrams sent %s not answered by %s (budget 0)%s", len(failed), total, since, by, kindCounts(count))},
		{Name: "answered_by", Value: float64(total - per[""]), Unit: "datagrams", Of: total,
			Text: fmt.Sprintf("answers %s: %s", since, answerCounts(per))},
		{Name: "max_latency", Value: msf(maxLat), Unit: "ms", Text: fmt.Sprintf("slowest answer %s", fmtMs(maxLat))},
		{Name: "max_schedule_gap", Value: msf(blind), Unit: "ms", Budget: budget(msf(o.maxBlind)),
			Text: fmt.Sprintf("longest time without a datagram %s (instrument limit %s)", fmtMs(blind), fmtMs(o.maxBlind))},
	}}
	out.figures = append(out.figures, silence(w, from, replies))
	if dl != nil {
		last := Figure{Name: "last_unanswered", Unit: "ms", Budget: budget(msf(dl.limit)),
			Text: fmt.Sprintf("every datagram sent after %s was answered by %s", dl.after, by)}
		if lastBad != nil {
			d := lastBad.sent.Time.Sub(dl.at)
			last.Value = msf(d)
			last.Text = fmt.Sprintf("the last datagram not answered by %s was #%d, sent %s after %s (budget %s)",
				by, lastBad.sent.Seq, fmtMs(d), dl.after, fmtMs(dl.limit))
		}
		out.figures = append(out.figures, last)
		if firstGood != nil {
			d := firstGood.sent.Time.Sub(dl.at)
			out.figures = append(out.figures, Figure{Name: "first_answered", Value: msf(d), Unit: "ms",
				Text: fmt.Sprintf("the first answered by %s was #%d, sent %s after %s", by, firstGood.sent.Seq, fmtMs(d), dl.after)})
		}
	}
	if len(failed) == 0 {
		return out, nil
	}
	out.verdict = Violation
	switch {
	case count[KindWrongBackend] > 0:
		out.kind = KindWrongBackend
	case count[KindWrongReply] > 0:
		out.kind = KindWrongReply
	default:
		out.kind = KindLost
	}
	sort.Slice(failed, func(i, j int) bool { return failed[i].sent.Time < failed[j].sent.Time })
	f := failed[0]
	out.at = f.sent.Time
	for _, d := range failed {
		out.marks = append(out.marks, markOf(d.sent, d.kind))
	}
	out.first = fmt.Sprintf("datagram #%d from %s to %s, sent %s: %s", f.sent.Seq, f.sent.Probe, f.sent.Target, w.Relative(f.sent.Time), f.how(o))
	var b strings.Builder
	b.WriteString("Timeline around it:\n")
	b.WriteString(w.Excerpt(f.sent.Time, o.context, o.context, func(e probe.Event) bool {
		return e.Kind == probe.KindSent && e.Probe == f.sent.Probe && e.Seq == f.sent.Seq
	}))
	b.WriteString("Not answered as they must be:\n")
	b.WriteString(answerRuns(w, failed, o))
	out.detail = b.String()
	return out, nil
}

// silence measures the longest run of the window's datagrams (of the senders from)
// that no server answered: how long the flow was blackholed, wherever it went, and
// when, relative to the transition. It is measured over the whole window, not judged.
func silence(w timeline.Window, from map[string]bool, replies map[probeSeq]*probe.Event) Figure {
	var run, longest []probe.Event
	last := map[string][]probe.Event{}
	for _, e := range w.Inside() {
		if e.Kind != probe.KindSent || !from[e.Probe] {
			continue
		}
		if r := replies[probeSeq{e.Probe, e.Seq}]; r != nil && r.Outcome == probe.OK {
			last[e.Probe] = nil
			continue
		}
		run = append(last[e.Probe], e)
		last[e.Probe] = run
		if len(run) > len(longest) {
			longest = run
		}
	}
	if len(longest) == 0 {
		return Figure{Name: "longest_unanswered", Unit: "ms", Text: "every datagram in the window was answered"}
	}
	first, end := longest[0], longest[len(longest)-1]
	d := end.Time.Sub(first.Time)
	return Figure{Name: "longest_unanswered", Value: msf(d), Unit: "ms",
		Text: fmt.Sprintf("longest run without an answer: %d datagrams over %s, #%d..#%d, from %s", len(longest), fmtMs(d), first.Seq, end.Seq, w.Relative(first.Time))}
}

// longestGapIn is the longest stretch from start to end without a time of ts
// (sorted).
func longestGapIn(start, end monotime.Time, ts []monotime.Time) (time.Duration, monotime.Time) {
	prev, at := start, start
	var gap time.Duration
	for _, t := range append(ts, end) {
		if d := t.Sub(prev); d > gap {
			gap, at = d, prev
		}
		prev = t
	}
	return gap, at
}

// answerCounts renders answers per server, unanswered last: "new 480, old 2, none 3".
func answerCounts(per map[string]int) string {
	var names []string
	for b := range per {
		if b != "" {
			names = append(names, b)
		}
	}
	slices.Sort(names)
	var parts []string
	for _, b := range names {
		parts = append(parts, fmt.Sprintf("%s %d", b, per[b]))
	}
	if per[""] > 0 || len(parts) == 0 {
		parts = append(parts, fmt.Sprintf("none %d", per[""]))
	}
	return strings.Join(parts, ", ")
}

// answerRuns lists failed datagrams in runs of consecutive ones of one probe that
// failed the same way.
func answerRuns(w timeline.Window, failed []datagram, o options) string {
	const maxRuns = 12
	var b strings.Builder
	runs := 0
	for i := 0; i < len(failed); {
		j := i
		for j+1 < len(failed) && failed[j+1].sent.Probe == failed[i].sent.Probe && failed[j+1].sent.Seq == failed[j].sent.Seq+1 &&
			failed[j+1].how(o) == failed[i].how(o) {
			j++
		}
		if runs == maxRuns {
			fmt.Fprintf(&b, "  ... and more, %d datagrams in all\n", len(failed))
			break
		}
		runs++
		fmt.Fprintf(&b, "  %s #%d..#%d (%d) %s, sent from %s to %s\n", failed[i].sent.Probe, failed[i].sent.Seq, failed[j].sent.Seq, j-i+1,
			failed[i].how(o), w.Relative(failed[i].sent.Time), w.Relative(failed[j].sent.Time))
		i = j + 1
	}
	return b.String()
}
