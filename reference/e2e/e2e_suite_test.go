// Package e2e tests the reference dataplane on a netns topology, driven through its
// own driver executable exactly as the conformance suite drives any implementation.
package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/dpconform/dpconform/driver"
	"github.com/dpconform/dpconform/fv/probe"
	"github.com/dpconform/dpconform/internal/buildbin"
	"github.com/dpconform/dpconform/internal/privileged"
	"github.com/dpconform/dpconform/internal/specbrief"
)

func TestMain(m *testing.M) {
	probe.RunIfChild()
	os.Exit(m.Run())
}

func TestE2E(t *testing.T) {
	RegisterFailHandler(Fail)
	specbrief.RunSpecs(t, "reference dataplane on a netns topology")
}

// binDir holds refdp and refdp-driver, built once for the suite.
var binDir string

var _ = BeforeSuite(func(ctx SpecContext) {
	privileged.Ginkgo(Skip, Fail)
	binDir = GinkgoT().TempDir()
	_, err := buildbin.Build(ctx, binDir, "reference/cmd/refdp", "drivers/refdp-driver")
	Expect(err).NotTo(HaveOccurred())
}, NodeTimeout(5*time.Minute))

// newDriver returns the reference's driver with faults switched on.
func newDriver(faults ...string) driver.Driver {
	env := []string{}
	if len(faults) > 0 {
		env = append(env, "DPC_REFDP_FAULTS="+strings.Join(faults, ","))
	}
	d, err := driver.NewExec(filepath.Join(binDir, "refdp-driver"), driver.DefaultTimeouts, env...)
	Expect(err).NotTo(HaveOccurred())
	return d
}

// artifactsDir is where failed specs leave diagnostics: DPC_ARTIFACTS, or
// _output/e2e under the repository root.
func artifactsDir() string {
	if d := os.Getenv("DPC_ARTIFACTS"); d != "" {
		return d
	}
	return filepath.Join("..", "..", "_output", "e2e")
}
