package bpf

import (
	"bytes"
	"go/build"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestGeneratedObjectsUpToDate regenerates the bpf2go output into a
// temporary directory, with each //go:generate line of loader.go (one object
// per version of refdp), and checks
// that the committed files are identical. bpf2go makes clang's output
// reproducible (-g for BTF, then DWARF stripped; -fdebug-prefix-map and
// -fno-ident, so no paths or compiler versions); a different clang version
// may still produce different code, so the test needs the same toolchain
// that generated the committed objects (Debian's clang 14 on amd64).
func TestGeneratedObjectsUpToDate(t *testing.T) {
	if testing.Short() {
		t.Skip("SKIPPED: regenerating the BPF objects builds bpf2go; not with -short")
	}
	for _, tool := range []string{"clang", "llvm-strip"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("SKIPPED: cannot check the committed BPF objects against their sources without %s: %v", tool, err)
		}
	}
	goBin := filepath.Join(build.Default.GOROOT, "bin", "go")
	if _, err := os.Stat(goBin); err != nil {
		t.Skipf("SKIPPED: no go binary at %s: %v", goBin, err)
	}

	src, err := os.ReadFile("loader.go")
	if err != nil {
		t.Fatal(err)
	}
	var lines [][]string
	for _, line := range strings.Split(string(src), "\n") {
		if rest, ok := strings.CutPrefix(line, "//go:generate go tool bpf2go "); ok {
			lines = append(lines, strings.Fields(rest)) // the line has no quoted arguments
		}
	}
	if lines == nil {
		t.Fatal("no //go:generate go tool bpf2go line in loader.go")
	}

	out := t.TempDir()
	for _, args := range lines {
		cmd := exec.Command(goBin, append([]string{"tool", "bpf2go", "-output-dir", out}, args...)...)
		cmd.Env = append(os.Environ(), "GOPACKAGE=bpf", "GOFILE=loader.go")
		if b, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("%s: %v\n%s", cmd, err, b)
		}
	}
	generated, err := filepath.Glob(filepath.Join(out, "*"))
	if err != nil || len(generated) != 2*len(lines) {
		t.Fatalf("bpf2go wrote %v (%v), want a .go and a .o per line", generated, err)
	}
	for _, path := range generated {
		name := filepath.Base(path)
		want, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s is stale: run `go generate ./bpf/...` and commit the result", name)
		}
	}
}
