// Package privileged decides what a test that needs root does when it is not root.
//
// Tests that create network namespaces, load BPF programs or change iptables run for
// real as root. Elsewhere they skip with a loud reason, unless DPC_REQUIRE_PRIVILEGED=1
// (set by CI), where a skip would hide work and so is a failure instead.
//
// A -short run (`make check`, the fast tier) leaves them out by choice, whoever runs
// it: they skip, and DPC_REQUIRE_PRIVILEGED does not turn that skip into a failure,
// since `make test` runs them in full.
package privileged

import (
	"flag"
	"fmt"
	"os"
	"testing"
)

// shortSkip is why a -short run leaves a privileged test out.
const shortSkip = "not in a -short run (make check): it needs root or a third-party binary; make test runs it"

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
	if Short() {
		return shortSkip
	}
	if os.Geteuid() != 0 {
		return fmt.Sprintf("needs root (network namespaces, BPF, iptables); running as uid %d", os.Geteuid())
	}
	return ""
}

// Required reports whether DPC_REQUIRE_PRIVILEGED asks for privileged tests to run.
// A -short run never requires them.
func Required() bool { return os.Getenv(EnvRequire) == "1" && !Short() }

// Short reports whether this is a test binary run with -short: the fast tier, which
// runs only what needs neither root nor a third-party binary.
func Short() bool {
	return testing.Testing() && flag.Parsed() && flag.Lookup("test.short") != nil && testing.Short()
}

// Require skips t loudly when it cannot run privileged tests, or fails it when
// DPC_REQUIRE_PRIVILEGED=1.
func Require(t TB) {
	t.Helper()
	if Short() {
		t.Skip(shortSkip)
		return
	}
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
	if Short() {
		skip(shortSkip)
		return
	}
	if why := Missing(); why != "" {
		if Required() {
			fail("PRIVILEGED TEST CANNOT RUN: " + why + " (" + EnvRequire + "=1 forbids skipping)")
			return
		}
		skip("SKIPPED PRIVILEGED TEST: " + why + "; run as root, or set " + EnvRequire + "=1 to make this a failure")
	}
}

// SkipOptionalPeer skips the tests of an optional peer, one whose binaries the user
// builds from a source the project cannot fetch (Calico: its releases are not on the
// Go module proxy, docs/calico.md), when they were not given: loudly, on stderr as
// well as in the skip, naming the variable that gives them (env) and how to build
// them (how). It is the one skip DPC_REQUIRE_PRIVILEGED=1 accepts: what a fresh
// machine cannot build is not hidden work. A test that cannot run for any other
// reason (not root) still goes through Ginkgo or Require first.
func SkipOptionalPeer(skip func(string, ...int), peer, env, how string) {
	msg := fmt.Sprintf("OPTIONAL PEER NOT RUN: %s: %s is not set; %s", peer, env, how)
	fmt.Fprintf(os.Stderr, "\n*** %s ***\n\n", msg)
	skip(msg)
}
