package conformance

import (
	"fmt"
	"slices"
	"strings"

	"github.com/dpconform/dpconform/driver"
	"github.com/dpconform/dpconform/fv/matchers"
)

// Feature is something an implementation claims in `info`; a spec runs only when the
// implementation claims every feature it needs.
type Feature string

// Features.
const (
	FeatureClusterIP             Feature = "ClusterIP"
	FeatureNodePort              Feature = "NodePort"
	FeatureNodePortRemoteBackend Feature = "NodePortRemoteBackend"
	FeatureTCP                   Feature = "TCP"
	FeatureUDP                   Feature = "UDP"
	FeatureNetworkPolicy         Feature = "NetworkPolicy"
	FeaturePolicyVerdicts        Feature = "PolicyVerdicts"
)

// RequiredFeatures are the features an implementation must claim with each profile:
// a profile's specs need them, so claiming the profile without them would skip every
// spec and certify nothing. Specs may need further, optional features; a spec skipped
// for an optional feature the implementation does not claim does not keep its profile
// from passing.
var RequiredFeatures = map[Profile][]Feature{
	Core:          {FeatureClusterIP, FeatureNodePort, FeatureTCP},
	ModeSwitch:    {FeatureClusterIP, FeatureNodePort, FeatureTCP},
	Policy:        {FeatureNetworkPolicy, FeatureTCP, FeatureUDP},
	Upgrade:       {FeatureClusterIP, FeatureNodePort, FeatureTCP},
	Observability: {FeatureNetworkPolicy, FeaturePolicyVerdicts},
}

// FailureKind says how a spec failed, so that the self-test can tell a spec that
// catches its fault from one that fails for another reason. The kinds of the checks
// are the matchers' own (matchers.Kind); the runner adds KindNotReady.
type FailureKind = matchers.Kind

// Kinds the runner and the State checks add to the matchers' own.
const (
	// KindNotReady: the agent did not report ready within the Ready budget. The
	// implementation was judged and did not come up.
	KindNotReady FailureKind = "not-ready"
	// KindRulesLeft: rules a hand-over must remove (kube-proxy's) are still there.
	KindRulesLeft FailureKind = "rules-left"
	// KindRulesRemoved: rules that are not the implementation's were removed.
	KindRulesRemoved FailureKind = "rules-removed"
	// KindNotFlowing: a Service does not carry new connections when it must.
	KindNotFlowing FailureKind = "not-flowing"
)

// claims checks what the implementation claims: known profiles, and each with its
// required features.
func claims(info driver.Info) error {
	var errs []string
	for _, p := range info.Profiles {
		req, known := RequiredFeatures[Profile(p)]
		if !known {
			errs = append(errs, fmt.Sprintf("unknown profile %q (profiles: %s)", p, joinProfiles(AllProfiles)))
			continue
		}
		var missing []string
		for _, f := range req {
			if !info.HasFeature(string(f)) {
				missing = append(missing, string(f))
			}
		}
		if len(missing) > 0 {
			errs = append(errs, fmt.Sprintf("claims the %s profile without its required features %s", p, strings.Join(missing, ", ")))
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("driver info of %s: %s; claim them in `info` or drop the profile (docs/driver.md)", info.Name, strings.Join(errs, "; "))
	}
	return nil
}

func joinProfiles(ps []Profile) string {
	s := make([]string, len(ps))
	for i, p := range ps {
		s[i] = string(p)
	}
	return strings.Join(s, ", ")
}

// ParseProfiles parses a comma-separated list of profiles, rejecting unknown ones.
func ParseProfiles(list string) ([]Profile, error) {
	var out []Profile
	for _, p := range strings.Split(list, ",") {
		p = strings.TrimSpace(p)
		if p == "" {
			continue
		}
		if !slices.Contains(AllProfiles, Profile(p)) {
			return nil, fmt.Errorf("unknown profile %q; profiles: %s", p, joinProfiles(AllProfiles))
		}
		out = append(out, Profile(p))
	}
	return out, nil
}

func profileOrder(p Profile) int {
	if i := slices.Index(AllProfiles, p); i >= 0 {
		return i
	}
	return len(AllProfiles)
}
