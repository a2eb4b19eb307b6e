package main

import (
	"context"
	"testing"
	"time"

	. "github.com/onsi/gomega"

	"github.com/dpconform/dpconform/conformance"
	"github.com/dpconform/dpconform/conformance/fuzz"
)

// A replay runs with the budgets its schedule failed with, and the command line's
// over them.
func TestFuzzBudgets(t *testing.T) {
	g := NewWithT(t)
	rf := &fuzz.ReplayFile{Budgets: []string{"stream-max-gap=500ms", "settle=4s"}}
	b, err := fuzzBudgets(rf, "replay.yaml", []string{"settle=2s"})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(b.StreamMaxGap).To(Equal(500 * time.Millisecond))
	g.Expect(b.Settle).To(Equal(2 * time.Second))
	g.Expect(b.EndpointProgrammed).To(Equal(conformance.DefaultBudgets.EndpointProgrammed))

	b, err = fuzzBudgets(nil, "", nil)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(b).To(Equal(conformance.DefaultBudgets))

	_, err = fuzzBudgets(&fuzz.ReplayFile{Budgets: []string{"no-such=1s"}}, "replay.yaml", nil)
	g.Expect(err).To(MatchError(ContainSubstring(`replay file replay.yaml: budget "no-such=1s"`)))
}

// A replay with --replays runs until a run does not pass, at most N times, and
// reports the last run.
func TestReplayUntil(t *testing.T) {
	g := NewWithT(t)
	for _, c := range []struct {
		what  string
		runs  int
		fails int // the run (from 1) that does not pass, or 0
		want  conformance.ResultKind
		calls int
	}{
		{"every run passes", 5, 0, conformance.Passed, 5},
		{"the third run fails", 5, 3, conformance.Failed, 3},
		{"once", 1, 0, conformance.Passed, 1},
	} {
		calls := 0
		res := replayUntil(context.Background(), c.runs, func() conformance.Result {
			calls++
			if calls == c.fails {
				return conformance.Result{Result: conformance.Failed, Reason: "a timeout"}
			}
			return conformance.Result{Result: conformance.Passed}
		}, t.Logf)
		g.Expect(res.Result).To(Equal(c.want), c.what)
		g.Expect(calls).To(Equal(c.calls), c.what)
	}
	// An interrupted run stops the replays.
	ctx, cancel := context.WithCancel(context.Background())
	calls := 0
	replayUntil(ctx, 5, func() conformance.Result { calls++; cancel(); return conformance.Result{Result: conformance.Passed} }, t.Logf)
	g.Expect(calls).To(Equal(1))
}
