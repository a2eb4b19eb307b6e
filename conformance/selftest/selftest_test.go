// Package selftest proves the suite can fail: every spec passes against the clean
// reference dataplane, and fails against the reference with each fault it names, with
// the expected kind of failure. A spec that cannot fail is a defect.
package selftest

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/dpconform/dpconform/conformance"
	_ "github.com/dpconform/dpconform/conformance/specs"
	"github.com/dpconform/dpconform/driver"
	"github.com/dpconform/dpconform/fv/matchers"
	"github.com/dpconform/dpconform/fv/probe"
	"github.com/dpconform/dpconform/internal/buildbin"
	"github.com/dpconform/dpconform/internal/privileged"
	"github.com/dpconform/dpconform/internal/specbrief"
	"github.com/dpconform/dpconform/reference/faults"
	"github.com/dpconform/dpconform/topologies/netns"
)

func TestMain(m *testing.M) {
	probe.RunIfChild()
	os.Exit(m.Run())
}

func TestSelftest(t *testing.T) {
	RegisterFailHandler(Fail)
	specbrief.RunSpecs(t, "dpconform self-test against the reference dataplane")
}

var (
	bins map[string]string
	// controlPlanes serves every run of the self-test, reset between runs; the stub
	// runs that go two at a time borrow two.
	controlPlanes *netns.ControlPlanes
	// phaseLog keeps a line per run with the time it spent in each phase
	// (_output/selftest/phases.tsv): where the self-test's time goes.
	phaseLog = &conformance.PhaseLog{Path: filepath.Join("..", "..", "_output", "selftest", "phases.tsv")}
)

var _ = BeforeSuite(func(ctx SpecContext) {
	privileged.Ginkgo(Skip, Fail)
	var err error
	bins, err = buildbin.Build(ctx, GinkgoT().TempDir(), "reference/cmd/refdp", "drivers/refdp-driver")
	Expect(err).NotTo(HaveOccurred())
	controlPlanes = netns.NewControlPlanes("", func(f string, a ...any) { GinkgoWriter.Printf(f+"\n", a...) })
	DeferCleanup(func() { Expect(controlPlanes.Close()).To(Succeed()) })
}, NodeTimeout(5*time.Minute))

// runSpec runs one spec against the reference with the given faults on.
func runSpec(ctx context.Context, s conformance.Spec, faults ...string) conformance.Result {
	GinkgoHelper()
	name := "clean"
	if len(faults) > 0 {
		name = strings.Join(faults, "+")
	}
	return runWith(ctx, s, bins["refdp-driver"], name, testBudgets(), faultEnv(faults)...)
}

// faultEnv is the driver environment that turns the reference's faults on.
func faultEnv(faults []string) []string {
	if len(faults) == 0 {
		return nil
	}
	return []string{"DPC_REFDP_FAULTS=" + strings.Join(faults, ",")}
}

// testBudgets are the budgets of the catalogue, but for SVC-SNAT-PRESSURE's churn:
// 15 s instead of a minute, to keep make test within its time. refdp's 4,536 SNAT
// ports are all taken some 5 s into its traffic, and by the end all but a few dozen
// have been taken over by new flows since (docs/faults.md); the full minute is
// measured by hand.
func testBudgets() conformance.Budgets {
	b := conformance.DefaultBudgets
	b.SNATChurn = 15 * time.Second
	return b
}

// runWith runs one spec against the driver at path.
func runWith(ctx context.Context, s conformance.Spec, path, name string, budgets conformance.Budgets, env ...string) conformance.Result {
	GinkgoHelper()
	res, err := run(ctx, s, path, name, budgets, env...)
	Expect(err).NotTo(HaveOccurred())
	return res
}

// EnvClockSkew, set to a duration (1000s), runs the whole self-test with every host on
// a clock of its own (netns.Options.ClockSkew): `make selftest CLOCK_SKEW=1000s`.
const EnvClockSkew = "DPC_CLOCK_SKEW"

// clockSkew is EnvClockSkew's value.
var clockSkew = func() time.Duration {
	d, err := time.ParseDuration(os.Getenv(EnvClockSkew))
	if os.Getenv(EnvClockSkew) != "" && err != nil {
		panic(fmt.Sprintf("%s=%q: want a duration such as 1000s: %v", EnvClockSkew, os.Getenv(EnvClockSkew), err))
	}
	return d
}()

