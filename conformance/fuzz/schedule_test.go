package fuzz

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	. "github.com/onsi/gomega"

	"github.com/dpconform/dpconform/conformance"
	"github.com/dpconform/dpconform/driver"
	"github.com/dpconform/dpconform/fv/harness"
	"github.com/dpconform/dpconform/fv/monotime"
	"github.com/dpconform/dpconform/fv/timeline"
)

var claims = Claims{Nodes: 2, Spares: Spares, Services: Services, Upgrade: true, Switch: true, Policies: PolicyCases(), Address: true, Churn: true}

func TestGenerateIsSeeded(t *testing.T) {
	g := NewWithT(t)
	a := Generate(7, 3, claims, 40, 20*time.Second)
	g.Expect(Generate(7, 3, claims, 40, 20*time.Second)).To(Equal(a), "the same seed and round draw the same schedule")
	g.Expect(Generate(7, 4, claims, 40, 20*time.Second)).NotTo(Equal(a), "another round draws another")
	g.Expect(Generate(8, 3, claims, 40, 20*time.Second)).NotTo(Equal(a), "another seed draws another")
	g.Expect(len(a.Actions)-len(a.Vanished())-len(a.churns())).To(Equal(40), "the steps drawn, and a spare's vanishing and a churn besides")
}

// A seed's rounds stay what the ledger measured: seed 2's round 7, in which the
// fuzzer found ungated-on-every-start (docs/results/notes/fuzzing.md), is drawn as
// it was then; a new pod's label, drawn since, has a stream of its own.
func TestGenerateKeepsTheLedgersRounds(t *testing.T) {
	g := NewWithT(t)
	ms := func(n int) Offset { return Offset(time.Duration(n) * time.Millisecond) }
	s := Generate(2, 7, claims, DefaultSteps, DefaultSpan)
	g.Expect(s.Actions[7].Like).To(BeElementOf(PodLikes))
	s.Actions[7].Like = ""
	g.Expect(s.Actions).To(Equal([]Action{
		{At: ms(2561), Op: OpOutage, Node: 2, For: ms(838)},
		{At: ms(4774), Op: OpAddAddress},
		{At: ms(6490), Op: OpCrash, Node: 2},
		{At: ms(6683), Op: OpCrash, Node: 2},
		{At: ms(8166), Op: OpPolicy, Case: "allow ingress to x/a from y/b's IP (ipBlock /32)"},
		{At: ms(9681), Op: OpRemoveAddress},
		{At: ms(9741), Op: OpOutage, Node: 1, For: ms(875)},
		{At: ms(9741) + ms(875)/2, Op: OpPod}, // inside the outage
	}))
}

