package topologies

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"strings"
)

func output(ctx context.Context, h Host, name string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	var out bytes.Buffer
	cmd.Stdout = &out
	cmd.Stderr = &out
	if err := h.Start(cmd); err != nil {
		return nil, fmt.Errorf("start %s in %s: %w", name, h.Name(), err)
	}
	if err := cmd.Wait(); err != nil {
		return out.Bytes(), fmt.Errorf("%s %s in %s: %w: %s", name, strings.Join(args, " "), h.Name(), err, bytes.TrimSpace(out.Bytes()))
	}
	return out.Bytes(), nil
}
