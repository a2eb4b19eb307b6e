// Package controlplane runs a real Kubernetes control plane for one run: etcd,
// kube-apiserver and a kube-controller-manager that runs only the EndpointSlice
// controllers. Nothing is mocked; agents watch it with their ordinary clients.
package controlplane

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

// Versions of the binaries that `make control-plane` and `make cni` build. They must
// match topologies/binaries/go.mod; a test checks that they do.
const (
	KubernetesVersion = "v1.37.2"
	EtcdVersion       = "v3.7.3"
	CNIPluginsVersion = "v1.10.0"
)

// Binaries are the paths of the programs a netns topology runs.
type Binaries struct {
	Etcd              string
	APIServer         string
	ControllerManager string
	KubeProxy         string
	// CNIDir holds the CNI plugins (ptp, host-local, loopback).
	CNIDir string
}

// CacheEnv names the environment variables CacheDir reads: a process that runs a
// program which looks for the cache (a driver) with an environment of its own passes
// these on, or the program finds another user's cache or none.
var CacheEnv = []string{"DPC_CACHE_DIR", "XDG_CACHE_HOME", "HOME"}

// CacheDir is the per-user directory the make targets build into: DPC_CACHE_DIR, or
// $XDG_CACHE_HOME/dpconform, or ~/.cache/dpconform (the variables of CacheEnv).
func CacheDir() string {
	if d := os.Getenv("DPC_CACHE_DIR"); d != "" {
		return d
	}
	if d := os.Getenv("XDG_CACHE_HOME"); d != "" {
		return filepath.Join(d, "dpconform")
	}
	home, err := os.UserHomeDir()
	if err != nil {
		home = "/root"
	}
	return filepath.Join(home, ".cache", "dpconform")
}

// FindBinaries locates the binaries: each DPC_ETCD, DPC_KUBE_APISERVER,
// DPC_KUBE_CONTROLLER_MANAGER, DPC_KUBE_PROXY and DPC_CNI_DIR overrides the cache of
// the make targets. It fails with one message naming every missing binary and the fix.
func FindBinaries() (Binaries, error) {
	cp := filepath.Join(CacheDir(), "control-plane", "k8s-"+KubernetesVersion+"-etcd-"+EtcdVersion)
	cni := filepath.Join(CacheDir(), "cni", "plugins-"+CNIPluginsVersion)
	pick := func(env, def string) string {
		if v := os.Getenv(env); v != "" {
			return v
		}
		return def
	}
	b := Binaries{
		Etcd:              pick("DPC_ETCD", filepath.Join(cp, "etcd")),
		APIServer:         pick("DPC_KUBE_APISERVER", filepath.Join(cp, "kube-apiserver")),
		ControllerManager: pick("DPC_KUBE_CONTROLLER_MANAGER", filepath.Join(cp, "kube-controller-manager")),
		KubeProxy:         pick("DPC_KUBE_PROXY", filepath.Join(cp, "kube-proxy")),
		CNIDir:            pick("DPC_CNI_DIR", cni),
	}
	var errs []error
	for _, c := range []struct{ env, path string }{
		{"DPC_ETCD", b.Etcd},
		{"DPC_KUBE_APISERVER", b.APIServer},
		{"DPC_KUBE_CONTROLLER_MANAGER", b.ControllerManager},
		{"DPC_CNI_DIR", filepath.Join(b.CNIDir, "ptp")},
		{"DPC_CNI_DIR", filepath.Join(b.CNIDir, "host-local")},
		{"DPC_CNI_DIR", filepath.Join(b.CNIDir, "loopback")},
	} {
		if err := executable(c.path); err != nil {
			errs = append(errs, fmt.Errorf("%w (run `make control-plane cni` to build it, or set %s)", err, c.env))
		}
	}
	return b, errors.Join(errs...)
}

// HasKubeProxy reports whether the kube-proxy binary is there, with the fix if not.
func (b Binaries) HasKubeProxy() error {
	if err := executable(b.KubeProxy); err != nil {
		return fmt.Errorf("%w (run `make control-plane` to build it, or set DPC_KUBE_PROXY)", err)
	}
	return nil
}

func executable(path string) error {
	st, err := os.Stat(path)
	if err != nil {
		return fmt.Errorf("missing binary %s", path)
	}
	if st.IsDir() || st.Mode()&0o111 == 0 {
		return fmt.Errorf("%s is not an executable file", path)
	}
	return nil
}
