package conformance

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/dpconform/dpconform/fv/driver"
	"github.com/dpconform/dpconform/fv/harness"
	"github.com/dpconform/dpconform/fv/matchers"
	"github.com/dpconform/dpconform/fv/monotime"
	"github.com/dpconform/dpconform/fv/probe"
	"github.com/dpconform/dpconform/fv/timeline"
	"github.com/dpconform/dpconform/topologies"
	"github.com/dpconform/dpconform/topologies/netns"
)

// Results of a spec.
const (
	Passed  = "passed"
	Failed  = "failed"
	Skipped = "skipped"
	Errored = "error"
)

// Config configures a Runner.
type Config struct {
	// Driver is the implementation under test; DriverPath names it in the report.
	Driver     driver.Driver
	DriverPath string
	// Probe is how probes run (the dpconform binary, or a test binary).
	Probe probe.Program
	// Profiles restricts the run to these profiles (empty: every profile the
	// implementation claims).
	Profiles []string
	// Budgets (zero: DefaultBudgets).
	Budgets Budgets
	// NewTopology makes a fresh topology for a spec (default: a 2-node netns topology
	// with the implementation's CNI configuration).
	NewTopology func(ctx context.Context, info driver.Info) (topologies.Topology, error)
	// OutputDir receives diagnostics of failed specs (default _output/conformance).
	OutputDir string
	// SpecTimeout bounds one spec (default 5 min).
	SpecTimeout time.Duration
	// Logf reports progress; ProbeStderr receives probes' stderr. Both may be nil.
	Logf        func(format string, args ...any)
	ProbeStderr io.Writer
}

// Result is the outcome of one spec.
type Result struct {
	ID          string        `json:"id"`
	Profile     string        `json:"profile"`
	Description string        `json:"description"`
	Result      string        `json:"result"`
	Reason      string        `json:"reason,omitempty"`
	Duration    time.Duration `json:"duration"`
	Checks      []CheckResult `json:"checks,omitempty"`
	Diagnostics string        `json:"diagnostics,omitempty"`
	// Message is the full failure message (timelines included) for people.
	Message string `json:"-"`
}

// FailedKinds returns the kinds of the checks that failed.
func (r Result) FailedKinds() []FailureKind {
	var out []FailureKind
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
}

// NewRunner asks the implementation for its info once.
func NewRunner(ctx context.Context, cfg Config) (*Runner, error) {
	if cfg.Budgets == (Budgets{}) {
		cfg.Budgets = DefaultBudgets
	}
	if cfg.OutputDir == "" {
		cfg.OutputDir = filepath.Join("_output", "conformance")
	}
	if cfg.SpecTimeout == 0 {
		cfg.SpecTimeout = 5 * time.Minute
	}
	if cfg.Logf == nil {
		cfg.Logf = func(string, ...any) {}
	}
	if cfg.NewTopology == nil {
		cfg.NewTopology = func(ctx context.Context, info driver.Info) (topologies.Topology, error) {
			return netns.New(ctx, netns.Options{CNIConfig: info.CNI, Logf: cfg.Logf})
		}
	}
	info, err := cfg.Driver.Info(ctx)
	if err != nil {
		return nil, err
	}
	return &Runner{cfg: cfg, info: info}, nil
}

// Info is what the implementation said of itself.
func (r *Runner) Info() driver.Info { return r.info }

// Selected reports whether a spec runs, and why not.
func (r *Runner) Selected(s Spec) (bool, string) {
	if len(r.cfg.Profiles) > 0 && !slices.Contains(r.cfg.Profiles, s.Profile) {
		return false, fmt.Sprintf("profile %s not selected (PROFILES=%s)", s.Profile, strings.Join(r.cfg.Profiles, ","))
	}
	if !r.info.HasProfile(s.Profile) {
		return false, fmt.Sprintf("%s does not claim the %s profile", r.info.Name, s.Profile)
	}
	var missing []string
	for _, f := range s.Features {
		if !r.info.HasFeature(f) {
			missing = append(missing, f)
		}
	}
	if len(missing) > 0 {
		return false, fmt.Sprintf("%s does not claim feature %s", r.info.Name, strings.Join(missing, ", "))
	}
	return true, ""
}

