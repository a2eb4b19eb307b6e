package netns

import (
	"strings"
	"testing"
)

func TestExpandCNIConfig(t *testing.T) {
	vars := map[string]string{
		"POD_CIDR": "10.244.1.0/24", "NODE_NAME": "node-b", "NODE_IP": "10.213.1.11", "CNI_DATA_DIR": "/tmp/x",
		"KUBECONFIG": "/run/k/kubeconfig", "STATE_DIR": "/run/k/state",
	}
	out, err := ExpandCNIConfig([]byte(DefaultCNIConfig), vars)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"subnet": "10.244.1.0/24"`, `"dataDir": "/tmp/x/ipam"`} {
		if !strings.Contains(string(out), want) {
			t.Errorf("expanded config lacks %s:\n%s", want, out)
		}
	}
	// What a real plugin (Calico's, Cilium's) needs to find the API server and its agent.
	out, err = ExpandCNIConfig([]byte(`{"kubeconfig": "${KUBECONFIG}", "stateDir": "${STATE_DIR}/cni"}`), vars)
	if err != nil {
		t.Fatal(err)
	}
	if want := `{"kubeconfig": "/run/k/kubeconfig", "stateDir": "/run/k/state/cni"}`; string(out) != want {
		t.Errorf("expanded to %s, want %s", out, want)
	}
	_, err = ExpandCNIConfig([]byte(`{"subnet": "${POD_CDIR}"}`), vars)
	if err == nil || !strings.Contains(err.Error(), "${POD_CDIR}") {
		t.Errorf("a misspelt variable must be reported by name, got %v", err)
	}
	if err == nil || !strings.Contains(err.Error(), "${KUBECONFIG}, ${STATE_DIR}") {
		t.Errorf("the error must list every known variable, got %v", err)
	}
}
