package conformance

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/dpconform/dpconform/fv/probe"
	"github.com/dpconform/dpconform/topologies"
)

// Step is one step of a transition. Every step records on the timeline what it did
// and when (stop-sent, exited, start-sent, ready, pod-added, ...), so that a window
// can be placed around it and a failure told relative to it.
type Step struct {
	// Name says what the step does, for progress and errors.
	Name string
	Do   func(ctx context.Context, e *Env) error
}

// Names of the transition events that the Kubernetes steps record.
const (
	EventPodAdded     = "pod-added"
	EventPodRemoved   = "pod-removed"
	EventServerStop   = "server-stopped"
	EventObjectChange = "object-changed"
)

// Restart stops the agent on n gracefully (SIGTERM), starts it and waits until it is
// ready again.
func Restart(n topologies.Node) Step {
	return Step{"graceful restart of the agent on " + n.Name(), func(ctx context.Context, e *Env) error {
		return e.World.Restart(ctx, n, false)
	}}
}

// Crash kills the agent on n (SIGKILL), starts it and waits until it is ready again.
func Crash(n topologies.Node) Step {
	return Step{"SIGKILL and start of the agent on " + n.Name(), func(ctx context.Context, e *Env) error {
		return e.World.Restart(ctx, n, true)
	}}
}

// UpgradeAgent stops the agent on n gracefully (or, if crash, kills it) and starts it
// with the spec's Setup.Upgrade options (another version, other settings), then
// waits until it is ready; later starts of n keep those options. Each step is
// recorded, start-sent with the start call it made.
func UpgradeAgent(n topologies.Node, crash bool) Step {
	how := "graceful stop"
	if crash {
		how = "SIGKILL"
	}
	return Step{"upgrade the agent on " + n.Name() + " (" + how + ", then a start with the spec's upgrade options)", func(ctx context.Context, e *Env) error {
		return e.World.Upgrade(ctx, n, crash, e.upgrade)
	}}
}

// RollBackAgent stops the agent on n gracefully and starts it with the spec's
// Setup.Start options again (what it ran before an UpgradeAgent: the upgrade rolled
// back), then waits until it is ready; later starts of n keep those options.
func RollBackAgent(n topologies.Node) Step {
	return Step{"roll back the agent on " + n.Name() + " (graceful stop, then a start with the spec's start options)", func(ctx context.Context, e *Env) error {
		return e.World.Upgrade(ctx, n, false, e.World.StartOptions)
	}}
}

// ReleaseHeld tells the traffic's connect probes with Hold to hold no more of the
// connections they open (harness.World.ReleaseHeld), recording holds-released:
// what was opened up to now is held to the end and checked then.
func ReleaseHeld() Step {
	return Step{"stop holding new connections", func(_ context.Context, e *Env) error { return e.World.ReleaseHeld() }}
}

// Stop stops the agent on n gracefully and returns once it has exited.
func Stop(n topologies.Node) Step {
	return Step{"stop the agent on " + n.Name(), func(ctx context.Context, e *Env) error { return e.World.Stop(ctx, n) }}
}

// Kill crashes the agent on n.
func Kill(n topologies.Node) Step {
	return Step{"kill the agent on " + n.Name(), func(ctx context.Context, e *Env) error { return e.World.Kill(ctx, n) }}
}

// Start starts the agent on n with the spec's start options and waits until it is
// ready.
func Start(n topologies.Node) Step {
	return Step{"start the agent on " + n.Name(), func(ctx context.Context, e *Env) error {
		if err := e.World.Start(ctx, n); err != nil {
			return err
		}
		return e.World.WaitReady(ctx, n)
	}}
}

// Switch hands node n over from the real kube-proxy (which the spec's Setup started
// there) to the implementation: kube-proxy stops and leaves its rules and conntrack
// state, then the implementation starts and becomes ready.
func Switch(n topologies.Node) Step {
	return Step{"switch " + n.Name() + " from kube-proxy to the implementation", func(ctx context.Context, e *Env) error {
		return e.World.Switch(ctx, n)
	}}
}

// AddPod adds a pod as a runtime and kubelet would and records pod-added once its
// status is written; if into is not nil it receives the pod.
func AddPod(spec topologies.PodSpec, into *topologies.Pod) Step {
	return Step{"add pod " + spec.Name, func(ctx context.Context, e *Env) error {
		p, err := e.Topo.AddPod(ctx, spec)
		if err != nil {
			return err
		}
		e.Record(EventPodAdded, spec.Name)
		if into != nil {
			*into = p
		}
		return nil
	}}
}

// RemovePod deletes a pod and its network, recording pod-removed when it is gone.
func RemovePod(p topologies.Pod) Step {
	return Step{"remove pod " + p.Name(), func(ctx context.Context, e *Env) error {
		if err := e.Topo.RemovePod(ctx, p); err != nil {
			return err
		}
		e.Record(EventPodRemoved, p.Name())
		return nil
	}}
}

