package skel_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/dpconform/dpconform/driver"
	"github.com/dpconform/dpconform/driver/skel"
)

// fakeAgent is an agent whose methods answer what its fields say, recording the
// calls with whether each had a deadline.
type fakeAgent struct {
	calls    *[]string
	err      error    // what every method but Status returns
	files    []string // what Diagnostics returns
	status   driver.Status
	waitDone bool // every method but Status blocks until its context ends
}

func (a fakeAgent) do(ctx context.Context, verb string) error {
	_, ok := ctx.Deadline()
	*a.calls = append(*a.calls, fmt.Sprintf("%s deadline=%v", verb, ok))
	if a.waitDone {
		<-ctx.Done()
		return fmt.Errorf("%s: agent has not exited: %w", verb, ctx.Err())
	}
	return a.err
}

func (a fakeAgent) Start(ctx context.Context) (int, error) {
	if err := a.do(ctx, "start"); err != nil {
		return 7, err // a PID with an error must not reach the reply
	}
	return 42, nil
}

func (a fakeAgent) Status(ctx context.Context) driver.Status {
	_ = a.do(ctx, "status")
	return a.status
}

func (a fakeAgent) Stop(ctx context.Context) error { return a.do(ctx, "stop") }
func (a fakeAgent) Kill(ctx context.Context) error { return a.do(ctx, "kill") }
func (a fakeAgent) Cleanup(ctx context.Context) error {
	return a.do(ctx, "cleanup")
}

func (a fakeAgent) Diagnostics(ctx context.Context, dir string) ([]string, error) {
	return a.files, a.do(ctx, "diagnostics")
}

func TestAgentFuncs(t *testing.T) {
	state := t.TempDir()
	netns := filepath.Join(state, "netns")
	if err := os.WriteFile(netns, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"DPC_NODE": "node-a", "DPC_NETNS": netns, "DPC_KUBECONFIG": "/k", "DPC_STATE_DIR": state, "DPC_TOPOLOGY": "netns"}
	dir := filepath.Join(t.TempDir(), "collect")
	budgets := driver.Timeouts{Start: time.Minute, Status: time.Minute, Stop: time.Minute, Kill: 20 * time.Millisecond, Collect: time.Minute}
	boom := errors.New("boom")

	tests := []struct {
		name  string
		args  []string
		agent fakeAgent
		// lookupErr is what AgentFor answers instead of an agent.
		lookupErr error
		want      string
		// wantCalls are the agent's calls, after the lookup's "for node-a start=…".
		wantCalls []string
	}{
		{name: "start", args: []string{"start", "--mode", "m1"}, want: `{"pid":42}`,
			wantCalls: []string{"for node-a start=start --mode m1", "start deadline=true"}},
		{name: "status", args: []string{"status"}, agent: fakeAgent{status: driver.Status{Running: true, Ready: true}}, want: `{"running":true,"ready":true}`,
			wantCalls: []string{"for node-a start=<nil>", "status deadline=true"}},
		{name: "stop", args: []string{"stop"}, want: `{}`, wantCalls: []string{"for node-a start=<nil>", "stop deadline=true"}},
		{name: "kill", args: []string{"kill"}, want: `{}`, wantCalls: []string{"for node-a start=<nil>", "kill deadline=true"}},
		{name: "collect", args: []string{"collect", "--dir", dir}, agent: fakeAgent{files: []string{"a.log"}}, want: `{"files":["a.log"]}`,
			wantCalls: []string{"for node-a start=<nil>", "diagnostics deadline=true"}},
		{name: "a zero budget adds no deadline", args: []string{"cleanup"}, want: `{}`, wantCalls: []string{"for node-a start=<nil>", "cleanup deadline=false"}},

		// What the agent cannot do becomes the verb's Failure.
		{name: "start fails", args: []string{"start"}, agent: fakeAgent{err: boom}, want: `{"error":"start failed","detail":"boom"}`},
		{name: "a Failure is replied as it is", args: []string{"start"}, agent: fakeAgent{err: fmt.Errorf("start: %w", skel.Fail("already running", "in mode m2"))},
			want: `{"error":"already running","detail":"in mode m2"}`},
		{name: "stop fails", args: []string{"stop"}, agent: fakeAgent{err: boom}, want: `{"error":"agent did not exit","detail":"boom"}`},
		{name: "kill runs out of its budget", args: []string{"kill"}, agent: fakeAgent{waitDone: true},
			want: `{"error":"agent did not exit","detail":"kill: agent has not exited: context deadline exceeded"}`},
		{name: "collect writes nothing", args: []string{"collect", "--dir", dir}, agent: fakeAgent{err: boom}, want: `{"error":"collect failed","detail":"boom"}`},
		{name: "collect writes part", args: []string{"collect", "--dir", dir}, agent: fakeAgent{err: boom, files: []string{"a.log"}}, want: `{"files":["a.log"]}`},
		{name: "cleanup fails", args: []string{"cleanup"}, agent: fakeAgent{err: boom}, want: `{"error":"cleanup failed","detail":"boom"}`},

		// No agent: the lookup's error is the reply, and no agent is asked.
		{name: "no agent", args: []string{"stop"}, lookupErr: skel.Fail("missing binary", "agent: not found"),
			want: `{"error":"missing binary","detail":"agent: not found"}`, wantCalls: []string{"for node-a start=<nil>"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var calls []string
			tt.agent.calls = &calls
			agentFor := func(n skel.Node, start *driver.StartOptions) (skel.Agent, error) {
				s := "<nil>"
				if start != nil {
					s = fmt.Sprintf("%+v", start)
				}
				calls = append(calls, fmt.Sprintf("for %s start=%s", n.Name, s))
				if tt.lookupErr != nil {
					return nil, tt.lookupErr
				}
				return tt.agent, nil
			}
			funcs := skel.AgentFuncs(agentFor, budgets)
			funcs.Info = func(context.Context) (driver.Info, error) {
				return driver.Info{Name: "testdp", Modes: []string{"m1", "m2"}}, nil
			}
			lookup := func(k string) (string, bool) { v, ok := env[k]; return v, ok }
			var stdout, stderr bytes.Buffer
			begin := time.Now()
			code := skel.Run(context.Background(), "test-driver", funcs, tt.args, lookup, &stdout, &stderr)
			if took := time.Since(begin); took > 10*time.Second {
				t.Errorf("took %s: a budget was not applied", took)
			}
			if got := strings.TrimSpace(stdout.String()); got != tt.want {
				t.Errorf("reply %s, want %s", got, tt.want)
			}
			wantCode := 0
			if strings.Contains(tt.want, `"error"`) {
				wantCode = 1
			}
			if code != wantCode {
				t.Errorf("exit code %d, want %d (stderr %q)", code, wantCode, stderr.String())
			}
			if tt.wantCalls != nil && strings.Join(calls, "\n") != strings.Join(tt.wantCalls, "\n") {
				t.Errorf("calls\n%s\nwant\n%s", strings.Join(calls, "\n"), strings.Join(tt.wantCalls, "\n"))
			}
		})
	}
}

