// Command kube-proxy-driver makes the real kube-proxy an implementation under test: a
// Services-only dataplane (ClusterIP, NodePort) in iptables or nftables mode, driven
// through the driver contract (docs/driver.md) like any vendor's dataplane, one verb per
// call, JSON on stdout. It runs kube-proxy through the kube-proxy fixture (fv/kubeproxy)
// and supports netns topologies only: on kind, kube-proxy is the cluster's own
// DaemonSet.
//
// Environment: DPC_NODE, DPC_NETNS, DPC_KUBECONFIG, DPC_STATE_DIR, DPC_TOPOLOGY as the
// contract says; DPC_KUBE_PROXY (the kube-proxy binary; default the one `make
// control-plane` builds); DPC_KUBE_PROXY_MODE (iptables or nftables, the mode of a start
// without --mode; default iptables). See docs/kube-proxy.md.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"time"

	"github.com/dpconform/dpconform/fv/kubeproxy"
	"github.com/dpconform/dpconform/internal/driverreply"
	"github.com/dpconform/dpconform/topologies/controlplane"
	"github.com/dpconform/dpconform/topologies/netns"
)

// EnvMode is the environment variable that picks the mode of a start without --mode.
const EnvMode = "DPC_KUBE_PROXY_MODE"

// features are what kube-proxy implements of the Core profile.
var features = []string{"ClusterIP", "NodePort", "NodePortRemoteBackend", "TCP", "UDP"}

// Budgets of the verbs, inside the contract's timeouts (fv/driver.DefaultTimeouts).
const (
	stopWait    = 30 * time.Second
	killWait    = 5 * time.Second
	statusWait  = 3 * time.Second
	collectWait = 45 * time.Second
	cleanupWait = 45 * time.Second
)

const verbs = "info start status stop kill events collect cleanup"

func main() {
	if len(os.Args) < 2 {
		driverreply.Exit("kube-proxy-driver", nil, driverreply.Fail("usage", "kube-proxy-driver VERB [args]; verbs: %s", verbs))
	}
	out, err := run(os.Args[1], os.Args[2:])
	driverreply.Exit("kube-proxy-driver", out, err)
}

func run(verb string, args []string) (any, error) {
	ctx := context.Background()
	switch verb {
	case "info":
		return info(), nil
	case "start":
		return start(ctx, args)
	case "status":
		return withFixture(args, func(f *kubeproxy.Fixture) (any, error) {
			ctx, cancel := context.WithTimeout(ctx, statusWait)
			defer cancel()
			st := f.Status(ctx)
			return map[string]bool{"running": st.Running(), "ready": st.Ready()}, nil
		})
	case "stop":
		return withFixture(args, func(f *kubeproxy.Fixture) (any, error) {
			ctx, cancel := context.WithTimeout(ctx, stopWait)
			defer cancel()
			if err := f.Stop(ctx); err != nil {
				return nil, driverreply.Fail("agent did not exit", "%v", err)
			}
			return struct{}{}, nil
		})
	case "kill":
		return withFixture(args, func(f *kubeproxy.Fixture) (any, error) {
			ctx, cancel := context.WithTimeout(ctx, killWait)
			defer cancel()
			if err := f.Kill(ctx); err != nil {
				return nil, driverreply.Fail("agent did not exit", "%v", err)
			}
			return struct{}{}, nil
		})
	case "events":
		return nil, driverreply.Fail("unsupported", "kube-proxy reports no policy verdicts (it implements Services only and does not claim the Observability profile)")
	case "collect":
		return collect(ctx, args)
	case "cleanup":
		return withFixture(args, func(f *kubeproxy.Fixture) (any, error) {
			ctx, cancel := context.WithTimeout(ctx, cleanupWait)
			defer cancel()
			if err := f.Cleanup(ctx); err != nil {
				return nil, driverreply.Fail("cleanup failed", "%v", err)
			}
			return struct{}{}, nil
		})
	}
	return nil, driverreply.Fail("unknown verb", "%q; verbs: %s", verb, verbs)
}

func info() any {
	return map[string]any{
		"name":     "kube-proxy",
		"version":  kubeProxyVersion(),
		"profiles": []string{"Core"},
		"features": features,
		"cni":      json.RawMessage(netns.DefaultCNIConfig),
	}
}

var versionPattern = regexp.MustCompile(`\bv\d+\.\d+\.\d+\S*`)

// kubeProxyVersion is the version of the kube-proxy binary in use, or the one `make
// control-plane` builds when the binary cannot say (it may not be built yet: info is
// static and asked before anything runs).
func kubeProxyVersion() string {
	bins, _ := controlplane.FindBinaries()
	if bins.HasKubeProxy() != nil {
		return controlplane.KubernetesVersion
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, bins.KubeProxy, "--version").Output()
	if v := versionPattern.Find(out); err == nil && v != nil {
		return string(v)
	}
	return controlplane.KubernetesVersion
}

