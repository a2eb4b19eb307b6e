// Package specs holds the conformance specs, one file each, registered into the
// conformance registry from their init functions. Importing it for its side effects
// registers the whole catalogue.
package specs

import (
	"context"
	"net"
	"strconv"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/dpconform/dpconform/conformance"
	"github.com/dpconform/dpconform/fv/driver"
	"github.com/dpconform/dpconform/fv/probe"
	"github.com/dpconform/dpconform/topologies"
)

// EchoPort is where backends serve; ServicePort is the Services' port.
const (
	EchoPort    = 8080
	ServicePort = 80
)

// service is a Service as the fixture created it.
type service struct {
	name      string
	clusterIP string
	nodePort  int32
	backends  []topologies.Pod
}

// clusterIPAddr is the Service's ClusterIP:port.
func (s service) clusterIPAddr() string {
	return net.JoinHostPort(s.clusterIP, strconv.Itoa(ServicePort))
}

// nodePortAddr is node's IP with the Service's node port.
func (s service) nodePortAddr(n topologies.Node) string {
	return net.JoinHostPort(n.IP().String(), strconv.Itoa(int(s.nodePort)))
}

// fixture is the common world of the Core specs: the node under transition (node-a)
// with a backend and a client pod, a backend on node-b, and a NodePort Service for
// each backend.
type fixture struct {
	nodeA, nodeB  topologies.Node
	client        topologies.Pod // on node-a
	local, remote topologies.Pod // backends on node-a and node-b
	svcLocal      service        // selects only local
	svcRemote     service        // selects only remote
}

// addBackend adds a pod on node that serves TCP on EchoPort under its own name.
func addBackend(ctx context.Context, e *conformance.Env, name, node string, labels map[string]string) (topologies.Pod, error) {
	p, err := e.Topo.AddPod(ctx, topologies.PodSpec{Name: name, Node: node, Labels: labels,
		Ports: []topologies.ContainerPort{{Name: "echo", Port: EchoPort}}})
	if err != nil {
		return nil, conformance.Environmentf("add pod %s: %v", name, err)
	}
	if _, err := e.World.StartProbe(ctx, p, probe.Serve{Name: name, TCP: []int{EchoPort}}); err != nil {
		return nil, conformance.Environmentf("serve on %s: %v", name, err)
	}
	return p, nil
}

// addService creates a NodePort Service selecting selector and waits until its
// EndpointSlices list backends.
func addService(ctx context.Context, e *conformance.Env, name string, selector map[string]string, backends ...topologies.Pod) (service, error) {
	svc, err := topologies.CreateService(ctx, e.Topo.Kube(), &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.ServiceSpec{
			Type:     corev1.ServiceTypeNodePort,
			Selector: selector,
			Ports:    []corev1.ServicePort{{Name: "echo", Port: ServicePort, TargetPort: intstr.FromInt32(EchoPort), Protocol: corev1.ProtocolTCP}},
		},
	})
	if err != nil {
		return service{}, conformance.Environmentf("%v", err)
	}
	if err := topologies.WaitForEndpoints(ctx, e.Topo.Kube(), "default", name, backends...); err != nil {
		return service{}, conformance.Environmentf("%v", err)
	}
	return service{name: name, clusterIP: svc.Spec.ClusterIP, nodePort: svc.Spec.Ports[0].NodePort, backends: backends}, nil
}

