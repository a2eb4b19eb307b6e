// Package conformance is the dpconform suite: a registry of specs, each an invariant a
// Kubernetes dataplane must hold across a transition, the runner that sets up the world
// for a spec and drives an implementation through its driver, and the report. Ginkgo
// specs, their labels, the report and the self-test are all built from the registry.
//
// A spec is a value (Spec) with a Setup (how its world starts) and a Body that builds
// its workloads and runs one or more Scenarios: traffic, preconditions proven in
// steady state, a transition made of Steps, and checks over the transition's window.
// The Env runs a scenario and owns its timeline, its probes and the classification of
// what went wrong; docs/architecture.md shows how a spec is written.
package conformance

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"sync"

	"github.com/dpconform/dpconform/driver"
)

// FaultCase is a fault of the reference dataplane that a spec must catch, and the
// kinds of failure that count as catching it.
type FaultCase struct {
	Fault string
	Kinds []FailureKind
	// Runs, when above one, says that the spec catches the fault by chance, at a rate
	// measured and recorded (docs/faults.md): its window is shorter than anything a
	// probe can promise to meet, so the self-test counts the fault caught when one of
	// this many runs catches it. Zero or one: the one run must.
	Runs int
}

// Setup says how a spec's world starts, before its body runs. The zero Setup starts
// the implementation on every node and waits until each is ready.
type Setup struct {
	// Start are the options the implementation is started with on every node (a
	// mode, a version, settings: `start --mode/--version/--set`). A spec whose options
	// the implementation's `info` does not offer is skipped with that reason.
	Start driver.StartOptions
	// KubeProxy lists the nodes (by index in Topology.Nodes(): 0 is node-a) that run
	// the real kube-proxy (iptables mode) instead of the implementation at first; a
	// Switch step hands such a node over to the implementation.
	KubeProxy []int
	// Deferred leaves the implementation stopped on every node; the spec's steps
	// start it (a spec of the order in which workloads and agent come up).
	Deferred bool
	// Upgrade are the options the spec's UpgradeAgent steps start the implementation
	// with: another version (driver.VersionLatest after a Start of
	// driver.VersionPrevious), other settings. Like Start, a spec whose options the
	// implementation does not offer is skipped.
	Upgrade driver.StartOptions
}

// runsImplementation reports whether the implementation starts on node i at set-up.
func (s Setup) runsImplementation(i int) bool {
	return !s.Deferred && !slices.Contains(s.KubeProxy, i)
}

// Spec is one conformance spec.
type Spec struct {
	// ID is stable and used in reports, e.g. RESTART-NODEPORT-NEW.
	ID      string
	Profile Profile
	// Features the implementation must claim for the spec to run.
	Features []Feature
	// Description says what the spec holds an implementation to, in one sentence.
	Description string
	// Transition, Traffic and Invariant say in words, for the catalogue
	// (docs/specs.md, made from the registry), what the spec does to the world, what
	// it measures that with, and what must hold, with the default budgets.
	Transition string
	Traffic    string
	Invariant  string
	// Budgets names the budgets (Budgets' `budget` tags) the invariant is held to.
	Budgets []string
	// Origin is where the spec comes from: the defect of a real dataplane it guards
	// against, or the design it holds implementations to.
	Origin string
	// Design says why the spec is built as it is, where a reader of its result needs
	// to know (what it holds on purpose, what it leaves to another spec): prose the
	// catalogue prints, paragraphs separated by blank lines.
	Design string
	// Catches lists the faults of the reference the spec is shown to catch.
	Catches []FaultCase
	// Setup is how the world starts (zero: the implementation on every node).
	Setup Setup
	// Body builds the spec's workloads and runs its scenarios on the Env (Env.Run).
	// An error it returns unmarked is an error of the run, not a verdict.
	Body func(ctx context.Context, e *Env) error
}

var (
	mu       sync.Mutex
	registry = map[string]Spec{}
)

// Register adds a spec; each spec registers itself from its own file's init.
func Register(s Spec) {
	mu.Lock()
	defer mu.Unlock()
	if s.ID == "" || s.Profile == "" || s.Body == nil {
		panic(fmt.Sprintf("conformance: spec %q needs an ID, a profile and a body", s.ID))
	}
	if _, ok := RequiredFeatures[s.Profile]; !ok {
		panic(fmt.Sprintf("conformance: spec %s has unknown profile %q", s.ID, s.Profile))
	}
	if len(s.Catches) == 0 {
		panic(fmt.Sprintf("conformance: spec %s names no fault it catches; a checker that cannot fail is a defect", s.ID))
	}
	for _, c := range s.Catches {
		if c.Fault == "" || len(c.Kinds) == 0 {
			panic(fmt.Sprintf("conformance: spec %s: a caught fault needs a name and the kinds of failure that catch it", s.ID))
		}
	}
	for _, b := range s.Budgets {
		if !slices.Contains(BudgetNames(), b) {
			panic(fmt.Sprintf("conformance: spec %s names budget %q, which Budgets does not have", s.ID, b))
		}
	}
	if _, dup := registry[s.ID]; dup {
		panic("conformance: spec " + s.ID + " registered twice")
	}
	registry[s.ID] = s
}

// Specs returns every registered spec, ordered by profile then ID.
func Specs() []Spec {
	mu.Lock()
	defer mu.Unlock()
	out := make([]Spec, 0, len(registry))
	for _, s := range registry {
		out = append(out, s)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Profile != out[j].Profile {
			return profileOrder(out[i].Profile) < profileOrder(out[j].Profile)
		}
		return out[i].ID < out[j].ID
	})
	return out
}

// Labels are the spec's profile and the features it needs, as Ginkgo labels.
func (s Spec) Labels() []string {
	return append([]string{string(s.Profile)}, featureStrings(s.Features)...)
}

func featureStrings(fs []Feature) []string {
	out := make([]string, len(fs))
	for i, f := range fs {
		out[i] = string(f)
	}
	return out
}