// Run runs one spec in a world of its own and returns its result; it never panics on
// a failure of the implementation, the driver or the environment.
func (r *Runner) Run(ctx context.Context, s Spec) (res Result) {
	res = Result{ID: s.ID, Profile: s.Profile, Description: s.Description}
	start := time.Now()
	defer func() { res.Duration = time.Since(start).Round(time.Millisecond) }()
	if ok, why := r.Selected(s); !ok {
		res.Result, res.Reason = Skipped, why
		return res
	}
	ctx, cancel := context.WithTimeout(ctx, r.cfg.SpecTimeout)
	defer cancel()

	r.cfg.Logf("%s: setting up the topology", s.ID)
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
	env := &Env{World: w, Topo: topo, Info: r.info, Budgets: r.cfg.Budgets, Logf: r.cfg.Logf}
	defer func() {
		cctx, ccancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer ccancel()
		if res.Result == Failed || res.Result == Errored {
			dir := filepath.Join(r.cfg.OutputDir, "diagnostics", s.ID)
			if _, err := w.Collect(cctx, dir); err == nil {
				res.Diagnostics = dir
			}
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
	r.cfg.Logf("%s: starting %s on every node", s.ID, r.info.Name)
	readyCtx, readyCancel := context.WithTimeout(ctx, r.cfg.Budgets.Ready)
	err = w.StartAll(readyCtx)
	readyCancel()
	if err == nil {
		r.cfg.Logf("%s: running", s.ID)
		// The body's transitions are the only ones its windows may see.
		w.Timeline = timeline.New()
		err = s.Run(ctx, env)
	}
	res.Checks = env.Checks()
	controlErr := control.finish(ctx)

	switch {
	case controlErr != nil:
		res.Result, res.Reason = Errored, "environment: the control flow (suite to external client, crossing no dataplane) failed, so nothing is charged to the implementation: "+controlErr.Error()
	case err != nil && driver.IsDriverError(err):
		res.Result, res.Reason = Errored, err.Error()
	case err != nil && errors.Is(err, errEnvironment):
		res.Result, res.Reason = Errored, err.Error()
	case err != nil && errors.Is(err, errPrecondition):
		res.Result, res.Reason = Failed, "precondition: "+strings.TrimPrefix(err.Error(), errPrecondition.Error()+": ")
	case err != nil && errors.Is(err, errImplementation):
		res.Result, res.Reason = Failed, strings.TrimPrefix(err.Error(), errImplementation.Error()+": ")
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
	var msgs []string
	for _, c := range res.Checks {
		if !c.Passed && c.Message != "" {
			msgs = append(msgs, "check "+c.Name+":\n"+c.Message)
		}
	}
	res.Message = strings.Join(msgs, "\n\n")
	return res
}

// errImplementation marks a failure of the implementation that is not a check (it
// did not become ready again, say).
var errImplementation = errors.New("implementation failure")

// Failf returns an error that fails the spec with a reason of the implementation.
func Failf(format string, args ...any) error {
	return fmt.Errorf("%w: %s", errImplementation, fmt.Sprintf(format, args...))
}

// Environmentf returns an error that reports the environment as broken.
func Environmentf(format string, args ...any) error {
	return fmt.Errorf("%w: %s", errEnvironment, fmt.Sprintf(format, args...))
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
	c.connect, err = probe.Start(ctx, suiteHost{}, cfg.Probe, probe.Connect{Name: "control", Target: target, Interval: 10 * time.Millisecond}, opts)
	if err != nil {
		c.server.Kill(ctx)
		return nil, err
	}
	c.start = monotime.Now()
	return c, nil
}

func (c *control) finish(ctx context.Context) error {
	end := monotime.Now()
	errs := []error{c.connect.Stop(ctx), c.server.Stop(ctx)}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	win := c.tl.Window(c.start, end)
	m := matchers.HaveNoFailedAttempts(matchers.Probes("control"), matchers.MaxBlind(time.Second))
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
