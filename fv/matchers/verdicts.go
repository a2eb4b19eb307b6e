package matchers

import (
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/dpconform/dpconform/fv/timeline"
)

// Between restricts HaveNoVerdicts to verdicts on flows from src to dst (IP
// addresses, as the implementation reports them; an empty one matches any address,
// e.g. every flow to a server); repeat it for several flows.
func Between(src, dst string) Option {
	return func(o *options) { o.flows = append(o.flows, [2]string{src, dst}) }
}

// HaveNoVerdicts succeeds when the implementation reported no policy verdict of the
// given kind ("deny") inside the window, on the flows selected with Between (every
// flow without it). It is the Observability profile's invariant: a flow that policy
// allows must never be logged as denied, even for a moment. The verdicts must have
// been polled past the window's end on every node, or the matcher returns an
// ErrInstrument error. Options: Between.
func HaveNoVerdicts(verdict string, opts ...Option) Matcher {
	return newMatcher(fmt.Sprintf("no %q policy verdict", verdict), KindVerdict, opts, func(w timeline.Window, o options) (outcome, error) {
		nodes, err := polled(w)
		if err != nil {
			return outcome{}, err
		}
		var found []timeline.Verdict
		total := 0
		for _, v := range w.VerdictsInside() {
			if !o.selects(v) {
				continue
			}
			total++
			if v.Verdict == verdict {
				found = append(found, v)
			}
		}
		out := outcome{verdict: Pass, figures: []Figure{
			{Name: verdict + "_verdicts", Value: float64(len(found)), Unit: "verdicts", Of: total, Budget: budget(0),
				Text: fmt.Sprintf("%d %q of %d verdicts reported on the selected flows, from %s (budget 0)", len(found), verdict, total, strings.Join(nodes, ", "))},
		}}
		if len(found) == 0 {
			return out, nil
		}
		out.verdict, out.at = Violation, found[0].Time
		for _, v := range found {
			out.marks = append(out.marks, Mark{Node: v.Node, Time: v.Time, Kind: KindVerdict})
		}
		out.first = fmt.Sprintf("%s: %s", w.Relative(found[0].Time), found[0])
		var b strings.Builder
		b.WriteString("Verdicts:\n")
		for i, v := range found {
			if i == 12 {
				fmt.Fprintf(&b, "  ... and %d more\n", len(found)-12)
				break
			}
			fmt.Fprintf(&b, "  %s: %s\n", w.Relative(v.Time), v)
		}
		out.detail = b.String()
		return out, nil
	})
}

// HaveVerdicts succeeds when the implementation reported at least one policy verdict
// of the given kind inside the window on the flows selected with Between. It proves
// the instrument before HaveNoVerdicts is trusted: an implementation that reports
// nothing would pass "no deny" on every flow. Options: Between.
func HaveVerdicts(verdict string, opts ...Option) Matcher {
	return newMatcher(fmt.Sprintf("a %q policy verdict", verdict), KindVerdict, opts, func(w timeline.Window, o options) (outcome, error) {
		nodes, err := polled(w)
		if err != nil {
			return outcome{}, err
		}
		n, total := 0, 0
		for _, v := range w.VerdictsInside() {
			if !o.selects(v) {
				continue
			}
			total++
			if v.Verdict == verdict {
				n++
			}
		}
		out := outcome{verdict: Pass, figures: []Figure{
			{Name: verdict + "_verdicts", Value: float64(n), Unit: "verdicts", Of: total,
				Text: fmt.Sprintf("%d %q of %d verdicts reported on the selected flows, from %s", n, verdict, total, strings.Join(nodes, ", "))},
		}}
		if n == 0 {
			out.verdict = Violation
			out.first = fmt.Sprintf("no %q verdict was reported on the selected flows (%d verdicts on them in all)", verdict, total)
		}
		return out, nil
	})
}

// polled checks that every node's verdicts were polled past the window's end, and
// returns the nodes.
func polled(w timeline.Window) ([]string, error) {
	if len(w.VerdictsReported) == 0 {
		return nil, fmt.Errorf("no policy verdicts were polled: the scenario must poll them (conformance.Scenario.Verdicts)")
	}
	nodes := make([]string, 0, len(w.VerdictsReported))
	for n := range w.VerdictsReported {
		nodes = append(nodes, n)
	}
	sort.Strings(nodes)
	for _, n := range nodes {
		if t := w.VerdictsReported[n]; t < w.End {
			return nil, fmt.Errorf("the policy verdicts of %s were reported only up to %s, short of %s", n, w.Relative(t), w.Relative(w.End))
		}
	}
	return nodes, nil
}

// selects reports whether v is on a flow Between selected (every flow without it).
func (o options) selects(v timeline.Verdict) bool {
	return len(o.flows) == 0 || slices.ContainsFunc(o.flows, func(f [2]string) bool {
		return (f[0] == "" || f[0] == v.Src) && (f[1] == "" || f[1] == v.Dst)
	})
}
