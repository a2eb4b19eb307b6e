package conformance

import (
	"compress/gzip"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/dpconform/dpconform/conformance/report"
	"github.com/dpconform/dpconform/driver"
	"github.com/dpconform/dpconform/fv/matchers"
	"github.com/dpconform/dpconform/fv/probe"
	"github.com/dpconform/dpconform/fv/timeline"
)

// The files of a run in its output directory. run.json and the timelines are the run
// data; report.yaml and report.html are made from them, by the run and by
// `dpconform report DIR` from a saved run, the same way.
const (
	RunFile    = "run.json"
	YAMLFile   = "report.yaml"
	HTMLFile   = "report.html"
	timelines  = "timelines"
	dataFormat = 1
)

// RunRecord is what a run decided, saved as run.json: the implementation, the
// budgets and every spec's result with its checks and failure message. With the
// timelines next to it, it is all report.yaml and report.html are made of.
type RunRecord struct {
	Format         int                   `json:"format"`
	Date           time.Time             `json:"date"`
	Implementation report.Implementation `json:"implementation"`
	Topology       string                `json:"topology"`
	Budgets        Budgets               `json:"budgets"`
	Repeat         int                   `json:"repeat"`
	// Claimed are the profiles the run certifies (Runner.Claimed).
	Claimed []Profile `json:"claimed"`
	Results []Result  `json:"results"`
}

// NewRunRecord records the results of a run of r, in registry order.
func NewRunRecord(r *Runner, topology string, results []Result, now time.Time) RunRecord {
	rec := RunRecord{
		Format: dataFormat, Date: now.UTC().Truncate(time.Second), Topology: topology,
		Implementation: report.Implementation{Name: r.info.Name, Version: r.info.Version, Profiles: r.info.Profiles, Features: r.info.Features},
		Budgets:        r.cfg.Budgets, Repeat: r.cfg.Repeat, Results: results,
	}
	for _, p := range AllProfiles {
		if r.Claimed(p) {
			rec.Claimed = append(rec.Claimed, p)
		}
	}
	return rec
}

// Report builds the report of the recorded run.
func (rec RunRecord) Report() report.Report {
	info := driver.Info{Name: rec.Implementation.Name, Version: rec.Implementation.Version,
		Profiles: rec.Implementation.Profiles, Features: rec.Implementation.Features}
	claimed := func(p Profile) bool { return slices.Contains(rec.Claimed, p) }
	return BuildReport(info, rec.Topology, rec.Budgets, rec.Repeat, claimed, rec.Results, rec.Date)
}

// WriteReports saves the run data in dir and writes report.yaml and report.html from
// it (the timelines the results name are already there, saved by the runner).
func (rec RunRecord) WriteReports(dir string) (report.Report, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return report.Report{}, err
	}
	data, err := json.MarshalIndent(rec, "", " ")
	if err != nil {
		return report.Report{}, err
	}
	if err := os.WriteFile(filepath.Join(dir, RunFile), data, 0o644); err != nil {
		return report.Report{}, err
	}
	return rec.writeReports(dir)
}

func (rec RunRecord) writeReports(dir string) (report.Report, error) {
	rep := rec.Report()
	if err := rep.WriteYAML(filepath.Join(dir, YAMLFile)); err != nil {
		return rep, err
	}
	page, err := RenderHTML(rec, dir)
	if err != nil {
		return rep, fmt.Errorf("render %s: %w", HTMLFile, err)
	}
	return rep, os.WriteFile(filepath.Join(dir, HTMLFile), page, 0o644)
}

// Rebuild reads the run data saved in dir and writes its report.yaml and report.html
// again: `dpconform report DIR`.
func Rebuild(dir string) (report.Report, error) {
	rec, err := LoadRun(dir)
	if err != nil {
		return report.Report{}, err
	}
	return rec.writeReports(dir)
}

// LoadRun reads the run data saved in dir.
func LoadRun(dir string) (RunRecord, error) {
	var rec RunRecord
	data, err := os.ReadFile(filepath.Join(dir, RunFile))
	if errors.Is(err, fs.ErrNotExist) {
		return rec, fmt.Errorf("%s has no %s: it is not the output directory of a dpconform run (dpconform run --output DIR)", dir, RunFile)
	}
	if err != nil {
		return rec, err
	}
	if err := json.Unmarshal(data, &rec); err != nil {
		return rec, fmt.Errorf("%s: %w", filepath.Join(dir, RunFile), err)
	}
	if rec.Format != dataFormat {
		return rec, fmt.Errorf("%s is of format %d; this dpconform reads format %d", filepath.Join(dir, RunFile), rec.Format, dataFormat)
	}
	return rec, nil
}

// TimelineRecord is the raw timeline of one run of a spec: every probe event, every
// transition event and policy verdict, where its scenarios fell, and the marks of its
// failed checks. The runner saves it gzipped (timelines/ID.json.gz) and the page of a
// run draws its charts from it.
type TimelineRecord struct {
	Format      int                   `json:"format"`
	ID          string                `json:"id"`
	Run         int                   `json:"run"`
	Events      []probe.Event         `json:"events"`
	Transitions []timeline.Transition `json:"transitions"`
	Verdicts    []timeline.Verdict    `json:"verdicts,omitempty"`
	Scenarios   []ScenarioRecord      `json:"scenarios,omitempty"`
	// Marks are the failed checks' marks, by the check's index in the result.
	Marks map[int][]matchers.Mark `json:"marks,omitempty"`
}

// timelineFile is where run i of n of a spec keeps its timeline, relative to the
// output directory.
func timelineFile(id string, i, n int) string {
	if n == 1 {
		return filepath.Join(timelines, id+".json.gz")
	}
	return filepath.Join(timelines, fmt.Sprintf("%s.run-%d.json.gz", id, i))
}

func newTimelineRecord(id string, run int, tl *timeline.Timeline, scenarios []ScenarioRecord, checks []CheckResult) TimelineRecord {
	all := tl.Window(0, 0)
	rec := TimelineRecord{Format: dataFormat, ID: id, Run: run, Events: all.Events, Transitions: all.Transitions, Verdicts: all.Verdicts, Scenarios: scenarios}
	for i, c := range checks {
		if len(c.Marks) > 0 {
			if rec.Marks == nil {
				rec.Marks = map[int][]matchers.Mark{}
			}
			rec.Marks[i] = c.Marks
		}
	}
	return rec
}

func (rec TimelineRecord) write(path string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	zw := gzip.NewWriter(f)
	err = json.NewEncoder(zw).Encode(rec)
	return errors.Join(err, zw.Close(), f.Close())
}

// ReadTimeline reads a saved timeline.
func ReadTimeline(path string) (TimelineRecord, error) {
	var rec TimelineRecord
	f, err := os.Open(path)
	if err != nil {
		return rec, err
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		return rec, fmt.Errorf("%s: %w", path, err)
	}
	if err := json.NewDecoder(zr).Decode(&rec); err != nil {
		return rec, fmt.Errorf("%s: %w", path, err)
	}
	if rec.Format != dataFormat {
		return rec, fmt.Errorf("%s is of format %d; this dpconform reads format %d", path, rec.Format, dataFormat)
	}
	return rec, nil
}
