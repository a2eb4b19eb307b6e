package privileged

import (
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