// run is runWith without Gomega, for runs off the spec's goroutine.
func run(ctx context.Context, s conformance.Spec, path, name string, budgets conformance.Budgets, env ...string) (conformance.Result, error) {
	return runConfig(ctx, s, path, name, conformance.Config{Budgets: budgets, ClockSkew: clockSkew}, env...)
}

// runConfig runs one spec against the driver at path with cfg (its Budgets, clock
// skew and alignment; the rest is the self-test's).
func runConfig(ctx context.Context, s conformance.Spec, path, name string, cfg conformance.Config, env ...string) (conformance.Result, error) {
	d, err := driver.NewExec(path, driver.DefaultTimeouts, env...)
	if err != nil {
		return conformance.Result{}, err
	}
	prog, err := probe.Self()
	if err != nil {
		return conformance.Result{}, err
	}
	cfg.Driver, cfg.Probe, cfg.ControlPlanes = d, prog, controlPlanes
	cfg.OutputDir = filepath.Join("..", "..", "_output", "selftest", s.ID, name)
	cfg.Logf = func(f string, a ...any) { GinkgoWriter.Printf(s.ID+" "+name+": "+f+"\n", a...) }
	r, err := conformance.NewRunner(ctx, cfg)
	if err != nil {
		return conformance.Result{}, err
	}
	res := r.Run(ctx, s)
	GinkgoWriter.Printf("%s with %s: %s %s\n", s.ID, name, res.Result, res.Reason)
	GinkgoWriter.Printf("%s with %s took %s: %s\n", s.ID, name, res.Duration, conformance.PhasesString(res.Phases))
	if err := phaseLog.Add(name, res); err != nil {
		GinkgoWriter.Printf("phase log: %v\n", err)
	}
	return res, nil
}

// stubDriver writes a driver that claims every profile and does nothing: its agent is
// "running" and, if ready, reports ready without programming anything, whatever
// version or settings it is started with.
func stubDriver(dir string, ready bool) string {
	GinkgoHelper()
	path := filepath.Join(dir, fmt.Sprintf("stub-driver-ready-%v", ready))
	script := `#!/bin/sh
case "$1" in
info) echo '{"name":"stub","version":"0","profiles":["Core","ModeSwitch","Policy","Upgrade","Observability"],"features":["ClusterIP","NodePort","NodePortRemoteBackend","TCP","UDP","NetworkPolicy","PolicyVerdicts"],"versions":["v1","v2"],"settings":["ct-size"]}' ;;
status) echo '{"running":true,"ready":` + fmt.Sprint(ready) + `}' ;;
collect) echo '{"files":[]}' ;;
*) echo '{}' ;;
esac
`
	Expect(os.WriteFile(path, []byte(script), 0o755)).To(Succeed())
	return path
}

var _ = Describe("the catalogue", func() {
	It("names only faults the reference knows", func() {
		for _, s := range conformance.Specs() {
			for _, fc := range s.Catches {
				Expect(faults.Known()).To(ContainElement(fc.Fault), "%s catches %q, which reference/faults does not define", s.ID, fc.Fault)
			}
		}
	})
})

// stubWorkers is how many stub runs share the machine at once. A stub is judged on
// what it never does (program anything, become ready), not on timing, so unlike the
// reference's runs they need not have the machine to themselves; their world's
// bring-up is most of their time, and two at once use both cores.
const stubWorkers = 2

// stubRun is one run against a stub, started in the background.
type stubRun struct {
	spec    conformance.Spec
	ready   bool
	name    string
	text    string // its spec's text, as focus matches it
	driver  string
	budgets conformance.Budgets
	queued  bool
	done    chan struct{}
	res     conformance.Result
	err     error
}

// result returns the run's result once it is there; a run that was not started in
// the background (its spec looked unselected) runs now.
func (r *stubRun) result(ctx context.Context) (conformance.Result, error) {
	if !r.queued {
		return run(ctx, r.spec, r.driver, r.name, r.budgets)
	}
	select {
	case <-r.done:
		return r.res, r.err
	case <-ctx.Done():
		return conformance.Result{}, fmt.Errorf("waiting for %s against the stub that %s: %w", r.spec.ID, r.name, ctx.Err())
	}
}

