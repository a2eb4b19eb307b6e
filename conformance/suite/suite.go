// Package suite runs the catalogue as Ginkgo specs: what `dpconform run` does, for a
// Go implementation that embeds the suite (a conformance.Runner with any
// driver.Driver, and Run), under `go test` or from its own binary.
package suite

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/dpconform/dpconform/conformance"

	"github.com/dpconform/dpconform/conformance/record"
	"github.com/dpconform/dpconform/conformance/report"
	"github.com/onsi/ginkgo/v2"
)

// Options configure Run.
type Options struct {
	Runner *conformance.Runner
	// OutputDir receives report.yaml and junit.xml (default: the runner's OutputDir).
	OutputDir string
	// Topology names the topology provider in the report.
	Topology string
	// Summary, if set, receives a table of the results at the end.
	Summary io.Writer
	// Focus, if set, runs only the specs whose IDs match these regular expressions.
	Focus []string
	// Report, if set, receives the report once it is written.
	Report *report.Report
}

// Run turns the registry into Ginkgo specs (labelled with their profile and
// features), runs them against the runner's implementation, and writes report.yaml
// and junit.xml. It works under `go test` (t is the *testing.T) and from a plain
// binary (t is anything with a Fail method), so vendors can run a compiled suite.
func Run(t ginkgo.GinkgoTestingT, opts Options) bool {
	r := opts.Runner
	cfg := r.Config()
	if opts.OutputDir == "" {
		opts.OutputDir = cfg.OutputDir
	}
	if opts.Topology == "" {
		opts.Topology = "netns"
	}
	var (
		mu      sync.Mutex
		results = map[string]conformance.Result{}
	)
	ginkgo.Describe("dpconform", func() {
		for _, s := range conformance.Specs() {
			labels := s.Labels()
			ginkgo.It(s.ID, ginkgo.Label(labels...), func(ctx ginkgo.SpecContext) {
				ginkgo.By(cfg.Budgets.Prose(s.Description))
				res := r.Run(ctx, s)
				mu.Lock()
				results[s.ID] = res
				mu.Unlock()
				for _, c := range res.Checks {
					ginkgo.AddReportEntry(checkEntry(c), ginkgo.ReportEntryVisibilityFailureOrVerbose)
				}
				switch res.Result {
				case conformance.Skipped:
					ginkgo.Skip(res.Reason)
				case conformance.Errored:
					ginkgo.Fail("ERROR (not a verdict on the implementation)" + passes(res) + ": " + res.Reason + diagnostics(res))
				case conformance.Failed:
					msg := "FAILED"
					if res.Kind != "" {
						msg += " (" + string(res.Kind) + ")"
					}
					msg += passes(res) + ": " + res.Reason
					if res.Message != "" {
						msg += "\n\n" + res.Message
					}
					ginkgo.Fail(msg + diagnostics(res))
				}
			}, ginkgo.SpecTimeout(time.Duration(cfg.Repeat)*(cfg.SpecTimeout+time.Minute)))
		}
	})
	ginkgo.ReportAfterSuite("dpconform report", func(ginkgo.Report) {
		mu.Lock()
		defer mu.Unlock()
		var all []conformance.Result
		for _, s := range conformance.Specs() {
			res, ok := results[s.ID]
			if !ok {
				res = conformance.Result{ID: s.ID, Profile: s.Profile, Description: cfg.Budgets.Prose(s.Description), Result: conformance.Skipped, Reason: "not selected (focus or label filter)"}
				if ok, why, optional := r.Selected(s); !ok {
					res.Reason, res.Optional = why, optional
				}
			}
			all = append(all, res)
		}
		// report.yaml and report.html are made from the run data saved here, as
		// `dpconform report DIR` makes them again from a saved run.
		rep, err := record.NewRunRecord(r, opts.Topology, all, time.Now()).WriteReports(opts.OutputDir)
		if opts.Report != nil {
			*opts.Report = rep
		}
		if err != nil {
			ginkgo.Fail("write the report to " + opts.OutputDir + ": " + err.Error())
		}
		if opts.Summary != nil {
			rep.PrintSummary(opts.Summary)
			fmt.Fprintf(opts.Summary, "\nreport: %s\npage:   %s\njunit:  %s\n", filepath.Join(opts.OutputDir, record.YAMLFile),
				filepath.Join(opts.OutputDir, record.HTMLFile), filepath.Join(opts.OutputDir, "junit.xml"))
		}
	})
	suiteCfg, repCfg := ginkgo.GinkgoConfiguration()
	if repCfg.JUnitReport == "" {
		repCfg.JUnitReport = filepath.Join(opts.OutputDir, "junit.xml")
	}
	if len(opts.Focus) > 0 {
		focus, err := FocusOnIDs(opts.Focus)
		if err != nil {
			fmt.Fprintln(os.Stderr, "dpconform:", err)
			t.Fail()
			return false
		}
		suiteCfg.FocusStrings = append(suiteCfg.FocusStrings, focus)
	}
	if len(cfg.Profiles) > 0 && suiteCfg.LabelFilter == "" {
		suiteCfg.LabelFilter = strings.Join(profileStrings(cfg.Profiles), " || ")
	}
	r.SetTotal(selectedCount(r, opts.Focus))
	return ginkgo.RunSpecs(t, "dpconform conformance: "+r.Info().Name, suiteCfg, repCfg, ginkgo.Labels{"dpconform"})
}