// Every step a schedule draws is one the world can run, every kind of step is drawn,
// and some steps fall due while the one before is still in its window.
func TestGenerateDrawsEveryStep(t *testing.T) {
	g := NewWithT(t)
	ops := map[Op]int{}
	overlaps, inside, switched, churned := 0, 0, 0, 0
	likes := map[string]int{}
	for round := 1; round <= 20; round++ {
		s := Generate(1, round, claims, 10, 15*time.Second)
		member := map[string]string{}
		left, vanished := map[string]Offset{}, map[string]bool{}
		added, addedAt := false, Offset(0)
		for i, a := range s.Actions {
			ops[a.Op]++
			if i > 0 {
				g.Expect(a.At).To(BeNumerically(">=", s.Actions[i-1].At), "in the order they are due")
				if time.Duration(a.At-s.Actions[i-1].At) < 300*time.Millisecond {
					overlaps++
				}
			}
			switch a.Op {
			case OpRestart, OpCrash, OpUpgrade:
				g.Expect(a.Node).To(BeElementOf(1, 2))
			case OpOutage:
				g.Expect(a.Node).To(BeElementOf(1, 2))
				g.Expect(time.Duration(a.For)).To(BeNumerically(">=", 300*time.Millisecond))
				if a.Node == 1 && slices.ContainsFunc(s.Actions, func(b Action) bool {
					return (b.Op == OpJoin || b.Op == OpLeave) && b.At == a.At+a.For/2
				}) {
					inside++
				}
			case OpPolicy:
				g.Expect(PolicyCases()).To(ContainElement(a.Case))
			case OpPod:
				g.Expect(PodLikes).To(ContainElement(a.Like))
				likes[a.Like]++
			case OpSwitch:
				g.Expect(i).To(BeZero(), "a switch is the first step")
				g.Expect(a.Node).To(Equal(1))
				switched++
			case OpJoin:
				g.Expect(Spares).To(ContainElement(a.Backend))
				g.Expect(Services).To(ContainElement(a.Service))
				g.Expect(vanished).NotTo(HaveKey(a.Backend), "a spare that vanished joins nothing")
				member[a.Backend] = a.Service
			case OpLeave:
				g.Expect(member).To(HaveKey(a.Backend), "a spare leaves only a Service it joined")
				delete(member, a.Backend)
				left[a.Backend] = a.At
			case OpVanish:
				g.Expect(a.Backend).NotTo(Equal(unready))
				g.Expect(member).NotTo(HaveKey(a.Backend), "a spare vanishes once it has left its Service")
				g.Expect(time.Duration(a.At-left[a.Backend])).To(BeNumerically(">=", 2500*time.Millisecond), "past udp-repoint after its leave")
				g.Expect(vanished).To(BeEmpty(), "one spare vanishes at most")
				vanished[a.Backend] = true
			case OpAddAddress, OpRemoveAddress:
				g.Expect(a.Op == OpAddAddress).To(Equal(!added), "the address is added, then removed, in turn")
				if a.Op == OpRemoveAddress {
					g.Expect(time.Duration(a.At-addedAt)).To(BeNumerically(">=", 1500*time.Millisecond), "removed once it had its time to be served")
				}
				added, addedAt = !added, a.At
			case OpChurn:
				g.Expect(time.Duration(a.For)).To(BeNumerically(">=", churnFor))
				g.Expect(time.Duration(a.For)).To(BeNumerically("<", churnFor+churnJitter))
				g.Expect(time.Duration(a.At)).To(BeNumerically("<", 15*time.Second), "due in the span")
				g.Expect(s.churns()).To(HaveLen(1), "one churn a round at most")
				churned++
			}
		}
	}
	for _, op := range []Op{OpRestart, OpCrash, OpUpgrade, OpOutage, OpJoin, OpLeave, OpVanish, OpSwitch, OpPolicy, OpAddAddress, OpRemoveAddress, OpChurn} {
		g.Expect(ops).To(HaveKey(op), "20 rounds draw a %s", op)
	}
	g.Expect(likes).To(HaveLen(len(PodLikes)), "new pods like each of x's pods")
	g.Expect(overlaps).To(BeNumerically(">", 10), "steps due within 300 ms of the one before")
	g.Expect(inside).To(BeNumerically(">", 5), "a Service changes inside an outage of node 1")
	g.Expect(switched).To(BeNumerically("~", 5, 4), "about one round in four starts with a switch")
	g.Expect(churned).To(BeNumerically("~", 5, 4), "about one round in four churns")

	fewer := claims
	fewer.Upgrade, fewer.Switch, fewer.Policies, fewer.Address, fewer.Churn = false, false, nil, false, false
	for round := 1; round <= 20; round++ {
		for _, a := range Generate(1, round, fewer, 10, 15*time.Second).Actions {
			g.Expect(a.Op).NotTo(BeElementOf(OpUpgrade, OpSwitch, OpPolicy, OpPod, OpAddAddress, OpRemoveAddress, OpChurn), "only the steps claimed")
		}
	}
}

// Every drawn schedule fits the order a world's spares keep (vanishOrder, which
// validate applies): seed 20261212's round 48 once did not, its vanishing spare
// brought back into a Service by a leave made a join after the vanish was drawn.
func TestGenerateKeepsTheSparesOrder(t *testing.T) {
	for _, seed := range []uint64{1, 2, 20261212} {
		for round := 1; round <= 200; round++ {
			s := Generate(seed, round, claims, DefaultSteps, DefaultSpan)
			if err := vanishOrder(s.Actions); err != nil {
				t.Errorf("seed %d, round %d: %v", seed, round, err)
			}
		}
	}
}

