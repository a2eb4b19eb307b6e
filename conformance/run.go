package conformance

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"runtime/debug"
	"slices"
	"strings"
	"time"

	"github.com/dpconform/dpconform/conformance/report"
	"github.com/dpconform/dpconform/driver"
	"github.com/dpconform/dpconform/fv/clocks"
	"github.com/dpconform/dpconform/fv/harness"
	"github.com/dpconform/dpconform/fv/matchers"
	"github.com/dpconform/dpconform/fv/workloads"
	"github.com/dpconform/dpconform/topologies"
)

// runOnce runs a selected spec once in a world of its own; the driver's diagnostics
// of a failed run go to the directory diagnostics, under OutputDir.
func (r *Runner) runOnce(ctx context.Context, s Spec, run, runs int, phase func(Phase)) (res Result) {
	o := &oneRun{r: r, spec: s, res: Result{ID: s.ID, Profile: s.Profile, Description: r.cfg.Budgets.Prose(s.Description)}, clock: newPhaseClock(), progress: phase}
	ctx, cancel := context.WithTimeout(ctx, r.cfg.SpecTimeout)
	defer cancel()
	defer func() {
		o.teardown(ctx)
		res = o.res
	}()
	// A spec that panics is a defect of the suite, not a verdict: the run errors,
	// is taken down like any other, and the rest of the catalogue runs on.
	defer func() {
		if p := recover(); p != nil {
			o.res.Result, o.res.Reason = Errored, fmt.Sprintf("the spec panicked, a defect of the suite: %v", p)
			o.res.Message = string(debug.Stack())
		}
	}()
	o.acquire(ctx, run, runs)
	return o.res
}

// oneRun is one run of a spec on its way through its stages. Each stage that sets
// something up pushes the stage that takes it down; teardown runs those in reverse,
// after the run's verdict, so that what they find wrong (a topology that would not
// close) can still change it.
type oneRun struct {
	r        *Runner
	spec     Spec
	res      Result
	start    time.Time
	clock    *phaseClock
	progress func(Phase)
	down     []stage
}

// stage is a named step of taking a run down.
type stage struct {
	name string
	fn   func(ctx context.Context)
}

func (o *oneRun) phase(p Phase) {
	o.clock.enter(p)
	o.progress(p)
}

func (o *oneRun) then(name string, fn func(ctx context.Context)) {
	o.down = append(o.down, stage{name, fn})
}

// errored ends the run as an error of its environment.
func (o *oneRun) errored(why string, err error) {
	o.res.Result, o.res.Reason = Errored, why+err.Error()
}

// acquire runs the stages that bring up the run's world, and the spec in it: the
// host's settings noted, a topology, the world on it, the control probe, the
// implementation's start, the spec's body, its checks and verdict.
func (o *oneRun) acquire(ctx context.Context, run, runs int) {
	r, s := o.r, o.spec
	o.start = time.Now()
	// What the implementation changes for the whole machine is put back after the
	// run, and reported. (The self-test's concurrent stub runs change nothing.)
	host := snapshotHost()
	o.then("restore host settings", func(context.Context) {
		o.res.HostSettings = host.restore()
		for _, h := range o.res.HostSettings {
			r.cfg.Logf("%s: the implementation changed a host-wide setting: %s", s.ID, h)
		}
	})
	r.cfg.Logf("%s: setting up the topology", s.ID)
	o.phase(PhaseTopology)
	topo, err := r.cfg.NewTopology(ctx, r.info)
	if err != nil {
		o.errored("environment: topology: ", err)
		return
	}
	o.then("close the topology", func(context.Context) {
		if err := topo.Close(); err != nil && o.res.Result == Passed {
			o.errored("environment: topology close: ", err)
		}
	})
	w := harness.New(topo, r.cfg.Driver, r.cfg.Probe)
	w.ProbeStderr = r.cfg.ProbeStderr
	w.ReadyTimeout = r.cfg.Budgets.Ready
	w.ClockAlignmentOff = r.cfg.ClockAlignmentOff
	env := &Env{World: w, Topo: topo, Info: r.info, Budgets: r.cfg.Budgets, Logf: r.cfg.Logf, phase: o.phase}
	// Selected checked that info offers them.
	w.StartOptions, _ = r.info.Resolve(s.Setup.Start)
	env.upgrade, _ = r.info.Resolve(s.Setup.Upgrade)
	o.then("record the starts", func(context.Context) { o.res.Starts = w.Starts() })
	o.then("collect diagnostics and clean up", func(ctx context.Context) {
		o.phase(PhaseCleanup)
		cctx, ccancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
		defer ccancel()
		if o.res.Result == Failed || o.res.Result == Errored {
			o.res.Diagnostics = r.collect(cctx, w, s.ID, diagnosticsDir(s.ID, run, runs))
		}
		if err := w.Cleanup(cctx); err != nil && o.res.Result == Passed {
			o.errored("driver cleanup: ", err)
		}
	})

	if topologies.HasOwnClocks(topo) {
		// Hosts of other clocks: related to the suite's before anything runs, every
		// time after a transition allowed clock-uncertainty more, and a spec whose
		// budgets that would blur refused (Budgets.ClockUncertainty).
		if why := r.cfg.Budgets.ClockRefusal(s.Budgets); why != "" {
			o.res.Result, o.res.Reason = Skipped, "refused: the hosts read clocks of their own, and "+why+": a tenth of what it judges would hang on the clocks"
			return
		}
		if err := o.measureClocks(ctx, w); err != nil {
			o.errored("environment: clocks: ", err)
			return
		}
		env.clock = r.cfg.Budgets.ClockUncertainty
	}
	control, err := startControl(ctx, topo, r.cfg)
	if err != nil {
		o.errored("environment: control probe: ", err)
		return
	}
	o.then("stop the control flow", func(ctx context.Context) { control.kill(context.WithoutCancel(ctx)) })
	o.phase(PhaseStart)
	err = r.setUp(ctx, w, s.Setup)
	if err == nil {
		r.cfg.Logf("%s: running", s.ID)
		o.phase(PhaseWorkloads)
		err = s.Body(ctx, env)
	}
	o.res.Checks = env.Checks()
	controlErr := control.finish(ctx, r.cfg.Budgets)
	clockErr := o.finishClocks(ctx, w)
	r.judge(&o.res, err, controlErr)
	if clockErr != nil && o.res.Result != Skipped {
		// Where the hosts' times may be further off than the checks allowed for,
		// no verdict stands.
		o.errored("environment: clocks: ", clockErr)
	}
	var msgs []string
	for _, c := range o.res.Checks {
		if !c.Passed && c.Message != "" {
			msgs = append(msgs, "check "+c.Name+":\n"+c.Message)
		}
	}
	o.res.Message = strings.Join(msgs, "\n\n")
	o.res.Timeline = r.saveTimeline(&o.res, w, env, run, runs)
}

