// Command cilium-driver makes the real Cilium agent an implementation under test: an
// eBPF dataplane with its kube-proxy replacement (ClusterIP, NodePort, socket
// load-balancing) and its own CNI plugin, driven through the driver contract
// (docs/driver.md) like any vendor's dataplane, one verb per call, JSON on stdout, its
// verbs written on driver/skel. The agent runs inside a netns topology's node (its
// network, mount and cgroup namespaces), one per node, against the run's API server,
// with no operator and no kvstore; see docs/cilium.md for how it is configured and why.
//
// Environment: DPC_NODE, DPC_NETNS, DPC_KUBECONFIG, DPC_STATE_DIR, DPC_TOPOLOGY as the
// contract says; DPC_CILIUM_DIR (the directory `make cilium` fills: cilium-agent,
// cni/cilium-cni, bpf/, crds/; default its cache directory); DPC_CILIUM_CLANG (the
// clang the agent compiles its datapath with; default Debian's clang-19);
// DPC_CILIUM_OBJECT_CACHE (the directory of the agent's compile cache, or "off";
// default cilium-objects/ in the node's state directory: clangcache.go);
// DPC_CILIUM_AGENT_ARGS (flags appended to the agent's command line, for experiments:
// the version info reports then names them, so that no report passes them off as
// Cilium's defaults).
package main

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/dpconform/dpconform/driver"
	"github.com/dpconform/dpconform/driver/skel"
	"github.com/dpconform/dpconform/drivers/internal/cache"
)

// Version is the Cilium release `make cilium` builds; it must match
// topologies/binaries/cilium/go.mod (a test checks that it does).
const Version = "v1.20.2"

// Environment variables that override where the driver finds Cilium.
const (
	EnvDir       = "DPC_CILIUM_DIR"
	EnvClang     = "DPC_CILIUM_CLANG"
	EnvAgentArgs = "DPC_CILIUM_AGENT_ARGS"
)

// defaultClang is the clang Cilium's datapath is compiled with: v1.20 needs LLVM 18.1
// or later (Debian 12's default clang is 14), and Cilium's own image ships 19.1.7, the
// version of Debian 12's clang-19 package (`make cilium` installs it).
const defaultClang = "/usr/lib/llvm-19/bin/clang"

// features are what Cilium's kube-proxy replacement implements of the Core profile.
var features = []string{"ClusterIP", "NodePort", "NodePortRemoteBackend", "TCP", "UDP"}

// cniConfig is the network configuration Cilium writes for itself
// (daemon/cmd/cni/config.go in v1.20.2), with the plugin's log in the node's state
// directory. The plugin finds the agent on its default socket,
// /var/run/cilium/cilium.sock, which is the node's own: a node has its own /run.
const cniConfig = `{
  "cniVersion": "1.0.0",
  "name": "cilium",
  "plugins": [
    {
      "type": "cilium-cni",
      "enable-debug": false,
      "log-file": "${STATE_DIR}/cilium-cni.log"
    }
  ]
}`

func main() {
	// Run as the agent's clang (clangcache.go), through the wrapper Start links.
	if filepath.Base(os.Args[0]) == clangName {
		os.Exit(runClang(os.Args[1:]))
	}
	funcs := skel.AgentFuncs(agentFor, budgets)
	funcs.Info = info
	// No Events: Cilium's verdicts come from Hubble, which this driver does not run;
	// it does not claim the Observability profile.
	funcs.RequireNetNS = true
	funcs.CheckNode = checkTopology
	skel.Main("cilium-driver", funcs)
}

// budgets are skel.ProcessBudgets but for stop: Cilium's graceful stop waits for its
// controllers and may take longer than kube-proxy's.
var budgets = func() driver.Timeouts {
	b := skel.ProcessBudgets
	b.Stop = 50 * time.Second
	return b
}()

func info(context.Context) (driver.Info, error) {
	version := Version
	if extra := extraArgs(); len(extra) > 0 {
		version += " with " + strings.Join(extra, " ")
	}
	return driver.Info{
		Name:     "cilium",
		Version:  version,
		Profiles: []string{"Core"},
		Features: features,
		CNI:      json.RawMessage(cniConfig),
		CNIDir:   filepath.Join(Dir(), "cni"),
	}, nil
}

// checkTopology refuses a kind topology: there, Cilium is installed with its Helm
// chart as a DaemonSet.
var checkTopology = skel.NetNSOnly("cilium-agent", "install Cilium with its Helm chart")

// Dir is where the driver finds Cilium: DPC_CILIUM_DIR, else the cache of `make
// cilium`.
func Dir() string {
	if d := os.Getenv(EnvDir); d != "" {
		return d
	}
	return filepath.Join(cache.Dir(), "cilium", Version)
}

// extraArgs are the flags DPC_CILIUM_AGENT_ARGS appends to the agent's command line.
func extraArgs() []string { return strings.Fields(os.Getenv(EnvAgentArgs)) }

// Clang is the clang the agent compiles its datapath with.
func Clang() string {
	if c := os.Getenv(EnvClang); c != "" {
		return c
	}
	return defaultClang
}

// agentFor builds the agent for the node of this call; skel has checked the
// contract's environment. Cilium takes no start options.
func agentFor(n skel.Node, _ *driver.StartOptions) (skel.Agent, error) {
	if _, err := os.Stat(n.Kubeconfig); err != nil {
		return nil, skel.Fail("bad environment", "DPC_KUBECONFIG=%s: %w", n.Kubeconfig, err)
	}
	a := newAgent(Dir(), Clang(), n)
	if err := a.checkInstall(); err != nil {
		return nil, skel.Fail("missing binary", "%w (run `make cilium` to build and install it, or set %s and %s)", err, EnvDir, EnvClang)
	}
	// The agent inherits this environment, DPC_RUN included: the topology's cleanup
	// finds an agent that outlived its run by it.
	return driverAgent{a}, nil
}

// driverAgent is the agent as skel manages it: its status in the contract's terms.
type driverAgent struct{ *agent }

// Status implements skel.Agent.
func (a driverAgent) Status(ctx context.Context) driver.Status {
	st := a.agent.Status(ctx)
	return driver.Status{Running: st.PID != 0, Ready: st.Ready()}
}

func executable(path string) error {
	st, err := os.Stat(path)
	if err != nil {
		return err
	}
	if st.IsDir() || st.Mode()&0o111 == 0 {
		return errors.New(path + " is not an executable file")
	}
	return nil
}
