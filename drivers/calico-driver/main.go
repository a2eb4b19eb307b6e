// Command calico-driver makes Calico an implementation under test: Felix in its eBPF
// dataplane mode (BPFEnabled), with the Kubernetes API as its datastore (KDD) and
// Calico's own CNI plugin, driven through the driver contract (docs/driver.md) like any
// vendor's dataplane, one verb per call, JSON on stdout, its verbs written on
// driver/skel. Felix runs inside a node of a netns topology, as calico-node runs it
// on a real node; the driver does for the cluster what calico-node's start-up and
// Calico's manifests do (CRDs, ClusterInformation, an IP pool, the node's address).
//
// Calico's releases are not on the Go module proxy, so the driver takes its binaries
// from a directory: DPC_CALICO_DIR, as `make calico CALICO_SRC=/path/to/calico` builds
// it from a Calico source tree (docs/calico.md).
//
// Environment: DPC_NODE, DPC_NETNS, DPC_KUBECONFIG, DPC_STATE_DIR, DPC_BPFFS,
// DPC_TOPOLOGY as the contract says; DPC_CALICO_DIR (required).
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/dpconform/dpconform/driver"
	"github.com/dpconform/dpconform/driver/skel"
)

// EnvDir names the directory of a Calico build (Build).
const EnvDir = "DPC_CALICO_DIR"

// features are what Calico's eBPF dataplane implements of the Core and Policy
// profiles: it replaces kube-proxy (ClusterIP, NodePort, TCP and UDP), forwards
// NodePort traffic to a backend on another node, and enforces Kubernetes
// NetworkPolicy (Felix turns each into a Calico policy in the default tier).
var features = []string{"ClusterIP", "NetworkPolicy", "NodePort", "NodePortRemoteBackend", "TCP", "UDP"}

// calicoBudgets are the deadlines of the driver's verbs. Start does the datastore's
// set-up before it starts Felix (the first start of a run creates Calico's CRDs and
// waits until the API server serves them), which ProcessBudgets' 20 s would cut short
// on a loaded machine; the contract gives start 30 s.
var calicoBudgets = func() driver.Timeouts {
	b := skel.ProcessBudgets
	b.Start = 28 * time.Second
	return b
}()

func main() { skel.Main("calico-driver", verbs()) }

// verbs are the driver's verbs.
func verbs() skel.Funcs {
	funcs := skel.AgentFuncs(agentFor, calicoBudgets)
	funcs.Info = info
	// No Events: the driver has no source of policy verdicts that is complete through
	// each call, as the contract asks; it does not claim the Observability profile.
	funcs.RequireNetNS = true
	funcs.CheckNode = checkTopology
	return funcs
}

// loadBuild is the build DPC_CALICO_DIR names, or a Failure that says how to make one.
func loadBuild() (*Build, error) {
	dir := os.Getenv(EnvDir)
	if dir == "" {
		return nil, skel.Fail("missing binaries", "%s is not set: build Calico with `make calico CALICO_SRC=/path/to/calico` (a checkout of github.com/projectcalico/calico) and set %s to the directory it prints", EnvDir, EnvDir)
	}
	b, err := LoadBuild(dir)
	if err != nil {
		return nil, skel.Fail("missing binaries", "%s=%s: %w (build it with `make calico CALICO_SRC=/path/to/calico`)", EnvDir, dir, err)
	}
	return b, nil
}

func info(context.Context) (driver.Info, error) {
	b, err := loadBuild()
	if err != nil {
		return driver.Info{}, err
	}
	return driver.Info{
		Name:    "calico",
		Version: b.Describe(),
		// ModeSwitch: Felix in eBPF mode takes a node over from kube-proxy in iptables
		// mode as Calico documents the manual switch (kube-proxy stopped, Felix started
		// with its kube-proxy clean-up at its default, on), which is what the suite's
		// Switch step does (docs/calico.md).
		Profiles: []string{"Core", "ModeSwitch", "Policy"},
		Features: features,
		CNI:      cniConfig(),
		CNIDir:   b.CNIDir(),
	}, nil
}

// checkTopology refuses a kind topology: Felix runs inside a netns topology's node.
var checkTopology = skel.NetNSOnly("Calico Felix", "install Calico with its own manifests or operator")

// agentFor builds Felix for the node of this call; skel has checked the contract's
// environment. The driver takes no start options.
func agentFor(n skel.Node, _ *driver.StartOptions) (skel.Agent, error) {
	if _, err := os.Stat(n.Kubeconfig); err != nil {
		return nil, skel.Fail("bad environment", "DPC_KUBECONFIG=%s: %w", n.Kubeconfig, err)
	}
	b, err := loadBuild()
	if err != nil {
		return nil, err
	}
	// Felix inherits this environment, DPC_RUN included: the topology's cleanup finds
	// a Felix that outlived its run by it.
	return &felix{Build: b, Node: n.Name, Kubeconfig: n.Kubeconfig, Dir: filepath.Join(n.StateDir, "calico"), NetNS: n.NetNS, BPFFS: n.BPFFS}, nil
}

// errNotExecutable is returned for a file that should be an executable and is not.
var errNotExecutable = errors.New("not an executable file")

func executable(path string) error {
	st, err := os.Stat(path)
	if err != nil {
		return err
	}
	if st.IsDir() || st.Mode()&0o111 == 0 {
		return fmt.Errorf("%s: %w", path, errNotExecutable)
	}
	return nil
}
