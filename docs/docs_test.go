// Package docs holds the tests that keep the documentation from drifting: every link
// resolves to a file of the repository, every page a page names in text is one of it,
// and every Go
// listing is the compiled source it is marked as.
package docs

import (
	"bytes"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// repoRoot is the repository's root, from this package's directory.
const repoRoot = ".."

// pages lists the Markdown pages under root: README.md and docs/, the diagnostics
// runs keep in the ledger aside.
func pages(root string) ([]string, error) {
	out := []string{filepath.Join(root, "README.md")}
	err := filepath.WalkDir(filepath.Join(root, "docs"), func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && d.Name() == "diagnostics" {
			return filepath.SkipDir
		}
		if !d.IsDir() && strings.HasSuffix(path, ".md") {
			out = append(out, path)
		}
		return nil
	})
	return out, err
}

// link matches a Markdown link's target: [text](target) or [text](target "title").
var link = regexp.MustCompile(`\]\(([^)\s]+)(?:\s+"[^"]*")?\)`)

// cited matches a path named in text rather than linked; one of a Markdown page, such
// as `dir/PAGE.md`, must be a file of the repository too.
var cited = regexp.MustCompile(`[\w.-]+(?:/[\w.-]+)+`)

// checkReferences returns a problem per link of page that does not resolve to a file
// or directory inside root, and per citation of a file outside the repository.
func checkReferences(root, page string) []string {
	data, err := os.ReadFile(page)
	if err != nil {
		return []string{err.Error()}
	}
	rel, _ := filepath.Rel(root, page)
	var problems []string
	for i, line := range strings.Split(string(data), "\n") {
		for _, c := range cited.FindAllString(link.ReplaceAllString(line, "]"), -1) {
			if strings.HasSuffix(c, ".md") && !exists(root, filepath.Dir(page), c) {
				problems = append(problems, fmt.Sprintf("%s:%d cites %s, which is not in the repository: state what it says in the page's own words", rel, i+1, c))
			}
		}
		for _, m := range link.FindAllStringSubmatch(line, -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "#") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			target, _, _ = strings.Cut(target, "#")
			path := filepath.Clean(filepath.Join(filepath.Dir(page), target))
			if r, err := filepath.Rel(root, path); err != nil || strings.HasPrefix(r, "..") {
				problems = append(problems, fmt.Sprintf("%s:%d links %s, outside the repository", rel, i+1, m[1]))
				continue
			}
			if _, err := os.Stat(path); err != nil {
				problems = append(problems, fmt.Sprintf("%s:%d links %s, which does not exist", rel, i+1, m[1]))
			}
		}
	}
	return problems
}

// exists reports whether the path a page cites is a file of the repository at root,
// read from the root or from the page's directory.
func exists(root, dir, path string) bool {
	for _, base := range []string{root, dir} {
		p := filepath.Clean(filepath.Join(base, path))
		if r, err := filepath.Rel(root, p); err != nil || strings.HasPrefix(r, "..") {
			continue
		}
		if _, err := os.Stat(p); err == nil {
			return true
		}
	}
	return false
}

// listingMark names the source a Go listing shows: a whole file, or one top-level
// declaration of it (a func, a type, or a var or const group, by its first name).
var listingMark = regexp.MustCompile(`^<!-- listing: (\S+)(?: (\S+))? -->$`)

// checkListings returns a problem per Go listing of page that is not marked with its
// source, or differs from it.
func checkListings(root, page string) []string {
	data, err := os.ReadFile(page)
	if err != nil {
		return []string{err.Error()}
	}
	rel, _ := filepath.Rel(root, page)
	lines := strings.Split(string(data), "\n")
	var problems []string
	for i := 0; i < len(lines); i++ {
		if strings.TrimSpace(lines[i]) != "```go" {
			continue
		}
		start := i + 1
		end := start
		for end < len(lines) && strings.TrimSpace(lines[end]) != "```" {
			end++
		}
		listing := strings.Join(lines[start:end], "\n")
		var mark []string
		for j := i - 1; j >= 0 && j >= i-2; j-- {
			if m := listingMark.FindStringSubmatch(strings.TrimSpace(lines[j])); m != nil {
				mark = m
				break
			}
		}
		i = end
		if mark == nil {
			problems = append(problems, fmt.Sprintf("%s:%d: a Go listing with no <!-- listing: PATH [NAME] --> naming the compiled source it shows", rel, start))
			continue
		}
		want, err := source(filepath.Join(root, mark[1]), mark[2])
		if err != nil {
			problems = append(problems, fmt.Sprintf("%s:%d: %v", rel, start, err))
			continue
		}
		if strings.TrimSpace(listing) != strings.TrimSpace(want) {
			problems = append(problems, fmt.Sprintf("%s:%d: the listing differs from %s %s; copy it again from the source", rel, start, mark[1], mark[2]))
		}
	}
	return problems
}

