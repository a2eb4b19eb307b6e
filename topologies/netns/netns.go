// Package netns provides a topology of network namespaces on one host: nodes on a
// shared L2 fabric with host-gw routes between their pod CIDRs, an external client on
// the same fabric, pods wired by CNI, and a real control plane reachable from every
// node. It needs root.
package netns

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"sync"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/dpconform/dpconform/topologies"
	"github.com/dpconform/dpconform/topologies/controlplane"
)

// DefaultNodes is how many nodes a topology has unless Options say otherwise.
const DefaultNodes = 2

// Options configure a netns topology. The zero value is a 2-node topology with the
// default CNI configuration and binaries from the make targets' cache.
type Options struct {
	// Nodes is the number of nodes (default DefaultNodes, at most 26).
	Nodes int
	// Binaries locates etcd, kube-apiserver, kube-controller-manager and the CNI
	// plugins; zero means controlplane.FindBinaries.
	Binaries *controlplane.Binaries
	// CNIConfig is a CNI network configuration list, the implementation's; empty means
	// DefaultCNIConfig. See ExpandCNIConfig for the variables it may use.
	CNIConfig []byte
	// Logf reports progress; nil discards it.
	Logf func(format string, args ...any)
	// RunRoot is where run directories live (default $TMPDIR/dpconform).
	RunRoot string
	// CNIDirs are directories of CNI plugins the implementation ships (the driver's
	// info.cni_dir), searched before the topology's own.
	CNIDirs []string
	// ClockSkew, when not zero, gives every node and the external client a
	// CLOCK_MONOTONIC of its own, as on a cluster of separate machines: node i's runs
	// (i+1)×ClockSkew ahead of the suite's, the external client's ClockSkew behind
	// (time namespaces; whole seconds). Pods read their node's clock.
	ClockSkew time.Duration
	// ControlPlanes, when set, lends the topology a control plane that outlives it
	// (reset to its state at start when the topology closes) instead of starting one
	// of its own. Nil: the topology starts and stops its own.
	ControlPlanes *ControlPlanes
}

// Topology is a running netns topology. It implements topologies.Topology.
type Topology struct {
	runID    string
	dir      string
	fabric   netip.Prefix
	logf     func(string, ...any)
	bins     controlplane.Binaries
	cniConf  []byte
	cniDirs  []string
	cp       *controlplane.ControlPlane
	pool     *ControlPlanes // where cp was borrowed from; nil if it is the run's own
	pooled   *pooledCP
	nodes    []*node
	external *host
	skew     time.Duration // Options.ClockSkew

	mu     sync.Mutex
	pods   map[string]*pod       // by namespace/name
	added  map[netip.Addr]string // addresses AddAddress added, to the node's name
	closed bool
}

var _ topologies.Topology = (*Topology)(nil)

// Fixed addressing inside a run. Only the fabric's /24 is visible in the root network
// namespace (it holds the API server's address), so it is the one part chosen per run;
// pod and service ranges exist only inside the run's namespaces.
const (
	fabricBase    = "10.213.0.0/16"
	podCIDRFormat = "10.244.%d.0/24"
	serviceCIDR   = "10.96.0.0/16"
)

// The last byte of each host's address on the fabric: the root namespace (the API
// server), node i at firstNodeHost+i (at most 26 nodes: .10 to .35), the external
// client, and node i's spare address (Node.SpareAddress) at firstSpareHost+i, which
// no host holds until a spec adds it to the node.
const (
	rootHost       = 1
	firstNodeHost  = 10
	externalHost   = 100
	firstSpareHost = 200
)

