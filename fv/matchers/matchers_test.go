package matchers_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"

	"github.com/dpconform/dpconform/fv/matchers"
	"github.com/dpconform/dpconform/fv/monotime"
	"github.com/dpconform/dpconform/fv/probe"
	"github.com/dpconform/dpconform/fv/timeline"
)

// The synthetic transition: stop-sent at 2 s, exited at 2.1 s, start-sent at 2.2 s,
// ready at 2.5 s; the spec window runs from 1 s to 5.5 s. Probes run from 0.5 s and
// report up to 6 s.
const base = monotime.Time(1_000_000_000_000)

func at(ms float64) monotime.Time { return base + monotime.Time(ms*1e6) }

func newTimeline() *timeline.Timeline {
	tl := timeline.New()
	tl.RecordAt(at(2000), timeline.StopSent, "")
	tl.RecordAt(at(2100), timeline.Exited, "")
	tl.RecordAt(at(2200), timeline.StartSent, "")
	tl.RecordAt(at(2500), timeline.Ready, "")
	return tl
}

func window(tl *timeline.Timeline) timeline.Window {
	w, err := tl.TransitionWindow(time.Second, 3*time.Second)
	if err != nil {
		panic(err)
	}
	return w
}

func lifecycle(tl *timeline.Timeline, name string, role probe.Role, readyMs, reportedMs float64) {
	tl.Add(probe.Event{Time: at(readyMs), Kind: probe.KindReady, Probe: name, Role: role})
	tl.Add(probe.Event{Time: at(reportedMs), Kind: probe.KindMark, Probe: name})
}

// connects adds attempts every 2 ms from 500 ms to 6 s; fail decides an attempt's outcome.
func connects(tl *timeline.Timeline, name string, fail func(ms float64) probe.Outcome) {
	lifecycle(tl, name, probe.RoleConnect, 400, 6000)
	seq := uint64(0)
	for ms := 500.0; ms < 6000; ms += 2 {
		seq++
		o := probe.OK
		if fail != nil {
			o = fail(ms)
		}
		e := probe.Event{Time: at(ms), Kind: probe.KindAttempt, Probe: name, Seq: seq, Outcome: o, Latency: 300 * time.Microsecond, Target: "10.0.0.1:80", Backend: "pod-a"}
		switch o {
		case probe.OK:
		case probe.Timeout:
			e.Latency, e.Backend, e.Err = time.Second, "", "connect: no answer before the deadline"
		case probe.Unreachable:
			e.Backend, e.Err = "", "connect: network is unreachable"
		default:
			e.Backend, e.Err = "", "connect: connection refused (RST or ICMP port unreachable)"
		}
		tl.Add(e)
	}
}

// streams adds k streams with an echo every 5 ms, summarised every 100 ms, except
// while silent(ms) says the stream is silent; end, if set, ends stream 1.
func streams(tl *timeline.Timeline, name string, k int, silent func(id int, ms float64) bool, end *probe.Event) {
	lifecycle(tl, name, probe.RoleStream, 450, 6000)
	for id := 1; id <= k; id++ {
		tl.Add(probe.Event{Time: at(400), Kind: probe.KindOpen, Probe: name, Stream: id, Outcome: probe.OK, Latency: time.Millisecond})
		var batch []float64
		last := -1.0
		var maxGap float64
		var gapAt float64
		seq := uint64(0)
		flush := func() {
			if len(batch) == 0 {
				return
			}
			tl.Add(probe.Event{Time: at(batch[0]), End: at(batch[len(batch)-1]), Kind: probe.KindEcho, Probe: name, Stream: id,
				Count: len(batch), Seq: seq, Gap: time.Duration(maxGap * 1e6), GapAt: at(gapAt), Backend: "pod-b"})
			batch, maxGap = nil, 0
		}
		for ms := 405.0; ms < 6000; ms += 5 {
			if int(ms)%100 == 0 {
				flush()
			}
			if end != nil && id == end.Stream && ms >= float64(end.Time-base)/1e6 {
				break
			}
			if silent != nil && silent(id, ms) {
				continue
			}
			seq++
			if last >= 0 && ms-last > maxGap {
				maxGap, gapAt = ms-last, last
			}
			if last >= 0 && ms-last > 50 {
				tl.Add(probe.Event{Time: at(last), End: at(ms), Kind: probe.KindGap, Probe: name, Stream: id, Gap: time.Duration((ms - last) * 1e6), Seq: seq})
			}
			batch = append(batch, ms)
			last = ms
		}
		flush()
		if end != nil && id == end.Stream {
			e := *end
			e.Probe, e.Kind = name, probe.KindEnd
			tl.Add(e)
		}
	}
}

// udp adds datagrams alternately to S and D every ms from 500 ms to 5.9 s, and their
// receipt when delivered(label, ms) says so.
func udp(tl *timeline.Timeline, delivered func(label string, ms float64) bool) {
	lifecycle(tl, "s", probe.RoleServe, 100, 6200)
	lifecycle(tl, "d", probe.RoleServe, 100, 6200)
	udpFrom(tl, "p", delivered)
}

// udpFrom adds a udp sender to udp's servers S and D.
func udpFrom(tl *timeline.Timeline, name string, delivered func(label string, ms float64) bool) {
	lifecycle(tl, name, probe.RoleUDP, 450, 6000)
	udpSends(tl, name, 500, 5900, delivered)
}

