package driver

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// fakeDriver writes a driver script whose body handles $1.
func fakeDriver(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "driver")
	if err := os.WriteFile(p, []byte("#!/bin/bash\n"+body+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestExecDriver(t *testing.T) {
	n := Node{Name: "node-a", Env: []string{"DPC_NODE=node-a"}}
	short := Timeouts{Info: time.Second, Start: time.Second, Status: 500 * time.Millisecond, Stop: time.Second, Kill: time.Second, Events: time.Second, Collect: time.Second, Cleanup: time.Second}
	tests := []struct {
		name     string
		body     string
		call     func(d *Exec) error
		wantKind string // "" means success
		wantText []string
	}{
		{
			name: "info ok",
			body: `[ "$1" = info ] && echo '{"name":"x","version":"1","profiles":["Core"],"features":["NodePort"]}'`,
			call: func(d *Exec) error {
				info, err := d.Info(context.Background())
				if err == nil && (!info.HasProfile("Core") || !info.HasFeature("NodePort") || info.HasProfile("Policy")) {
					return errors.New("profiles or features misread")
				}
				return err
			},
		},
		{
			name: "status reads the node's environment",
			body: `[ "$DPC_NODE" = node-a ] && echo '{"running":true,"ready":false}'`,
			call: func(d *Exec) error {
				st, err := d.Status(context.Background(), n)
				if err == nil && (!st.Running || st.Ready) {
					return errors.New("status misread")
				}
				return err
			},
		},
		{
			name:     "malformed reply",
			body:     `echo 'running: yes'`,
			call:     func(d *Exec) error { _, err := d.Status(context.Background(), n); return err },
			wantKind: "malformed",
			wantText: []string{"not the JSON object", "running: yes"},
		},
		{
			name:     "status without its fields",
			body:     `echo '{}'`,
			call:     func(d *Exec) error { _, err := d.Status(context.Background(), n); return err },
			wantKind: "malformed",
			wantText: []string{`"running" and "ready"`},
		},
		{
			name:     "ready since, of an agent not ready",
			body:     `echo '{"running":true,"ready":false,"ready_since_ns":5}'`,
			call:     func(d *Exec) error { _, err := d.Status(context.Background(), n); return err },
			wantKind: "malformed",
			wantText: []string{`"ready_since_ns" 5`, "CLOCK_MONOTONIC"},
		},
		{
			name:     "info without a name",
			body:     `echo '{"version":"1"}'`,
			call:     func(d *Exec) error { _, err := d.Info(context.Background()); return err },
			wantKind: "malformed",
		},
		{
			name:     "non-zero exit keeps the driver's error and stderr",
			body:     `echo 'agent binary missing' >&2; echo '{"error":"cannot start","detail":"no /usr/bin/agent"}'; exit 3`,
			call:     func(d *Exec) error { return d.Start(context.Background(), n, StartOptions{}) },
			wantKind: "exit",
			wantText: []string{"cannot start", "no /usr/bin/agent", "agent binary missing", "exit status 3", "start on node-a"},
		},
		{
			name:     "a driver killed by a signal",
			body:     `echo 'about to die' >&2; kill -KILL $$`,
			call:     func(d *Exec) error { return d.Stop(context.Background(), n) },
			wantKind: "exit",
			wantText: []string{"killed by signal SIGKILL", "about to die", "stop on node-a"},
		},
		{
			name:     "hung driver",
			body:     `sleep 30; echo '{}'`,
			call:     func(d *Exec) error { return d.Stop(context.Background(), n) },
			wantKind: "timeout",
			wantText: []string{"no answer within 1s"},
		},
		{
			name:     "a process left holding stdout",
			body:     `sleep 30 & echo '{}'`,
			call:     func(d *Exec) error { return d.Kill(context.Background(), n) },
			wantKind: "exec",
			wantText: []string{"still holds its stdout"},
		},
		{
			name:     "two JSON values",
			body:     `echo '{}{}'`,
			call:     func(d *Exec) error { return d.Cleanup(context.Background(), n) },
			wantKind: "malformed",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d, err := NewExec(fakeDriver(t, tt.body), short)
			if err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			err = tt.call(d)
			if tt.wantKind == "" {
				if err != nil {
					t.Fatalf("want success, got %v", err)
				}
				return
			}
			var de *Error
			if !errors.As(err, &de) {
				t.Fatalf("want a driver Error of kind %s, got %v", tt.wantKind, err)
			}
			if de.Kind != tt.wantKind {
				t.Errorf("kind %q, want %q: %v", de.Kind, tt.wantKind, err)
			}
			for _, w := range tt.wantText {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error lacks %q:\n%v", w, err)
				}
			}
			if d := time.Since(start); d > 10*time.Second {
				t.Errorf("call took %s; a hung driver must be cut off at its deadline", d)
			}
		})
	}
}

func TestNewExecNamesTheFix(t *testing.T) {
	_, err := NewExec("/nonexistent/driver", DefaultTimeouts)
	if err == nil || !strings.Contains(err.Error(), "/nonexistent/driver") {
		t.Fatalf("want an error naming the path, got %v", err)
	}
	p := filepath.Join(t.TempDir(), "notexec")
	os.WriteFile(p, []byte("x"), 0o644)
	if _, err := NewExec(p, DefaultTimeouts); err == nil || !strings.Contains(err.Error(), "chmod +x") {
		t.Fatalf("want an error naming chmod, got %v", err)
	}
}

// A node's Start is how a call gets where the topology runs it (inside a netns node);
// the adapter must use it for every node verb, and its failure is an exec error.
func TestExecDriverStartsThroughTheNode(t *testing.T) {
	var started []string
	n := Node{Name: "node-a", Env: []string{"DPC_NODE=node-a"}, Start: func(cmd *exec.Cmd) error {
		started = append(started, cmd.Args[1])
		cmd.Env = append(cmd.Env, "IN_NODE=yes")
		return cmd.Start()
	}}
	d, err := NewExec(fakeDriver(t, `[ "$IN_NODE" = yes ] && echo '{"running":true,"ready":true}'`), DefaultTimeouts)
	if err != nil {
		t.Fatal(err)
	}
	if st, err := d.Status(context.Background(), n); err != nil || !st.Ready {
		t.Fatalf("status through the node's Start = %+v, %v; want ready", st, err)
	}
	if len(started) != 1 || started[0] != "status" {
		t.Fatalf("node Start saw %v, want [status]", started)
	}
	n.Start = func(*exec.Cmd) error { return errors.New("no such node") }
	_, err = d.Status(context.Background(), n)
	var de *Error
	if !errors.As(err, &de) || de.Kind != "exec" || !strings.Contains(err.Error(), "no such node") {
		t.Fatalf("status with a failing node Start = %v; want an exec error naming it", err)
	}
}

// A start on real nodes may first load an image: it gets longer there, and only it.
func TestTimeoutsFor(t *testing.T) {
	if got := TimeoutsFor("netns"); got != DefaultTimeouts {
		t.Fatalf("netns: %+v, want the defaults %+v", got, DefaultTimeouts)
	}
	for _, topo := range []string{"kind", "cluster"} {
		got := TimeoutsFor(topo)
		if got.Start <= DefaultTimeouts.Start {
			t.Fatalf("%s: start %v, want more than %v", topo, got.Start, DefaultTimeouts.Start)
		}
		got.Start = DefaultTimeouts.Start
		if got != DefaultTimeouts {
			t.Fatalf("%s: budgets other than start changed: %+v", topo, got)
		}
	}
}
