package specs

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/dpconform/dpconform/conformance"
)

// catalogueFile is docs/specs.md, made from the registry (make docs).
var catalogueFile = filepath.Join("..", "..", "docs", "specs.md")

// The committed catalogue is what the registry makes: a spec added, changed or
// removed without `make docs` fails here.
func TestCatalogueIsCurrent(t *testing.T) {
	var made bytes.Buffer
	if err := conformance.WriteCatalogue(&made); err != nil {
		t.Fatal(err)
	}
	committed, err := os.ReadFile(catalogueFile)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Equal(committed, made.Bytes()) {
		return
	}
	have, want := strings.Split(string(committed), "\n"), strings.Split(made.String(), "\n")
	line := 0
	for line < len(have) && line < len(want) && have[line] == want[line] {
		line++
	}
	at := func(ls []string) string {
		if line < len(ls) {
			return ls[line]
		}
		return "(end of file)"
	}
	t.Errorf("docs/specs.md is not what the spec registry makes; run `make docs` and commit it.\n"+
		"First difference, line %d:\n  committed: %s\n  registry:  %s", line+1, at(have), at(want))
}

// Every spec says what it does, with what, what must hold and where it comes from:
// the catalogue has nothing else to say about it.
func TestEverySpecIsDescribed(t *testing.T) {
	for _, s := range conformance.Specs() {
		for field, v := range map[string]string{"Description": s.Description, "Transition": s.Transition, "Traffic": s.Traffic,
			"Invariant": s.Invariant, "Origin": s.Origin} {
			if strings.TrimSpace(v) == "" {
				t.Errorf("%s has no %s: the catalogue (docs/specs.md) needs it", s.ID, field)
			}
		}
		if len(s.Budgets) == 0 {
			t.Errorf("%s names no budget its invariant is held to", s.ID)
		}
	}
}

// TestNoSpecRefusedOnOtherClocks: at the default clock-uncertainty, hosts of clocks of
// their own (a cluster of machines) refuse no spec of the catalogue.
func TestNoSpecRefusedOnOtherClocks(t *testing.T) {
	for _, s := range conformance.Specs() {
		if why := conformance.DefaultBudgets.ClockRefusal(s.Budgets); why != "" {
			t.Errorf("%s is refused at the default clock-uncertainty: %s", s.ID, why)
		}
	}
}
