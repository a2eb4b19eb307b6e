package main

import (
	"os"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/dpconform/dpconform/driver/drivertest"
	"github.com/dpconform/dpconform/fv/probe"
	"github.com/dpconform/dpconform/internal/privileged"
	"github.com/dpconform/dpconform/internal/specbrief"
)

func TestMain(m *testing.M) {
	probe.RunIfChild()
	os.Exit(m.Run())
}

func TestCalicoDriver(t *testing.T) {
	RegisterFailHandler(Fail)
	specbrief.RunSpecs(t, "calico driver on a netns topology")
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
	driverPath = drivertest.Build(ctx, "drivers/calico-driver")
}, NodeTimeout(5*time.Minute))
