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

func TestCiliumDriver(t *testing.T) {
	RegisterFailHandler(Fail)
	specbrief.RunSpecs(t, "cilium driver on a netns topology")
}

// driverPath is the driver executable, built once for the suite.
var driverPath string

var _ = BeforeSuite(func(ctx SpecContext) {
	privileged.Ginkgo(Skip, Fail)
	Expect(newAgent(Dir(), Clang(), skelNode()).checkInstall()).To(Succeed(), "Cilium: run `make cilium`, or set %s and %s", EnvDir, EnvClang)
	driverPath = drivertest.Build(ctx, "drivers/cilium-driver")
}, NodeTimeout(5*time.Minute))
