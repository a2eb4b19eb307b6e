// Package specbrief runs a Ginkgo suite and repeats each failure's message, in brief,
// where a CI log's tail shows it.
//
// Ginkgo prints a failure's message where the spec ran, often many screens before
// the end of a long suite, and its closing summary names only the spec and its
// location. A CI system that keeps the last lines of a run (ours does) then shows
// that a spec failed but not why. RunSpecs logs each failure again after the suite,
// through the test's own log, which `go test` prints last, under "--- FAIL".
package specbrief

import (
	"fmt"
	"strings"
	"testing"

	"github.com/onsi/ginkgo/v2"
	"github.com/onsi/ginkgo/v2/types"
)

// maxLines is how many lines of a failure's message are repeated: enough for a
// reason and the first lines of a timeline, not the whole of it.
const maxLines = 12

// RunSpecs runs the suite as ginkgo.RunSpecs does, then logs each spec that failed
// (or panicked, or timed out) with its location and the first lines of its message.
// Call it where ginkgo.RunSpecs would be called, after RegisterFailHandler.
func RunSpecs(t *testing.T, description string) bool {
	t.Helper()
	var brief []string
	ginkgo.ReportAfterSuite("failures in brief", func(r ginkgo.Report) {
		for _, s := range r.SpecReports {
			if s.State.Is(types.SpecStateFailureStates) {
				brief = append(brief, Brief(s))
			}
		}
	})
	ok := ginkgo.RunSpecs(t, description)
	for _, b := range brief {
		t.Log(b)
	}
	return ok
}

// Brief is a spec's failure in a few lines: what failed, where, and the start of its
// message (the rest is in the suite's output above it).
func Brief(s types.SpecReport) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s (%s)", strings.ToUpper(s.State.String()), s.FullText(), s.Failure.Location)
	lines := strings.Split(strings.TrimRight(s.Failure.Message, "\n"), "\n")
	for i, l := range lines {
		if i == maxLines {
			fmt.Fprintf(&b, "\n    ... %d more lines in the spec's output above", len(lines)-maxLines)
			break
		}
		b.WriteString("\n    " + l)
	}
	return b.String()
}
