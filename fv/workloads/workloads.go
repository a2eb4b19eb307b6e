// Package workloads builds the standard worlds that specs, the reference's own tests
// and the benchmarks run traffic in: backends that serve under their own name,
// Services that select them, the Core fixture (a backend on the node under
// transition and one on another node, a client pod, a NodePort Service each), and the
// netpol fixture (namespaces x, y, z with pods a, b, c, as the upstream NetworkPolicy
// e2e tests build it). Every wait has a deadline, and a flow is only taken as
// programmed once it has carried a streak of connections (WaitFlowing), never after a
// sleep.
package workloads

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/dpconform/dpconform/fv/harness"
	"github.com/dpconform/dpconform/fv/probe"
	"github.com/dpconform/dpconform/fv/timeline"
	"github.com/dpconform/dpconform/topologies"
)

// EchoPort is where backends serve; ServicePort is the Services' port.
const (
	EchoPort    = 8080
	ServicePort = 80
)

// ErrNotFlowing marks a flow that did not carry traffic within its budget once the
// API said it should: a failed precondition of a spec, charged to the
// implementation.
var ErrNotFlowing = errors.New("flow not programmed")

// Service is a Service as it was created, with the backends its EndpointSlices list.
type Service struct {
	Name      string
	Namespace string
	ClusterIP string
	NodePort  int32
	Backends  []topologies.Pod
}

// ClusterIPAddr is the Service's ClusterIP:port.
func (s Service) ClusterIPAddr() string {
	return net.JoinHostPort(s.ClusterIP, strconv.Itoa(ServicePort))
}

// NodePortAddr is node n's IP with the Service's node port.
func (s Service) NodePortAddr(n topologies.Node) string { return s.NodePortAt(n.IP()) }

// NodePortAt is addr (one of a node's addresses) with the Service's node port.
func (s Service) NodePortAt(addr netip.Addr) string {
	return net.JoinHostPort(addr.String(), strconv.Itoa(int(s.NodePort)))
}

// Direct is a pod's own address with EchoPort: a flow that needs no Service.
func Direct(p topologies.Pod) string {
	return net.JoinHostPort(p.IP().String(), strconv.Itoa(EchoPort))
}

// AddBackend adds a pod on node that serves TCP and UDP on EchoPort under its own
// name, and returns it with its server (stop the server to close its sockets, as a
// kubelet stopping the container does).
func AddBackend(ctx context.Context, w *harness.World, name, node string, labels map[string]string) (topologies.Pod, *probe.Process, error) {
	return addBackend(ctx, w, topologies.PodSpec{Name: name, Node: node, Labels: labels}, false)
}

// AddRecordingBackend is AddBackend with a server that also reports every connection
// it receives (probe.Serve.RecordTCP), sender and attempt included: a check then sees
// a request that reached the backend even when its reply never got back
// (matchers.HaveZeroDelivered with OnBackends).
func AddRecordingBackend(ctx context.Context, w *harness.World, name, node string, labels map[string]string) (topologies.Pod, *probe.Process, error) {
	return addBackend(ctx, w, topologies.PodSpec{Name: name, Node: node, Labels: labels}, true)
}

// AddNotReadyBackend is AddBackend with a pod whose Ready condition stays false: it
// serves, but its Services' EndpointSlices list it not ready, and no Service may
// send it a new connection.
func AddNotReadyBackend(ctx context.Context, w *harness.World, name, node string, labels map[string]string) (topologies.Pod, *probe.Process, error) {
	return addBackend(ctx, w, topologies.PodSpec{Name: name, Node: node, Labels: labels, NotReady: true}, false)
}

func addBackend(ctx context.Context, w *harness.World, spec topologies.PodSpec, record bool) (topologies.Pod, *probe.Process, error) {
	spec.Ports = []topologies.ContainerPort{{Name: "echo", Port: EchoPort}, {Name: "echo-udp", Port: EchoPort, Protocol: "UDP"}}
	p, err := w.Topo.AddPod(ctx, spec)
	if err != nil {
		return nil, nil, fmt.Errorf("add backend %s: %w", spec.Name, err)
	}
	srv, err := w.StartProbe(ctx, p, probe.Serve{Name: spec.Name, TCP: []int{EchoPort}, UDP: []int{EchoPort}, RecordTCP: record})
	if err != nil {
		return nil, nil, fmt.Errorf("serve on %s: %w", spec.Name, err)
	}
	return p, srv, nil
}

// AddService creates a NodePort Service in the default namespace that selects
// selector on EchoPort (TCP), and waits until its EndpointSlices list exactly
// backends.
func AddService(ctx context.Context, w *harness.World, name string, selector map[string]string, backends ...topologies.Pod) (Service, error) {
	return addService(ctx, w, name, corev1.ProtocolTCP, selector, backends)
}

// AddUDPService is AddService for UDP: the Service's one port, ServicePort/UDP,
// selects EchoPort/UDP.
func AddUDPService(ctx context.Context, w *harness.World, name string, selector map[string]string, backends ...topologies.Pod) (Service, error) {
	return addService(ctx, w, name, corev1.ProtocolUDP, selector, backends)
}

