// Package record keeps what a run decided (run.json, beside the timelines the runner
// saved) and makes the run's reports from it: report.yaml (conformance/report) and
// report.html, the page with a chart of each check's timeline. A run writes them as it
// ends, and `dpconform report DIR` writes them again from a saved run, the same way.
// The engine never imports it.
package record

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/dpconform/dpconform/conformance"
	"github.com/dpconform/dpconform/conformance/report"
	"github.com/dpconform/dpconform/driver"
)

// The files of a run in its output directory. run.json and the timelines are the run
// data; report.yaml and report.html are made from them, by the run and by
// `dpconform report DIR` from a saved run, the same way.
const (
	RunFile  = "run.json"
	YAMLFile = "report.yaml"
	HTMLFile = "report.html"
)

// RunRecord is what a run decided, saved as run.json: the implementation, the
// budgets and every spec's result with its checks and failure message. With the
// timelines next to it, it is all report.yaml and report.html are made of.
type RunRecord struct {
	Format         int                   `json:"format"`
	Date           time.Time             `json:"date"`
	Implementation report.Implementation `json:"implementation"`
	Topology       string                `json:"topology"`
	Budgets        conformance.Budgets   `json:"budgets"`
	Repeat         int                   `json:"repeat"`
	// Claimed are the profiles the run certifies (conformance.Runner.Claimed).
	Claimed []conformance.Profile `json:"claimed"`
	Results []conformance.Result  `json:"results"`
}

// NewRunRecord records the results of a run of r, in registry order.
func NewRunRecord(r *conformance.Runner, topology string, results []conformance.Result, now time.Time) RunRecord {
	info := r.Info()
	rec := RunRecord{
		Format: conformance.DataFormat, Date: now.UTC().Truncate(time.Second), Topology: topology,
		Implementation: report.Implementation{Name: info.Name, Version: info.Version, Profiles: info.Profiles, Features: info.Features},
		Budgets:        r.Budgets(), Repeat: r.Repeat(), Results: results,
	}
	for _, p := range conformance.AllProfiles {
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
	claimed := func(p conformance.Profile) bool { return slices.Contains(rec.Claimed, p) }
	return conformance.BuildReport(info, rec.Topology, rec.Budgets, rec.Repeat, claimed, rec.Results, rec.Date)
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
	if rec.Format != conformance.DataFormat {
		return rec, fmt.Errorf("%s is of format %d; this dpconform reads format %d", filepath.Join(dir, RunFile), rec.Format, conformance.DataFormat)
	}
	return rec, nil
}
