package kind

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/vishvananda/netlink"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dpconform/dpconform/driver/proc"
	"github.com/dpconform/dpconform/topologies"
	"github.com/dpconform/dpconform/topologies/kind/nodeimage"
	"github.com/dpconform/dpconform/topologies/kubeobj"
)

// NotReadyCondition is the readiness gate of a pod added with PodSpec.NotReady: no one
// sets it, so the kubelet keeps the pod not Ready.
const NotReadyCondition = kubeobj.NotReadyCondition

// pod is a real pod run by a node's kubelet, its one container the probe image.
type pod struct {
	t         *Topology
	name      string
	namespace string
	node      *node
	labels    map[string]string
	ip        netip.Addr
	container string // the workload container's ID

	mu    sync.Mutex
	pid   int         // the workload container's process, as the host sees it
	procs []*exec.Cmd // what Start started in the pod
}

var _ topologies.Pod = (*pod)(nil)

func (p *pod) Name() string              { return p.name }
func (p *pod) Namespace() string         { return p.namespace }
func (p *pod) NodeName() string          { return p.node.name }
func (p *pod) Labels() map[string]string { return maps.Clone(p.labels) }
func (p *pod) IP() netip.Addr            { return p.ip }
func (p *pod) key() string               { return p.namespace + "/" + p.name }
func (p *pod) hostPID() (int, error)     { return p.pid, nil }

// Start implements topologies.Host: cmd runs in the pod's container (its mount,
// UTS, IPC and network namespaces, the image's filesystem), a child of the caller.
func (p *pod) Start(cmd *exec.Cmd) error {
	if err := enter(p, cmd); err != nil {
		return err
	}
	p.mu.Lock()
	p.procs = append(p.procs, cmd)
	p.mu.Unlock()
	return nil
}

// AddPod implements topologies.Topology: the Pod goes to the API with its node named,
// and the node's kubelet runs it (containerd makes the sandbox and calls the
// implementation's CNI). AddPod returns once the kubelet has written the pod's IP and
// its readiness (Ready, or not for spec.NotReady).
//
// spec.OnWired cannot be served: a probe could start only once the kubelet has said
// where the pod is, which is what OnWired exists to precede. Such a spec is refused
// with topologies.ErrUnsupported.
func (t *Topology) AddPod(ctx context.Context, spec topologies.PodSpec) (topologies.Pod, error) {
	if spec.OnWired != nil {
		return nil, fmt.Errorf("%w: on kind the kubelet writes a pod's status, so no probe can start in pod %s before the API says where it is (PodSpec.OnWired)", topologies.ErrUnsupported, spec.Name)
	}
	if spec.Name == "" || spec.Node == "" {
		return nil, errors.New("PodSpec needs a Name and a Node")
	}
	if spec.Namespace == "" {
		spec.Namespace = "default"
	}
	n, ok := t.Node(spec.Node).(*node)
	if !ok {
		return nil, fmt.Errorf("pod %s: no node %q in this topology", spec.Name, spec.Node)
	}
	if err := t.ensureNamespace(ctx, spec.Namespace); err != nil {
		return nil, err
	}
	obj := t.podObject(spec)
	if _, err := t.c.kube.CoreV1().Pods(spec.Namespace).Create(ctx, obj, metav1.CreateOptions{}); err != nil {
		return nil, fmt.Errorf("create Pod %s/%s: %w", spec.Namespace, spec.Name, err)
	}
	p := &pod{t: t, name: spec.Name, namespace: spec.Namespace, node: n, labels: maps.Clone(spec.Labels)}
	t.mu.Lock()
	t.pods[p.key()] = p
	t.mu.Unlock()
	if err := t.waitRunning(ctx, p, !spec.NotReady); err != nil {
		return nil, errors.Join(err, t.RemovePod(context.WithoutCancel(ctx), p))
	}
	return p, nil
}

func (t *Topology) ensureNamespace(ctx context.Context, name string) error {
	_, err := kubeobj.EnsureNamespace(ctx, t.c.kube, name, nil)
	return err
}

