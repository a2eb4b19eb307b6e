package cache

import (
	"testing"

	"github.com/dpconform/dpconform/topologies/controlplane"
)

// The drivers find what the suite's make targets built where the suite does.
func TestSameAsTheSuite(t *testing.T) {
	if KubernetesVersion != controlplane.KubernetesVersion || EtcdVersion != controlplane.EtcdVersion {
		t.Fatalf("versions %s, %s; the control plane's are %s, %s", KubernetesVersion, EtcdVersion, controlplane.KubernetesVersion, controlplane.EtcdVersion)
	}
	for _, env := range []map[string]string{
		{"DPC_CACHE_DIR": "/cache", "XDG_CACHE_HOME": "/xdg", "HOME": "/home/u"},
		{"DPC_CACHE_DIR": "", "XDG_CACHE_HOME": "/xdg", "HOME": "/home/u"},
		{"DPC_CACHE_DIR": "", "XDG_CACHE_HOME": "", "HOME": "/home/u"},
	} {
		for k, v := range env {
			t.Setenv(k, v)
		}
		t.Setenv("DPC_KUBE_PROXY", "")
		if got, want := Dir(), controlplane.CacheDir(); got != want {
			t.Errorf("with %v: Dir() = %s, the suite's %s", env, got, want)
		}
		bins, _ := controlplane.FindBinaries()
		if got := KubeProxy(); got != bins.KubeProxy {
			t.Errorf("with %v: KubeProxy() = %s, the suite's %s", env, got, bins.KubeProxy)
		}
	}
	t.Setenv("DPC_KUBE_PROXY", "/opt/kube-proxy")
	if got := KubeProxy(); got != "/opt/kube-proxy" {
		t.Errorf("KubeProxy() = %s with DPC_KUBE_PROXY set, want it", got)
	}
}