// An implementation of NetworkPolicy alone has a world of the netpol fixture: its
// rounds draw agent steps, policies and pods, every round puts a policy in force,
// and a pod appears inside node 1's outages.
func TestGeneratePolicyOnly(t *testing.T) {
	g := NewWithT(t)
	c := ClaimsOf(driver.Info{Name: "np", Profiles: []string{string(conformance.Policy), string(conformance.ModeSwitch)}})
	g.Expect(c).To(Equal(Claims{Nodes: 2, Policies: PolicyCases()}), "no Services, spares, address or switch")
	g.Expect(Fuzzable(driver.Info{Name: "np", Profiles: []string{string(conformance.Policy)}})).To(Succeed())
	g.Expect(Fuzzable(driver.Info{Name: "obs", Profiles: []string{string(conformance.Observability)}})).To(MatchError(ContainSubstring("obs claims neither Core nor Policy")))

	ops, inside := map[Op]int{}, 0
	for round := 1; round <= 30; round++ {
		s := Generate(1, round, c, 8, 15*time.Second)
		g.Expect(s.Actions).To(ContainElement(HaveField("Op", OpPolicy)), "round %d puts a policy in force", round)
		for _, a := range s.Actions {
			ops[a.Op]++
			g.Expect(a.Op).To(BeElementOf(OpRestart, OpCrash, OpOutage, OpPolicy, OpPod), "round %d: %s", round, a)
			if a.Op == OpOutage && a.Node == 1 && slices.ContainsFunc(s.Actions, func(b Action) bool { return b.Op == OpPod && b.At == a.At+a.For/2 }) {
				inside++
			}
		}
	}
	g.Expect(ops).To(HaveLen(5), "every step the claims allow is drawn")
	g.Expect(inside).To(BeNumerically(">", 3), "a pod appears inside an outage of node 1")
}

// Minimize finds the steps a failure needs, however the schedule around them is.
func TestMinimize(t *testing.T) {
	s := Generate(3, 1, claims, 16, 15*time.Second)
	for _, need := range [][]int{{5}, {2, 11}, {0, 7, 15}, {3, 4}} {
		g := NewWithT(t)
		var want []Action
		for _, i := range need {
			want = append(want, s.Actions[i])
		}
		runs := 0
		fails := func(as []Action) bool {
			runs++
			for _, w := range want {
				if !slices.Contains(as, w) {
					return false
				}
			}
			return true
		}
		g.Expect(Minimize(s.Actions, fails)).To(Equal(want))
		t.Logf("%d of 16 steps found in %d replays", len(need), runs)
		g.Expect(runs).To(BeNumerically("<", 50), "replays for %d of 16 steps", len(need))
	}
	// A failure that needs the whole schedule keeps it.
	g := NewWithT(t)
	g.Expect(Minimize(s.Actions, func(as []Action) bool { return len(as) == len(s.Actions) })).To(Equal(s.Actions))
}

// Tightening moves the steps to the start and draws them together while the failure
// holds, and stops where it would not.
func TestTighten(t *testing.T) {
	g := NewWithT(t)
	as := []Action{{At: Offset(2 * time.Second), Op: OpRestart, Node: 1}, {At: Offset(6 * time.Second), Op: OpCrash, Node: 2}}
	got := tighten(as, func(as []Action) bool { return as[1].At-as[0].At >= Offset(time.Second) })
	g.Expect(got).To(Equal([]Action{{At: 0, Op: OpRestart, Node: 1}, {At: Offset(time.Second), Op: OpCrash, Node: 2}}))
	g.Expect(tighten(as, func([]Action) bool { return false })).To(Equal(as), "nothing changes that no longer fails")
}

func TestOffsetJSON(t *testing.T) {
	g := NewWithT(t)
	b, err := json.Marshal(Action{At: Offset(1250 * time.Millisecond), Op: OpOutage, Node: 2, For: Offset(time.Second)})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(string(b)).To(Equal(`{"at":"1.25s","op":"outage","node":2,"for":"1s"}`))
	var a Action
	g.Expect(json.Unmarshal(b, &a)).To(Succeed())
	g.Expect(a.At).To(Equal(Offset(1250 * time.Millisecond)))
	g.Expect(json.Unmarshal([]byte(`{"at":1250}`), &a)).To(MatchError(ContainSubstring(`a duration such as "1.25s"`)))
}

