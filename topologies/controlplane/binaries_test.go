package controlplane

import (
	"os"
	"regexp"
	"testing"
)

// The versions FindBinaries looks for must be the ones the make targets build.
func TestVersionsMatchBuildModule(t *testing.T) {
	mod, err := os.ReadFile("../binaries/go.mod")
	if err != nil {
		t.Fatal(err)
	}
	for path, want := range map[string]string{
		"k8s.io/kubernetes":                      KubernetesVersion,
		"go.etcd.io/etcd/server/v3":              EtcdVersion,
		"github.com/containernetworking/plugins": CNIPluginsVersion,
	} {
		m := regexp.MustCompile(`(?m)^\s*` + regexp.QuoteMeta(path) + `\s+(\S+)`).FindSubmatch(mod)
		if m == nil {
			t.Errorf("%s not required by topologies/binaries/go.mod", path)
			continue
		}
		if string(m[1]) != want {
			t.Errorf("topologies/binaries/go.mod builds %s %s, but controlplane looks for %s", path, m[1], want)
		}
	}
}

func TestFindBinariesNamesTheFix(t *testing.T) {
	t.Setenv("DPC_CACHE_DIR", t.TempDir())
	_, err := FindBinaries()
	if err == nil {
		t.Fatal("FindBinaries found binaries in an empty cache")
	}
	for _, want := range []string{"etcd", "kube-apiserver", "ptp", "make control-plane cni", "DPC_ETCD"} {
		if !regexp.MustCompile(regexp.QuoteMeta(want)).MatchString(err.Error()) {
			t.Errorf("error does not mention %q:\n%v", want, err)
		}
	}
}
