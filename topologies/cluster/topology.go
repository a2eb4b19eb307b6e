package cluster

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"os/exec"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/dpconform/dpconform/topologies"
	"github.com/dpconform/dpconform/topologies/kubeobj"
)

// Topology is one spec's view of the cluster. It implements topologies.Topology:
// nodes are the nodes under test, reached through their helper pods; pods are real
// pods; the external client is this machine or a pod on a node not under test. Close
// removes what the spec made (its pods, the objects it created, the namespaces it
// made, addresses, pinned neighbours) and leaves the run's own pods for the next.
type Topology struct {
	c *Cluster

	mu     sync.Mutex
	pods   map[string]*pod // by namespace/name
	added  map[netip.Addr]*node
	pinned []pin
	closed bool
}

type pin struct {
	from *helper
	addr netip.Addr
}

var _ topologies.Topology = (*Topology)(nil)

// Provider implements topologies.Topology.
func (t *Topology) Provider() string { return "cluster" }

// RunID implements topologies.Topology.
func (t *Topology) RunID() string { return t.c.runID }

// OwnClocks implements topologies.OwnClocks: true when a node reads another clock
// than this machine's, or Options.MeasureClocks asked to measure them all.
func (t *Topology) OwnClocks() bool { return t.c.ownClocks }

// Cluster is the cluster the topology is a view of.
func (t *Topology) Cluster() *Cluster { return t.c }

// Nodes implements topologies.Topology.
func (t *Topology) Nodes() []topologies.Node {
	out := make([]topologies.Node, len(t.c.nodes))
	for i, n := range t.c.nodes {
		out[i] = n
	}
	return out
}

// Node implements topologies.Topology.
func (t *Topology) Node(name string) topologies.Node {
	for _, n := range t.c.nodes {
		if n.node == name {
			return n
		}
	}
	return nil
}

// External implements topologies.Topology.
func (t *Topology) External() topologies.Host { return t.c.external }

// Kube implements topologies.Topology: a client whose requests in namespace "default"
// go to the run's namespace and whose creations carry the run's label (transport.go).
func (t *Topology) Kube() kubernetes.Interface { return t.c.kube }

// RESTConfig implements topologies.Topology.
func (t *Topology) RESTConfig() *rest.Config { return rest.CopyConfig(t.c.restConfig) }

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

// helperOf is the helper pod on a host's network: a node's, or the external pod's.
func (t *Topology) helperOf(h topologies.Host) (*helper, bool) {
	switch h := h.(type) {
	case *node:
		return h.helper, h.c == t.c
	case *podExternal:
		return h.h, h.h.c == t.c
	}
	return nil, false
}

// PinNeighbour implements topologies.Topology, on from's interface to the nodes'
// network, through its helper pod.
func (t *Topology) PinNeighbour(ctx context.Context, from topologies.Host, addr netip.Addr, via topologies.Node) error {
	n, ok := via.(*node)
	if !ok || n.c != t.c {
		return fmt.Errorf("pin neighbour %s: %s is not a node of this topology", addr, via.Name())
	}
	if _, local := from.(*localExternal); local {
		return fmt.Errorf("%w: the external client is this machine, routed to the nodes rather than on their network, so it has no neighbour entry for %s to pin (give an external node instead of --external-address)", topologies.ErrUnsupported, addr)
	}
	src, ok := t.helperOf(from)
	if !ok {
		return fmt.Errorf("pin neighbour %s: %s is not a host on the nodes' network", addr, from.Name())
	}
	if !addr.IsValid() {
		return fmt.Errorf("%w: node %s has no spare address (give one with --spare-address %s=IP, a free address on its network)", topologies.ErrUnsupported, n.node, n.node)
	}
	mac, err := n.helper.exec(ctx, "node-op", "mac", n.helper.iface)
	if err != nil {
		return fmt.Errorf("pin neighbour %s: %w", addr, err)
	}
	if _, err := src.exec(ctx, "node-op", "neigh-set", src.iface, addr.String(), mac); err != nil {
		return fmt.Errorf("pin neighbour %s at %s on %s: %w", addr, mac, from.Name(), err)
	}
	t.mu.Lock()
	t.pinned = append(t.pinned, pin{from: src, addr: addr})
	t.mu.Unlock()
	return nil
}