// udpSends adds what sender name sends from fromMs to toMs, a datagram a millisecond,
// to S and D in turn, and what of it udp's servers receive.
func udpSends(tl *timeline.Timeline, name string, fromMs, toMs float64, delivered func(label string, ms float64) bool) {
	seq := uint64(0)
	for ms := fromMs; ms < toMs; ms++ {
		seq++
		label, srv := "S", "s"
		if seq%2 == 0 {
			label, srv = "D", "d"
		}
		tl.Add(probe.Event{Time: at(ms), Kind: probe.KindSent, Probe: name, Seq: seq, Target: label, Outcome: probe.OK})
		if delivered(label, ms) {
			tl.Add(probe.Event{Time: at(ms), End: at(ms + 0.1), Kind: probe.KindRecv, Probe: srv, Seq: seq, From: name, Target: label, Proto: "udp", Backend: srv})
		}
	}
}

// stoppedFrom adds a udp sender to udp's servers that sends from 2 s to 3 s, then
// reports its stop and exits with outcome exit.
func stoppedFrom(tl *timeline.Timeline, name string, exit probe.Outcome, delivered func(label string, ms float64) bool) {
	tl.Add(probe.Event{Time: at(1950), Kind: probe.KindReady, Probe: name, Role: probe.RoleUDP})
	udpSends(tl, name, 2000, 3000, delivered)
	if exit == probe.OK {
		tl.Add(probe.Event{Time: at(3000), Kind: probe.KindDone, Probe: name})
	}
	tl.Add(probe.Event{Time: at(3001), Kind: probe.KindExit, Probe: name, Outcome: exit})
}

type check struct {
	name      string
	build     func(tl *timeline.Timeline)
	matcher   func() matchers.Matcher
	pass      bool
	verdict   matchers.Verdict
	kind      matchers.Kind // of a violation; checked when set
	contains  []string      // in the failure message, or in the error for instrument verdicts
	figure    string
	figureVal float64
}

func run(t *testing.T, cases []check) {
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			g := NewWithT(t)
			tl := newTimeline()
			c.build(tl)
			w := window(tl)
			m := c.matcher()
			ok, err := m.Match(w)
			res := m.Result()
			g.Expect(res.Verdict).To(Equal(c.verdict), "result %+v, err %v", res, err)
			switch {
			case c.kind != "":
				g.Expect(res.Kind).To(Equal(c.kind), "kind of %+v", res)
			case res.Verdict == matchers.Violation:
				g.Expect(res.Kind).NotTo(BeEmpty(), "a violation names its kind: %+v", res)
			case res.Verdict == matchers.Pass:
				g.Expect(res.Kind).To(BeEmpty(), "a pass has no failure kind")
			}
			checkMarks(t, res)
			if c.verdict == matchers.Instrument {
				g.Expect(err).To(MatchError(matchers.ErrInstrument))
				for _, s := range c.contains {
					g.Expect(err.Error()).To(ContainSubstring(s))
				}
				return
			}
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(ok).To(Equal(c.pass))
			msg := m.NegatedFailureMessage(w)
			if !ok {
				msg = m.FailureMessage(w)
			}
			t.Logf("message:\n%s", msg)
			for _, s := range c.contains {
				g.Expect(msg).To(ContainSubstring(s))
			}
			if c.figure != "" {
				found := false
				for _, f := range res.Figures {
					if f.Name == c.figure {
						found = true
						g.Expect(f.Value).To(BeNumerically("~", c.figureVal, 0.01), "figure %s", f.Text)
						g.Expect(f.Within()).To(Equal(c.pass))
					}
				}
				g.Expect(found).To(BeTrue(), "figure %s in %+v", c.figure, res.Figures)
			}
		})
	}
}

