package record

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

	"github.com/dpconform/dpconform/conformance"
	"github.com/dpconform/dpconform/fv/matchers"
	"github.com/dpconform/dpconform/fv/monotime"
	"github.com/dpconform/dpconform/fv/probe"
	"github.com/dpconform/dpconform/fv/timeline"
)

// lane kinds, by the events that draw them.
const (
	roleConnect = "connect"
	roleStream  = "stream"
	roleUDP     = "udp"
	roleServe   = "server"
	roleReach   = "reach"
	roleVerdict = "verdicts"
)

// laneData gathers one lane's events in the chart's range.
type laneData struct {
	key     string // probe name, or "verdicts node-a"
	role    string
	first   monotime.Time
	events  []probe.Event
	target  string
	streams map[int]bool
	verdict []timeline.Verdict
}

// maxLanes bounds the lanes of a chart: a page stays readable, and the lanes left
// out are named under it.
const maxLanes = 24

func roleOrder(r string) int {
	return map[string]int{roleConnect: 0, roleStream: 0, roleUDP: 0, roleReach: 0, roleServe: 1, roleVerdict: 2}[r]
}

func markLane(m matchers.Mark) string {
	if m.Node != "" {
		return roleVerdict + " " + m.Node
	}
	return m.Probe
}

// gatherLanes collects, per probe (and per node for verdicts), the events that touch
// [x0, x1].
func gatherLanes(tr *conformance.TimelineRecord, x0, x1 monotime.Time) []*laneData {
	by := map[string]*laneData{}
	var order []*laneData
	get := func(key, role string, t monotime.Time) *laneData {
		l := by[key]
		if l == nil {
			l = &laneData{key: key, role: role, first: t, streams: map[int]bool{}}
			by[key] = l
			order = append(order, l)
		}
		return l
	}
	for _, e := range tr.Events {
		end := max(e.Time, e.End)
		if end < x0 || e.Time > x1 {
			continue
		}
		var role string
		switch e.Kind {
		case probe.KindAttempt, probe.KindHeld:
			role = roleConnect
		case probe.KindOpen, probe.KindEcho, probe.KindGap, probe.KindEnd:
			role = roleStream
		case probe.KindSent, probe.KindReply:
			role = roleUDP
		case probe.KindRecv:
			role = roleServe
		case probe.KindReach:
			role = roleReach
		default:
			continue
		}
		l := get(e.Probe, role, e.Time)
		l.events = append(l.events, e)
		if e.Stream > 0 {
			l.streams[e.Stream] = true
		}
		if l.target == "" && e.Kind != probe.KindRecv {
			l.target = e.Target
		}
	}
	for _, v := range tr.Verdicts {
		if v.Time < x0 || v.Time > x1 {
			continue
		}
		l := get(roleVerdict+" "+v.Node, roleVerdict, v.Time)
		l.verdict = append(l.verdict, v)
	}
	return order
}

// outcomeClass names how an attempt, a stream's open or end, or a datagram's answer
// went, for its colour.
func outcomeClass(o probe.Outcome) string {
	switch o {
	case probe.OK, "":
		return "ok"
	case probe.Reset, probe.Refused:
		return "reset"
	case probe.Timeout:
		return "timeout"
	case probe.Unreachable:
		return "unreachable"
	}
	return "other"
}

// colRun is a run of consecutive pixel columns [from, to] and what they count.
type colRun struct{ from, to, n int }

// runsOf merges the columns present in counts (a column may count 0: it is covered by
// a span that started before it) into runs, with their sums.
func runsOf(counts map[int]int) []colRun {
	cols := make([]int, 0, len(counts))
	for c := range counts {
		cols = append(cols, c)
	}
	slices.Sort(cols)
	var out []colRun
	for _, c := range cols {
		if len(out) > 0 && out[len(out)-1].to >= c-1 {
			out[len(out)-1].to = c
			out[len(out)-1].n += counts[c]
			continue
		}
		out = append(out, colRun{c, c, counts[c]})
	}
	return out
}