func (t *Topology) podObject(spec topologies.PodSpec) *corev1.Pod {
	return kubeobj.PodObject(spec, spec.Namespace, t.c.probeImage, corev1.PullNever, []string{t.c.probe, "pause"})
}

// waitRunning waits for the kubelet's status: the pod's IP, its container running
// (and Ready, if ready), then finds the container's process.
func (t *Topology) waitRunning(ctx context.Context, p *pod, ready bool) error {
	wctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	last, err := kubeobj.WaitRunning(wctx, t.c.kube, p.namespace, p.name, ready, 60*time.Second)
	if err != nil {
		return err
	}
	ip, err := netip.ParseAddr(last.Status.PodIP)
	if err != nil {
		return fmt.Errorf("pod %s: IP %q: %w", p.key(), last.Status.PodIP, err)
	}
	p.ip = ip
	_, p.container, _ = strings.Cut(last.Status.ContainerStatuses[0].ContainerID, "://")
	// The runtime says running once it has told runc to start the container, and
	// runc's init may not have executed the program yet: wait for the program.
	for {
		pid, err := containerPID(p.container, []byte(t.c.probe+"\x00pause\x00"))
		if err == nil {
			p.pid = pid
			return nil
		}
		select {
		case <-wctx.Done():
			return fmt.Errorf("pod %s: %w", p.key(), err)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// RemovePod implements topologies.Topology as a kubelet removes a pod: what was
// started in it stops (its sockets close while the pod's interface is there, so peers
// see FIN or RST), then the Pod is deleted and the kubelet stops the container and
// tears the sandbox down (CNI DEL); RemovePod returns once the Pod is gone.
func (t *Topology) RemovePod(ctx context.Context, tp topologies.Pod) error {
	p, err := t.ours(tp)
	if err != nil {
		return err
	}
	return t.teardown(ctx, p, false)
}

// VanishPod implements topologies.Topology as a lost sandbox goes: the pod's
// interface goes first (the veth pair, so the node's side too), then what was
// started in it dies with no interface to send a FIN or RST on, then the Pod is
// deleted and the kubelet cleans up (its CNI DEL finds the interface gone).
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
		if err := withLink(p, "eth0", func(h *netlink.Handle, l netlink.Link) error { return h.LinkDel(l) }); err != nil {
			errs = append(errs, fmt.Errorf("vanish pod %s: delete its interface: %w", p.key(), err))
		}
	}
	p.mu.Lock()
	procs := p.procs
	p.procs = nil
	p.mu.Unlock()
	for _, cmd := range procs {
		if cmd.Process != nil {
			_ = cmd.Process.Signal(syscall.SIGKILL)
		}
	}
	// The processes are the caller's children, reaped by whoever waits on them; a
	// zombie holds no socket, so gone means not alive or a zombie.
	deadline := time.Now().Add(10 * time.Second)
	for _, cmd := range procs {
		for cmd.Process != nil && proc.Alive(cmd.Process.Pid) && !zombie(cmd.Process.Pid) {
			if time.Now().After(deadline) {
				errs = append(errs, fmt.Errorf("pod %s: process %d did not exit after SIGKILL", p.key(), cmd.Process.Pid))
				break
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	if err := kubeobj.DeletePod(ctx, t.c.kube, p.namespace, p.name, 60*time.Second, func() bool {
		return p.pid == 0 || !proc.Alive(p.pid) || zombie(p.pid)
	}); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

func zombie(pid int) bool {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return true
	}
	// pid (comm) S ...: the state follows the last ')'.
	i := bytes.LastIndexByte(data, ')')
	return i < 0 || i+2 >= len(data) || data[i+2] == 'Z' || data[i+2] == 'X'
}

// baseImage is what an implementation's image can be built on offline: the node
// image's Debian root filesystem (iptables, nftables, iproute2).
func baseImage() string { return nodeimage.RootfsTag() }
