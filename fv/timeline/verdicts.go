package timeline

import (
	"fmt"
	"sort"

	"github.com/dpconform/dpconform/fv/monotime"
)

// Verdict is a policy verdict the implementation reported (the driver's `events`),
// stamped with the implementation's own CLOCK_MONOTONIC time so that it lines up with
// the probes' events.
type Verdict struct {
	Time    monotime.Time `json:"t"`
	Node    string        `json:"node"`
	Verdict string        `json:"verdict"` // "deny", "allow"
	Src     string        `json:"src"`
	Dst     string        `json:"dst"`
	Proto   string        `json:"proto,omitempty"`
	Sport   int           `json:"sport,omitempty"`
	Dport   int           `json:"dport,omitempty"`
	Reason  string        `json:"reason,omitempty"`
}

func (v Verdict) String() string {
	s := fmt.Sprintf("%s %s %s:%d -> %s:%d on %s", v.Verdict, v.Proto, v.Src, v.Sport, v.Dst, v.Dport, v.Node)
	if v.Reason != "" {
		s += " (" + v.Reason + ")"
	}
	return s
}

// AddVerdicts appends verdicts reported by node's implementation and notes that
// node's verdicts up to through have all been reported (the poll's watermark).
func (tl *Timeline) AddVerdicts(node string, through monotime.Time, vs []Verdict) {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	tl.verdicts = append(tl.verdicts, vs...)
	if tl.verdictMarks == nil {
		tl.verdictMarks = map[string]monotime.Time{}
	}
	tl.verdictMarks[node] = max(tl.verdictMarks[node], through)
}

// VerdictsReported returns, per node whose verdicts are polled, the time up to which
// they have all been reported.
func (tl *Timeline) VerdictsReported() map[string]monotime.Time {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	_, marks := tl.snapshotVerdicts()
	return marks
}

// snapshotVerdicts copies the verdicts, sorted, and the watermarks; tl.mu is held.
func (tl *Timeline) snapshotVerdicts() ([]Verdict, map[string]monotime.Time) {
	vs := append([]Verdict(nil), tl.verdicts...)
	sort.SliceStable(vs, func(i, j int) bool { return vs[i].Time < vs[j].Time })
	marks := map[string]monotime.Time{}
	for n, t := range tl.verdictMarks {
		marks[n] = t
	}
	return vs, marks
}

// VerdictsInside returns the verdicts stamped inside the window.
func (w Window) VerdictsInside() []Verdict {
	var out []Verdict
	for _, v := range w.Verdicts {
		if w.Contains(v.Time) {
			out = append(out, v)
		}
	}
	return out
}