// Close implements topologies.Topology: it removes the spec's pods and what it
// created through the API (every object labelled with the run but the run's own
// pods, and the namespaces it made), the addresses it added and the neighbours it
// pinned.
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
	added, pinned := t.added, t.pinned
	t.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var errs []error
	for _, p := range pods {
		errs = append(errs, t.teardown(ctx, p, false))
	}
	errs = append(errs, removeSpecObjects(ctx, t.c.kube, t.c.runID, t.c.namespace))
	for addr, n := range added {
		errs = append(errs, n.delAddr(ctx, addr))
	}
	for _, p := range pinned {
		_, _ = p.from.exec(ctx, "node-op", "neigh-del", p.from.iface, p.addr.String())
	}
	t.c.mu.Lock()
	if t.c.session == t {
		t.c.session = nil
	}
	t.c.mu.Unlock()
	return errors.Join(errs...)
}

// start runs cmd in a container of a pod of the run through the exec helper. The
// program is the dpconform binary (by cmd.Path, this machine's, or by name), which
// the image has at ProbePath; the caller's environment stays here.
func (c *Cluster) start(namespace, podName string, cmd *exec.Cmd) error {
	if len(cmd.Args) == 0 {
		return errors.New("start: empty command")
	}
	prog := cmd.Args[0]
	if cmd.Path == c.self || cmd.Args[0] == c.self || cmd.Args[0] == "dpconform" {
		prog = c.probePath
	} else if cmd.Err != nil && !strings.Contains(prog, "/") {
		cmd.Err = nil
	}
	command := append([]string{prog}, cmd.Args[1:]...)
	return startInPod(c.self, c.kubeconfig, namespace, podName, "workload", command, cmd)
}

// node is a node under test.
type node struct {
	c        *Cluster
	*helper  // the node's helper pod, on its network
	index    int
	spare    netip.Addr
	podCIDR  netip.Prefix
	stateDir string
}

var _ topologies.Node = (*node)(nil)

func (n *node) Name() string             { return n.helper.node }
func (n *node) IP() netip.Addr           { return n.ip }
func (n *node) PodCIDR() netip.Prefix    { return n.podCIDR }
func (n *node) Interface() string        { return n.iface }
func (n *node) SpareAddress() netip.Addr { return n.spare }

// Start implements topologies.Host: cmd runs in the node's helper pod (the node's
// network and PID namespaces, privileged, the image's filesystem).
func (n *node) Start(cmd *exec.Cmd) error { return n.c.start(n.c.namespace, n.helper.name, cmd) }

// StartDriver implements topologies.Node: a driver call runs on this machine and
// reaches the node through the API (docs/driver.md, DPC_TOPOLOGY=cluster).
func (n *node) StartDriver(cmd *exec.Cmd) error { return cmd.Start() }

// DriverEnv implements topologies.Node.
func (n *node) DriverEnv() []string {
	return []string{
		"DPC_NODE=" + n.helper.node,
		"DPC_NETNS=",
		"DPC_KUBECONFIG=" + n.c.kubeconfig,
		"DPC_STATE_DIR=" + n.stateDir,
		"DPC_TOPOLOGY=cluster",
		"DPC_RUN=" + n.c.runID,
		"DPC_NAMESPACE=" + n.c.namespace,
	}
}

// AddAddress implements topologies.Node, through the node's helper pod.
func (n *node) AddAddress(ctx context.Context, addr netip.Addr) error {
	if !addr.IsValid() {
		return fmt.Errorf("%w: node %s has no spare address (give one with --spare-address %s=IP)", topologies.ErrUnsupported, n.helper.node, n.helper.node)
	}
	if _, err := n.exec(ctx, "node-op", "addr-add", n.iface, addr.String()+"/"+strconv.Itoa(n.bits)); err != nil {
		return fmt.Errorf("add %s to %s's %s: %w", addr, n.helper.node, n.iface, err)
	}
	if s := n.c.session; s != nil {
		s.mu.Lock()
		s.added[addr] = n
		s.mu.Unlock()
	}
	return nil
}

// RemoveAddress implements topologies.Node.
func (n *node) RemoveAddress(ctx context.Context, addr netip.Addr) error {
	if err := n.delAddr(ctx, addr); err != nil {
		return err
	}
	if s := n.c.session; s != nil {
		s.mu.Lock()
		delete(s.added, addr)
		s.mu.Unlock()
	}
	return nil
}

func (n *node) delAddr(ctx context.Context, addr netip.Addr) error {
	if _, err := n.exec(ctx, "node-op", "addr-del", n.iface, addr.String()+"/"+strconv.Itoa(n.bits)); err != nil {
		return fmt.Errorf("remove %s from %s's %s: %w", addr, n.helper.node, n.iface, err)
	}
	return nil
}

