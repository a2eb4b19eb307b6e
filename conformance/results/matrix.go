// Package results makes the transition matrix from the results ledger (docs/results,
// internal/ledger): which flows survive which transition, in which implementation,
// measured. Rows are the catalogue's specs by profile, columns the ledger's runs (and
// any run set beside them), each cell the spec's result with its failure kind and
// the figure against its budget, linking to the report it came from.
package results

import (
	"cmp"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"sigs.k8s.io/yaml"

	"github.com/dpconform/dpconform/conformance"
	"github.com/dpconform/dpconform/conformance/report"
	"github.com/dpconform/dpconform/internal/ledger"
)

// Column is one run of the matrix: its report and where it came from.
type Column struct {
	// Title names the implementation, its version and the run.
	Title string
	// Link is the report's path, relative to the page the matrix is written into.
	Link   string
	Report report.Report
	// Provenance is the ledger's record of the run (zero for a run set beside the
	// ledger).
	Provenance ledger.Provenance
	// Run is the run's name in the ledger (all-profiles, iptables-core, ...); empty
	// for a run set beside it.
	Run string
}

// Load reads the ledger at root into columns, in the ledger's order, with links
// relative to root.
func Load(root string) ([]Column, error) {
	runs, err := ledger.Load(root)
	if err != nil {
		return nil, err
	}
	var cols []Column
	for _, r := range runs {
		rep, err := ReadReport(filepath.Join(r.Dir, ledger.ReportFile))
		if err != nil {
			return nil, err
		}
		rel, err := filepath.Rel(root, filepath.Join(r.Dir, ledger.ReportFile))
		if err != nil {
			return nil, err
		}
		cols = append(cols, Column{
			Title:      fmt.Sprintf("%s %s (%s)", r.Implementation, r.Version, r.Name),
			Link:       filepath.ToSlash(rel),
			Report:     rep,
			Provenance: r.Provenance,
			Run:        r.Name,
		})
	}
	return cols, nil
}

// ReadReport reads a report.yaml; a field it does not know is an error, so a report of
// another format is never half read.
func ReadReport(path string) (report.Report, error) {
	var rep report.Report
	data, err := os.ReadFile(path)
	if err != nil {
		return rep, err
	}
	if err := yaml.UnmarshalStrict(data, &rep); err != nil {
		return rep, fmt.Errorf("%s: %w", path, err)
	}
	if rep.Kind != "ConformanceReport" {
		return rep, fmt.Errorf("%s: kind %q, want ConformanceReport", path, rep.Kind)
	}
	return rep, nil
}

// Headline renders one row per column and one column per profile: how many of the
// profile's specs passed, or why it was not judged. Links are prefixed with prefix
// (the ledger's path from the page the table goes into).
func Headline(cols []Column, prefix string) string {
	var b strings.Builder
	b.WriteString("| implementation | topology |")
	for _, p := range conformance.AllProfiles {
		fmt.Fprintf(&b, " %s |", p)
	}
	b.WriteString("\n|---|---|")
	for range conformance.AllProfiles {
		b.WriteString("---|")
	}
	b.WriteString("\n")
	for _, c := range cols {
		fmt.Fprintf(&b, "| [%s](%s) | %s |", c.Title, prefix+c.Link, c.Report.Topology)
		for _, p := range conformance.AllProfiles {
			fmt.Fprintf(&b, " %s |", profileCell(c.Report, p))
		}
		b.WriteString("\n")
	}
	return b.String()
}

// Complete reports whether the column's run ran a whole profile: a run focused on a
// few specs (a seed's pair) is in the matrix, not among the headline's rows, and so
// is a run of the reference with faults on (a measurement of the specs).
func (c Column) Complete() bool {
	if len(c.Provenance.Faults) > 0 {
		return false
	}
	for _, p := range c.Report.Profiles {
		if !p.Claimed {
			continue
		}
		if !slices.ContainsFunc(p.Specs, func(s report.SpecReport) bool {
			return s.Result == conformance.Skipped && strings.HasPrefix(s.Reason, "not selected")
		}) {
			return true
		}
	}
	return false
}

