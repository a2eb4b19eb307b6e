// Package kubeobj holds the Kubernetes objects and waits that the providers whose
// pods are real pods (kind, an existing cluster) share: a spec's pod as a Pod object,
// the wait for the kubelet to run it, its removal, and the namespaces specs name.
package kubeobj

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"maps"
	"os"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/dpconform/dpconform/topologies"
)

// NotReadyCondition is the readiness gate of a pod added with PodSpec.NotReady: no one
// sets it, so the kubelet keeps the pod not Ready.
const NotReadyCondition = "dpconform.io/not-ready"

// PodObject is spec as a Pod: one container, "workload", running command from image,
// with the ports spec declares and, for spec.NotReady, a readiness gate no one sets.
// The pod is bound to spec.Node (no scheduler decides) and ends in a second.
func PodObject(spec topologies.PodSpec, namespace, image string, pull corev1.PullPolicy, command []string) *corev1.Pod {
	c := corev1.Container{Name: "workload", Image: image, ImagePullPolicy: pull, Command: command}
	for _, port := range spec.Ports {
		proto := corev1.ProtocolTCP
		if port.Protocol == "UDP" {
			proto = corev1.ProtocolUDP
		}
		c.Ports = append(c.Ports, corev1.ContainerPort{Name: port.Name, ContainerPort: port.Port, Protocol: proto})
	}
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: spec.Name, Namespace: namespace, Labels: maps.Clone(spec.Labels)},
		Spec: corev1.PodSpec{
			NodeName:                      spec.Node,
			Containers:                    []corev1.Container{c},
			TerminationGracePeriodSeconds: ptr.To[int64](1),
			EnableServiceLinks:            ptr.To(false),
			AutomountServiceAccountToken:  ptr.To(false),
			// A node under test may carry taints (a control-plane node): the spec
			// chose the node, so the pod goes there.
			Tolerations: []corev1.Toleration{{Operator: corev1.TolerationOpExists}},
		},
	}
	if spec.NotReady {
		p.Spec.ReadinessGates = []corev1.PodReadinessGate{{ConditionType: NotReadyCondition}}
	}
	return p
}

// WaitRunning waits up to timeout for the kubelet's status of a pod: its IP, every
// container running, and Ready if ready. It returns the pod as last read.
func WaitRunning(ctx context.Context, kube kubernetes.Interface, namespace, name string, ready bool, timeout time.Duration) (*corev1.Pod, error) {
	wctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var last *corev1.Pod
	var err error
	for {
		last, err = kube.CoreV1().Pods(namespace).Get(wctx, name, metav1.GetOptions{})
		if err == nil && last.Status.PodIP != "" && running(last) && (!ready || PodReady(last)) {
			return last, nil
		}
		node := ""
		if last != nil {
			node = last.Spec.NodeName
		}
		select {
		case <-wctx.Done():
			return nil, fmt.Errorf("pod %s/%s on %s did not run (last error: %v; status: %s): %w", namespace, name, node, err, PodState(last), wctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func running(p *corev1.Pod) bool {
	if len(p.Status.ContainerStatuses) != len(p.Spec.Containers) {
		return false
	}
	for _, c := range p.Status.ContainerStatuses {
		if c.State.Running == nil {
			return false
		}
	}
	return true
}

// PodReady reports whether the pod's Ready condition is true.
func PodReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// PodState says, for an error message, where a pod is: its phase, IP, waiting or
// terminated containers and the conditions that are not true.
func PodState(p *corev1.Pod) string {
	if p == nil {
		return "none"
	}
	s := fmt.Sprintf("phase %s, IP %q", p.Status.Phase, p.Status.PodIP)
	for _, c := range p.Status.ContainerStatuses {
		switch {
		case c.State.Waiting != nil:
			s += fmt.Sprintf(", %s waiting: %s %s", c.Name, c.State.Waiting.Reason, c.State.Waiting.Message)
		case c.State.Terminated != nil:
			s += fmt.Sprintf(", %s terminated: %s", c.Name, c.State.Terminated.Reason)
		}
	}
	for _, c := range p.Status.Conditions {
		if c.Status != corev1.ConditionTrue && c.Message != "" {
			s += fmt.Sprintf(", %s: %s", c.Type, c.Message)
		}
	}
	return s
}

// DeletePod deletes a pod at once (no grace period) and waits up to timeout until
// the API no longer has it; gone, if not nil, must also hold (e.g. its process exited).
func DeletePod(ctx context.Context, kube kubernetes.Interface, namespace, name string, timeout time.Duration, gone func() bool) error {
	pods := kube.CoreV1().Pods(namespace)
	var errs error
	if err := pods.Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}); err != nil && !apierrors.IsNotFound(err) {
		errs = fmt.Errorf("delete Pod %s/%s: %w", namespace, name, err)
	}
	wctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		_, err := pods.Get(wctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) && (gone == nil || gone()) {
			return errs
		}
		select {
		case <-wctx.Done():
			return fmt.Errorf("pod %s/%s is not gone: %w (%v)", namespace, name, wctx.Err(), errs)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// EnsureNamespace creates a namespace with labels unless it exists, and returns
// whether it created it.
func EnsureNamespace(ctx context.Context, kube kubernetes.Interface, name string, labels map[string]string) (bool, error) {
	_, err := kube.CoreV1().Namespaces().Get(ctx, name, metav1.GetOptions{})
	if err == nil {
		return false, nil
	}
	if !apierrors.IsNotFound(err) {
		return false, fmt.Errorf("namespace %s: %w", name, err)
	}
	_, err = kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("create namespace %s: %w", name, err)
	}
	return true, nil
}

// WaitNamespacesGone waits until none of names is left (a namespace goes once its
// objects have), so a next spec may reuse the names.
func WaitNamespacesGone(ctx context.Context, kube kubernetes.Interface, names []string) error {
	for {
		var left []string
		for _, n := range names {
			_, err := kube.CoreV1().Namespaces().Get(ctx, n, metav1.GetOptions{})
			if err == nil || !apierrors.IsNotFound(err) {
				left = append(left, n)
			}
		}
		if len(left) == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("namespaces %v are not gone: %w", left, ctx.Err())
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// ProbeImage is the name of the image that holds only the probe binary bin, at its
// path: a digest of the binary and its path, so a rebuilt or moved binary gets an image
// of its own. The kind topology builds and loads it; on another cluster it is the
// default image reference, which a vendor mirrors.
func ProbeImage(bin string) (string, error) {
	data, err := os.ReadFile(bin)
	if err != nil {
		return "", fmt.Errorf("probe binary: %w", err)
	}
	sum := sha256.Sum256(append([]byte(bin+"\x00"), data...))
	return "dpconform.local/probe:" + hex.EncodeToString(sum[:])[:16], nil
}
