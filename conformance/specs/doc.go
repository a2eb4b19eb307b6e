// Package specs holds the conformance specs, one file each, registered into the
// conformance registry from their init functions. Importing it for its side effects
// registers the whole catalogue.
//
// A spec reads as the invariant it states: its Setup, the workloads it builds
// (fv/workloads), and the scenarios it runs, each a declared Traffic, Preconditions,
// Transition and Checks that the Env runs (docs/architecture.md, "Writing a spec").
package specs

import (
	"github.com/dpconform/dpconform/conformance"
	"github.com/dpconform/dpconform/topologies"
)

// restart is the transition of the restart specs: a graceful restart of the agent on
// n, or (crash) a SIGKILL and start.
func restart(n topologies.Node, crash bool) conformance.Step {
	if crash {
		return conformance.Crash(n)
	}
	return conformance.Restart(n)
}

func how(crash bool) string {
	if crash {
		return "SIGKILL and start"
	}
	return "graceful restart"
}
