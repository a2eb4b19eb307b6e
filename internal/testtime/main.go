// Command testtime prints where a make test's time went: each step (steps.tsv, which
// the Makefile writes), each package go test ran (go-test.log, from `ok` and `FAIL`
// lines), and for each phase log (conformance.PhaseLog) the runs' time by phase and
// its slowest specs. So whoever adds a spec, a peer or a step sees what it costs.
//
//	go run ./internal/testtime DIR [PHASES.tsv ...]
package main

import (
	"bufio"
	"cmp"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: testtime DIR [PHASES.tsv ...]")
		os.Exit(2)
	}
	if err := report(os.Stdout, os.Args[1], os.Args[2:]); err != nil {
		fmt.Fprintln(os.Stderr, "testtime:", err)
		os.Exit(1)
	}
}

// report writes the summary of the make test whose records are in dir, with the phase
// logs named; a record that is missing is skipped (a make test that stopped early
// wrote fewer).
func report(w io.Writer, dir string, phaseLogs []string) error {
	steps, err := readTSV(filepath.Join(dir, "steps.tsv"))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	var total time.Duration
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "\nwhere make test's time went")
	for _, s := range steps {
		if len(s) < 3 {
			continue
		}
		secs, _ := strconv.Atoi(s[1])
		d := time.Duration(secs) * time.Second
		total += d
		state := ""
		if s[2] != "0" {
			state = "FAILED"
		}
		fmt.Fprintf(tw, "  %s\t%s\t%s\t\n", s[0], minutes(d), state)
	}
	fmt.Fprintf(tw, "  total\t%s\t\t\n", minutes(total))
	if err := tw.Flush(); err != nil {
		return err
	}

	pkgs, err := packages(filepath.Join(dir, "go-test.log"))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	if len(pkgs) > 0 {
		fmt.Fprintln(w, "\ngo test, by package (the slowest first; those under 10 s summed)")
		slices.SortStableFunc(pkgs, func(a, b pkgTime) int { return cmp.Compare(b.d, a.d) })
		var rest time.Duration
		var nrest int
		for _, p := range pkgs {
			if p.d < 10*time.Second {
				rest += p.d
				nrest++
				continue
			}
			fmt.Fprintf(tw, "  %s\t%s\t%s\t\n", p.name, minutes(p.d), p.state)
		}
		if nrest > 0 {
			fmt.Fprintf(tw, "  %d more packages\t%s\t\t\n", nrest, minutes(rest))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}

	for _, path := range phaseLogs {
		if err := phases(w, path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
	}
	return nil
}

type pkgTime struct {
	name, state string
	d           time.Duration
}

// packages reads go test's result lines: "ok  \tPKG\t12.3s" and "FAIL\tPKG\t4.5s".
func packages(path string) ([]pkgTime, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []pkgTime
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		fields := strings.Split(sc.Text(), "\t")
		if len(fields) < 3 || (strings.TrimSpace(fields[0]) != "ok" && fields[0] != "FAIL") {
			continue
		}
		d, err := time.ParseDuration(strings.Fields(fields[2])[0])
		if err != nil {
			continue
		}
		state := ""
		if fields[0] == "FAIL" {
			state = "FAILED"
		}
		out = append(out, pkgTime{name: strings.TrimPrefix(fields[1], "github.com/dpconform/dpconform/"), state: state, d: d})
	}
	return out, sc.Err()
}

// phases summarises a phase log: how many runs, their time by phase, and the slowest
// specs by their summed time.
func phases(w io.Writer, path string) error {
	rows, err := readTSV(path)
	if err != nil {
		return err
	}
	if len(rows) < 2 {
		return nil
	}
	header := rows[0]
	const first = 4 // spec, against, result, seconds, then the phases
	sum := make([]float64, len(header))
	bySpec := map[string]float64{}
	for _, r := range rows[1:] {
		for i := 3; i < len(r) && i < len(header); i++ {
			v, _ := strconv.ParseFloat(r[i], 64)
			sum[i] += v
			if i == 3 {
				bySpec[r[0]] += v
			}
		}
	}
	fmt.Fprintf(w, "\n%s: %d runs, %s\n ", path, len(rows)-1, minutes(secs(sum[3])))
	for i := first; i < len(header); i++ {
		if sum[i] > 0 {
			fmt.Fprintf(w, " %s %s", header[i], minutes(secs(sum[i])))
		}
	}
	fmt.Fprintln(w)
	specs := make([]string, 0, len(bySpec))
	for s := range bySpec {
		specs = append(specs, s)
	}
	slices.SortFunc(specs, func(a, b string) int { return cmp.Compare(bySpec[b], bySpec[a]) })
	fmt.Fprint(w, "  slowest:")
	for _, s := range specs[:min(5, len(specs))] {
		fmt.Fprintf(w, " %s %s;", s, minutes(secs(bySpec[s])))
	}
	fmt.Fprintln(w)
	return nil
}

func readTSV(path string) ([][]string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var rows [][]string
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		if line != "" {
			rows = append(rows, strings.Split(line, "\t"))
		}
	}
	return rows, nil
}

func secs(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

// minutes renders d as "12m05s", the form the steps of a long make test read best in.
func minutes(d time.Duration) string {
	d = d.Round(time.Second)
	return fmt.Sprintf("%dm%02ds", int(d.Minutes()), int(d.Seconds())%60)
}
