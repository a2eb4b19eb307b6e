// Package buildbin builds the project's commands for tests that run them as separate
// processes (drivers, agents), the way a user would.
package buildbin

import (
	"context"
	"fmt"
	"os/exec"
	"path"
	"path/filepath"
)

// Module is the project's module path.
const Module = "github.com/dpconform/dpconform"

// Build runs `go build` for each command package (relative to the module, e.g.
// "reference/cmd/refdp") into dir, and returns the paths of the binaries by name.
func Build(ctx context.Context, dir string, pkgs ...string) (map[string]string, error) {
	out := map[string]string{}
	for _, p := range pkgs {
		name := path.Base(p)
		bin := filepath.Join(dir, name)
		cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, Module+"/"+p)
		if o, err := cmd.CombinedOutput(); err != nil {
			return nil, fmt.Errorf("go build %s: %w: %s", p, err, o)
		}
		out[name] = bin
	}
	return out, nil
}