func drawLane(l *laneData, s scale, rel timeline.Window, y int) laneView {
	lv := laneView{Name: l.key, Role: l.role, Y: y}
	h := 28
	streams := make([]int, 0, len(l.streams))
	for id := range l.streams {
		streams = append(streams, id)
	}
	slices.Sort(streams)
	if l.role == roleStream {
		h = max(28, 8+4*len(streams))
	}
	lv.H = h
	top := y + breachStrip
	body := h - breachStrip
	lv.MidY = top + body/2
	lv.NameY, lv.SubY = lv.MidY-1, lv.MidY+10
	lv.Label = l.key
	switch l.role {
	case roleConnect:
		lv.Sub = "new connections"
	case roleStream:
		lv.Sub = fmt.Sprintf("%d %s", len(streams), plural(len(streams), "stream", "streams"))
	case roleUDP:
		lv.Sub = "datagrams"
	case roleServe:
		lv.Sub = "server: what it received"
	case roleReach:
		lv.Sub = "reachability"
	case roleVerdict:
		lv.Sub = "policy verdicts"
	}
	if l.target != "" {
		lv.Sub += " to " + l.target
	}
	lv.Title = lv.Label + ": " + lv.Sub

	count := func(format string) func(int) string {
		return func(n int) string { return fmt.Sprintf(format, n) }
	}
	// okBand and failure blocks for per-event outcomes bucketed by column.
	bucket := func(events []probe.Event, class func(probe.Event) string) map[string]map[int]int {
		out := map[string]map[int]int{}
		for _, e := range events {
			c := class(e)
			if c == "" {
				continue
			}
			if out[c] == nil {
				out[c] = map[int]int{}
			}
			out[c][s.col(e.Time)]++
		}
		return out
	}
	drawBuckets := func(b map[string]map[int]int, noun string, failClass string) {
		kinds := make([]string, 0, len(b))
		for k := range b {
			kinds = append(kinds, k)
		}
		slices.Sort(kinds)
		// Successes first, failures over them.
		slices.SortStableFunc(kinds, func(a, b string) int { return cmp.Compare(boolInt(a != "ok"), boolInt(b != "ok")) })
		for _, k := range kinds {
			if k == "ok" {
				lv.Rects = append(lv.Rects, s.marksOf(rel, runsOf(b[k]), lv.MidY-3, 6, "ok", "ok", count("%d "+noun+" ok"))...)
				continue
			}
			lv.Rects = append(lv.Rects, s.marksOf(rel, runsOf(b[k]), top+1, body-2, "fail "+failClass+" k-"+k, k, count("%d "+noun+" "+strings.ToUpper(k)))...)
		}
	}

	switch l.role {
	case roleConnect, roleReach:
		drawBuckets(bucket(l.events, func(e probe.Event) string {
			if e.Kind != probe.KindAttempt && e.Kind != probe.KindReach {
				return ""
			}
			return outcomeClass(e.Outcome)
		}), plural(2, "attempt", "attempts"), "attempt")
		// A held connection that was lost when the probe checked it is marked where
		// it was opened: that is the moment whose flows the implementation lost.
		// (Those that held were counted ok as attempts already.)
		drawBuckets(bucket(l.events, func(e probe.Event) string {
			if e.Kind != probe.KindHeld || e.Outcome == probe.OK {
				return ""
			}
			return outcomeClass(e.Outcome)
		}), "held connections, lost:", "attempt held")
	case roleUDP:
		replies := map[uint64]probe.Event{}
		for _, e := range l.events {
			if e.Kind == probe.KindReply {
				replies[e.Seq] = e
			}
		}
		// A probe that does not ask for answers reports none: its datagrams are
		// only sent, and what reached a server shows on that server's lane.
		withReplies := len(replies) > 0
		b := bucket(l.events, func(e probe.Event) string {
			r, answered := replies[e.Seq]
			switch {
			case e.Kind != probe.KindSent:
				return ""
			case e.Outcome != probe.OK:
				return "other"
			case !withReplies:
				return "sent"
			case !answered:
				return "unanswered"
			case r.Outcome != probe.OK:
				return "other"
			}
			return "ok"
		})
		lv.Rects = append(lv.Rects, s.marksOf(rel, runsOf(b["sent"]), lv.MidY-3, 6, "sent", "sent", count("%d datagrams sent"))...)
		lv.Rects = append(lv.Rects, s.marksOf(rel, runsOf(b["unanswered"]), lv.MidY-4, 8, "unanswered", "unanswered", count("%d datagrams not answered"))...)
		delete(b, "sent")
		delete(b, "unanswered")
		drawBuckets(b, "datagrams", "datagram")
	case roleServe:
		counts := map[int]int{}
		for _, e := range l.events {
			counts[s.col(e.Time)]++
		}
		lv.Rects = append(lv.Rects, s.marksOf(rel, runsOf(counts), lv.MidY-3, 6, "recv", "recv", count("%d requests received (by when they were sent)"))...)
	case roleVerdict:
		deny, allow := map[int]int{}, map[int]int{}
		for _, v := range l.verdict {
			if v.Verdict == "deny" {
				deny[s.col(v.Time)]++
			} else {
				allow[s.col(v.Time)]++
			}
		}
		lv.Rects = append(lv.Rects, s.marksOf(rel, runsOf(allow), lv.MidY-3, 6, "allow", "allow", count("%d allow verdicts"))...)
		lv.Rects = append(lv.Rects, s.marksOf(rel, runsOf(deny), top+1, body-2, "fail verdict k-deny", "deny", count("%d deny verdicts"))...)
	case roleStream:
		rowH := max(3, (body-2)/max(1, len(streams)))
		rowOf := map[int]int{}
		for i, id := range streams {
			rowOf[id] = top + 1 + i*rowH
		}
		// Echoes are summaries over periods: draw the union of their periods.
		alive := map[int]map[int]int{}
		for _, e := range l.events {
			switch {
			case e.Kind == probe.KindEcho:
				if alive[e.Stream] == nil {
					alive[e.Stream] = map[int]int{}
				}
				for c := s.col(e.Time); c <= s.col(e.End); c++ {
					alive[e.Stream][c]++
				}
			case e.Kind == probe.KindOpen && e.Outcome != probe.OK,
				e.Kind == probe.KindEnd && e.Outcome != probe.Stopped:
				k := outcomeClass(e.Outcome)
				if e.Outcome == probe.Closed {
					k = "closed"
				}
				what := "stream %d ENDED: %s"
				if e.Kind == probe.KindOpen {
					what = "stream %d failed to open: %s"
				}
				r := colRun{s.col(e.Time), s.col(e.Time), 1}
				text := fmt.Sprintf(what, e.Stream, strings.ToUpper(string(e.Outcome)))
				lv.Rects = append(lv.Rects, s.marksOf(rel, []colRun{r}, rowOf[e.Stream]-1, rowH+2, "fail stream k-"+k, k, func(int) string { return text })...)
			}
		}
		for _, id := range streams {
			runs := runsOf(alive[id])
			for i := range runs {
				runs[i].n = 0 // echo periods, not a count of anything
			}
			text := fmt.Sprintf("stream %d echoing", id)
			lv.Rects = append(s.marksOf(rel, runs, rowOf[id], max(2, rowH-1), "ok", "ok", func(int) string { return text }), lv.Rects...)
		}
	}
	return lv
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

// drawBreaches marks a failed check's marks on the strip above their lanes.
func drawBreaches(c chartCheck, s scale, rel timeline.Window, lanes map[string]*laneView) {
	type key struct {
		lane string
		kind matchers.Kind
	}
	cols := map[key]map[int]int{}
	var order []key
	for _, m := range c.Marks {
		if m.Time > s.x1 || max(m.End, m.Time) < s.x0 {
			continue
		}
		k := key{markLane(m), m.Kind}
		if lanes[k.lane] == nil {
			continue
		}
		if cols[k] == nil {
			cols[k] = map[int]int{}
			order = append(order, k)
		}
		from, to := s.col(max(m.Time, s.x0)), s.col(max(m.Time, s.x0))
		if m.End > m.Time {
			to = s.col(m.End)
		}
		cols[k][from]++
		// A span covers its columns without counting in them.
		for col := from + 1; col <= to; col++ {
			if _, ok := cols[k][col]; !ok {
				cols[k][col] = 0
			}
		}
	}
	for _, k := range order {
		l := lanes[k.lane]
		what := func(n int) string { return fmt.Sprintf("check %d, %s: %d in breach (%s)", c.Num, c.Name, n, k.kind) }
		for _, m := range s.marksOf(rel, runsOf(cols[k]), l.Y, breachStrip-1, "breach", string(k.kind), what) {
			m.Check = fmt.Sprint(c.Num)
			l.Rects = append(l.Rects, m)
		}
	}
}
