// Command kube-proxy-driver makes the real kube-proxy an implementation under test: a
// Services-only dataplane (ClusterIP, NodePort) in iptables or nftables mode, driven
// through the driver contract (docs/driver.md) like any vendor's dataplane, one verb per
// call, JSON on stdout, its verbs written on driver/skel. It runs kube-proxy through
// the kube-proxy fixture (drivers/kubeproxy) and supports netns topologies only: on kind,
// kube-proxy is the cluster's own DaemonSet.
//
// Environment: DPC_NODE, DPC_NETNS, DPC_KUBECONFIG, DPC_STATE_DIR, DPC_TOPOLOGY as the
// contract says; DPC_KUBE_PROXY (the kube-proxy binary; default the one `make
// control-plane` builds); DPC_KUBE_PROXY_MODE (iptables or nftables, the mode of a start
// without --mode; default iptables). See docs/kube-proxy.md.
package main

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"regexp"
	"time"

	"github.com/dpconform/dpconform/driver"
	"github.com/dpconform/dpconform/driver/skel"
	"github.com/dpconform/dpconform/drivers/internal/cache"
	"github.com/dpconform/dpconform/drivers/kubeproxy"
)

// EnvMode is the environment variable that picks the mode of a start without --mode.
const EnvMode = "DPC_KUBE_PROXY_MODE"

// features are what kube-proxy implements of the Core profile.
var features = []string{"ClusterIP", "NodePort", "NodePortRemoteBackend", "TCP", "UDP"}

func main() {
	funcs := skel.AgentFuncs(agentFor, skel.ProcessBudgets)
	funcs.Info = info
	// No Events: kube-proxy reports no policy verdicts (it implements Services only
	// and does not claim the Observability profile).
	funcs.RequireNetNS = true
	funcs.CheckNode = checkTopology
	skel.Main("kube-proxy-driver", funcs)
}

func info(context.Context) (driver.Info, error) {
	modes := make([]string, len(kubeproxy.Modes))
	for i, m := range kubeproxy.Modes {
		modes[i] = string(m)
	}
	profiles := []string{"Core"}
	// In nftables mode kube-proxy is what a node switches to from kube-proxy's
	// iptables mode, a migration users make: it is judged on the ModeSwitch profile.
	if os.Getenv(EnvMode) == string(kubeproxy.NFTables) {
		profiles = append(profiles, "ModeSwitch")
	}
	return driver.Info{
		Name:     "kube-proxy",
		Version:  kubeProxyVersion(),
		Profiles: profiles,
		Features: features,
		Modes:    modes,
	}, nil
}

var versionPattern = regexp.MustCompile(`\bv\d+\.\d+\.\d+\S*`)

// kubeProxyVersion is the version of the kube-proxy binary in use, or the one `make
// control-plane` builds when the binary cannot say (it may not be built yet: info is
// static and asked before anything runs).
func kubeProxyVersion() string {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, cache.KubeProxy(), "--version").Output()
	if v := versionPattern.Find(out); err == nil && v != nil {
		return string(v)
	}
	return cache.KubernetesVersion
}

// checkTopology refuses a kind topology: there, kube-proxy is the cluster's own.
var checkTopology = skel.NetNSOnly("kube-proxy", "use the cluster's own kube-proxy DaemonSet")

// fixture builds the kube-proxy fixture for the node of this call; skel has checked
// the contract's environment.
func fixture(n skel.Node, mode kubeproxy.Mode) (*kubeproxy.Fixture, error) {
	if _, err := os.Stat(n.Kubeconfig); err != nil {
		return nil, skel.Fail("bad environment", "DPC_KUBECONFIG=%s: %w", n.Kubeconfig, err)
	}
	bin := cache.KubeProxy()
	if st, err := os.Stat(bin); err != nil || st.IsDir() || st.Mode()&0o111 == 0 {
		return nil, skel.Fail("missing binary", "kube-proxy: no executable %s (run `make control-plane` to build it, or set DPC_KUBE_PROXY)", bin)
	}
	// kube-proxy inherits this environment, DPC_RUN included: the topology's cleanup
	// finds a kube-proxy that outlived its run by it.
	return &kubeproxy.Fixture{
		Binary: bin,
		NetNS:  n.NetNS,
		Dir:    n.StateDir,
		Config: kubeproxy.Config{NodeName: n.Name, Kubeconfig: n.Kubeconfig, Mode: mode},
	}, nil
}

// agentFor builds the kube-proxy fixture for the node of this call. A start starts
// kube-proxy in start.Mode (skel checked it is one info offers), else in the mode of
// $DPC_KUBE_PROXY_MODE, else iptables; the other verbs manage whichever mode runs.
func agentFor(n skel.Node, start *driver.StartOptions) (skel.Agent, error) {
	var mode kubeproxy.Mode
	if start != nil {
		name, from := start.Mode, "--mode"
		if name == "" {
			name, from = os.Getenv(EnvMode), EnvMode
		}
		var err error
		if mode, err = kubeproxy.ParseMode(name); err != nil {
			return nil, skel.Fail("bad arguments", "%s: %w", from, err)
		}
	}
	f, err := fixture(n, mode)
	if err != nil {
		return nil, err
	}
	return driverAgent{f}, nil
}

// driverAgent is the fixture as skel manages it: its status in the contract's terms,
// and a start refused for another mode's kube-proxy as "already running".
type driverAgent struct{ *kubeproxy.Fixture }

// Start implements skel.Agent.
func (a driverAgent) Start(ctx context.Context) (int, error) {
	pid, err := a.Fixture.Start(ctx)
	if errors.Is(err, kubeproxy.ErrRunning) {
		return 0, skel.Fail("already running", "%w", err)
	}
	return pid, err
}

// Status implements skel.Agent.
func (a driverAgent) Status(ctx context.Context) driver.Status {
	st := a.Fixture.Status(ctx)
	return driver.Status{Running: st.Running(), Ready: st.Ready()}
}
