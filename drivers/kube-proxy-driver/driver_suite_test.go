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
	"github.com/dpconform/dpconform/topologies/controlplane"
)

func TestMain(m *testing.M) {
	probe.RunIfChild()
	os.Exit(m.Run())
}

func TestKubeProxyDriver(t *testing.T) {
	RegisterFailHandler(Fail)
	specbrief.RunSpecs(t, "kube-proxy driver on a netns topology")
}

// driverPath is the driver executable, built once for the suite.
var driverPath string

var _ = BeforeSuite(func(ctx SpecContext) {
	privileged.Ginkgo(Skip, Fail)
	bins, _ := controlplane.FindBinaries()
	Expect(bins.HasKubeProxy()).To(Succeed())
	driverPath = drivertest.Build(ctx, "drivers/kube-proxy-driver")
}, NodeTimeout(5*time.Minute))
