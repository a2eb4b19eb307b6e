package fuzz

import (
	"testing"
	"time"

	. "github.com/onsi/gomega"

	"github.com/dpconform/dpconform/fv/matchers"
	"github.com/dpconform/dpconform/fv/probe"
	"github.com/dpconform/dpconform/fv/timeline"
)

// vanished is a window from 1 s to 7 s of a join's two streams, one on web-local and
// one on on (a spare, or web-local too), echoing every 100 ms; spare-a vanishes at
// 2.5 s, and the stream on it ends at endMs (0: never). down is a span of node-a's
// agent not ready (ms; zero: none).
func vanished(on string, endMs int, down [2]int) timeline.Window {
	tl := probeTimeline(2000, "stream-join-1", probe.RoleStream)
	tl.RecordAt(at(2500), vanishedEvent("spare-a"), "")
	if down[1] > 0 {
		tl.RecordAt(at(down[0]), timeline.StopSent, "node-a")
		tl.RecordAt(at(down[1]), timeline.Ready, "node-a")
	}
	for id, backend := range map[int]string{1: "web-local", 2: on} {
		tl.Add(probe.Event{Time: at(450), Kind: probe.KindOpen, Probe: "stream-join-1", Stream: id, Outcome: probe.OK, Latency: time.Millisecond})
		for ms := 500; ms < 8000; ms += 100 {
			if backend == "spare-a" && ms > 2500 {
				break
			}
			tl.Add(probe.Event{Time: at(ms), End: at(ms + 95), Kind: probe.KindEcho, Probe: "stream-join-1", Stream: id, Count: 20, Gap: 5 * time.Millisecond, GapAt: at(ms), Backend: backend})
		}
	}
	if endMs > 0 {
		tl.Add(probe.Event{Time: at(endMs), Kind: probe.KindEnd, Probe: "stream-join-1", Stream: 2, Outcome: probe.Reset, Err: "connection reset by peer"})
	}
	tl.Add(probe.Event{Time: at(8000), Kind: probe.KindMark, Probe: "stream-join-1"})
	return tl.Window(at(1000), at(7000))
}

// The streams on a spare that vanished must end within end-within of it, or of the
// ready of node-a's agent where it was down meanwhile; a round in which none reached
// the spare has nothing to judge.
func TestEndedOnVanish(t *testing.T) {
	for _, tc := range []struct {
		name     string
		spare    string // the spare the timeline's streams reached
		resetAt  int    // ms from the start to the streams' reset; 0: never
		down     [2]int // when node-a's agent was down, ms from the start
		wantOK   bool
		wantKind matchers.Kind
		wantText string // the first figure's, if not empty
	}{
		{name: "reset 600 ms after the vanishing", spare: "spare-a", resetAt: 3100, wantOK: true},
		{name: "never ended: it hangs", spare: "spare-a", wantKind: matchers.KindHang},
		{name: "reset 2.5 s after the vanishing, with the agent up", spare: "spare-a", resetAt: 5000},
		{name: "the agent was down from 200 ms after the vanishing to 700 ms: 2 s from its ready", spare: "spare-a", resetAt: 5000, down: [2]int{2700, 3200}, wantOK: true},
		{name: "no stream on spare-a: nothing to end", spare: "web-local", wantOK: true, wantText: "no stream had reached spare-a before it vanished: none to end"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			m := newEndedOnVanish("spare-a", "node-a", 2*time.Second, []string{"stream-join-1"}).WithDefaults()
			ok, err := m.Match(vanished(tc.spare, tc.resetAt, tc.down))
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(ok).To(Equal(tc.wantOK))
			if tc.wantKind != "" {
				g.Expect(m.Result().Kind).To(Equal(tc.wantKind))
			}
			if tc.wantText != "" {
				g.Expect(m.Result().Figures[0].Text).To(Equal(tc.wantText))
			}
			if !ok {
				t.Logf("%s", m.FailureMessage(nil))
			}
		})
	}
	_, err := newEndedOnVanish("spare-a", "node-a", 2*time.Second, nil).WithDefaults().Match("a string")
	NewWithT(t).Expect(err).To(MatchError(ContainSubstring("expected a timeline.Window")))
}

// A spare vanishes only once it has left its Service, 2.5 s or more before; never
// the spare that is never ready; and nothing happens to it after.
func TestVanishOrder(t *testing.T) {
	g := NewWithT(t)
	ms := func(n int) Offset { return Offset(time.Duration(n) * time.Millisecond) }
	join := Action{At: 0, Op: OpJoin, Backend: "spare-a", Service: "web-local"}
	leave := Action{At: ms(1000), Op: OpLeave, Backend: "spare-a"}
	vanish := func(at int, b string) Action { return Action{At: ms(at), Op: OpVanish, Backend: b} }
	g.Expect(vanishOrder([]Action{join, leave, vanish(3500, "spare-a")})).To(Succeed())
	g.Expect(vanishOrder([]Action{vanish(500, "spare-b")})).To(Succeed(), "a spare that never joined: nothing to end")
	for what, c := range map[string]struct {
		actions []Action
		err     string
	}{
		"in its Service": {[]Action{join, vanish(3500, "spare-a")}, "spare-a is in web-local"},
		"too soon":       {[]Action{join, leave, vanish(2000, "spare-a")}, "spare-a left 1s before: a spare vanishes 2.5s or more after its leave"},
		"never ready":    {[]Action{vanish(500, unready)}, "is never ready"},
		"gone":           {[]Action{join, leave, vanish(3500, "spare-a"), {At: ms(4000), Op: OpJoin, Backend: "spare-a", Service: "web-local"}}, "step 4 (+4.000s join spare-a to web-local): spare-a vanished at an earlier step"},
	} {
		g.Expect(vanishOrder(c.actions)).To(MatchError(ContainSubstring(c.err)), what)
	}
}
