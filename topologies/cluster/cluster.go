// Package cluster is the topology of an existing Kubernetes cluster, known by its
// kubeconfig alone: the nodes are those the API lists (a label selector picks the
// ones under test), pods are real pods of the project's image that the nodes'
// kubelets run, commands run in them through the API's exec, and what a node's
// network needs (an address, a neighbour entry, a lost sandbox) is done by a helper
// pod on the node's network. Everything a run creates is in a namespace of its own or
// labelled with the run's ID, and goes at the run's end or with `dpconform cleanup
// --kubeconfig`.
package cluster

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

	"github.com/dpconform/dpconform/topologies"
	"github.com/dpconform/dpconform/topologies/kubeobj"
)

const (
	// RunPrefix starts every cluster run's ID: "dpx" and five hex digits.
	RunPrefix = "dpx"
	// RunLabel marks every object a run creates, with the run's ID as its value: the
	// run's namespace, the namespaces specs make, every object the suite creates, and
	// the cluster-scoped objects a driver makes for the run (docs/driver.md).
	RunLabel = "dpconform.io/run"
	// roleLabel marks the run's own pods (node helpers, the external client), which
	// stay from spec to spec.
	roleLabel = "dpconform.io/role"
	// OwnerAnnotation on a run's namespace names the process that runs it
	// (host/pid/start), so that cleanup spares a live run.
	OwnerAnnotation = "dpconform.io/owner"
	// NamespacePrefix starts the name of a run's namespace (then the run ID).
	NamespacePrefix = "dpconform-"
)

var runIDPattern = regexp.MustCompile(`^` + RunPrefix + `[0-9a-f]{5}$`)

// Options configure a cluster topology.
type Options struct {
	// Kubeconfig is the path of the cluster's kubeconfig (required). The suite, the
	// exec helper and the driver use it.
	Kubeconfig string
	// NodeSelector is a label selector for the nodes under test (default: every
	// node); of those that are Ready and schedulable, the first Nodes by name are used.
	NodeSelector string
	// Nodes is how many nodes the specs use (default 2).
	Nodes int
	// ExternalAddress makes this machine the external client, at this address as the
	// nodes see it: it measures the path from outside the cluster, routed. Empty: a
	// host-network pod on ExternalNode is the client, on the nodes' own network.
	ExternalAddress string
	// ExternalNode is the node, not under test, of the external client's pod; empty
	// picks the first Ready node the selector leaves out.
	ExternalNode string
	// SpareAddresses gives, by node name, a free address on the network of the node's
	// interface that no host holds (NODE-ADDRESS-CHANGE adds it to the node). A node
	// without one cannot serve that spec, which is skipped with the reason.
	SpareAddresses map[string]netip.Addr
	// ProbeImage is the image of the pods (default: the image of the kind topology
	// for ProbeBinary, dpconform.local/probe:<digest>, which a kind run loads into its
	// nodes); a vendor mirrors it and names the mirror. ProbePath is the dpconform
	// binary in it (default: ProbeBinary, where the kind topology's image has it).
	ProbeImage, ProbePath string
	// ProbeBinary is the dpconform binary on this machine: it runs the exec helper
	// and the external client in ExternalAddress mode (default: this executable).
	ProbeBinary string
	// RunRoot is where run directories (the drivers' state directories) live
	// (default $TMPDIR/dpconform-cluster).
	RunRoot string
	// MeasureClocks has the suite measure and convert every host's clock even where
	// the nodes share this machine's (kind): what a cluster of separate machines
	// needs, proven on one. Nodes that do not share it are measured anyway.
	MeasureClocks bool
	// Logf reports progress; nil discards it.
	Logf func(format string, args ...any)
}

// Cluster is an existing cluster as one run uses it. Topologies (Session) are views
// of it for one spec each.
type Cluster struct {
	runID      string
	namespace  string
	dir        string
	logf       func(string, ...any)
	kubeconfig string
	self       string
	image      string
	probePath  string
	restConfig *rest.Config
	kube       kubernetes.Interface
	nodes      []*node
	external   topologies.Host
	extPod     *helper // the external client's pod, if it is one
	ownClocks  bool    // a node reads another clock than this machine's, or MeasureClocks

	mu      sync.Mutex
	session *Topology
	closed  bool
}

// helper is one of the run's own privileged pods on a node's network.
type helper struct {
	c     *Cluster
	name  string // the pod's
	node  string
	ip    netip.Addr
	iface string
	bits  int
}

// Name implements topologies.Host.
func (h *helper) Name() string { return h.name }

