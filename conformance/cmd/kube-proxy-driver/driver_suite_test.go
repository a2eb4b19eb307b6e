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
	"github.com/dpconform/dpconform/topologies/controlplane"
)

func TestMain(m *testing.M) {
	probe.RunIfChild()
	os.Exit(m.Run())
}

func TestKubeProxyDriver(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "kube-proxy driver on a netns topology")
}

// driverPath is the driver executable, built once for the suite.
var driverPath string

var _ = BeforeSuite(func(ctx SpecContext) {
	privileged.Ginkgo(Skip, Fail)
	bins, _ := controlplane.FindBinaries()
	Expect(bins.HasKubeProxy()).To(Succeed())
	driverPath = filepath.Join(GinkgoT().TempDir(), "kube-proxy-driver")
	cmd := exec.CommandContext(ctx, "go", "build", "-o", driverPath, "github.com/dpconform/dpconform/conformance/cmd/kube-proxy-driver")
	out, err := cmd.CombinedOutput()
	Expect(err).NotTo(HaveOccurred(), "go build kube-proxy-driver: %s", out)
}, NodeTimeout(5*time.Minute))

// newDriver returns the driver adapter with env added to every call.
func newDriver(env ...string) driver.Driver {
	GinkgoHelper()
	d, err := driver.NewExec(driverPath, driver.DefaultTimeouts, env...)
	Expect(err).NotTo(HaveOccurred())
	return d
}

// artifactsDir is where failed specs leave diagnostics: DPC_ARTIFACTS, or
// _output/kube-proxy-driver under the repository root.
func artifactsDir() string {
	if d := os.Getenv("DPC_ARTIFACTS"); d != "" {
		return d
	}
	return filepath.Join("..", "..", "..", "_output", "kube-proxy-driver")
}
