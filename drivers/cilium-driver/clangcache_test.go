package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// fakeClang stands for clang: with -E it prints the source; otherwise it logs a
// compile, fails on a source that says FAIL, warns on one that says WARN, and
// writes "object of <source>" to stdout.
const fakeClang = `#!/bin/sh
pre=0; src=
for a; do case "$a" in -E) pre=1;; *.c) src=$a;; esac; done
if [ $pre = 1 ]; then cat "$src"; exit; fi
echo compile >> "$FAKE_CLANG_LOG"
if grep -q FAIL "$src"; then echo "error: FAIL" >&2; exit 3; fi
if grep -q WARN "$src"; then echo "warning: WARN" >&2; fi
printf 'object of '; cat "$src"
`

func TestCacheable(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		want bool
	}{
		{"Cilium's compile", []string{"-I/x", "-g", "-O2", "--target=bpf", "-c", "/lib/bpf_lxc.c", "-o", "-"}, true},
		{"to a file", []string{"-c", "a.c", "-o", "a.o"}, false},
		{"no -c", []string{"a.c", "-o", "-"}, false},
		{"preprocess only", []string{"-E", "-c", "a.c", "-o", "-"}, false},
		{"version", []string{"--version"}, false},
		{"dependency file", []string{"-MD", "-c", "a.c", "-o", "-"}, false},
		{"response file", []string{"@args", "-c", "a.c", "-o", "-"}, false},
		{"source on stdin", []string{"-c", "-", "-o", "-"}, false},
		{"two outputs", []string{"-o", "b.o", "-c", "a.c", "-o", "-"}, false},
		{"split dwarf", []string{"-gsplit-dwarf", "-c", "a.c", "-o", "-"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := cacheable(tc.args); got != tc.want {
				t.Errorf("cacheable(%q) = %t, want %t", tc.args, got, tc.want)
			}
		})
	}
}

func TestClangCache(t *testing.T) {
	dir := t.TempDir()
	clang := filepath.Join(dir, "clang")
	if err := os.WriteFile(clang, []byte(fakeClang), 0o755); err != nil {
		t.Fatal(err)
	}
	log := filepath.Join(dir, "compiles")
	t.Setenv("FAKE_CLANG_LOG", log)
	compiles := func() int {
		data, _ := os.ReadFile(log)
		return strings.Count(string(data), "compile")
	}
	src := filepath.Join(dir, "prog.c")
	c := &clangCache{Real: clang, Dir: filepath.Join(dir, "cache")}
	args := []string{"-O2", "-c", src, "-o", "-"}

	for _, step := range []struct {
		name     string
		source   string // written to src first, unless empty
		args     []string
		code     int
		stdout   string
		stderr   string
		compiles int // compiles of the real clang so far
	}{
		{"a miss compiles", "int a;", args, 0, "object of int a;", "", 1},
		{"the same input hits", "", args, 0, "object of int a;", "", 1},
		{"another argument misses", "", append([]string{"-DX"}, args...), 0, "object of int a;", "", 2},
		{"another source misses", "int b;", args, 0, "object of int b;", "", 3},
		{"back to the first source hits", "int a;", args, 0, "object of int a;", "", 3},
		{"a warning is written on the miss", "WARN", args, 0, "object of WARN", "warning: WARN\n", 4},
		{"and replayed on the hit", "", args, 0, "object of WARN", "warning: WARN\n", 4},
		{"a failure is clang's", "FAIL", args, 3, "", "error: FAIL\n", 5},
		{"and is not stored", "", args, 3, "", "error: FAIL\n", 6},
	} {
		if step.source != "" {
			if err := os.WriteFile(src, []byte(step.source), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		var stdout, stderr bytes.Buffer
		code, err := c.compile(step.args, &stdout, &stderr)
		if err != nil {
			t.Errorf("%s: %v", step.name, err)
		}
		if code != step.code || stdout.String() != step.stdout || stderr.String() != step.stderr {
			t.Errorf("%s: exit %d, stdout %q, stderr %q; want %d, %q, %q", step.name, code, stdout.String(), stderr.String(), step.code, step.stdout, step.stderr)
		}
		if n := compiles(); n != step.compiles {
			t.Errorf("%s: %d compiles by the real clang, want %d", step.name, n, step.compiles)
		}
	}
	// Nothing but entries is left: no temporary file of a store.
	_ = filepath.WalkDir(c.Dir, func(p string, d os.DirEntry, err error) error {
		if err == nil && strings.Contains(d.Name(), ".tmp") {
			t.Errorf("left behind: %s", p)
		}
		return nil
	})
}

func TestClangCachePrune(t *testing.T) {
	dir := t.TempDir()
	c := &clangCache{Dir: dir}
	now := time.Now()
	entry := func(name string, size int, age time.Duration, stderr bool) string {
		p := filepath.Join(dir, name[:2], name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, make([]byte, size), 0o644); err != nil {
			t.Fatal(err)
		}
		if stderr {
			if err := os.WriteFile(p+".stderr", []byte("warning"), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.Chtimes(p, now.Add(-age), now.Add(-age)); err != nil {
			t.Fatal(err)
		}
		return p
	}
	expired := entry("aa-expired", 10, maxAge+time.Hour, true)
	oldest := entry("bb-oldest", 400, 3*time.Hour, true)
	older := entry("cc-older", 400, 2*time.Hour, false)
	recent := entry("dd-recent", 400, time.Hour, false)
	stale := entry("ee.tmp123", 10, 2*time.Hour, false)
	fresh := entry("ff.tmp456", 10, time.Minute, false)

	// 1,200 bytes of live entries against a limit of 1,000: the least recently used
	// go until the rest is within 750.
	c.prune(now, 1000)
	for _, tc := range []struct {
		path string
		kept bool
	}{
		{expired, false}, {expired + ".stderr", false},
		{oldest, false}, {oldest + ".stderr", false},
		{older, false}, {recent, true},
		{stale, false}, {fresh, true},
	} {
		_, err := os.Stat(tc.path)
		if kept := err == nil; kept != tc.kept {
			t.Errorf("%s: kept %t, want %t", filepath.Base(tc.path), kept, tc.kept)
		}
	}
}
