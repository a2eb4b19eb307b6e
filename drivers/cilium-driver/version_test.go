package main

import (
	"os"
	"regexp"
	"testing"
)

// TestVersionMatchesTheBuild checks that the version the driver reports and looks its
// install up by is the one `make cilium` builds.
func TestVersionMatchesTheBuild(t *testing.T) {
	data, err := os.ReadFile("../../topologies/binaries/cilium/go.mod")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^require github.com/cilium/cilium (\S+)$`).FindSubmatch(data)
	if m == nil {
		t.Fatal("topologies/binaries/cilium/go.mod does not require github.com/cilium/cilium on a line of its own")
	}
	if string(m[1]) != Version {
		t.Errorf("the driver reports Cilium %s, the build pins %s", Version, m[1])
	}
}
