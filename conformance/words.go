package conformance

import "github.com/dpconform/dpconform/conformance/report"

// The engine speaks the report's words: a profile, a result and a phase are what
// report.yaml calls them (conformance/report).
type (
	Profile    = report.Profile
	ResultKind = report.ResultKind
	Phase      = report.Phase
)

// Profiles, in report order (AllProfiles).
const (
	Core          = report.Core
	ModeSwitch    = report.ModeSwitch
	Policy        = report.Policy
	Upgrade       = report.Upgrade
	Observability = report.Observability
)

// AllProfiles lists the profiles in report order.
var AllProfiles = report.AllProfiles

// Results of a spec (and, with Incomplete, of a profile).
const (
	Passed     = report.Passed
	Failed     = report.Failed
	Skipped    = report.Skipped
	Errored    = report.Errored
	Incomplete = report.Incomplete
)

// The phases of a run, in order.
const (
	PhaseTopology    = report.PhaseTopology
	PhaseStart       = report.PhaseStart
	PhaseWorkloads   = report.PhaseWorkloads
	PhaseSteadyState = report.PhaseSteadyState
	PhaseTransition  = report.PhaseTransition
	PhaseSettle      = report.PhaseSettle
	PhaseChecks      = report.PhaseChecks
	PhaseCleanup     = report.PhaseCleanup
)
