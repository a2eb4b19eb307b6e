package main

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/dpconform/dpconform/internal/buildbin"
)

// TestBadInput runs the driver with malformed environments and arguments: each must
// exit non-zero with the contract's {"error","detail"} naming what is wrong.
func TestBadInput(t *testing.T) {
	dir := t.TempDir()
	bins, err := buildbin.Build(context.Background(), dir, "reference/cmd/refdp-driver")
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

// TestInfo checks that info answers without any environment.
func TestInfo(t *testing.T) {
	bins, err := buildbin.Build(context.Background(), t.TempDir(), "reference/cmd/refdp-driver")
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(bins["refdp-driver"], "info").Output()
	if err != nil {
		t.Fatal(err)
	}
	var info struct {
		Name     string
		Profiles []string
		CNI      json.RawMessage
	}
	if err := json.Unmarshal(out, &info); err != nil || info.Name != "refdp" || len(info.Profiles) == 0 || !strings.Contains(string(info.CNI), "${POD_CIDR}") {
		t.Fatalf("info: %s (%v)", out, err)
	}
}
