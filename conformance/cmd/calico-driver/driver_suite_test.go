package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/dpconform/dpconform/fv/driver"
	"github.com/dpconform/dpconform/fv/probe"
	"github.com/dpconform/dpconform/internal/privileged"
)

func TestMain(m *testing.M) {
	probe.RunIfChild()
	os.Exit(m.Run())
}

func TestCalicoDriver(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "calico driver on a netns topology")
}

// driverPath is the driver executable, built once for the suite.
var driverPath string

var _ = BeforeSuite(func(ctx SpecContext) {
	privileged.Ginkgo(Skip, Fail)
	if os.Getenv(EnvDir) == "" {
		privileged.SkipOptionalPeer(Skip, "Calico (Felix, eBPF dataplane)", EnvDir,
			"build Calico from a source tree with `make calico CALICO_SRC=/path/to/calico` (docs/calico.md) and set it to the directory it prints")
	}
	_, err := LoadBuild(os.Getenv(EnvDir))
	Expect(err).NotTo(HaveOccurred(), "%s=%s", EnvDir, os.Getenv(EnvDir))
	driverPath = filepath.Join(GinkgoT().TempDir(), "calico-driver")
	cmd := exec.CommandContext(ctx, "go", "build", "-o", driverPath, "github.com/dpconform/dpconform/conformance/cmd/calico-driver")
	out, err := cmd.CombinedOutput()
	Expect(err).NotTo(HaveOccurred(), "go build calico-driver: %s", out)
}, NodeTimeout(5*time.Minute))

// newDriver returns the driver adapter.
func newDriver() driver.Driver {
	GinkgoHelper()
	d, err := driver.NewExec(driverPath, driver.DefaultTimeouts)
	Expect(err).NotTo(HaveOccurred())
	return d
}

// artifactsDir is where failed specs leave diagnostics: DPC_ARTIFACTS, or
// _output/calico-driver under the repository root.
func artifactsDir() string {
	if d := os.Getenv("DPC_ARTIFACTS"); d != "" {
		return d
	}
	return filepath.Join("..", "..", "..", "_output", "calico-driver")
}
