// Package layering enforces the import rules of docs/architecture.md on non-test code:
// the suite knows an implementation only through its driver, the Kubernetes API and
// CNI, exactly as it will know a vendor's; every driver, the reference's too, is
// written as a vendor's would be, against the kit alone; the reference is a
// dataplane on its own.
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
	"conformance": {"reference", "bpf", "drivers"},
	"fv":          {"conformance", "reference", "bpf", "drivers"},
	"topologies":  {"conformance", "fv", "reference", "bpf", "drivers"},
	"reference":   {"conformance", "fv", "topologies", "drivers"},
	"bpf":         {"conformance", "fv", "topologies", "reference", "drivers"},
	// A driver imports the kit, its own implementation's libraries (the reference's
	// driver: reference/ and bpf/) and drivers/internal, nothing of the suite.
	"drivers": {"conformance", "fv", "topologies", "internal"},
}

// reportAPI is the report's format (report.yaml): vendors' tooling and the results
// ledger read it without the suite, so it imports nothing of the project.
const reportAPI = module + "conformance/report"

// kubeProxy is the one package of drivers/ the suite imports: kube-proxy is where a
// ModeSwitch spec starts from, run by the suite itself (fv/harness), and the
// kube-proxy driver runs it with the same library.
const kubeProxy = module + "drivers/kubeproxy"

// The driver kit (driver/) is what a vendor's Go driver imports: the contract, its
// skeleton and helpers. Every driver imports it, the reference's too, so it imports
// nothing of the project but itself; drivertest alone, the checks a vendor runs on
// their own driver, may bring up a world to run one in.
const kit = "driver"

// kitWorld is the kit's package that may import the rest of the project.
const kitWorld = module + "driver/drivertest"

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
	checked, kits := 0, 0
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
		inKit := tree(p.ImportPath) == kit && p.ImportPath != kitWorld
		if p.ImportPath == reportAPI {
			for _, d := range p.Deps {
				if strings.HasPrefix(d, module) {
					t.Errorf("%s imports %s: the report's format imports nothing of the project (docs/architecture.md, Layering)", p.ImportPath, d)
				}
			}
		}
		if inKit {
			kits++
		}
		for _, d := range p.Deps {
			if !strings.HasPrefix(d, module) {
				continue
			}
			if inKit && tree(d) != kit {
				t.Errorf("%s imports %s: the driver kit may import only itself, since every vendor's driver and the reference import it (docs/architecture.md, Layering)", p.ImportPath, d)
			}
			for _, ban := range bans {
				if tree(d) == ban && d != kubeProxy {
					t.Errorf("%s imports %s: %s/ must not depend on %s/ (docs/architecture.md, Layering)", p.ImportPath, d, tree(p.ImportPath), ban)
				}
			}
		}
	}
	if checked < 10 {
		t.Fatalf("only %d packages listed; the check would prove nothing", checked)
	}
	if kits < 5 {
		t.Fatalf("%d packages of the driver kit listed; is it renamed?", kits)
	}
}
