package harness

import (
	"net/netip"
	"os/exec"
	"testing"
	"time"

	"github.com/dpconform/dpconform/fv/clocks"
	"github.com/dpconform/dpconform/fv/monotime"
)

type fakePod struct{ name, node string }

func (p fakePod) Name() string              { return p.name }
func (p fakePod) IP() netip.Addr            { return netip.Addr{} }
func (p fakePod) Start(*exec.Cmd) error     { return nil }
func (p fakePod) Namespace() string         { return "default" }
func (p fakePod) NodeName() string          { return p.node }
func (p fakePod) Labels() map[string]string { return nil }

// TestProbeClock: a probe's times are converted by its host's clock (a pod's by its
// node's), a server's record of a request by the sender's; a probe the world did not
// start reads the suite's clock, and so does everything with the alignment off.
func TestProbeClock(t *testing.T) {
	w := &World{clocks: map[string]*HostClock{
		"node-a":   {Host: "node-a", Span: clocks.Span{First: clocks.Estimate{Offset: 1000 * time.Second, Samples: 1}}},
		"external": {Host: "external", Span: clocks.Span{First: clocks.Estimate{Offset: -1000 * time.Second, Samples: 1}}},
	}}
	const at = monotime.Time(5000 * time.Second)
	srv := w.probeClock(fakePod{name: "backend", node: "node-a"}, "srv")
	w.probeClock(fakePod{name: "client", node: "node-b"}, "cl") // node-b: not measured
	w.probeHost["ext"] = "external"

	for _, c := range []struct {
		probe string
		t     monotime.Time
		want  monotime.Time
	}{
		{"srv", at.Add(1000 * time.Second), at},  // its own time, node-a's clock
		{"ext", at.Add(-1000 * time.Second), at}, // a sender on the external client
		{"cl", at, at},                           // a host not measured: the suite's clock
		{"control", at, at},                      // not the world's probe
		{"srv", 0, 0},                            // unset stays unset
	} {
		if got := srv(c.probe, c.t); got != c.want {
			t.Errorf("%s at %d: %d, want %d", c.probe, c.t, got, c.want)
		}
	}
	if got := w.toSuite("node-a", at.Add(1000*time.Second)); got != at {
		t.Errorf("toSuite node-a: %d, want %d", got, at)
	}
	w.ClockAlignmentOff = true
	if got := w.probeClock(fakePod{name: "backend2", node: "node-a"}, "srv2")("srv2", at); got != at {
		t.Errorf("alignment off: %d, want the time as written", got)
	}
	if got := (&World{}).probeClock(fakePod{name: "p", node: "node-a"}, "p"); got != nil {
		t.Error("a world of one clock converts nothing: want no conversion")
	}
}
