package topologies

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"strings"
)

// output runs name in h and returns its stdout. Its stderr is kept apart: in one
// pipe with stdout, a line a tool writes to stderr as it exits lands where its
// buffered stdout stood at that moment, often inside a line (conntrack's "N flow
// entries have been shown" split an entry of `conntrack -L`, which a parser then
// missed).
func output(ctx context.Context, h Host, name string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout = &stdout
	cmd.Stderr = &stderr
	if err := h.Start(cmd); err != nil {
		return nil, fmt.Errorf("start %s in %s: %w", name, h.Name(), err)
	}
	if err := cmd.Wait(); err != nil {
		said := bytes.TrimSpace(stderr.Bytes())
		if len(said) == 0 {
			said = bytes.TrimSpace(stdout.Bytes())
		}
		return stdout.Bytes(), fmt.Errorf("%s %s in %s: %w: %s", name, strings.Join(args, " "), h.Name(), err, said)
	}
	return stdout.Bytes(), nil
}
