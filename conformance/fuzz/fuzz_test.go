package fuzz_test

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"

	"github.com/dpconform/dpconform/conformance"
	"github.com/dpconform/dpconform/conformance/fuzz"
	"github.com/dpconform/dpconform/driver"
	"github.com/dpconform/dpconform/fv/probe"
	"github.com/dpconform/dpconform/internal/buildbin"
	"github.com/dpconform/dpconform/internal/privileged"
	"github.com/dpconform/dpconform/topologies/netns"
)

func TestMain(m *testing.M) {
	probe.RunIfChild()
	os.Exit(m.Run())
}

// runner is a Runner of the reference with faults on (DPC_REFDP_FAULTS), writing its
// rounds' reports, timelines and diagnostics to the test's temporary directory.
func runner(t *testing.T, ctx context.Context, bins map[string]string, pool *netns.ControlPlanes, faults string) *conformance.Runner {
	return runnerTo(t, ctx, bins, pool, faults, filepath.Join(t.TempDir(), "out"))
}

// runnerTo is runner writing to dir.
func runnerTo(t *testing.T, ctx context.Context, bins map[string]string, pool *netns.ControlPlanes, faults, dir string) *conformance.Runner {
	t.Helper()
	var env []string
	if faults != "" {
		env = append(env, "DPC_REFDP_FAULTS="+faults)
	}
	d, err := driver.NewExec(bins["refdp-driver"], driver.DefaultTimeouts, env...)
	if err != nil {
		t.Fatal(err)
	}
	prog, err := probe.Self()
	if err != nil {
		t.Fatal(err)
	}
	r, err := conformance.NewRunner(ctx, conformance.Config{Driver: d, Probe: prog, ControlPlanes: pool,
		OutputDir: dir, Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// A short seeded fuzz run, as make test runs it: the clean reference passes the
// first two rounds of seed 1 (each starts with a switch from kube-proxy), and a
// churn of node 1's SNAT ports with a join, an upgrade and a leave in bursts; with a
// fault that any restart of an agent shows (its conntrack is not pinned, so
// established flows are reset), seed 7's first round, which takes node 1's agent
// down first, fails, the schedule shrinks to one step, and its replay file fails
// again.
func TestFuzzReference(t *testing.T) {
	privileged.Require(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	bins, err := buildbin.Build(ctx, t.TempDir(), "reference/cmd/refdp", "drivers/refdp-driver")
	if err != nil {
		t.Fatal(err)
	}
	pool := netns.NewControlPlanes("", t.Logf)
	defer pool.Close()

	t.Run("clean", func(t *testing.T) {
		g := NewWithT(t)
		run, err := fuzz.Fuzz(ctx, runner(t, ctx, bins, pool, ""), fuzz.Options{Seed: 1, Rounds: 2, Logf: t.Logf})
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(run.Rounds).To(HaveLen(2))
		for _, rd := range run.Rounds {
			g.Expect(rd.Result).To(Equal(conformance.Passed), "round %d: %s", rd.Round, rd.Reason)
		}
		g.Expect(run.Finding).To(BeNil())
	})

	// Neither of seed 1's first two rounds churns or bursts: those steps run here
	// alone (the churn as the ledger's replay-churn.yaml holds it), and the clean
	// reference passes their checks.
	t.Run("clean under a churn and bursts", func(t *testing.T) {
		g := NewWithT(t)
		s := fuzz.Schedule{Actions: []fuzz.Action{
			{At: fuzz.Offset(time.Second), Op: fuzz.OpChurn, For: fuzz.Offset(12 * time.Second)},
			{At: fuzz.Offset(2 * time.Second), Op: fuzz.OpJoin, Backend: "spare-a", Service: "web-local"},
			{At: fuzz.Offset(4 * time.Second), Op: fuzz.OpUpgrade, Node: 1},
			{At: fuzz.Offset(6 * time.Second), Op: fuzz.OpLeave, Backend: "spare-a"},
		}}
		res := fuzz.Replay(ctx, runner(t, ctx, bins, pool, ""), s)
		g.Expect(res.Result).To(Equal(conformance.Passed), res.Reason)
		judged := func(name string) int {
			i := slices.IndexFunc(res.Checks, func(c conformance.CheckResult) bool { return strings.Contains(c.Name, name) })
			g.Expect(i).NotTo(Equal(-1), "the round judges %s", name)
			f := res.Checks[i].Figures[0]
			t.Logf("%s: %s", res.Checks[i].Name, f.Text)
			return f.Of
		}
		g.Expect(judged("step 1's churn")).To(BeNumerically(">", 10_000), "12 s at 2 ms on two probes")
		for _, step := range []string{"step 2's burst", "step 3's burst", "step 4's burst"} {
			g.Expect(judged(step)).To(BeNumerically(">", 300), "at least 100 ms at 250 µs")
		}
	})

	t.Run("finds and shrinks unpinned-conntrack", func(t *testing.T) {
		g := NewWithT(t)
		r := runner(t, ctx, bins, pool, "unpinned-conntrack")
		run, err := fuzz.Fuzz(ctx, r, fuzz.Options{Seed: 7, Rounds: 3, Shrink: true, Replays: 1, Logf: t.Logf})
		g.Expect(err).NotTo(HaveOccurred())
		f := run.Finding
		g.Expect(f).NotTo(BeNil(), "no violation in %d rounds", len(run.Rounds))
		g.Expect(f.Kinds).To(ContainElement(conformance.FailureKind("reset")), f.Reason)
		g.Expect(f.Shrunk).NotTo(BeNil())
		g.Expect(f.Shrunk.Actions).To(HaveLen(1), "shrunk to:\n%s", f.Shrunk)
		g.Expect(f.Shrunk.Actions[0].Op).To(BeElementOf(fuzz.OpRestart, fuzz.OpCrash, fuzz.OpUpgrade, fuzz.OpOutage))
		t.Logf("found after %s in round %d; shrunk in %d replays to:\n%s", f.After, f.Round, f.ShrinkRuns, f.Shrunk)

		path := filepath.Join(t.TempDir(), "replay.yaml")
		g.Expect(fuzz.NewReplayFile(r, *f.Shrunk, *f.Replayed).Write(path)).To(Succeed())
		rf, err := fuzz.ReadReplayFile(path)
		g.Expect(err).NotTo(HaveOccurred())
		res := fuzz.Replay(ctx, r, rf.Schedule)
		g.Expect(res.Result).To(Equal(conformance.Failed), res.Reason)
		g.Expect(slices.ContainsFunc(res.FailedKinds(), func(k conformance.FailureKind) bool { return slices.Contains(f.Kinds, k) })).To(BeTrue(),
			"the replay fails as the round did: %v, %v", res.FailedKinds(), f.Kinds)
	})
}
