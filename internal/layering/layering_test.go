// Package layering enforces the import rules of ARCHITECTURE.md on non-test code: the
// suite knows an implementation only through its driver, the Kubernetes API and CNI,
// exactly as it will know a vendor's; the reference is a dataplane on its own.
package layering

import (
	"encoding/json"
	"io"
	"os/exec"
	"strings"
	"testing"
)

const module = "github.com/dpconform/dpconform/"

// forbidden maps a package tree to the trees its (non-test) code must not import.
var forbidden = map[string][]string{
	"conformance": {"reference", "bpf"},
	"fv":          {"conformance", "reference", "bpf"},
	"topologies":  {"conformance", "fv", "reference", "bpf"},
	"reference":   {"conformance", "fv", "topologies"},
	"bpf":         {"conformance", "fv", "topologies", "reference"},
}

// contract are the packages of fv that a vendor's Go driver imports: the driver
// contract, its skeleton and its helpers (crds). The reference's driver is one such driver, so it may
// import them, and nothing else of fv. For that to keep the reference free of the
// suite, they import nothing of the project but each other and internal/ packages,
// and those only if they are themselves free of the rest (their dependencies are
// checked with the contract's, since Deps is transitive).
var contract = map[string]bool{
	module + "fv/driver":      true,
	module + "fv/driver/skel": true,
	module + "fv/driver/crds": true,
}

func tree(pkg string) string {
	rest := strings.TrimPrefix(pkg, module)
	top, _, _ := strings.Cut(rest, "/")
	return top
}

func TestLayering(t *testing.T) {
	cmd := exec.Command("go", "list", "-json=ImportPath,Deps", module+"...")
	cmd.Dir = "../.."
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	dec := json.NewDecoder(strings.NewReader(string(out)))
	checked, contracts := 0, 0
	for {
		var p struct {
			ImportPath string
			Deps       []string
		}
		if err := dec.Decode(&p); err == io.EOF {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		bans := forbidden[tree(p.ImportPath)]
		checked++
		if contract[p.ImportPath] {
			contracts++
		}
		for _, d := range p.Deps {
			if !strings.HasPrefix(d, module) {
				continue
			}
			if contract[p.ImportPath] && !contract[d] && tree(d) != "internal" {
				t.Errorf("%s imports %s: the driver contract may import only itself and internal/ packages, since every vendor's driver and the reference import it (ARCHITECTURE.md, Layering)", p.ImportPath, d)
			}
			if tree(p.ImportPath) == "reference" && contract[d] {
				continue
			}
			for _, ban := range bans {
				if tree(d) == ban {
					t.Errorf("%s imports %s: %s/ must not depend on %s/ (ARCHITECTURE.md, Layering)", p.ImportPath, d, tree(p.ImportPath), ban)
				}
			}
		}
	}
	if checked < 10 {
		t.Fatalf("only %d packages listed; the check would prove nothing", checked)
	}
	if contracts != len(contract) {
		t.Fatalf("%d of the %d contract packages listed; is one renamed?", contracts, len(contract))
	}
}
