package record

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/html"

	"github.com/dpconform/dpconform/conformance"
	"github.com/dpconform/dpconform/conformance/report"
	"github.com/dpconform/dpconform/fv/matchers"
)

// copyDir copies the recorded run in testdata to a temporary directory, so a test
// may write its reports next to it.
func copyDir(t *testing.T, from string) string {
	t.Helper()
	to := t.TempDir()
	err := filepath.WalkDir(from, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(from, p)
		if d.IsDir() {
			return os.MkdirAll(filepath.Join(to, rel), 0o755)
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(to, rel), data, 0o644)
	})
	if err != nil {
		t.Fatal(err)
	}
	return to
}

// The recorded run (testdata/failed-run) is RESTART-NODEPORT-NEW against refdp with
// eager-service-sync: its two checks failed with 199 and 197 refused attempts across
// a graceful restart (stop-sent, exited, start-sent, ready).
const recordedRun = "testdata/failed-run"

func TestPageOfARecordedFailure(t *testing.T) {
	dir := copyDir(t, recordedRun)
	rep, err := Rebuild(dir)
	if err != nil {
		t.Fatal(err)
	}
	rec, err := LoadRun(dir)
	if err != nil {
		t.Fatal(err)
	}
	page, err := os.ReadFile(filepath.Join(dir, HTMLFile))
	if err != nil {
		t.Fatal(err)
	}
	doc, err := html.Parse(bytes.NewReader(page))
	if err != nil {
		t.Fatal(err)
	}

	// The page and report.yaml are of the same run data.
	yaml, err := os.ReadFile(filepath.Join(dir, YAMLFile))
	if err != nil {
		t.Fatal(err)
	}
	fresh := filepath.Join(t.TempDir(), YAMLFile)
	if err := rec.Report().WriteYAML(fresh); err != nil {
		t.Fatal(err)
	}
	if want, _ := os.ReadFile(fresh); !bytes.Equal(yaml, want) {
		t.Error("report.yaml rebuilt from run.json differs from the report of the same record")
	}
	if s := rep.Profiles[0].Specs[5]; s.ID != "RESTART-NODEPORT-NEW" || s.Result != conformance.Failed || s.Timeline != "timelines/RESTART-NODEPORT-NEW.json.gz" {
		t.Fatalf("the recorded run's report: %+v", s)
	}

	var failedAttempts, marksTotal float64
	var failedChecks int
	for _, r := range rec.Results {
		if r.ID != "RESTART-NODEPORT-NEW" {
			continue
		}
		for _, c := range r.Checks {
			if c.Passed {
				continue
			}
			failedChecks++
			marksTotal += float64(c.MarksTotal)
			for _, f := range c.Figures {
				if f.Name == "failed_attempts" {
					failedAttempts += f.Value
				}
			}
		}
	}
	if failedAttempts != 396 || failedChecks != 2 {
		t.Fatalf("the recorded run has %v failed attempts in %d checks, want 396 in 2", failedAttempts, failedChecks)
	}

	svg := find(doc, func(n *html.Node) bool {
		return n.Data == "svg" && attr(n, "data-chart") == "overview" && attr(n, "id") == "RESTART-NODEPORT-NEW-s1"
	})
	if len(svg) != 1 {
		t.Fatalf("%d overview charts of RESTART-NODEPORT-NEW, want 1", len(svg))
	}
	chart := svg[0]
	// Every failed attempt is in a failure mark, each mark counting its attempts.
	if got := sumN(find(chart, hasClasses("fail", "attempt"))); got != failedAttempts {
		t.Errorf("failure marks count %v attempts, want %v (failed_attempts of the checks)", got, failedAttempts)
	}
	if got := sumN(find(chart, hasClasses("breach"))); got != marksTotal {
		t.Errorf("breach marks count %v, want %v (the checks' marks)", got, marksTotal)
	}
	var events []string
	for _, g := range find(chart, hasClasses("event")) {
		if g.Data == "g" {
			events = append(events, attr(g, "data-event"))
		}
	}
	if !slices.Equal(events, []string{"stop-sent", "exited", "start-sent", "ready"}) {
		t.Errorf("event lines %v, want stop-sent, exited, start-sent, ready", events)
	}
	firsts := find(chart, func(n *html.Node) bool { return n.Data == "g" && hasClasses("first")(n) })
	if len(firsts) != failedChecks {
		t.Errorf("%d first-violation markers, want one per failed check (%d)", len(firsts), failedChecks)
	}
	// The summary links to the first violation, and the link's target exists.
	link := find(doc, func(n *html.Node) bool {
		return n.Data == "a" && strings.HasPrefix(attr(n, "href"), "#RESTART-NODEPORT-NEW-s1-first-")
	})
	if len(link) == 0 {
		t.Fatal("no link to the first violation")
	}
	target := strings.TrimPrefix(attr(link[0], "href"), "#")
	if len(find(doc, func(n *html.Node) bool { return attr(n, "id") == target })) != 1 {
		t.Errorf("the link to the first violation, #%s, has no target", target)
	}
	lanes := find(chart, func(n *html.Node) bool { return n.Data == "g" && hasClasses("lane")(n) })
	var names []string
	for _, l := range lanes {
		names = append(names, attr(l, "data-lane"))
	}
	if !slices.Equal(names, []string{"nodeport-local", "nodeport-remote"}) {
		t.Errorf("lanes %v, want nodeport-local and nodeport-remote", names)
	}
	if len(find(doc, func(n *html.Node) bool { return n.Data == "svg" && attr(n, "data-chart") == "zoom" })) != 1 {
		t.Error("no close-up of the first violation")
	}

	// Self-contained: nothing to fetch, nothing to run.
	for _, n := range find(doc, func(n *html.Node) bool { return n.Type == html.ElementNode }) {
		switch n.Data {
		case "script", "link", "img", "iframe", "object", "embed":
			t.Errorf("the page has a <%s>: it must not fetch or run anything", n.Data)
		}
		for _, a := range n.Attr {
			if (a.Key == "src" || a.Key == "href") && strings.Contains(a.Val, "://") {
				t.Errorf("<%s %s=%q> points off the page", n.Data, a.Key, a.Val)
			}
		}
	}
	if bytes.Contains(page, []byte("url(")) || bytes.Contains(page, []byte("@import")) {
		t.Error("the page's CSS fetches something")
	}

	// Rebuilding the same data makes the same page.
	again, err := RenderHTML(rec, dir)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(again, page) {
		t.Error("the same run data rendered twice differs")
	}
	if len(page) > 200_000 {
		t.Errorf("the page of one spec is %d bytes; charts are bucketed per pixel and should stay small", len(page))
	}
}

