package conformance

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestPhaseClockSumsEachPhaseOverScenarios(t *testing.T) {
	now := time.Unix(0, 0)
	c := newPhaseClock()
	c.now = func() time.Time { return now }
	step := func(p Phase, d time.Duration) {
		c.enter(p)
		now = now.Add(d)
	}
	step(PhaseTopology, 2*time.Second)
	step(PhaseStart, time.Second)
	step(PhaseWorkloads, 500*time.Millisecond)
	// Two scenarios: each goes through steady state, transition, settle and checks.
	for range 2 {
		step(PhaseSteadyState, time.Second)
		step(PhaseTransition, 300*time.Millisecond)
		step(PhaseSettle, 2*time.Second)
		step(PhaseChecks, 100*time.Millisecond)
	}
	step(PhaseCleanup, 1500*time.Millisecond)
	got := PhasesString(c.stop())
	want := "topology 2s, start 1s, workloads 500ms, steady state 2s, transition 600ms, settle 4s, checks 200ms, cleanup 1.5s"
	if got != want {
		t.Errorf("phases = %q, want %q", got, want)
	}
}

func TestPhaseClockStopsWhereTheRunStopped(t *testing.T) {
	now := time.Unix(0, 0)
	c := newPhaseClock()
	c.now = func() time.Time { return now }
	c.enter(PhaseTopology)
	now = now.Add(time.Second)
	c.enter(PhaseCleanup)
	now = now.Add(time.Second)
	// A run that failed at its topology never entered the others: they are not
	// reported as zero.
	if got, want := PhasesString(c.stop()), "topology 1s, cleanup 1s"; got != want {
		t.Errorf("phases = %q, want %q", got, want)
	}
}

func TestCombineSumsPhasesOfRuns(t *testing.T) {
	runs := []Result{
		{ID: "X", Result: Passed, Phases: []PhaseTime{{PhaseTopology, time.Second}, {PhaseStart, time.Second}}},
		{ID: "X", Result: Passed, Phases: []PhaseTime{{PhaseTopology, 2 * time.Second}, {PhaseCleanup, time.Second}}},
	}
	if got, want := PhasesString(Combine(runs).Phases), "topology 3s, start 1s, cleanup 1s"; got != want {
		t.Errorf("phases = %q, want %q", got, want)
	}
}

func TestPhaseLogWritesAHeaderOnceAndALinePerRun(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sub", "phases.tsv")
	// What an earlier process wrote is replaced, not appended to.
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte("spec\tagainst\nOLD\tearlier\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	l := &PhaseLog{Path: path}
	for _, r := range []Result{
		{ID: "A", Result: Passed, Duration: 3 * time.Second, Phases: []PhaseTime{{PhaseTopology, time.Second}, {PhaseCleanup, 2 * time.Second}}},
		{ID: "B", Result: Failed, Duration: time.Second, Phases: []PhaseTime{{PhaseStart, 250 * time.Millisecond}}},
	} {
		if err := l.Add("clean", r); err != nil {
			t.Fatal(err)
		}
	}
	data, err := os.ReadFile(l.Path)
	if err != nil {
		t.Fatal(err)
	}
	want := strings.Join([]string{
		"spec\tagainst\tresult\tseconds\ttopology\tstart\tworkloads\tsteady state\ttransition\tsettle\tchecks\tcleanup",
		"A\tclean\tpassed\t3.000\t1.000\t0.000\t0.000\t0.000\t0.000\t0.000\t0.000\t2.000",
		"B\tclean\tfailed\t1.000\t0.000\t0.250\t0.000\t0.000\t0.000\t0.000\t0.000\t0.000",
		"",
	}, "\n")
	if string(data) != want {
		t.Errorf("phases.tsv:\n%s\nwant:\n%s", data, want)
	}
}
