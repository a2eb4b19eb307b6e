package skel_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/dpconform/dpconform/driver"
	"github.com/dpconform/dpconform/driver/skel"
)

// asDriver makes the test binary the driver executable of the round-trip test, the
// way CNI's plugin tests re-execute themselves as a plugin.
const asDriver = "SKEL_TEST_AS_DRIVER"

func TestMain(m *testing.M) {
	if os.Getenv(asDriver) != "" {
		skel.Main("test-driver", fileDriver())
	}
	os.Exit(m.Run())
}

var testInfo = driver.Info{
	Name:     "testdp",
	Version:  "1.0",
	Profiles: []string{"Core"},
	Features: []string{"TCP"},
	Modes:    []string{"m1", "m2"},
	Versions: []string{"v1"},
	Settings: []string{"mtu"},
}

// recorder is an implementation that records its calls and answers fixed values.
type recorder struct{ calls []string }

func (r *recorder) record(format string, args ...any) {
	r.calls = append(r.calls, fmt.Sprintf(format, args...))
}

func (r *recorder) funcs() skel.Funcs {
	return skel.Funcs{
		Info: func(context.Context) (driver.Info, error) { r.record("info"); return testInfo, nil },
		Start: func(_ context.Context, n skel.Node, o driver.StartOptions) (int, error) {
			r.record("start %+v %+v", n, o)
			return 42, nil
		},
		Status: func(_ context.Context, n skel.Node) (driver.Status, error) {
			r.record("status %s", n.Name)
			return driver.Status{Running: true}, nil
		},
		Stop: func(_ context.Context, n skel.Node) error { r.record("stop %s", n.Name); return nil },
		Kill: func(_ context.Context, n skel.Node) error { r.record("kill %s", n.Name); return nil },
		Events: func(_ context.Context, n skel.Node, cursor string) (driver.Events, error) {
			r.record("events %s %s", n.Name, cursor)
			return driver.Events{Cursor: "c2"}, nil
		},
		Collect: func(_ context.Context, n skel.Node, dir string) ([]string, error) {
			r.record("collect %s", n.Name)
			if _, err := os.Stat(dir); err != nil {
				return nil, err
			}
			return nil, nil
		},
		Cleanup: func(_ context.Context, n skel.Node) error { r.record("cleanup %s", n.Name); return nil },
	}
}

