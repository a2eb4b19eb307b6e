package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/onsi/ginkgo/v2/formatter"
	"golang.org/x/term"

	"github.com/dpconform/dpconform/conformance"
	"github.com/dpconform/dpconform/conformance/record"
	"github.com/dpconform/dpconform/conformance/report"
	_ "github.com/dpconform/dpconform/conformance/specs" // the catalogue
	"github.com/dpconform/dpconform/conformance/suite"
	"github.com/dpconform/dpconform/driver"
	"github.com/dpconform/dpconform/fv/probe"
	"github.com/dpconform/dpconform/topologies"
	"github.com/dpconform/dpconform/topologies/kind"
	"github.com/dpconform/dpconform/topologies/netns"
)

// suiteT satisfies Ginkgo's GinkgoTestingT outside `go test`.
type suiteT struct{ failed bool }

func (t *suiteT) Fail() { t.failed = true }

func run(args []string) error {
	fs := flag.NewFlagSet("run", flag.ExitOnError)
	drv := fs.String("driver", "", "path of the implementation's driver executable (required)")
	profiles := fs.String("profiles", "", "comma-separated profiles to run (default: every profile the implementation claims)")
	output := fs.String("output", filepath.Join("_output", "conformance"), "directory for report.yaml, report.html, junit.xml, the run data and diagnostics")
	var env multiFlag
	fs.Var(&env, "driver-env", "KEY=VALUE added to every driver call's environment (repeatable)")
	verbose := fs.Bool("v", false, "also print what each spec does in detail (topology, driver calls, steps)")
	quiet := fs.Bool("quiet", false, "for CI logs: print a line per spec result and a failure's details, no phases")
	var focus multiFlag
	fs.Var(&focus, "focus", "run only specs whose ID matches this regular expression (repeatable); the profiles it leaves incomplete are not certified")
	budgets := conformance.DefaultBudgets
	fs.Func("budget", "override a budget, name=value (repeatable; budgets: "+strings.Join(conformance.BudgetNames(), ", ")+")", budgets.Set)
	topology := fs.String("topology", "netns", "where the specs run: netns (network namespaces on this host), kind (a 2-node kind cluster on the project's dockerd, made once for the run) or cluster (an existing cluster, --kubeconfig); see docs/certification.md")
	kindImage := fs.String("kind-image", "", "the kind node image (default: DPC_KIND_IMAGE, else the one `make kind-image` builds)")
	kindNodes := fs.Int("kind-nodes", kind.DefaultNodes, "kind: the number of nodes (the specs use the first two; a third serves --kind-then's cluster run as the external client's node)")
	kindThen := fs.String("kind-then", "", "kind: a shell command to run after the suite, while the cluster is still up, with DPC_KIND_KUBECONFIG, DPC_KIND_HOST_ADDRESS (this machine as the nodes reach it) and DPC_KIND_SPARE_ADDRESSES (node=IP,...) set; its failure fails the run (make kind-conformance runs the cluster topology on the same cluster this way)")
	var co clusterOptions
	co.flags(fs)
	clockSkew := fs.Duration("clock-skew", 0, "netns: give each node and the external client a CLOCK_MONOTONIC of its own, as on a cluster of separate machines: node i's `D`×(i+1) ahead of the suite's, the external client's D behind (time namespaces; whole seconds, e.g. 1000s); the report gives each host's measured offset and uncertainty")
	repeat := fs.Int("repeat", 1, "run each selected spec `N` times, each in a fresh world; a spec passes only if all N runs pass, and the report gives its passes as k of N")
	fs.Parse(args)
	if *drv == "" {
		return errors.New("--driver is required: the path of your implementation's driver executable (see docs/driver.md)")
	}
	if _, err := suite.FocusOnIDs(focus); err != nil {
		return fmt.Errorf("--focus: %w", err)
	}
	if *repeat < 1 {
		return fmt.Errorf("--repeat %d: want at least 1 (the number of runs of each spec)", *repeat)
	}
	if *topology != "netns" && *topology != "kind" && *topology != "cluster" {
		return fmt.Errorf("--topology %q: want netns, kind or cluster", *topology)
	}
	if *topology == "cluster" && co.kubeconfig == "" {
		return errors.New("--topology cluster needs --kubeconfig: the kubeconfig of the cluster to certify on")
	}
	if *clockSkew != 0 && *topology != "netns" {
		return errors.New("--clock-skew is for --topology netns: a cluster's machines have clocks of their own already")
	}
	if *kindThen != "" && *topology != "kind" {
		return errors.New("--kind-then is for --topology kind")
	}
	if os.Geteuid() != 0 && *topology != "cluster" {
		return fmt.Errorf("the %s topology needs root: run dpconform as root", *topology)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	setup, err := newRunnerSetup(*topology, *drv, env, *output, budgets, *quiet, *verbose)
	if err != nil {
		return err
	}
	defer setup.Close()
	cfg, self, prog := setup.cfg, setup.self, setup.prog
	cfg.Repeat, cfg.ClockSkew = *repeat, *clockSkew
	if cfg.Profiles, err = conformance.ParseProfiles(*profiles); err != nil {
		return fmt.Errorf("--profiles: %w", err)
	}
	var kt *kindTopologies
	if *topology == "kind" {
		kt = &kindTopologies{probe: self, image: *kindImage, nodes: *kindNodes, logf: cfg.Logf}
		defer kt.Close()
		cfg.NewTopology = kt.New
	}
	var ct *clusterTopologies
	if *topology == "cluster" {
		ct = &clusterTopologies{opts: co, self: self, logf: cfg.Logf}
		defer ct.Close()
		cfg.NewTopology = ct.New
	}
	r, err := conformance.NewRunner(ctx, cfg)
	if err != nil {
		return fmt.Errorf("ask the driver for info: %w", err)
	}
	reportTopology := *topology
	if ct != nil {
		if err := ct.prepare(ctx); err != nil {
			return fmt.Errorf("cluster topology: %w", err)
		}
		reportTopology = "cluster (external client: " + ct.cluster.ExternalMode() + ")"
	}
	if kt != nil {
		// Made before the first spec, so that what the kubelets write to the host
		// at their start is not taken for the first spec's implementation's doing.
		if err := kt.prepare(ctx, r.Info()); err != nil {
			return fmt.Errorf("kind topology: %w", err)
		}
	}
	t := &suiteT{}
	var rep report.Report
	// dpconform prints its own progress, each failure's timeline and the summary;
	// Ginkgo's console reporter would write over the live line. (junit.xml is
	// Ginkgo's still.)
	formatter.ColorableStdOut = io.Discard
	suite.Run(t, suite.Options{Runner: r, OutputDir: *output, Summary: summaryAfter(prog, os.Stdout), Focus: focus, Report: &rep, Topology: reportTopology})
	var errs []error
	if err := rep.Certified(); err != nil {
		errs = append(errs, err)
	} else if t.failed {
		errs = append(errs, errors.New("the implementation did not pass every selected spec (see the report)"))
	}
	if *kindThen != "" && kt.cluster != nil {
		if err := kt.then(ctx, *kindThen); err != nil {
			errs = append(errs, fmt.Errorf("--kind-then: %w", err))
		}
	}
	return errors.Join(errs...)
}

// kindTopologies makes one kind cluster for the run, when the first spec needs it
// (with the implementation's CNI), and gives each spec a view of it.
type kindTopologies struct {
	probe, image string
	nodes        int
	logf         func(string, ...any)
	cluster      *kind.Cluster
}

func (k *kindTopologies) prepare(ctx context.Context, info driver.Info) error {
	if k.cluster != nil {
		return nil
	}
	c, err := kind.NewCluster(ctx, kind.Options{Nodes: k.nodes, ProbeBinary: k.probe, Image: k.image, CNIConfig: info.CNI, CNIDirs: info.CNIDirs(), Logf: k.logf})
	if err != nil {
		return err
	}
	k.cluster = c
	return nil
}

func (k *kindTopologies) New(ctx context.Context, info driver.Info) (topologies.Topology, error) {
	if err := k.prepare(ctx, info); err != nil {
		return nil, err
	}
	return k.cluster.Session(ctx)
}

func (k *kindTopologies) Close() {
	if k.cluster != nil {
		if err := k.cluster.Close(); err != nil {
			fmt.Fprintln(os.Stderr, "dpconform: remove the kind cluster:", err)
		}
	}
}

// then runs command with the cluster up, the run's topologies closed.
func (k *kindTopologies) then(ctx context.Context, command string) error {
	var spares []string
	for _, n := range k.cluster.Nodes() {
		spares = append(spares, n.Name()+"="+n.SpareAddress().String())
	}
	cmd := exec.CommandContext(ctx, "/bin/sh", "-c", command)
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	cmd.Env = append(os.Environ(), "DPC_KIND_KUBECONFIG="+k.cluster.Kubeconfig(),
		"DPC_KIND_HOST_ADDRESS="+k.cluster.Daemon().HostAddress().String(),
		"DPC_KIND_SPARE_ADDRESSES="+strings.Join(spares, ","))
	// SIGTERM, not SIGKILL, when ctx ends: a dpconform run then removes what it made.
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 3 * time.Minute
	return cmd.Run()
}

// newProgress prints progress to stderr: a live line on a terminal, a line per phase
// otherwise, a line per result with --quiet; colours only on a terminal that takes
// them (NO_COLOR unset, TERM not dumb).
// runnerSetup is what `run` and `fuzz` configure alike: the driver, told the
// topology on every call (info too: a driver may offer different things on each,
// docs/driver.md; a node's own environment says it again), this binary as the
// probe, one control plane serving the runs one after another (reset between
// them), and the progress display. Close closes the pool and the display.
type runnerSetup struct {
	cfg  conformance.Config
	self string
	prog *ProgressPrinter
	pool *netns.ControlPlanes
}

func newRunnerSetup(topology, drv string, env []string, output string, budgets conformance.Budgets, quiet, verbose bool) (*runnerSetup, error) {
	d, err := driver.NewExec(drv, driver.TimeoutsFor(topology), append(env, "DPC_TOPOLOGY="+topology)...)
	if err != nil {
		return nil, err
	}
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	s := &runnerSetup{self: self, prog: newProgress(quiet), pool: netns.NewControlPlanes("", nil)}
	s.cfg = conformance.Config{Driver: d, Probe: probe.Binary(self), OutputDir: output, Budgets: budgets, ControlPlanes: s.pool, Progress: s.prog.Update}
	if verbose {
		s.cfg.Logf = s.prog.Logf
	}
	return s, nil
}

func (s *runnerSetup) Close() {
	s.prog.Close()
	s.pool.Close()
}

func newProgress(quiet bool) *ProgressPrinter {
	fd := int(os.Stderr.Fd())
	tty := term.IsTerminal(fd)
	mode := ProgressLines
	switch {
	case quiet:
		mode = ProgressQuiet
	case tty:
		mode = ProgressLive
	}
	color := tty && os.Getenv("NO_COLOR") == "" && os.Getenv("TERM") != "dumb"
	p := NewProgressPrinter(os.Stderr, mode, color)
	if w, _, err := term.GetSize(fd); err == nil && tty {
		p.Width = w
	}
	return p
}

// summaryAfter is w, written once the progress printer has stopped and cleared its
// live line.
func summaryAfter(p *ProgressPrinter, w io.Writer) io.Writer {
	return writerFunc(func(b []byte) (int, error) {
		p.Close()
		return w.Write(b)
	})
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(b []byte) (int, error) { return f(b) }

func rebuildReport(args []string) error {
	fs := flag.NewFlagSet("report", flag.ExitOnError)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), "usage: dpconform report DIR\n\nwrites DIR/report.yaml and DIR/report.html again from the run data a run saved in DIR\n(run.json and timelines/)\n")
	}
	fs.Parse(args)
	if fs.NArg() != 1 {
		fs.Usage()
		return errors.New("report needs the output directory of a run")
	}
	dir := fs.Arg(0)
	rep, err := record.Rebuild(dir)
	if err != nil {
		return err
	}
	rep.PrintSummary(os.Stdout)
	fmt.Printf("\nreport: %s\npage:   %s\n", filepath.Join(dir, record.YAMLFile), filepath.Join(dir, record.HTMLFile))
	return nil
}

func specs(args []string) error {
	fs := flag.NewFlagSet("specs", flag.ExitOnError)
	markdown := fs.Bool("markdown", false, "write the catalogue as docs/specs.md has it (make docs)")
	fs.Parse(args)
	if *markdown {
		return conformance.WriteCatalogue(os.Stdout)
	}
	listSpecs()
	return nil
}

func listSpecs() {
	tw := tabwriter.NewWriter(os.Stdout, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tPROFILE\tFEATURES\tCATCHES\tDESCRIPTION")
	for _, s := range conformance.Specs() {
		var faults []string
		for _, f := range s.Catches {
			faults = append(faults, f.Fault)
		}
		var features []string
		for _, f := range s.Features {
			features = append(features, string(f))
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", s.ID, s.Profile, strings.Join(features, ","), strings.Join(faults, ","), conformance.DefaultBudgets.Prose(s.Description))
	}
	tw.Flush()
}
