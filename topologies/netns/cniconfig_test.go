package netns

import (
	"strings"
	"testing"
)

func TestExpandCNIConfig(t *testing.T) {
	vars := map[string]string{"POD_CIDR": "10.244.1.0/24", "NODE_NAME": "node-b", "NODE_IP": "10.213.1.11", "CNI_DATA_DIR": "/tmp/x"}
	out, err := ExpandCNIConfig([]byte(DefaultCNIConfig), vars)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"subnet": "10.244.1.0/24"`, `"dataDir": "/tmp/x/ipam"`} {
		if !strings.Contains(string(out), want) {
			t.Errorf("expanded config lacks %s:\n%s", want, out)
		}
	}
	_, err = ExpandCNIConfig([]byte(`{"subnet": "${POD_CDIR}"}`), vars)
	if err == nil || !strings.Contains(err.Error(), "${POD_CDIR}") {
		t.Errorf("a misspelt variable must be reported by name, got %v", err)
	}
}
