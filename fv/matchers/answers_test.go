package matchers_test

import (
	"testing"
	"time"

	"github.com/dpconform/dpconform/fv/matchers"
	"github.com/dpconform/dpconform/fv/probe"
	"github.com/dpconform/dpconform/fv/timeline"
)

// answer is what becomes of a datagram sent at ms: the server that receives it
// ("" for none), whether its answer comes back, and from where.
type answer struct {
	server   string
	answered bool
	wrongSrc bool
}

// udpAnswers adds probe "c" sending a datagram to "svc" every 2 ms from 500 ms to
// 5.9 s on one socket, with Replies, and servers "old" and "new"; fate decides each
// datagram's. The endpoints are updated at 2300 ms.
func udpAnswers(tl *timeline.Timeline, fate func(ms float64) answer) {
	tl.RecordAt(at(2300), "endpoints-updated", "")
	lifecycle(tl, "c", probe.RoleUDP, 450, 6000)
	lifecycle(tl, "old", probe.RoleServe, 100, 6200)
	lifecycle(tl, "new", probe.RoleServe, 100, 6200)
	seq := uint64(0)
	for ms := 500.0; ms < 5900; ms += 2 {
		seq++
		tl.Add(probe.Event{Time: at(ms), Kind: probe.KindSent, Probe: "c", Seq: seq, Target: "svc", Outcome: probe.OK})
		f := fate(ms)
		if f.server == "" {
			continue
		}
		tl.Add(probe.Event{Time: at(ms), End: at(ms + 0.1), Kind: probe.KindRecv, Probe: f.server, Seq: seq, From: "c", Target: "svc", Proto: "udp", Backend: f.server})
		if !f.answered {
			continue
		}
		r := probe.Event{Time: at(ms), End: at(ms + 0.2), Latency: 200 * time.Microsecond, Kind: probe.KindReply, Probe: "c", Seq: seq,
			Target: "svc", Backend: f.server, Peer: "10.96.0.10:80", Outcome: probe.OK}
		if f.wrongSrc {
			r.Peer, r.Outcome, r.Err = "10.244.1.7:8080", probe.WrongReply, "the reply came from 10.244.1.7:8080, not from the destination 10.96.0.10:80"
		}
		tl.Add(r)
	}
}

// moved is a flow answered by old until the update, by nobody for gapMs, then by new.
func moved(gapMs float64) func(ms float64) answer {
	return func(ms float64) answer {
		switch {
		case ms < 2300:
			return answer{server: "old", answered: true}
		case ms < 2300+gapMs:
			return answer{}
		}
		return answer{server: "new", answered: true}
	}
}

func TestHaveDatagramsAnswered(t *testing.T) {
	byOld := func() matchers.Matcher { return matchers.HaveDatagramsAnswered(matchers.Backends("old")) }
	run(t, []check{{
		name: "passes when the old backend answers every datagram",
		build: func(tl *timeline.Timeline) {
			udpAnswers(tl, func(float64) answer { return answer{server: "old", answered: true} })
		},
		matcher: byOld,
		pass:    true, verdict: matchers.Pass, figure: "unanswered", figureVal: 0,
	}, {
		name: "fails when three datagrams are lost",
		build: func(tl *timeline.Timeline) {
			udpAnswers(tl, func(ms float64) answer {
				if ms >= 3000 && ms < 3006 {
					return answer{}
				}
				return answer{server: "old", answered: true}
			})
		},
		matcher: byOld,
		verdict: matchers.Violation, kind: matchers.KindLost, figure: "unanswered", figureVal: 3,
		contains: []string{"3 of", "never answered", "c #1251..#1253 (3) never answered", "<=="},
	}, {
		name: "fails when another backend answers",
		build: func(tl *timeline.Timeline) {
			udpAnswers(tl, func(ms float64) answer {
				if ms == 3000 {
					return answer{server: "new", answered: true}
				}
				return answer{server: "old", answered: true}
			})
		},
		matcher: byOld,
		verdict: matchers.Violation, kind: matchers.KindWrongBackend, figure: "unanswered", figureVal: 1,
		contains: []string{"reached new, expected old", "answers inside the window: new 1, old"},
	}, {
		name: "fails when the answer does not come from the address the datagram went to",
		build: func(tl *timeline.Timeline) {
			udpAnswers(tl, func(ms float64) answer { return answer{server: "old", answered: true, wrongSrc: ms == 3000} })
		},
		matcher: byOld,
		verdict: matchers.Violation, kind: matchers.KindWrongReply, figure: "unanswered", figureVal: 1,
		contains: []string{"answered by old, but the reply came from 10.244.1.7:8080"},
	}, {
		name: "tells a delivered datagram whose answer was lost from one never delivered",
		build: func(tl *timeline.Timeline) {
			udpAnswers(tl, func(ms float64) answer { return answer{server: "old", answered: ms != 3000} })
		},
		matcher: byOld,
		verdict: matchers.Violation, kind: matchers.KindLost,
		contains: []string{"delivered to old, whose answer never came back"},
	}, {
		name: "is an instrument error when the sender was blind",
		build: func(tl *timeline.Timeline) {
			lifecycle(tl, "c", probe.RoleUDP, 400, 6000)
			tl.RecordAt(at(2300), "endpoints-updated", "")
		},
		matcher:  byOld,
		verdict:  matchers.Instrument,
		contains: []string{"sent no datagram"},
	}})
}

