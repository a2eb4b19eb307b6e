package matchers_test

import (
	"testing"
	"time"

	"github.com/dpconform/dpconform/fv/matchers"
	"github.com/dpconform/dpconform/fv/probe"
	"github.com/dpconform/dpconform/fv/timeline"
)

// balanced adds attempts every 2 ms from 500 ms to 6 s, each answered by the backend
// pick names, or timed out where it names none.
func balanced(tl *timeline.Timeline, name string, pick func(seq uint64, ms float64) string) {
	lifecycle(tl, name, probe.RoleConnect, 400, 6000)
	seq := uint64(0)
	for ms := 500.0; ms < 6000; ms += 2 {
		seq++
		e := probe.Event{Time: at(ms), Kind: probe.KindAttempt, Probe: name, Seq: seq, Outcome: probe.OK, Latency: 300 * time.Microsecond, Target: "10.96.0.10:80"}
		if e.Backend = pick(seq, ms); e.Backend == "" {
			e.Outcome, e.Latency, e.Err = probe.Timeout, time.Second, "connect: no answer before the deadline"
		}
		tl.Add(e)
	}
}

// A Service whose backend "old" is replaced by "new" across the restart: before ready
// the stale dataplane still sends to old (or fails); from ready only to keep and new.
func reconciled(staleUntil, failUntil float64) func(*timeline.Timeline) {
	return func(tl *timeline.Timeline) {
		balanced(tl, "s1", func(seq uint64, ms float64) string {
			switch {
			case ms < failUntil && ms >= 2500:
				return ""
			case seq%2 == 0:
				return "keep"
			case ms < staleUntil:
				return "old"
			}
			return "new"
		})
	}
}

func TestFrom(t *testing.T) {
	fromReady := func(opts ...matchers.Option) []matchers.Option {
		return append([]matchers.Option{matchers.From(timeline.Ready, 0)}, opts...)
	}
	run(t, []check{{
		name:  "judges only from ready: the stale backend before it does not count",
		build: reconciled(2500, 0),
		matcher: func() matchers.Matcher {
			return matchers.HaveNoFailedAttempts(fromReady(matchers.Backends("keep", "new"))...)
		},
		pass: true, verdict: matchers.Pass, figure: "failed_attempts", figureVal: 0,
		contains: []string{"window from at ready to 3.0 s after ready (3.0 s)", "failed 0 of 1501 attempts"},
	}, {
		name:    "without From the same timeline fails",
		build:   reconciled(2500, 0),
		matcher: func() matchers.Matcher { return matchers.HaveNoFailedAttempts(matchers.Backends("keep", "new")) },
		verdict: matchers.Violation, kind: matchers.KindWrongBackend,
	}, {
		name:  "fails on the stale backend 40 ms after ready",
		build: reconciled(2540, 0),
		matcher: func() matchers.Matcher {
			return matchers.HaveNoFailedAttempts(fromReady(matchers.Backends("keep", "new"))...)
		},
		verdict: matchers.Violation, kind: matchers.KindWrongBackend, figure: "failed_attempts", figureVal: 10,
		contains: []string{"First violation: probe s1, started at ready", "WRONG BACKEND old"},
	}, {
		name:  "with an offset, forgives failures up to it and no later",
		build: reconciled(0, 3600),
		matcher: func() matchers.Matcher {
			return matchers.HaveNoFailedAttempts(matchers.From(timeline.Ready, time.Second), matchers.Backends("keep", "new"))
		},
		verdict: matchers.Violation, kind: matchers.KindTimeout, figure: "failed_attempts", figureVal: 50,
		contains: []string{"window from 1.0 s after ready", "First violation: probe s1, started 1.0 s after ready"},
	}, {
		name:  "with an offset past every failure, passes",
		build: reconciled(0, 3400),
		matcher: func() matchers.Matcher {
			return matchers.HaveNoFailedAttempts(matchers.From(timeline.Ready, time.Second), matchers.Backends("keep", "new"))
		},
		pass: true, verdict: matchers.Pass,
	}, {
		name:     "is an instrument error without the event",
		build:    reconciled(0, 0),
		matcher:  func() matchers.Matcher { return matchers.HaveNoFailedAttempts(matchers.From("switched", 0)) },
		verdict:  matchers.Instrument,
		contains: []string{`no "switched" event in the window`},
	}, {
		name:  "is an instrument error when the window ends before the offset",
		build: reconciled(0, 0),
		matcher: func() matchers.Matcher {
			return matchers.HaveNoFailedAttempts(matchers.From(timeline.Ready, 3*time.Second))
		},
		verdict:  matchers.Instrument,
		contains: []string{"ends before 3.0 s after ready"},
	}})
}