func (h *helper) exec(ctx context.Context, args ...string) (string, error) {
	out, err := topologies.Output(ctx, hostOf(h, h.name), h.c.probePath, args...)
	return strings.TrimSpace(string(out)), err
}

// hostOf is h as a Host named name, for Output.
func hostOf(h *helper, name string) topologies.Host { return &helperHost{helper: h, name: name} }

type helperHost struct {
	*helper
	name string
}

func (h *helperHost) Name() string   { return h.name }
func (h *helperHost) IP() netip.Addr { return h.ip }
func (h *helperHost) Start(cmd *exec.Cmd) error {
	return h.c.start(h.c.namespace, h.helper.name, cmd)
}

// Open discovers the cluster's nodes, creates the run's namespace and its helper pods,
// and returns the cluster for the run. If ctx is cancelled or any step fails,
// everything made so far is removed before it returns.
func Open(ctx context.Context, opts Options) (_ *Cluster, err error) {
	if opts.Kubeconfig == "" {
		return nil, errors.New("a cluster topology needs the cluster's kubeconfig (--kubeconfig)")
	}
	kc, err := filepath.Abs(opts.Kubeconfig)
	if err != nil {
		return nil, err
	}
	if _, err := os.Stat(kc); err != nil {
		return nil, fmt.Errorf("--kubeconfig %s: %w", opts.Kubeconfig, err)
	}
	if opts.Nodes == 0 {
		opts.Nodes = 2
	}
	if opts.Nodes < 2 {
		return nil, fmt.Errorf("Options.Nodes=%d: the specs use two nodes or more", opts.Nodes)
	}
	self := opts.ProbeBinary
	if self == "" {
		if self, err = os.Executable(); err != nil {
			return nil, err
		}
	}
	c := &Cluster{logf: opts.Logf, kubeconfig: kc, self: self, image: opts.ProbeImage, probePath: opts.ProbePath, ownClocks: opts.MeasureClocks}
	if c.logf == nil {
		c.logf = func(string, ...any) {}
	}
	if c.image == "" {
		if c.image, err = kubeobj.ProbeImage(self); err != nil {
			return nil, err
		}
	}
	if c.probePath == "" {
		c.probePath = self
	}
	var id [3]byte
	if _, err := rand.Read(id[:]); err != nil {
		return nil, err
	}
	c.runID = RunPrefix + hex.EncodeToString(id[:])[:5]
	c.namespace = NamespacePrefix + c.runID
	root := opts.RunRoot
	if root == "" {
		root = filepath.Join(os.TempDir(), "dpconform-cluster")
	}
	c.dir = filepath.Join(root, c.runID)
	if err := os.MkdirAll(c.dir, 0o755); err != nil {
		return nil, fmt.Errorf("create run directory: %w", err)
	}
	base, err := restConfig(kc)
	if err != nil {
		os.RemoveAll(c.dir)
		return nil, err
	}
	c.restConfig = rest.CopyConfig(base)
	c.restConfig.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return &runTransport{next: rt, namespace: c.namespace, label: c.runID}
	})
	if c.kube, err = kubernetes.NewForConfig(c.restConfig); err != nil {
		os.RemoveAll(c.dir)
		return nil, err
	}
	under, spare, err := discover(ctx, c.kube, opts)
	if err != nil {
		os.RemoveAll(c.dir)
		return nil, err
	}
	defer func() {
		if err != nil {
			c.logf("cluster set-up failed, removing what was made: %v", err)
			if cerr := c.Close(); cerr != nil {
				err = errors.Join(err, fmt.Errorf("clean up after failed set-up: %w", cerr))
			}
		}
	}()
	c.logf("cluster run %s: nodes %s, namespace %s, image %s", c.runID, nodeNames(under), c.namespace, c.image)
	owner, err := ownerOf(os.Getpid())
	if err != nil {
		return nil, err
	}
	if _, err := c.kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{
		Name: c.namespace, Annotations: map[string]string{OwnerAnnotation: owner},
		// The helpers and a DaemonSet agent are privileged pods on the host's network:
		// where Pod Security admission enforces a level by default, the run's
		// namespace asks for the one they need.
		Labels: map[string]string{RunLabel: c.runID, "pod-security.kubernetes.io/enforce": "privileged"},
	}}, metav1.CreateOptions{}); err != nil {
		return nil, fmt.Errorf("create the run's namespace %s: %w", c.namespace, err)
	}
	for i, n := range under {
		h, err := c.startHelper(ctx, "node-"+strconv.Itoa(i), n)
		if err != nil {
			return nil, err
		}
		nd := &node{c: c, helper: h, index: i, spare: opts.SpareAddresses[n.Name], stateDir: filepath.Join(c.dir, n.Name)}
		if cidr := n.Spec.PodCIDR; cidr != "" {
			if nd.podCIDR, err = netip.ParsePrefix(cidr); err != nil {
				return nil, fmt.Errorf("node %s: podCIDR %q: %w", n.Name, cidr, err)
			}
		}
		if err := os.MkdirAll(nd.stateDir, 0o755); err != nil {
			return nil, err
		}
		c.nodes = append(c.nodes, nd)
	}
	switch {
	case opts.ExternalAddress != "":
		ip, err := netip.ParseAddr(opts.ExternalAddress)
		if err != nil || !ip.Is4() {
			return nil, fmt.Errorf("--external-address %q: want this machine's IPv4 address as the nodes reach it", opts.ExternalAddress)
		}
		c.external = &localExternal{ip: ip}
	default:
		if spare == nil {
			return nil, fmt.Errorf("no node is left for the external client (every Ready node is under test): give an external node (--external-node, a node the selector leaves out) or this machine's address (--external-address)")
		}
		if c.extPod, err = c.startHelper(ctx, "external", spare); err != nil {
			return nil, err
		}
		c.external = &podExternal{h: c.extPod}
	}
	return c, nil
}

