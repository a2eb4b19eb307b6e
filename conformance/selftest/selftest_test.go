// Package selftest proves the suite can fail: every spec passes against the clean
// reference dataplane, and fails against the reference with each fault it names, with
// the expected kind of failure. A spec that cannot fail is a defect.
package selftest

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/dpconform/dpconform/conformance"
	_ "github.com/dpconform/dpconform/conformance/specs"
	"github.com/dpconform/dpconform/fv/driver"
	"github.com/dpconform/dpconform/fv/probe"
	"github.com/dpconform/dpconform/internal/buildbin"
	"github.com/dpconform/dpconform/internal/privileged"
)

func TestMain(m *testing.M) {
	probe.RunIfChild()
	os.Exit(m.Run())
}

func TestSelftest(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "dpconform self-test against the reference dataplane")
}

var bins map[string]string

var _ = BeforeSuite(func(ctx SpecContext) {
	privileged.Ginkgo(Skip, Fail)
	var err error
	bins, err = buildbin.Build(ctx, GinkgoT().TempDir(), "reference/cmd/refdp", "reference/cmd/refdp-driver")
	Expect(err).NotTo(HaveOccurred())
}, NodeTimeout(5*time.Minute))

// runSpec runs one spec against the reference with the given faults on.
func runSpec(ctx context.Context, s conformance.Spec, faults ...string) conformance.Result {
	GinkgoHelper()
	var env []string
	if len(faults) > 0 {
		env = append(env, "DPC_REFDP_FAULTS="+strings.Join(faults, ","))
	}
	d, err := driver.NewExec(bins["refdp-driver"], driver.DefaultTimeouts, env...)
	Expect(err).NotTo(HaveOccurred())
	prog, err := probe.Self()
	Expect(err).NotTo(HaveOccurred())
	name := "clean"
	if len(faults) > 0 {
		name = strings.Join(faults, "+")
	}
	r, err := conformance.NewRunner(ctx, conformance.Config{
		Driver: d, DriverPath: bins["refdp-driver"], Probe: prog,
		OutputDir: filepath.Join("..", "..", "_output", "selftest", s.ID, name),
		Logf:      func(f string, a ...any) { GinkgoWriter.Printf(f+"\n", a...) },
	})
	Expect(err).NotTo(HaveOccurred())
	res := r.Run(ctx, s)
	GinkgoWriter.Printf("%s with %s: %s %s\n", s.ID, name, res.Result, res.Reason)
	return res
}

var _ = Describe("every spec", func() {
	for _, s := range conformance.Specs() {
		It(s.ID+" passes against the clean reference", func(ctx SpecContext) {
			res := runSpec(ctx, s)
			Expect(res.Result).To(Equal(conformance.Passed), "%s: %s\n%s", res.Result, res.Reason, res.Message)
		}, SpecTimeout(6*time.Minute))

		for _, fc := range s.Catches {
			It(s.ID+" catches the fault "+fc.Fault, func(ctx SpecContext) {
				res := runSpec(ctx, s, fc.Fault)
				Expect(res.Result).To(Equal(conformance.Failed), "the spec must fail against %s, but: %s %s", fc.Fault, res.Result, res.Reason)
				kinds := res.FailedKinds()
				Expect(slices.ContainsFunc(kinds, func(k conformance.FailureKind) bool { return slices.Contains(fc.Kinds, k) })).
					To(BeTrue(), "it failed with %v, want one of %v: %s", kinds, fc.Kinds, res.Reason)
			}, SpecTimeout(6*time.Minute))
		}
	}
})
