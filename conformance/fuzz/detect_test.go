package fuzz_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dpconform/dpconform/conformance"
	"github.com/dpconform/dpconform/conformance/fuzz"
	_ "github.com/dpconform/dpconform/conformance/specs" // the catalogue, for which specs name each fault
	"github.com/dpconform/dpconform/internal/buildbin"
	"github.com/dpconform/dpconform/internal/privileged"
	"github.com/dpconform/dpconform/reference/faults"
	"github.com/dpconform/dpconform/topologies/netns"
)

// Environment of TestDetection, which `make fuzz-faults` sets.
const (
	envDetect = "DPC_FUZZ_DETECT" // the TSV file to write; the test runs only when it is set
	envSeed   = "DPC_FUZZ_SEED"   // default 1
	envRounds = "DPC_FUZZ_ROUNDS" // rounds at most per fault, default 3
	envFaults = "DPC_FUZZ_FAULTS" // comma-separated faults (default: every one the reference knows)
)

// TestDetection fuzzes the reference with each named fault on, without being told
// which, for a few rounds of one seed, shrinks what it finds, and writes a line per
// fault: the round that found it and after how long, how it failed, the steps it
// shrank to, and the specs that name the fault. A fault it does not find is a line
// too: what the schedules cannot yet compose. A fault that only specs of profiles
// whose steps the fuzzer does not draw (not in fuzz.Profiles) name is listed as
// such, not fuzzed. Each fault's rounds (reports, timelines, diagnostics) are
// written to fuzz-detect/<fault> beside the table.
func TestDetection(t *testing.T) {
	out := os.Getenv(envDetect)
	if out == "" {
		t.Skip(envDetect + " is not set: make fuzz-faults measures the fuzzer's detection of each fault")
	}
	privileged.Require(t)
	seed, rounds := envUint(t, envSeed, 1), int(envUint(t, envRounds, 3))
	names := faults.Known()
	if v := os.Getenv(envFaults); v != "" {
		names = strings.Split(v, ",")
	}
	ctx := context.Background()
	bins, err := buildbin.Build(ctx, t.TempDir(), "reference/cmd/refdp", "drivers/refdp-driver")
	if err != nil {
		t.Fatal(err)
	}
	pool := netns.NewControlPlanes("", t.Logf)
	defer pool.Close()
	lines := []string{"fault\tfound in round\tafter\tkinds\tshrunk to\tshrink replays\tspecs that name it\tfirst violation"}
	for _, name := range names {
		if ps := profilesNaming(name); !slices.ContainsFunc(ps, func(p conformance.Profile) bool { return slices.Contains(fuzz.Profiles, p) }) {
			why := fmt.Sprintf("not fuzzed: only %s specs name it, and the fuzzer draws the steps of %s", joinProfiles(ps), joinProfiles(fuzz.Profiles))
			lines = append(lines, strings.Join([]string{name, "-", "-", "-", "-", "-", strings.Join(naming(name), " "), why}, "\t"))
			continue
		}
		// Each fault's rounds keep their evidence beside the table: a finding
		// that shrinking does not reproduce is read from its round's timeline.
		r := runnerTo(t, ctx, bins, pool, name, filepath.Join(filepath.Dir(out), "fuzz-detect", name))
		start := time.Now()
		run, err := fuzz.Fuzz(ctx, r, fuzz.Options{Seed: seed, Rounds: rounds, Shrink: true, Replays: 1, Logf: t.Logf})
		if err != nil {
			t.Errorf("%s: %v", name, err)
		}
		row := []string{name, "-", "-", "-", "-", "-", strings.Join(naming(name), " "), fmt.Sprintf("none in %d rounds (%s)", len(run.Rounds), time.Since(start).Round(time.Second))}
		if f := run.Finding; f != nil {
			row[1], row[2], row[3] = strconv.Itoa(f.Round), f.After, kinds(f.Kinds)
			if f.Shrunk != nil {
				row[4], row[5] = strings.ReplaceAll(strings.TrimSpace(f.Shrunk.String()), "\n", "; "), strconv.Itoa(f.ShrinkRuns)
			}
			row[7] = f.Reason
		}
		t.Logf("%s", strings.Join(row, " | "))
		lines = append(lines, strings.Join(row, "\t"))
	}
	header := fmt.Sprintf("# dpconform fuzz against the reference with each fault on: seed %d, at most %d rounds of %d steps over %s, shrunk with 1 replay per candidate\n",
		seed, rounds, fuzz.DefaultSteps, fuzz.DefaultSpan)
	if err := os.WriteFile(out, []byte(header+strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
}

func envUint(t *testing.T, name string, def uint64) uint64 {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.ParseUint(v, 10, 64)
	if err != nil {
		t.Fatalf("%s=%q: want a number", name, v)
	}
	return n
}

// naming are the specs whose Catches name fault.
func naming(fault string) []string {
	var ids []string
	for _, s := range conformance.Specs() {
		if slices.ContainsFunc(s.Catches, func(fc conformance.FaultCase) bool { return fc.Fault == fault }) {
			ids = append(ids, s.ID)
		}
	}
	return ids
}

// profilesNaming are the profiles of the specs that name fault.
func profilesNaming(fault string) []conformance.Profile {
	var ps []conformance.Profile
	for _, s := range conformance.Specs() {
		if slices.ContainsFunc(s.Catches, func(fc conformance.FaultCase) bool { return fc.Fault == fault }) && !slices.Contains(ps, s.Profile) {
			ps = append(ps, s.Profile)
		}
	}
	return ps
}

func joinProfiles(ps []conformance.Profile) string {
	s := make([]string, len(ps))
	for i, p := range ps {
		s[i] = string(p)
	}
	return strings.Join(s, " and ")
}

func kinds(ks []conformance.FailureKind) string {
	s := make([]string, len(ks))
	for i, k := range ks {
		s[i] = string(k)
	}
	return strings.Join(s, ",")
}
