package conformance

import (
	"testing"

	"github.com/dpconform/dpconform/fv/monotime"
	"github.com/dpconform/dpconform/fv/probe"
)

// A step that waits on a Streak (NODE-ADDRESS-CHANGE's, SVC-ENDPOINT-CHURN's) must see one only
// where HaveServedWithin will: consecutive attempts in the order they started, all
// started after the address was added, although they are reported as they end.
func TestStreak(t *testing.T) {
	const since = monotime.Time(1000)
	attempt := func(seq uint64, o probe.Outcome) probe.Event {
		ev := probe.Event{Kind: probe.KindAttempt, Probe: "p", Seq: seq, Time: since + monotime.Time(seq), Outcome: o}
		if o == probe.OK {
			ev.Backend = "web"
		}
		return ev
	}
	run := func(events []probe.Event) (fired bool) {
		w := NewStreak("p", 3, "web")
		w.Observe(attempt(1, probe.OK)) // before it is armed: ignored
		w.Arm(since)
		for _, ev := range events {
			w.Observe(ev)
		}
		select {
		case <-w.done:
			return true
		default:
			return false
		}
	}
	for _, c := range []struct {
		name   string
		events []probe.Event
		want   bool
	}{
		{"three in a row", []probe.Event{attempt(2, probe.OK), attempt(3, probe.OK), attempt(4, probe.OK)}, true},
		{"reported out of order", []probe.Event{attempt(2, probe.OK), attempt(4, probe.OK), attempt(3, probe.OK)}, true},
		// The bug this test is for: a timeout reported after the attempts around it
		// breaks the streak where it started.
		{"a late timeout in the middle", []probe.Event{attempt(2, probe.OK), attempt(4, probe.OK), attempt(5, probe.OK), attempt(3, probe.Timeout)}, false},
		{"a late timeout, then three more", []probe.Event{attempt(2, probe.OK), attempt(4, probe.OK), attempt(5, probe.OK), attempt(3, probe.Timeout), attempt(6, probe.OK)}, true},
		{"a wrong backend breaks it", []probe.Event{attempt(2, probe.OK), {Kind: probe.KindAttempt, Probe: "p", Seq: 3, Time: since + 3, Outcome: probe.OK, Backend: "other"}, attempt(4, probe.OK)}, false},
		{"another probe's attempts do not count", []probe.Event{attempt(2, probe.OK), {Kind: probe.KindAttempt, Probe: "q", Seq: 3, Time: since + 3, Outcome: probe.OK, Backend: "web"}, attempt(4, probe.OK)}, false},
		{"started before it was armed", []probe.Event{{Kind: probe.KindAttempt, Probe: "p", Seq: 2, Time: since - 1, Outcome: probe.OK, Backend: "web"}, attempt(3, probe.OK), attempt(4, probe.OK)}, false},
	} {
		if got := run(c.events); got != c.want {
			t.Errorf("%s: fired %v, want %v", c.name, got, c.want)
		}
	}
}