// ExternalMode says which external client the run has, for the report: the two
// measure different paths.
func (c *Cluster) ExternalMode() string {
	switch e := c.external.(type) {
	case *localExternal:
		return fmt.Sprintf("this machine at %s (routed from outside the cluster)", e.ip)
	case *podExternal:
		return fmt.Sprintf("a host-network pod on node %s, not under test, at %s (on the nodes' network)", e.h.node, e.h.ip)
	}
	return "none"
}

// RunID is the run's ID, the value of RunLabel on what it made.
func (c *Cluster) RunID() string { return c.runID }

// Namespace is the run's namespace.
func (c *Cluster) Namespace() string { return c.namespace }

func nodeNames(ns []*corev1.Node) string {
	var s []string
	for _, n := range ns {
		s = append(s, n.Name)
	}
	return strings.Join(s, ", ")
}

// discover lists the nodes: those under test (selected, Ready, schedulable, the first
// opts.Nodes by name) and the node for the external client's pod, if any.
func discover(ctx context.Context, kube kubernetes.Interface, opts Options) (under []*corev1.Node, ext *corev1.Node, err error) {
	sel, err := labels.Parse(opts.NodeSelector)
	if err != nil {
		return nil, nil, fmt.Errorf("node selector %q: %w", opts.NodeSelector, err)
	}
	all, err := kube.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, nil, fmt.Errorf("list the cluster's nodes: %w", err)
	}
	sort.Slice(all.Items, func(i, j int) bool { return all.Items[i].Name < all.Items[j].Name })
	var left, skipped []string
	var rest []*corev1.Node
	for i := range all.Items {
		n := &all.Items[i]
		ok := nodeReady(n) && !n.Spec.Unschedulable && internalIP(n).IsValid()
		switch {
		case !ok:
			skipped = append(skipped, n.Name)
		case sel.Matches(labels.Set(n.Labels)) && len(under) < opts.Nodes && n.Name != opts.ExternalNode:
			under = append(under, n)
		default:
			rest = append(rest, n)
		}
	}
	if len(under) < opts.Nodes {
		return nil, nil, fmt.Errorf("the node selector %q matches %d Ready, schedulable nodes with an InternalIP (%s), and the specs need %d (not usable: %v): choose others with --node-selector",
			opts.NodeSelector, len(under), nodeNames(under), opts.Nodes, skipped)
	}
	for _, n := range rest {
		if opts.ExternalNode == "" || n.Name == opts.ExternalNode {
			return under, n, nil
		}
		left = append(left, n.Name)
	}
	if opts.ExternalNode != "" {
		return nil, nil, fmt.Errorf("--external-node %s is not a Ready node outside the nodes under test (those are %s; the others: %v)", opts.ExternalNode, nodeNames(under), left)
	}
	return under, nil, nil
}

func nodeReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func internalIP(n *corev1.Node) netip.Addr {
	for _, a := range n.Status.Addresses {
		if a.Type == corev1.NodeInternalIP {
			if ip, err := netip.ParseAddr(a.Address); err == nil && ip.Is4() {
				return ip
			}
		}
	}
	return netip.Addr{}
}