func TestHaveDatagramsAnsweredWithin(t *testing.T) {
	byNew := func(limit time.Duration) func() matchers.Matcher {
		return func() matchers.Matcher {
			return matchers.HaveDatagramsAnsweredWithin("endpoints-updated", limit, matchers.Backends("new"))
		}
	}
	run(t, []check{{
		name:    "passes when the new backend answers from 50 ms after the update",
		build:   func(tl *timeline.Timeline) { udpAnswers(tl, moved(50)) },
		matcher: byNew(time.Second),
		pass:    true, verdict: matchers.Pass, figure: "last_unanswered", figureVal: 48,
		contains: []string{"the first answered by new was #926, sent 50.0 ms after endpoints-updated"},
	}, {
		name:    "measures how long the flow went unanswered, wherever it went",
		build:   func(tl *timeline.Timeline) { udpAnswers(tl, moved(50)) },
		matcher: byNew(time.Second),
		pass:    true, verdict: matchers.Pass, figure: "longest_unanswered", figureVal: 48,
		contains: []string{"longest run without an answer: 25 datagrams over 48.0 ms, #901..#925, from at endpoints-updated"},
	}, {
		name:    "fails when the flow stays pinned to the removed backend",
		build:   func(tl *timeline.Timeline) { udpAnswers(tl, moved(1e6)) },
		matcher: byNew(time.Second),
		verdict: matchers.Violation, kind: matchers.KindLost, figure: "last_unanswered", figureVal: 3200,
		contains: []string{"datagram #1401 from c to svc", "never answered",
			"answers from 1.0 s after endpoints-updated: none 1101"},
	}, {
		name:    "fails when the flow moves later than the budget",
		build:   func(tl *timeline.Timeline) { udpAnswers(tl, moved(1500)) },
		matcher: byNew(time.Second),
		verdict: matchers.Violation, kind: matchers.KindLost, figure: "last_unanswered", figureVal: 1498,
	}, {
		name: "fails when the old backend answers again after the deadline",
		build: func(tl *timeline.Timeline) {
			udpAnswers(tl, func(ms float64) answer {
				if ms == 4000 {
					return answer{server: "old", answered: true}
				}
				return moved(50)(ms)
			})
		},
		matcher: byNew(time.Second),
		verdict: matchers.Violation, kind: matchers.KindWrongBackend, figure: "last_unanswered", figureVal: 1700,
		contains: []string{"reached old, expected new"},
	}, {
		name: "fails when the old backend still receives what the new one answers",
		build: func(tl *timeline.Timeline) {
			udpAnswers(tl, moved(50))
			tl.Add(probe.Event{Time: at(4000), End: at(4000.1), Kind: probe.KindRecv, Probe: "old", Seq: 1751, From: "c", Target: "svc", Proto: "udp", Backend: "old"})
		},
		matcher: byNew(time.Second),
		verdict: matchers.Violation, kind: matchers.KindWrongBackend,
	}, {
		name:     "is an instrument error when the window ends before the deadline",
		build:    func(tl *timeline.Timeline) { udpAnswers(tl, moved(50)) },
		matcher:  byNew(4 * time.Second),
		verdict:  matchers.Instrument,
		contains: []string{"before the deadline"},
	}, {
		name: "is an instrument error when the sender goes blind after the deadline",
		build: func(tl *timeline.Timeline) {
			tl.RecordAt(at(2300), "endpoints-updated", "")
			lifecycle(tl, "c", probe.RoleUDP, 450, 6000)
			for i, ms := range []float64{500, 3500, 3510} {
				tl.Add(probe.Event{Time: at(ms), Kind: probe.KindSent, Probe: "c", Seq: uint64(i + 1), Target: "svc", Outcome: probe.OK})
			}
		},
		matcher:  byNew(time.Second),
		verdict:  matchers.Instrument,
		contains: []string{"sent no datagram for", "blind"},
	}, {
		name:     "is an instrument error without the event",
		build:    func(tl *timeline.Timeline) { udpAnswers(tl, moved(50)) },
		matcher:  func() matchers.Matcher { return matchers.HaveDatagramsAnsweredWithin("no-such-event", time.Second) },
		verdict:  matchers.Instrument,
		contains: []string{`no "no-such-event" event`},
	}})
}
