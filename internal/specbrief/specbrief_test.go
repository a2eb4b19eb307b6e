package specbrief

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/onsi/ginkgo/v2"
	"github.com/onsi/ginkgo/v2/types"
	"github.com/onsi/gomega"
)

func TestBrief(t *testing.T) {
	var msg []string
	for i := range 20 {
		msg = append(msg, fmt.Sprintf("line %d", i+1))
	}
	s := types.SpecReport{
		ContainerHierarchyTexts: []string{"kube-router"},
		LeafNodeText:            "passes POLICY-TRUTH-TABLE",
		State:                   types.SpecStateFailed,
		Failure: types.Failure{
			Message:  strings.Join(msg, "\n") + "\n",
			Location: types.CodeLocation{FileName: "kuberouter_test.go", LineNumber: 62},
		},
	}
	got := Brief(s)
	lines := strings.Split(got, "\n")
	if want := "FAILED kube-router passes POLICY-TRUTH-TABLE (kuberouter_test.go:62)"; lines[0] != want {
		t.Errorf("first line %q, want %q", lines[0], want)
	}
	if len(lines) != 1+maxLines+1 {
		t.Fatalf("%d lines, want the heading, %d of the message and a note of the rest:\n%s", len(lines), maxLines, got)
	}
	if lines[1] != "    line 1" || lines[maxLines] != fmt.Sprintf("    line %d", maxLines) {
		t.Errorf("the message's first lines are not repeated in order:\n%s", got)
	}
	if want := fmt.Sprintf("    ... %d more lines in the spec's output above", 20-maxLines); lines[len(lines)-1] != want {
		t.Errorf("last line %q, want %q", lines[len(lines)-1], want)
	}

	s.Failure.Message = "one line"
	s.State = types.SpecStateTimedout
	if got, want := Brief(s), "TIMEDOUT kube-router passes POLICY-TRUTH-TABLE (kuberouter_test.go:62)\n    one line"; got != want {
		t.Errorf("Brief = %q, want %q", got, want)
	}
}

// envChild makes this test binary the suite TestRunSpecsLogsFailures runs.
const envChild = "SPECBRIEF_CHILD"

// TestChild is a suite with a spec that fails with a long message; it runs only as
// TestRunSpecsLogsFailures's child.
func TestChild(t *testing.T) {
	if os.Getenv(envChild) != "1" {
		t.Skip("run by TestRunSpecsLogsFailures")
	}
	gomega.RegisterFailHandler(ginkgo.Fail)
	ginkgo.It("passes", func() {})
	ginkgo.It("fails with its reason", func() {
		ginkgo.GinkgoWriter.Println(strings.Repeat("noise\n", 200))
		gomega.Expect("Errored").To(gomega.Equal("Passed"), "the reason the run errored\nits second line")
	})
	RunSpecs(t, "specbrief child")
}

// A failure's reason is printed after the suite's own summary, in the last lines
// of `go test`'s output, where a CI log's tail shows it.
func TestRunSpecsLogsFailures(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, "-test.run=^TestChild$")
	cmd.Env = append(os.Environ(), envChild+"=1")
	out, err := cmd.CombinedOutput()
	if err == nil {
		t.Fatalf("the child suite passed, though one of its specs fails:\n%s", out)
	}
	s := string(out)
	summary := strings.LastIndex(s, "Summarizing 1 Failure")
	reason := strings.LastIndex(s, "the reason the run errored")
	if summary < 0 || reason < summary {
		t.Fatalf("the failure's reason is not repeated after the suite's summary:\n%s", s)
	}
	tail := s[reason:]
	if !strings.Contains(s[summary:], "FAILED fails with its reason") || !strings.Contains(tail, "its second line") {
		t.Errorf("the brief after the summary lacks the spec or its message:\n%s", s[summary:])
	}
	if n := strings.Count(s[summary:], "\n"); n > 40 {
		t.Errorf("%d lines after the summary, want the brief alone:\n%s", n, s[summary:])
	}
}