func TestHaveNoFailedAttempts(t *testing.T) {
	run(t, []check{{
		name:    "passes on a clean run",
		build:   func(tl *timeline.Timeline) { connects(tl, "ext", nil) },
		matcher: func() matchers.Matcher { return matchers.HaveNoFailedAttempts() },
		pass:    true, verdict: matchers.Pass, figure: "failed_attempts", figureVal: 0,
		contains: []string{"failed 0 of 2251 attempts"},
	}, {
		name: "fails on timeouts after stop-sent, with the timeline",
		build: func(tl *timeline.Timeline) {
			connects(tl, "ext", func(ms float64) probe.Outcome {
				if ms >= 2132 && ms < 2142 {
					return probe.Timeout
				}
				return probe.OK
			})
		},
		matcher: func() matchers.Matcher { return matchers.HaveNoFailedAttempts() },
		verdict: matchers.Violation, kind: matchers.KindTimeout, figure: "failed_attempts", figureVal: 5,
		contains: []string{
			"failed 5 of 2251 attempts (budget 0): 5 timeout",
			"First violation: probe ext, started 32.0 ms after exited (68.0 ms before start-sent)",
			"attempt #817 to 10.0.0.1:80: TIMEOUT after 1.0 s",
			"===== exited =====", "<==", "attempts #", "ext #817..#821 TIMEOUT (5)",
		},
	}, {
		name: "fails on a refusal with a budget of one refusal less",
		build: func(tl *timeline.Timeline) {
			connects(tl, "ext", func(ms float64) probe.Outcome {
				if ms == 2600 || ms == 2800 {
					return probe.Refused
				}
				return probe.OK
			})
		},
		matcher: func() matchers.Matcher { return matchers.HaveNoFailedAttempts(matchers.Allow(1)) },
		verdict: matchers.Violation, kind: matchers.KindReset, figure: "failed_attempts", figureVal: 2,
		contains: []string{"2 reset", "REFUSED", "after ready"},
	}, {
		name:     "fails on a wrong backend",
		build:    func(tl *timeline.Timeline) { connects(tl, "ext", nil) },
		matcher:  func() matchers.Matcher { return matchers.HaveNoFailedAttempts(matchers.Backends("pod-z")) },
		verdict:  matchers.Violation,
		kind:     matchers.KindWrongBackend,
		contains: []string{"WRONG BACKEND pod-a (expected pod-z)", "2251 wrong-backend"},
	}, {
		// Found running real Calico: an unreachable attempt was reported as a wrong
		// backend while the figure counted it as "other".
		name: "fails on an unreachable network as unreachable, not as a wrong backend",
		build: func(tl *timeline.Timeline) {
			connects(tl, "ext", func(ms float64) probe.Outcome {
				if ms >= 3000 && ms < 3010 {
					return probe.Unreachable
				}
				return probe.OK
			})
		},
		matcher: func() matchers.Matcher { return matchers.HaveNoFailedAttempts(matchers.Backends("pod-a")) },
		verdict: matchers.Violation, kind: matchers.KindUnreachable, figure: "failed_attempts", figureVal: 5,
		contains: []string{"failed 5 of 2251 attempts (budget 0): 5 unreachable", "UNREACHABLE"},
	}, {
		name: "names the sharper kind when failures mix: a reset before an unreachable",
		build: func(tl *timeline.Timeline) {
			connects(tl, "ext", func(ms float64) probe.Outcome {
				switch {
				case ms == 2600:
					return probe.Unreachable
				case ms == 2700:
					return probe.Refused
				}
				return probe.OK
			})
		},
		matcher: func() matchers.Matcher { return matchers.HaveNoFailedAttempts() },
		verdict: matchers.Violation, kind: matchers.KindReset,
		contains: []string{"1 reset, 1 unreachable"},
	}, {
		name: "ignores failures outside the window",
		build: func(tl *timeline.Timeline) {
			connects(tl, "ext", func(ms float64) probe.Outcome {
				if ms < 1000 || ms > 5500 {
					return probe.Timeout
				}
				return probe.OK
			})
		},
		matcher: func() matchers.Matcher { return matchers.HaveNoFailedAttempts() },
		pass:    true, verdict: matchers.Pass,
	}, {
		name: "is an instrument error when the probe was blind",
		build: func(tl *timeline.Timeline) {
			lifecycle(tl, "ext", probe.RoleConnect, 400, 6000)
			for ms := 500.0; ms < 6000; ms += 2 {
				if ms < 3000 || ms > 3400 {
					tl.Add(probe.Event{Time: at(ms), Kind: probe.KindAttempt, Probe: "ext", Outcome: probe.OK})
				}
			}
		},
		matcher:  func() matchers.Matcher { return matchers.HaveNoFailedAttempts() },
		verdict:  matchers.Instrument,
		contains: []string{"probe ext started no attempt for 404.0 ms", "blind"},
	}, {
		name: "is an instrument error when the probe crashed",
		build: func(tl *timeline.Timeline) {
			tl.Add(probe.Event{Time: at(400), Kind: probe.KindReady, Probe: "ext", Role: probe.RoleConnect})
			tl.Add(probe.Event{Time: at(2000), Kind: probe.KindMark, Probe: "ext"})
			tl.Add(probe.Event{Time: at(2300), Kind: probe.KindExit, Probe: "ext", Outcome: probe.Crashed, Err: "signal: segmentation fault"})
		},
		matcher:  func() matchers.Matcher { return matchers.HaveNoFailedAttempts() },
		verdict:  matchers.Instrument,
		contains: []string{"probe ext has reported only up to", "CRASHED: signal: segmentation fault"},
	}, {
		name:     "is an instrument error without a connect probe",
		build:    func(tl *timeline.Timeline) {},
		matcher:  func() matchers.Matcher { return matchers.HaveNoFailedAttempts() },
		verdict:  matchers.Instrument,
		contains: []string{"no connect probe"},
	}})
}

