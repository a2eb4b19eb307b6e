package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/dpconform/dpconform/conformance"
	"github.com/dpconform/dpconform/conformance/fuzz"
	"github.com/dpconform/dpconform/conformance/record"
	"github.com/dpconform/dpconform/driver"
)

// The files a fuzz run writes into its output directory, besides the reports.
const (
	fuzzFile   = "fuzz.yaml"
	replayFile = "replay.yaml"
)

func fuzzCmd(args []string) error {
	fs := flag.NewFlagSet("fuzz", flag.ExitOnError)
	drv := fs.String("driver", "", "path of the implementation's driver executable (required)")
	var env multiFlag
	fs.Var(&env, "driver-env", "KEY=VALUE added to every driver call's environment (repeatable)")
	seed := fs.Uint64("seed", 0, "draws every round's schedule: a run is repeated by its seed (default: from the time, printed)")
	rounds := fs.Int("rounds", 0, "stop after `N` rounds (default: rounds until --duration)")
	duration := fs.Duration("duration", 10*time.Minute, "start no round after this long (with --rounds 0)")
	steps := fs.Int("steps", fuzz.DefaultSteps, "steps in a round's schedule")
	span := fs.Duration("span", fuzz.DefaultSpan, "the time a round's steps are drawn over")
	interval := fs.Duration("connect-interval", fuzz.DefaultConnectInterval, "the time between a round's new connections on each path (a round holds its traffic for tens of seconds: much faster, and a correct dataplane runs out of tuples; docs/fuzzing.md)")
	mode := fs.String("mode", "", "the implementation's mode its agents start in (start --mode; one of info's modes; default: its default)")
	replay := fs.String("replay", "", "run the schedule of this replay file (one that `dpconform fuzz` wrote) and nothing else")
	noShrink := fs.Bool("no-shrink", false, "report a failing schedule as it is, without shrinking it")
	replays := fs.Int("replays", fuzz.DefaultReplays, "while shrinking, replay each candidate up to `N` times (it fails if any replay does); with --replay, run the file's schedule up to N times, until one fails (once unless set)")
	output := fs.String("output", filepath.Join("_output", "fuzz"), "directory for fuzz.yaml, replay.yaml, report.yaml, report.html and the rounds' data")
	verbose := fs.Bool("v", false, "also print what each round does in detail")
	quiet := fs.Bool("quiet", false, "for CI logs: a line per round, no phases")
	// The budgets are set once the replay file, if any, is read: its own first (a
	// schedule failed with them), then these.
	var budgetFlags []string
	fs.Func("budget", "override a budget, name=value (repeatable; budgets: "+strings.Join(conformance.BudgetNames(), ", ")+"); a replay file's own come first", func(v string) error {
		check := conformance.DefaultBudgets
		budgetFlags = append(budgetFlags, v)
		return check.Set(v)
	})
	fs.Parse(args)
	replayRuns := 1
	fs.Visit(func(f *flag.Flag) {
		if f.Name == "replays" {
			replayRuns = *replays
		}
	})
	if *replays < 1 {
		return fmt.Errorf("--replays %d: want at least one run", *replays)
	}
	if *drv == "" {
		return errors.New("--driver is required: the path of your implementation's driver executable (see docs/driver.md)")
	}
	if *steps < 1 || *span <= 0 {
		return fmt.Errorf("--steps %d --span %s: want at least one step over a positive span", *steps, *span)
	}
	if os.Geteuid() != 0 {
		return errors.New("fuzz runs on the netns topology, which needs root: run dpconform as root")
	}
	var rf *fuzz.ReplayFile
	if *replay != "" {
		f, err := fuzz.ReadReplayFile(*replay)
		if err != nil {
			return err
		}
		rf = &f
	}
	budgets, err := fuzzBudgets(rf, *replay, budgetFlags)
	if err != nil {
		return err
	}
	if *seed == 0 {
		*seed = uint64(time.Now().UnixNano())
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	// A replay file left by an earlier run must not pass for this run's finding; the
	// rest of the directory is overwritten (or is the user's: --output may be any).
	if err := os.Remove(filepath.Join(*output, replayFile)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	setup, err := newRunnerSetup("netns", *drv, env, *output, budgets, *quiet, *verbose)
	if err != nil {
		return err
	}
	defer setup.Close()
	cfg, prog := setup.cfg, setup.prog
	r, err := conformance.NewRunner(ctx, cfg)
	if err != nil {
		return fmt.Errorf("ask the driver for info: %w", err)
	}
	if err := fuzz.Fuzzable(r.Info()); err != nil {
		return err
	}
	if rf != nil {
		return replayCmd(ctx, r, *rf, replayRuns, *output, prog)
	}
	if err := r.Info().Offers(driver.StartOptions{Mode: *mode}); err != nil {
		return fmt.Errorf("--mode: %w", err)
	}
	prog.Logf("fuzzing %s %s with seed %d", r.Info().Name, r.Info().Version, *seed)
	run, err := fuzz.Fuzz(ctx, r, fuzz.Options{Seed: *seed, Steps: *steps, Span: *span, ConnectInterval: *interval, Mode: *mode, Rounds: *rounds, Duration: *duration,
		Shrink: !*noShrink, Replays: *replays, Logf: prog.Logf})
	if werr := writeFuzz(r, run, *output, prog); werr != nil {
		err = errors.Join(err, werr)
	}
	if err != nil {
		return err
	}
	if f := run.Finding; f != nil {
		return fmt.Errorf("round %d of seed %d found a violation after %s: %s (replay: %s)", f.Round, run.Seed, f.After, f.Reason, filepath.Join(*output, replayFile))
	}
	prog.Logf("no violation in %d rounds (%s) of seed %d", len(run.Rounds), run.Duration, run.Seed)
	return nil
}

// fuzzBudgets are the default budgets with a replay file's overrides (the ones its
// schedule failed with), if any, then the command line's.
func fuzzBudgets(rf *fuzz.ReplayFile, path string, flags []string) (conformance.Budgets, error) {
	b := conformance.DefaultBudgets
	if rf != nil {
		for _, v := range rf.Budgets {
			if err := b.Set(v); err != nil {
				return b, fmt.Errorf("replay file %s: budget %q: %w", path, v, err)
			}
		}
	}
	for _, v := range flags {
		if err := b.Set(v); err != nil {
			return b, err
		}
	}
	return b, nil
}

// replayCmd runs a replay file's schedule up to runs times, until a run does not
// pass, and reports the last run.
func replayCmd(ctx context.Context, r *conformance.Runner, rf fuzz.ReplayFile, runs int, output string, prog *ProgressPrinter) error {
	prog.Logf("replaying round %d of seed %d (%d steps), which failed against %s (%s):\n%s", rf.Schedule.Round, rf.Schedule.Seed, len(rf.Schedule.Actions), rf.Implementation, rf.FirstViolation, rf.Schedule)
	res := replayUntil(ctx, runs, func() conformance.Result { return fuzz.Replay(ctx, r, rf.Schedule) }, prog.Logf)
	if _, err := record.NewRunRecord(r, "netns", []conformance.Result{res}, time.Now()).WriteReports(output); err != nil {
		return err
	}
	switch res.Result {
	case conformance.Failed:
		return fmt.Errorf("the replay failed: %s (report: %s)", res.Reason, filepath.Join(output, record.HTMLFile))
	case conformance.Errored:
		return fmt.Errorf("the replay erred, no verdict: %s", res.Reason)
	}
	prog.Logf("the replay passed (report: %s)", filepath.Join(output, record.HTMLFile))
	return nil
}

// replayUntil runs replay until a run does not pass, at most runs times, and
// returns the last run's result: a window of microseconds is met by some replays
// only. It stops early when ctx ends.
func replayUntil(ctx context.Context, runs int, replay func() conformance.Result, logf func(string, ...any)) conformance.Result {
	var res conformance.Result
	for i := range runs {
		res = replay()
		if runs > 1 {
			logf("replay %d of %d: %s %s", i+1, runs, res.Result, res.Reason)
		}
		if res.Result != conformance.Passed || ctx.Err() != nil {
			break
		}
	}
	return res
}

// writeFuzz writes a fuzz run's record, its replay file (when it found a violation)
// and the report of its rounds; of the timelines of the rounds that passed it keeps
// the last.
func writeFuzz(r *conformance.Runner, run fuzz.Run, output string, prog *ProgressPrinter) error {
	if err := os.MkdirAll(output, 0o755); err != nil {
		return err
	}
	results := run.Results
	last := -1
	for i, res := range results {
		if res.Result == conformance.Passed {
			last = i
		}
	}
	for i := range results {
		if results[i].Result == conformance.Passed && i != last && results[i].Timeline != "" {
			_ = os.Remove(filepath.Join(output, results[i].Timeline))
			results[i].Timeline = ""
		}
	}
	if f := run.Finding; f != nil {
		s, res := f.Schedule, f.Result
		if f.Shrunk != nil && f.Replayed != nil {
			s, res = *f.Shrunk, *f.Replayed
		}
		if err := fuzz.NewReplayFile(r, s, res).Write(filepath.Join(output, replayFile)); err != nil {
			return err
		}
		prog.Logf("the failing schedule, %d steps (of %d drawn):\n%s", len(s.Actions), len(f.Schedule.Actions), s)
	}
	b, err := yaml.Marshal(run)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(output, fuzzFile), b, 0o644); err != nil {
		return err
	}
	if len(results) == 0 {
		return nil
	}
	_, err = record.NewRunRecord(r, "netns", results, time.Now()).WriteReports(output)
	return err
}
