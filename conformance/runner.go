package conformance

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/dpconform/dpconform/driver"
	"github.com/dpconform/dpconform/fv/harness"
	"github.com/dpconform/dpconform/fv/matchers"
	"github.com/dpconform/dpconform/fv/monotime"
	"github.com/dpconform/dpconform/fv/probe"
	"github.com/dpconform/dpconform/fv/timeline"
	"github.com/dpconform/dpconform/fv/workloads"
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

// Result is the outcome of one spec.
type Result struct {
	ID          string        `json:"id"`
	Profile     Profile       `json:"profile"`
	Description string        `json:"description"`
	Result      ResultKind    `json:"result"`
	Reason      string        `json:"reason,omitempty"`
	Duration    time.Duration `json:"duration"` // void runs (Void) included
	Checks      []CheckResult `json:"checks,omitempty"`
	// Kind is how a spec failed outside its checks (not-ready, precondition).
	Kind FailureKind `json:"kind,omitempty"`
	// Diagnostics are the files the driver collected for a failed spec (of every run),
	// relative to the output directory.
	Diagnostics []string `json:"diagnostics,omitempty"`
	// Runs are the results of each run, in order, when the spec ran more than once
	// (Config.Repeat); the fields above then combine them (combine).
	Runs []Result `json:"runs,omitempty"`
	// ChecksFrom is the run (from 1) whose Checks, Kind and Message the result
	// carries, when it ran more than once.
	ChecksFrom int `json:"checksFrom,omitempty"`
	// Optional is set on a spec skipped only because the implementation does not
	// claim an optional feature it needs: that skip does not keep its profile from
	// passing.
	Optional bool `json:"optional,omitempty"`
	// Message is the full failure message (timelines included) for people.
	Message string `json:"message,omitempty"`
	// HostSettings are the host-wide kernel settings the run changed (of every run),
	// and whether the runner could put them back.
	HostSettings []HostSetting `json:"hostSettings,omitempty"`
	// Starts are the distinct start calls the spec made (of every run), e.g.
	// "start --version v1", "start --version v2": the variants it ran.
	Starts []string `json:"starts,omitempty"`
	// Timeline is the run's raw timeline (TimelineRecord), relative to the output
	// directory; of a spec that ran more than once, the timeline of the run whose
	// checks it carries (each run keeps its own in Runs).
	Timeline string `json:"timeline,omitempty"`
	// Phases is how long the run spent in each phase (of a spec that ran more than
	// once, or whose run was void and ran again, of its runs together): where its time
	// went.
	Phases []PhaseTime `json:"phases,omitempty"`
	// Void are the reasons of runs that were void, each run again in a fresh world:
	// a probe was blind (matchers.ErrBlind, the machine did not run it) and no check
	// had failed, or the control flow was blind, so the run measured nothing either
	// way.
	Void []string `json:"void,omitempty"`

	blind bool // void: a blind probe with no other check failed, or a blind control flow
}

