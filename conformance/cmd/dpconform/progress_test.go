package main

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/dpconform/dpconform/conformance"
	"github.com/dpconform/dpconform/fv/matchers"
)

// events are the progress of one spec that fails, as the runner reports it.
func progressEvents() []conformance.Progress {
	start := time.Unix(1000, 0)
	p := conformance.Progress{ID: "RESTART-NODEPORT-NEW", Index: 2, Total: 24, Run: 1, Runs: 1, Started: start}
	var out []conformance.Progress
	for _, ph := range []conformance.Phase{conformance.PhaseTopology, conformance.PhaseStart, conformance.PhaseWorkloads, conformance.PhaseSteadyState, conformance.PhaseTransition, conformance.PhaseSettle, conformance.PhaseChecks, conformance.PhaseCleanup} {
		q := p
		q.Phase = ph
		out = append(out, q)
	}
	res := conformance.Result{ID: p.ID, Result: conformance.Failed, Reason: "no failed new connection: reset", Duration: 13 * time.Second,
		Checks:  []conformance.CheckResult{{Name: "no failed new connection", Kind: matchers.KindReset}},
		Message: "check no failed new connection:\nExpected no failed connection attempt\nFirst violation: ..."}
	done := p
	done.Result, done.Final = &res, true
	return append(out, done)
}

func TestProgressPrinter(t *testing.T) {
	for _, tc := range []struct {
		name      string
		mode      ProgressMode
		color     bool
		want, not []string
	}{
		{"a log: a line per phase", ProgressLines, false,
			[]string{"[2/24] RESTART-NODEPORT-NEW · topology · 1.5 s", "· transition ·", "· checks ·",
				"[2/24] RESTART-NODEPORT-NEW ✗ FAILED (reset) in 13.0 s: no failed new connection: reset", "    First violation: ..."},
			[]string{"\x1b[", "\r"}},
		{"quiet: results and failures only", ProgressQuiet, false,
			[]string{"[2/24] RESTART-NODEPORT-NEW ✗ FAILED (reset) in 13.0 s", "    Expected no failed connection attempt"},
			[]string{"topology", "transition ·", "\x1b["}},
		{"a terminal: one line redrawn, in colour", ProgressLive, true,
			[]string{"\r\x1b[K[2/24] RESTART-NODEPORT-NEW · \x1b[1mtransition\x1b[0m", "\x1b[1;31m✗ FAILED (reset)\x1b[0m"},
			nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var b bytes.Buffer
			p := NewProgressPrinter(&b, tc.mode, tc.color)
			p.now = func() time.Time { return time.Unix(1001, 5e8) }
			for _, ev := range progressEvents() {
				p.Update(ev)
			}
			p.Close()
			out := b.String()
			t.Logf("\n%s", out)
			for _, w := range tc.want {
				if !strings.Contains(out, w) {
					t.Errorf("lacks %q", w)
				}
			}
			for _, n := range tc.not {
				if strings.Contains(out, n) {
					t.Errorf("has %q", n)
				}
			}
		})
	}
}

// A live line never wraps: a line that wraps cannot be redrawn in place.
func TestProgressLiveLineFitsTheTerminal(t *testing.T) {
	var b bytes.Buffer
	p := NewProgressPrinter(&b, ProgressLive, true)
	p.Width = 40
	p.now = func() time.Time { return time.Unix(1001, 0) }
	p.Update(progressEvents()[4])
	p.Close()
	for _, line := range strings.Split(b.String(), "\r\x1b[K") {
		if n := len([]rune(line)); n >= 40 {
			t.Errorf("live line of %d runes on a 40-column terminal: %q", n, line)
		}
	}
}