// selectedCount is how many specs a run with these focus expressions will run: the
// "of how many" of its progress.
func selectedCount(r *conformance.Runner, focus []string) int {
	var res []*regexp.Regexp
	for _, f := range focus {
		if re, err := regexp.Compile(f); err == nil {
			res = append(res, re)
		}
	}
	n := 0
	for _, s := range conformance.Specs() {
		if len(res) > 0 && !slices.ContainsFunc(res, func(re *regexp.Regexp) bool { return re.MatchString(s.ID) }) {
			continue
		}
		if ok, _, _ := r.Selected(s); ok {
			n++
		}
	}
	return n
}

// FocusOnIDs turns regular expressions over spec IDs (SuiteOptions.Focus) into the
// one Ginkgo focus that selects exactly the specs whose ID one of them matches.
// Ginkgo matches a focus against a spec's full text, its containers' texts and then
// the ID, where ^ would not mean the start of the ID.
func FocusOnIDs(exprs []string) (string, error) {
	var ids []string
	for _, s := range conformance.Specs() {
		ids = append(ids, s.ID)
	}
	return focusOn(exprs, ids)
}

func focusOn(exprs, ids []string) (string, error) {
	var res []*regexp.Regexp
	for _, e := range exprs {
		re, err := regexp.Compile(e)
		if err != nil {
			return "", fmt.Errorf("focus %q is not a regular expression: %w", e, err)
		}
		res = append(res, re)
	}
	var picked []string
	for _, id := range ids {
		if slices.ContainsFunc(res, func(re *regexp.Regexp) bool { return re.MatchString(id) }) {
			picked = append(picked, regexp.QuoteMeta(id))
		}
	}
	return "(^| )(" + strings.Join(picked, "|") + ")$", nil
}

func checkEntry(c conformance.CheckResult) string {
	state := "passed"
	if !c.Passed {
		state = "FAILED (" + string(c.Kind) + ")"
	}
	var figs []string
	for _, f := range c.Figures {
		figs = append(figs, conformance.FigureText(f))
	}
	return fmt.Sprintf("check %q %s: %s", c.Name, state, strings.Join(figs, "; "))
}

// passes says how many runs of a repeated spec passed, for its failure message.
func passes(r conformance.Result) string {
	if len(r.Runs) == 0 {
		return ""
	}
	k, n := r.Passes()
	return fmt.Sprintf(", passed %d of %d runs", k, n)
}

func diagnostics(r conformance.Result) string {
	if len(r.Diagnostics) == 0 {
		return ""
	}
	return fmt.Sprintf("\n\ndiagnostics from the driver (%d files, in the output directory): %s", len(r.Diagnostics), strings.Join(r.Diagnostics, ", "))
}

func profileStrings(ps []conformance.Profile) []string {
	out := make([]string, len(ps))
	for i, p := range ps {
		out[i] = string(p)
	}
	return out
}
