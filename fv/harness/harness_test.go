package harness

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/dpconform/dpconform/driver"
	"github.com/dpconform/dpconform/fv/monotime"
	"github.com/dpconform/dpconform/fv/probe"
	"github.com/dpconform/dpconform/fv/timeline"
	"github.com/dpconform/dpconform/topologies"
)

// fakeNode and fakeTopo are the little of a topology that driver calls need.
type fakeNode struct {
	topologies.Node
	name string
}

func (n fakeNode) Name() string        { return n.name }
func (n fakeNode) DriverEnv() []string { return []string{"DPC_NODE=" + n.name} }

type fakeTopo struct {
	topologies.Topology
	nodes []topologies.Node
}

func (t fakeTopo) Nodes() []topologies.Node { return t.nodes }
func (t fakeTopo) Pods() []topologies.Pod   { return nil }

// fakeDriver answers Collect and Status from functions.
type fakeDriver struct {
	driver.Driver
	collect func(dir string) ([]string, error)
	status  func(call int) (driver.Status, error)
	calls   int
	started []string // each Start's options
	stops   int
}

func (d *fakeDriver) Start(_ context.Context, _ driver.Node, o driver.StartOptions) error {
	d.started = append(d.started, o.String())
	return nil
}

func (d *fakeDriver) Stop(context.Context, driver.Node) error { d.stops++; return nil }

func (d *fakeDriver) Collect(_ context.Context, _ driver.Node, dir string) ([]string, error) {
	return d.collect(dir)
}

func (d *fakeDriver) Status(context.Context, driver.Node) (driver.Status, error) {
	d.calls++
	return d.status(d.calls)
}

func world(d *fakeDriver) *World {
	return New(fakeTopo{nodes: []topologies.Node{fakeNode{name: "node-a"}}}, d, probe.Program{})
}

// A driver that writes into the directory it is given without creating it (as a
// real Calico driver did) must not lose its files; a file it names but did not write
// is not reported.
func TestCollectCreatesTheDirectory(t *testing.T) {
	d := &fakeDriver{collect: func(dir string) ([]string, error) {
		p := filepath.Join(dir, "maps.txt")
		if err := os.WriteFile(p, []byte("x"), 0o644); err != nil {
			return nil, err
		}
		return []string{p, "rules.txt", filepath.Join(dir, "never-written.txt")}, os.WriteFile(filepath.Join(dir, "rules.txt"), nil, 0o644)
	}}
	dir := filepath.Join(t.TempDir(), "diagnostics", "SPEC")
	files, err := world(d).Collect(context.Background(), dir)
	if err != nil {
		t.Fatalf("Collect: %v", err)
	}
	want := []string{filepath.Join(dir, "node-a", "maps.txt"), filepath.Join(dir, "node-a", "rules.txt")}
	if strings.Join(files, " ") != strings.Join(want, " ") {
		t.Errorf("Collect returned %v, want %v", files, want)
	}
}

func TestWaitReady(t *testing.T) {
	timeout := &driver.Error{Verb: "status", Kind: "timeout", Err: errors.New("no answer within 5s")}
	malformed := &driver.Error{Verb: "status", Kind: "malformed"}
	for _, tc := range []struct {
		name   string
		status func(call int) (driver.Status, error)
		check  func(error) bool
	}{
		{"ready after a status call that missed its deadline", func(call int) (driver.Status, error) {
			if call == 1 {
				return driver.Status{}, timeout
			}
			return driver.Status{Running: true, Ready: true}, nil
		}, func(err error) bool { return err == nil }},
		{"never ready is a verdict", func(int) (driver.Status, error) {
			return driver.Status{Running: true}, nil
		}, func(err error) bool {
			return errors.Is(err, ErrNotReady) && strings.Contains(err.Error(), "within 200ms")
		}},
		{"stopped running before ready is a verdict", func(call int) (driver.Status, error) {
			return driver.Status{Running: call < 3}, nil
		}, func(err error) bool {
			return errors.Is(err, ErrNotReady) && strings.Contains(err.Error(), "stopped running")
		}},
		{"a status that never answers is the driver's error", func(int) (driver.Status, error) {
			return driver.Status{}, timeout
		}, func(err error) bool { return driver.IsTimeout(err) && !errors.Is(err, ErrNotReady) }},
		{"a malformed status is the driver's error at once", func(int) (driver.Status, error) {
			return driver.Status{}, malformed
		}, func(err error) bool { return driver.IsDriverError(err) && !driver.IsTimeout(err) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := world(&fakeDriver{status: tc.status})
			w.ReadyTimeout = 200 * time.Millisecond
			err := w.WaitReady(context.Background(), w.Topo.Nodes()[0])
			if !tc.check(err) {
				t.Errorf("WaitReady = %v", err)
			}
			recorded := len(w.Timeline().Transitions()) == 1 && w.Timeline().Transitions()[0].Name == timeline.Ready
			if recorded != (err == nil) {
				t.Errorf("ready recorded: %v, error: %v", recorded, err)
			}
		})
	}
}

