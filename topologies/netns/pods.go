package netns

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/invoke"
	types100 "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/dpconform/dpconform/topologies"
)

// DefaultCNIConfig wires pods with the standard ptp and host-local plugins: a veth per
// pod, a /32 route to it on the node, and addresses from the node's pod CIDR.
const DefaultCNIConfig = `{
  "cniVersion": "1.0.0",
  "name": "dpconform",
  "plugins": [
    {
      "type": "ptp",
      "mtu": 1500,
      "ipMasq": false,
      "ipam": {
        "type": "host-local",
        "ranges": [[{"subnet": "${POD_CIDR}"}]],
        "routes": [{"dst": "0.0.0.0/0"}],
        "dataDir": "${CNI_DATA_DIR}/ipam"
      }
    }
  ]
}`

// loopbackConfig brings a pod's lo up, as container runtimes do before the pod network.
const loopbackConfig = `{"cniVersion": "1.0.0", "name": "loopback", "type": "loopback"}`

// ExpandCNIConfig substitutes the variables a network configuration may use, per node:
// ${POD_CIDR}, ${NODE_NAME}, ${NODE_IP}, ${CNI_DATA_DIR} (a directory private to the
// node and run, for IPAM state), ${KUBECONFIG} (a kubeconfig that works from inside the
// node, DPC_KUBECONFIG) and ${STATE_DIR} (the node's state directory, DPC_STATE_DIR):
// real plugins such as Calico's and Cilium's find the API server and their agent's
// state through the last two. Any other ${...} is an error, so that a typo in an
// implementation's configuration is reported rather than passed to a plugin.
func ExpandCNIConfig(conf []byte, vars map[string]string) ([]byte, error) {
	var unknown []string
	out := os.Expand(string(conf), func(k string) string {
		v, ok := vars[k]
		if !ok {
			unknown = append(unknown, "${"+k+"}")
		}
		return v
	})
	if len(unknown) > 0 {
		return nil, fmt.Errorf("CNI configuration uses unknown variables %s; known: ${POD_CIDR}, ${NODE_NAME}, ${NODE_IP}, ${CNI_DATA_DIR}, ${KUBECONFIG}, ${STATE_DIR}", strings.Join(unknown, ", "))
	}
	return []byte(out), nil
}

// pod is a workload: a network namespace wired by CNI inside its node.
type pod struct {
	host
	namespace   string
	node        *node
	labels      map[string]string
	containerID string
}

func (p *pod) Namespace() string         { return p.namespace }
func (p *pod) NodeName() string          { return p.node.name }
func (p *pod) Labels() map[string]string { return maps.Clone(p.labels) }
func (p *pod) key() string               { return p.namespace + "/" + p.name }
func (p *pod) String() string            { return p.key() + "@" + p.node.name }

// nodeExec runs CNI plugins inside a node (its network, mount and cgroup namespaces),
// so that the host side of a pod's veth lands in the node and a plugin finds its agent
// where the agent runs, as on a real node.
type nodeExec struct {
	*invoke.DefaultExec
	node *node
}

func (e *nodeExec) ExecPlugin(ctx context.Context, pluginPath string, stdin []byte, environ []string) ([]byte, error) {
	return runInNode(ctx, e.node, pluginPath, stdin, environ)
}

func (t *Topology) cniFor(n *node) (*libcni.CNIConfig, *libcni.NetworkConfigList, *libcni.PluginConfig, error) {
	dataDir := filepath.Join(t.dir, "nodes", n.name, "cni")
	conf, err := ExpandCNIConfig(t.cniConf, map[string]string{
		"POD_CIDR":     n.podCIDR.String(),
		"NODE_NAME":    n.name,
		"NODE_IP":      n.ip.String(),
		"CNI_DATA_DIR": dataDir,
		"KUBECONFIG":   t.Kubeconfig(),
		"STATE_DIR":    n.stateDir,
	})
	if err != nil {
		return nil, nil, nil, err
	}
	list, err := libcni.NetworkConfFromBytes(conf)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("parse CNI configuration list: %w", err)
	}
	lo, err := libcni.NetworkPluginConfFromBytes([]byte(loopbackConfig))
	if err != nil {
		return nil, nil, nil, err
	}
	exec := &nodeExec{
		DefaultExec: &invoke.DefaultExec{RawExec: &invoke.RawExec{Stderr: os.Stderr}, PluginDecoder: version.PluginDecoder{}},
		node:        n,
	}
	// The implementation's own plugins first, then the topology's.
	dirs := append(slices.Clone(t.cniDirs), t.bins.CNIDir)
	cni := libcni.NewCNIConfigWithCacheDir(dirs, filepath.Join(dataDir, "cache"), exec)
	return cni, list, lo, nil
}

func (p *pod) runtimeConf() *libcni.RuntimeConf {
	return &libcni.RuntimeConf{
		ContainerID: p.containerID,
		NetNS:       p.NetNSPath(),
		IfName:      "eth0",
		// The arguments kubelet passes, for plugins that look the pod up.
		Args: [][2]string{
			{"IgnoreUnknown", "1"},
			{"K8S_POD_NAMESPACE", p.namespace},
			{"K8S_POD_NAME", p.name},
			{"K8S_POD_INFRA_CONTAINER_ID", p.containerID},
		},
	}
}

