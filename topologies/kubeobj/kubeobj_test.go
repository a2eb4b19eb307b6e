package kubeobj

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/dpconform/dpconform/topologies"
)

func TestPodObject(t *testing.T) {
	for _, tc := range []struct {
		name     string
		spec     topologies.PodSpec
		wantGate bool
		ports    string
	}{
		{name: "ready", spec: topologies.PodSpec{Name: "a", Node: "n1", Labels: map[string]string{"app": "a"}}},
		{name: "not ready", spec: topologies.PodSpec{Name: "b", Node: "n2", NotReady: true}, wantGate: true},
		{name: "ports", spec: topologies.PodSpec{Name: "c", Node: "n1", Ports: []topologies.ContainerPort{{Name: "http", Port: 80}, {Name: "dns", Port: 53, Protocol: "UDP"}}}, ports: "http/80/TCP dns/53/UDP"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := PodObject(tc.spec, "ns", "img", corev1.PullNever, []string{"/dpconform", "pause"})
			if p.Namespace != "ns" || p.Name != tc.spec.Name || p.Spec.NodeName != tc.spec.Node {
				t.Errorf("pod %s/%s on %s", p.Namespace, p.Name, p.Spec.NodeName)
			}
			if got := len(p.Spec.ReadinessGates) == 1 && p.Spec.ReadinessGates[0].ConditionType == NotReadyCondition; got != tc.wantGate {
				t.Errorf("readiness gate %v, want %v", p.Spec.ReadinessGates, tc.wantGate)
			}
			var ports []string
			for _, cp := range p.Spec.Containers[0].Ports {
				ports = append(ports, cp.Name+"/"+strconv.Itoa(int(cp.ContainerPort))+"/"+string(cp.Protocol))
			}
			if strings.Join(ports, " ") != tc.ports {
				t.Errorf("ports %v, want %s", ports, tc.ports)
			}
			// The spec's labels are copied: a spec changing its map later changes nothing.
			if tc.spec.Labels != nil {
				tc.spec.Labels["app"] = "changed"
				if p.Labels["app"] != "a" {
					t.Errorf("labels share the spec's map")
				}
			}
		})
	}
}

// TestWaitRunning: a pod the kubelet never runs times out with its state in the
// error; one that runs is returned.
func TestWaitRunning(t *testing.T) {
	ctx := context.Background()
	kube := fake.NewClientset(&corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns"},
		Spec:       corev1.PodSpec{NodeName: "n1", Containers: []corev1.Container{{Name: "workload"}}},
		Status: corev1.PodStatus{Phase: corev1.PodPending, ContainerStatuses: []corev1.ContainerStatus{{Name: "workload",
			State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "ErrImageNeverPull"}}}}},
	})
	_, err := WaitRunning(ctx, kube, "ns", "p", false, 300*time.Millisecond)
	if err == nil || !strings.Contains(err.Error(), "ErrImageNeverPull") || !strings.Contains(err.Error(), "on n1") {
		t.Fatalf("error %v, want one naming the node and the waiting reason", err)
	}
	p, _ := kube.CoreV1().Pods("ns").Get(ctx, "p", metav1.GetOptions{})
	p.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.0.0.5",
		ContainerStatuses: []corev1.ContainerStatus{{Name: "workload", State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}}}}
	if _, err := kube.CoreV1().Pods("ns").UpdateStatus(ctx, p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := WaitRunning(ctx, kube, "ns", "p", true, 300*time.Millisecond); err == nil {
		t.Fatalf("a pod that is not Ready passed a wait for Ready")
	}
	got, err := WaitRunning(ctx, kube, "ns", "p", false, 300*time.Millisecond)
	if err != nil || got.Status.PodIP != "10.0.0.5" {
		t.Fatalf("running pod: %v, %v", got, err)
	}
}
