// Package cache finds the third-party binaries the shipped peer drivers run where
// dpconform's make targets build them (topologies/binaries): the drivers are written
// as a vendor's would be, against the kit alone, so they read the convention here
// rather than from the suite's packages; a test holds the two equal.
package cache

import (
	"os"
	"path/filepath"
)

// Versions of the control plane that `make control-plane` builds, kube-proxy among
// it (topologies/binaries/go.mod).
const (
	KubernetesVersion = "v1.37.2"
	EtcdVersion       = "v3.7.3"
)

// Dir is the per-user directory the make targets build into: DPC_CACHE_DIR, or
// $XDG_CACHE_HOME/dpconform, or ~/.cache/dpconform.
func Dir() string {
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

// KubeProxy is the kube-proxy binary: DPC_KUBE_PROXY, else the one `make
// control-plane` builds.
func KubeProxy() string {
	if p := os.Getenv("DPC_KUBE_PROXY"); p != "" {
		return p
	}
	return filepath.Join(Dir(), "control-plane", "k8s-"+KubernetesVersion+"-etcd-"+EtcdVersion, "kube-proxy")
}
