package fuzz

import (
	"fmt"
	"os"
	"strings"

	"sigs.k8s.io/yaml"

	"github.com/dpconform/dpconform/conformance"
)

// The replay file's type.
const (
	ReplayAPIVersion = "dpconform.dev/fuzz/v1"
	ReplayKind       = "Replay"
)

// ReplayFile is a schedule that failed, written so that `dpconform fuzz --replay`
// runs it again: the schedule, and for the reader what it ran against and how it
// failed.
type ReplayFile struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	// Implementation is the name and version the schedule failed against; Budgets
	// the budgets overridden then (name=value): a replay with others may not fail.
	Implementation string   `json:"implementation"`
	Budgets        []string `json:"budgets,omitempty"`
	// Failed are the kinds of its violations, FirstViolation the check that failed.
	Failed         []conformance.FailureKind `json:"failed,omitempty"`
	FirstViolation string                    `json:"firstViolation,omitempty"`
	Schedule       Schedule                  `json:"schedule"`
}

// NewReplayFile records s, which failed against r's implementation with res.
func NewReplayFile(r *conformance.Runner, s Schedule, res conformance.Result) ReplayFile {
	info := r.Info()
	return ReplayFile{APIVersion: ReplayAPIVersion, Kind: ReplayKind, Implementation: strings.TrimSpace(info.Name + " " + info.Version),
		Budgets: r.Budgets().Overridden(), Failed: res.FailedKinds(), FirstViolation: res.Reason, Schedule: s}
}

// Write writes f to path as YAML.
func (f ReplayFile) Write(path string) error {
	b, err := yaml.Marshal(f)
	if err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o644)
}

// ReadReplayFile reads a replay file, refusing one of another type or with fields
// it does not know (a typo would otherwise replay another schedule).
func ReadReplayFile(path string) (ReplayFile, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return ReplayFile{}, err
	}
	var f ReplayFile
	if err := yaml.UnmarshalStrict(b, &f); err != nil {
		return ReplayFile{}, fmt.Errorf("replay file %s: %w", path, err)
	}
	if f.APIVersion != ReplayAPIVersion || f.Kind != ReplayKind {
		return ReplayFile{}, fmt.Errorf("replay file %s: apiVersion %q, kind %q: want %s, %s (a file `dpconform fuzz` wrote)", path, f.APIVersion, f.Kind, ReplayAPIVersion, ReplayKind)
	}
	if len(f.Schedule.Actions) == 0 {
		return ReplayFile{}, fmt.Errorf("replay file %s: the schedule has no steps", path)
	}
	return f, nil
}
