package matchers

import (
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"

	"github.com/dpconform/dpconform/fv/probe"
	"github.com/dpconform/dpconform/fv/timeline"
)

// receivers checks that every serve probe on the timeline reported up to the window
// end plus the grace, so that a delivery still in flight at the end is not missed,
// and reported no error in that time: a receiver whose own socket dropped datagrams
// (its receive buffer full) would make the path look lossy.
func receivers(w timeline.Window, o options) error {
	for _, p := range ofRole(probesOf(w), probe.RoleServe, options{}) {
		if err := covers(w, p, false, w.End.Add(o.grace)); err != nil {
			return fmt.Errorf("receiver: %w", err)
		}
		for _, e := range p.errs {
			if e.Time >= w.Start && e.Time <= w.End.Add(o.grace) {
				return fmt.Errorf("receiver: probe %s reported an error %s: %s", p.name, w.Relative(e.Time), e.Err)
			}
		}
	}
	return nil
}

// senders returns the selected client probes (connect, stream, udp) and checks that
// they reported up to the window end (or, with SendersMayStop, stopped cleanly).
func senders(w timeline.Window, o options, roles ...probe.Role) (map[string]bool, error) {
	ps := probesOf(w)
	names := map[string]bool{}
	for _, r := range roles {
		for _, p := range ofRole(ps, r, o) {
			if err := coversOr(w, p, false, w.End, o.mayStop); err != nil {
				return nil, err
			}
			names[p.name] = true
		}
	}
	if len(names) == 0 {
		return nil, fmt.Errorf("no sending probe on the timeline%s", selection(o))
	}
	return names, nil
}

// HaveZeroDelivered succeeds when nothing that the selected probes sent inside the
// window was delivered: no serve probe received one of their requests or datagrams,
// no connect attempt and no stream opened, no echo came back. It is the invariant of
// a flow that policy denies. With OnBackends only what those backends received or
// answered counts: nothing reaches a backend a Service no longer has. Options: Probes
// (the senders), To (destination labels or addresses), OnBackends, Grace, Context,
// From, SendersMayStop.
func HaveZeroDelivered(opts ...Option) Matcher {
	return newMatcher("nothing delivered", KindDelivered, opts, func(w timeline.Window, o options) (outcome, error) {
		from, err := senders(w, o, probe.RoleConnect, probe.RoleStream, probe.RoleUDP)
		if err != nil {
			return outcome{}, err
		}
		if err := receivers(w, o); err != nil {
			return outcome{}, err
		}
		type key struct {
			from  string
			proto string
			seq   uint64
		}
		delivered := map[key]probe.Event{}
		sent := 0
		for _, e := range w.Inside() {
			if !o.toSelected(e.Target) {
				continue
			}
			// A request a backend outside OnBackends received or answered is not
			// counted; the attempt is still one that was sent.
			at := o.streamSelected(e.Backend)
			switch {
			case e.Kind == probe.KindRecv && from[e.From] && at:
				proto := e.Proto
				if proto == "tcp" {
					proto = "attempt"
				}
				k := key{e.From, proto, e.Seq}
				if _, ok := delivered[k]; !ok {
					delivered[k] = e
				}
			case !from[e.Probe]:
			case e.Kind == probe.KindAttempt && e.Outcome != probe.Skipped:
				sent++
				if e.Outcome == probe.OK && at {
					delivered[key{e.Probe, "attempt", e.Seq}] = e
				}
			case e.Kind == probe.KindOpen:
				sent++
				if e.Outcome == probe.OK && at {
					delivered[key{e.Probe, "open", uint64(e.Stream)}] = e
				}
			case e.Kind == probe.KindEcho && at:
				delivered[key{e.Probe, fmt.Sprintf("echo %d", e.Stream), e.Seq}] = e
			case e.Kind == probe.KindSent:
				sent++
			}
		}
		if sent == 0 {
			return outcome{}, fmt.Errorf("the senders sent nothing inside the window: a flow that is never tried is not shown to be denied")
		}
		n := 0
		var all []probe.Event
		for _, e := range delivered {
			if e.Kind == probe.KindEcho {
				n += e.Count
			} else {
				n++
			}
			all = append(all, e)
		}
		to := ""
		if len(o.onBackends) > 0 {
			to = " to " + strings.Join(o.onBackends, " or ")
		}
		out := outcome{verdict: Pass, figures: []Figure{
			{Name: "delivered", Value: float64(n), Unit: "requests", Of: sent, Budget: budget(0),
				Text: fmt.Sprintf("%d of %d requests delivered%s (budget 0)", n, sent, to)},
		}}
		if n == 0 {
			return out, nil
		}
		sort.Slice(all, func(i, j int) bool { return all[i].Time < all[j].Time })
		first := all[0]
		out.verdict, out.at = Violation, first.Time
		for _, e := range all {
			m := markOf(e, KindDelivered)
			if e.Kind == probe.KindRecv {
				m.Probe, m.Stream = e.From, 0
			}
			out.marks = append(out.marks, m)
		}
		who := first.Probe
		if first.Kind == probe.KindRecv {
			who = first.From
		}
		out.first = fmt.Sprintf("from probe %s, sent %s: %s", who, w.Relative(first.Time), timeline.Describe(first))
		var b strings.Builder
		b.WriteString("Timeline around it:\n")
		b.WriteString(w.Excerpt(first.Time, o.context, o.context, func(e probe.Event) bool {
			return e.Kind == first.Kind && e.Time == first.Time && e.Seq == first.Seq && e.Probe == first.Probe
		}))
		out.detail = b.String()
		return out, nil
	})
}

