package conformance

import (
	"errors"
	"fmt"
	"testing"

	"github.com/dpconform/dpconform/topologies"
)

// TestJudgeUnsupportedSetUp: a set-up the topology cannot serve (topologies.
// ErrUnsupported, however wrapped) skips the spec with the topology's reason; it is
// neither a verdict on the implementation nor an error of the run.
func TestJudgeUnsupportedSetUp(t *testing.T) {
	r := &Runner{}
	unsupported := fmt.Errorf("%w: on kind the kubelet writes a pod's status", topologies.ErrUnsupported)
	for _, c := range []struct {
		name string
		err  error
		want ResultKind
	}{
		{"from a step", fmt.Errorf("step %q: %w", "add pod", unsupported), Skipped},
		{"from the set-up, as an environment error", fmt.Errorf("%w: %w", ErrEnvironment, unsupported), Skipped},
		{"an environment error", fmt.Errorf("%w: no space", ErrEnvironment), Errored},
		{"anything else", errors.New("boom"), Errored},
	} {
		var res Result
		r.judge(&res, c.err, nil)
		if res.Result != c.want {
			t.Errorf("%s: %s (%s), want %s", c.name, res.Result, res.Reason, c.want)
		}
		if c.want == Skipped && res.Reason != c.err.Error() {
			t.Errorf("%s: reason %q, want the topology's %q", c.name, res.Reason, c.err)
		}
	}
}
