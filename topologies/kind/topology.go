package kind

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"sync"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/dpconform/dpconform/topologies"
)

// Topology is one spec's view of a kind cluster. It implements topologies.Topology:
// nodes are the node containers, the external client a container on the cluster's
// network, pods real pods that the nodes' kubelets run. Close removes what the spec
// made (pods, Services, NetworkPolicies, namespaces, addresses, pinned neighbours)
// and leaves the cluster for the next; a topology made by New deletes the cluster too.
type Topology struct {
	c          *Cluster
	ownCluster bool
	namespaces map[string]bool // at the start, kept at Close

	mu     sync.Mutex
	pods   map[string]*pod       // by namespace/name
	added  map[netip.Addr]string // addresses AddAddress added, to the node's name
	pinned []pin
	closed bool
}

type pin struct {
	from topologies.Host
	addr netip.Addr
}

var _ topologies.Topology = (*Topology)(nil)

// New creates a cluster and returns a topology that deletes it when closed.
func New(ctx context.Context, opts Options) (*Topology, error) {
	c, err := NewCluster(ctx, opts)
	if err != nil {
		return nil, err
	}
	t, err := c.Session(ctx)
	if err != nil {
		return nil, errors.Join(err, c.Close())
	}
	t.ownCluster = true
	return t, nil
}

// Session returns a topology for one spec. Only one is open at a time.
func (c *Cluster) Session(ctx context.Context) (*Topology, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, errors.New("the kind cluster is closed")
	}
	if c.session != nil {
		return nil, errors.New("a topology of this kind cluster is still open: close it first")
	}
	nss, err := c.kube.CoreV1().Namespaces().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list namespaces: %w", err)
	}
	t := &Topology{c: c, namespaces: map[string]bool{}, pods: map[string]*pod{}, added: map[netip.Addr]string{}}
	for _, ns := range nss.Items {
		t.namespaces[ns.Name] = true
	}
	c.session = t
	return t, nil
}

// Provider implements topologies.Topology.
func (t *Topology) Provider() string { return "kind" }

// RunID implements topologies.Topology.
func (t *Topology) RunID() string { return t.c.runID }

// Cluster is the kind cluster the topology is a view of.
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
		if n.name == name {
			return n
		}
	}
	return nil
}

// External implements topologies.Topology.
func (t *Topology) External() topologies.Host { return t.c.external }

// Kube implements topologies.Topology.
func (t *Topology) Kube() kubernetes.Interface { return t.c.kube }

// RESTConfig implements topologies.Topology.
func (t *Topology) RESTConfig() *rest.Config { return rest.CopyConfig(t.c.restConfig) }

// Kubeconfig is the path of a kubeconfig that works from the host and the nodes.
func (t *Topology) Kubeconfig() string { return t.c.kubeconfig }

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

// PinNeighbour implements topologies.Topology, in from's network namespace.
func (t *Topology) PinNeighbour(ctx context.Context, from topologies.Host, addr netip.Addr, via topologies.Node) error {
	n, ok := via.(*node)
	if !ok || n.c != t.c {
		return fmt.Errorf("pin neighbour %s: %s is not a node of this topology", addr, via.Name())
	}
	src, ok := from.(nsHost)
	if !ok {
		return fmt.Errorf("pin neighbour %s: %s is not a host on the nodes' network", addr, from.Name())
	}
	var mac net.HardwareAddr
	if err := withLink(n, "eth0", func(h *netlink.Handle, l netlink.Link) error {
		mac = l.Attrs().HardwareAddr
		return nil
	}); err != nil {
		return err
	}
	if err := withLink(src, "eth0", func(h *netlink.Handle, l netlink.Link) error {
		return h.NeighSet(&netlink.Neigh{LinkIndex: l.Attrs().Index, Family: netlink.FAMILY_V4, State: netlink.NUD_PERMANENT,
			IP: addr.AsSlice(), HardwareAddr: mac})
	}); err != nil {
		return fmt.Errorf("pin neighbour %s at %s on %s: %w", addr, mac, from.Name(), err)
	}
	t.mu.Lock()
	t.pinned = append(t.pinned, pin{from: from, addr: addr})
	t.mu.Unlock()
	return nil
}

