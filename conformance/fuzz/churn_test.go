package fuzz

import (
	"testing"
	"time"

	. "github.com/onsi/gomega"

	"github.com/dpconform/dpconform/fv/matchers"
	"github.com/dpconform/dpconform/fv/probe"
	"github.com/dpconform/dpconform/fv/timeline"
)

// churnWindow is a window from 0 to 5 s in which step 3 churns from 1 s to 3 s:
// each of its probes starts an attempt every 2 ms from 1 s to stop (ms) and reports
// a watermark at 3.5 s, and the attempts at fail (ms, of churn-3-1) end as outcome
// says.
func churnWindow(stop int, outcome probe.Outcome, fail ...int) timeline.Window {
	tl := timeline.New()
	tl.RecordAt(at(1000), EventChurnStart, "3")
	tl.RecordAt(at(3000), EventChurnEnd, "3")
	seq := map[string]uint64{}
	for _, name := range churnNames(3) {
		tl.Add(probe.Event{Time: at(990), Kind: probe.KindReady, Probe: name, Role: probe.RoleConnect})
		for ms := 1000; ms < stop; ms += 2 {
			seq[name]++
			o := probe.OK
			for _, f := range fail {
				if ms == f && name == churnProbe(3, 1) {
					o = outcome
				}
			}
			tl.Add(probe.Event{Time: at(ms), Kind: probe.KindAttempt, Probe: name, Seq: seq[name], Outcome: o, Target: "10.0.0.1:30080", Backend: "pod-b"})
		}
		tl.Add(probe.Event{Time: at(3500), Kind: probe.KindMark, Probe: name, Role: probe.RoleConnect})
	}
	return tl.Window(at(0), at(5000))
}

func TestChurned(t *testing.T) {
	g := NewWithT(t)
	// 2,000 attempts in the churn's span (2,002 when the probes go on past its end,
	// which is inclusive): 2 (3) may fail, but not by a reset or refusal.
	for _, tc := range []struct {
		name    string
		w       timeline.Window
		verdict matchers.Verdict
		kind    matchers.Kind
		failed  int
		of      int
	}{
		{"all answered", churnWindow(3000, probe.OK), matchers.Pass, "", 0, 2000},
		{"two timeouts, within snat-retry-per-mille", churnWindow(3000, probe.Timeout, 1500, 2500), matchers.Pass, "", 2, 2000},
		{"three timeouts, past it", churnWindow(3000, probe.Timeout, 1500, 2000, 2500), matchers.Violation, matchers.KindTimeout, 3, 2000},
		{"four timeouts, two of them after the churn", churnWindow(3100, probe.Timeout, 1500, 2500, 3020, 3050), matchers.Pass, "", 2, 2002},
		{"one reset", churnWindow(3000, probe.Reset, 2000), matchers.Violation, matchers.KindReset, 1, 2000},
		{"one refused", churnWindow(3000, probe.Refused, 2000), matchers.Violation, matchers.KindReset, 1, 2000},
		{"a probe starved for 500 ms before the end", churnWindow(2500, probe.OK), matchers.Instrument, "", 0, 0},
	} {
		m := newChurned(3, 1).WithDefaults(matchers.Context(100 * time.Millisecond))
		ok, err := m.Match(tc.w)
		if tc.verdict == matchers.Instrument {
			g.Expect(err).To(MatchError(matchers.ErrBlind), tc.name)
			g.Expect(err).To(MatchError(matchers.ErrInstrument), tc.name)
		} else {
			g.Expect(err).NotTo(HaveOccurred(), tc.name)
		}
		res := m.Result()
		g.Expect(ok).To(Equal(tc.verdict == matchers.Pass), "%s: %s", tc.name, res.First)
		g.Expect(res.Verdict).To(Equal(tc.verdict), tc.name)
		g.Expect(res.Kind).To(Equal(tc.kind), tc.name)
		switch {
		case tc.kind == matchers.KindReset:
			g.Expect(m.FailureMessage(tc.w)).To(ContainSubstring("no reset"), tc.name)
		case tc.verdict != matchers.Instrument:
			g.Expect(res.Figures[0].Name).To(Equal("failed_attempts"), tc.name)
			g.Expect(res.Figures[0].Value).To(BeEquivalentTo(tc.failed), tc.name)
			g.Expect(res.Figures[0].Of).To(Equal(tc.of), "%s: the churn's span is judged, not the window", tc.name)
			g.Expect(*res.Figures[0].Budget).To(BeEquivalentTo(churnAllowance(tc.of, 1)), tc.name)
		}
		if tc.verdict == matchers.Violation {
			g.Expect(m.FailureMessage(tc.w)).To(ContainSubstring("Timeline around it"), tc.name)
		}
	}

	tl := timeline.New()
	tl.RecordAt(at(1000), EventChurnStart, "3")
	m := newChurned(3, 1)
	ok, err := m.Match(tl.Window(at(0), at(5000)))
	g.Expect(err).To(MatchError(matchers.ErrInstrument), "a churn that did not end")
	g.Expect(ok).To(BeFalse())
	g.Expect(m.Result().Verdict).To(Equal(matchers.Instrument))
	g.Expect(m.FailureMessage(nil)).To(ContainSubstring("did not run to its end"))
}

func TestChurnAllowance(t *testing.T) {
	g := NewWithT(t)
	g.Expect(churnAllowance(0, 1)).To(Equal(0))
	g.Expect(churnAllowance(1, 1)).To(Equal(1), "rounded up")
	g.Expect(churnAllowance(1000, 1)).To(Equal(1))
	g.Expect(churnAllowance(1001, 1)).To(Equal(2))
	g.Expect(churnAllowance(20000, 1)).To(Equal(20))
}
