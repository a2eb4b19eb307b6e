package matchers

import (
	"fmt"
	"slices"
	"strings"

	"github.com/dpconform/dpconform/fv/probe"
	"github.com/dpconform/dpconform/fv/timeline"
)

// HaveStreamsOn succeeds when each of backends answers at least one of the selected
// streams opened before the window end: a spec about what happens to the streams of
// one backend of a Service must first show that the Service's load balancing put
// streams on every backend it judges. Options: Probes.
func HaveStreamsOn(backends ...string) Matcher {
	what := "streams answered by each of " + strings.Join(backends, ", ")
	return newMatcher(what, KindUnserved, nil, func(w timeline.Window, o options) (outcome, error) {
		streams, err := streamProbes(w, o, false)
		if err != nil {
			return outcome{}, err
		}
		per := map[string]int{}
		for _, s := range streams {
			per[s.backend]++
		}
		var parts, none []string
		for _, b := range backends {
			parts = append(parts, fmt.Sprintf("%s %d", b, per[b]))
			if per[b] == 0 {
				none = append(none, b)
			}
		}
		var others []string
		for b, n := range per {
			if !slices.Contains(backends, b) {
				name := b
				if name == "" {
					name = "(no echo yet)"
				}
				others = append(others, fmt.Sprintf("%s %d", name, n))
			}
		}
		slices.Sort(others)
		text := fmt.Sprintf("streams per backend: %s of %d", strings.Join(parts, ", "), len(streams))
		if len(others) > 0 {
			text += "; others: " + strings.Join(others, ", ")
		}
		out := outcome{verdict: Pass, figures: []Figure{
			{Name: "backends_without_streams", Value: float64(len(none)), Unit: "backends", Of: len(backends), Budget: budget(0), Text: text},
		}}
		if len(none) == 0 {
			return out, nil
		}
		out.verdict = Violation
		out.first = fmt.Sprintf("no stream of %d was answered by %s", len(streams), strings.Join(none, " or "))
		return out, nil
	})
}

// HaveAttemptsOn succeeds when each of backends answers at least one of the selected
// connect attempts that started inside the window: the load balancing of a Service
// reaches every backend a spec relies on (before a change, the backend it will remove;
// after it, the backend it added). Attempts answered by others, or failed, are counted
// but not judged. A window in which the probes started no attempt is an instrument
// error. Options: Probes, From.
func HaveAttemptsOn(backends []string, opts ...Option) Matcher {
	what := "new connections answered by each of " + strings.Join(backends, ", ")
	return newMatcher(what, KindUnserved, opts, func(w timeline.Window, o options) (outcome, error) {
		probes := ofRole(probesOf(w), probe.RoleConnect, o)
		if len(probes) == 0 {
			return outcome{}, fmt.Errorf("no connect probe on the timeline%s", selection(o))
		}
		for _, p := range probes {
			if err := covers(w, p, false, w.End); err != nil {
				return outcome{}, err
			}
		}
		per := map[string]int{}
		total, failed := 0, 0
		for _, e := range w.Inside() {
			if e.Kind != probe.KindAttempt || !o.selected(e.Probe) {
				continue
			}
			total++
			if e.Outcome == probe.OK {
				per[e.Backend]++
			} else {
				failed++
			}
		}
		if total == 0 {
			return outcome{}, fmt.Errorf("the probes%s started no attempt inside the window", selection(o))
		}
		var parts, none, others []string
		for _, b := range backends {
			parts = append(parts, fmt.Sprintf("%s %d", b, per[b]))
			if per[b] == 0 {
				none = append(none, b)
			}
		}
		for b, n := range per {
			if !slices.Contains(backends, b) {
				others = append(others, fmt.Sprintf("%s %d", b, n))
			}
		}
		slices.Sort(others)
		text := fmt.Sprintf("answers per backend: %s of %d attempts", strings.Join(parts, ", "), total)
		if len(others) > 0 {
			text += "; others: " + strings.Join(others, ", ")
		}
		if failed > 0 {
			text += fmt.Sprintf("; %d failed", failed)
		}
		out := outcome{verdict: Pass, figures: []Figure{
			{Name: "backends_unanswered", Value: float64(len(none)), Unit: "backends", Of: len(backends), Budget: budget(0), Text: text},
		}}
		if len(none) == 0 {
			return out, nil
		}
		out.verdict = Violation
		out.first = fmt.Sprintf("no attempt of %d was answered by %s", total, strings.Join(none, " or "))
		return out, nil
	})
}