// source returns the file at path, or its top-level declaration named name with its
// doc comment.
func source(path, name string) (string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	if name == "" {
		return string(data), nil
	}
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, path, data, parser.ParseComments)
	if err != nil {
		return "", err
	}
	for _, d := range f.Decls {
		var names []string
		var doc *ast.CommentGroup
		switch d := d.(type) {
		case *ast.FuncDecl:
			names, doc = []string{d.Name.Name}, d.Doc
		case *ast.GenDecl:
			doc = d.Doc
			for _, s := range d.Specs {
				switch s := s.(type) {
				case *ast.TypeSpec:
					names = append(names, s.Name.Name)
				case *ast.ValueSpec:
					for _, n := range s.Names {
						names = append(names, n.Name)
					}
				}
			}
		}
		if !slices.Contains(names, name) {
			continue
		}
		from := d.Pos()
		if doc != nil {
			from = doc.Pos()
		}
		return string(bytes.TrimSpace(data[fset.Position(from).Offset:fset.Position(d.End()).Offset])), nil
	}
	return "", fmt.Errorf("%s has no top-level declaration %s", path, name)
}

func TestReferencesResolve(t *testing.T) {
	ps, err := pages(repoRoot)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range ps {
		for _, problem := range checkReferences(repoRoot, p) {
			t.Error(problem)
		}
	}
}

func TestListingsAreTheirSource(t *testing.T) {
	ps, err := pages(repoRoot)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range ps {
		for _, problem := range checkListings(repoRoot, p) {
			t.Error(problem)
		}
	}
}

// The checks fail on what they are for: a dangling link, a citation of a file outside
// the repository, a listing that drifted from its source, and one with no source.
func TestDriftChecksFail(t *testing.T) {
	root := t.TempDir()
	write := func(name, content string) {
		t.Helper()
		path := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("x/x.go", "package x\n\n// F adds.\nfunc F(a, b int) int {\n\treturn a + b\n}\n")
	write("README.md", "See [docs](docs/page.md) and [here](docs/page.md#a-section).\n")
	write("docs/page.md", "As [the design](../../elsewhere/DESIGN.md) says, and `notes/DESIGN.md`; see [gone](gone.md) and docs/page.md.\n\n"+
		"<!-- listing: x/x.go F -->\n```go\n// F adds.\nfunc F(a, b int) int {\n\treturn a + b\n}\n```\n\n"+
		"<!-- listing: x/x.go F -->\n```go\nfunc F(a, b int) int { return a - b }\n```\n\n"+
		"```go\nfunc G() {}\n```\n")
	var refs, lists []string
	ps, err := pages(root)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range ps {
		refs = append(refs, checkReferences(root, p)...)
		lists = append(lists, checkListings(root, p)...)
	}
	wantIn := func(problems []string, want ...string) {
		t.Helper()
		for _, w := range want {
			if !slices.ContainsFunc(problems, func(p string) bool { return strings.Contains(p, w) }) {
				t.Errorf("no problem naming %q in %q", w, problems)
			}
		}
	}
	wantIn(refs, "cites notes/DESIGN.md", "links ../../elsewhere/DESIGN.md, outside", "links gone.md")
	if len(refs) != 3 { // the citation, the link outside the repository, gone.md
		t.Errorf("reference problems %q: want 3 (README.md's links resolve)", refs)
	}
	wantIn(lists, "docs/page.md:12: the listing differs from x/x.go F", "docs/page.md:16: a Go listing with no")
	if len(lists) != 2 {
		t.Errorf("listing problems %q: want 2 (the first listing is its source)", lists)
	}
}
