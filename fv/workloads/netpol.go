package workloads

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dpconform/dpconform/fv/harness"
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
	var ports []topologies.ContainerPort
	var tcp, udp []int
	for _, port := range NetpolPorts {
		ports = append(ports,
			topologies.ContainerPort{Name: NetpolPortName(port, corev1.ProtocolTCP), Port: port, Protocol: "TCP"},
			topologies.ContainerPort{Name: NetpolPortName(port, corev1.ProtocolUDP), Port: port, Protocol: "UDP"})
		tcp, udp = append(tcp, int(port)), append(udp, int(port))
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
			p.Pod, err = w.Topo.AddPod(ctx, topologies.PodSpec{Name: name, Namespace: ns, Node: nodes[i%len(nodes)].Name(),
				Labels: map[string]string{PodLabel: name}, Ports: ports})
			if err != nil {
				return nil, fmt.Errorf("add pod %s: %w", p.ID(), err)
			}
			if _, err := w.StartProbe(ctx, p.Pod, serveAll(p.ID(), tcp, udp)); err != nil {
				return nil, fmt.Errorf("serve on %s: %w", p.ID(), err)
			}
			f.Pods = append(f.Pods, p)
			i++
		}
	}
	return f, nil
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

func serveAll(name string, tcp, udp []int) probe.Serve {
	return probe.Serve{Name: name, TCP: tcp, UDP: udp, RecordTCP: true}
}
