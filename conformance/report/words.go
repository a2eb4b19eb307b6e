// Package report is the ConformanceReport a dpconform run writes (report.yaml) and a
// vendor publishes: its types, which are the format's API (APIVersion), the words
// they are made of (profiles, results, phases) and how a report reads for people.
// It imports nothing of the suite, so that a vendor's tooling and the results
// ledger read reports without it.
package report

// Profile groups specs by what an implementation claims to do.
type Profile string

// Profiles, in report order (AllProfiles).
const (
	Core          Profile = "Core"
	ModeSwitch    Profile = "ModeSwitch"
	Policy        Profile = "Policy"
	Upgrade       Profile = "Upgrade"
	Observability Profile = "Observability"
)

// AllProfiles lists the profiles in report order.
var AllProfiles = []Profile{Core, ModeSwitch, Policy, Upgrade, Observability}

// ResultKind is the outcome of a spec or a profile.
type ResultKind string

// Results of a spec (and, with Partial and Incomplete, of a profile).
const (
	Passed  ResultKind = "passed"
	Failed  ResultKind = "failed"
	Skipped ResultKind = "skipped"
	// Errored: the spec could not be judged (a driver that broke its contract, a
	// broken environment); not a verdict on the implementation.
	Errored ResultKind = "error"
	// Incomplete: a profile the implementation claims had specs that did not run for
	// a reason other than an optional feature it does not claim (a focus, a start
	// option it does not offer): it is not certified.
	Incomplete ResultKind = "incomplete"
)

// Phase is a stage of one run of a spec, as progress shows it.
type Phase string

// The phases of a run, in order. A spec with several scenarios goes through the
// scenario phases once per scenario.
const (
	PhaseTopology    Phase = "topology"     // a fresh topology and its control plane
	PhaseStart       Phase = "start"        // the implementation started, until ready
	PhaseWorkloads   Phase = "workloads"    // pods, Services and policies, flows warmed up
	PhaseSteadyState Phase = "steady state" // traffic runs; preconditions proven
	PhaseTransition  Phase = "transition"   // the transition's steps
	PhaseSettle      Phase = "settle"       // traffic runs on after the last step
	PhaseChecks      Phase = "checks"       // invariants judged
	PhaseCleanup     Phase = "cleanup"      // diagnostics, driver clean-up, teardown
)