// selected guesses whether Ginkgo will run the spec with this full text, from the
// focus and skip expressions it was given, so that a focused self-test does not start
// every stub run in the background. A wrong guess costs time, never a verdict: a spec
// whose run was not started runs it itself.
func selected(text string) bool {
	cfg, _ := GinkgoConfiguration()
	match := func(exprs []string) bool {
		re, err := regexp.Compile(strings.Join(exprs, "|"))
		return err != nil || re.MatchString(text)
	}
	return (len(cfg.FocusStrings) == 0 || match(cfg.FocusStrings)) && (len(cfg.SkipStrings) == 0 || !match(cfg.SkipStrings))
}

// Preconditions are proven, not assumed: an implementation that does nothing fails
// every spec, and so does one that never becomes ready. The runs start together, in
// stubWorkers goroutines, and each spec below judges its own.
var _ = Describe("a stub implementation", Ordered, ContinueOnFailure, func() {
	var runs []*stubRun
	stub := func(s conformance.Spec, ready bool, text string) *stubRun {
		r := &stubRun{spec: s, ready: ready, text: "a stub implementation " + text, budgets: testBudgets(), done: make(chan struct{})}
		if ready {
			r.name = "does-nothing"
			// It will never be programmed: do not wait 10 s for that. Not less than
			// 3 s: the ModeSwitch specs' flows run through the real kube-proxy first,
			// which programs them, and at 1 s with two stub runs at once its warm-up
			// once missed.
			r.budgets.Programmed = 3 * time.Second
			r.budgets.PolicyProgrammed = time.Second
		} else {
			r.name = "never-ready"
			r.budgets.Ready = 2 * time.Second
		}
		runs = append(runs, r)
		return r
	}
	BeforeAll(func() {
		dir := GinkgoT().TempDir()
		drivers := map[bool]string{true: stubDriver(dir, true), false: stubDriver(dir, false)}
		var queued []*stubRun
		for _, r := range runs {
			r.driver = drivers[r.ready]
			if r.queued = selected(r.text); r.queued {
				queued = append(queued, r)
			}
		}
		ctx, cancel := context.WithCancel(context.Background())
		queue := make(chan *stubRun)
		var wg sync.WaitGroup
		for range stubWorkers {
			wg.Go(func() {
				for r := range queue {
					r.res, r.err = run(ctx, r.spec, r.driver, r.name, r.budgets)
					close(r.done)
				}
			})
		}
		go func() {
			defer close(queue)
			for _, r := range queued {
				select {
				case queue <- r:
				case <-ctx.Done():
					return
				}
			}
		}()
		// After the last spec, or on an interrupt: stop what still runs, and wait
		// for its world to be torn down.
		DeferCleanup(wg.Wait)
		DeferCleanup(cancel)
	})

	neverReady := map[string]bool{}
	// needsNeverReady reports whether s proves "never ready fails" on its own. When a
	// spec's Setup starts the implementation on some node, the runner waits for it to
	// be ready before the spec's body runs, so that verdict is decided by the Setup
	// alone and one spec per distinct Setup proves it for all. A spec whose Setup
	// starts nothing waits for readiness in its own body and is proven itself.
	needsNeverReady := func(s conformance.Spec) bool {
		if s.Setup.Deferred || len(s.Setup.KubeProxy) >= netns.DefaultNodes {
			return true
		}
		// What the runner's set-up starts: Setup.Upgrade is for the spec's own steps.
		setup := s.Setup
		setup.Upgrade = driver.StartOptions{}
		key := fmt.Sprintf("%+v", setup) // fmt sorts map keys: a stable key
		first := !neverReady[key]
		neverReady[key] = true
		return first
	}
	for _, s := range conformance.Specs() {
		// It fails the Core and Upgrade specs on a precondition (nothing is
		// programmed), the ModeSwitch specs because kube-proxy's rules are never taken
		// over, the Policy and Observability specs on a precondition (what their
		// policies refuse is reached), and the truth table, whose precondition is that
		// everything is reached, at its first case that refuses anything.
		want := map[conformance.Profile]conformance.FailureKind{
			conformance.Core: matchers.KindPrecondition, conformance.ModeSwitch: conformance.KindRulesLeft,
			conformance.Policy: matchers.KindPrecondition, conformance.Upgrade: matchers.KindPrecondition,
			conformance.Observability: matchers.KindPrecondition,
		}[s.Profile]
		if s.ID == "POLICY-TRUTH-TABLE" {
			want = matchers.KindDelivered
		}
		text := "that does nothing fails " + s.ID + " (" + string(want) + ")"
		nothing := stub(s, true, text)
		It(text, func(ctx SpecContext) {
			res, err := nothing.result(ctx)
			Expect(err).NotTo(HaveOccurred())
			if s.Profile == conformance.ModeSwitch && slices.Equal(res.FailedKinds(), []conformance.FailureKind{matchers.KindPrecondition}) {
				// Before the switch the real kube-proxy carries the traffic, not the
				// stub: once in some hundred runs, with another stub's world sharing the
				// two cores, an attempt through it timed out in the steady state (CI,
				// 2026-12-05), and the run ended before the switch it is here to judge.
				// That says nothing of the stub; its verdict is the next run's.
				GinkgoWriter.Printf("%s: kube-proxy's steady state failed before the switch (%s); running it once more\n", s.ID, res.Reason)
				res, err = run(ctx, nothing.spec, nothing.driver, nothing.name, nothing.budgets)
				Expect(err).NotTo(HaveOccurred())
			}
			Expect(res.Result).To(Equal(conformance.Failed), "%s: %s", res.Result, res.Reason)
			Expect(res.FailedKinds()).To(ContainElement(want), res.Reason)
		}, SpecTimeout(3*time.Minute))

		if !needsNeverReady(s) {
			continue
		}
		text = "that never becomes ready fails " + s.ID + " as not ready"
		never := stub(s, false, text)
		It(text, func(ctx SpecContext) {
			res, err := never.result(ctx)
			Expect(err).NotTo(HaveOccurred())
			Expect(res.Result).To(Equal(conformance.Failed), "%s: %s", res.Result, res.Reason)
			Expect(res.FailedKinds()).To(Equal([]conformance.FailureKind{conformance.KindNotReady}), res.Reason)
		}, SpecTimeout(3*time.Minute))
	}
})

