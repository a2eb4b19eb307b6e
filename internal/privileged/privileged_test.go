package privileged

import (
	"flag"
	"fmt"
	"os"
	"strings"
	"testing"
)

// An optional peer that was not given is skipped, never failed, whether or not
// DPC_REQUIRE_PRIVILEGED asks for every privileged test to run, and the skip says
// what to set and how to build it.
func TestSkipOptionalPeer(t *testing.T) {
	for _, require := range []string{"", "1"} {
		t.Run(EnvRequire+"="+require, func(t *testing.T) {
			t.Setenv(EnvRequire, require)
			var skipped []string
			SkipOptionalPeer(func(msg string, _ ...int) { skipped = append(skipped, msg) }, "Calico", "DPC_CALICO_DIR", "build it with `make calico`")
			if len(skipped) != 1 {
				t.Fatalf("skipped %d times, want once", len(skipped))
			}
			for _, want := range []string{"OPTIONAL PEER NOT RUN", "Calico", "DPC_CALICO_DIR", "make calico"} {
				if !strings.Contains(skipped[0], want) {
					t.Errorf("skip message %q lacks %q", skipped[0], want)
				}
			}
		})
	}
}

// fakeTB records what Require did.
type fakeTB struct{ skipped, fatal string }

func (f *fakeTB) Helper()           {}
func (f *fakeTB) Skip(args ...any)  { f.skipped = fmt.Sprint(args...) }
func (f *fakeTB) Fatal(args ...any) { f.fatal = fmt.Sprint(args...) }

// A -short run leaves privileged tests out, even where DPC_REQUIRE_PRIVILEGED=1
// would fail a skip: the fast tier leaves them out by choice, and make test runs them.
// Without -short, DPC_REQUIRE_PRIVILEGED still decides.
func TestShortLeavesPrivilegedOut(t *testing.T) {
	was := flag.Lookup("test.short").Value.String()
	t.Cleanup(func() { _ = flag.Set("test.short", was) })
	t.Setenv(EnvRequire, "1")

	if err := flag.Set("test.short", "true"); err != nil {
		t.Fatal(err)
	}
	var f fakeTB
	Require(&f)
	if f.fatal != "" || !strings.Contains(f.skipped, "make check") {
		t.Errorf("-short with %s=1: skipped %q, failed %q; want a skip naming make check", EnvRequire, f.skipped, f.fatal)
	}
	if Required() {
		t.Errorf("Required() in a -short run: want false")
	}

	if err := flag.Set("test.short", "false"); err != nil {
		t.Fatal(err)
	}
	f = fakeTB{}
	Require(&f)
	if os.Geteuid() == 0 && (f.skipped != "" || f.fatal != "") {
		t.Errorf("as root without -short: skipped %q, failed %q; want it to run", f.skipped, f.fatal)
	}
	if os.Geteuid() != 0 && !strings.Contains(f.fatal, "CANNOT RUN") {
		t.Errorf("not root, %s=1, without -short: failed %q; want a failure", EnvRequire, f.fatal)
	}
}
