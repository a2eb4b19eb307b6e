package harness

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

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

// KubeProxyReadyTimeout is how long StartKubeProxy waits for kube-proxy to have
// written its rules for both IP families. Quiet, that takes 0.9-1.8 s
// (docs/kube-proxy.md); a loaded machine has made it exceed 2 s.
const KubeProxyReadyTimeout = 60 * time.Second

// Names of the transition events of kube-proxy on a node that is switched over.
const (
	KubeProxyReady    = "kube-proxy-ready"
	KubeProxyStopSent = "kube-proxy-stop-sent"
	KubeProxyExited   = "kube-proxy-exited"
)

// KubeProxyDir is where, under a node's state directory, the kube-proxy that runs
// before a switch keeps its files: apart from the implementation's, which may be a
// kube-proxy too.
const KubeProxyDir = "kube-proxy-before-switch"

// StartKubeProxy runs the real kube-proxy (iptables mode) on n in place of the
// implementation, with the node's FORWARD policy DROP and accepts only for its own
// pods' traffic (LocalPodsChain), so that kube-proxy's KUBE-FORWARD accept is what
// carries flows that enter and leave by the host interface; and waits until it has
// synced, recording kube-proxy-ready.
func (w *World) StartKubeProxy(ctx context.Context, n topologies.Node) error {
	if w.Topo.Provider() != "netns" {
		// The fixture runs the kube-proxy binary inside a netns node; on kind,
		// kube-proxy is a DaemonSet of the cluster, which no spec set-up deploys yet.
		return fmt.Errorf("%w: kube-proxy before a switch runs only on the netns topology (on %s it would be the cluster's DaemonSet)", topologies.ErrUnsupported, w.Topo.Provider())
	}
	f, err := KubeProxyFor(n, kubeproxy.IPTables)
	if err != nil {
		return fmt.Errorf("kube-proxy on %s: %w", n.Name(), err)
	}
	f.Dir = filepath.Join(f.Dir, KubeProxyDir)
	if err := os.MkdirAll(f.Dir, 0o755); err != nil {
		return fmt.Errorf("kube-proxy on %s: %w", n.Name(), err)
	}
	if err := localPodsOnly(ctx, n); err != nil {
		return err
	}
	if err := defaultRoute(ctx, n); err != nil {
		return err
	}
	w.mu.Lock()
	if w.kubeProxy == nil {
		w.kubeProxy = map[string]*kubeproxy.Fixture{}
	}
	w.kubeProxy[n.Name()] = f
	w.mu.Unlock()
	if _, err := f.Start(ctx); err != nil {
		return fmt.Errorf("kube-proxy on %s: %w", n.Name(), err)
	}
	rctx, cancel := context.WithTimeout(ctx, KubeProxyReadyTimeout)
	defer cancel()
	if err := f.WaitReady(rctx); err != nil {
		return fmt.Errorf("kube-proxy on %s: %w", n.Name(), err)
	}
	w.Timeline().Record(KubeProxyReady, n.Name())
	return nil
}

// LocalPodsChain is the chain of the filter table that, before a switch, accepts
// forwarded traffic from and to the node's own pods, as the CNI or dataplane of a
// node with kube-proxy does (Calico's FORWARD accepts only its workloads' interfaces).
// Traffic that enters and leaves by the host interface, a NodePort flow to a backend
// on another node, is then carried only by kube-proxy's KUBE-FORWARD accept: the
// traffic of Calico PR 13778.
const LocalPodsChain = "DPC-LOCAL-PODS"

// localPodsOnly sets n's FORWARD policy DROP and accepts forwarded traffic of the
// node's pods (its pod CIDR) in LocalPodsChain.
func localPodsOnly(ctx context.Context, n topologies.Node) error {
	cidr := n.PodCIDR().String()
	for _, args := range [][]string{
		{"-P", "FORWARD", "DROP"},
		{"-N", LocalPodsChain},
		{"-A", LocalPodsChain, "-s", cidr, "-m", "comment", "--comment", "dpconform: the node's pods", "-j", "ACCEPT"},
		{"-A", LocalPodsChain, "-d", cidr, "-m", "comment", "--comment", "dpconform: the node's pods", "-j", "ACCEPT"},
		{"-A", "FORWARD", "-j", LocalPodsChain},
	} {
		if out, err := topologies.Output(ctx, n, "iptables", append([]string{"-w", "5"}, args...)...); err != nil {
			return fmt.Errorf("FORWARD on %s (iptables %s): %w: %s", n.Name(), strings.Join(args, " "), err, out)
		}
	}
	return nil
}

// defaultRoute gives n a default route out of eth0, as a node of a real cluster has
// one, if it has none. A CNI that gives its pods a link-local gateway answered by
// proxy ARP (Calico's 169.254.1.1) needs it: the kernel answers ARP by proxy only for
// an address it has a route to through another interface. Before a switch no
// dataplane answers for that gateway (Felix in eBPF mode does, once it runs), so
// without the route the node's pods reach nothing. The route has no gateway: what it
// carries is ARPed for on the node's network, which holds only the suite's hosts, and
// goes no further.
func defaultRoute(ctx context.Context, n topologies.Node) error {
	out, err := topologies.Output(ctx, n, "ip", "-4", "route", "show", "default")
	if err != nil {
		return fmt.Errorf("routes of %s: %w: %s", n.Name(), err, out)
	}
	if strings.TrimSpace(string(out)) != "" {
		return nil
	}
	if out, err := topologies.Output(ctx, n, "ip", "-4", "route", "add", "default", "dev", "eth0"); err != nil {
		return fmt.Errorf("default route on %s: %w: %s", n.Name(), err, out)
	}
	return nil
}