// profileCell is a profile's result in the headline: how many of the specs that ran
// passed ("11 of 11", "**9 of 11**" when one did not), how many did not run (a
// focused run), or why the profile was not run.
func profileCell(rep report.Report, p conformance.Profile) string {
	i := slices.IndexFunc(rep.Profiles, func(pr report.ProfileReport) bool { return pr.Name == p })
	if i < 0 {
		if !slices.Contains(rep.Implementation.Profiles, string(p)) {
			return "not claimed"
		}
		return "not in this run"
	}
	pr := rep.Profiles[i]
	if !pr.Claimed {
		return "not claimed"
	}
	passed, ran := 0, 0
	for _, s := range pr.Specs {
		if s.Result == conformance.Skipped {
			continue
		}
		ran++
		if s.Result == conformance.Passed {
			passed++
		}
	}
	if ran == 0 {
		return "not in this run"
	}
	cell := fmt.Sprintf("%d of %d", passed, ran)
	if pr.Result != conformance.Passed && pr.Result != conformance.Incomplete || passed < ran {
		cell = "**" + cell + "**"
	}
	if ran < len(pr.Specs) {
		cell += fmt.Sprintf(" (%d not run)", len(pr.Specs)-ran)
	}
	return cell
}

// Matrix renders the full matrix: a table per profile, a row per spec of the
// catalogue, a column per run.
func Matrix(cols []Column) string {
	var b strings.Builder
	bySpec := make([]map[string]report.SpecReport, len(cols))
	for i, c := range cols {
		bySpec[i] = map[string]report.SpecReport{}
		for _, p := range c.Report.Profiles {
			for _, s := range p.Specs {
				bySpec[i][s.ID] = s
			}
		}
	}
	for _, p := range conformance.AllProfiles {
		var specs []conformance.Spec
		for _, s := range conformance.Specs() {
			if s.Profile == p {
				specs = append(specs, s)
			}
		}
		if len(specs) == 0 {
			continue
		}
		slices.SortFunc(specs, func(a, b conformance.Spec) int { return cmp.Compare(a.ID, b.ID) })
		fmt.Fprintf(&b, "\n### %s\n\n| spec |", p)
		for _, c := range cols {
			fmt.Fprintf(&b, " [%s](%s) |", c.Title, c.Link)
		}
		b.WriteString("\n|---|")
		for range cols {
			b.WriteString("---|")
		}
		b.WriteString("\n")
		for _, s := range specs {
			fmt.Fprintf(&b, "| %s |", s.ID)
			for i, c := range cols {
				sr, ok := bySpec[i][s.ID]
				fmt.Fprintf(&b, " %s |", specCell(c.Report, p, sr, ok))
			}
			b.WriteString("\n")
		}
	}
	return b.String()
}

// specCell is one spec's result in one run: passed with its key figure, failed with
// its kind and the figure that broke the budget, or why it did not run.
func specCell(rep report.Report, p conformance.Profile, s report.SpecReport, ok bool) string {
	if !ok {
		if !slices.Contains(rep.Implementation.Profiles, string(p)) {
			return "not claimed"
		}
		return "not in this run"
	}
	switch s.Result {
	case conformance.Passed:
		if f := figure(s, true); f != "" {
			return "passed: " + f
		}
		return "passed"
	case conformance.Failed:
		cell := "**failed**"
		if s.Kind != "" {
			cell += " (" + s.Kind + ")"
		}
		if f := figure(s, false); f != "" {
			cell += ": " + f
		}
		return cell
	case conformance.Skipped:
		if strings.HasPrefix(s.Reason, "not selected") {
			return "not in this run"
		}
		return "skipped: " + escape(firstLine(s.Reason))
	default:
		return string(s.Result) + ": " + escape(firstLine(s.Reason))
	}
}

// keyFigures are the figures of the dataplane's own behaviour a passed cell may show:
// failed new connections, stream resets and gaps, a UDP flow's unanswered datagrams
// and how late the last one was (not the instrument's own figures).
var keyFigures = map[string]bool{"failed_attempts": true, "max_gap": true, "resets": true, "unanswered": true, "last_unanswered": true}

// figure is the figure to show for s: for a pass, its key figure closest to its
// budget; for a failure, the first figure over its budget.
func figure(s report.SpecReport, passed bool) string {
	var best report.FigureReport
	bestRatio := -1.0
	for _, c := range s.Checks {
		if strings.HasPrefix(c.Name, "precondition: ") && passed {
			continue
		}
		for _, f := range c.Figures {
			if f.Budget == nil {
				continue
			}
			if !passed {
				if !f.Within {
					return escape(f.Measured)
				}
				continue
			}
			if !keyFigures[f.Name] {
				continue
			}
			ratio := f.Value / max(*f.Budget, 1)
			if ratio > bestRatio {
				best, bestRatio = f, ratio
			}
		}
	}
	if bestRatio < 0 {
		return ""
	}
	return escape(best.Measured)
}

func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	if len(line) > 120 {
		line = line[:117] + "..."
	}
	return line
}

// escape keeps a cell's text from breaking its table.
func escape(s string) string { return strings.ReplaceAll(s, "|", `\|`) }