func TestHaveStreamGapsWithin(t *testing.T) {
	run(t, []check{{
		name:    "passes on steady streams",
		build:   func(tl *timeline.Timeline) { streams(tl, "st", 3, nil, nil) },
		matcher: func() matchers.Matcher { return matchers.HaveStreamGapsWithin(200 * time.Millisecond) },
		pass:    true, verdict: matchers.Pass, figure: "max_gap", figureVal: 5,
		contains: []string{"max gap 5.0 ms"},
	}, {
		name: "fails on a 300 ms silence",
		build: func(tl *timeline.Timeline) {
			streams(tl, "st", 3, func(id int, ms float64) bool { return id == 2 && ms > 2100 && ms < 2400 }, nil)
		},
		matcher: func() matchers.Matcher { return matchers.HaveStreamGapsWithin(200 * time.Millisecond) },
		verdict: matchers.Violation, figure: "max_gap", figureVal: 300,
		contains: []string{"stream st/2 (answered by pod-b) went 300.0 ms without an echo, from at exited",
			"GAP of 300.0 ms", "<=="},
	}, {
		name: "fails on a stream that dies, up to the window end",
		build: func(tl *timeline.Timeline) {
			streams(tl, "st", 2, nil, &probe.Event{Time: at(3000), Stream: 1, Outcome: probe.Reset, Err: "send: connection reset (RST)"})
		},
		matcher:  func() matchers.Matcher { return matchers.HaveStreamGapsWithin(200 * time.Millisecond) },
		verdict:  matchers.Violation,
		contains: []string{"had no echo from", "to the window end", "it ended 500.0 ms after ready: RESET"},
	}, {
		name: "passes when the silence is outside the window",
		build: func(tl *timeline.Timeline) {
			streams(tl, "st", 1, func(id int, ms float64) bool { return ms > 600 && ms < 900 }, nil)
		},
		matcher: func() matchers.Matcher { return matchers.HaveStreamGapsWithin(200 * time.Millisecond) },
		pass:    true, verdict: matchers.Pass,
	}, {
		// The machine did not run the probe for 230 ms: nothing was in flight for the
		// path to lose, so the gap's judged length is what is left of it.
		name: "does not count the probe's own stall against the path",
		build: func(tl *timeline.Timeline) {
			streams(tl, "st", 2, func(id int, ms float64) bool { return ms > 2100 && ms < 2400 }, nil)
			for id := 1; id <= 2; id++ {
				tl.Add(probe.Event{Time: at(2105), End: at(2335), Kind: probe.KindStall, Probe: "st", Stream: id, Gap: 230 * time.Millisecond})
			}
		},
		matcher: func() matchers.Matcher { return matchers.HaveStreamGapsWithin(200 * time.Millisecond) },
		pass:    true, verdict: matchers.Pass, figure: "max_gap", figureVal: 70,
		contains: []string{"(300.0 ms long, 230.0 ms of it the instrument's own stall)", "longest stall of the probes or echo servers themselves 230.0 ms"},
	}, {
		name: "fails on what the probe's stall does not explain",
		build: func(tl *timeline.Timeline) {
			streams(tl, "st", 1, func(id int, ms float64) bool { return ms > 2100 && ms < 2500 }, nil)
			tl.Add(probe.Event{Time: at(2105), End: at(2205), Kind: probe.KindStall, Probe: "st", Stream: 1, Gap: 100 * time.Millisecond})
		},
		matcher: func() matchers.Matcher { return matchers.HaveStreamGapsWithin(200 * time.Millisecond) },
		verdict: matchers.Violation, figure: "max_gap", figureVal: 300,
		contains: []string{"went 400.0 ms without an echo", "(100.0 ms of it the instrument's own stall, not counted)",
			"the probe itself did not run for 100.0 ms"},
	}, {
		name: "is an instrument error when the probe stalled past the limit",
		build: func(tl *timeline.Timeline) {
			streams(tl, "st", 1, func(id int, ms float64) bool { return ms > 2100 && ms < 2500 }, nil)
			tl.Add(probe.Event{Time: at(2105), End: at(2435), Kind: probe.KindStall, Probe: "st", Stream: 1, Gap: 330 * time.Millisecond})
		},
		matcher:  func() matchers.Matcher { return matchers.HaveStreamGapsWithin(200 * time.Millisecond) },
		verdict:  matchers.Instrument,
		contains: []string{"its probe did not send for 330.0 ms", "blind", "250.0 ms is the limit"},
	}, {
		// The echo server that answers the streams did not run for 230 ms: no echo
		// could be sent, whatever the path did.
		name: "does not count its echo server's stall against the path",
		build: func(tl *timeline.Timeline) {
			streams(tl, "st", 2, func(id int, ms float64) bool { return ms > 2100 && ms < 2400 }, nil)
			tl.Add(probe.Event{Time: at(2105), End: at(2335), Kind: probe.KindServerStall, Probe: "pod-b", Gap: 230 * time.Millisecond})
		},
		matcher: func() matchers.Matcher { return matchers.HaveStreamGapsWithin(200 * time.Millisecond) },
		pass:    true, verdict: matchers.Pass, figure: "max_gap", figureVal: 70,
		contains: []string{"(300.0 ms long, 230.0 ms of it the instrument's own stall)", "longest stall of the probes or echo servers themselves 230.0 ms"},
	}, {
		name: "counts the stall of a server that does not answer the stream",
		build: func(tl *timeline.Timeline) {
			streams(tl, "st", 1, func(id int, ms float64) bool { return ms > 2100 && ms < 2400 }, nil)
			tl.Add(probe.Event{Time: at(2105), End: at(2335), Kind: probe.KindServerStall, Probe: "pod-z", Gap: 230 * time.Millisecond})
		},
		matcher: func() matchers.Matcher { return matchers.HaveStreamGapsWithin(200 * time.Millisecond) },
		verdict: matchers.Violation, figure: "max_gap", figureVal: 300,
	}, {
		// Client 2105-2205 and server 2150-2250 cover 145 ms of the 400 ms gap, not 200.
		name: "takes the time the probe and its server both stalled off once",
		build: func(tl *timeline.Timeline) {
			streams(tl, "st", 1, func(id int, ms float64) bool { return ms > 2100 && ms < 2500 }, nil)
			tl.Add(probe.Event{Time: at(2105), End: at(2205), Kind: probe.KindStall, Probe: "st", Stream: 1, Gap: 100 * time.Millisecond})
			tl.Add(probe.Event{Time: at(2150), End: at(2250), Kind: probe.KindServerStall, Probe: "pod-b", Gap: 100 * time.Millisecond})
		},
		matcher: func() matchers.Matcher { return matchers.HaveStreamGapsWithin(200 * time.Millisecond) },
		verdict: matchers.Violation, figure: "max_gap", figureVal: 255,
		contains: []string{"(145.0 ms of it the instrument's own stall, not counted)", "the echo server itself did not run for 100.0 ms"},
	}, {
		name: "is an instrument error when the echo server stalled past the limit",
		build: func(tl *timeline.Timeline) {
			streams(tl, "st", 1, func(id int, ms float64) bool { return ms > 2100 && ms < 2500 }, nil)
			tl.Add(probe.Event{Time: at(2105), End: at(2435), Kind: probe.KindServerStall, Probe: "pod-b", Gap: 330 * time.Millisecond})
		},
		matcher:  func() matchers.Matcher { return matchers.HaveStreamGapsWithin(200 * time.Millisecond) },
		verdict:  matchers.Instrument,
		contains: []string{"stream st/1 (answered by pod-b): its echo server pod-b did not run for 330.0 ms", "blind", "250.0 ms is the limit"},
	}})
}