// nodeEnv builds the fixture for the node of this call from the contract's environment.
func nodeEnv(mode kubeproxy.Mode) (*kubeproxy.Fixture, error) {
	get := os.Getenv
	var missing []string
	for _, k := range []string{"DPC_NODE", "DPC_NETNS", "DPC_KUBECONFIG", "DPC_STATE_DIR"} {
		if get(k) == "" {
			missing = append(missing, k)
		}
	}
	if topo := get("DPC_TOPOLOGY"); topo != "" && topo != "netns" {
		return nil, driverreply.Fail("unsupported topology", "DPC_TOPOLOGY=%s: this driver runs kube-proxy inside a node's network namespace (DPC_TOPOLOGY=netns); on kind, use the cluster's own kube-proxy DaemonSet", topo)
	}
	if len(missing) > 0 {
		return nil, driverreply.Fail("bad environment", "%s not set; the suite sets them per node (see docs/driver.md); this driver needs a netns topology (DPC_NETNS)", strings.Join(missing, ", "))
	}
	if st, err := os.Stat(get("DPC_STATE_DIR")); err != nil || !st.IsDir() {
		return nil, driverreply.Fail("bad environment", "DPC_STATE_DIR=%s is not a directory", get("DPC_STATE_DIR"))
	}
	if _, err := os.Stat(get("DPC_NETNS")); err != nil {
		return nil, driverreply.Fail("bad environment", "DPC_NETNS=%s: %v (is the topology still up?)", get("DPC_NETNS"), err)
	}
	if _, err := os.Stat(get("DPC_KUBECONFIG")); err != nil {
		return nil, driverreply.Fail("bad environment", "DPC_KUBECONFIG=%s: %v", get("DPC_KUBECONFIG"), err)
	}
	bins, _ := controlplane.FindBinaries() // only kube-proxy matters here
	if err := bins.HasKubeProxy(); err != nil {
		return nil, driverreply.Fail("missing binary", "kube-proxy: %v", err)
	}
	// kube-proxy inherits this environment, DPC_RUN included: the topology's cleanup
	// finds a kube-proxy that outlived its run by it.
	return &kubeproxy.Fixture{
		Binary: bins.KubeProxy,
		NetNS:  get("DPC_NETNS"),
		Dir:    get("DPC_STATE_DIR"),
		Config: kubeproxy.Config{NodeName: get("DPC_NODE"), Kubeconfig: get("DPC_KUBECONFIG"), Mode: mode},
	}, nil
}

// withFixture runs a verb that takes no arguments on the node's fixture.
func withFixture(args []string, fn func(*kubeproxy.Fixture) (any, error)) (any, error) {
	if len(args) > 0 {
		return nil, driverreply.Fail("bad arguments", "unexpected arguments %q", args)
	}
	f, err := nodeEnv("")
	if err != nil {
		return nil, err
	}
	return fn(f)
}

func start(ctx context.Context, args []string) (any, error) {
	fs := flag.NewFlagSet("start", flag.ContinueOnError)
	fs.SetOutput(os.Stderr)
	modeFlag := fs.String("mode", "", "proxy mode: iptables or nftables (default $"+EnvMode+", else iptables)")
	if err := fs.Parse(args); err != nil {
		return nil, driverreply.Fail("bad arguments", "%v; usage: start [--mode iptables|nftables]", err)
	}
	if fs.NArg() > 0 {
		return nil, driverreply.Fail("bad arguments", "unexpected arguments %q; usage: start [--mode iptables|nftables]", fs.Args())
	}
	name, from := *modeFlag, "--mode"
	if name == "" {
		name, from = os.Getenv(EnvMode), EnvMode
	}
	mode, err := kubeproxy.ParseMode(name)
	if err != nil {
		return nil, driverreply.Fail("bad arguments", "%s: %v", from, err)
	}
	f, err := nodeEnv(mode)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	pid, err := f.Start(ctx)
	if errors.Is(err, kubeproxy.ErrRunning) {
		return nil, driverreply.Fail("already running", "%v", err)
	}
	if err != nil {
		return nil, driverreply.Fail("start failed", "%v", err)
	}
	return map[string]int{"pid": pid}, nil
}

func collect(ctx context.Context, args []string) (any, error) {
	fs := flag.NewFlagSet("collect", flag.ContinueOnError)
	fs.SetOutput(os.Stderr)
	dir := fs.String("dir", "", "directory to write diagnostics into")
	if err := fs.Parse(args); err != nil || *dir == "" || fs.NArg() > 0 {
		return nil, driverreply.Fail("bad arguments", "usage: collect --dir DIR")
	}
	f, err := nodeEnv("")
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, collectWait)
	defer cancel()
	files, err := f.Diagnostics(ctx, *dir)
	if err != nil && len(files) == 0 {
		return nil, driverreply.Fail("collect failed", "%v", err)
	}
	if files == nil {
		files = []string{}
	}
	return map[string][]string{"files": files}, nil
}