func TestHaveAttemptsOn(t *testing.T) {
	run(t, []check{{
		name:    "passes when every backend answers",
		build:   reconciled(2500, 0),
		matcher: func() matchers.Matcher { return matchers.HaveAttemptsOn([]string{"keep", "new"}) },
		pass:    true, verdict: matchers.Pass, figure: "backends_unanswered", figureVal: 0,
		contains: []string{"answers per backend: keep 1125, new 751 of 2251 attempts; others: old 375"},
	}, {
		name:  "fails when a backend answers none",
		build: reconciled(2500, 0),
		matcher: func() matchers.Matcher {
			return matchers.HaveAttemptsOn([]string{"keep", "old"}, matchers.From(timeline.Ready, 0))
		},
		verdict: matchers.Violation, kind: matchers.KindUnserved, figure: "backends_unanswered", figureVal: 1,
		contains: []string{"no attempt of 1501 was answered by old", "keep 750, old 0 of 1501 attempts; others: new 751"},
	}, {
		name:  "fails when failures leave a backend unanswered",
		build: reconciled(0, 6000),
		matcher: func() matchers.Matcher {
			return matchers.HaveAttemptsOn([]string{"new"}, matchers.From(timeline.Ready, 0))
		},
		verdict: matchers.Violation, kind: matchers.KindUnserved,
		contains: []string{"no attempt of 1501 was answered by new", "1501 failed"},
	}, {
		name:     "is an instrument error when the probe started nothing",
		build:    func(tl *timeline.Timeline) { lifecycle(tl, "s1", probe.RoleConnect, 400, 6000) },
		matcher:  func() matchers.Matcher { return matchers.HaveAttemptsOn([]string{"new"}) },
		verdict:  matchers.Instrument,
		contains: []string{"started no attempt"},
	}})
}

// Nothing of S1 reaches its removed backend "old" from ready on: seen at the backend
// (it records each request) and in the answer.
func TestHaveZeroDeliveredOnBackends(t *testing.T) {
	withServer := func(staleUntil float64, replies bool) func(*timeline.Timeline) {
		return func(tl *timeline.Timeline) {
			lifecycle(tl, "old", probe.RoleServe, 100, 6200)
			balanced(tl, "s1", func(seq uint64, ms float64) string {
				if seq%2 == 1 && ms < staleUntil {
					tl.Add(probe.Event{Time: at(ms), End: at(ms + 0.2), Kind: probe.KindRecv, Probe: "old", Seq: seq, From: "s1", Target: "10.96.0.10:80", Proto: "tcp", Backend: "old"})
					if replies {
						return "old"
					}
					return "" // the reply is lost: the attempt times out
				}
				return "keep"
			})
		}
	}
	onOld := func() matchers.Matcher {
		return matchers.HaveZeroDelivered(matchers.Probes("s1"), matchers.OnBackends("old"), matchers.From(timeline.Ready, 0))
	}
	run(t, []check{{
		name:    "passes when the removed backend gets nothing from ready on",
		build:   withServer(2500, true),
		matcher: onOld,
		pass:    true, verdict: matchers.Pass, figure: "delivered", figureVal: 0,
		contains: []string{"0 of 1501 requests delivered to old (budget 0)"},
	}, {
		name:  "counts only the named backend: others answering is no delivery",
		build: withServer(0, true),
		matcher: func() matchers.Matcher {
			return matchers.HaveZeroDelivered(matchers.Probes("s1"), matchers.OnBackends("gone"))
		},
		pass: true, verdict: matchers.Pass, figure: "delivered", figureVal: 0,
	}, {
		name:    "fails when the removed backend answers after ready",
		build:   withServer(2520, true),
		matcher: onOld,
		verdict: matchers.Violation, kind: matchers.KindDelivered, figure: "delivered", figureVal: 5,
		contains: []string{"5 of 1501 requests delivered to old", "sent at ready: attempt #1001 to 10.96.0.10:80: ok in 0.30 ms, answered by old"},
	}, {
		name:    "fails when it receives requests whose replies are lost",
		build:   withServer(2520, false),
		matcher: onOld,
		verdict: matchers.Violation, kind: matchers.KindDelivered, figure: "delivered", figureVal: 5,
	}})
}

// The report shows the window a From check judged, not the one it was given.
func TestFromReportsItsWindow(t *testing.T) {
	tl := newTimeline()
	reconciled(0, 0)(tl)
	w := window(tl)
	m := matchers.HaveNoFailedAttempts(matchers.From(timeline.Ready, time.Second))
	if ok, err := m.Match(w); !ok || err != nil {
		t.Fatalf("Match: %v, %v", ok, err)
	}
	if got, want := m.Result().Window, "window from 1.0 s after ready to 3.0 s after ready (2.0 s)"; got != want {
		t.Errorf("Result().Window = %q, want %q", got, want)
	}
	plain := matchers.HaveNoFailedAttempts()
	if _, err := plain.Match(w); err != nil {
		t.Fatal(err)
	}
	if got := plain.Result().Window; got != "" {
		t.Errorf("without From, Result().Window = %q, want empty (the caller's window)", got)
	}
}