func TestAgentFuncsKeepsTheCause(t *testing.T) {
	cause := errors.New("pid 7 still runs")
	funcs := skel.AgentFuncs(func(skel.Node, *driver.StartOptions) (skel.Agent, error) {
		return fakeAgent{calls: new([]string), err: cause}, nil
	}, driver.Timeouts{})
	err := funcs.Stop(context.Background(), skel.Node{Name: "node-a"})
	var f *skel.Failure
	if !errors.As(err, &f) || f.Msg != "agent did not exit" || !errors.Is(err, cause) {
		t.Errorf("Stop: %v, want the Failure \"agent did not exit\" wrapping %v", err, cause)
	}
	if pid, err := funcs.Start(context.Background(), skel.Node{}, driver.StartOptions{}); pid != 0 || !errors.Is(err, cause) {
		t.Errorf("Start: %d, %v; want 0 and an error that wraps %v", pid, err, cause)
	}
}

func TestNetNSOnly(t *testing.T) {
	check := skel.NetNSOnly("mydp", "deploy mydp's DaemonSet")
	for _, topo := range []string{"", "netns"} {
		if err := check(skel.Node{Topology: topo}); err != nil {
			t.Errorf("DPC_TOPOLOGY=%q: %v, want nil", topo, err)
		}
	}
	// Through Run: the topology is the reason, not the DPC_NETNS kind never sets.
	funcs := skel.Funcs{
		Status:       func(context.Context, skel.Node) (driver.Status, error) { return driver.Status{}, nil },
		RequireNetNS: true,
		CheckNode:    check,
	}
	lookup := func(k string) (string, bool) {
		v, ok := map[string]string{"DPC_NODE": "n", "DPC_TOPOLOGY": "kind"}[k]
		return v, ok
	}
	var stdout, stderr bytes.Buffer
	if code := skel.Run(context.Background(), "mydp-driver", funcs, []string{"status"}, lookup, &stdout, &stderr); code != 1 {
		t.Fatalf("exit code %d, want 1", code)
	}
	var reply map[string]string
	if err := json.Unmarshal(stdout.Bytes(), &reply); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"error":  "unsupported topology",
		"detail": "DPC_TOPOLOGY=kind: this driver runs mydp inside a node's network namespace (DPC_TOPOLOGY=netns); on kind, deploy mydp's DaemonSet",
	}
	if reply["error"] != want["error"] || reply["detail"] != want["detail"] {
		t.Errorf("reply %v, want %v", reply, want)
	}
}

// A driver built on ProcessBudgets answers every verb inside the contract's timeout.
func TestProcessBudgetsFitTheContract(t *testing.T) {
	b, c := skel.ProcessBudgets, driver.DefaultTimeouts
	for _, v := range []struct {
		verb          string
		budget, limit time.Duration
	}{{"start", b.Start, c.Start}, {"status", b.Status, c.Status}, {"stop", b.Stop, c.Stop}, {"kill", b.Kill, c.Kill}, {"collect", b.Collect, c.Collect}, {"cleanup", b.Cleanup, c.Cleanup}} {
		if v.budget <= 0 || v.budget >= v.limit {
			t.Errorf("%s: budget %s, want more than 0 and less than the contract's %s", v.verb, v.budget, v.limit)
		}
	}
}
