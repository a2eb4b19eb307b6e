package conformance

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/dpconform/dpconform/driver"
	"github.com/dpconform/dpconform/fv/probe"
	"github.com/dpconform/dpconform/topologies"
	"github.com/dpconform/dpconform/topologies/netns"
)

// Config configures a Runner.
type Config struct {
	// Driver is the implementation under test.
	Driver driver.Driver
	// Probe is how probes run (the dpconform binary, or a test binary).
	Probe probe.Program
	// Profiles restricts the run to these profiles (empty: every profile the
	// implementation claims).
	Profiles []Profile
	// Budgets (zero: DefaultBudgets).
	Budgets Budgets
	// NewTopology makes a fresh topology for a spec (default: a 2-node netns topology
	// with the implementation's CNI configuration).
	NewTopology func(ctx context.Context, info driver.Info) (topologies.Topology, error)
	// ControlPlanes, when set, lends the default netns topologies control planes that
	// outlive them, reset between runs to their state at start, instead of each run
	// starting its own (netns.ControlPlanes): ~3 s less per run. The caller closes it.
	ControlPlanes *netns.ControlPlanes
	// ClockSkew gives the default netns topologies' hosts clocks of their own
	// (netns.Options.ClockSkew), as the machines of a real cluster have: the suite
	// then measures and converts them, and a run shows that it does.
	ClockSkew time.Duration
	// ClockAlignmentOff leaves every host's times on its own clock, as if it were the
	// suite's (harness.World.ClockAlignmentOff): the self-test's switch, which shows
	// that with hosts of other clocks a run without alignment fails. Never for a
	// certification.
	ClockAlignmentOff bool
	// OutputDir receives diagnostics of failed specs (default _output/conformance).
	OutputDir string
	// SpecTimeout bounds one run of a spec (default 5 min).
	SpecTimeout time.Duration
	// Repeat is how many times each selected spec runs, each in a fresh world (0:
	// once). A spec passes only if every run passes.
	Repeat int
	// Logf reports what the run does in detail; ProbeStderr receives probes' stderr.
	// Both may be nil.
	Logf        func(format string, args ...any)
	ProbeStderr io.Writer
	// Progress, if set, is told which spec of how many runs, each phase it enters,
	// and each result (ProgressPrinter prints it for people).
	Progress func(Progress)
}

// Progress is one step of a run, for a person watching it.
type Progress struct {
	ID string
	// Index counts the specs that ran so far, this one included; Total is how many
	// will run (Runner.SetTotal; 0 when unknown).
	Index, Total int
	// Run is this run of the spec, of Runs (--repeat).
	Run, Runs int
	// Phase is the phase this run of the spec entered; empty once it ended.
	Phase Phase
	// Started is when this run of the spec started.
	Started time.Time
	// Result is set once a run ended (Phase empty): the run's, and with Final the
	// spec's, all its runs combined.
	Result *Result
	Final  bool
}

// Runner runs specs against one implementation.
type Runner struct {
	cfg  Config
	info driver.Info

	mu           sync.Mutex
	index, total int
}

// NewRunner asks the implementation for its info once, and refuses an implementation
// that claims a profile without the features the profile requires.
func NewRunner(ctx context.Context, cfg Config) (*Runner, error) {
	if cfg.Budgets == (Budgets{}) {
		cfg.Budgets = DefaultBudgets
	}
	if err := cfg.Budgets.Validate(); err != nil {
		return nil, err
	}
	if cfg.OutputDir == "" {
		cfg.OutputDir = filepath.Join("_output", "conformance")
	}
	if cfg.SpecTimeout == 0 {
		cfg.SpecTimeout = 5 * time.Minute
	}
	if cfg.Repeat == 0 {
		cfg.Repeat = 1
	}
	if cfg.Repeat < 0 {
		return nil, fmt.Errorf("repeat %d: want at least one run of each spec", cfg.Repeat)
	}
	if cfg.Logf == nil {
		cfg.Logf = func(string, ...any) {}
	}
	if cfg.NewTopology == nil {
		cfg.NewTopology = func(ctx context.Context, info driver.Info) (topologies.Topology, error) {
			return netns.New(ctx, netns.Options{CNIConfig: info.CNI, CNIDirs: info.CNIDirs(), Logf: cfg.Logf, ControlPlanes: cfg.ControlPlanes, ClockSkew: cfg.ClockSkew})
		}
	}
	info, err := cfg.Driver.Info(ctx)
	if err != nil {
		return nil, err
	}
	if err := claims(info); err != nil {
		return nil, err
	}
	return &Runner{cfg: cfg, info: info}, nil
}

// Info is what the implementation said of itself.
func (r *Runner) Info() driver.Info { return r.info }

// Config is the configuration the runner runs with.
func (r *Runner) Config() Config { return r.cfg }

// Budgets are the budgets the runner holds the implementation to.
func (r *Runner) Budgets() Budgets { return r.cfg.Budgets }

// Repeat is how many times each selected spec runs.
func (r *Runner) Repeat() int { return r.cfg.Repeat }

