package workloads

import (
	"context"
	"fmt"
	"net/netip"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dpconform/dpconform/fv/harness"
	"github.com/dpconform/dpconform/fv/netpolmodel"
	"github.com/dpconform/dpconform/fv/probe"
	"github.com/dpconform/dpconform/topologies"
)

// The netpol fixture's shape, as the upstream NetworkPolicy e2e tests (and Cyclonus)
// build it: three namespaces of three pods, each serving TCP and UDP on two ports.
var (
	NetpolNamespaces = []string{"x", "y", "z"}
	NetpolPods       = []string{"a", "b", "c"}
	NetpolPorts      = []int32{80, 81}
)

// Labels the netpol fixture's policies select on: every pod carries PodLabel with
// its name, every namespace NamespaceLabel with its name (beside the API's own
// kubernetes.io/metadata.name).
const (
	PodLabel       = "pod"
	NamespaceLabel = "ns"
)

// NetpolPod is one pod of the netpol fixture.
type NetpolPod struct {
	Namespace, Name string
	Pod             topologies.Pod
}

// ID is the pod's name in matrices and as its server's backend name: "x/a".
func (p NetpolPod) ID() string { return p.Namespace + "/" + p.Name }

// Netpol is the netpol fixture.
type Netpol struct {
	Pods []NetpolPod // x/a, x/b, x/c, y/a, ...
}

// Pod returns the fixture's pod ns/name, or false.
func (f *Netpol) Pod(ns, name string) (NetpolPod, bool) {
	for _, p := range f.Pods {
		if p.Namespace == ns && p.Name == name {
			return p, true
		}
	}
	return NetpolPod{}, false
}

// NetpolPortName is the name of a pod's container port, "serve-80-tcp", so that a
// policy can name ports; each pod declares one per port and protocol.
func NetpolPortName(port int32, proto corev1.Protocol) string {
	p := "tcp"
	if proto == corev1.ProtocolUDP {
		p = "udp"
	}
	return fmt.Sprintf("serve-%d-%s", port, p)
}

// DeployNetpol creates the labelled namespaces and the nine pods, spread over the
// nodes round robin, each serving TCP and UDP on NetpolPorts under its ID.
func DeployNetpol(ctx context.Context, w *harness.World) (*Netpol, error) {
	nodes := w.Topo.Nodes()
	if len(nodes) == 0 {
		return nil, fmt.Errorf("the netpol fixture needs a node")
	}
	f := &Netpol{}
	i := 0
	for _, ns := range NetpolNamespaces {
		if err := labelledNamespace(ctx, w, ns); err != nil {
			return nil, err
		}
		for _, name := range NetpolPods {
			p := NetpolPod{Namespace: ns, Name: name}
			var err error
			p.Pod, err = w.Topo.AddPod(ctx, NetpolPodSpec(ns, name, nodes[i%len(nodes)].Name()))
			if err != nil {
				return nil, fmt.Errorf("add pod %s: %w", p.ID(), err)
			}
			if _, err := w.StartProbe(ctx, p.Pod, NetpolServe(p.ID())); err != nil {
				return nil, fmt.Errorf("serve on %s: %w", p.ID(), err)
			}
			f.Pods = append(f.Pods, p)
			i++
		}
	}
	return f, nil
}

// NetpolPodSpec is a pod of the netpol fixture's shape: ns/name on node, labelled
// with its name, declaring a named container port per port and protocol.
func NetpolPodSpec(ns, name, node string) topologies.PodSpec {
	var ports []topologies.ContainerPort
	for _, port := range NetpolPorts {
		ports = append(ports,
			topologies.ContainerPort{Name: NetpolPortName(port, corev1.ProtocolTCP), Port: port, Protocol: "TCP"},
			topologies.ContainerPort{Name: NetpolPortName(port, corev1.ProtocolUDP), Port: port, Protocol: "UDP"})
	}
	return topologies.PodSpec{Name: name, Namespace: ns, Node: node, Labels: map[string]string{PodLabel: name}, Ports: ports}
}

// NetpolServe is the server of a netpol fixture's pod: TCP and UDP on NetpolPorts
// under its ID, reporting every request.
func NetpolServe(id string) probe.Serve {
	var ports []int
	for _, port := range NetpolPorts {
		ports = append(ports, int(port))
	}
	return probe.Serve{Name: id, TCP: ports, UDP: ports, RecordTCP: true}
}

func labelledNamespace(ctx context.Context, w *harness.World, name string) error {
	nss := w.Topo.Kube().CoreV1().Namespaces()
	obj := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{NamespaceLabel: name}}}
	if _, err := nss.Create(ctx, obj, metav1.CreateOptions{}); err == nil {
		return nil
	}
	cur, err := nss.Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("namespace %s: %w", name, err)
	}
	if cur.Labels[NamespaceLabel] == name {
		return nil
	}
	if cur.Labels == nil {
		cur.Labels = map[string]string{}
	}
	cur.Labels[NamespaceLabel] = name
	if _, err := nss.Update(ctx, cur, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("label namespace %s: %w", name, err)
	}
	return nil
}

// NetpolCluster is the netpol fixture as the NetworkPolicy model sees it: labelled
// namespaces, and pods labelled with their names that declare a named container
// port per port and protocol, at the addresses ip gives by ID ("y/b").
func NetpolCluster(ip func(id string) netip.Addr) netpolmodel.Cluster {
	var c netpolmodel.Cluster
	for _, ns := range NetpolNamespaces {
		c.Namespaces = append(c.Namespaces, netpolmodel.Namespace{Name: ns,
			Labels: map[string]string{NamespaceLabel: ns, "kubernetes.io/metadata.name": ns}})
	}
	var ports []corev1.ContainerPort
	for _, p := range NetpolPorts {
		for _, proto := range []corev1.Protocol{corev1.ProtocolTCP, corev1.ProtocolUDP} {
			ports = append(ports, corev1.ContainerPort{Name: NetpolPortName(p, proto), ContainerPort: p, Protocol: proto})
		}
	}
	for _, ns := range NetpolNamespaces {
		for _, name := range NetpolPods {
			c.Pods = append(c.Pods, netpolmodel.Pod{Namespace: ns, Name: name,
				Labels: map[string]string{PodLabel: name}, IP: ip(ns + "/" + name), Ports: ports})
		}
	}
	return c
}