func TestHaveNoResets(t *testing.T) {
	run(t, []check{{
		name:    "passes without resets",
		build:   func(tl *timeline.Timeline) { streams(tl, "st", 2, nil, nil) },
		matcher: func() matchers.Matcher { return matchers.HaveNoResets() },
		pass:    true, verdict: matchers.Pass, figure: "resets", figureVal: 0,
	}, {
		name: "fails on a reset stream",
		build: func(tl *timeline.Timeline) {
			streams(tl, "st", 2, nil, &probe.Event{Time: at(2150), Stream: 1, Outcome: probe.Reset, Err: "receive: connection reset (RST)"})
		},
		matcher: func() matchers.Matcher { return matchers.HaveNoResets() },
		verdict: matchers.Violation, figure: "resets", figureVal: 1,
		contains: []string{"1 reset (RST) over 2 streams", "probe st 50.0 ms after exited", "ENDED: RESET", "<=="},
	}, {
		name: "fails on refused attempts too",
		build: func(tl *timeline.Timeline) {
			connects(tl, "ext", func(ms float64) probe.Outcome {
				if ms == 2050 {
					return probe.Refused
				}
				return probe.OK
			})
		},
		matcher:  func() matchers.Matcher { return matchers.HaveNoResets() },
		verdict:  matchers.Violation,
		contains: []string{"REFUSED"},
	}})
}

func TestBeAliveAtEnd(t *testing.T) {
	run(t, []check{{
		name:    "passes on living streams",
		build:   func(tl *timeline.Timeline) { streams(tl, "st", 4, nil, nil) },
		matcher: func() matchers.Matcher { return matchers.BeAliveAtEnd() },
		pass:    true, verdict: matchers.Pass, figure: "dead_streams", figureVal: 0,
		contains: []string{"0 of 4 streams dead"},
	}, {
		name: "fails on a reset stream",
		build: func(tl *timeline.Timeline) {
			streams(tl, "st", 4, nil, &probe.Event{Time: at(4000), Stream: 3, Outcome: probe.Reset, Err: "x"})
		},
		matcher: func() matchers.Matcher { return matchers.BeAliveAtEnd() },
		verdict: matchers.Violation, figure: "dead_streams", figureVal: 1,
		contains: []string{"stream st/3 (answered by pod-b) ended 1.5 s after ready: RESET"},
	}, {
		name: "fails on a silent stream",
		build: func(tl *timeline.Timeline) {
			streams(tl, "st", 2, func(id int, ms float64) bool { return id == 1 && ms > 4000 }, nil)
		},
		matcher:  func() matchers.Matcher { return matchers.BeAliveAtEnd() },
		verdict:  matchers.Violation,
		contains: []string{"stream st/1 (answered by pod-b) has had no echo since 1.5 s after ready (1.5 s before the end)"},
	}, {
		name: "is an instrument error when the probe stopped its streams early",
		build: func(tl *timeline.Timeline) {
			streams(tl, "st", 1, nil, &probe.Event{Time: at(5000), Stream: 1, Outcome: probe.Stopped, Err: "probe stopped"})
		},
		matcher:  func() matchers.Matcher { return matchers.BeAliveAtEnd() },
		verdict:  matchers.Instrument,
		contains: []string{"stopped by its probe"},
	}})
}

func TestHaveZeroDelivered(t *testing.T) {
	denied := func(tl *timeline.Timeline, leak float64) {
		connects(tl, "p", func(ms float64) probe.Outcome {
			if ms == leak {
				return probe.OK
			}
			return probe.Timeout
		})
		udp(tl, func(label string, ms float64) bool { return ms == leak+1 })
	}
	run(t, []check{{
		name:    "passes when nothing gets through",
		build:   func(tl *timeline.Timeline) { denied(tl, -1) },
		matcher: func() matchers.Matcher { return matchers.HaveZeroDelivered() },
		pass:    true, verdict: matchers.Pass, figure: "delivered", figureVal: 0,
	}, {
		name:    "fails when one attempt and one datagram get through",
		build:   func(tl *timeline.Timeline) { denied(tl, 2300) },
		matcher: func() matchers.Matcher { return matchers.HaveZeroDelivered() },
		verdict: matchers.Violation, figure: "delivered", figureVal: 2,
		contains: []string{"2 of", "from probe p, sent 100.0 ms after start-sent", "ok in 0.30 ms"},
	}, {
		name:     "is an instrument error when nothing was sent",
		build:    func(tl *timeline.Timeline) { lifecycle(tl, "p", probe.RoleUDP, 400, 6000) },
		matcher:  func() matchers.Matcher { return matchers.HaveZeroDelivered() },
		verdict:  matchers.Instrument,
		contains: []string{"sent nothing"},
	}, {
		name: "is an instrument error when a receiver stopped early",
		build: func(tl *timeline.Timeline) {
			denied(tl, -1)
			lifecycle(tl, "late", probe.RoleServe, 100, 3000)
		},
		matcher:  func() matchers.Matcher { return matchers.HaveZeroDelivered() },
		verdict:  matchers.Instrument,
		contains: []string{"receiver: probe late has reported only up to"},
	}})
}