// AddPod implements topologies.Topology, in a container runtime's order: the Pod object
// is scheduled to its node, then its sandbox namespace is created and wired by CNI,
// then the kubelet's part (status with IP, Ready) is written.
func (t *Topology) AddPod(ctx context.Context, spec topologies.PodSpec) (_ topologies.Pod, err error) {
	if spec.Name == "" || spec.Node == "" {
		return nil, fmt.Errorf("AddPod: PodSpec needs Name and Node (got %+v)", spec)
	}
	if spec.Namespace == "" {
		spec.Namespace = "default"
	}
	var n *node
	for _, c := range t.nodes {
		if c.name == spec.Node {
			n = c
		}
	}
	if n == nil {
		return nil, fmt.Errorf("AddPod %s: no node %q in this topology", spec.Name, spec.Node)
	}
	p := &pod{
		host:        host{name: spec.Name, netns: t.runID + "-pod-" + spec.Namespace + "-" + spec.Name, timeNS: n.timeNS},
		namespace:   spec.Namespace,
		node:        n,
		labels:      maps.Clone(spec.Labels),
		containerID: t.runID + "-" + spec.Namespace + "-" + spec.Name,
	}
	p.cgroup = n.podCgroup(p)
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return nil, errors.New("AddPod: topology is closed")
	}
	if _, dup := t.pods[p.key()]; dup {
		t.mu.Unlock()
		return nil, fmt.Errorf("AddPod: pod %s already exists", p.key())
	}
	t.pods[p.key()] = p
	t.mu.Unlock()
	defer func() {
		if err != nil {
			t.mu.Lock()
			delete(t.pods, p.key())
			t.mu.Unlock()
			_ = t.teardownPod(context.Background(), p, true, false)
		}
	}()

	if err := ensureNamespace(ctx, t, p.namespace); err != nil {
		return nil, err
	}
	obj, err := t.Kube().CoreV1().Pods(p.namespace).Create(ctx, podObject(spec), metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("create Pod %s: %w", p.key(), err)
	}
	nsh, err := createNamedNS(p.netns)
	if err != nil {
		return nil, err
	}
	nsh.Close()
	if p.cgroup != "" {
		if err := os.Mkdir(p.cgroup, 0o755); err != nil {
			return nil, fmt.Errorf("create the cgroup of pod %s: %w", p.key(), err)
		}
	}
	cni, list, lo, err := t.cniFor(n)
	if err != nil {
		return nil, err
	}
	cniCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if _, err := cni.AddNetwork(cniCtx, lo, p.runtimeConf()); err != nil {
		return nil, fmt.Errorf("CNI ADD loopback for pod %s: %w", p.key(), err)
	}
	res, err := cni.AddNetworkList(cniCtx, list, p.runtimeConf())
	if err != nil {
		return nil, fmt.Errorf("CNI ADD %s for pod %s on %s: %w", list.Name, p.key(), n.name, err)
	}
	r, err := types100.NewResultFromResult(res)
	if err != nil {
		return nil, fmt.Errorf("CNI ADD for pod %s: unreadable result: %w", p.key(), err)
	}
	for _, ip := range r.IPs {
		if a, ok := netip.AddrFromSlice(ip.Address.IP); ok && a.Unmap().Is4() {
			p.ip = a.Unmap()
			break
		}
	}
	if !p.ip.IsValid() {
		return nil, fmt.Errorf("CNI ADD for pod %s returned no IPv4 address: %+v", p.key(), r.IPs)
	}
	if spec.OnWired != nil {
		if err := spec.OnWired(ctx, p); err != nil {
			return nil, fmt.Errorf("pod %s wired: %w", p.key(), err)
		}
	}
	if err := t.writeRunning(ctx, obj, p.ip, n.ip, !spec.NotReady); err != nil {
		return nil, fmt.Errorf("write status of Pod %s: %w", p.key(), err)
	}
	return p, nil
}

// writeRunning writes the status setRunning builds as a strategic-merge patch of the
// status subresource, as a kubelet does (statusutil.PatchPodStatus). A CNI plugin may
// write the Pod during ADD (Calico annotates it with its IPs), so obj's resourceVersion
// is stale by now; a patch carries none, so it needs neither a fresh Get nor a retry
// loop, and it leaves alone what others wrote (metadata, status fields the API server
// set). The UID in the patch is a precondition, so a Pod deleted and recreated under
// the same name meanwhile is not written.
func (t *Topology) writeRunning(ctx context.Context, obj *corev1.Pod, ip, hostIP netip.Addr, ready bool) error {
	obj = obj.DeepCopy()
	setRunning(obj, ip, hostIP, ready)
	patch, err := json.Marshal(map[string]any{
		"metadata": map[string]any{"uid": obj.UID},
		"status":   obj.Status,
	})
	if err != nil {
		return fmt.Errorf("encode status patch: %w", err)
	}
	_, err = t.Kube().CoreV1().Pods(obj.Namespace).Patch(ctx, obj.Name, types.StrategicMergePatchType, patch, metav1.PatchOptions{}, "status")
	return err
}

