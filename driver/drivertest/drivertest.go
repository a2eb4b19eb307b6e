// Package drivertest holds what the tests of a driver share (the shipped ones in
// drivers/, and conformance/peers, which runs them; a vendor's too): building a
// driver once, running it as a process, and a node environment that is well-formed
// but no node. Only tests import it.
package drivertest

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path"
	"path/filepath"

	"github.com/onsi/ginkgo/v2"
	"github.com/onsi/gomega"

	"github.com/dpconform/dpconform/driver"
	"github.com/dpconform/dpconform/internal/buildbin"
	"github.com/dpconform/dpconform/topologies/controlplane"
)

// Build builds the driver command pkg (relative to the module, e.g.
// "drivers/cilium-driver") into a temporary directory and returns its path.
func Build(ctx context.Context, pkg string) string {
	ginkgo.GinkgoHelper()
	bins, err := buildbin.Build(ctx, ginkgo.GinkgoT().TempDir(), pkg)
	gomega.Expect(err).NotTo(gomega.HaveOccurred())
	return bins[path.Base(pkg)]
}

// NewExec returns the adapter for the driver executable bin, with env added to every
// call.
func NewExec(bin string, env ...string) driver.Driver {
	ginkgo.GinkgoHelper()
	d, err := driver.NewExec(bin, driver.DefaultTimeouts, env...)
	gomega.Expect(err).NotTo(gomega.HaveOccurred())
	return d
}

// Call runs the driver executable bin once with exactly env, plus what locates
// programs and the binaries' cache (PATH, and those of controlplane.CacheEnv where
// set), and returns its exit code and decoded stdout. Without HOME a driver finds the
// cache of another user than the test's (Go's os.UserHomeDir fails; a driver falls
// back to /root).
func Call(bin string, env []string, args ...string) (int, map[string]any) {
	ginkgo.GinkgoHelper()
	cmd := exec.Command(bin, args...)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
	for _, k := range controlplane.CacheEnv {
		if v, ok := os.LookupEnv(k); ok {
			cmd.Env = append(cmd.Env, k+"="+v)
		}
	}
	cmd.Env = append(cmd.Env, env...)
	var stdout bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, ginkgo.GinkgoWriter
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else {
		gomega.Expect(err).NotTo(gomega.HaveOccurred())
	}
	var out map[string]any
	gomega.Expect(json.Unmarshal(stdout.Bytes(), &out)).To(gomega.Succeed(), "stdout is not one JSON object: %q", stdout.String())
	return code, out
}

// TB is the subset of testing.TB that NodeEnv needs: a *testing.T, or ginkgo.GinkgoT() in a
// spec.
type TB interface {
	Helper()
	TempDir() string
	Fatal(args ...any)
}

// NodeEnv returns a well-formed node environment pointing at files that exist but are
// no node: a new temporary directory with empty netns and kubeconfig files is
// DPC_STATE_DIR and each of dirVars (cilium's DPC_BPFFS). The order is fixed, as
// tests slice it: DPC_NODE, DPC_NETNS, DPC_KUBECONFIG, DPC_STATE_DIR, dirVars,
// DPC_TOPOLOGY=netns.
func NodeEnv(t TB, dirVars ...string) []string {
	t.Helper()
	dir := t.TempDir()
	nsFile := filepath.Join(dir, "netns")
	kubeconfig := filepath.Join(dir, "kubeconfig")
	for _, f := range []string{nsFile, kubeconfig} {
		if err := os.WriteFile(f, nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	env := []string{"DPC_NODE=node-a", "DPC_NETNS=" + nsFile, "DPC_KUBECONFIG=" + kubeconfig, "DPC_STATE_DIR=" + dir}
	for _, v := range dirVars {
		env = append(env, v+"="+dir)
	}
	return append(env, "DPC_TOPOLOGY=netns")
}

// ArtifactsDir is where failed specs of the driver command name leave diagnostics:
// DPC_ARTIFACTS, or _output/<name> in the root of the module whose test runs (the
// nearest directory above the test's that holds a go.mod).
func ArtifactsDir(name string) string {
	if d := os.Getenv("DPC_ARTIFACTS"); d != "" {
		return d
	}
	root, err := os.Getwd()
	if err != nil {
		return filepath.Join("_output", name)
	}
	for dir := root; ; dir = filepath.Dir(dir) {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return filepath.Join(dir, "_output", name)
		}
		if dir == filepath.Dir(dir) {
			return filepath.Join(root, "_output", name)
		}
	}
}
