// Package topologies defines the world a conformance spec runs in: nodes, pods, an
// external client and a Kubernetes API server, behind one interface that every provider
// (network namespaces on one host, kind clusters) implements. Specs only ever see this
// interface.
package topologies

import (
	"context"
	"errors"
	"net/netip"
	"os/exec"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// Topology is a running set of nodes with a Kubernetes control plane.
type Topology interface {
	// Provider names the provider: "netns" or "kind".
	Provider() string
	// RunID is the per-run prefix carried by every name the run creates.
	RunID() string
	// Nodes returns the nodes in a stable order.
	Nodes() []Node
	// Node returns the node with the given name, or nil.
	Node(name string) Node
	// External is the client outside the cluster (for NodePort traffic).
	External() Host

	// Kube is a client of the topology's API server for the suite itself.
	Kube() kubernetes.Interface
	// RESTConfig is the configuration behind Kube.
	RESTConfig() *rest.Config

	// AddPod wires a pod as a container runtime would (Pod object, network namespace,
	// CNI ADD) and then plays the kubelet (status with the pod's IP, Ready). It returns
	// once the pod's status is written.
	AddPod(ctx context.Context, spec PodSpec) (Pod, error)
	// RemovePod removes a pod as a kubelet does: its processes stop (their sockets
	// close, so peers see FIN or RST), then the Pod object goes, CNI DEL, and the
	// pod's namespace is removed.
	RemovePod(ctx context.Context, pod Pod) error
	// VanishPod removes a pod as a lost sandbox or host does: its network goes first
	// (CNI DEL), then its processes, whose sockets close with no interface to send a
	// FIN or RST on, so its peers hear nothing; then the Pod object and namespace go.
	VanishPod(ctx context.Context, pod Pod) error
	// Pods returns the pods added and not removed.
	Pods() []Pod

	// PinNeighbour makes from's neighbour entry for addr permanent, at the hardware
	// address of node's interface: from sends to addr by way of node whether node
	// holds addr or not, as a client that cached the entry keeps doing until it
	// expires. from is a host on the nodes' network (the external client or a node).
	PinNeighbour(ctx context.Context, from Host, addr netip.Addr, node Node) error

	// Close removes everything the run created. It is safe to call more than once.
	Close() error
}

// Host is a place where processes run with their own network: a node, a pod or the
// external client.
type Host interface {
	// Name identifies the host within the run (a Node or Pod object's name, or "external").
	Name() string
	// IP is the host's IPv4 address on its primary interface.
	IP() netip.Addr
	// Start starts cmd inside the host's network namespace. cmd must not have been
	// started; on some providers Start rewrites cmd (for example to run it through a
	// container runtime), so callers must not rely on cmd.Path afterwards.
	Start(cmd *exec.Cmd) error
}

// Node is a Kubernetes node of the topology.
type Node interface {
	Host
	// PodCIDR is the range the node's pods get their addresses from.
	PodCIDR() netip.Prefix
	// Interface is the name of the node's interface to the fabric (e.g. "eth0").
	Interface() string
	// DriverEnv is the environment a driver call for this node gets (DRIVER.md):
	// DPC_NODE, DPC_NETNS, DPC_KUBECONFIG, DPC_STATE_DIR, DPC_TOPOLOGY and DPC_RUN.
	DriverEnv() []string
	// StartDriver starts a driver call for this node (cmd not yet started) where the
	// provider runs them: inside the node, in all its namespaces and its cgroup, on
	// netns; on the host where the node is a machine of its own (kind).
	StartDriver(cmd *exec.Cmd) error
	// SpareAddress is an IPv4 address on the network of the node's interface that
	// the topology keeps for this node: no host holds it until AddAddress adds it.
	SpareAddress() netip.Addr
	// AddAddress adds addr to the node's interface, a further address on the
	// network its IP is on, as an operator or a cloud agent adds a secondary IP.
	// The Node object is not changed: an address on the interface is not one of the
	// node's status addresses. addr must be free: no host of the topology holds it.
	AddAddress(ctx context.Context, addr netip.Addr) error
	// RemoveAddress removes an address that AddAddress added.
	RemoveAddress(ctx context.Context, addr netip.Addr) error
}

// Pod is a workload wired into a node by CNI.
type Pod interface {
	Host
	Namespace() string
	NodeName() string
	Labels() map[string]string
}

// PodSpec describes a pod to add.
type PodSpec struct {
	// Name of the Pod object; required.
	Name string
	// Namespace of the Pod object; "default" when empty.
	Namespace string
	// Node is the name of the node to place the pod on; required.
	Node string
	// Labels of the Pod object (Services and NetworkPolicies select on them).
	Labels map[string]string
	// Ports the pod's container declares (informational, for named target ports).
	Ports []ContainerPort
	// NotReady leaves the pod's Ready condition false.
	NotReady bool
	// OnWired, if set, runs once the pod's sandbox is wired by CNI and before the
	// kubelet's part (the status with the pod's IP) is written, as a container starts
	// once its sandbox is ready: a probe started here sends from the pod's first
	// possible packet, before the API says where the pod is. An error fails AddPod.
	OnWired func(ctx context.Context, p Pod) error
}

// ContainerPort is a port a pod declares.
type ContainerPort struct {
	Name     string
	Port     int32
	Protocol string // "TCP" (default) or "UDP"
}

// Output runs name with args inside h's network namespace and returns what it wrote
// to stdout; the error includes what it wrote to stderr (or, if nothing, to stdout).
func Output(ctx context.Context, h Host, name string, args ...string) ([]byte, error) {
	return output(ctx, h, name, args...)
}

// ErrUnsupported marks a request a provider cannot serve honestly (a pod's probe
// before the kubelet writes its status, on kind): the spec that asked is skipped with
// the reason the error gives, never run on an imitation.
var ErrUnsupported = errors.New("not supported by this topology")

// OwnClocks is implemented by a topology whose hosts may read another CLOCK_MONOTONIC
// than the suite's: nodes on other machines, or in time namespaces of their own. The
// suite then measures each node's and the external client's clock against its own and
// converts what they stamp (a pod reads its node's clock); on a topology that does not
// implement it, or says false, every host reads the suite's clock.
type OwnClocks interface {
	OwnClocks() bool
}

// HasOwnClocks reports whether t's hosts may read clocks other than the suite's.
func HasOwnClocks(t Topology) bool {
	c, ok := t.(OwnClocks)
	return ok && c.OwnClocks()
}
