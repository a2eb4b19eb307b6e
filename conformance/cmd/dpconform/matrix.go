package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/dpconform/dpconform/conformance/record"
	"github.com/dpconform/dpconform/conformance/results"
	"github.com/dpconform/dpconform/internal/ledger"
)

// matrix prints the transition matrix of the ledger at its argument, with runs of
// one's own beside it (--beside DIR, a run's output directory), or with --write makes
// the ledger's page and the README's generated blocks (make docs).
func matrix(args []string) error {
	fs := flag.NewFlagSet("matrix", flag.ExitOnError)
	write := fs.Bool("write", false, "write LEDGER/README.md and the generated blocks of --readme (make docs)")
	readme := fs.String("readme", "README.md", "the README whose generated headline --write updates")
	var beside multiFlag
	fs.Var(&beside, "beside", "a run's output directory (its report.yaml) to set beside the ledger's runs; repeatable")
	fs.Parse(args)
	if fs.NArg() != 1 {
		return errors.New("usage: dpconform matrix [--write [--readme README.md]] [--beside DIR ...] LEDGER (e.g. docs/results)")
	}
	root := fs.Arg(0)
	if *write {
		if len(beside) > 0 {
			return errors.New("matrix: --write makes the ledger's own page; --beside is for printing")
		}
		g, err := results.Generate(root)
		if err != nil {
			return err
		}
		text, err := os.ReadFile(*readme)
		if err != nil {
			return err
		}
		out, err := g.ApplyToReadme(string(text))
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(root, results.PageFile), []byte(g.Page), 0o644); err != nil {
			return err
		}
		return os.WriteFile(*readme, []byte(out), 0o644)
	}
	cols, err := results.Load(root)
	if err != nil {
		return err
	}
	for _, dir := range beside {
		rep, err := results.ReadReport(filepath.Join(dir, record.YAMLFile))
		if err != nil {
			return fmt.Errorf("--beside %s: %w (a run's output directory holds its report.yaml)", dir, err)
		}
		cols = append(cols, results.Column{
			Title:  fmt.Sprintf("%s %s (%s)", rep.Implementation.Name, rep.Implementation.Version, dir),
			Link:   filepath.ToSlash(filepath.Join(dir, record.YAMLFile)),
			Report: rep,
		})
	}
	fmt.Print(results.Headline(cols, ""))
	fmt.Print(results.Matrix(cols))
	return nil
}

// publish puts a run's report into the results ledger with its provenance: the
// repository's commit, which the work tree must not differ from outside docs/.
func publish(args []string) error {
	fs := flag.NewFlagSet("publish", flag.ExitOnError)
	name := fs.String("run", "", "the run's name in the ledger, e.g. all-profiles (required)")
	command := fs.String("command", "", "the command that runs it again (required)")
	repo := fs.String("repo", ".", "the dpconform repository the run ran from")
	faultList := fs.String("faults", "", "the reference's faults the run had on (DPC_REFDP_FAULTS), comma-separated: a measurement of the specs, kept out of the README's headline")
	fs.Parse(args)
	if fs.NArg() != 2 || *name == "" || *command == "" {
		return errors.New("usage: dpconform publish --run NAME --command CMD [--repo DIR] [--faults F,...] OUTPUT_DIR LEDGER (e.g. _output/conformance docs/results)")
	}
	out, root := fs.Arg(0), fs.Arg(1)
	report := filepath.Join(out, record.YAMLFile)
	rep, err := results.ReadReport(report)
	if err != nil {
		return fmt.Errorf("%w (OUTPUT_DIR is a run's output directory)", err)
	}
	head, err := ledger.Head(*repo)
	if err != nil {
		return err
	}
	date, err := time.Parse(time.RFC3339, rep.Date)
	if err != nil {
		return fmt.Errorf("%s: date: %w", report, err)
	}
	version, _, _ := strings.Cut(rep.Implementation.Version, " ")
	dir := filepath.Join(root, rep.Implementation.Name, version, *name)
	p := ledger.Provenance{Commit: head, Topology: rep.Topology, Command: *command, Date: date, Machine: ledger.Machine()}
	if *faultList != "" {
		p.Faults = strings.Split(*faultList, ",")
	}
	// Everything but the docs may decide a run of the reference.
	if err := ledger.Write(*repo, dir, report, p, []string{".", ":(exclude)docs"}); err != nil {
		return err
	}
	fmt.Println("wrote", dir)
	return nil
}
