package dockerd

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestDropCapability: the wrapper removes CAP_SYS_RESOURCE from every capability set
// of the spec that runc's arguments name, and leaves the rest of the spec as it was,
// numbers included.
func TestDropCapability(t *testing.T) {
	caps := `{"bounding":["CAP_CHOWN","CAP_SYS_RESOURCE"],"effective":["CAP_SYS_RESOURCE"],"permitted":["CAP_CHOWN"]}`
	bundleSpec := `{"ociVersion":"1.0.2","process":{"capabilities":` + caps + `},"linux":{"resources":{"memory":{"limit":9223372036854775807}}}}`
	processSpec := `{"args":["sh"],"capabilities":` + caps + `}`
	for _, c := range []struct {
		name, spec string
		args       func(path string) []string
	}{
		{"create --bundle", bundleSpec, func(p string) []string {
			return []string{"--root", "/r", "create", "--bundle", filepath.Dir(p), "id"}
		}},
		{"run --bundle=", bundleSpec, func(p string) []string { return []string{"run", "--bundle=" + filepath.Dir(p), "id"} }},
		{"exec --process", processSpec, func(p string) []string { return []string{"exec", "--process", p, "id"} }},
	} {
		dir := t.TempDir()
		file := filepath.Join(dir, "config.json")
		if strings.HasPrefix(c.name, "exec") {
			file = filepath.Join(dir, "process.json")
		}
		if err := os.WriteFile(file, []byte(c.spec), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := dropCapability(c.args(file)); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		data, _ := os.ReadFile(file)
		if strings.Contains(string(data), capSysResource) {
			t.Errorf("%s: %s still has %s", c.name, data, capSysResource)
		}
		if !strings.Contains(string(data), "CAP_CHOWN") {
			t.Errorf("%s: %s lost other capabilities", c.name, data)
		}
		if strings.Contains(c.spec, "9223372036854775807") && !strings.Contains(string(data), "9223372036854775807") {
			t.Errorf("%s: %s changed a number", c.name, data)
		}
		var doc map[string]any
		if err := json.Unmarshal(data, &doc); err != nil {
			t.Errorf("%s: not JSON after the edit: %v", c.name, err)
		}
	}
	// Arguments that name no spec change nothing and fail nothing.
	if err := dropCapability([]string{"--version"}); err != nil {
		t.Error(err)
	}
}