// RemovePod implements topologies.Topology.
func (t *Topology) RemovePod(ctx context.Context, tp topologies.Pod) error {
	t.mu.Lock()
	p, ok := t.pods[tp.Namespace()+"/"+tp.Name()]
	delete(t.pods, tp.Namespace()+"/"+tp.Name())
	t.mu.Unlock()
	if !ok {
		return fmt.Errorf("RemovePod: no pod %s/%s in this topology", tp.Namespace(), tp.Name())
	}
	return t.teardownPod(ctx, p, true, false)
}

// VanishPod implements topologies.Topology.
func (t *Topology) VanishPod(ctx context.Context, tp topologies.Pod) error {
	t.mu.Lock()
	p, ok := t.pods[tp.Namespace()+"/"+tp.Name()]
	delete(t.pods, tp.Namespace()+"/"+tp.Name())
	t.mu.Unlock()
	if !ok {
		return fmt.Errorf("VanishPod: no pod %s/%s in this topology", tp.Namespace(), tp.Name())
	}
	return t.teardownPod(ctx, p, true, true)
}

// teardownPod stops what runs in the pod, deletes its object (if asked), calls CNI DEL
// and removes its namespace; it goes on past errors and returns them all. With
// networkFirst, CNI DEL comes before the processes are killed: their sockets close
// with no way out, and peers see no FIN or RST.
func (t *Topology) teardownPod(ctx context.Context, p *pod, deleteObject, networkFirst bool) error {
	var errs []error
	kill := func() {
		if _, err := os.Stat(p.NetNSPath()); err == nil {
			if err := killNetNSProcesses([]string{p.NetNSPath()}); err != nil {
				errs = append(errs, err)
			}
		}
	}
	cniDel := func() {
		if _, err := os.Stat(p.NetNSPath()); err != nil {
			return
		}
		cni, list, lo, err := t.cniFor(p.node)
		if err != nil {
			errs = append(errs, err)
			return
		}
		cniCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		if err := cni.DelNetworkList(cniCtx, list, p.runtimeConf()); err != nil {
			errs = append(errs, fmt.Errorf("CNI DEL for pod %s: %w", p.key(), err))
		}
		if err := cni.DelNetwork(cniCtx, lo, p.runtimeConf()); err != nil {
			errs = append(errs, fmt.Errorf("CNI DEL loopback for pod %s: %w", p.key(), err))
		}
	}
	if networkFirst {
		cniDel()
	}
	kill()
	if deleteObject {
		err := t.Kube().CoreV1().Pods(p.namespace).Delete(ctx, p.name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)})
		if err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("delete Pod %s: %w", p.key(), err))
		}
	}
	if !networkFirst {
		cniDel()
	}
	if err := deleteNamedNS(p.netns); err != nil {
		errs = append(errs, err)
	}
	if err := removeCgroupTree(p.cgroup); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

func podObject(spec topologies.PodSpec) *corev1.Pod {
	c := corev1.Container{Name: "workload", Image: "dpconform.invalid/workload:v1"}
	for _, port := range spec.Ports {
		proto := corev1.ProtocolTCP
		if port.Protocol == "UDP" {
			proto = corev1.ProtocolUDP
		}
		c.Ports = append(c.Ports, corev1.ContainerPort{Name: port.Name, ContainerPort: port.Port, Protocol: proto})
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: spec.Name, Namespace: spec.Namespace, Labels: maps.Clone(spec.Labels)},
		Spec: corev1.PodSpec{
			NodeName:                      spec.Node,
			Containers:                    []corev1.Container{c},
			TerminationGracePeriodSeconds: ptr.To[int64](0),
		},
	}
}

// setRunning writes what a kubelet reports for a started pod.
func setRunning(p *corev1.Pod, ip, hostIP netip.Addr, ready bool) {
	now := metav1.Now()
	readyStatus := corev1.ConditionTrue
	if !ready {
		readyStatus = corev1.ConditionFalse
	}
	p.Status = corev1.PodStatus{
		Phase:     corev1.PodRunning,
		PodIP:     ip.String(),
		PodIPs:    []corev1.PodIP{{IP: ip.String()}},
		HostIP:    hostIP.String(),
		HostIPs:   []corev1.HostIP{{IP: hostIP.String()}},
		StartTime: &now,
		Conditions: []corev1.PodCondition{
			{Type: corev1.PodScheduled, Status: corev1.ConditionTrue, LastTransitionTime: now},
			{Type: corev1.PodInitialized, Status: corev1.ConditionTrue, LastTransitionTime: now},
			{Type: corev1.ContainersReady, Status: readyStatus, LastTransitionTime: now},
			{Type: corev1.PodReady, Status: readyStatus, LastTransitionTime: now},
		},
		ContainerStatuses: []corev1.ContainerStatus{{
			Name: "workload", Image: "dpconform.invalid/workload:v1", Ready: ready, Started: ptr.To(true),
			State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: now}},
		}},
	}
}