func TestDeliverToOnceDeliveredTo(t *testing.T) {
	run(t, []check{{
		name: "passes when S is reached from the first D delivery on",
		build: func(tl *timeline.Timeline) {
			udp(tl, func(label string, ms float64) bool { return ms >= 2300 })
		},
		matcher: func() matchers.Matcher { return matchers.DeliverToOnceDeliveredTo("S", "D") },
		pass:    true, verdict: matchers.Pass, figure: "lost_after_control", figureVal: 0,
	}, {
		name: "counts a sender whose first datagrams were dropped as seen opening",
		build: func(tl *timeline.Timeline) {
			udp(tl, func(label string, ms float64) bool { return ms >= 2300 })
		},
		matcher: func() matchers.Matcher { return matchers.DeliverToOnceDeliveredTo("S", "D") },
		pass:    true, verdict: matchers.Pass, figure: "openings_seen", figureVal: 1,
	}, {
		name: "does not count a sender live from its first datagram as seen opening",
		build: func(tl *timeline.Timeline) {
			udp(tl, func(label string, ms float64) bool { return true })
		},
		matcher: func() matchers.Matcher { return matchers.DeliverToOnceDeliveredTo("S", "D") },
		pass:    true, verdict: matchers.Pass, figure: "openings_seen", figureVal: 0,
	}, {
		name: "passes when S is reached before D",
		build: func(tl *timeline.Timeline) {
			udp(tl, func(label string, ms float64) bool { return label == "S" && ms >= 2200 || ms >= 2300 })
		},
		matcher: func() matchers.Matcher { return matchers.DeliverToOnceDeliveredTo("S", "D") },
		pass:    true, verdict: matchers.Pass,
	}, {
		name: "fails when S lags behind D by 20 ms",
		build: func(tl *timeline.Timeline) {
			udp(tl, func(label string, ms float64) bool { return label == "D" && ms >= 2300 || ms >= 2320 })
		},
		matcher: func() matchers.Matcher { return matchers.DeliverToOnceDeliveredTo("S", "D") },
		verdict: matchers.Violation, figure: "lost_after_control", figureVal: 9,
		contains: []string{"9 of", "datagram #1803 from p to S, sent 102.0 ms after start-sent", "1.0 ms after #1802 to D which was delivered, was never delivered", "<=="},
	}, {
		name:     "fails its precondition when D is never reached",
		build:    func(tl *timeline.Timeline) { udp(tl, func(label string, ms float64) bool { return label == "S" }) },
		matcher:  func() matchers.Matcher { return matchers.DeliverToOnceDeliveredTo("S", "D") },
		verdict:  matchers.Precondition,
		contains: []string{"PRECONDITION NOT MET: no datagram to D was delivered"},
	}, {
		// Each sender is judged on its own: q, which never went live, proves nothing,
		// though p did.
		name: "fails its precondition when one of two senders never reaches D",
		build: func(tl *timeline.Timeline) {
			udp(tl, func(label string, ms float64) bool { return ms >= 2300 })
			udpFrom(tl, "q", func(label string, ms float64) bool { return label == "S" && ms >= 5000 })
		},
		matcher:  func() matchers.Matcher { return matchers.DeliverToOnceDeliveredTo("S", "D") },
		verdict:  matchers.Precondition,
		contains: []string{"PRECONDITION NOT MET: no datagram from q to D was delivered"},
	}, {
		name: "fails when the second of two senders lags",
		build: func(tl *timeline.Timeline) {
			udp(tl, func(label string, ms float64) bool { return ms >= 2300 })
			udpFrom(tl, "q", func(label string, ms float64) bool { return label == "D" && ms >= 3300 || ms >= 3320 })
		},
		matcher: func() matchers.Matcher { return matchers.DeliverToOnceDeliveredTo("S", "D") },
		verdict: matchers.Violation, figure: "lost_after_control", figureVal: 9,
		contains: []string{"9 of", "from q to S"},
	}, {
		// A sender the spec stopped once it was live: judged on what it sent with
		// SendersMayStop, an instrument error without it, and so is one that crashed.
		name: "judges a sender that stopped cleanly, with SendersMayStop",
		build: func(tl *timeline.Timeline) {
			udp(tl, func(label string, ms float64) bool { return ms >= 2300 })
			stoppedFrom(tl, "q", probe.OK, func(label string, ms float64) bool { return label == "D" && ms >= 2400 || ms >= 2420 })
		},
		matcher: func() matchers.Matcher { return matchers.DeliverToOnceDeliveredTo("S", "D", matchers.SendersMayStop()) },
		verdict: matchers.Violation, figure: "lost_after_control", figureVal: 9,
		contains: []string{"9 of", "from q to S"},
	}, {
		name: "is an instrument error when a sender stopped, without SendersMayStop",
		build: func(tl *timeline.Timeline) {
			udp(tl, func(label string, ms float64) bool { return ms >= 2300 })
			stoppedFrom(tl, "q", probe.OK, func(label string, ms float64) bool { return ms >= 2400 })
		},
		matcher:  func() matchers.Matcher { return matchers.DeliverToOnceDeliveredTo("S", "D") },
		verdict:  matchers.Instrument,
		contains: []string{"probe q has reported only up to"},
	}, {
		name: "is an instrument error when a sender crashed, with SendersMayStop",
		build: func(tl *timeline.Timeline) {
			udp(tl, func(label string, ms float64) bool { return ms >= 2300 })
			stoppedFrom(tl, "q", probe.Crashed, func(label string, ms float64) bool { return ms >= 2400 })
		},
		matcher:  func() matchers.Matcher { return matchers.DeliverToOnceDeliveredTo("S", "D", matchers.SendersMayStop()) },
		verdict:  matchers.Instrument,
		contains: []string{"probe q has reported only up to", "its process ended"},
	}, {
		// What the receiver's own socket dropped would look like the path's loss.
		name: "is an instrument error when a receiver's socket dropped datagrams",
		build: func(tl *timeline.Timeline) {
			udp(tl, func(label string, ms float64) bool { return ms >= 2300 })
			tl.Add(probe.Event{Time: at(3000), Kind: probe.KindError, Probe: "s",
				Err: "udp 10.0.0.1:9000: 12 datagrams dropped by the probe's own socket (receive buffer full) before this one"})
		},
		matcher:  func() matchers.Matcher { return matchers.DeliverToOnceDeliveredTo("S", "D") },
		verdict:  matchers.Instrument,
		contains: []string{"receiver: probe s reported an error", "12 datagrams dropped"},
	}})
}