// VanishPod removes a pod as a lost sandbox does, its network first so that its
// peers hear no FIN or RST (topologies.Topology.VanishPod), recording pod-removed
// when it is gone.
func VanishPod(p topologies.Pod) Step {
	return Step{"vanish pod " + p.Name(), func(ctx context.Context, e *Env) error {
		if err := e.World.VanishPod(ctx, p); err != nil {
			return err
		}
		e.Record(EventPodRemoved, p.Name())
		return nil
	}}
}

// StopServer stops a workload's server, closing its sockets as a kubelet stopping
// the container does, and records server-stopped.
func StopServer(srv *probe.Process) Step {
	return Step{"stop the server " + srv.Name(), func(ctx context.Context, e *Env) error {
		if err := srv.Stop(ctx); err != nil {
			return fmt.Errorf("stop the server %s: %w", srv.Name(), err)
		}
		e.Record(EventServerStop, srv.Name())
		return nil
	}}
}

// Record records a transition event of the spec's own (e.g. backend-removed, before
// the steps that remove it).
func Record(name, detail string) Step {
	return Step{"record " + name, func(_ context.Context, e *Env) error {
		e.Record(name, detail)
		return nil
	}}
}

// Pause waits d: the spacing between steps a spec makes on purpose (changes a
// fixed time apart), never a wait for the implementation, which is on an event.
func Pause(d time.Duration) Step {
	return Step{"pause " + d.String(), func(ctx context.Context, _ *Env) error { return sleep(ctx, d) }}
}

// Do is a step of the spec's own; fn records its events.
func Do(name string, fn func(ctx context.Context, e *Env) error) Step { return Step{name, fn} }

// Apply creates obj, or updates it if it exists, and records object-changed. It
// takes the kinds that specs change: Services and NetworkPolicies.
func Apply(obj runtime.Object) Step {
	return Step{"apply " + describe(obj), func(ctx context.Context, e *Env) error {
		kube := e.Topo.Kube()
		var err error
		switch o := obj.(type) {
		case *corev1.Service:
			svcs := kube.CoreV1().Services(nsOr(o.Namespace))
			if _, err = svcs.Create(ctx, o, metav1.CreateOptions{}); apierrors.IsAlreadyExists(err) {
				var cur *corev1.Service
				if cur, err = svcs.Get(ctx, o.Name, metav1.GetOptions{}); err == nil {
					o = o.DeepCopy()
					o.ResourceVersion = cur.ResourceVersion
					o.Spec.ClusterIP, o.Spec.ClusterIPs = cur.Spec.ClusterIP, cur.Spec.ClusterIPs
					_, err = svcs.Update(ctx, o, metav1.UpdateOptions{})
				}
			}
		case *networkingv1.NetworkPolicy:
			nps := kube.NetworkingV1().NetworkPolicies(nsOr(o.Namespace))
			if _, err = nps.Create(ctx, o, metav1.CreateOptions{}); apierrors.IsAlreadyExists(err) {
				var cur *networkingv1.NetworkPolicy
				if cur, err = nps.Get(ctx, o.Name, metav1.GetOptions{}); err == nil {
					o = o.DeepCopy()
					o.ResourceVersion = cur.ResourceVersion
					_, err = nps.Update(ctx, o, metav1.UpdateOptions{})
				}
			}
		default:
			return fmt.Errorf("apply: %T is not a kind the steps change (Service, NetworkPolicy)", obj)
		}
		if err != nil {
			return fmt.Errorf("apply %s: %w", describe(obj), err)
		}
		e.Record(EventObjectChange, "applied "+describe(obj))
		return nil
	}}
}

// Delete deletes obj (a Service or a NetworkPolicy) and records object-changed.
func Delete(obj runtime.Object) Step {
	return Step{"delete " + describe(obj), func(ctx context.Context, e *Env) error {
		kube := e.Topo.Kube()
		var err error
		switch o := obj.(type) {
		case *corev1.Service:
			err = kube.CoreV1().Services(nsOr(o.Namespace)).Delete(ctx, o.Name, metav1.DeleteOptions{})
		case *networkingv1.NetworkPolicy:
			err = kube.NetworkingV1().NetworkPolicies(nsOr(o.Namespace)).Delete(ctx, o.Name, metav1.DeleteOptions{})
		default:
			return fmt.Errorf("delete: %T is not a kind the steps change (Service, NetworkPolicy)", obj)
		}
		if err != nil {
			return fmt.Errorf("delete %s: %w", describe(obj), err)
		}
		e.Record(EventObjectChange, "deleted "+describe(obj))
		return nil
	}}
}

func describe(obj runtime.Object) string {
	m, err := meta.Accessor(obj)
	if err != nil {
		return fmt.Sprintf("%T", obj)
	}
	kind := fmt.Sprintf("%T", obj)
	switch obj.(type) {
	case *corev1.Service:
		kind = "Service"
	case *networkingv1.NetworkPolicy:
		kind = "NetworkPolicy"
	}
	return kind + " " + nsOr(m.GetNamespace()) + "/" + m.GetName()
}

func nsOr(ns string) string {
	if ns == "" {
		return "default"
	}
	return ns
}
