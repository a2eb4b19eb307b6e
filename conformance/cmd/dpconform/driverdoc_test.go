package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/dpconform/dpconform/conformance"
	"github.com/dpconform/dpconform/conformance/record"
	"github.com/dpconform/dpconform/internal/buildbin"
	"github.com/dpconform/dpconform/internal/privileged"
)

// driverDoc is the page whose shell driver the test runs.
var driverDoc = filepath.Join("..", "..", "..", "docs", "driver.md")

// shellDriver returns the driver docs/driver.md shows: the ```sh block after its
// marker.
func shellDriver(t *testing.T) string {
	t.Helper()
	doc, err := os.ReadFile(driverDoc)
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(doc), "<!-- the shell driver: the test reads the block below -->\n```sh\n")
	if !ok {
		t.Fatal("docs/driver.md has no shell driver after its marker")
	}
	script, _, ok := strings.Cut(rest, "```\n")
	if !ok {
		t.Fatal("the shell driver's block in docs/driver.md does not end")
	}
	return script
}

// TestShellDriverFromTheDocs runs the complete shell driver of docs/driver.md, as the
// page has it, against refdp: RESTART-ESTABLISHED (a graceful restart, then a SIGKILL
// and start) must pass with it, and its collect and its refusal of a verb it lacks
// must keep the contract.
func TestShellDriverFromTheDocs(t *testing.T) {
	privileged.Require(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	dir := t.TempDir()
	bins, err := buildbin.Build(ctx, dir, "conformance/cmd/dpconform", "reference/cmd/refdp")
	if err != nil {
		t.Fatal(err)
	}
	drv := filepath.Join(dir, "refdp-sh-driver")
	if err := os.WriteFile(drv, []byte(shellDriver(t)), 0o755); err != nil {
		t.Fatal(err)
	}

	// The verbs that need no topology: collect, and one it does not implement.
	state := t.TempDir()
	if err := os.WriteFile(filepath.Join(state, "refdp.log"), []byte("a log\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	into := t.TempDir()
	verb := func(args ...string) ([]byte, error) {
		cmd := exec.CommandContext(ctx, drv, args...)
		cmd.Env = append(os.Environ(), "DPC_NODE=node-a", "DPC_STATE_DIR="+state)
		return cmd.Output()
	}
	out, err := verb("collect", "--dir", into)
	var files struct{ Files []string }
	if err != nil || json.Unmarshal(out, &files) != nil || len(files.Files) != 1 {
		t.Errorf("collect: %v %q, want one file", err, out)
	} else if got, _ := os.ReadFile(filepath.Join(into, files.Files[0])); string(got) != "a log\n" {
		t.Errorf("collect wrote %q, want the agent's log", got)
	}
	out, err = verb("events")
	var refusal struct{ Error string }
	if err == nil || json.Unmarshal(out, &refusal) != nil || refusal.Error == "" {
		t.Errorf("events: %v %q, want a non-zero exit with {\"error\": ...}", err, out)
	}

	// A spec, through dpconform, as a vendor runs it. --focus leaves Core
	// incomplete, so the run is not certified (exit 1) though the spec passed.
	output := filepath.Join(dir, "run")
	cmd := exec.CommandContext(ctx, bins["dpconform"], "run", "--driver", drv, "--focus", "^RESTART-ESTABLISHED$", "--quiet", "--output", output)
	var logs bytes.Buffer
	cmd.Stdout, cmd.Stderr = &logs, &logs
	err = cmd.Run()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 1 {
		t.Fatalf("dpconform run with the shell driver: %v, want exit 1 (one spec certifies nothing)\n%s", err, logs.String())
	}
	rec, err := record.LoadRun(output)
	if err != nil {
		t.Fatal(err)
	}
	if rec.Implementation.Name != "refdp-sh" {
		t.Errorf("the run's implementation is %q, want the shell driver's refdp-sh", rec.Implementation.Name)
	}
	for _, r := range rec.Results {
		if r.ID == "RESTART-ESTABLISHED" && r.Result != conformance.Passed {
			t.Errorf("RESTART-ESTABLISHED with the shell driver: %s %s\n%s\n%s", r.Result, r.Reason, r.Message, logs.String())
		}
	}
}
