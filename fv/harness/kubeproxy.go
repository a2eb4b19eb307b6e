package harness

import (
	"strings"

	"github.com/dpconform/dpconform/drivers/kubeproxy"
	"github.com/dpconform/dpconform/topologies"
	"github.com/dpconform/dpconform/topologies/controlplane"
)

// KubeProxyFor returns the kube-proxy fixture for node n of a netns topology, in mode,
// with the kube-proxy binary of controlplane.FindBinaries: the node a ModeSwitch spec
// switches from.
func KubeProxyFor(n topologies.Node, mode kubeproxy.Mode) (*kubeproxy.Fixture, error) {
	env := map[string]string{}
	var extra []string
	for _, kv := range n.DriverEnv() {
		k, v, _ := strings.Cut(kv, "=")
		env[k] = v
		if k == "DPC_RUN" {
			extra = append(extra, kv)
		}
	}
	bins, _ := controlplane.FindBinaries() // only kube-proxy matters here
	if err := bins.HasKubeProxy(); err != nil {
		return nil, err
	}
	f := &kubeproxy.Fixture{
		Binary:  bins.KubeProxy,
		NetNS:   env["DPC_NETNS"],
		Dir:     env["DPC_STATE_DIR"],
		Config:  kubeproxy.Config{NodeName: n.Name(), Kubeconfig: env["DPC_KUBECONFIG"], Mode: mode},
		Env:     extra,
		StartIn: n.Start,
	}
	return f, f.Check()
}
