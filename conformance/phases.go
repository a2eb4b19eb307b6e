package conformance

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"
)

// phaseOrder is the order phases are reported in: the order a run goes through them.
var phaseOrder = []Phase{PhaseTopology, PhaseStart, PhaseWorkloads, PhaseSteadyState, PhaseTransition, PhaseSettle, PhaseChecks, PhaseCleanup}

// PhaseTime is how long a run spent in one phase, summed over its scenarios.
type PhaseTime struct {
	Phase    Phase         `json:"phase"`
	Duration time.Duration `json:"duration"`
}

// phaseClock times the phases of one run: each call to enter ends the phase before.
type phaseClock struct {
	now     func() time.Time
	current Phase
	since   time.Time
	spent   map[Phase]time.Duration
}

func newPhaseClock() *phaseClock {
	return &phaseClock{now: time.Now, spent: map[Phase]time.Duration{}}
}

// enter ends the current phase, if any, and starts p.
func (c *phaseClock) enter(p Phase) {
	now := c.now()
	if c.current != "" {
		c.spent[c.current] += now.Sub(c.since)
	}
	c.current, c.since = p, now
}

// stop ends the current phase and returns the time spent in each phase the run
// entered, in phaseOrder.
func (c *phaseClock) stop() []PhaseTime {
	c.enter("")
	return phaseTimes(c.spent)
}

// phaseTimes lists the phases spent holds in phaseOrder, rounded to the millisecond.
func phaseTimes(spent map[Phase]time.Duration) []PhaseTime {
	var out []PhaseTime
	for _, p := range phaseOrder {
		if d, ok := spent[p]; ok {
			out = append(out, PhaseTime{Phase: p, Duration: d.Round(time.Millisecond)})
		}
	}
	return out
}

// sumPhases adds up the phase times of several runs.
func sumPhases(runs []Result) []PhaseTime {
	spent := map[Phase]time.Duration{}
	for _, r := range runs {
		for _, pt := range r.Phases {
			spent[pt.Phase] += pt.Duration
		}
	}
	if len(spent) == 0 {
		return nil
	}
	return phaseTimes(spent)
}

// PhasesString renders phase times for people: "topology 1.2s, start 0.8s, ...".
func PhasesString(pts []PhaseTime) string {
	parts := make([]string, len(pts))
	for i, pt := range pts {
		parts[i] = fmt.Sprintf("%s %s", pt.Phase, pt.Duration.Round(10*time.Millisecond))
	}
	return strings.Join(parts, ", ")
}

// PhaseLog writes a line per run to a tab-separated file: which spec ran with what,
// its result, and the seconds it spent in each phase. A test suite that runs many
// specs keeps one, so that where its time went can be read after it (make test).
// The file holds one process's runs: the first Add replaces what an earlier
// process wrote.
type PhaseLog struct {
	Path string

	mu      sync.Mutex
	started bool
}

// Add appends res's line, labelled with what it ran against; the first Add writes
// the header. It is safe for concurrent use.
func (l *PhaseLog) Add(label string, res Result) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if err := os.MkdirAll(filepath.Dir(l.Path), 0o755); err != nil {
		return err
	}
	flags := os.O_CREATE | os.O_WRONLY | os.O_APPEND
	if !l.started {
		flags |= os.O_TRUNC
	}
	f, err := os.OpenFile(l.Path, flags, 0o644)
	if err != nil {
		return err
	}
	var b strings.Builder
	if !l.started {
		b.WriteString("spec\tagainst\tresult\tseconds")
		for _, p := range phaseOrder {
			b.WriteString("\t" + string(p))
		}
		b.WriteString("\n")
		l.started = true
	}
	spent := map[Phase]time.Duration{}
	for _, pt := range res.Phases {
		spent[pt.Phase] = pt.Duration
	}
	fmt.Fprintf(&b, "%s\t%s\t%s\t%.3f", res.ID, label, res.Result, res.Duration.Seconds())
	for _, p := range phaseOrder {
		fmt.Fprintf(&b, "\t%.3f", spent[p].Seconds())
	}
	b.WriteString("\n")
	_, err = f.WriteString(b.String())
	return errors.Join(err, f.Close())
}
