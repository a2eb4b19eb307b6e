package matchers_test

import (
	"testing"
	"time"

	"github.com/dpconform/dpconform/fv/matchers"
	"github.com/dpconform/dpconform/fv/probe"
	"github.com/dpconform/dpconform/fv/timeline"
)

// held adds the attempts of a connect probe with Hold (connects) and, when it
// stopped (stopped), the check of each answered one at 6 s: lost(ms) says how
// the connection opened at ms fared, none when nothing is reported for it.
func held(tl *timeline.Timeline, lost func(ms float64) probe.Outcome, stopped bool) {
	heldUntil(tl, lost, stopped, 6000)
}

// heldUntil is held for a probe told to release at releaseMs: it holds only the
// connections opened before.
func heldUntil(tl *timeline.Timeline, lost func(ms float64) probe.Outcome, stopped bool, releaseMs float64) {
	connects(tl, "ext", nil)
	if releaseMs < 6000 {
		tl.Add(probe.Event{Time: at(releaseMs), Kind: probe.KindReleased, Probe: "ext"})
	}
	if !stopped {
		return
	}
	seq := uint64(0)
	for ms := 500.0; ms < releaseMs; ms += 2 {
		seq++
		o := probe.OK
		if lost != nil {
			o = lost(ms)
		}
		if o == "" {
			continue
		}
		e := probe.Event{Time: at(ms), End: at(6001), Kind: probe.KindHeld, Probe: "ext", Seq: seq, Outcome: o, Target: "10.0.0.1:80", Backend: "pod-a", Latency: 200 * time.Microsecond}
		if o != probe.OK {
			e.Backend, e.Err = "", "reply: connection reset by peer"
		}
		tl.Add(e)
	}
	tl.Add(probe.Event{Time: at(6002), Kind: probe.KindDone, Probe: "ext"})
}

func TestHaveAllHeldAlive(t *testing.T) {
	// The flows opened between the new start and ready lose their state.
	inTheWindow := func(o probe.Outcome) func(ms float64) probe.Outcome {
		return func(ms float64) probe.Outcome {
			if ms >= 2240 && ms < 2250 {
				return o
			}
			return probe.OK
		}
	}
	run(t, []check{{
		name:    "passes when every held connection answers at the end",
		build:   func(tl *timeline.Timeline) { held(tl, nil, true) },
		matcher: func() matchers.Matcher { return matchers.HaveAllHeldAlive() },
		pass:    true, verdict: matchers.Pass, figure: "held_lost", figureVal: 0,
		contains: []string{"lost 0 of 2251 connections held"},
	}, {
		name:    "fails on connections opened in the window and reset at the end, with the timeline of their opening",
		build:   func(tl *timeline.Timeline) { held(tl, inTheWindow(probe.Reset), true) },
		matcher: func() matchers.Matcher { return matchers.HaveAllHeldAlive() },
		verdict: matchers.Violation, kind: matchers.KindReset, figure: "held_lost", figureVal: 5,
		contains: []string{
			"lost 5 of 2251 connections held from their opening to the end: 5 reset",
			"First violation: probe ext, opened 40.0 ms after start-sent (260.0 ms before ready)",
			"held connection #871 to 10.0.0.1:80: LOST, checked after 3.761 s: RESET",
			"Timeline around the opening of the first", "ext #871..#875 RESET when checked (5)",
		},
	}, {
		name:    "fails on connections that time out at the end",
		build:   func(tl *timeline.Timeline) { held(tl, inTheWindow(probe.Timeout), true) },
		matcher: func() matchers.Matcher { return matchers.HaveAllHeldAlive() },
		verdict: matchers.Violation, kind: matchers.KindTimeout, figure: "held_lost", figureVal: 5,
	}, {
		name: "ignores connections opened outside the window",
		build: func(tl *timeline.Timeline) {
			held(tl, func(ms float64) probe.Outcome {
				return map[bool]probe.Outcome{true: probe.Reset, false: probe.OK}[ms < 900]
			}, true)
		},
		matcher: func() matchers.Matcher { return matchers.HaveAllHeldAlive() },
		pass:    true, verdict: matchers.Pass, figure: "held_lost", figureVal: 0,
	}, {
		name:    "judges the connections opened before the release, and leaves those after it alone",
		build:   func(tl *timeline.Timeline) { heldUntil(tl, inTheWindow(probe.Reset), true, 2600) },
		matcher: func() matchers.Matcher { return matchers.HaveAllHeldAlive() },
		verdict: matchers.Violation, kind: matchers.KindReset, figure: "held_lost", figureVal: 5,
		contains: []string{"lost 5 of 800 connections held"},
	}, {
		name:     "is blind without the probe's stop",
		build:    func(tl *timeline.Timeline) { held(tl, nil, false) },
		matcher:  func() matchers.Matcher { return matchers.HaveAllHeldAlive() },
		verdict:  matchers.Instrument,
		contains: []string{"did not stop cleanly"},
	}, {
		name: "is blind to a probe that did not hold its connections",
		build: func(tl *timeline.Timeline) {
			held(tl, func(ms float64) probe.Outcome { return map[bool]probe.Outcome{true: "", false: probe.OK}[ms > 3000] }, true)
		},
		matcher:  func() matchers.Matcher { return matchers.HaveAllHeldAlive() },
		verdict:  matchers.Instrument,
		contains: []string{"no held connection for its answered attempt", "Hold"},
	}})
}