func addService(ctx context.Context, w *harness.World, name string, proto corev1.Protocol, selector map[string]string, backends []topologies.Pod) (Service, error) {
	svc, err := topologies.CreateService(ctx, w.Topo.Kube(), &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.ServiceSpec{
			Type:     corev1.ServiceTypeNodePort,
			Selector: selector,
			Ports:    []corev1.ServicePort{{Name: "echo", Port: ServicePort, TargetPort: intstr.FromInt32(EchoPort), Protocol: proto}},
		},
	})
	if err != nil {
		return Service{}, err
	}
	if err := topologies.WaitForEndpoints(ctx, w.Topo.Kube(), svc.Namespace, name, backends...); err != nil {
		return Service{}, err
	}
	return Service{Name: name, Namespace: svc.Namespace, ClusterIP: svc.Spec.ClusterIP, NodePort: svc.Spec.Ports[0].NodePort, Backends: backends}, nil
}

// Flow is a way to reach a backend: from a host, to an address, answered by a
// backend (any, when empty).
type Flow struct {
	Name    string
	From    topologies.Host
	Target  string
	Backend string
}

// Warm says when a flow counts as programmed: Streak new connections in a row, one
// every Interval, reach the right backend within Within.
type Warm struct {
	Streak   int
	Interval time.Duration
	Within   time.Duration
}

// DefaultWarm is the suite's default (conformance.DefaultBudgets holds the same).
var DefaultWarm = Warm{Streak: 20, Interval: 10 * time.Millisecond, Within: 10 * time.Second}

// WaitFlowing waits until new connections on fl reach its backend warm.Streak times
// in a row, within warm.Within. The probe runs through the World, so its attempts are
// on the timeline (and retired when it stops). A flow that does not warm up is an
// ErrNotFlowing; anything else that fails is an error of the run.
func WaitFlowing(ctx context.Context, w *harness.World, fl Flow, warm Warm) error {
	ok := make(chan struct{})
	var (
		mu     sync.Mutex
		streak int
		last   probe.Event
	)
	observe := func(ev probe.Event) {
		if ev.Kind != probe.KindAttempt {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		last = ev
		if ev.Outcome == probe.OK && (fl.Backend == "" || ev.Backend == fl.Backend) {
			streak++
		} else {
			streak = 0
		}
		if streak == warm.Streak {
			close(ok)
		}
	}
	p, err := w.StartProbe(ctx, fl.From, probe.Connect{Name: "warm-up-" + fl.Name, Target: fl.Target, Interval: warm.Interval}, observe)
	if err != nil {
		return err
	}
	defer func() { _ = w.StopProbe(context.WithoutCancel(ctx), p) }()
	select {
	case <-ok:
		return nil
	case <-time.After(warm.Within):
		mu.Lock()
		defer mu.Unlock()
		to := "any backend"
		if fl.Backend != "" {
			to = fl.Backend
		}
		lastText := "none was made"
		if last.Kind != "" {
			lastText = string(last.Outcome)
			if last.Backend != "" {
				lastText += " from " + last.Backend
			}
			if last.Err != "" {
				lastText += " (" + last.Err + ")"
			}
		}
		return fmt.Errorf("%w: %s (%s from %s) did not carry %d connections in a row to %s within %s of the API listing its backends; last attempt: %s",
			ErrNotFlowing, fl.Name, fl.Target, fl.From.Name(), warm.Streak, to, timeline.Duration(warm.Within), lastText)
	case <-ctx.Done():
		return ctx.Err()
	}
}

// WaitUDPFlowing is WaitFlowing for a UDP flow: rounds of warm.Streak datagrams, each
// from a new socket (a new flow for the dataplane) and all at once, until one round
// is answered by fl's backend (any, when empty) in every datagram, from fl.Target's
// address, within warm.Within. A round's datagram waits probe.DefaultReachTimeout
// for its answer. New sockets, because a flow that starts before its Service is
// programmed may be tracked unNATed, and stay so: that is not what a spec measures.
func WaitUDPFlowing(ctx context.Context, w *harness.World, fl Flow, warm Warm) error {
	deadline := time.Now().Add(warm.Within)
	targets := make([]probe.Target, warm.Streak)
	for i := range targets {
		targets[i] = probe.Target{Label: strconv.Itoa(i + 1), Proto: "udp", Addr: fl.Target}
	}
	for round := 1; ; round++ {
		evs, err := w.Reach(ctx, fl.From, probe.Reach{Name: fmt.Sprintf("warm-up-%s-%d", fl.Name, round), Targets: targets, Tries: 1})
		if err != nil {
			return err
		}
		var bad *probe.Event
		for i, e := range evs {
			if e.Outcome != probe.OK || (fl.Backend != "" && e.Backend != fl.Backend) {
				bad = &evs[i]
				break
			}
		}
		if bad == nil {
			return nil
		}
		if time.Now().After(deadline) {
			to := "any backend"
			if fl.Backend != "" {
				to = fl.Backend
			}
			last := string(bad.Outcome)
			if bad.Backend != "" {
				last += " from " + bad.Backend
			}
			if bad.Err != "" {
				last += " (" + bad.Err + ")"
			}
			return fmt.Errorf("%w: %s (UDP to %s from %s): no round of %d datagrams from new sockets was answered by %s in full within %s of the API listing its backends; last round's first miss: %s",
				ErrNotFlowing, fl.Name, fl.Target, fl.From.Name(), warm.Streak, to, timeline.Duration(warm.Within), last)
		}
	}
}

// WaitAllFlowing is WaitFlowing for each flow in turn.
func WaitAllFlowing(ctx context.Context, w *harness.World, warm Warm, flows ...Flow) error {
	for _, fl := range flows {
		if err := WaitFlowing(ctx, w, fl, warm); err != nil {
			return err
		}
	}
	return nil
}
