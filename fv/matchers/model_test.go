package matchers_test

import (
	"testing"
	"time"

	"github.com/dpconform/dpconform/fv/matchers"
	"github.com/dpconform/dpconform/fv/monotime"
	"github.com/dpconform/dpconform/fv/probe"
	"github.com/dpconform/dpconform/fv/timeline"
)

// pod-a serves throughout; pod-b is the Service's until 2.2 s (start-sent), and the
// model gives a change 500 ms to be programmed.
func podBLeaves(probeName string, t monotime.Time, slack time.Duration) []string {
	if probeName != "x" {
		return nil
	}
	if t.Add(-500*time.Millisecond-slack) <= at(2200) {
		return []string{"pod-a", "pod-b"}
	}
	return []string{"pod-a"}
}

// answeredBy adds attempts every 2 ms from 500 ms to 6 s, answered by who(ms).
func answeredBy(who func(ms float64) string) func(tl *timeline.Timeline) {
	return func(tl *timeline.Timeline) {
		lifecycle(tl, "x", probe.RoleConnect, 400, 6000)
		seq := uint64(0)
		for ms := 500.0; ms < 6000; ms += 2 {
			seq++
			tl.Add(probe.Event{Time: at(ms), Kind: probe.KindAttempt, Probe: "x", Seq: seq, Outcome: probe.OK, Latency: 300 * time.Microsecond, Target: "10.0.0.1:80", Backend: who(ms)})
		}
	}
}

func TestHaveAnswersAsModelled(t *testing.T) {
	alternate := func(until float64) func(ms float64) string {
		return func(ms float64) string {
			if int(ms/2)%2 == 0 && ms < until {
				return "pod-b"
			}
			return "pod-a"
		}
	}
	run(t, []check{{
		name:    "passes when the backend that left answers nothing new after its budget",
		build:   answeredBy(alternate(2700)),
		matcher: func() matchers.Matcher { return matchers.HaveAnswersAsModelled(podBLeaves, matchers.Probes("x")) },
		pass:    true, verdict: matchers.Pass, figure: "unmodelled_answers", figureVal: 0,
	}, {
		name:    "fails, as wrong-backend, when it still answers after its budget",
		build:   answeredBy(alternate(3000)),
		matcher: func() matchers.Matcher { return matchers.HaveAnswersAsModelled(podBLeaves, matchers.Probes("x")) },
		verdict: matchers.Violation, kind: matchers.KindWrongBackend, figure: "unmodelled_answers", figureVal: 74,
		contains: []string{"First violation: probe x, started 204.0 ms after ready: attempt #1103 to 10.0.0.1:80 answered by pod-b, which the model did not allow then (allowed: pod-a)", "x #1103 answered by pod-b, started 204.0 ms after ready"},
	}, {
		name:  "allows the clocks' uncertainty on top of the budget",
		build: answeredBy(alternate(3000)),
		matcher: func() matchers.Matcher {
			return matchers.HaveAnswersAsModelled(podBLeaves, matchers.Probes("x"), matchers.ClockUncertainty(300*time.Millisecond))
		},
		pass: true, verdict: matchers.Pass,
	}, {
		name:     "is an instrument error when its probe is blind",
		build:    func(tl *timeline.Timeline) { lifecycle(tl, "x", probe.RoleConnect, 400, 6000) },
		matcher:  func() matchers.Matcher { return matchers.HaveAnswersAsModelled(podBLeaves, matchers.Probes("x")) },
		verdict:  matchers.Instrument,
		contains: []string{"started no attempt", "blind"},
	}})
}
