package main

import (
	"testing"
	"time"

	. "github.com/onsi/gomega"

	"github.com/dpconform/dpconform/conformance"
	"github.com/dpconform/dpconform/conformance/fuzz"
)

// A replay runs with the budgets its schedule failed with, and the command line's
// over them.
func TestFuzzBudgets(t *testing.T) {
	g := NewWithT(t)
	rf := &fuzz.ReplayFile{Budgets: []string{"stream-max-gap=500ms", "settle=4s"}}
	b, err := fuzzBudgets(rf, "replay.yaml", []string{"settle=2s"})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(b.StreamMaxGap).To(Equal(500 * time.Millisecond))
	g.Expect(b.Settle).To(Equal(2 * time.Second))
	g.Expect(b.EndpointProgrammed).To(Equal(conformance.DefaultBudgets.EndpointProgrammed))

	b, err = fuzzBudgets(nil, "", nil)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(b).To(Equal(conformance.DefaultBudgets))

	_, err = fuzzBudgets(&fuzz.ReplayFile{Budgets: []string{"no-such=1s"}}, "replay.yaml", nil)
	g.Expect(err).To(MatchError(ContainSubstring(`replay file replay.yaml: budget "no-such=1s"`)))
}