// localExternal is this machine as the external client, at the address the nodes
// see it by.
type localExternal struct{ ip netip.Addr }

func (e *localExternal) Name() string              { return "external" }
func (e *localExternal) IP() netip.Addr            { return e.ip }
func (e *localExternal) Start(cmd *exec.Cmd) error { return cmd.Start() }

// podExternal is a host-network pod on a node not under test.
type podExternal struct{ h *helper }

func (e *podExternal) Name() string   { return "external" }
func (e *podExternal) IP() netip.Addr { return e.h.ip }
func (e *podExternal) Start(cmd *exec.Cmd) error {
	return e.h.c.start(e.h.c.namespace, e.h.name, cmd)
}

// pod is a real pod of the probe image.
type pod struct {
	t         *Topology
	name      string
	namespace string // the real one (the run's for "default")
	node      *node
	labels    map[string]string
	ip        netip.Addr
	container string

	mu    sync.Mutex
	procs []*exec.Cmd
}

var _ topologies.Pod = (*pod)(nil)

func (p *pod) Name() string              { return p.name }
func (p *pod) Namespace() string         { return p.namespace }
func (p *pod) NodeName() string          { return p.node.helper.node }
func (p *pod) Labels() map[string]string { return maps.Clone(p.labels) }
func (p *pod) IP() netip.Addr            { return p.ip }
func (p *pod) key() string               { return p.namespace + "/" + p.name }

// Start implements topologies.Host: cmd runs in the pod's container through the exec
// helper, a child of the caller.
func (p *pod) Start(cmd *exec.Cmd) error {
	if err := p.t.c.start(p.namespace, p.name, cmd); err != nil {
		return err
	}
	p.mu.Lock()
	p.procs = append(p.procs, cmd)
	p.mu.Unlock()
	return nil
}

// AddPod implements topologies.Topology: the Pod goes to the API bound to its node,
// and the node's kubelet runs it (the runtime makes the sandbox and calls the
// cluster's CNI). AddPod returns once the kubelet has written the pod's IP and its
// readiness. spec.OnWired cannot be served, as on kind: it is refused with
// topologies.ErrUnsupported.
func (t *Topology) AddPod(ctx context.Context, spec topologies.PodSpec) (topologies.Pod, error) {
	if spec.OnWired != nil {
		return nil, fmt.Errorf("%w: on a cluster the kubelet writes a pod's status, so no probe can start in pod %s before the API says where it is (PodSpec.OnWired)", topologies.ErrUnsupported, spec.Name)
	}
	if spec.Name == "" || spec.Node == "" {
		return nil, errors.New("PodSpec needs a Name and a Node")
	}
	n, ok := t.Node(spec.Node).(*node)
	if !ok {
		return nil, fmt.Errorf("pod %s: no node %q in this topology", spec.Name, spec.Node)
	}
	ns, err := t.namespaceFor(ctx, spec.Namespace)
	if err != nil {
		return nil, err
	}
	obj := t.c.podObject(spec, ns)
	if _, err := t.c.kube.CoreV1().Pods(ns).Create(ctx, obj, metav1.CreateOptions{}); err != nil {
		return nil, fmt.Errorf("create Pod %s/%s: %w", ns, spec.Name, err)
	}
	p := &pod{t: t, name: spec.Name, namespace: ns, node: n, labels: maps.Clone(spec.Labels)}
	t.mu.Lock()
	t.pods[p.key()] = p
	t.mu.Unlock()
	last, err := kubeobj.WaitRunning(ctx, t.c.kube, ns, spec.Name, !spec.NotReady, 2*time.Minute)
	if err == nil {
		p.ip, err = netip.ParseAddr(last.Status.PodIP)
		_, p.container, _ = strings.Cut(last.Status.ContainerStatuses[0].ContainerID, "://")
	}
	if err != nil {
		return nil, errors.Join(err, t.RemovePod(context.WithoutCancel(ctx), p))
	}
	return p, nil
}