// SetTotal tells progress how many specs this run will run.
func (r *Runner) SetTotal(n int) {
	r.mu.Lock()
	r.total = n
	r.mu.Unlock()
}

// progress reports p with the spec's place in the run.
func (r *Runner) progress(p Progress) {
	if r.cfg.Progress != nil {
		r.cfg.Progress(p)
	}
}

// Claimed reports whether profile p is claimed by the implementation and selected
// for this run: the profiles a run certifies.
func (r *Runner) Claimed(p Profile) bool {
	return r.info.HasProfile(string(p)) && (len(r.cfg.Profiles) == 0 || slices.Contains(r.cfg.Profiles, p))
}

// Selected reports whether a spec runs, why not, and whether the reason is only an
// optional feature the implementation does not claim.
func (r *Runner) Selected(s Spec) (ok bool, why string, optional bool) {
	if len(r.cfg.Profiles) > 0 && !slices.Contains(r.cfg.Profiles, s.Profile) {
		return false, fmt.Sprintf("profile %s not selected (profiles: %s)", s.Profile, joinProfiles(r.cfg.Profiles)), false
	}
	if !r.info.HasProfile(string(s.Profile)) {
		return false, fmt.Sprintf("%s does not claim the %s profile", r.info.Name, s.Profile), false
	}
	var missing []string
	for _, f := range s.Features {
		if !r.info.HasFeature(string(f)) {
			missing = append(missing, string(f))
		}
	}
	if len(missing) > 0 {
		return false, fmt.Sprintf("%s does not claim feature %s", r.info.Name, strings.Join(missing, ", ")), true
	}
	for _, o := range []driver.StartOptions{s.Setup.Start, s.Setup.Upgrade} {
		if err := r.info.Offers(o); err != nil {
			return false, err.Error(), false
		}
	}
	return true, "", false
}

// Run runs one spec Repeat times, each in a world of its own, and returns its result
// (the runs combined); it never panics on a failure of the implementation, the driver
// or the environment. A spec that is not selected does not run and is skipped.
func (r *Runner) Run(ctx context.Context, s Spec) Result {
	if ok, why, optional := r.Selected(s); !ok {
		return Result{ID: s.ID, Profile: s.Profile, Description: r.cfg.Budgets.Prose(s.Description), Result: Skipped, Reason: why, Optional: optional}
	}
	r.mu.Lock()
	r.index++
	p := Progress{ID: s.ID, Index: r.index, Total: r.total, Runs: r.cfg.Repeat}
	r.mu.Unlock()
	runs := make([]Result, r.cfg.Repeat)
	for i := range runs {
		if len(runs) > 1 {
			r.cfg.Logf("%s: run %d of %d", s.ID, i+1, len(runs))
		}
		p.Run, p.Started = i+1, time.Now()
		phase := func(ph Phase) {
			p := p
			p.Phase = ph
			r.progress(p)
		}
		runs[i] = r.unlessVoid(ctx, s.ID, func() Result { return r.runOnce(ctx, s, i+1, len(runs), phase) })
		done := p
		done.Result = &runs[i]
		done.Final = len(runs) == 1
		r.progress(done)
	}
	if len(runs) == 1 {
		return runs[0]
	}
	res := Combine(runs)
	r.keepTimelines(&res)
	final := p
	final.Result, final.Final = &res, true
	r.progress(final)
	return res
}

// unlessVoid returns once's result, or, when that run was void (a probe blind and no
// check failed), the result of running it once more, which keeps the void run's
// reason and counts its time (Duration, Phases). Only once: a machine that cannot run
// the probes twice in a row is reported, as an error of the run.
func (r *Runner) unlessVoid(ctx context.Context, id string, once func() Result) Result {
	res := once()
	if !res.blind || ctx.Err() != nil {
		return res
	}
	r.cfg.Logf("%s: the run is void, a probe was blind (%s); running it again in a fresh world", id, res.Reason)
	again := once()
	again.Void = append(again.Void, res.Reason)
	again.Duration += res.Duration
	again.Phases = sumPhases([]Result{res, again})
	return again
}

// keepTimelines removes the saved timelines of a repeated spec's runs that passed,
// but for the one whose checks the result carries: what a reader needs of twenty
// clean runs is one of them, and every run that did not pass.
func (r *Runner) keepTimelines(res *Result) {
	for i := range res.Runs {
		run := &res.Runs[i]
		if run.Result != Passed || i+1 == res.ChecksFrom || run.Timeline == "" {
			continue
		}
		if err := os.Remove(filepath.Join(r.cfg.OutputDir, run.Timeline)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			r.cfg.Logf("%s: %v", res.ID, err)
		}
		run.Timeline = ""
	}
	if res.ChecksFrom > 0 {
		res.Timeline = res.Runs[res.ChecksFrom-1].Timeline
	}
}

// diagnosticsDir is where run i of n of a spec keeps its diagnostics, relative to the
// output directory: runs of a repeated spec do not overwrite each other's.
func diagnosticsDir(id string, i, n int) string {
	if n == 1 {
		return filepath.Join("diagnostics", id)
	}
	return filepath.Join("diagnostics", id, fmt.Sprintf("run-%d", i))
}