// WaitReady asks a slow driver less often: after a call it waits readyPollCost times
// as long as the call took, or ReadyPoll, whichever is longer, so that its calls take
// at most a quarter of the wait.
func TestWaitReadyPacesSlowCalls(t *testing.T) {
	for _, c := range []struct{ took, want time.Duration }{
		{0, ReadyPoll},
		{5 * time.Millisecond, ReadyPoll},
		{100 * time.Millisecond, 300 * time.Millisecond},
	} {
		if got := readyPause(c.took); got != c.want {
			t.Errorf("readyPause(%s) = %s, want %s", c.took, got, c.want)
		}
	}
	const slow = 30 * time.Millisecond
	var ends, starts []time.Time
	w := world(&fakeDriver{status: func(call int) (driver.Status, error) {
		starts = append(starts, time.Now())
		time.Sleep(slow)
		ends = append(ends, time.Now())
		return driver.Status{Running: true, Ready: call == 4}, nil
	}})
	if err := w.WaitReady(context.Background(), w.Topo.Nodes()[0]); err != nil {
		t.Fatal(err)
	}
	for i := 1; i < len(starts); i++ {
		if gap := starts[i].Sub(ends[i-1]); gap < readyPollCost*slow {
			t.Errorf("status call %d started %s after the one before ended, which took %s: want at least %s", i+1, gap, slow, readyPollCost*slow)
		}
	}
}

// An agent is recorded ready when its driver says it became ready, if that is inside
// the wait, else when the suite saw it: a driver can only make the checks that start
// at ready stricter.
func TestReadyAt(t *testing.T) {
	asked, seen := monotime.Time(1_000_000), monotime.Time(1_050_000)
	for _, c := range []struct {
		name  string
		since int64
		want  monotime.Time
	}{
		{"not given", 0, seen},
		{"inside the wait", 1_010_000, 1_010_000},
		{"before the wait: a previous agent's", 900_000, seen},
		{"after it was seen", 1_060_000, seen},
	} {
		if got := readyAt(asked, seen, c.since); got != c.want {
			t.Errorf("%s: readyAt = %d, want %d", c.name, got, c.want)
		}
	}
	since := monotime.Now()
	w := world(&fakeDriver{status: func(call int) (driver.Status, error) {
		if call < 3 {
			return driver.Status{Running: true}, nil
		}
		return driver.Status{Running: true, Ready: true, ReadySinceNS: int64(since.Add(30 * time.Millisecond))}, nil
	}})
	since = monotime.Now()
	if err := w.WaitReady(context.Background(), w.Topo.Nodes()[0]); err != nil {
		t.Fatal(err)
	}
	if tr := w.Timeline().Transitions(); len(tr) != 1 || tr[0].Time != since.Add(30*time.Millisecond) {
		t.Errorf("ready recorded %+v, want at the driver's %d", tr, since.Add(30*time.Millisecond))
	}
}

// An upgrade starts the node with its new options, and every later start of that
// node keeps them; the World lists the distinct starts, and the timeline says
// which start was which.
func TestUpgradeKeepsTheNewOptions(t *testing.T) {
	d := &fakeDriver{status: func(int) (driver.Status, error) { return driver.Status{Running: true, Ready: true}, nil }}
	w := world(d)
	w.StartOptions = driver.StartOptions{Version: "v1"}
	n := w.Topo.Nodes()[0]
	ctx := context.Background()
	if err := w.StartAll(ctx); err != nil {
		t.Fatal(err)
	}
	if err := w.Upgrade(ctx, n, false, driver.StartOptions{Version: "v2", Set: map[string]string{"ct-size": "8"}}); err != nil {
		t.Fatal(err)
	}
	if err := w.Restart(ctx, n, false); err != nil {
		t.Fatal(err)
	}
	want := []string{"start --version v1", "start --version v2 --set ct-size=8", "start --version v2 --set ct-size=8"}
	if strings.Join(d.started, "|") != strings.Join(want, "|") || d.stops != 2 {
		t.Errorf("driver started %q (stopped %d times), want %q (2)", d.started, d.stops, want)
	}
	if got := w.Starts(); strings.Join(got, "|") != strings.Join(want[:2], "|") {
		t.Errorf("Starts() = %q, want %q", got, want[:2])
	}
	var details []string
	for _, tr := range w.Timeline().Transitions() {
		if tr.Name == timeline.StartSent {
			details = append(details, tr.Detail)
		}
	}
	if len(details) != 3 || details[1] != "node-a: start --version v2 --set ct-size=8" {
		t.Errorf("start-sent details %q", details)
	}
}
