// Package privileged decides what a test that needs root does when it is not root.
//
// Tests that create network namespaces, load BPF programs or change iptables run for
// real as root. Elsewhere they skip with a loud reason, unless DPC_REQUIRE_PRIVILEGED=1
// (set by CI), where a skip would hide work and so is a failure instead.
package privileged

import (
	"fmt"
	"os"
)

// EnvRequire is the environment variable that turns a privilege skip into a failure.
const EnvRequire = "DPC_REQUIRE_PRIVILEGED"

// TB is the subset of testing.TB that Require needs.
type TB interface {
	Helper()
	Skip(args ...any)
	Fatal(args ...any)
}

// Missing returns why this process cannot run privileged tests, or "" when it can.
func Missing() string {
	if os.Geteuid() != 0 {
		return fmt.Sprintf("needs root (network namespaces, BPF, iptables); running as uid %d", os.Geteuid())
	}
	return ""
}

// Required reports whether DPC_REQUIRE_PRIVILEGED asks for privileged tests to run.
func Required() bool { return os.Getenv(EnvRequire) == "1" }

// Require skips t loudly when it cannot run privileged tests, or fails it when
// DPC_REQUIRE_PRIVILEGED=1.
func Require(t TB) {
	t.Helper()
	if why := Missing(); why != "" {
		if Required() {
			t.Fatal("PRIVILEGED TEST CANNOT RUN: " + why + " (" + EnvRequire + "=1 forbids skipping)")
		}
		t.Skip("SKIPPED PRIVILEGED TEST: " + why + "; run as root, or set " + EnvRequire + "=1 to make this a failure")
	}
}

// Ginkgo adapts Require to Ginkgo's Skip and Fail, which are passed in so that this
// package does not import Ginkgo: privileged.Ginkgo(Skip, Fail).
func Ginkgo(skip func(string, ...int), fail func(string, ...int)) {
	if why := Missing(); why != "" {
		if Required() {
			fail("PRIVILEGED TEST CANNOT RUN: " + why + " (" + EnvRequire + "=1 forbids skipping)")
			return
		}
		skip("SKIPPED PRIVILEGED TEST: " + why + "; run as root, or set " + EnvRequire + "=1 to make this a failure")
	}
}