var _ = Describe("every spec", func() {
	for _, s := range conformance.Specs() {
		It(s.ID+" passes against the clean reference", func(ctx SpecContext) {
			res := runSpec(ctx, s)
			Expect(res.Result).To(Equal(conformance.Passed), "%s: %s\n%s", res.Result, res.Reason, res.Message)
		}, SpecTimeout(6*time.Minute))

		for _, fc := range s.Catches {
			It(s.ID+" catches the fault "+fc.Fault, func(ctx SpecContext) {
				// A fault caught by chance (FaultCase.Runs) is caught when one of its
				// runs catches it; a run that passes is another chance, a run that
				// fails in another way is a defect either way.
				for run := 1; ; run++ {
					res := runSpec(ctx, s, fc.Fault)
					if res.Result == conformance.Passed && run < fc.Runs {
						GinkgoWriter.Printf("%s passed against %s in run %d of up to %d: its rate is below one (docs/faults.md)\n", s.ID, fc.Fault, run, fc.Runs)
						continue
					}
					expectCaught(res, fc)
					return
				}
			}, SpecTimeout(time.Duration(max(fc.Runs, 1))*6*time.Minute))
		}
	}
})

// expectCaught asserts that res failed against fc's fault with a kind fc declares.
func expectCaught(res conformance.Result, fc conformance.FaultCase) {
	GinkgoHelper()
	Expect(res.Result).To(Equal(conformance.Failed), "the spec must fail against %s, but: %s %s", fc.Fault, res.Result, res.Reason)
	kinds := res.FailedKinds()
	Expect(slices.ContainsFunc(kinds, func(k conformance.FailureKind) bool { return slices.Contains(fc.Kinds, k) })).
		To(BeTrue(), "it failed with %v, want one of %v: %s", kinds, fc.Kinds, res.Reason)
}
