package fuzz

import (
	"testing"
	"time"

	. "github.com/onsi/gomega"

	"github.com/dpconform/dpconform/fv/matchers"
	"github.com/dpconform/dpconform/fv/monotime"
	"github.com/dpconform/dpconform/fv/probe"
	"github.com/dpconform/dpconform/fv/timeline"
)

// pod-b is the Service's until 2.2 s, and the model gives a change 500 ms.
func podBLeaves(probeName string, start, _ monotime.Time) []string {
	if probeName != "x" && probeName != "udp-x" {
		return nil
	}
	if start.Add(-500*time.Millisecond) <= at(2200) {
		return []string{"pod-a", "pod-b"}
	}
	return []string{"pod-a"}
}

// pod-b is leaving from 2.2 s to 2.7 s.
func podBLeaving(probeName string, t monotime.Time, backend string) bool {
	return backend == "pod-b" && t > at(2200) && t <= at(2700)
}

// probeTimeline is a timeline with start-sent at startSent (ms) and probe name, of
// role, ready at 400 ms.
func probeTimeline(startSent int, name string, role probe.Role) *timeline.Timeline {
	tl := timeline.New()
	tl.RecordAt(at(startSent), timeline.StartSent, "node-a")
	tl.Add(probe.Event{Time: at(400), Kind: probe.KindReady, Probe: name, Role: role})
	return tl
}

// udpDatagram adds to tl datagram seq of flow udp-x to web-udp, sent at ms and
// answered a millisecond later by by with outcome (no reply if by is empty).
func udpDatagram(tl *timeline.Timeline, seq uint64, ms int, by string, outcome probe.Outcome) {
	tl.Add(probe.Event{Time: at(ms), Kind: probe.KindSent, Probe: "udp-x", Seq: seq, Target: "web-udp", Outcome: probe.OK})
	if by != "" {
		tl.Add(probe.Event{Time: at(ms), Kind: probe.KindReply, Probe: "udp-x", Seq: seq, End: at(ms + 1), Target: "web-udp", Backend: by, Outcome: outcome})
	}
}

// answered is a window from 1 s to 5.5 s of attempts every 2 ms from 500 ms to 6 s,
// pod-b answering every other one until until (ms), pod-a the rest.
func answered(until int) timeline.Window {
	tl := probeTimeline(2200, "x", probe.RoleConnect)
	seq := uint64(0)
	for ms := 500; ms < 6000; ms += 2 {
		seq++
		who := "pod-a"
		if (ms/2)%2 == 0 && ms < until {
			who = "pod-b"
		}
		tl.Add(probe.Event{Time: at(ms), Kind: probe.KindAttempt, Probe: "x", Seq: seq, Outcome: probe.OK, Target: "10.0.0.1:80", Backend: who})
	}
	tl.Add(probe.Event{Time: at(6000), Kind: probe.KindMark, Probe: "x"})
	return tl.Window(at(1000), at(5500))
}

func TestAnswersAsModelled(t *testing.T) {
	g := NewWithT(t)
	m := newAnswersAsModelled(podBLeaves, podBLeaving)
	ok, err := m.Match(answered(2700))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(ok).To(BeTrue(), "pod-b answers nothing new after its budget: %s", m.FailureMessage(nil))
	g.Expect(m.Result().Verdict).To(Equal(matchers.Pass))

	ok, err = m.Match(answered(3000))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(ok).To(BeFalse(), "pod-b answers up to 3 s, 300 ms past its budget")
	res := m.Result()
	g.Expect(res.Verdict).To(Equal(matchers.Violation))
	g.Expect(res.Kind).To(Equal(matchers.KindWrongBackend))
	g.Expect(res.Figures[0].Value).To(BeEquivalentTo(74))
	g.Expect(res.MarksTotal).To(Equal(74))
	msg := m.FailureMessage(nil)
	t.Logf("%s", msg)
	g.Expect(msg).To(ContainSubstring("First violation: probe x, started 504.0 ms after start-sent: attempt #1103 to 10.0.0.1:80 answered by pod-b, which the model did not allow then (allowed: pod-a)"))
	g.Expect(msg).To(ContainSubstring("<=="))

	_, err = m.Match("a string")
	g.Expect(err).To(MatchError(ContainSubstring("expected a timeline.Window")))
}

