package harness

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dpconform/dpconform/fv/probe"
	"github.com/dpconform/dpconform/topologies"
)

// loopbackHost runs probes in the test's own network namespace, on loopback: the
// harness's plumbing needs no privilege.
type loopbackHost struct{}

var _ topologies.Host = loopbackHost{}

func (loopbackHost) Name() string              { return "loopback" }
func (loopbackHost) IP() netip.Addr            { return netip.MustParseAddr("127.0.0.1") }
func (loopbackHost) Start(cmd *exec.Cmd) error { return cmd.Start() }
func (h loopbackHost) addr(port int) string    { return fmt.Sprintf("%s:%d", h.IP(), port) }

// freePorts returns n distinct loopback ports nobody listens on (TCP) right now.
func freePorts(t *testing.T, n int) []int {
	t.Helper()
	var ports []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports
}

// Nine pods probe their rows at once, as a truth table does: each call gets exactly
// its own targets' outcomes, in order, and the events are on the timeline.
func TestReachConcurrently(t *testing.T) {
	prog, err := probe.Self()
	if err != nil {
		t.Fatal(err)
	}
	w := New(fakeTopo{}, nil, prog)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	t.Cleanup(func() {
		if err := w.Cleanup(context.Background()); err != nil {
			t.Error(err)
		}
	})
	h := loopbackHost{}
	ports := freePorts(t, 2)
	served, closed := ports[0], ports[1]
	if _, err := w.StartProbe(ctx, h, probe.Serve{Name: "srv", TCP: []int{served}, UDP: []int{served}}); err != nil {
		t.Fatal(err)
	}
	rows := 9
	results := make([][]probe.Event, rows)
	errs := make([]error, rows)
	var wg sync.WaitGroup
	for i := range rows {
		cfg := probe.Reach{Name: fmt.Sprintf("reach-%d", i), Targets: []probe.Target{
			{Label: fmt.Sprintf("row %d srv TCP", i), Proto: "tcp", Addr: h.addr(served)},
			{Label: fmt.Sprintf("row %d srv UDP", i), Proto: "udp", Addr: h.addr(served)},
			{Label: fmt.Sprintf("row %d closed TCP", i), Proto: "tcp", Addr: h.addr(closed)},
		}}
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i], errs[i] = w.Reach(ctx, h, cfg)
		}()
	}
	wg.Wait()
	for i := range rows {
		if errs[i] != nil {
			t.Errorf("row %d: %v", i, errs[i])
			continue
		}
		want := []probe.Outcome{probe.OK, probe.OK, probe.Refused}
		if len(results[i]) != len(want) {
			t.Errorf("row %d: %d outcomes, want %d", i, len(results[i]), len(want))
			continue
		}
		for j, e := range results[i] {
			if wantLabel := []string{"srv TCP", "srv UDP", "closed TCP"}[j]; e.Label != fmt.Sprintf("row %d %s", i, wantLabel) || e.Probe != fmt.Sprintf("reach-%d", i) {
				t.Errorf("row %d, outcome %d is %q of %s", i, j, e.Label, e.Probe)
			}
			if e.Outcome != want[j] || (e.Outcome == probe.OK && e.Backend != "srv") {
				t.Errorf("row %d %q: %s by %q (%s), want %s", i, e.Label, e.Outcome, e.Backend, e.Err, want[j])
			}
		}
	}
	onTimeline := 0
	for _, e := range w.Timeline().Whole().Events {
		if e.Kind == probe.KindReach {
			onTimeline++
		}
	}
	if onTimeline != 3*rows {
		t.Errorf("%d reach events on the timeline, want %d", onTimeline, 3*rows)
	}
	w.mu.Lock()
	left := len(w.probes) + len(w.reaches)
	w.mu.Unlock()
	if left != 0 {
		t.Errorf("%d client probes left after Reach returned; each should be retired", left)
	}
}

func TestReachRefusesABadConfig(t *testing.T) {
	w := New(fakeTopo{}, nil, probe.Program{Path: "/nonexistent"})
	_, err := w.Reach(context.Background(), loopbackHost{}, probe.Reach{Name: "r"})
	if !errors.Is(err, probe.ErrProbe) || !strings.Contains(err.Error(), "at least one target") {
		t.Errorf("Reach without targets = %v", err)
	}
}

func TestReachOutcomes(t *testing.T) {
	cfg := probe.Reach{Name: "r", Targets: []probe.Target{{Label: "a"}, {Label: "b"}, {Label: "c"}}}
	ev := func(label string) probe.Event {
		return probe.Event{Kind: probe.KindReach, Label: label, Outcome: probe.OK}
	}
	other := probe.Event{Kind: probe.KindMark}
	got, problem := reachOutcomes(cfg, []probe.Event{ev("c"), other, ev("a"), ev("b")})
	if problem != "" || len(got) != 3 || got[0].Label != "a" || got[1].Label != "b" || got[2].Label != "c" {
		t.Errorf("complete: %+v, %q", got, problem)
	}
	skipped := ev("c")
	skipped.Outcome = probe.Skipped
	_, problem = reachOutcomes(cfg, []probe.Event{ev("a"), ev("a"), ev("zz"), skipped})
	for _, want := range []string{`no outcome for 1 of 3 targets: "b"`, `stopped before it tried 1 of 3 targets: "c"`, `more than one outcome for "a"`, `not asked for: "zz"`} {
		if !strings.Contains(problem, want) {
			t.Errorf("problem %q does not say %q", problem, want)
		}
	}
	if b := ReachBudget(probe.Reach{Targets: make([]probe.Target, probe.ReachParallel+1)}); b != ReachStartup+2*2*probe.DefaultReachTimeout {
		t.Errorf("budget of %d TCP targets: %v", probe.ReachParallel+1, b)
	}
	if b := ReachBudget(probe.Reach{Targets: []probe.Target{{Proto: "udp"}}, Tries: 2, Timeout: time.Second}); b != ReachStartup+4*time.Second {
		t.Errorf("budget of one UDP target: %v", b)
	}
}
