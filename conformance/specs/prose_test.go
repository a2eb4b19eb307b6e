package specs

import (
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/dpconform/dpconform/conformance"
)

// A spec's prose names its budgets ({name}), never states their values: the
// catalogue and the reports render them from the budgets (Budgets.Prose), so a
// changed default cannot leave a stale number behind.
func TestProseNamesBudgetsNotTheirValues(t *testing.T) {
	ref := regexp.MustCompile(`\{([a-z][a-z0-9-]*)\}`)
	literal := regexp.MustCompile("[0-9][0-9.,]* ?(µs|ms|s|min)? \\(`([a-z][a-z0-9-]*)`\\)")
	names := conformance.BudgetNames()
	for _, s := range conformance.Specs() {
		for field, text := range map[string]string{"Description": s.Description, "Transition": s.Transition, "Traffic": s.Traffic, "Invariant": s.Invariant} {
			for _, m := range ref.FindAllStringSubmatch(text, -1) {
				if !slices.Contains(names, m[1]) {
					t.Errorf("%s's %s names {%s}, which is no budget", s.ID, field, m[1])
				}
			}
			for _, m := range literal.FindAllStringSubmatch(text, -1) {
				if slices.Contains(names, m[2]) {
					t.Errorf("%s's %s states %q: write {%s}", s.ID, field, m[0], m[2])
				}
			}
			// The values of the budgets it lists, written out where the budget is meant.
			for _, b := range s.Budgets {
				v := conformance.DefaultBudgets.Prose("{" + b + "}")
				v = strings.TrimSuffix(v, " (`"+b+"`)")
				if strings.ContainsAny(v, "0123456789") && strings.Contains(text, "every "+v) {
					t.Errorf("%s's %s states \"every %s\", the value of its budget %s: write {%s}", s.ID, field, v, b, b)
				}
			}
		}
	}
}

func TestProseRendersBudgets(t *testing.T) {
	got := conformance.DefaultBudgets.Prose("no gap over {switch-max-gap}; {not-a-budget}")
	if want := "no gap over 1 s (`switch-max-gap`); {not-a-budget}"; got != want {
		t.Errorf("Prose = %q, want %q", got, want)
	}
}