// measureClocks relates every host's clock to the suite's (harness.MeasureClocks)
// and refuses hosts already more uncertain than clock-uncertainty.
func (o *oneRun) measureClocks(ctx context.Context, w *harness.World) error {
	if err := w.MeasureClocks(ctx); err != nil {
		return err
	}
	for _, hc := range w.Clocks() {
		o.r.cfg.Logf("%s: %s's clock is %s from the suite's (least round trip %s of %d exchanges)", o.spec.ID, hc.Host, hc.First, hc.First.RTT, hc.First.Samples)
	}
	return o.clocksWithin(w.Clocks())
}

// finishClocks measures the hosts' clocks again at the end, records every host's
// figures in the result, and says whether a time a host stamped may be further off
// than clock-uncertainty. A world of one clock has nothing to measure.
func (o *oneRun) finishClocks(ctx context.Context, w *harness.World) error {
	if !topologies.HasOwnClocks(w.Topo) {
		return nil
	}
	hcs, err := w.FinishClocks(ctx)
	for _, hc := range hcs {
		o.res.Clocks = append(o.res.Clocks, clockReport(hc))
	}
	if err != nil {
		return err
	}
	return o.clocksWithin(hcs)
}

func (o *oneRun) clocksWithin(hcs []harness.HostClock) error {
	limit := o.r.cfg.Budgets.ClockUncertainty
	for _, hc := range hcs {
		if u := hc.Uncertainty(); u > limit {
			return fmt.Errorf("%s's clock is %s from the suite's with an uncertainty of %s (least round trip %s, drift %s), over clock-uncertainty=%s: the times it stamps cannot be placed as finely as the checks allow for; measure over a quieter path, or raise the budget", hc.Host, hc.First, u, hc.First.RTT, hc.Drift(), limit)
		}
	}
	return nil
}

func clockReport(hc harness.HostClock) report.ClockReport {
	return report.ClockReport{Host: hc.Host, Offset: clocks.Signed(hc.First.Offset), Uncertainty: hc.Uncertainty().String(),
		Drift: clocks.Signed(hc.Drift()), RTT: hc.First.RTT.String(), Samples: hc.First.Samples}
}

// teardown runs the stages that take the run down, the last set up first; then the
// run's phases (teardown included) and its duration are final.
func (o *oneRun) teardown(ctx context.Context) {
	for i := len(o.down) - 1; i >= 0; i-- {
		o.down[i].fn(ctx)
	}
	o.res.Phases = o.clock.stop()
	o.res.Duration = time.Since(o.start).Round(time.Millisecond)
}

// saveTimeline writes the run's raw timeline, with its scenarios and the marks of its
// checks, to the output directory and returns its path relative to it (empty if it
// could not be written: the report then has no chart for it, and says so).
func (r *Runner) saveTimeline(res *Result, w *harness.World, env *Env, run, runs int) string {
	rel := timelineFile(res.ID, run, runs)
	rec := newTimelineRecord(res.ID, run, w.Timeline(), env.scenarios, res.Checks)
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