// ProbeCPU is the CPU every pod of a run requests. Probes run in the run's pods (what
// exec starts joins the container's cgroup), and a pod that requests nothing is
// BestEffort, whose cgroup has the least CPU weight there is (cpu.shares 2 against
// the 1024 of the node's daemons and the hundreds of the control plane's Burstable
// pods): whenever the node is busy (the API server streaming the probes' events, a
// container restarting), its probes wait, and their streams showed gaps of 100-190
// ms that the same streams through the kind topology, whose probes are not in the
// pods' cgroups, never showed (35-47 ms). A request makes them Burstable, with a
// weight of their own; no limit, which would throttle them.
var ProbeCPU = resource.MustParse("100m")

// podObject is a pod of the run: the project's image, the probe binary's `pause`,
// and ProbeCPU requested.
func (c *Cluster) podObject(spec topologies.PodSpec, namespace string) *corev1.Pod {
	p := kubeobj.PodObject(spec, namespace, c.image, corev1.PullIfNotPresent, []string{c.probePath, "pause"})
	p.Spec.Containers[0].Resources.Requests = corev1.ResourceList{corev1.ResourceCPU: ProbeCPU}
	return p
}

// startHelper runs one of the run's privileged host-network pods on n and finds its
// interface to the nodes' network (the one holding n's InternalIP).
func (c *Cluster) startHelper(ctx context.Context, name string, n *corev1.Node) (*helper, error) {
	p := c.podObject(topologies.PodSpec{Name: name, Node: n.Name, Labels: map[string]string{roleLabel: "helper"}}, c.namespace)
	p.Spec.HostNetwork, p.Spec.HostPID = true, true
	p.Spec.Containers[0].SecurityContext = &corev1.SecurityContext{Privileged: ptr.To(true)}
	if _, err := c.kube.CoreV1().Pods(c.namespace).Create(ctx, p, metav1.CreateOptions{}); err != nil {
		return nil, fmt.Errorf("create helper pod %s on %s: %w", name, n.Name, err)
	}
	if _, err := kubeobj.WaitRunning(ctx, c.kube, c.namespace, name, false, 2*time.Minute); err != nil {
		return nil, fmt.Errorf("helper pod on %s (image %s: can the node pull it?): %w", n.Name, c.image, err)
	}
	h := &helper{c: c, name: name, node: n.Name, ip: internalIP(n)}
	shared, err := h.sameClock(ctx)
	if err != nil {
		return nil, err
	}
	if !shared {
		c.logf("node %s reads another CLOCK_MONOTONIC than this machine's: the suite measures it and places its times on its own", n.Name)
		c.ownClocks = true
	}
	out, err := h.exec(ctx, "node-op", "iface", h.ip.String())
	if err != nil {
		return nil, fmt.Errorf("find node %s's interface: %w", n.Name, err)
	}
	f := strings.Fields(out)
	if len(f) != 2 {
		return nil, fmt.Errorf("node %s's interface: unexpected %q", n.Name, out)
	}
	h.iface = f[0]
	if h.bits, err = strconv.Atoi(f[1]); err != nil {
		return nil, fmt.Errorf("node %s's interface: unexpected %q", n.Name, out)
	}
	return h, nil
}

// sameClock reports whether a node reads this machine's CLOCK_MONOTONIC: one kernel
// (kind, a cluster of containers) is one clock, and a reading taken on the node then
// lies between two taken here before and after. On separate machines it does not,
// and the suite measures each host's offset instead (topologies.OwnClocks).
func (h *helper) sameClock(ctx context.Context) (bool, error) {
	before := monoNow()
	out, err := h.exec(ctx, "node-op", "clock")
	after := monoNow()
	if err != nil {
		return false, fmt.Errorf("read node %s's clock: %w", h.node, err)
	}
	v, err := strconv.ParseInt(out, 10, 64)
	if err != nil {
		return false, fmt.Errorf("node %s's clock: %q", h.node, out)
	}
	return v >= before && v <= after, nil
}

// Session returns a topology for one spec. Only one is open at a time.
func (c *Cluster) Session(ctx context.Context) (*Topology, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, errors.New("the cluster topology is closed")
	}
	if c.session != nil {
		return nil, errors.New("a topology of this cluster is still open: close it first")
	}
	t := &Topology{c: c, pods: map[string]*pod{}, added: map[netip.Addr]*node{}}
	c.session = t
	return t, nil
}

// Close removes what the run made: its namespace (and so every pod and object in it),
// the namespaces specs made and the cluster-scoped objects labelled with the run, and
// waits until they are gone. It is safe to call more than once.
func (c *Cluster) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	s := c.session
	c.mu.Unlock()
	var errs []error
	if s != nil {
		errs = append(errs, s.Close())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	errs = append(errs, removeRun(ctx, c.kube, c.runID, c.logf), os.RemoveAll(c.dir))
	return errors.Join(errs...)
}