// Close implements topologies.Topology: it removes the spec's pods, the Services,
// NetworkPolicies and namespaces it made, the addresses it added and the neighbours
// it pinned, and empties the nodes' state directories. A topology made by New deletes
// the cluster too.
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
	errs = append(errs, t.removeObjects(ctx))
	for addr, name := range added {
		if n, ok := t.Node(name).(*node); ok {
			errs = append(errs, n.delAddr(addr))
		}
	}
	for _, p := range pinned {
		if h, ok := p.from.(nsHost); ok {
			_ = withLink(h, "eth0", func(nh *netlink.Handle, l netlink.Link) error {
				return nh.NeighDel(&netlink.Neigh{LinkIndex: l.Attrs().Index, Family: netlink.FAMILY_V4, IP: p.addr.AsSlice()})
			})
		}
	}
	for _, n := range t.c.nodes {
		entries, _ := os.ReadDir(n.stateDir)
		for _, e := range entries {
			errs = append(errs, os.RemoveAll(filepath.Join(n.stateDir, e.Name())))
		}
	}
	t.c.mu.Lock()
	if t.c.session == t {
		t.c.session = nil
	}
	t.c.mu.Unlock()
	if t.ownCluster {
		errs = append(errs, t.c.Close())
	}
	return errors.Join(errs...)
}

