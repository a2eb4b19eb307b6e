package kind

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

func TestExpandCNIConfig(t *testing.T) {
	vars := map[string]string{"POD_CIDR": "10.244.1.0/24", "CNI_DATA_DIR": "/var/lib/cni/x"}
	out, err := expandCNIConfig([]byte(`{"subnet":"${POD_CIDR}","dataDir":"${CNI_DATA_DIR}/ipam"}`), vars)
	if err != nil || string(out) != `{"subnet":"10.244.1.0/24","dataDir":"/var/lib/cni/x/ipam"}` {
		t.Errorf("got %s, %v", out, err)
	}
	if _, err := expandCNIConfig([]byte(`{"x":"${NOPE}"}`), vars); err == nil || !strings.Contains(err.Error(), "${NOPE}") {
		t.Errorf("an unknown variable: %v, want an error naming it", err)
	}
}

// TestCheckStatic: the pods' image holds the probe binary alone, so a dynamically
// linked one is refused with the fix, and so are a relative path and no path.
func TestCheckStatic(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "main.go")
	os.WriteFile(src, []byte("package main\nimport \"os/user\"\nfunc main() { user.Current() }\n"), 0o644)
	build := func(name string, cgo string) string {
		bin := filepath.Join(dir, name)
		cmd := exec.Command("go", "build", "-o", bin, src)
		cmd.Env = append(os.Environ(), "CGO_ENABLED="+cgo)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go build: %v: %s", err, out)
		}
		return bin
	}
	if err := checkStatic(build("static", "0")); err != nil {
		t.Errorf("a static binary: %v", err)
	}
	if _, err := exec.LookPath("gcc"); err == nil {
		if err := checkStatic(build("dynamic", "1")); err == nil || !strings.Contains(err.Error(), "CGO_ENABLED=0") {
			t.Errorf("a dynamic binary: %v, want a refusal naming CGO_ENABLED=0", err)
		}
	}
	for _, p := range []string{"", "relative/bin", filepath.Join(dir, "missing")} {
		if err := checkStatic(p); err == nil {
			t.Errorf("checkStatic(%q) accepted it", p)
		}
	}
}