// New creates a topology. If ctx is cancelled or any step fails, everything made so far
// is removed before New returns.
func New(ctx context.Context, opts Options) (_ *Topology, err error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("a netns topology needs root: it creates network namespaces, veths, a bridge and bpffs mounts; run as root")
	}
	if opts.Nodes == 0 {
		opts.Nodes = DefaultNodes
	}
	if opts.Nodes < 1 || opts.Nodes > 26 {
		return nil, fmt.Errorf("Options.Nodes=%d: a netns topology has 1 to 26 nodes", opts.Nodes)
	}
	if err := checkClockSkew(opts.ClockSkew); err != nil {
		return nil, fmt.Errorf("Options.ClockSkew: %w", err)
	}
	t := &Topology{logf: opts.Logf, pods: map[string]*pod{}, added: map[netip.Addr]string{}, skew: opts.ClockSkew}
	if t.logf == nil {
		t.logf = func(string, ...any) {}
	}
	if opts.Binaries != nil {
		t.bins = *opts.Binaries
	} else if t.bins, err = controlplane.FindBinaries(); err != nil {
		return nil, err
	}
	t.cniConf = opts.CNIConfig
	for _, d := range opts.CNIDirs {
		if !filepath.IsAbs(d) {
			return nil, fmt.Errorf("CNI plugin directory %q: the driver's info.cni_dir must be an absolute path", d)
		}
		if st, err := os.Stat(d); err != nil || !st.IsDir() {
			return nil, fmt.Errorf("CNI plugin directory %s (the driver's info.cni_dir) is not a directory: %v", d, err)
		}
	}
	t.cniDirs = opts.CNIDirs
	if len(t.cniConf) == 0 {
		t.cniConf = []byte(DefaultCNIConfig)
	}
	root := opts.RunRoot
	if root == "" {
		root = DefaultRunRoot()
	}
	if t.runID, t.dir, err = newRun(root); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			t.logf("set-up failed, removing what was made: %v", err)
			if cerr := t.Close(); cerr != nil {
				err = errors.Join(err, fmt.Errorf("clean up after failed set-up: %w", cerr))
			}
		}
	}()
	t.logf("run %s: creating the fabric", t.runID)
	if err := t.createFabric(); err != nil {
		return nil, err
	}

	// The control plane takes seconds to become ready; build the nodes meanwhile.
	cpDone := make(chan error, 1)
	go func() {
		if opts.ControlPlanes != nil {
			c, err := opts.ControlPlanes.get(ctx, t.bins)
			if err == nil {
				t.logf("run %s: borrowed control plane %s (API server on %s)", t.runID, c.id, c.addr.Addr())
				t.mu.Lock()
				t.cp, t.pool, t.pooled = c.cp, opts.ControlPlanes, c
				t.mu.Unlock()
			}
			cpDone <- err
			return
		}
		t.logf("run %s: starting etcd and kube-apiserver on %s", t.runID, t.fabricRootAddr())
		cp, err := controlplane.Start(ctx, controlplane.Config{
			Binaries:    t.bins,
			Dir:         filepath.Join(t.dir, "control-plane"),
			BindIP:      t.fabricRootAddr(),
			ServiceCIDR: netip.MustParsePrefix(serviceCIDR),
			Env:         []string{EnvRun + "=" + t.runID},
		})
		t.mu.Lock()
		t.cp = cp
		t.mu.Unlock()
		cpDone <- err
	}()
	nodeErr := t.createNodes(ctx, opts.Nodes)
	if err := <-cpDone; err != nil {
		return nil, errors.Join(nodeErr, err)
	}
	if nodeErr != nil {
		return nil, nodeErr
	}
	if t.pooled != nil {
		if err := t.routeToAPIServer(t.pooled.addr.Addr()); err != nil {
			return nil, err
		}
	}
	t.logf("run %s: API server ready; registering nodes", t.runID)
	if err := t.registerNodes(ctx); err != nil {
		return nil, err
	}
	t.logf("run %s: ready (%d nodes)", t.runID, len(t.nodes))
	return t, nil
}

// Provider implements topologies.Topology.
func (t *Topology) Provider() string { return "netns" }

// RunID implements topologies.Topology.
func (t *Topology) RunID() string { return t.runID }

