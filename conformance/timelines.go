package conformance

import (
	"compress/gzip"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/dpconform/dpconform/fv/matchers"
	"github.com/dpconform/dpconform/fv/probe"
	"github.com/dpconform/dpconform/fv/timeline"
)

// DataFormat is the format of a run's saved data: its timelines and its record
// (run.json, conformance/record). A reader refuses another.
const DataFormat = 1

// timelines is the directory of a run's output where the runner saves each run's
// raw timeline.
const timelines = "timelines"

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
	rec := TimelineRecord{Format: DataFormat, ID: id, Run: run, Events: all.Events, Transitions: all.Transitions, Verdicts: all.Verdicts, Scenarios: scenarios}
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
	if rec.Format != DataFormat {
		return rec, fmt.Errorf("%s is of format %d; this dpconform reads format %d", path, rec.Format, DataFormat)
	}
	return rec, nil
}
