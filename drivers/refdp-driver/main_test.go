package main

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/dpconform/dpconform/driver"
	"github.com/dpconform/dpconform/internal/buildbin"
)

// TestBadInput runs the driver with malformed environments and arguments: each must
// exit non-zero with the contract's {"error","detail"} naming what is wrong.
func TestBadInput(t *testing.T) {
	dir := t.TempDir()
	bins, err := buildbin.Build(context.Background(), dir, "drivers/refdp-driver")
	if err != nil {
		t.Fatal(err)
	}
	state := t.TempDir()
	good := []string{"DPC_NODE=node-a", "DPC_KUBECONFIG=/nonexistent/kubeconfig", "DPC_STATE_DIR=" + state}
	notDir := filepath.Join(state, "file")
	os.WriteFile(notDir, nil, 0o644)
	tests := []struct {
		name string
		args []string
		env  []string
		want []string
	}{
		{"no verb", nil, good, []string{"usage"}},
		{"unknown verb", []string{"restart"}, good, []string{"unknown verb", "restart"}},
		{"missing environment", []string{"status"}, []string{"DPC_NODE=node-a"}, []string{"DPC_KUBECONFIG", "DPC_STATE_DIR", "not set"}},
		{"state dir not a directory", []string{"status"}, []string{"DPC_NODE=n", "DPC_KUBECONFIG=k", "DPC_STATE_DIR=" + notDir}, []string{"DPC_STATE_DIR", "not a directory"}},
		{"missing netns", []string{"status"}, append(good, "DPC_NETNS=/nonexistent/netns"), []string{"DPC_NETNS=/nonexistent/netns"}},
		{"unknown mode", []string{"start", "--mode", "iptables"}, good, []string{"not offered", `mode "iptables"`, "modes: ebpf"}},
		{"unknown version", []string{"start", "--version", "v3"}, good, []string{"not offered", `version "v3"`, "versions: v1, v2"}},
		{"unknown setting", []string{"start", "--set", "ct-max=5"}, good, []string{"not offered", `setting "ct-max"`, "settings: ct-size"}},
		// On kind and on a cluster the DaemonSet runs refdp's defaults: info offers no
		// version or setting there, so a start that asks for one is refused before
		// anything is touched, not started as something else.
		{"a version on kind", []string{"start", "--version", "v2"}, append(good, "DPC_TOPOLOGY=kind"), []string{"not offered", `version "v2"`, "no versions"}},
		{"a setting on a cluster", []string{"start", "--set", "ct-size=131072"}, append(good, "DPC_TOPOLOGY=cluster"), []string{"not offered", `setting "ct-size"`, "no settings"}},
		{"bad conntrack size", []string{"start", "--set", "ct-size=lots"}, append(good, "REFDP_BINARY=/bin/true"), []string{"bad setting", "ct-size=lots", "number of entries"}},
		{"unknown fault", []string{"start"}, append(good, "DPC_REFDP_FAULTS=no-such-fault", "REFDP_BINARY=/bin/true"), []string{"DPC_REFDP_FAULTS", "no-such-fault", "known faults"}},
		{"agent binary missing", []string{"start"}, good, []string{"refdp", "make build", "REFDP_BINARY"}},
		{"collect without a directory", []string{"collect"}, good, []string{"--dir"}},
		{"bad cursor", []string{"events", "--cursor", "garbage"}, good, []string{"bad cursor", `"garbage"`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cmd := exec.Command(bins["refdp-driver"], tt.args...)
			cmd.Env = append([]string{"PATH=" + os.Getenv("PATH")}, tt.env...)
			out, err := cmd.Output()
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() == 0 {
				t.Fatalf("want a non-zero exit, got %v (stdout %s)", err, out)
			}
			var reply struct{ Error, Detail string }
			if err := json.Unmarshal(out, &reply); err != nil || reply.Error == "" {
				t.Fatalf("stdout is not {\"error\",\"detail\"}: %q (%v)", out, err)
			}
			msg := reply.Error + ": " + reply.Detail
			for _, w := range tt.want {
				if !strings.Contains(msg, w) {
					t.Errorf("error %q does not mention %q", msg, w)
				}
			}
		})
	}
}

// TestInfo checks that info answers without any environment, and that it offers on
// each topology what the driver can start there (DPC_TOPOLOGY, which the suite gives
// info too).
func TestInfo(t *testing.T) {
	bins, err := buildbin.Build(context.Background(), t.TempDir(), "drivers/refdp-driver")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		topology           string
		versions, settings []string
		profiles           []string
		verdicts           bool
	}{
		{"", []string{"v1", "v2"}, []string{"ct-size"}, []string{"Core", "ModeSwitch", "Policy", "Upgrade", "Observability"}, true},
		{"netns", []string{"v1", "v2"}, []string{"ct-size"}, []string{"Core", "ModeSwitch", "Policy", "Upgrade", "Observability"}, true},
		{"kind", nil, nil, []string{"Core", "ModeSwitch", "Policy", "Observability"}, true},
		{"cluster", nil, nil, []string{"Core", "ModeSwitch", "Policy"}, false},
	} {
		t.Run("DPC_TOPOLOGY="+tc.topology, func(t *testing.T) {
			cmd := exec.Command(bins["refdp-driver"], "info")
			if tc.topology != "" {
				cmd.Env = []string{"DPC_TOPOLOGY=" + tc.topology}
			}
			out, err := cmd.Output()
			if err != nil {
				t.Fatal(err)
			}
			var info driver.Info
			if err := json.Unmarshal(out, &info); err != nil || info.Name != "refdp" || !strings.Contains(string(info.CNI), "${POD_CIDR}") {
				t.Fatalf("info: %s (%v)", out, err)
			}
			if !slices.Equal(info.Versions, tc.versions) || !slices.Equal(info.Settings, tc.settings) || !slices.Equal(info.Profiles, tc.profiles) {
				t.Errorf("info offers versions %v, settings %v, profiles %v: want %v (oldest first), %v, %v", info.Versions, info.Settings, info.Profiles, tc.versions, tc.settings, tc.profiles)
			}
			if got := info.HasFeature("PolicyVerdicts"); got != tc.verdicts {
				t.Errorf("info claims PolicyVerdicts: %v, want %v", got, tc.verdicts)
			}
		})
	}
}

// TestRunArgs checks what `refdp run` is told for each start option.
func TestRunArgs(t *testing.T) {
	for _, tc := range []struct {
		opts driver.StartOptions
		want []string
		err  string
	}{
		{driver.StartOptions{}, nil, ""},
		{driver.StartOptions{Mode: "ebpf"}, nil, ""},
		{driver.StartOptions{Version: "v1"}, []string{"--version", "v1"}, ""},
		{driver.StartOptions{Version: "v2", Set: map[string]string{"ct-size": "131072"}}, []string{"--version", "v2", "--conntrack-size", "131072"}, ""},
		{driver.StartOptions{Set: map[string]string{"ct-size": "0"}}, nil, "bad setting"},
		{driver.StartOptions{Set: map[string]string{"ct-size": "4294967296"}}, nil, "bad setting"},
		{driver.StartOptions{Version: "v0"}, nil, "not offered"},
	} {
		got, err := runArgs(tc.opts)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%+v: %v, want an error %q", tc.opts, err, tc.err)
			}
			continue
		}
		if err != nil || !slices.Equal(got, tc.want) {
			t.Errorf("%+v: %v (%v), want %v", tc.opts, got, err, tc.want)
		}
	}
}