// deploy builds the fixture.
func deploy(ctx context.Context, e *conformance.Env) (*fixture, error) {
	nodes := e.Topo.Nodes()
	if len(nodes) < 2 {
		return nil, conformance.Environmentf("the Core specs need 2 nodes, the topology has %d", len(nodes))
	}
	f := &fixture{nodeA: nodes[0], nodeB: nodes[1]}
	var err error
	if f.local, err = addBackend(ctx, e, "web-local", f.nodeA.Name(), map[string]string{"app": "web-local"}); err != nil {
		return nil, err
	}
	if f.remote, err = addBackend(ctx, e, "web-remote", f.nodeB.Name(), map[string]string{"app": "web-remote"}); err != nil {
		return nil, err
	}
	if f.client, err = e.Topo.AddPod(ctx, topologies.PodSpec{Name: "client", Node: f.nodeA.Name()}); err != nil {
		return nil, conformance.Environmentf("add pod client: %v", err)
	}
	if f.svcLocal, err = addService(ctx, e, "web-local", map[string]string{"app": "web-local"}, f.local); err != nil {
		return nil, err
	}
	if f.svcRemote, err = addService(ctx, e, "web-remote", map[string]string{"app": "web-remote"}, f.remote); err != nil {
		return nil, err
	}
	for _, fl := range []struct {
		name    string
		from    topologies.Host
		target  string
		backend string
	}{
		{"clusterip-local", f.client, f.svcLocal.clusterIPAddr(), f.local.Name()},
		{"clusterip-remote", f.client, f.svcRemote.clusterIPAddr(), f.remote.Name()},
		{"nodeport-local", e.Topo.External(), f.svcLocal.nodePortAddr(f.nodeA), f.local.Name()},
		{"nodeport-remote", e.Topo.External(), f.svcRemote.nodePortAddr(f.nodeA), f.remote.Name()},
	} {
		if err := waitFlowing(ctx, e, fl.from, fl.name, fl.target, fl.backend); err != nil {
			return nil, err
		}
	}
	return f, nil
}

// restart restarts node's agent (crash: SIGKILL) and fails the spec if it does not
// come back ready.
func restart(ctx context.Context, e *conformance.Env, n topologies.Node, crash bool) error {
	if err := e.World.Restart(ctx, n, crash); err != nil {
		return implementationOr(err, "the agent on %s did not come back ready after the restart: %v", n.Name(), err)
	}
	return nil
}

// implementationOr passes driver errors on and charges anything else to the
// implementation.
func implementationOr(err error, format string, args ...any) error {
	if driver.IsDriverError(err) {
		return err
	}
	return conformance.Failf(format, args...)
}

func how(crash bool) string {
	if crash {
		return "SIGKILL and start"
	}
	return "graceful restart"
}

// warmStreak is how many consecutive new connections must succeed for a flow to count
// as programmed.
const warmStreak = 20

// waitFlowing waits until new connections from h to target reach backend (any, if
// empty) warmStreak times in a row, within the Programmed budget. Specs start their
// measurement only then: programming a new Service takes an implementation a while,
// and that is not what they measure.
func waitFlowing(ctx context.Context, e *conformance.Env, h topologies.Host, name, target, backend string) error {
	ok := make(chan struct{})
	streak := 0
	var last probe.Event
	var mu sync.Mutex
	onEvent := func(ev probe.Event) {
		if ev.Kind != probe.KindAttempt {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		last = ev
		if ev.Outcome == probe.OK && (backend == "" || ev.Backend == backend) {
			streak++
		} else {
			streak = 0
		}
		if streak == warmStreak {
			close(ok)
		}
	}
	p, err := probe.Start(ctx, h, e.World.Probe, probe.Connect{Name: "warm-up-" + name, Target: target, Interval: 10 * time.Millisecond},
		probe.Options{OnEvent: onEvent, Stderr: e.World.ProbeStderr})
	if err != nil {
		return conformance.Environmentf("%v", err)
	}
	defer p.Stop(context.Background())
	select {
	case <-ok:
		return nil
	case <-time.After(e.Budgets.Programmed):
		mu.Lock()
		defer mu.Unlock()
		return conformance.PreconditionFailf("%s (%s from %s) did not carry %d connections in a row to %s within %s of its EndpointSlices listing it; last attempt: %s %s %s",
			name, target, h.Name(), warmStreak, backend, e.Budgets.Programmed, last.Outcome, last.Backend, last.Err)
	case <-ctx.Done():
		return ctx.Err()
	}
}
