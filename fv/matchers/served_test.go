package matchers_test

import (
	"testing"
	"time"

	"github.com/dpconform/dpconform/fv/matchers"
	"github.com/dpconform/dpconform/fv/probe"
	"github.com/dpconform/dpconform/fv/timeline"
)

// addressChange is the synthetic NODE-ADDRESS-CHANGE: an address added at 2 s and
// removed at 2.5 s (inside the window of 1 s to 5.5 s), and a probe "x" to it whose
// attempts end as outcome says.
func addressChange(outcome func(ms float64) probe.Outcome) func(*timeline.Timeline) {
	return func(tl *timeline.Timeline) {
		tl.RecordAt(at(2000), "address-added", "")
		tl.RecordAt(at(2500), "address-removed", "")
		connects(tl, "x", outcome)
	}
}

// servedFrom answers from fromMs until untilMs, refuses from the address's addition
// until then, and times out before and after.
func servedFrom(fromMs, untilMs float64) func(float64) probe.Outcome {
	return func(ms float64) probe.Outcome {
		switch {
		case ms < 2000 || ms >= untilMs:
			return probe.Timeout
		case ms < fromMs:
			return probe.Refused
		}
		return probe.OK
	}
}

func TestHaveServedWithin(t *testing.T) {
	served := func(opts ...matchers.Option) func() matchers.Matcher {
		return func() matchers.Matcher {
			return matchers.HaveServedWithin("address-added", time.Second, 20, append([]matchers.Option{matchers.Probes("x")}, opts...)...)
		}
	}
	run(t, []check{{
		name:    "passes when served soon after the event, whatever failed before it",
		build:   addressChange(servedFrom(2010, 2500)),
		matcher: served(),
		pass:    true, verdict: matchers.Pass, figure: "time_to_serve", figureVal: 10,
		contains: []string{"served 10.0 ms after address-added", "5 attempts failed between address-added and the first of 20 in a row"},
	}, {
		name: "passes at the streak after a failure that broke a shorter one",
		build: addressChange(func(ms float64) probe.Outcome {
			if ms == 2030 {
				return probe.Reset
			}
			return servedFrom(2010, 2500)(ms)
		}),
		matcher: served(),
		pass:    true, verdict: matchers.Pass, figure: "time_to_serve", figureVal: 32,
	}, {
		name:    "fails, as a reset, when the address is never served",
		build:   addressChange(servedFrom(9999, 2500)),
		matcher: served(),
		verdict: matchers.Violation, kind: matchers.KindReset, figure: "time_to_serve", figureVal: 3500,
		contains: []string{
			"not served in the 3.5 s after address-added (budget 1.0 s)",
			"First violation: x not served within 1.0 s of address-added; 501 attempts failed in that time: 250 reset, 251 timeout",
			"First failed attempt: probe x, started at address-added",
			"===== address-added =====", "x #751..#1000 REFUSED (250)",
		},
	}, {
		name:    "fails when served only after its budget",
		build:   addressChange(servedFrom(3100, 5000)),
		matcher: served(),
		verdict: matchers.Violation, kind: matchers.KindReset, figure: "time_to_serve", figureVal: 1100,
		contains: []string{"served 1.1 s after address-added (budget 1.0 s)"},
	}, {
		name:     "fails when the wrong backend answers",
		build:    addressChange(servedFrom(2000, 9999)),
		matcher:  served(matchers.Backends("pod-z")),
		verdict:  matchers.Violation,
		kind:     matchers.KindWrongBackend,
		contains: []string{"wrong backend pod-a"},
	}, {
		name:     "is an instrument error without the event",
		build:    func(tl *timeline.Timeline) { connects(tl, "x", nil) },
		matcher:  served(),
		verdict:  matchers.Instrument,
		contains: []string{`no "address-added" event`},
	}, {
		name: "is an instrument error when the probe was blind after the event",
		build: func(tl *timeline.Timeline) {
			tl.RecordAt(at(2000), "address-added", "")
			lifecycle(tl, "x", probe.RoleConnect, 400, 6000)
			for ms := 500.0; ms < 6000; ms += 2 {
				if ms < 2000 || ms > 2400 {
					tl.Add(probe.Event{Time: at(ms), Kind: probe.KindAttempt, Probe: "x", Outcome: probe.OK})
				}
			}
		},
		matcher:  served(),
		verdict:  matchers.Instrument,
		contains: []string{"probe x started no attempt for 402.0 ms", "blind"},
	}})
}

func TestHaveNoServedAttempts(t *testing.T) {
	afterRemoval := func() matchers.Matcher {
		return matchers.HaveNoServedAttempts(matchers.Probes("x"), matchers.From("address-removed", time.Second))
	}
	run(t, []check{{
		name:    "passes when nothing answers a second after the removal",
		build:   addressChange(servedFrom(2010, 2600)),
		matcher: afterRemoval,
		pass:    true, verdict: matchers.Pass, figure: "served_attempts", figureVal: 0,
		contains: []string{"0 of 1001 attempts answered (budget 0); the others: 1001 timeout"},
	}, {
		name:    "fails, as delivered, when the address is still served after its budget",
		build:   addressChange(servedFrom(2010, 4000)),
		matcher: afterRemoval,
		verdict: matchers.Violation, kind: matchers.KindDelivered, figure: "served_attempts", figureVal: 250,
		contains: []string{
			"250 of 1001 attempts answered (budget 0); the others: 751 timeout",
			"First violation: probe x, started 1.0 s after address-removed: attempt #1501 to 10.0.0.1:80: ok",
			"x #1501..#1750 ANSWERED by pod-a (250)",
		},
	}, {
		name:    "judges the whole window without From: nothing answers before the address exists",
		build:   addressChange(servedFrom(2010, 2500)),
		matcher: func() matchers.Matcher { return matchers.HaveNoServedAttempts(matchers.Probes("x")) },
		verdict: matchers.Violation, kind: matchers.KindDelivered, figure: "served_attempts", figureVal: 245,
	}, {
		name:     "is an instrument error when From names an event not on the timeline",
		build:    addressChange(servedFrom(2010, 2500)),
		matcher:  func() matchers.Matcher { return matchers.HaveNoServedAttempts(matchers.From("address-gone", 0)) },
		verdict:  matchers.Instrument,
		contains: []string{`no "address-gone" event`},
	}, {
		name:  "is an instrument error when the window ends before From's start",
		build: addressChange(servedFrom(2010, 2500)),
		matcher: func() matchers.Matcher {
			return matchers.HaveNoServedAttempts(matchers.From("address-removed", 5*time.Second))
		},
		verdict:  matchers.Instrument,
		contains: []string{"before 5.0 s after address-removed"},
	}})
}

// From narrows any matcher: the failures before the change are not judged.
func TestFromNarrowsTheWindow(t *testing.T) {
	run(t, []check{{
		name:  "HaveNoFailedAttempts from the streak on",
		build: addressChange(servedFrom(2010, 9999)),
		matcher: func() matchers.Matcher {
			return matchers.HaveNoFailedAttempts(matchers.From("address-added", 10*time.Millisecond))
		},
		pass: true, verdict: matchers.Pass, figure: "failed_attempts", figureVal: 0,
	}, {
		name:    "and fails when it starts too early",
		build:   addressChange(servedFrom(2010, 9999)),
		matcher: func() matchers.Matcher { return matchers.HaveNoFailedAttempts(matchers.From("address-added", 0)) },
		verdict: matchers.Violation, kind: matchers.KindReset, figure: "failed_attempts", figureVal: 5,
	}})
}
