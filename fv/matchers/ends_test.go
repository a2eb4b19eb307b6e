package matchers_test

import (
	"testing"
	"time"

	. "github.com/onsi/gomega"

	"github.com/dpconform/dpconform/fv/matchers"
	"github.com/dpconform/dpconform/fv/probe"
	"github.com/dpconform/dpconform/fv/timeline"
)

// churn is a timeline with one stream on backend "keep" and one on "gone"; the
// backend "gone" is removed at 2200 ms. The stream on "gone" goes silent then, and
// ends at endMs with outcome end (no end event when endMs is 0).
func churn(endMs float64, end probe.Outcome) timeline.Window {
	tl := timeline.New()
	tl.RecordAt(at(2000), "backend-added", "")
	tl.RecordAt(at(2200), "backend-removed", "")
	lifecycle(tl, "s", probe.RoleStream, 300, 6000)
	for id, backend := range map[int]string{1: "keep", 2: "gone"} {
		tl.Add(probe.Event{Time: at(400), Kind: probe.KindOpen, Probe: "s", Stream: id, Outcome: probe.OK, Latency: time.Millisecond})
		for ms := 405.0; ms < 6000; ms += 100 {
			if backend == "gone" && ms > 2200 {
				break
			}
			tl.Add(probe.Event{Time: at(ms), End: at(ms + 95), Kind: probe.KindEcho, Probe: "s", Stream: id, Count: 20, Gap: 5 * time.Millisecond, GapAt: at(ms), Backend: backend})
		}
	}
	if endMs > 0 {
		tl.Add(probe.Event{Time: at(endMs), Kind: probe.KindEnd, Probe: "s", Stream: 2, Outcome: end, Err: "connection reset by peer"})
	}
	w, err := tl.SpanWindow(time.Second, 3*time.Second)
	if err != nil {
		panic(err)
	}
	return w
}

func TestHaveStreamsEndedWithin(t *testing.T) {
	g := NewWithT(t)
	gone := matchers.OnBackends("gone")

	g.Expect(churn(2300, probe.Reset)).To(matchers.HaveStreamsEndedWithin("backend-removed", time.Second, gone))
	g.Expect(churn(2300, probe.Closed)).To(matchers.HaveStreamsEndedWithin("backend-removed", time.Second, gone), "a FIN ends a stream too")

	m := matchers.HaveStreamsEndedWithin("backend-removed", time.Second, gone)
	ok, err := m.Match(churn(0, ""))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(ok).To(BeFalse(), "a stream that hangs must fail")
	g.Expect(m.FailureMessage(churn(0, ""))).To(And(ContainSubstring("stream s/2 (answered by gone)"), ContainSubstring("did not end"), ContainSubstring("nothing since")))
	g.Expect(m.Result().Figures[0].Value).To(BeEquivalentTo(1))

	m = matchers.HaveStreamsEndedWithin("backend-removed", time.Second, gone)
	ok, _ = m.Match(churn(3500, probe.Reset))
	g.Expect(ok).To(BeFalse(), "ending after the deadline is too late")
	g.Expect(m.FailureMessage(churn(3500, probe.Reset))).To(And(ContainSubstring("did not end within 1.0 s"),
		ContainSubstring("then reset 1.3 s after backend-removed, over budget"), Not(ContainSubstring("nothing since"))),
		"a late end is told as one, with when and how, not as silence")
	g.Expect(m.Result().Kind).To(Equal(matchers.KindHang))
	g.Expect(m.Result().Figures[1].Value).To(BeEquivalentTo(1), "ended_late")
	g.Expect(m.Result().Figures[2].Value).To(BeNumerically("~", 1300, 1), "latest_end counts the late end")

	m = matchers.HaveStreamsEndedWithin("backend-removed", time.Second, matchers.OnBackends("nobody"))
	ok, err = m.Match(churn(2300, probe.Reset))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(ok).To(BeFalse())
	g.Expect(m.Result().Verdict).To(Equal(matchers.Precondition), "no stream to judge is not a pass")
}

func TestOnBackendsSelectsStreams(t *testing.T) {
	g := NewWithT(t)
	w := churn(2300, probe.Reset)
	g.Expect(w).NotTo(matchers.HaveNoResets(), "the stream on the removed backend was reset")
	g.Expect(w).To(matchers.HaveNoResets(matchers.OnBackends("keep")))
	g.Expect(w).To(matchers.BeAliveAtEnd(matchers.OnBackends("keep")))
	g.Expect(w).NotTo(matchers.BeAliveAtEnd(matchers.OnBackends("gone")))
	g.Expect(w).To(matchers.HaveStreamGapsWithin(200*time.Millisecond, matchers.OnBackends("keep")))
}

// TestClockUncertainty: with hosts of other clocks, an event's time is known only to
// within the clocks' uncertainty, and no verdict may hang on which side of a limit
// after a transition it fell: every such limit is longer by it, and only by it.
func TestClockUncertainty(t *testing.T) {
	g := NewWithT(t)
	gone := matchers.OnBackends("gone")
	late := churn(3203, probe.Reset) // 3 ms past the 1 s after backend-removed

	g.Expect(late).NotTo(matchers.HaveStreamsEndedWithin("backend-removed", time.Second, gone), "3 ms late on one clock")
	g.Expect(late).To(matchers.HaveStreamsEndedWithin("backend-removed", time.Second, gone, matchers.ClockUncertainty(5*time.Millisecond)),
		"3 ms late is within 5 ms of uncertainty")
	g.Expect(late).NotTo(matchers.HaveStreamsEndedWithin("backend-removed", time.Second, gone, matchers.ClockUncertainty(2*time.Millisecond)),
		"but not within 2 ms")

	// The reset 100 ms after backend-removed: a check from 98 ms after it sees it,
	// unless the clocks' 5 ms may put it before.
	reset := churn(2300, probe.Reset)
	g.Expect(reset).NotTo(matchers.HaveNoResets(gone, matchers.From("backend-removed", 98*time.Millisecond)))
	g.Expect(reset).To(matchers.HaveNoResets(gone, matchers.From("backend-removed", 98*time.Millisecond), matchers.ClockUncertainty(5*time.Millisecond)))
}