// namespaceFor is where a spec's namespace is on the cluster: "default" (or none) is
// the run's; another is made, labelled with the run, and refused if it exists and is
// not the run's (a spec must never put pods among a cluster's own).
func (t *Topology) namespaceFor(ctx context.Context, name string) (string, error) {
	if name == "" || name == "default" || name == t.c.namespace {
		return t.c.namespace, nil
	}
	made, err := kubeobj.EnsureNamespace(ctx, t.c.kube, name, map[string]string{RunLabel: t.c.runID})
	if err != nil || made {
		return name, err
	}
	ns, err := t.c.kube.CoreV1().Namespaces().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return "", err
	}
	if ns.Labels[RunLabel] != t.c.runID {
		return "", fmt.Errorf("namespace %s exists on the cluster and is not this run's: a spec needs it for itself (remove it, or run on a cluster without it)", name)
	}
	return name, nil
}

// RemovePod implements topologies.Topology as a kubelet removes a pod: what was
// started in it stops, then the Pod is deleted and the kubelet stops the container
// and tears the sandbox down; RemovePod returns once the Pod is gone.
func (t *Topology) RemovePod(ctx context.Context, tp topologies.Pod) error {
	p, err := t.ours(tp)
	if err != nil {
		return err
	}
	return t.teardown(ctx, p, false)
}

// VanishPod implements topologies.Topology as a lost sandbox goes: the node's helper
// deletes the pod's interface (the veth pair, both ends) first, then what was started
// in it stops with no interface to send on, then the Pod is deleted.
func (t *Topology) VanishPod(ctx context.Context, tp topologies.Pod) error {
	p, err := t.ours(tp)
	if err != nil {
		return err
	}
	return t.teardown(ctx, p, true)
}

func (t *Topology) ours(tp topologies.Pod) (*pod, error) {
	p, ok := tp.(*pod)
	if !ok || p.t != t {
		return nil, fmt.Errorf("pod %s is not of this topology", tp.Name())
	}
	return p, nil
}

func (t *Topology) teardown(ctx context.Context, p *pod, networkFirst bool) error {
	t.mu.Lock()
	delete(t.pods, p.key())
	t.mu.Unlock()
	var errs []error
	if networkFirst {
		if _, err := p.node.exec(ctx, "node-op", "vanish", p.container); err != nil {
			errs = append(errs, fmt.Errorf("vanish pod %s: delete its interface: %w", p.key(), err))
		}
	}
	p.mu.Lock()
	procs := p.procs
	p.procs = nil
	p.mu.Unlock()
	// Killing an exec helper closes its stream: the command's stdin ends and a probe
	// stops; the Pod's deletion then stops whatever is left.
	for _, cmd := range procs {
		if cmd.Process != nil {
			_ = cmd.Process.Signal(syscall.SIGKILL)
		}
	}
	if err := kubeobj.DeletePod(ctx, t.c.kube, p.namespace, p.name, 60*time.Second, nil); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// removeSpecObjects deletes what a spec created through the API, found by the run's
// label: Services, NetworkPolicies and pods in every namespace (but the run's own
// pods), and the namespaces made for it; and waits until the pods and namespaces are
// gone, so the next spec may reuse their names.
func removeSpecObjects(ctx context.Context, kube kubernetes.Interface, runID, runNS string) error {
	sel := metav1.ListOptions{LabelSelector: RunLabel + "=" + runID + "," + roleLabel + "!=helper"}
	var errs []error
	svcs, err := kube.CoreV1().Services("").List(ctx, sel)
	if err != nil {
		return err
	}
	for _, s := range svcs.Items {
		if err := kube.CoreV1().Services(s.Namespace).Delete(ctx, s.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, err)
		}
	}
	nps, err := kube.NetworkingV1().NetworkPolicies("").List(ctx, sel)
	if err != nil {
		return err
	}
	for _, np := range nps.Items {
		if err := kube.NetworkingV1().NetworkPolicies(np.Namespace).Delete(ctx, np.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, err)
		}
	}
	pods, err := kube.CoreV1().Pods("").List(ctx, sel)
	if err != nil {
		return err
	}
	for _, p := range pods.Items {
		errs = append(errs, kubeobj.DeletePod(ctx, kube, p.Namespace, p.Name, 60*time.Second, nil))
	}
	nss, err := kube.CoreV1().Namespaces().List(ctx, metav1.ListOptions{LabelSelector: RunLabel + "=" + runID})
	if err != nil {
		return err
	}
	var gone []string
	for _, ns := range nss.Items {
		if ns.Name == runNS {
			continue
		}
		if err := kube.CoreV1().Namespaces().Delete(ctx, ns.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, err)
		}
		gone = append(gone, ns.Name)
	}
	errs = append(errs, kubeobj.WaitNamespacesGone(ctx, kube, gone))
	return errors.Join(errs...)
}