func TestReplayFile(t *testing.T) {
	g := NewWithT(t)
	dir := t.TempDir()
	f := ReplayFile{APIVersion: ReplayAPIVersion, Kind: ReplayKind, Implementation: "refdp v2", Failed: []conformance.FailureKind{"reset"},
		Schedule: Schedule{Seed: 9, Round: 2, Actions: []Action{{At: Offset(time.Second), Op: OpJoin, Backend: "spare-a", Service: "web-local"}}}}
	path := filepath.Join(dir, "replay.yaml")
	g.Expect(f.Write(path)).To(Succeed())
	got, err := ReadReplayFile(path)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(got).To(Equal(f))

	for name, text := range map[string]string{
		"unknown field": "apiVersion: dpconform.dev/fuzz/v1\nkind: Replay\nschedule:\n  actions:\n  - at: 1s\n    op: restart\n    nod: 1\n",
		"another kind":  "apiVersion: v1\nkind: Pod\n",
		"no steps":      "apiVersion: dpconform.dev/fuzz/v1\nkind: Replay\nschedule: {}\n",
	} {
		path := filepath.Join(dir, "bad.yaml")
		g.Expect(writeFile(path, text)).To(Succeed())
		_, err := ReadReplayFile(path)
		g.Expect(err).To(MatchError(ContainSubstring(path)), name)
	}
}

func at(ms int) monotime.Time { return monotime.Time(1e12 + int64(ms)*1e6) }

// The model allows a ready spare from when it was labelled in until the change's
// budget after it was labelled out; while the agent that programs the paths is down
// (stopped, killed, or kube-proxy stopped for a switch), the state from before it
// went down, until it is ready again; the spare that is never ready, never.
func TestModel(t *testing.T) {
	g := NewWithT(t)
	trs := []timeline.Transition{
		{Time: at(1000), Name: EventLabelled, Detail: "spare-a app=web-local"},
		{Time: at(3000), Name: EventLabelled, Detail: "spare-a app=" + idleApp},
		{Time: at(10000), Name: timeline.StopSent, Detail: "node-a"},
		{Time: at(10500), Name: EventLabelled, Detail: "spare-b app=web-remote"},
		{Time: at(11000), Name: EventLabelled, Detail: "spare-b app=web-local"},
		{Time: at(12000), Name: timeline.Ready, Detail: "node-a"},
		{Time: at(13000), Name: timeline.KillSent, Detail: "node-b"},
		{Time: at(14000), Name: EventLabelled, Detail: unready + " app=web-local"},
		{Time: at(20000), Name: harness.KubeProxyStopSent, Detail: "node-a"},
		{Time: at(20100), Name: EventLabelled, Detail: "spare-b app=" + idleApp},
		{Time: at(21000), Name: timeline.Ready, Detail: "node-a"},
	}
	m := &model{tl: func() []timeline.Transition { return trs }, budget: time.Second,
		service: map[string]string{"c-local": "web-local", "c-remote": "web-remote"},
		own:     map[string]string{"web-local": "web-local", "web-remote": "web-remote"},
		apps:    map[string]string{"web-local": "web-local", "web-remote": "web-remote"}, pathNode: "node-a"}
	for _, c := range []struct {
		probe   string
		ms      int
		latency int // ms from the start to the answer
		want    []string
	}{
		{"c-local", 900, 0, []string{"web-local"}},
		// Started before spare-a joined, answered after: its SYN may have left late.
		{"c-local", 900, 100, []string{"web-local", "spare-a"}},
		{"c-local", 900, 99, []string{"web-local"}},
		{"c-local", 1000, 0, []string{"web-local", "spare-a"}},
		{"c-local", 3999, 0, []string{"web-local", "spare-a"}},
		{"c-local", 4001, 0, []string{"web-local"}},
		{"c-local", 4001, 500, []string{"web-local"}},
		{"c-remote", 10800, 0, []string{"web-remote", "spare-b"}},
		// Down from 10 s to ready at 12 s: stale until ready, not after.
		{"c-remote", 11900, 0, []string{"web-remote", "spare-b"}},
		{"c-remote", 12100, 0, []string{"web-remote"}},
		{"c-local", 11500, 0, []string{"web-local", "spare-b"}},
		{"c-local", 15000, 0, []string{"web-local", "spare-b"}},
		// kube-proxy stopped at 20 s for a switch, the implementation ready at 21 s.
		{"c-local", 20900, 0, []string{"web-local", "spare-b"}},
		{"c-local", 21100, 0, []string{"web-local"}},
		{"other", 11500, 0, nil},
	} {
		g.Expect(m.allowed(c.probe, at(c.ms), at(c.ms+c.latency))).To(Equal(c.want), "%s at %d ms, answered %d ms later", c.probe, c.ms, c.latency)
	}
	// spare-a left web-local at 3 s: leaving within the budget, not before or after;
	// the Service's own backend never is.
	g.Expect(m.leaving("c-local", at(2900), "spare-a")).To(BeFalse())
	g.Expect(m.leaving("c-local", at(3500), "spare-a")).To(BeTrue())
	g.Expect(m.leaving("c-local", at(4100), "spare-a")).To(BeFalse())
	g.Expect(m.leaving("c-local", at(3500), "web-local")).To(BeFalse())
	g.Expect(m.leaving("other", at(3500), "spare-a")).To(BeFalse())
}

