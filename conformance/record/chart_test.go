package record

import (
	"slices"
	"testing"
	"time"

	"github.com/dpconform/dpconform/conformance"
	"github.com/dpconform/dpconform/fv/matchers"
	"github.com/dpconform/dpconform/fv/monotime"
	"github.com/dpconform/dpconform/fv/probe"
	"github.com/dpconform/dpconform/fv/timeline"
)

const ms = monotime.Time(time.Millisecond)

// A scenario of every lane kind: a stream probe whose stream 2 is reset after a gap,
// a UDP probe with answers and a run of unanswered datagrams, a server, and a node's
// policy verdicts; two failed checks mark a gap (a span) and deny verdicts.
func chartScenario() (conformance.TimelineRecord, conformance.ScenarioRecord, []chartCheck) {
	tr := conformance.TimelineRecord{Format: conformance.DataFormat, ID: "X", Run: 1}
	add := func(e probe.Event) { tr.Events = append(tr.Events, e) }
	for s := 1; s <= 2; s++ {
		add(probe.Event{Time: 100 * ms, Kind: probe.KindOpen, Probe: "st", Stream: s, Outcome: probe.OK, Target: "10.96.0.1:80"})
	}
	for t := monotime.Time(100); t < 4000; t += 100 {
		add(probe.Event{Time: t * ms, End: (t + 95) * ms, Kind: probe.KindEcho, Probe: "st", Stream: 1, Count: 20, Backend: "b"})
		if t < 2000 {
			add(probe.Event{Time: t * ms, End: (t + 95) * ms, Kind: probe.KindEcho, Probe: "st", Stream: 2, Count: 20, Backend: "b"})
		}
	}
	add(probe.Event{Time: 2600 * ms, Kind: probe.KindEnd, Probe: "st", Stream: 2, Outcome: probe.Reset, Backend: "b"})
	for seq := uint64(1); seq <= 1900; seq++ {
		t := monotime.Time(100+seq*2) * ms
		add(probe.Event{Time: t, Kind: probe.KindSent, Probe: "udp", Seq: seq, Outcome: probe.OK, Target: "S"})
		if seq < 900 || seq > 1000 {
			add(probe.Event{Time: t, End: t + ms, Kind: probe.KindReply, Probe: "udp", Seq: seq, Outcome: probe.OK, Backend: "s"})
			add(probe.Event{Time: t, End: t + ms/2, Kind: probe.KindRecv, Probe: "srv", Seq: seq, From: "udp", Proto: "udp", Backend: "s"})
		}
	}
	for t := monotime.Time(1900); t < 2000; t += 10 {
		tr.Verdicts = append(tr.Verdicts, timeline.Verdict{Time: t * ms, Node: "node-a", Verdict: "deny", Src: "10.244.0.5", Dst: "10.244.0.7"})
	}
	tr.Transitions = []timeline.Transition{{Time: 1000 * ms, Name: "stop-sent", Detail: "node-a"}, {Time: 1010 * ms, Name: "exited", Detail: "node-a"},
		{Time: 1020 * ms, Name: "start-sent", Detail: "node-a"}, {Time: 1900 * ms, Name: "ready", Detail: "node-a"}}
	sc := conformance.ScenarioRecord{From: 50 * ms, SteadyStart: 60 * ms, SteadyEnd: 900 * ms, Start: 100 * ms, End: 4000 * ms}
	checks := []chartCheck{
		{Num: 1, Name: "gaps within budget", Kind: matchers.KindGap, At: 2000 * ms, Total: 1,
			Marks: []matchers.Mark{{Probe: "st", Stream: 2, Time: 2000 * ms, End: 4000 * ms, Kind: matchers.KindGap}}},
		{Num: 2, Name: "no deny verdict", Kind: matchers.KindVerdict, At: 1900 * ms, Total: 10},
	}
	for t := monotime.Time(1900); t < 2000; t += 10 {
		checks[1].Marks = append(checks[1].Marks, matchers.Mark{Node: "node-a", Time: t * ms, Kind: matchers.KindVerdict})
	}
	return tr, sc, checks
}

