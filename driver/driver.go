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
	"maps"
	"os/exec"
	"slices"
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
	// CNIDir is a directory of CNI plugins the implementation ships, absolute; the
	// topology looks for plugins there before its own directory. Empty means none.
	CNIDir string `json:"cni_dir,omitempty"`
	// Modes, Versions and Settings are the variants `start` can start (--mode,
	// --version, and the keys of --set): a spec that needs a variant the
	// implementation does not offer is skipped, not failed. Empty means none.
	// Versions are listed oldest first.
	Modes    []string `json:"modes,omitempty"`
	Versions []string `json:"versions,omitempty"`
	Settings []string `json:"settings,omitempty"`
}

// StartOptions say which variant of the implementation `start` starts. The zero value
// is the implementation's default, which every driver must be able to start.
type StartOptions struct {
	Mode string // --mode M
	// Version is --version V: one of info's versions, or one named by its place in
	// them (VersionPrevious, VersionLatest), which the suite resolves before it
	// calls the driver.
	Version string
	Set     map[string]string // --set key=value, one flag per key, keys in sorted order
}

// String renders o as the driver call it makes, e.g. "start --version v2".
func (o StartOptions) String() string {
	return strings.Join(append([]string{"start"}, o.Args()...), " ")
}

// Args are the command-line flags of `start` for o: only the options that are set,
// --set flags sorted by key so that a call is reproducible.
func (o StartOptions) Args() []string {
	var args []string
	if o.Mode != "" {
		args = append(args, "--mode", o.Mode)
	}
	if o.Version != "" {
		args = append(args, "--version", o.Version)
	}
	for _, k := range slices.Sorted(maps.Keys(o.Set)) {
		args = append(args, "--set", k+"="+o.Set[k])
	}
	return args
}

// Versions a spec may ask for by their place in info's versions, which lists them
// oldest first, rather than by an implementation's names for them: an upgrade from
// the one before the newest to the newest. Info.Resolve names them.
const (
	VersionPrevious = "@previous"
	VersionLatest   = "@latest"
)

// Resolve replaces a version named by its place (VersionPrevious, VersionLatest)
// with the implementation's name for it; an error when info does not list enough
// versions for it (Offers says the same).
func (i Info) Resolve(o StartOptions) (StartOptions, error) {
	var back int
	switch o.Version {
	case VersionLatest:
		back = 1
	case VersionPrevious:
		back = 2
	default:
		return o, nil
	}
	if len(i.Versions) < back {
		if len(i.Versions) == 0 {
			return o, fmt.Errorf("%s offers no versions: %s needs %d (info's versions, oldest first)", i.Name, o.Version, back)
		}
		return o, fmt.Errorf("%s offers one version (%s): %s needs %d (info's versions, oldest first)", i.Name, i.Versions[0], o.Version, back)
	}
	o.Version = i.Versions[len(i.Versions)-back]
	return o, nil
}

// Offers returns nil if the implementation can start o, or an error that names what
// it does not offer and what it does, e.g. `refdp does not offer version "v2"
// (versions: v1)`: the suite skips a spec that needs it with that reason.
func (i Info) Offers(o StartOptions) error {
	var errs []error
	if o.Mode != "" && !contains(i.Modes, o.Mode) {
		errs = append(errs, i.notOffered("mode", "modes", o.Mode, i.Modes))
	}
	o, err := i.Resolve(o)
	if err != nil {
		errs = append(errs, err)
	} else if o.Version != "" && !contains(i.Versions, o.Version) {
		errs = append(errs, i.notOffered("version", "versions", o.Version, i.Versions))
	}
	for _, k := range slices.Sorted(maps.Keys(o.Set)) {
		if !contains(i.Settings, k) {
			errs = append(errs, i.notOffered("setting", "settings", k, i.Settings))
		}
	}
	return errors.Join(errs...)
}

func (i Info) notOffered(what, plural, want string, offered []string) error {
	if len(offered) == 0 {
		return fmt.Errorf("%s does not offer %s %q (it offers no %s)", i.Name, what, want, plural)
	}
	return fmt.Errorf("%s does not offer %s %q (%s: %s)", i.Name, what, want, plural, strings.Join(offered, ", "))
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
	// ReadySinceNS is, optionally, when the agent that runs now became ready,
	// CLOCK_MONOTONIC nanoseconds (the suite's clock); 0 when not given.
	ReadySinceNS int64 `json:"ready_since_ns,omitempty"`
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
	// Start, if set, starts a driver call's process for this node where the topology
	// runs them: inside the node (its network, mount and cgroup namespaces) on the
	// netns topology. Nil starts it here.
	Start func(*exec.Cmd) error
}

// CNIDirs are the plugin directories the implementation ships: none or CNIDir.
func (i Info) CNIDirs() []string {
	if i.CNIDir == "" {
		return nil
	}
	return []string{i.CNIDir}
}

// Driver is an implementation as the suite sees it. Every method blocks until the verb
// is done or ctx ends.
type Driver interface {
	Info(ctx context.Context) (Info, error)
	// Start starts the variant opts of the agent on the node and returns without
	// waiting for readiness.
	Start(ctx context.Context, n Node, opts StartOptions) error
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