// Dir is the run's private directory (logs, state, kubeconfig).
func (t *Topology) Dir() string { return t.dir }

// Nodes implements topologies.Topology.
func (t *Topology) Nodes() []topologies.Node {
	out := make([]topologies.Node, len(t.nodes))
	for i, n := range t.nodes {
		out[i] = n
	}
	return out
}

// Node implements topologies.Topology.
func (t *Topology) Node(name string) topologies.Node {
	for _, n := range t.nodes {
		if n.name == name {
			return n
		}
	}
	return nil
}

// External implements topologies.Topology.
func (t *Topology) External() topologies.Host { return t.external }

// Kube implements topologies.Topology.
func (t *Topology) Kube() kubernetes.Interface { return t.cp.Kube() }

// RESTConfig implements topologies.Topology.
func (t *Topology) RESTConfig() *rest.Config { return t.cp.RESTConfig() }

// Kubeconfig is the path of a kubeconfig usable from the root namespace and every node.
func (t *Topology) Kubeconfig() string { return t.cp.Kubeconfig() }

// Binaries are the binaries the topology runs (kube-proxy among them, for fixtures).
func (t *Topology) Binaries() controlplane.Binaries { return t.bins }

// Pods implements topologies.Topology.
func (t *Topology) Pods() []topologies.Pod {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]topologies.Pod, 0, len(t.pods))
	for _, p := range t.pods {
		out = append(out, p)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name() < out[j].Name() })
	return out
}

// Close implements topologies.Topology: it kills every process in the run's namespaces
// or carrying its marker, deletes pods (CNI DEL), namespaces, links and bpffs mounts,
// stops the control plane and removes the run directory.
func (t *Topology) Close() error {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return nil
	}
	t.closed = true
	pods := make([]*pod, 0, len(t.pods))
	for _, p := range t.pods {
		pods = append(pods, p)
	}
	t.pods = map[string]*pod{}
	cp, pool, pooled := t.cp, t.pool, t.pooled
	t.mu.Unlock()

	var errs []error
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// Pods first, through CNI DEL, as a runtime would; what DEL misses the namespace
	// removal below takes care of.
	for _, p := range pods {
		if err := t.teardownPod(ctx, p, false, false); err != nil {
			errs = append(errs, err)
		}
	}
	if cp != nil && pooled == nil {
		if err := cp.Stop(); err != nil {
			errs = append(errs, err)
		}
	}
	if err := removeRun(t.runID, t.dir); err != nil {
		errs = append(errs, err)
	}
	// A borrowed control plane goes back once every process of the run is gone, so
	// that no agent writes to it while it is reset.
	if pooled != nil {
		if err := pool.put(context.WithoutCancel(ctx), pooled); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// host is a network namespace with one interface on the fabric or a pod network.
type host struct {
	name   string
	netns  string // name under /var/run/netns
	ip     netip.Addr
	cgroup string // cgroup v2 directory its processes start in; "" for the caller's
	timeNS string // the pinned time namespace its processes enter; "" for the suite's clock
}

func (h *host) Name() string   { return h.name }
func (h *host) IP() netip.Addr { return h.ip }
func (h *host) Start(cmd *exec.Cmd) error {
	if err := h.inTime(cmd); err != nil {
		return err
	}
	return startIn(netnsPath(h.netns), h.cgroup, cmd)
}
func (h *host) NetNSPath() string                { return netnsPath(h.netns) }
func (h *host) handle() (*netlink.Handle, error) { return handleFor(h.netns) }

func handleFor(name string) (*netlink.Handle, error) {
	nsh, err := openNS(name)
	if err != nil {
		return nil, err
	}
	defer unix.Close(int(nsh))
	h, err := netlink.NewHandleAt(nsh)
	if err != nil {
		return nil, fmt.Errorf("netlink handle in %s: %w", name, err)
	}
	return h, nil
}
