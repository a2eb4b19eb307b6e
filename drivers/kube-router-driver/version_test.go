package main

import (
	"os"
	"regexp"
	"testing"
)

// TestVersionMatchesTheBuild checks that the version the driver reports and looks its
// binary up by is the one `make kube-router` builds.
func TestVersionMatchesTheBuild(t *testing.T) {
	data, err := os.ReadFile("../../topologies/binaries/kube-router/go.mod")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^require github.com/cloudnativelabs/kube-router/v2 (\S+)$`).FindSubmatch(data)
	if m == nil {
		t.Fatal("topologies/binaries/kube-router/go.mod does not require github.com/cloudnativelabs/kube-router/v2 on a line of its own")
	}
	if string(m[1]) != Version {
		t.Errorf("the driver reports kube-router %s, the build pins %s", Version, m[1])
	}
}

// TestSyncedSince checks readiness against kube-router's own log lines (v2.1.0, --v=1):
// only a full sync that ended without aborting, and logged after the start's offset,
// counts.
func TestSyncedSince(t *testing.T) {
	const (
		start   = "I1201 10:00:00.000000       1 network_policy_controller.go:231] Starting sync of iptables with version: 1764583200000000000\n"
		took    = "I1201 10:00:00.100000       1 network_policy_controller.go:228] sync iptables took 100ms\n"
		aborted = "E1201 10:00:00.050000       1 network_policy_controller.go:292] Aborting sync. Failed to run iptables-restore: exit status 1\n"
		prior   = "---- kube-router-driver: start\n"
	)
	for _, c := range []struct {
		name, before, after string
		want                bool
	}{
		{"nothing logged yet", "", "", false},
		{"a sync in progress", "", start, false},
		{"a completed sync", "", start + took, true},
		{"an aborted sync", "", start + aborted + took, false},
		{"an aborted sync, then a completed one", "", start + aborted + took + start + took, true},
		{"a previous process's sync", prior + start + took, start, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := t.TempDir() + "/kube-router.log"
			if err := os.WriteFile(p, []byte(c.before+c.after), 0o644); err != nil {
				t.Fatal(err)
			}
			got, detail := syncedSince(p, int64(len(c.before)))
			if got != c.want {
				t.Errorf("synced = %v (%s), want %v", got, detail, c.want)
			}
		})
	}
}
