// Package driver is how the suite talks to an implementation: a Go interface for the
// verbs of the driver contract (docs/driver.md), and an adapter that runs a driver
// executable for each call, with a deadline, and tells a driver's own failure (a
// malformed reply, a non-zero exit, a hang) apart from a dataplane failure.
package driver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
)

// Info is what `DRIVER info` reports.
type Info struct {
	Name     string   `json:"name"`
	Version  string   `json:"version"`
	Profiles []string `json:"profiles"`
	Features []string `json:"features"`
	// CNI is the implementation's CNI network configuration list; empty means the
	// topology's default (ptp + host-local).
	CNI json.RawMessage `json:"cni,omitempty"`
}

// HasProfile reports whether the implementation claims profile p.
func (i Info) HasProfile(p string) bool { return contains(i.Profiles, p) }

// HasFeature reports whether the implementation claims feature f.
func (i Info) HasFeature(f string) bool { return contains(i.Features, f) }

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// Status is what `DRIVER status` reports.
type Status struct {
	Running bool `json:"running"`
	Ready   bool `json:"ready"`
}

// Event is one policy verdict reported by `DRIVER events`.
type Event struct {
	TimeNS  int64  `json:"time_ns"`
	Verdict string `json:"verdict"`
	Src     string `json:"src"`
	Dst     string `json:"dst"`
	Proto   string `json:"proto"`
	Sport   int    `json:"sport"`
	Dport   int    `json:"dport"`
	Reason  string `json:"reason"`
}

// Events is a batch of verdicts and the cursor to ask from next time.
type Events struct {
	Cursor string  `json:"cursor"`
	Events []Event `json:"events"`
}

// Node is the environment of one node for driver calls (topologies.Node.DriverEnv).
type Node struct {
	Name string
	Env  []string
}

// Driver is an implementation as the suite sees it. Every method blocks until the verb
// is done or ctx ends.
type Driver interface {
	Info(ctx context.Context) (Info, error)
	// Start starts the agent on the node and returns without waiting for readiness.
	Start(ctx context.Context, n Node, mode string) error
	Status(ctx context.Context, n Node) (Status, error)
	// Stop stops the agent gracefully and returns once it has exited.
	Stop(ctx context.Context, n Node) error
	// Kill crashes the agent (SIGKILL or equivalent).
	Kill(ctx context.Context, n Node) error
	Events(ctx context.Context, n Node, cursor string) (Events, error)
	// Collect writes diagnostics into dir and returns the files written.
	Collect(ctx context.Context, n Node, dir string) ([]string, error)
	// Cleanup removes everything the implementation left on the node.
	Cleanup(ctx context.Context, n Node) error
}

// Error is a failure of the driver itself, never of the dataplane: the suite reports
// it as an error of the run, not as a failed spec.
type Error struct {
	Verb string
	Node string
	// Kind is what went wrong: "timeout", "exit", "malformed" or "exec".
	Kind string
	// Message and Detail are the driver's own {"error","detail"} when it gave them.
	Message string
	Detail  string
	// Stderr is what the driver wrote to stderr (trimmed), kept for the report.
	Stderr string
	Err    error
}

func (e *Error) Error() string {
	where := e.Verb
	if e.Node != "" {
		where += " on " + e.Node
	}
	s := fmt.Sprintf("driver %s: %s", where, e.Kind)
	if e.Message != "" {
		s += ": " + e.Message
	}
	if e.Detail != "" {
		s += " (" + e.Detail + ")"
	}
	if e.Err != nil {
		s += ": " + e.Err.Error()
	}
	if e.Stderr != "" {
		s += "\n  driver stderr:\n    " + indent(e.Stderr)
	}
	return s
}

func (e *Error) Unwrap() error { return e.Err }

// IsDriverError reports whether err is (or wraps) a driver Error.
func IsDriverError(err error) bool {
	var de *Error
	return errors.As(err, &de)
}

func indent(s string) string { return strings.ReplaceAll(s, "\n", "\n    ") }