func TestChartOfEveryLaneKind(t *testing.T) {
	tr, sc, checks := chartScenario()
	cv := buildChart("X-s1", "overview", "t", &tr, sc, checks, sc.From, sc.End)
	var lanes []string
	byName := map[string]laneView{}
	for _, l := range cv.Lanes {
		lanes = append(lanes, l.Name+"/"+l.Role)
		byName[l.Name] = l
	}
	if want := []string{"st/stream", "udp/udp", "srv/server", "verdicts node-a/verdicts"}; !slices.Equal(lanes, want) {
		t.Fatalf("lanes %v, want %v", lanes, want)
	}
	count := func(l laneView, class string) (marks, n int) {
		for _, r := range l.Rects {
			if r.Class == class {
				marks++
				n += r.N
			}
		}
		return marks, n
	}
	if _, n := count(byName["udp"], "unanswered"); n != 101 {
		t.Errorf("%d datagrams drawn unanswered, want 101 (#900..#1000)", n)
	}
	if m, n := count(byName["st"], "fail stream k-reset"); m != 1 || n != 1 {
		t.Errorf("the reset of stream 2: %d marks of %d, want one", m, n)
	}
	if _, n := count(byName["verdicts node-a"], "fail verdict k-deny"); n != 10 {
		t.Errorf("%d deny verdicts drawn, want 10", n)
	}
	if _, n := count(byName["verdicts node-a"], "breach"); n != 10 {
		t.Errorf("%d verdicts marked in breach, want 10", n)
	}
	// A span (the gap) is one mark reaching to the window's end, counted once.
	if m, n := count(byName["st"], "breach"); m != 1 || n != 1 {
		t.Errorf("the gap's breach: %d marks of %d, want one of 1", m, n)
	}
	var events []string
	for _, e := range cv.Events {
		events = append(events, e.Name)
	}
	if !slices.Equal(events, []string{"stop-sent", "exited", "start-sent", "ready"}) {
		t.Errorf("events %v", events)
	}
	if len(cv.Firsts) != 2 || cv.Firsts[0].Num != 2 || cv.Firsts[1].Num != 1 {
		t.Errorf("first violations %+v, want check 2's (at ready) then check 1's", cv.Firsts)
	}
	if len(cv.Bands) != 2 {
		t.Errorf("bands %+v, want the steady state and the checked window", cv.Bands)
	}

	// The close-up of the first violation: the deny verdicts from ready on, with the
	// transition event before them in it.
	z0, z1, ok := zoomRange(checks, sc, sc.From, sc.End, &tr)
	if !ok || z0 > 1900*ms || z1 < 1990*ms || z1-z0 > monotime.Time(time.Second) {
		t.Errorf("zoom %v..%v (%v), want a close-up around 1.9 s to 2.0 s", z0, z1, ok)
	}
}

// Held connections (Connect.Hold, the Upgrade profile): one lost when the probe
// checked it is a failure mark where it was opened; one that held adds nothing to the
// attempts that already counted it ok.
func TestChartOfHeldConnections(t *testing.T) {
	tr := conformance.TimelineRecord{Format: conformance.DataFormat, ID: "X", Run: 1}
	for seq := uint64(1); seq <= 100; seq++ {
		at := monotime.Time(100+seq*10) * ms
		tr.Events = append(tr.Events,
			probe.Event{Time: at, Kind: probe.KindAttempt, Probe: "c", Seq: seq, Outcome: probe.OK, Target: "10.96.0.1:80", Backend: "b"})
		held := probe.Event{Time: at, End: 3000 * ms, Kind: probe.KindHeld, Probe: "c", Seq: seq, Outcome: probe.OK, Target: "10.96.0.1:80", Backend: "b"}
		if seq == 50 || seq == 51 {
			held.Outcome, held.Backend = probe.Reset, ""
		}
		tr.Events = append(tr.Events, held)
	}
	sc := conformance.ScenarioRecord{From: 50 * ms, SteadyStart: 60 * ms, SteadyEnd: 500 * ms, Start: 100 * ms, End: 3000 * ms}
	cv := buildChart("X-s1", "overview", "t", &tr, sc, nil, sc.From, sc.End)
	if len(cv.Lanes) != 1 || cv.Lanes[0].Role != roleConnect {
		t.Fatalf("lanes %+v, want one connect lane", cv.Lanes)
	}
	var lost, ok int
	for _, r := range cv.Lanes[0].Rects {
		switch r.Class {
		case "fail attempt held k-reset":
			lost += r.N
		case "ok":
			ok += r.N
		}
	}
	if lost != 2 || ok != 100 {
		t.Errorf("%d held connections drawn lost, %d attempts ok: want 2 and 100", lost, ok)
	}
}