// FailedKinds returns the kinds of the spec's failure and of its failed checks.
func (r Result) FailedKinds() []FailureKind {
	var out []FailureKind
	if r.Kind != "" {
		out = append(out, r.Kind)
	}
	for _, c := range r.Checks {
		if !c.Passed && c.Kind != "" && !slices.Contains(out, c.Kind) {
			out = append(out, c.Kind)
		}
	}
	return out
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
			return netns.New(ctx, netns.Options{CNIConfig: info.CNI, CNIDirs: info.CNIDirs(), Logf: cfg.Logf, ControlPlanes: cfg.ControlPlanes})
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
		return Result{ID: s.ID, Profile: s.Profile, Description: s.Description, Result: Skipped, Reason: why, Optional: optional}
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
	res := combine(runs)
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

// combine folds the runs of a spec into one result: failed if any run failed, error
// if any errored and none failed, passed or skipped only if every run was (a mix of
// passed and skipped runs is a skip that keeps the profile incomplete). It carries the
// checks of the first failed run (else the first errored, else the last) and its
// reason, prefixed with the run.
func combine(runs []Result) Result {
	res := Result{ID: runs[0].ID, Profile: runs[0].Profile, Description: runs[0].Description, Runs: runs}
	count := map[ResultKind]int{}
	for _, run := range runs {
		count[run.Result]++
		res.Duration += run.Duration
		res.Diagnostics = append(res.Diagnostics, run.Diagnostics...)
		res.HostSettings = append(res.HostSettings, run.HostSettings...)
		res.Void = append(res.Void, run.Void...)
		for _, st := range run.Starts {
			if !slices.Contains(res.Starts, st) {
				res.Starts = append(res.Starts, st)
			}
		}
	}
	res.Phases = sumPhases(runs)
	kept := len(runs) - 1
	switch {
	case count[Failed] > 0:
		res.Result, kept = Failed, firstRun(runs, Failed)
	case count[Errored] > 0:
		res.Result, kept = Errored, firstRun(runs, Errored)
	case count[Passed] == len(runs):
		res.Result = Passed
	case count[Skipped] == len(runs):
		res.Result, res.Reason, res.Optional = Skipped, runs[0].Reason, runs[0].Optional
	default:
		res.Result, kept = Skipped, firstRun(runs, Skipped)
		res.Reason = fmt.Sprintf("skipped in %d of %d runs: %s", count[Skipped], len(runs), runs[kept].Reason)
	}
	k := runs[kept]
	res.ChecksFrom, res.Checks, res.Kind, res.Message = kept+1, k.Checks, k.Kind, k.Message
	if res.Result == Failed || res.Result == Errored {
		res.Reason = fmt.Sprintf("run %d: %s", kept+1, k.Reason)
	}
	return res
}

// firstRun returns the index of the first run with result kind.
func firstRun(runs []Result, kind ResultKind) int {
	return slices.IndexFunc(runs, func(r Result) bool { return r.Result == kind })
}

// Passes returns how many of the spec's runs passed, of how many ran: a spec that
// was not repeated ran once, or not at all if skipped.
func (r Result) Passes() (passed, of int) {
	if len(r.Runs) == 0 {
		switch r.Result {
		case Passed:
			return 1, 1
		case Skipped:
			return 0, 0
		}
		return 0, 1
	}
	for _, run := range r.Runs {
		if run.Result == Passed {
			passed++
		}
	}
	return passed, len(r.Runs)
}

// runOnce runs a selected spec once in a world of its own; the driver's diagnostics
// of a failed run go to the directory diagnostics, under OutputDir.
func (r *Runner) runOnce(ctx context.Context, s Spec, run, runs int, phase func(Phase)) (res Result) {
	res = Result{ID: s.ID, Profile: s.Profile, Description: s.Description}
	diagnostics := diagnosticsDir(s.ID, run, runs)
	start := time.Now()
	defer func() { res.Duration = time.Since(start).Round(time.Millisecond) }()
	// Where the run's time went, teardown included: this runs after every other
	// deferred step but the duration's.
	clock := newPhaseClock()
	defer func() { res.Phases = clock.stop() }()
	progress := phase
	phase = func(p Phase) {
		clock.enter(p)
		progress(p)
	}
	ctx, cancel := context.WithTimeout(ctx, r.cfg.SpecTimeout)
	defer cancel()

	// What the implementation changes for the whole machine is put back after the
	// run, and reported. (The self-test's concurrent stub runs change nothing.)
	host := snapshotHost()
	defer func() {
		res.HostSettings = host.restore()
		for _, h := range res.HostSettings {
			r.cfg.Logf("%s: the implementation changed a host-wide setting: %s", s.ID, h)
		}
	}()
	r.cfg.Logf("%s: setting up the topology", s.ID)
	phase(PhaseTopology)
	topo, err := r.cfg.NewTopology(ctx, r.info)
	if err != nil {
		res.Result, res.Reason = Errored, "environment: topology: "+err.Error()
		return res
	}
	defer func() {
		if err := topo.Close(); err != nil && res.Result == Passed {
			res.Result, res.Reason = Errored, "environment: topology close: "+err.Error()
		}
	}()
	w := harness.New(topo, r.cfg.Driver, r.cfg.Probe)
	w.ProbeStderr = r.cfg.ProbeStderr
	w.ReadyTimeout = r.cfg.Budgets.Ready
	env := &Env{World: w, Topo: topo, Info: r.info, Budgets: r.cfg.Budgets, Logf: r.cfg.Logf, phase: phase}
	// Selected checked that info offers them.
	w.StartOptions, _ = r.info.Resolve(s.Setup.Start)
	env.upgrade, _ = r.info.Resolve(s.Setup.Upgrade)
	defer func() { res.Starts = w.Starts() }()
	defer func() {
		phase(PhaseCleanup)
		cctx, ccancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
		defer ccancel()
		if res.Result == Failed || res.Result == Errored {
			res.Diagnostics = r.collect(cctx, w, s.ID, diagnostics)
		}
		if err := w.Cleanup(cctx); err != nil && res.Result == Passed {
			res.Result, res.Reason = Errored, "driver cleanup: "+err.Error()
		}
	}()

	control, err := startControl(ctx, topo, r.cfg)
	if err != nil {
		res.Result, res.Reason = Errored, "environment: control probe: "+err.Error()
		return res
	}
	phase(PhaseStart)
	err = r.setUp(ctx, w, s.Setup)
	if err == nil {
		r.cfg.Logf("%s: running", s.ID)
		phase(PhaseWorkloads)
		err = s.Body(ctx, env)
	}
	res.Checks = env.Checks()
	controlErr := control.finish(ctx, r.cfg.Budgets)
	r.judge(&res, err, controlErr)
	var msgs []string
	for _, c := range res.Checks {
		if !c.Passed && c.Message != "" {
			msgs = append(msgs, "check "+c.Name+":\n"+c.Message)
		}
	}
	res.Message = strings.Join(msgs, "\n\n")
	res.Timeline = r.saveTimeline(&res, w, env, run, runs)
	return res
}

// saveTimeline writes the run's raw timeline, with its scenarios and the marks of its
// checks, to the output directory and returns its path relative to it (empty if it
// could not be written: the report then has no chart for it, and says so).
func (r *Runner) saveTimeline(res *Result, w *harness.World, env *Env, run, runs int) string {
	rel := timelineFile(res.ID, run, runs)
	rec := newTimelineRecord(res.ID, run, w.Timeline, env.scenarios, res.Checks)
	if err := rec.write(filepath.Join(r.cfg.OutputDir, rel)); err != nil {
		r.cfg.Logf("%s: save the timeline: %v", res.ID, err)
		return ""
	}
	return rel
}

// setUp starts the world as the spec's Setup says: kube-proxy on its nodes, the
// implementation on the others (unless deferred), each ready.
func (r *Runner) setUp(ctx context.Context, w *harness.World, su Setup) error {
	var impl []topologies.Node
	for i, n := range w.Topo.Nodes() {
		switch {
		case slices.Contains(su.KubeProxy, i):
			r.cfg.Logf("starting the real kube-proxy on %s", n.Name())
			if err := w.StartKubeProxy(ctx, n); err != nil {
				return fmt.Errorf("%w: %w", ErrEnvironment, err)
			}
		case su.runsImplementation(i):
			impl = append(impl, n)
		}
	}
	if len(impl) == 0 {
		return nil
	}
	r.cfg.Logf("starting %s on %d nodes", r.info.Name, len(impl))
	return w.StartOn(ctx, impl)
}

// judge turns what the body returned into a verdict. Only marked errors are verdicts
// on the implementation (a failed check, a failed precondition, an agent that did not
// come up); a driver that broke its contract, a broken environment and anything
// unmarked are errors of the run.
func (r *Runner) judge(res *Result, err, controlErr error) {
	switch {
	case controlErr != nil:
		res.Result, res.Reason = Errored, "environment: the control flow (suite to external client, crossing no dataplane) failed, so nothing is charged to the implementation: "+controlErr.Error()
		// A blind control flow means the machine did not run the run's probes:
		// whatever the checks said, it measured nothing, so it is run again.
		res.blind = errors.Is(controlErr, matchers.ErrBlind)
	case err != nil && errors.Is(err, topologies.ErrUnsupported):
		// The topology cannot serve what the spec needs: no verdict either way.
		res.Result, res.Reason = Skipped, err.Error()
	case err != nil && driver.IsDriverError(err):
		res.Result, res.Reason = Errored, err.Error()
	case err != nil && errors.Is(err, ErrEnvironment):
		res.Result, res.Reason = Errored, err.Error()
		res.blind = errors.Is(err, matchers.ErrBlind) && !slices.ContainsFunc(res.Checks, func(c CheckResult) bool {
			return !c.Passed && c.Verdict != matchers.Instrument
		})
	case err != nil && errors.Is(err, errPrecondition), err != nil && errors.Is(err, workloads.ErrNotFlowing):
		res.Result, res.Kind = Failed, matchers.KindPrecondition
		res.Reason = "precondition: " + strings.TrimPrefix(err.Error(), errPrecondition.Error()+": ")
	case err != nil && errors.Is(err, harness.ErrNotReady):
		res.Result, res.Kind, res.Reason = Failed, KindNotReady, err.Error()
	case err != nil && errors.Is(err, context.DeadlineExceeded):
		res.Result, res.Reason = Errored, fmt.Sprintf("the spec did not finish within %s: %v", r.cfg.SpecTimeout, err)
	case err != nil:
		res.Result, res.Reason = Errored, err.Error()
	default:
		res.Result = Passed
		for _, c := range res.Checks {
			if !c.Passed {
				res.Result = Failed
				if res.Reason == "" {
					res.Reason = fmt.Sprintf("%s: %s (%s)", c.Name, c.Kind, overBudget(c))
				}
			}
		}
	}
}

// collect asks the driver for diagnostics into OutputDir/dir and returns the files
// that exist, relative to OutputDir.
func (r *Runner) collect(ctx context.Context, w *harness.World, id, dir string) []string {
	files, err := w.Collect(ctx, filepath.Join(r.cfg.OutputDir, dir))
	if err != nil {
		r.cfg.Logf("%s: collect diagnostics: %v", id, err)
	}
	return relativeTo(r.cfg.OutputDir, files)
}

// relativeTo returns the files under dir, relative to it; a report names nothing
// outside its own directory.
func relativeTo(dir string, files []string) []string {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil
	}
	var out []string
	for _, f := range files {
		fa, err := filepath.Abs(f)
		if err != nil {
			continue
		}
		if rel, err := filepath.Rel(abs, fa); err == nil && rel != ".." && !strings.HasPrefix(rel, "../") {
			out = append(out, filepath.ToSlash(rel))
		}
	}
	return out
}