// removeObjects deletes what a spec makes through the API: every Service but the
// API server's, every NetworkPolicy, every pod outside kube-system that the topology
// did not add (a spec's own), and the namespaces made since the topology opened; and
// waits until they are gone.
func (t *Topology) removeObjects(ctx context.Context) error {
	kube := t.c.kube
	var errs []error
	nss, err := kube.CoreV1().Namespaces().List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	for _, ns := range nss.Items {
		svcs, err := kube.CoreV1().Services(ns.Name).List(ctx, metav1.ListOptions{})
		if err != nil {
			errs = append(errs, err)
			continue
		}
		for _, s := range svcs.Items {
			if ns.Name == "default" && s.Name == "kubernetes" || ns.Name == "kube-system" {
				continue
			}
			if err := kube.CoreV1().Services(ns.Name).Delete(ctx, s.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
				errs = append(errs, err)
			}
		}
		if err := kube.NetworkingV1().NetworkPolicies(ns.Name).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{}); err != nil {
			errs = append(errs, err)
		}
		if !t.namespaces[ns.Name] {
			if err := kube.CoreV1().Namespaces().Delete(ctx, ns.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
				errs = append(errs, err)
			}
		}
	}
	// Namespaces go once their pods have: wait, so the next spec may reuse the names.
	for {
		nss, err := kube.CoreV1().Namespaces().List(ctx, metav1.ListOptions{})
		if err != nil {
			return errors.Join(append(errs, err)...)
		}
		var left []string
		for _, ns := range nss.Items {
			if !t.namespaces[ns.Name] {
				left = append(left, ns.Name)
			}
		}
		if len(left) == 0 {
			return errors.Join(errs...)
		}
		select {
		case <-ctx.Done():
			return errors.Join(append(errs, fmt.Errorf("namespaces %v are not gone: %w", left, ctx.Err()))...)
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// nsHost is a host of the topology whose namespaces a process enters to run there.
type nsHost interface {
	topologies.Host
	// hostPID is a process in the host's namespaces, as the host sees it.
	hostPID() (int, error)
}

// node is a kind node container.
type node struct {
	c        *Cluster
	name     string
	index    int
	pid      int
	ip       netip.Addr
	spare    netip.Addr
	podCIDR  netip.Prefix
	stateDir string
}

var _ topologies.Node = (*node)(nil)

func (n *node) Name() string                    { return n.name }
func (n *node) IP() netip.Addr                  { return n.ip }
func (n *node) PodCIDR() netip.Prefix           { return n.podCIDR }
func (n *node) Interface() string               { return "eth0" }
func (n *node) SpareAddress() netip.Addr        { return n.spare }
func (n *node) hostPID() (int, error)           { return n.pid, nil }
func (n *node) Start(cmd *exec.Cmd) error       { return enter(n, cmd) }
func (n *node) StartDriver(cmd *exec.Cmd) error { return cmd.Start() }

// DriverEnv implements topologies.Node: a driver call for a kind node runs on the
// host (the node is a machine of its own), with a kubeconfig and a state directory
// that are at the same paths inside the node, and the Docker endpoint and cluster
// name it needs to reach the node's container.
func (n *node) DriverEnv() []string {
	return []string{
		"DPC_NODE=" + n.name,
		"DPC_NETNS=",
		"DPC_KUBECONFIG=" + n.c.kubeconfig,
		"DPC_STATE_DIR=" + n.stateDir,
		"DPC_TOPOLOGY=kind",
		"DPC_RUN=" + n.c.runID,
		"DPC_KIND_CLUSTER=" + n.c.runID,
		"DOCKER_HOST=" + n.c.daemon.Host(),
		"DPC_KIND_BASE_IMAGE=" + baseImage(),
	}
}

// AddAddress implements topologies.Node.
func (n *node) AddAddress(ctx context.Context, addr netip.Addr) error {
	if !n.c.subnet.Contains(addr) {
		return fmt.Errorf("add %s to %s: not on its network %s", addr, n.name, n.c.subnet)
	}
	if err := withLink(n, "eth0", func(h *netlink.Handle, l netlink.Link) error {
		return h.AddrAdd(l, &netlink.Addr{IPNet: &net.IPNet{IP: addr.AsSlice(), Mask: net.CIDRMask(n.c.subnet.Bits(), 32)}})
	}); err != nil {
		return fmt.Errorf("add %s to %s's eth0: %w", addr, n.name, err)
	}
	s := n.c.session
	if s != nil {
		s.mu.Lock()
		s.added[addr] = n.name
		s.mu.Unlock()
	}
	return nil
}

// RemoveAddress implements topologies.Node.
func (n *node) RemoveAddress(ctx context.Context, addr netip.Addr) error {
	if err := n.delAddr(addr); err != nil {
		return err
	}
	if s := n.c.session; s != nil {
		s.mu.Lock()
		delete(s.added, addr)
		s.mu.Unlock()
	}
	return nil
}

func (n *node) delAddr(addr netip.Addr) error {
	err := withLink(n, "eth0", func(h *netlink.Handle, l netlink.Link) error {
		return h.AddrDel(l, &netlink.Addr{IPNet: &net.IPNet{IP: addr.AsSlice(), Mask: net.CIDRMask(n.c.subnet.Bits(), 32)}})
	})
	if err != nil {
		return fmt.Errorf("remove %s from %s's eth0: %w", addr, n.name, err)
	}
	return nil
}

// external is the client outside the cluster: a container on the run's network.
type external struct {
	c    *Cluster
	name string
	ip   netip.Addr
	pid  int
}

func (e *external) Name() string              { return "external" }
func (e *external) IP() netip.Addr            { return e.ip }
func (e *external) hostPID() (int, error)     { return e.pid, nil }
func (e *external) Start(cmd *exec.Cmd) error { return enter(e, cmd) }

// withLink runs fn with a netlink handle in h's network namespace and its link name.
func withLink(h nsHost, name string, fn func(*netlink.Handle, netlink.Link) error) error {
	pid, err := h.hostPID()
	if err != nil {
		return err
	}
	nsh, err := netns.GetFromPid(pid)
	if err != nil {
		return fmt.Errorf("network namespace of %s: %w", h.Name(), err)
	}
	defer nsh.Close()
	nh, err := netlink.NewHandleAt(nsh)
	if err != nil {
		return err
	}
	defer nh.Close()
	l, err := nh.LinkByName(name)
	if err != nil {
		return fmt.Errorf("%s in %s: %w", name, h.Name(), err)
	}
	return fn(nh, l)
}
