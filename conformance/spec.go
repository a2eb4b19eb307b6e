// Package conformance is the dpconform suite: a registry of specs, each an invariant a
// Kubernetes dataplane must hold across a transition, the runner that sets up the world
// for a spec and drives an implementation through its driver, and the report. Ginkgo
// specs, their labels, the report and the self-test are all built from the registry.
package conformance

import (
	"context"
	"fmt"
	"sort"
	"sync"
)

// Profiles group specs by what an implementation claims to do.
const (
	Core          = "Core"
	ModeSwitch    = "ModeSwitch"
	Policy        = "Policy"
	Upgrade       = "Upgrade"
	Observability = "Observability"
)

// Features an implementation may claim in `info`.
const (
	FeatureClusterIP             = "ClusterIP"
	FeatureNodePort              = "NodePort"
	FeatureNodePortRemoteBackend = "NodePortRemoteBackend"
	FeatureTCP                   = "TCP"
)

// FailureKind says how a spec failed, so the self-test can tell a spec that catches its
// fault from one that fails for another reason.
type FailureKind string

// Failure kinds, derived from what the failed check measured.
const (
	KindReset        FailureKind = "reset"   // RST on a new or established connection
	KindTimeout      FailureKind = "timeout" // no answer within the attempt timeout
	KindWrongBackend FailureKind = "wrong-backend"
	KindGap          FailureKind = "gap"       // a stream stalled beyond its budget
	KindNotAlive     FailureKind = "not-alive" // a stream that should be alive is dead
	KindHang         FailureKind = "hang"      // a stream that should have ended is still silent
	KindDelivered    FailureKind = "delivered" // traffic that must be denied got through
	KindPrecondition FailureKind = "precondition"
	KindOther        FailureKind = "other"
)

// FaultCase is a fault of the reference dataplane that a spec must catch, and the
// kinds of failure that count as catching it.
type FaultCase struct {
	Fault string
	Kinds []FailureKind
}

// Spec is one conformance spec.
type Spec struct {
	// ID is stable and used in reports, e.g. RESTART-NODEPORT-NEW.
	ID      string
	Profile string
	// Features the implementation must claim for the spec to run.
	Features []string
	// Description says what the spec holds an implementation to, in one sentence.
	Description string
	// Catches lists the faults of the reference the spec is shown to catch.
	Catches []FaultCase
	// Run is the body: it sets up workloads and probes, proves its preconditions,
	// drives the transition and records its checks on the Env.
	Run func(ctx context.Context, e *Env) error
}

var (
	mu       sync.Mutex
	registry = map[string]Spec{}
)

// Register adds a spec; each spec registers itself from its own file's init.
func Register(s Spec) {
	mu.Lock()
	defer mu.Unlock()
	if s.ID == "" || s.Profile == "" || s.Run == nil {
		panic(fmt.Sprintf("conformance: spec %q needs an ID, a profile and a body", s.ID))
	}
	if len(s.Catches) == 0 {
		panic(fmt.Sprintf("conformance: spec %s names no fault it catches; a checker that cannot fail is a defect", s.ID))
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

// AllProfiles lists the profiles in report order.
var AllProfiles = []string{Core, ModeSwitch, Policy, Upgrade, Observability}

func profileOrder(p string) int {
	for i, q := range AllProfiles {
		if q == p {
			return i
		}
	}
	return len(AllProfiles)
}
