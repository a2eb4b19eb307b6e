package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The summary adds up the steps, names the failed ones, lists the slow packages one
// by one and the fast ones as a sum, and sums each phase log by phase and spec.
func TestReport(t *testing.T) {
	dir := t.TempDir()
	files := map[string]string{
		"steps.tsv": "check\t190\t0\ngo test (privileged)\t700\t1\n",
		"go-test.log": "=== RUN   TestX\nok  \tgithub.com/dpconform/dpconform/fv/probe\t62.1s\n" +
			"ok  \tgithub.com/dpconform/dpconform/fv/a\t1.5s\nok  \tgithub.com/dpconform/dpconform/fv/b\t2.5s\n" +
			"FAIL\tgithub.com/dpconform/dpconform/conformance/selftest\t880.5s\n",
		"phases.tsv": "spec\tagainst\tresult\tseconds\ttopology\tstart\nA\tclean\tPassed\t10.5\t2.0\t3.0\n" +
			"B\tfault\tFailed\t20\t1\t2\nA\tfault\tFailed\t30\t1\t2\n",
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	var out bytes.Buffer
	if err := report(&out, dir, []string{filepath.Join(dir, "phases.tsv"), filepath.Join(dir, "absent.tsv")}); err != nil {
		t.Fatal(err)
	}
	got := out.String()
	for _, want := range []string{
		"total", "14m50s", // 190 s + 700 s
		"FAILED",
		"conformance/selftest", "14m41s",
		"fv/probe", "1m02s",
		"2 more packages", "0m04s",
		"3 runs, 1m01s", "topology 0m04s", "start 0m07s",
		"slowest: A 0m41s;", // 10.5 s + 30 s
	} {
		if !strings.Contains(got, want) {
			t.Errorf("summary lacks %q:\n%s", want, got)
		}
	}
}