func writeFile(path, text string) error { return os.WriteFile(path, []byte(text), 0o644) }

// A leave's burst is on the Service its spare's last join put it in.
func TestLeftService(t *testing.T) {
	g := NewWithT(t)
	s := Schedule{Actions: []Action{
		{Op: OpLeave, Backend: "spare-1"},
		{Op: OpJoin, Backend: "spare-1", Service: "web-local"},
		{Op: OpJoin, Backend: "spare-2", Service: "web-remote"},
		{Op: OpLeave, Backend: "spare-1"},
		{Op: OpLeave, Backend: "spare-1"},
		{Op: OpLeave, Backend: "spare-2"},
	}}
	g.Expect(s.leftService(0)).To(BeEmpty(), "a leave of a spare in no Service (a shrunk schedule)")
	g.Expect(s.leftService(3)).To(Equal("web-local"))
	g.Expect(s.leftService(4)).To(BeEmpty(), "left already")
	g.Expect(s.leftService(5)).To(Equal("web-remote"))
}

// A round that failed in one step's own span blames that step, and the join that put
// in its Service the spare a blamed leave takes out; a round that failed as a whole
// blames none.
func TestBlamed(t *testing.T) {
	s := Schedule{Actions: []Action{
		{At: 1, Op: OpJoin, Backend: "spare-a", Service: "web-local"},
		{At: 2, Op: OpLeave, Backend: "spare-a"},
		{At: 3, Op: OpRestart, Node: 2},
		{At: 4, Op: OpJoin, Backend: "spare-a", Service: "web-remote"},
		{At: 5, Op: OpUpgrade, Node: 1},
		{At: 6, Op: OpLeave, Backend: "spare-a"},
		{At: 7, Op: OpChurn, For: 8},
	}}
	failed := func(names ...string) conformance.Result {
		res := conformance.Result{Checks: []conformance.CheckResult{
			{Name: "every new connection of step 5's burst (on nodeport-local, one every order-interval) succeeds", Passed: true},
		}}
		for _, n := range names {
			res.Checks = append(res.Checks, conformance.CheckResult{Name: n})
		}
		return res
	}
	for _, c := range []struct {
		what  string
		res   conformance.Result
		steps []int
	}{
		{"a join's burst", failed("every new connection of step 4's burst (on clusterip-remote, one every order-interval) succeeds"), []int{3}},
		{"a leave's burst, with the join it undoes", failed("every new connection of step 6's burst (on clusterip-remote, one every order-interval) succeeds"), []int{3, 5}},
		{"the first leave's, with the first join", failed("every new connection of step 2's burst (on clusterip-local, one every order-interval) succeeds"), []int{0, 1}},
		{"a churn", failed("no connection of step 7's churn reset or refused, and at most snat-retry-per-mille in 1,000 fail otherwise"), []int{6}},
		{"the round as a whole", failed("every answer from a backend the model allowed"), nil},
		{"a passed span only", failed(), nil},
		{"no such step", failed("every new connection of step 9's burst (on clusterip-local, one every order-interval) succeeds"), nil},
	} {
		var want []Action
		for _, i := range c.steps {
			want = append(want, s.Actions[i])
		}
		NewWithT(t).Expect(s.blamed(c.res)).To(Equal(want), c.what)
	}
}
