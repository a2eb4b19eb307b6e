package conformance

import (
	"bytes"
	_ "embed"
	"fmt"
	"io"
	"regexp"
	"strings"
	"text/template"
	"time"
)

// The catalogue (docs/specs.md) is made from the registry, so that it cannot drift
// from the specs: `dpconform specs --markdown` writes it (make docs), and a test of
// conformance/specs fails when the committed file differs.

//go:embed catalogue.md.tmpl
var catalogueTemplate string

// budgetView is a budget's line in the catalogue: its name and default.
type budgetView struct {
	Name, Value string
}

type catalogueView struct {
	Profiles []catalogueProfile
	Budgets  []budgetView
	NotYet   []string
}

type catalogueProfile struct {
	Name     Profile
	Required string
	Intro    string
	After    string
	Specs    []catalogueSpec
}

type catalogueSpec struct {
	ID, Anchor, Profile, Features, Description string
	Transition, Traffic, Invariant, Origin     string
	Design                                     string
	Budgets, Catches                           string
}

// WriteCatalogue writes the catalogue of the registered specs as Markdown.
func WriteCatalogue(w io.Writer) error {
	t, err := template.New("catalogue").Parse(catalogueTemplate)
	if err != nil {
		return err
	}
	part := func(name string) (string, error) {
		sub := t.Lookup(name)
		if sub == nil {
			return "", nil
		}
		var b bytes.Buffer
		err := sub.Execute(&b, nil)
		return strings.TrimSpace(b.String()), err
	}
	defaults := DefaultBudgets.Values()
	var cv catalogueView
	for _, name := range BudgetNames() {
		cv.Budgets = append(cv.Budgets, budgetView{Name: name, Value: budgetText(defaults[name])})
	}
	byProfile := map[Profile][]Spec{}
	for _, s := range Specs() {
		byProfile[s.Profile] = append(byProfile[s.Profile], s)
	}
	for _, p := range AllProfiles {
		cp := catalogueProfile{Name: p, Required: strings.Join(featureStrings(RequiredFeatures[p]), ", ")}
		if cp.Intro, err = part("intro " + string(p)); err != nil {
			return err
		}
		if cp.After, err = part("after " + string(p)); err != nil {
			return err
		}
		for _, s := range byProfile[p] {
			cp.Specs = append(cp.Specs, catalogueEntry(s, defaults))
		}
		if len(cp.Specs) == 0 {
			cv.NotYet = append(cv.NotYet, fmt.Sprintf("%s: no spec yet.", p))
		}
		cv.Profiles = append(cv.Profiles, cp)
	}
	var b bytes.Buffer
	if err := t.Execute(&b, cv); err != nil {
		return err
	}
	// Blank lines the template's conditionals leave are not the document's.
	out := regexp.MustCompile(`\n{3,}`).ReplaceAll(bytes.TrimSpace(b.Bytes()), []byte("\n\n"))
	_, err = w.Write(append(out, '\n'))
	return err
}

func catalogueEntry(s Spec, defaults map[string]string) catalogueSpec {
	b := DefaultBudgets
	e := catalogueSpec{ID: s.ID, Anchor: strings.ToLower(s.ID), Profile: string(s.Profile), Description: b.Prose(s.Description),
		Features: strings.Join(featureStrings(s.Features), ", "), Transition: b.Prose(s.Transition), Traffic: b.Prose(s.Traffic),
		Invariant: b.Prose(s.Invariant), Origin: s.Origin, Design: b.Prose(s.Design)}
	if e.Features == "" {
		e.Features = "none beyond the profile's"
	}
	var budgets []string
	for _, b := range s.Budgets {
		budgets = append(budgets, fmt.Sprintf("`%s` %s", b, budgetText(defaults[b])))
	}
	e.Budgets = strings.Join(budgets, ", ")
	var catches []string
	for _, c := range s.Catches {
		var kinds []string
		for _, k := range c.Kinds {
			kinds = append(kinds, string(k))
		}
		by := ""
		if c.Runs > 1 {
			by = fmt.Sprintf("; by chance: the self-test takes up to %d runs", c.Runs)
		}
		catches = append(catches, fmt.Sprintf("`%s` (%s%s)", c.Fault, strings.Join(kinds, ", "), by))
	}
	e.Catches = strings.Join(catches, "; ")
	return e
}

// budgetText renders a budget's value as a person writes it: "1 s", "250 µs", "1 min".
func budgetText(v string) string {
	d, err := time.ParseDuration(v)
	if err != nil {
		return v // a count
	}
	switch {
	case d >= time.Minute && d%time.Minute == 0:
		return fmt.Sprintf("%d min", d/time.Minute)
	case d >= time.Second && d%time.Second == 0:
		return fmt.Sprintf("%d s", d/time.Second)
	case d >= time.Millisecond && d%time.Millisecond == 0:
		return fmt.Sprintf("%d ms", d/time.Millisecond)
	case d%time.Microsecond == 0:
		return fmt.Sprintf("%d µs", d/time.Microsecond)
	}
	return v
}

// budgetRef is a budget named in a spec's prose: {switch-max-gap} reads as its value
// and its name, "1 s (`switch-max-gap`)", so that the catalogue never states a value
// the budgets no longer hold.
var budgetRef = regexp.MustCompile(`\{([a-z][a-z0-9-]*)\}`)

// Prose renders the budgets that text names ({name}) with their values in b.
func (b Budgets) Prose(text string) string {
	values := b.Values()
	return budgetRef.ReplaceAllStringFunc(text, func(ref string) string {
		name := ref[1 : len(ref)-1]
		v, ok := values[name]
		if !ok {
			return ref
		}
		return budgetText(v) + " (`" + name + "`)"
	})
}