// DeliverToOnceDeliveredTo succeeds when, once any datagram to the control
// destination is delivered, every datagram to target sent after it is delivered too:
// the new sender is not live on the dataplane while the target's policy does not yet
// know it. "After" is by sequence number: the udp probe numbers its datagrams across
// all destinations. A target datagram that could not even be sent counts as lost.
// Each sender is judged on its own first delivery to control, and each must have one:
// when a sender has no datagram to control delivered in the window the precondition
// fails (its silence on target would prove nothing). Options: Probes (the udp
// senders), Grace, Context, SendersMayStop.
func DeliverToOnceDeliveredTo(target, control string, opts ...Option) Matcher {
	what := fmt.Sprintf("every datagram to %s delivered once one to %s is", target, control)
	return newMatcher(what, KindLost, opts, func(w timeline.Window, o options) (outcome, error) {
		from, err := senders(w, o, probe.RoleUDP)
		if err != nil {
			return outcome{}, err
		}
		if err := receivers(w, o); err != nil {
			return outcome{}, err
		}
		type key struct {
			from string
			seq  uint64
		}
		got := map[key]probe.Event{}
		for _, e := range w.Events {
			if e.Kind == probe.KindRecv && from[e.From] && (e.Target == target || e.Target == control) {
				got[key{e.From, e.Seq}] = e
			}
		}
		firstCtl := map[string]probe.Event{}
		var toTarget []probe.Event
		sentCtl := map[string]int{}
		// A sender whose first datagrams were dropped was seen opening; one whose
		// first datagram was delivered was live before it sent (its dataplane was
		// quicker than its probe), so only its later datagrams are judged. A sender's
		// datagrams come in sequence, so one undelivered before its first delivered
		// control datagram is seen here.
		closed := map[string]bool{}
		for _, e := range w.Inside() {
			if e.Kind != probe.KindSent || !from[e.Probe] || (e.Target != target && e.Target != control) {
				continue
			}
			_, delivered := got[key{e.Probe, e.Seq}]
			if _, seen := firstCtl[e.Probe]; !seen && !delivered {
				closed[e.Probe] = true
			}
			switch e.Target {
			case control:
				sentCtl[e.Probe]++
				if _, seen := firstCtl[e.Probe]; delivered && !seen {
					firstCtl[e.Probe] = e
				}
			case target:
				toTarget = append(toTarget, e)
			}
		}
		if len(firstCtl) < len(from) {
			var silent []string
			sent := 0
			for _, name := range slices.Sorted(maps.Keys(from)) {
				if _, ok := firstCtl[name]; !ok {
					silent = append(silent, name)
					sent += sentCtl[name]
				}
			}
			who := ""
			if len(from) > 1 {
				who = " from " + strings.Join(silent, ", ")
			}
			return outcome{verdict: Precondition, figures: []Figure{
				{Name: "control_delivered", Value: 0, Unit: "datagrams", Of: sent,
					Text: fmt.Sprintf("0 of %d datagrams%s to %s delivered", sent, who, control)},
			}, first: fmt.Sprintf("no datagram%s to %s was delivered in the window (%d sent): the ordering cannot be shown", who, control, sent)}, nil
		}
		var after, lost []probe.Event
		before, beforeOK := 0, 0
		for _, e := range toTarget {
			c, ok := firstCtl[e.Probe]
			_, delivered := got[key{e.Probe, e.Seq}]
			if !ok || e.Seq < c.Seq {
				before++
				if delivered {
					beforeOK++
				}
				continue
			}
			after = append(after, e)
			if !delivered {
				lost = append(lost, e)
			}
		}
		var firstOf probe.Event
		for _, c := range firstCtl {
			if firstOf.Time == 0 || c.Time < firstOf.Time {
				firstOf = c
			}
		}
		out := outcome{verdict: Pass, figures: []Figure{
			{Name: "lost_after_control", Value: float64(len(lost)), Unit: "datagrams", Of: len(after), Budget: budget(0),
				Text: fmt.Sprintf("%d of %d datagrams to %s sent after the first delivery to %s were lost (budget 0)", len(lost), len(after), target, control)},
			{Name: "delivered_before_control", Value: float64(beforeOK), Unit: "datagrams", Of: before,
				Text: fmt.Sprintf("%d of %d datagrams to %s sent before it were delivered; the first delivered to %s was #%d from %s, sent %s",
					beforeOK, before, target, control, firstOf.Seq, firstOf.Probe, w.Relative(firstOf.Time))},
			{Name: "openings_seen", Value: float64(len(closed)), Unit: "senders", Of: len(from),
				Text: fmt.Sprintf("%d of %d senders were seen opening (datagrams dropped before their first delivery to %s); the others were live from their first datagram", len(closed), len(from), control)},
		}}
		if len(lost) == 0 {
			return out, nil
		}
		l := lost[0]
		c := firstCtl[l.Probe]
		out.verdict, out.at = Violation, l.Time
		for _, e := range lost {
			out.marks = append(out.marks, markOf(e, KindLost))
		}
		how := "was never delivered"
		if l.Outcome != probe.OK {
			how = fmt.Sprintf("could not be sent: %s (%s)", strings.ToUpper(string(l.Outcome)), l.Err)
		}
		out.first = fmt.Sprintf("datagram #%d from %s to %s, sent %s, %s after #%d to %s which was delivered, %s",
			l.Seq, l.Probe, target, w.Relative(l.Time), fmtMs(l.Time.Sub(c.Time)), c.Seq, control, how)
		var b strings.Builder
		b.WriteString("Timeline around it:\n")
		b.WriteString(w.Excerpt(l.Time, o.context, o.context, func(e probe.Event) bool {
			return e.Kind == probe.KindSent && e.Probe == l.Probe && (e.Seq == l.Seq || e.Seq == c.Seq)
		}))
		b.WriteString("Lost:\n")
		b.WriteString(lostRuns(w, lost))
		out.detail = b.String()
		return out, nil
	})
}

// lostRuns lists lost datagrams in runs of consecutive ones (every len(To)-th sequence
// number of one sender goes to the same destination).
func lostRuns(w timeline.Window, lost []probe.Event) string {
	const maxRuns = 12
	var b strings.Builder
	runs := 0
	for i := 0; i < len(lost); {
		j := i
		for j+1 < len(lost) && lost[j+1].Probe == lost[i].Probe && lost[j+1].Seq-lost[j].Seq <= 2 && lost[j+1].Outcome == lost[i].Outcome {
			j++
		}
		if runs == maxRuns {
			fmt.Fprintf(&b, "  ... and more, %d datagrams in all\n", len(lost))
			break
		}
		runs++
		how := "not delivered"
		if lost[i].Outcome != probe.OK {
			how = "NOT SENT: " + strings.ToUpper(string(lost[i].Outcome))
		}
		fmt.Fprintf(&b, "  %s #%d..#%d (%d) %s, sent from %s to %s\n", lost[i].Probe, lost[i].Seq, lost[j].Seq, j-i+1, how,
			w.Relative(lost[i].Time), w.Relative(lost[j].Time))
		i = j + 1
	}
	return b.String()
}