func TestRun(t *testing.T) {
	state := t.TempDir()
	netns := filepath.Join(state, "netns")
	notDir := filepath.Join(state, "file")
	for _, f := range []string{netns, notDir} {
		if err := os.WriteFile(f, nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	good := map[string]string{
		"DPC_NODE": "node-a", "DPC_NETNS": netns, "DPC_KUBECONFIG": "/k", "DPC_STATE_DIR": state,
		"DPC_BPFFS": "/b", "DPC_TOPOLOGY": "netns", "DPC_RUN": "r1",
	}
	node := skel.Node{Name: "node-a", NetNS: netns, Kubeconfig: "/k", StateDir: state, BPFFS: "/b", Topology: "netns", Run: "r1"}
	with := func(kv ...string) map[string]string {
		env := map[string]string{}
		for k, v := range good {
			env[k] = v
		}
		for _, s := range kv {
			k, v, _ := strings.Cut(s, "=")
			if v == "" {
				delete(env, k)
			} else {
				env[k] = v
			}
		}
		return env
	}
	collectDir := filepath.Join(t.TempDir(), "not", "yet")

	tests := []struct {
		name string
		args []string
		env  map[string]string
		// edit changes the implementation for this case.
		edit func(*skel.Funcs)
		// want is the whole reply; for a failure, wantDetail are parts of its detail.
		want       string
		wantDetail []string
		// wantCalls are the calls the implementation saw.
		wantCalls []string
	}{
		// Each verb.
		{name: "info needs no node", args: []string{"info"},
			want:      `{"name":"testdp","version":"1.0","profiles":["Core"],"features":["TCP"],"modes":["m1","m2"],"versions":["v1"],"settings":["mtu"]}`,
			wantCalls: []string{"info"}},
		{name: "start with every option", args: []string{"start", "--mode", "m1", "--version=v1", "--set", "mtu=1400"}, env: good,
			want:      `{"pid":42}`,
			wantCalls: []string{"info", fmt.Sprintf("start %+v %+v", node, driver.StartOptions{Mode: "m1", Version: "v1", Set: map[string]string{"mtu": "1400"}})}},
		{name: "start with the default variant", args: []string{"start"}, env: good,
			want:      `{"pid":42}`,
			wantCalls: []string{"info", fmt.Sprintf("start %+v %+v", node, driver.StartOptions{})}},
		{name: "status", args: []string{"status"}, env: good, want: `{"running":true,"ready":false}`, wantCalls: []string{"status node-a"}},
		{name: "stop", args: []string{"stop"}, env: good, want: `{}`, wantCalls: []string{"stop node-a"}},
		{name: "kill", args: []string{"kill"}, env: good, want: `{}`, wantCalls: []string{"kill node-a"}},
		{name: "events with a cursor, none yet", args: []string{"events", "--cursor", "c1"}, env: good, want: `{"cursor":"c2","events":[]}`, wantCalls: []string{"events node-a c1"}},
		{name: "events from the start", args: []string{"events"}, env: good, want: `{"cursor":"c2","events":[]}`, wantCalls: []string{"events node-a "}},
		{name: "collect creates its directory", args: []string{"collect", "--dir", collectDir}, env: good, want: `{"files":[]}`, wantCalls: []string{"collect node-a"}},
		{name: "cleanup", args: []string{"cleanup"}, env: good, want: `{}`, wantCalls: []string{"cleanup node-a"}},
		{name: "kind: no netns needed", args: []string{"status"}, env: with("DPC_NETNS=", "DPC_TOPOLOGY=kind"), want: `{"running":true,"ready":false}`, wantCalls: []string{"status node-a"}},

		// Bad calls, refused before the implementation is asked.
		{name: "no verb", want: "usage", wantDetail: []string{"test-driver VERB [flags]", "verbs: info start status stop kill events collect cleanup"}},
		{name: "unknown verb", args: []string{"restart"}, env: good, want: "unknown verb", wantDetail: []string{`"restart"`, "verbs: info start"}},
		{name: "an unknown flag", args: []string{"start", "--force"}, env: good, want: "bad arguments", wantDetail: []string{"-force", "usage: start [--mode M] [--version V] [--set key=value]..."}},
		{name: "a flag without its value", args: []string{"events", "--cursor"}, env: good, want: "bad arguments", wantDetail: []string{"-cursor", "usage: events [--cursor C]"}},
		{name: "a positional argument", args: []string{"start", "--mode", "m1", "now"}, env: good, want: "bad arguments", wantDetail: []string{`unexpected arguments ["now"]`}},
		{name: "a setting without a value", args: []string{"start", "--set", "mtu"}, env: good, want: "bad arguments", wantDetail: []string{`"mtu" is not key=value`}},
		{name: "a setting twice", args: []string{"start", "--set", "mtu=1", "--set", "mtu=2"}, env: good, want: "bad arguments", wantDetail: []string{`"mtu" set twice`}},
		{name: "arguments to a verb that takes none", args: []string{"status", "--verbose"}, env: good, want: "bad arguments", wantDetail: []string{`unexpected arguments ["--verbose"]`, "usage: status"}},
		{name: "collect without a directory", args: []string{"collect"}, env: good, want: "bad arguments", wantDetail: []string{"collect needs --dir", "usage: collect --dir DIR"}},
		{name: "a mode not offered", args: []string{"start", "--mode", "m3"}, env: good, want: "not offered",
			wantDetail: []string{`testdp does not offer mode "m3" (modes: m1, m2)`}, wantCalls: []string{"info"}},
		{name: "everything not offered is named", args: []string{"start", "--version", "v2", "--set", "x=1"}, env: good, want: "not offered",
			wantDetail: []string{`testdp does not offer version "v2" (versions: v1); testdp does not offer setting "x" (settings: mtu)`}, wantCalls: []string{"info"}},
		{name: "options when info says nothing", args: []string{"start", "--mode", "m1"}, env: good, edit: func(f *skel.Funcs) { f.Info = nil }, want: "not offered",
			wantDetail: []string{`test-driver does not offer mode "m1" (it offers no modes)`}},

		// The node's environment.
		{name: "no environment", args: []string{"status"}, want: "bad environment", wantDetail: []string{"DPC_NODE, DPC_KUBECONFIG, DPC_STATE_DIR not set", "docs/driver.md"}},
		{name: "a netns topology required", args: []string{"stop"}, env: with("DPC_NETNS="), edit: func(f *skel.Funcs) { f.RequireNetNS = true }, want: "bad environment",
			wantDetail: []string{"DPC_NETNS not set", "test-driver needs a netns topology (DPC_NETNS)"}},
		{name: "all missing, netns too", args: []string{"stop"}, edit: func(f *skel.Funcs) { f.RequireNetNS = true }, want: "bad environment",
			wantDetail: []string{"DPC_NODE, DPC_NETNS, DPC_KUBECONFIG, DPC_STATE_DIR not set"}},
		{name: "a state directory that is a file", args: []string{"kill"}, env: with("DPC_STATE_DIR=" + notDir), want: "bad environment", wantDetail: []string{"DPC_STATE_DIR=" + notDir + " is not a directory"}},
		{name: "a network namespace that is gone", args: []string{"cleanup"}, env: with("DPC_NETNS=/nonexistent/netns"), want: "bad environment", wantDetail: []string{"DPC_NETNS=/nonexistent/netns", "no such file", "topology still up"}},
		{name: "the driver's own check comes first", args: []string{"status"}, env: map[string]string{"DPC_TOPOLOGY": "kind"},
			edit: func(f *skel.Funcs) {
				f.RequireNetNS = true
				f.CheckNode = func(n skel.Node) error {
					if n.Topology != "netns" {
						return skel.Fail("unsupported topology", "DPC_TOPOLOGY=%s: netns only", n.Topology)
					}
					return nil
				}
			}, want: "unsupported topology", wantDetail: []string{"DPC_TOPOLOGY=kind: netns only"}},

		// Verbs not implemented: the environment does not matter.
		{name: "events unsupported", args: []string{"events"}, edit: func(f *skel.Funcs) { f.Events = nil }, want: "unsupported", wantDetail: []string{"test-driver does not implement events", "Observability"}},
		{name: "stop unsupported", args: []string{"stop", "--now"}, edit: func(f *skel.Funcs) { f.Stop = nil }, want: "unsupported", wantDetail: []string{"test-driver does not implement stop"}},

		// Failing functions.
		{name: "a Failure keeps its shape", args: []string{"stop"}, env: good,
			edit: func(f *skel.Funcs) {
				f.Stop = func(context.Context, skel.Node) error {
					return fmt.Errorf("stopping: %w", skel.Fail("agent did not exit", "pid %d still runs; see %s", 7, "agent.log"))
				}
			}, want: `{"error":"agent did not exit","detail":"pid 7 still runs; see agent.log"}`},
		{name: "any other error", args: []string{"status"}, env: good,
			edit: func(f *skel.Funcs) {
				f.Status = func(context.Context, skel.Node) (driver.Status, error) {
					return driver.Status{Running: true}, errors.New("boom")
				}
			}, want: `{"error":"failed","detail":"boom"}`},
		{name: "a failed collect", args: []string{"collect", "--dir", collectDir}, env: good,
			edit: func(f *skel.Funcs) {
				f.Collect = func(context.Context, skel.Node, string) ([]string, error) {
					return []string{"half"}, skel.Fail("collect failed", "no logs")
				}
			}, want: `{"error":"collect failed","detail":"no logs"}`},
		{name: "info without a name", args: []string{"info"}, edit: func(f *skel.Funcs) {
			f.Info = func(context.Context) (driver.Info, error) { return driver.Info{}, nil }
		}, want: "bad info", wantDetail: []string{"info has no name"}},
		{name: "info's lists are arrays, never null", args: []string{"info"}, edit: func(f *skel.Funcs) {
			f.Info = func(context.Context) (driver.Info, error) { return driver.Info{Name: "x", Version: "1"}, nil }
		}, want: `{"name":"x","version":"1","profiles":[],"features":[]}`},
		{name: "a reply that cannot be encoded", args: []string{"info"}, edit: func(f *skel.Funcs) {
			f.Info = func(context.Context) (driver.Info, error) {
				return driver.Info{Name: "x", CNI: json.RawMessage("{")}, nil
			}
		}, want: "bad reply", wantDetail: []string{"test-driver cannot encode its reply"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var r recorder
			funcs := r.funcs()
			if tt.edit != nil {
				tt.edit(&funcs)
			}
			lookup := func(k string) (string, bool) { v, ok := tt.env[k]; return v, ok }
			var stdout, stderr bytes.Buffer
			code := skel.Run(context.Background(), "test-driver", funcs, tt.args, lookup, &stdout, &stderr)

			var reply map[string]any
			dec := json.NewDecoder(&stdout)
			if err := dec.Decode(&reply); err != nil || dec.More() {
				t.Fatalf("stdout is not one JSON object (%v): %q", err, stdout.String())
			}
			_, failed := reply["error"]
			if failed != (code != 0) || (code != 0 && code != 1) {
				t.Errorf("exit code %d with reply %v; want 0 with a reply, 1 with {error,detail}", code, reply)
			}
			if failed {
				if line := stderr.String(); !strings.HasPrefix(line, "test-driver: ") || !strings.Contains(line, reply["detail"].(string)) {
					t.Errorf("stderr %q does not carry the error", line)
				}
			} else if stderr.Len() > 0 {
				t.Errorf("stderr on success: %q", stderr.String())
			}
			if strings.HasPrefix(tt.want, "{") {
				var want map[string]any
				if err := json.Unmarshal([]byte(tt.want), &want); err != nil {
					t.Fatal(err)
				}
				if !reflect.DeepEqual(reply, want) {
					t.Errorf("reply %v, want %s", reply, tt.want)
				}
			} else {
				if reply["error"] != tt.want {
					t.Errorf("error %q, want %q (detail %q)", reply["error"], tt.want, reply["detail"])
				}
				for _, d := range tt.wantDetail {
					if detail, _ := reply["detail"].(string); !strings.Contains(detail, d) {
						t.Errorf("detail %q lacks %q", detail, d)
					}
				}
			}
			if !reflect.DeepEqual(r.calls, tt.wantCalls) {
				t.Errorf("calls %q, want %q", r.calls, tt.wantCalls)
			}
		})
	}
	if st, err := os.Stat(collectDir); err != nil || !st.IsDir() {
		t.Errorf("collect did not create --dir: %v", err)
	}
}

func TestFailWraps(t *testing.T) {
	err := skel.Fail("missing binary", "agent: %w; build it", os.ErrNotExist)
	if !errors.Is(err, os.ErrNotExist) {
		t.Errorf("%v does not wrap os.ErrNotExist", err)
	}
	var f *skel.Failure
	if !errors.As(fmt.Errorf("start: %w", err), &f) || f.Msg != "missing binary" || f.Detail != "agent: file does not exist; build it" {
		t.Errorf("Failure %+v", f)
	}
}

// fileDriver is the driver of the round trip: its agent is a file in DPC_STATE_DIR,
// so that state carries from one call (one process) to the next.
func fileDriver() skel.Funcs {
	agent := func(n skel.Node) string { return filepath.Join(n.StateDir, "agent") }
	return skel.Funcs{
		Info: func(context.Context) (driver.Info, error) { return testInfo, nil },
		Start: func(_ context.Context, n skel.Node, o driver.StartOptions) (int, error) {
			return 7, os.WriteFile(agent(n), []byte(o.Mode), 0o644)
		},
		Status: func(_ context.Context, n skel.Node) (driver.Status, error) {
			_, err := os.Stat(agent(n))
			return driver.Status{Running: err == nil, Ready: err == nil}, nil
		},
		Stop: func(_ context.Context, n skel.Node) error {
			if err := os.Remove(agent(n)); err != nil {
				return skel.Fail("not running", "%v", err)
			}
			return nil
		},
		Collect: func(_ context.Context, n skel.Node, dir string) ([]string, error) {
			p := filepath.Join(dir, "agent.txt")
			data, _ := os.ReadFile(agent(n))
			return []string{p}, os.WriteFile(p, data, 0o644)
		},
	}
}

// TestExecRoundTrip runs a driver built with skel through the suite's own adapter.
func TestExecRoundTrip(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	d, err := driver.NewExec(self, driver.DefaultTimeouts, asDriver+"=1")
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	n := driver.Node{Name: "node-a", Env: []string{"DPC_NODE=node-a", "DPC_KUBECONFIG=/k", "DPC_STATE_DIR=" + t.TempDir()}}

	info, err := d.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(info, testInfo) {
		t.Errorf("info %+v, want %+v", info, testInfo)
	}
	if err := d.Start(ctx, n, driver.StartOptions{Mode: "m2"}); err != nil {
		t.Fatal(err)
	}
	if st, err := d.Status(ctx, n); err != nil || st != (driver.Status{Running: true, Ready: true}) {
		t.Errorf("status after start: %+v, %v", st, err)
	}
	dir := filepath.Join(t.TempDir(), "diagnostics")
	files, err := d.Collect(ctx, n, dir)
	if err != nil || len(files) != 1 {
		t.Fatalf("collect: %q, %v", files, err)
	}
	if data, err := os.ReadFile(files[0]); err != nil || string(data) != "m2" {
		t.Errorf("collected %q, %v; want the agent's mode", data, err)
	}
	if err := d.Stop(ctx, n); err != nil {
		t.Fatal(err)
	}

	// Failures read as the driver's own, with the contract's message and detail.
	for _, tt := range []struct {
		name      string
		call      func() error
		msg, text string
	}{
		{"a second stop", func() error { return d.Stop(ctx, n) }, "not running", "no such file"},
		{"a version not offered", func() error { return d.Start(ctx, n, driver.StartOptions{Version: "v9"}) }, "not offered", `testdp does not offer version "v9" (versions: v1)`},
		{"a verb not implemented", func() error { return d.Kill(ctx, n) }, "unsupported", "test-driver does not implement kill"},
		{"no node environment", func() error { _, err := d.Status(ctx, driver.Node{Name: "node-b"}); return err }, "bad environment", "DPC_NODE, DPC_KUBECONFIG, DPC_STATE_DIR not set"},
	} {
		err := tt.call()
		var de *driver.Error
		if !errors.As(err, &de) || de.Kind != "exit" || de.Message != tt.msg || !strings.Contains(de.Detail, tt.text) {
			t.Errorf("%s: want an exit with %q (%q), got %v", tt.name, tt.msg, tt.text, err)
		}
		if de != nil && !strings.Contains(de.Stderr, "test-driver: "+tt.msg) {
			t.Errorf("%s: stderr %q lacks the error", tt.name, de.Stderr)
		}
	}
}