// controlPort is where the control flow's server listens in the external client.
const controlPort = 9999

// control is a flow that crosses no dataplane: from the suite's own namespace to the
// external client, over the fabric. If it fails, the environment is broken.
type control struct {
	tl      *timeline.Timeline
	start   monotime.Time
	server  *probe.Process
	connect *probe.Process
}

// suiteHost runs processes in the suite's own network namespace.
type suiteHost struct{}

func (suiteHost) Name() string              { return "suite" }
func (suiteHost) IP() netip.Addr            { return netip.Addr{} }
func (suiteHost) Start(cmd *exec.Cmd) error { return cmd.Start() }

func startControl(ctx context.Context, topo topologies.Topology, cfg Config) (*control, error) {
	c := &control{tl: timeline.New()}
	opts := probe.Options{OnEvent: c.tl.Add, Stderr: cfg.ProbeStderr}
	var err error
	c.server, err = probe.Start(ctx, topo.External(), cfg.Probe, probe.Serve{Name: "control-server", TCP: []int{controlPort}}, opts)
	if err != nil {
		return nil, err
	}
	target := net.JoinHostPort(topo.External().IP().String(), fmt.Sprint(controlPort))
	// A gentler rate than the specs' probes: it watches the environment, not latency.
	c.connect, err = probe.Start(ctx, suiteHost{}, cfg.Probe, probe.Connect{Name: "control", Target: target, Interval: cfg.Budgets.ControlInterval}, opts)
	if err != nil {
		c.server.Kill(ctx)
		return nil, err
	}
	c.start = monotime.Now()
	return c, nil
}

func (c *control) finish(ctx context.Context, b Budgets) error {
	end := monotime.Now()
	errs := []error{c.connect.Stop(ctx), c.server.Stop(ctx)}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	win := c.tl.Window(c.start, end)
	m := matchers.HaveNoFailedAttempts(matchers.Probes("control"), matchers.MaxBlind(b.ControlMaxBlind))
	ok, err := m.Match(win)
	if err != nil {
		return err
	}
	if !ok {
		return errors.New(m.FailureMessage(win))
	}
	return nil
}

// overBudget renders the figures of a failed check that exceed their budgets.
func overBudget(c CheckResult) string {
	var parts []string
	for _, f := range c.Figures {
		if !f.Within() {
			parts = append(parts, measured(f))
		}
	}
	if len(parts) == 0 {
		return firstLine(c.Message)
	}
	return strings.Join(parts, "; ")
}
