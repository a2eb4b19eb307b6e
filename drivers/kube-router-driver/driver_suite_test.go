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

func TestKubeRouterDriver(t *testing.T) {
	RegisterFailHandler(Fail)
	specbrief.RunSpecs(t, "kube-router driver on a netns topology")
}

// driverPath is the driver executable, built once for the suite.
var driverPath string

var _ = BeforeSuite(func(ctx SpecContext) {
	privileged.Ginkgo(Skip, Fail)
	Expect(executable(Binary())).To(Succeed(), "kube-router: run `make kube-router`, or set %s", EnvBinary)
	driverPath = drivertest.Build(ctx, "drivers/kube-router-driver")
}, NodeTimeout(5*time.Minute))