func TestMatchRejectsOtherValues(t *testing.T) {
	g := NewWithT(t)
	_, err := matchers.HaveNoResets().Match(42)
	g.Expect(err).To(HaveOccurred())
	g.Expect(errors.Is(err, matchers.ErrInstrument)).To(BeFalse())
	g.Expect(strings.Contains(err.Error(), "timeline.Window")).To(BeTrue())
	_, err = matchers.HaveNoResets().Match(timeline.New())
	g.Expect(err).To(HaveOccurred())
}

// The suite passes its budgets as defaults; an option the spec chose still wins.
func TestWithDefaults(t *testing.T) {
	g := NewWithT(t)
	tl := newTimeline()
	connects(tl, "ext", nil) // an attempt every 2 ms
	w := window(tl)

	strict := matchers.HaveNoFailedAttempts().WithDefaults(matchers.MaxBlind(time.Millisecond))
	_, err := strict.Match(w)
	g.Expect(err).To(MatchError(matchers.ErrInstrument), "a 1 ms blind budget given as a default applies")

	own := matchers.HaveNoFailedAttempts(matchers.MaxBlind(time.Second)).WithDefaults(matchers.MaxBlind(time.Millisecond))
	ok, err := own.Match(w)
	g.Expect(err).NotTo(HaveOccurred(), "the matcher's own MaxBlind wins over the default")
	g.Expect(ok).To(BeTrue())
}

func TestHaveStreamsOn(t *testing.T) {
	run(t, []check{{
		name:    "passes when every backend answers a stream",
		build:   func(tl *timeline.Timeline) { streams(tl, "st", 3, nil, nil) },
		matcher: func() matchers.Matcher { return matchers.HaveStreamsOn("pod-b") },
		pass:    true, verdict: matchers.Pass, figure: "backends_without_streams", figureVal: 0,
		contains: []string{"streams per backend: pod-b 3 of 3"},
	}, {
		name:    "fails when a backend answers none",
		build:   func(tl *timeline.Timeline) { streams(tl, "st", 3, nil, nil) },
		matcher: func() matchers.Matcher { return matchers.HaveStreamsOn("pod-b", "pod-c") },
		verdict: matchers.Violation, kind: matchers.KindUnserved, figure: "backends_without_streams", figureVal: 1,
		contains: []string{"no stream of 3 was answered by pod-c"},
	}})
}

func TestHaveNoVerdicts(t *testing.T) {
	verdicts := func(through float64, vs ...timeline.Verdict) func(*timeline.Timeline) {
		return func(tl *timeline.Timeline) { tl.AddVerdicts("node-a", at(through), vs) }
	}
	deny := timeline.Verdict{Time: at(2300), Node: "node-a", Verdict: "deny", Src: "10.244.0.5", Dst: "10.244.0.7", Proto: "udp", Sport: 4000, Dport: 80, Reason: "no ipset entry"}
	allow := deny
	allow.Verdict, allow.Time = "allow", at(2400)
	other := deny
	other.Src = "10.244.0.9"
	run(t, []check{{
		name:    "passes when only allows are reported",
		build:   verdicts(6000, allow),
		matcher: func() matchers.Matcher { return matchers.HaveNoVerdicts("deny") },
		pass:    true, verdict: matchers.Pass, figure: "deny_verdicts", figureVal: 0,
	}, {
		name:  "fails on a deny on the selected flow, with when it was",
		build: verdicts(6000, allow, deny),
		matcher: func() matchers.Matcher {
			return matchers.HaveNoVerdicts("deny", matchers.Between("10.244.0.5", "10.244.0.7"))
		},
		verdict: matchers.Violation, kind: matchers.KindVerdict, figure: "deny_verdicts", figureVal: 1,
		contains: []string{"100.0 ms after start-sent", "deny udp 10.244.0.5:4000 -> 10.244.0.7:80 on node-a (no ipset entry)"},
	}, {
		name:  "ignores denies on other flows",
		build: verdicts(6000, other),
		matcher: func() matchers.Matcher {
			return matchers.HaveNoVerdicts("deny", matchers.Between("10.244.0.5", "10.244.0.7"))
		},
		pass: true, verdict: matchers.Pass,
	}, {
		name:  "fails on a deny from any source to the server when the source is left empty",
		build: verdicts(6000, other),
		matcher: func() matchers.Matcher {
			return matchers.HaveNoVerdicts("deny", matchers.Between("", "10.244.0.7"))
		},
		verdict: matchers.Violation, kind: matchers.KindVerdict, figure: "deny_verdicts", figureVal: 1,
		contains: []string{"10.244.0.9:4000 -> 10.244.0.7:80"},
	}, {
		name:  "ignores denies to other servers when the source is left empty",
		build: verdicts(6000, other),
		matcher: func() matchers.Matcher {
			return matchers.HaveNoVerdicts("deny", matchers.Between("", "10.244.0.8"))
		},
		pass: true, verdict: matchers.Pass,
	}, {
		name:     "is an instrument error when no verdicts were polled",
		build:    func(*timeline.Timeline) {},
		matcher:  func() matchers.Matcher { return matchers.HaveNoVerdicts("deny") },
		verdict:  matchers.Instrument,
		contains: []string{"no policy verdicts were polled"},
	}, {
		name:     "is an instrument error when the polls stopped before the window end",
		build:    verdicts(4000),
		matcher:  func() matchers.Matcher { return matchers.HaveNoVerdicts("deny") },
		verdict:  matchers.Instrument,
		contains: []string{"reported only up to"},
	}})
}