// A backend that joined between an attempt's start and its answer may answer it
// (the client's SYN or datagram may leave late); one that joined after the answer
// may not.
func TestAnswersAsModelledJoinBeforeAnswer(t *testing.T) {
	g := NewWithT(t)
	// pod-c joins at 3 s.
	podCJoins := func(probeName string, _, answered monotime.Time) []string {
		if answered >= at(3000) {
			return []string{"pod-a", "pod-c"}
		}
		return []string{"pod-a"}
	}
	never := func(string, monotime.Time, string) bool { return false }
	for _, c := range []struct {
		latency time.Duration
		pass    bool
	}{
		{14 * time.Millisecond, true},
		{9 * time.Millisecond, false},
	} {
		tl := probeTimeline(2200, "x", probe.RoleConnect)
		tl.Add(probe.Event{Time: at(2990), Kind: probe.KindAttempt, Probe: "x", Seq: 1, Outcome: probe.OK, Target: "10.0.0.1:80",
			Backend: "pod-c", Latency: c.latency})
		tl.Add(probe.Event{Time: at(6000), Kind: probe.KindMark, Probe: "x"})
		m := newAnswersAsModelled(podCJoins, never)
		ok, err := m.Match(tl.Window(at(1000), at(5500)))
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(ok).To(Equal(c.pass), "answered %v after its start, 10 ms before pod-c joined: %s", c.latency, m.FailureMessage(nil))
	}
}

// A UDP flow's datagrams are judged by their replies: one sent at the reply's Time.
func TestAnswersAsModelledUDP(t *testing.T) {
	g := NewWithT(t)
	tl := probeTimeline(2200, "udp-x", probe.RoleUDP)
	udpDatagram(tl, 1, 2000, "pod-b", probe.OK)
	udpDatagram(tl, 2, 2600, "pod-b", probe.OK)         // within the 500 ms after pod-b left
	udpDatagram(tl, 3, 2400, "pod-b", probe.WrongReply) // it crossed the flow's deletion
	udpDatagram(tl, 4, 3000, "pod-b", probe.OK)         // the flow's conntrack entry kept
	udpDatagram(tl, 5, 3500, "pod-a", probe.WrongReply)
	// Another probe's answers are not the model's.
	tl.Add(probe.Event{Time: at(3000), Kind: probe.KindAttempt, Probe: "other", Seq: 1, Outcome: probe.OK, Backend: "pod-b"})
	tl.Add(probe.Event{Time: at(6000), Kind: probe.KindMark, Probe: "udp-x"})

	m := newAnswersAsModelled(podBLeaves, podBLeaving)
	ok, err := m.Match(tl.Window(at(1000), at(5500)))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(ok).To(BeFalse())
	res := m.Result()
	g.Expect(res.Kind).To(Equal(matchers.KindWrongBackend))
	g.Expect(res.Figures[0].Of).To(Equal(5))
	g.Expect(res.MarksTotal).To(Equal(2))
	g.Expect(res.Marks[1].Kind).To(Equal(matchers.KindWrongReply))
	msg := m.FailureMessage(nil)
	t.Logf("%s", msg)
	g.Expect(msg).To(ContainSubstring("attempt #4 to web-udp answered by pod-b, which the model did not allow then (allowed: pod-a)"))
	g.Expect(msg).To(ContainSubstring("<=="))
}

// A UDP flow answered every 20 ms but for a run of datagrams: a run of 150 ms passes
// a 200 ms budget, one of 300 ms does not, and a run at the window's end counts to
// the flow's last datagram.
func TestFlowGaps(t *testing.T) {
	g := NewWithT(t)
	window := func(lost func(ms int) bool) timeline.Window {
		tl := probeTimeline(2000, "udp-x", probe.RoleUDP)
		seq := uint64(0)
		for ms := 500; ms < 6000; ms += 20 {
			seq++
			by := "pod-a"
			if lost(ms) {
				by = ""
			}
			udpDatagram(tl, seq, ms, by, probe.OK)
		}
		// Another probe's datagrams are not a flow's.
		tl.Add(probe.Event{Time: at(3000), Kind: probe.KindSent, Probe: "other", Seq: 1, Outcome: probe.OK})
		tl.Add(probe.Event{Time: at(6000), Kind: probe.KindMark, Probe: "udp-x"})
		return tl.Window(at(1000), at(5500))
	}
	flow := func(p string) (string, bool) { return "web", p == "udp-x" }
	m := newFlowGaps(flow, 200*time.Millisecond, "stream-max-gap")

	ok, err := m.Match(window(func(ms int) bool { return ms > 2000 && ms < 2150 }))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(ok).To(BeTrue(), m.FailureMessage(nil))
	g.Expect(m.Result().Figures[0].Of).To(Equal(226))

	ok, _ = m.Match(window(func(ms int) bool { return ms > 2000 && ms < 2300 }))
	g.Expect(ok).To(BeFalse())
	res := m.Result()
	g.Expect(res.Kind).To(Equal(matchers.KindGap))
	g.Expect(res.MarksTotal).To(Equal(14)) // 2020 to 2280 ms
	msg := m.FailureMessage(nil)
	t.Logf("%s", msg)
	g.Expect(msg).To(ContainSubstring("unanswered, one of 14 in a row: the flow had no answer for 300ms (budget 200ms)"))
	g.Expect(msg).To(ContainSubstring("<=="))

	ok, _ = m.Match(window(func(ms int) bool { return ms > 5200 }))
	g.Expect(ok).To(BeFalse(), "unanswered from 5.2 s to the window's end")
	g.Expect(m.Result().MarksTotal).To(Equal(15)) // 5220 to 5500 ms
}