func TestRebuildNamesWhatIsMissing(t *testing.T) {
	_, err := Rebuild(t.TempDir())
	if err == nil || !strings.Contains(err.Error(), RunFile) || !strings.Contains(err.Error(), "--output") {
		t.Errorf("Rebuild of an empty directory: %v, want an error naming %s and how a run saves it", err, RunFile)
	}
}

// A missing timeline costs the chart, not the page.
func TestPageWithoutItsTimeline(t *testing.T) {
	dir := copyDir(t, recordedRun)
	if err := os.RemoveAll(filepath.Join(dir, "timelines")); err != nil {
		t.Fatal(err)
	}
	if _, err := Rebuild(dir); err != nil {
		t.Fatal(err)
	}
	page, err := os.ReadFile(filepath.Join(dir, HTMLFile))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(page, []byte("could not be read, so there is no chart")) || bytes.Contains(page, []byte("<svg")) {
		t.Error("a page without its timeline should say so and draw no chart")
	}
}

func find(n *html.Node, match func(*html.Node) bool) []*html.Node {
	var out []*html.Node
	var walk func(*html.Node)
	walk = func(n *html.Node) {
		if match(n) {
			out = append(out, n)
		}
		for c := n.FirstChild; c != nil; c = c.NextSibling {
			walk(c)
		}
	}
	walk(n)
	return out
}

func attr(n *html.Node, key string) string {
	for _, a := range n.Attr {
		if a.Key == key {
			return a.Val
		}
	}
	return ""
}

func hasClasses(classes ...string) func(*html.Node) bool {
	return func(n *html.Node) bool {
		have := strings.Fields(attr(n, "class"))
		for _, c := range classes {
			if !slices.Contains(have, c) {
				return false
			}
		}
		return n.Type == html.ElementNode
	}
}

func sumN(ns []*html.Node) float64 {
	var s float64
	for _, n := range ns {
		v, _ := strconv.ParseFloat(attr(n, "data-n"), 64)
		s += v
	}
	return s
}

// A repeated spec's section lists its runs and the spread of its figures.
func TestPageOfARepeatedSpec(t *testing.T) {
	zero := 0.0
	fig := func(v float64) []conformance.CheckResult {
		return []conformance.CheckResult{{Name: "no failed attempt", Passed: v == 0, Kind: "reset",
			Figures: []matchers.Figure{{Name: "failed_attempts", Value: v, Unit: "attempts", Budget: &zero}}}}
	}
	runs := []conformance.Result{
		{ID: "RESTART-NODEPORT-NEW", Profile: conformance.Core, Result: conformance.Passed, Checks: fig(0), Duration: 12 * time.Second},
		{ID: "RESTART-NODEPORT-NEW", Profile: conformance.Core, Result: conformance.Failed, Reason: "no failed attempt: reset", Checks: fig(14), Duration: 13 * time.Second},
		{ID: "RESTART-NODEPORT-NEW", Profile: conformance.Core, Result: conformance.Passed, Checks: fig(0), Duration: 12 * time.Second},
	}
	rec := RunRecord{Format: conformance.DataFormat, Implementation: report.Implementation{Name: "x", Profiles: []string{"Core"}}, Topology: "netns",
		Budgets: conformance.DefaultBudgets, Repeat: 3, Claimed: []conformance.Profile{conformance.Core}, Results: []conformance.Result{conformance.Combine(runs)}}
	page, err := RenderHTML(rec, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"2 of 3 runs passed", "Spread over the runs", "<td class=\"num\">14</td>", "1 of 3</td>", "No timeline was saved for this run"} {
		if !bytes.Contains(page, []byte(want)) {
			t.Errorf("the page lacks %q", want)
		}
	}
}