func TestHaveVerdicts(t *testing.T) {
	verdicts := func(through float64, vs ...timeline.Verdict) func(*timeline.Timeline) {
		return func(tl *timeline.Timeline) { tl.AddVerdicts("node-a", at(through), vs) }
	}
	deny := timeline.Verdict{Time: at(2300), Node: "node-a", Verdict: "deny", Src: "10.244.0.5", Dst: "10.244.0.7", Proto: "udp", Sport: 4000, Dport: 80}
	allow := deny
	allow.Verdict = "allow"
	run(t, []check{{
		name:  "passes when the denied flow is reported as denied",
		build: verdicts(6000, allow, deny),
		matcher: func() matchers.Matcher {
			return matchers.HaveVerdicts("deny", matchers.Between("10.244.0.5", "10.244.0.7"))
		},
		pass: true, verdict: matchers.Pass, figure: "deny_verdicts", figureVal: 1,
	}, {
		name:  "fails when the implementation reported no deny on it",
		build: verdicts(6000, allow),
		matcher: func() matchers.Matcher {
			return matchers.HaveVerdicts("deny", matchers.Between("10.244.0.5", "10.244.0.7"))
		},
		verdict: matchers.Violation, kind: matchers.KindVerdict,
		contains: []string{"0 \"deny\" of 1 verdicts", `no "deny" verdict was reported on the selected flows (1 verdicts on them in all)`},
	}, {
		name:     "is an instrument error when the polls stopped before the window end",
		build:    verdicts(4000, deny),
		matcher:  func() matchers.Matcher { return matchers.HaveVerdicts("deny") },
		verdict:  matchers.Instrument,
		contains: []string{"reported only up to"},
	}})
}

// Every outcome a connect probe can record has its kind, and wrong-backend is only a
// reply from a backend the check did not allow.
func TestAttemptKind(t *testing.T) {
	for o, want := range map[probe.Outcome]matchers.Kind{
		probe.OK:          "",
		probe.Refused:     matchers.KindReset,
		probe.Reset:       matchers.KindReset,
		probe.Timeout:     matchers.KindTimeout,
		probe.Unreachable: matchers.KindUnreachable,
		probe.NoReply:     matchers.KindNoReply,
		probe.WrongReply:  matchers.KindWrongReply,
		probe.Skipped:     matchers.KindSkipped,
		probe.LocalError:  matchers.KindLocalError,
	} {
		e := probe.Event{Kind: probe.KindAttempt, Outcome: o}
		if got := matchers.AttemptKind(e, []string{"pod-a"}); o != probe.OK && got != want {
			t.Errorf("AttemptKind(%s) = %q, want %q", o, got, want)
		}
		e.Backend = "pod-a"
		if o == probe.OK && matchers.AttemptKind(e, []string{"pod-a"}) != "" {
			t.Errorf("an answer from an allowed backend is no failure")
		}
	}
	if got := matchers.AttemptKind(probe.Event{Outcome: probe.OK, Backend: "pod-z"}, []string{"pod-a"}); got != matchers.KindWrongBackend {
		t.Errorf("an answer from pod-z when pod-a is allowed: %q, want wrong-backend", got)
	}
	if got := matchers.AttemptKind(probe.Event{Outcome: probe.Unreachable}, []string{"pod-a"}); got == matchers.KindWrongBackend {
		t.Error("an unreachable attempt is not a wrong backend")
	}
}

// markCount names, per figure, the figures that count every moment in breach: a
// violation marks each of them for the chart, no more, no fewer.
var markCount = map[string]bool{"failed_attempts": true, "gaps_over_budget": true, "resets": true, "dead_streams": true,
	"hung_streams": true, "lost_after_control": true, "unanswered": true, "served_attempts": true, "deny_verdicts": true}

// checkMarks holds every result to the contract of its marks: none on a pass; on a
// violation, in time order, each with its kind and its lane, as many as the figure
// that counts them, and the first violation's time among them.
func checkMarks(t *testing.T, res matchers.Result) {
	t.Helper()
	if res.Verdict != matchers.Violation {
		if len(res.Marks) > 0 || res.MarksTotal > 0 || res.At != 0 {
			t.Errorf("a %s carries marks %v (total %d) or a violation time %v", res.Verdict, res.Marks, res.MarksTotal, res.At)
		}
		return
	}
	for i, m := range res.Marks {
		if m.Kind == "" || (m.Probe == "" && m.Node == "") || (m.End != 0 && m.End < m.Time) {
			t.Errorf("mark %d %+v lacks a kind or a lane, or ends before it starts", i, m)
		}
		if i > 0 && m.Time < res.Marks[i-1].Time {
			t.Errorf("marks out of time order at %d: %+v after %+v", i, m, res.Marks[i-1])
		}
	}
	if res.MarksTotal != len(res.Marks) && len(res.Marks) != matchers.MaxMarks {
		t.Errorf("%d marks kept of %d, below the limit %d", len(res.Marks), res.MarksTotal, matchers.MaxMarks)
	}
	for _, f := range res.Figures {
		if markCount[f.Name] && float64(res.MarksTotal) != f.Value {
			t.Errorf("%d marks, but the figure %s counts %v", res.MarksTotal, f.Name, f.Value)
		}
	}
	if len(res.Marks) > 0 && res.At == 0 {
		t.Errorf("a violation with marks has no time for its first violation: %q", res.First)
	}
}
