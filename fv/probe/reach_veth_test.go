package probe_test

import (
	"context"
	"io"
	"testing"
	"time"

	"github.com/dpconform/dpconform/fv/probe"
	"github.com/dpconform/dpconform/internal/privileged"
)

// TestReachThroughVeth proves the reach role on a real path between two namespaces:
// served ports answer with the server's name, closed ports are refused, a DROP and an
// address nobody holds are timeouts, and the server sees the label as it was given.
func TestReachThroughVeth(t *testing.T) {
	privileged.Require(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	l, err := newLab(ctx, func(f func() error) {
		t.Cleanup(func() {
			if err := f(); err != nil {
				t.Error(err)
			}
		})
	}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := l.start(ctx, l.pair.Server, probe.Serve{Name: "pod-b", TCP: []int{8080, 9000}, UDP: []int{5000, 5009}, RecordTCP: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.fw.Apply(ctx, "-I INPUT -p tcp --dport 9000 -j DROP", "-I INPUT -p udp --dport 5009 -j DROP"); err != nil {
		t.Fatal(err)
	}
	const timeout = 300 * time.Millisecond
	cfg := probe.Reach{Name: "reach-a", Timeout: timeout, Targets: []probe.Target{
		{Label: "b TCP/8080", Proto: "tcp", Addr: l.server(8080)},
		{Label: "b UDP/5000", Proto: "udp", Addr: l.server(5000)},
		{Label: "b TCP/8081 closed", Proto: "tcp", Addr: l.server(8081)},
		{Label: "b UDP/5001 closed", Proto: "udp", Addr: l.server(5001)},
		{Label: "b TCP/9000 dropped", Proto: "tcp", Addr: l.server(9000)},
		{Label: "b UDP/5009 dropped", Proto: "udp", Addr: l.server(5009)},
		{Label: "nobody TCP/80", Proto: "tcp", Addr: "10.99.0.77:80"},
		{Label: "nobody UDP/80", Proto: "udp", Addr: "10.99.0.77:80"},
	}}
	want := []struct {
		outcome probe.Outcome
		tries   int
	}{{probe.OK, 1}, {probe.OK, 1}, {probe.Refused, 1}, {probe.Refused, 1},
		{probe.Timeout, 1}, {probe.Timeout, probe.DefaultReachTries}, {probe.Timeout, 1}, {probe.Timeout, probe.DefaultReachTries}}
	start := time.Now()
	p, err := l.start(ctx, l.pair.Client, cfg)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.Done():
	case <-ctx.Done():
		t.Fatalf("reach did not end: %v", ctx.Err())
	}
	if err := p.Err(); err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	got := map[string]probe.Event{}
	for _, e := range p.Events() {
		if e.Kind == probe.KindReach {
			got[e.Label] = e
		}
	}
	for i, tg := range cfg.Targets {
		e, ok := got[tg.Label]
		switch {
		case !ok:
			t.Errorf("%q: no outcome", tg.Label)
		case e.Outcome != want[i].outcome || e.Count != want[i].tries:
			t.Errorf("%q: %s after %d tries (%s), want %s after %d", tg.Label, e.Outcome, e.Count, e.Err, want[i].outcome, want[i].tries)
		case e.Outcome == probe.OK && e.Backend != "pod-b":
			t.Errorf("%q: answered by %q, want pod-b", tg.Label, e.Backend)
		case e.Outcome == probe.Timeout && (e.Latency < timeout || e.Latency > timeout+100*time.Millisecond):
			t.Errorf("%q: timed out after %v, want %v", tg.Label, e.Latency, timeout)
		}
	}
	// Concurrently: the slowest target (3 UDP tries) bounds the whole.
	if max := time.Duration(probe.DefaultReachTries)*timeout + 500*time.Millisecond; took > max {
		t.Errorf("took %v, want under %v: the targets did not run concurrently", took, max)
	}
	stopCtx, stopCancel := context.WithTimeout(ctx, 5*time.Second)
	defer stopCancel()
	if err := srv.Stop(stopCtx); err != nil {
		t.Fatal(err)
	}
	labels := map[string]bool{}
	for _, e := range srv.Events() {
		if e.Kind == probe.KindRecv && e.From == "reach-a" {
			labels[e.Proto+" "+e.Target] = true
		}
	}
	for _, l := range []string{"tcp b TCP/8080", "udp b UDP/5000"} {
		if !labels[l] {
			t.Errorf("the server did not receive %q; it received %v", l, labels)
		}
	}
}
