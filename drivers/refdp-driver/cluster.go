package main

// DPC_TOPOLOGY=cluster: refdp on a cluster the suite knows only by its kubeconfig,
// as on kind a DaemonSet, and everything else through the API, since the driver runs
// on a machine that is not a node:
//
//   - start makes sure of refdp's service account and its read-only ClusterRole (and
//     binding, labelled with the run: the topology removes them with the run), the
//     DaemonSet in the run's namespace (DPC_NAMESPACE) from DPC_REFDP_IMAGE (default:
//     the image the kind mode builds and loads, dpconform.local/refdp:<digest>), and
//     labels the node; the agent reaches the API server at the address the
//     `kubernetes` Service's endpoints give, since refdp is what implements the
//     Service's ClusterIP.
//   - status is the agent's pod on the node: running, and Ready by its readiness
//     probe, which reads the status file the agent writes.
//   - stop removes the node's label and waits until the pod is gone (SIGTERM, then
//     the pod's grace period, as the kubelet stops any pod).
//   - kill is a crash: SIGKILL to the agent's process, from inside its pod (the pod
//     shares one PID namespace, so the agent is not its init); its kubelet restarts
//     the container.
//   - collect saves the agent's logs; cleanup stops it and runs `refdp cleanup` on
//     the node in a one-shot privileged pod of the same image.
//   - events (the policy verdicts in the node's bpffs) is not offered here: the
//     Observability profile needs a netns or kind topology.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/remotecommand"
	utilexec "k8s.io/client-go/util/exec"
	"k8s.io/utils/ptr"

	"github.com/dpconform/dpconform/driver/skel"
	"github.com/dpconform/dpconform/reference/agent"
	"github.com/dpconform/dpconform/reference/faults"
)

const (
	clusterStateDir = "/run/refdp"
	// clusterNodeLabel selects the nodes the DaemonSet runs on; its value is the run.
	clusterNodeLabel = "dpconform.io/refdp-run"
	runLabel         = "dpconform.io/run"
)

func onCluster(n skel.Node) bool { return n.Topology == "cluster" }

// clusterEnv is a cluster call's environment: the run's namespace and a client.
type clusterEnv struct {
	skel.Node
	namespace string
	kube      kubernetes.Interface
	kubeconf  string
}

func clusterEnvOf(n skel.Node) (clusterEnv, error) {
	ns := os.Getenv("DPC_NAMESPACE")
	if ns == "" {
		return clusterEnv{}, skel.Fail("bad environment", "DPC_NAMESPACE is empty: on DPC_TOPOLOGY=cluster, the topology names the run's namespace, where refdp's DaemonSet goes")
	}
	kube, err := kubeFor(n)
	if err != nil {
		return clusterEnv{}, skel.Fail("bad environment", "DPC_KUBECONFIG=%s: %w", n.Kubeconfig, err)
	}
	return clusterEnv{Node: n, namespace: ns, kube: kube, kubeconf: n.Kubeconfig}, nil
}

// clusterImage is the agent's image: DPC_REFDP_IMAGE, else the one the kind mode
// builds from the refdp binary next to the driver.
func clusterImage() (string, error) {
	if img := os.Getenv("DPC_REFDP_IMAGE"); img != "" {
		return img, nil
	}
	bin, err := agentBinary()
	if err != nil {
		return "", err
	}
	img, _, err := kindImage(bin)
	return img, err
}

// apiEndpoint is an address of the API server that a host-network pod reaches
// without a Service: the `kubernetes` Service's endpoint.
func apiEndpoint(ctx context.Context, kube kubernetes.Interface) (string, string, error) {
	slices, err := kube.DiscoveryV1().EndpointSlices("default").List(ctx, metav1.ListOptions{LabelSelector: "kubernetes.io/service-name=kubernetes"})
	if err != nil {
		return "", "", err
	}
	for _, s := range slices.Items {
		for _, ep := range s.Endpoints {
			for _, p := range s.Ports {
				if len(ep.Addresses) > 0 && p.Port != nil {
					return ep.Addresses[0], fmt.Sprint(*p.Port), nil
				}
			}
		}
	}
	return "", "", errors.New("the kubernetes Service has no endpoint")
}

func (c clusterEnv) rbac(ctx context.Context) error {
	name := "refdp-" + c.Run
	labels := map[string]string{runLabel: c.Run}
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: kindName, Namespace: c.namespace, Labels: labels}}
	if _, err := c.kube.CoreV1().ServiceAccounts(c.namespace).Create(ctx, sa, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	cr := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}, Rules: []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"nodes", "pods", "services", "namespaces"}, Verbs: []string{"get", "list", "watch"}},
		{APIGroups: []string{"discovery.k8s.io"}, Resources: []string{"endpointslices"}, Verbs: []string{"get", "list", "watch"}},
		{APIGroups: []string{"networking.k8s.io"}, Resources: []string{"networkpolicies"}, Verbs: []string{"get", "list", "watch"}},
	}}
	if _, err := c.kube.RbacV1().ClusterRoles().Create(ctx, cr, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	crb := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels},
		RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: name},
		Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Name: kindName, Namespace: c.namespace}}}
	if _, err := c.kube.RbacV1().ClusterRoleBindings().Create(ctx, crb, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	return nil
}

// daemonSet is refdp's DaemonSet on a cluster: the kind mode's (privileged on the
// node's network with its bpffs and xtables lock), in the run's namespace with a
// service account instead of a kubeconfig, the status file in the pod's own
// directory, read by a readiness probe, and one PID namespace for the pod (kill
// reaches the agent).
func (c clusterEnv) daemonSet(image, host, port string, fl []string) *appsv1.DaemonSet {
	ds := daemonSet(c.Node, image, fl)
	ds.Namespace = c.namespace
	spec := &ds.Spec.Template.Spec
	spec.NodeSelector = map[string]string{clusterNodeLabel: c.Run}
	spec.ShareProcessNamespace = ptr.To(true)
	spec.ServiceAccountName = kindName
	cmd := []string{kindAgentPath, "run", "--node", "$(NODE_NAME)", "--in-cluster", "--bpffs", "/sys/fs/bpf", "--state-dir", clusterStateDir}
	for _, f := range fl {
		cmd = append(cmd, "--fault", f)
	}
	ctr := &spec.Containers[0]
	ctr.Command = cmd
	ctr.ImagePullPolicy = corev1.PullIfNotPresent
	// Not the Service's ClusterIP: refdp is what serves it.
	ctr.Env = append(ctr.Env, corev1.EnvVar{Name: "KUBERNETES_SERVICE_HOST", Value: host}, corev1.EnvVar{Name: "KUBERNETES_SERVICE_PORT", Value: port})
	ctr.ReadinessProbe = &corev1.Probe{
		ProbeHandler: corev1.ProbeHandler{Exec: &corev1.ExecAction{Command: []string{"/bin/sh", "-c",
			fmt.Sprintf(`grep -q '"ready":true' %s/%s`, clusterStateDir, agent.StatusFile)}}},
		PeriodSeconds: 1, FailureThreshold: 1, SuccessThreshold: 1, TimeoutSeconds: 5,
	}
	// The run's directories are on the suite's machine, not on the nodes.
	ctr.VolumeMounts = ctr.VolumeMounts[:2]
	ctr.VolumeMounts = append(ctr.VolumeMounts, corev1.VolumeMount{Name: "state", MountPath: clusterStateDir})
	spec.Volumes = append(spec.Volumes[:2], corev1.Volume{Name: "state", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}})
	return ds
}

func (c clusterEnv) labelNode(ctx context.Context, on bool) error {
	patch := `{"metadata":{"labels":{"` + clusterNodeLabel + `":null}}}`
	if on {
		patch = `{"metadata":{"labels":{"` + clusterNodeLabel + `":"` + c.Run + `"}}}`
	}
	_, err := c.kube.CoreV1().Nodes().Patch(ctx, c.Name, types.MergePatchType, []byte(patch), metav1.PatchOptions{})
	return err
}

func clusterStart(ctx context.Context, n skel.Node) (int, error) {
	c, err := clusterEnvOf(n)
	if err != nil {
		return 0, err
	}
	image, err := clusterImage()
	if err != nil {
		return 0, err
	}
	fl, err := faults.Parse([]string{os.Getenv("DPC_REFDP_FAULTS")})
	if err != nil {
		return 0, skel.Fail("bad environment", "DPC_REFDP_FAULTS: %w", err)
	}
	host, port, err := apiEndpoint(ctx, c.kube)
	if err != nil {
		return 0, skel.Fail("start failed", "the API server's address: %w", err)
	}
	if err := c.rbac(ctx); err != nil {
		return 0, skel.Fail("start failed", "refdp's service account and role: %w", err)
	}
	want := c.daemonSet(image, host, port, fl.Names())
	dss := c.kube.AppsV1().DaemonSets(c.namespace)
	got, err := dss.Get(ctx, kindName, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		_, err = dss.Create(ctx, want, metav1.CreateOptions{})
	case err == nil && !equalCommand(got, want):
		got.Spec.Template = want.Spec.Template
		_, err = dss.Update(ctx, got, metav1.UpdateOptions{})
	}
	if err != nil {
		return 0, skel.Fail("start failed", "DaemonSet %s/%s: %w", c.namespace, kindName, err)
	}
	if err := c.labelNode(ctx, true); err != nil {
		return 0, skel.Fail("start failed", "label Node %s: %w", n.Name, err)
	}
	return 0, nil
}

func equalCommand(a, b *appsv1.DaemonSet) bool {
	x, y := a.Spec.Template.Spec.Containers[0], b.Spec.Template.Spec.Containers[0]
	return x.Image == y.Image && strings.Join(x.Command, "\x00") == strings.Join(y.Command, "\x00")
}

// agentPod is the DaemonSet's pod on the node, if any (one not being deleted).
func (c clusterEnv) agentPod(ctx context.Context) (*corev1.Pod, error) {
	pods, err := c.kube.CoreV1().Pods(c.namespace).List(ctx, metav1.ListOptions{LabelSelector: "app=" + kindName, FieldSelector: "spec.nodeName=" + c.Name})
	if err != nil {
		return nil, err
	}
	for i := range pods.Items {
		if pods.Items[i].DeletionTimestamp == nil {
			return &pods.Items[i], nil
		}
	}
	return nil, nil
}

func clusterStatus(ctx context.Context, n skel.Node) (bool, bool, error) {
	c, err := clusterEnvOf(n)
	if err != nil {
		return false, false, err
	}
	p, err := c.agentPod(ctx)
	if err != nil || p == nil || len(p.Status.ContainerStatuses) == 0 {
		return false, false, err
	}
	cs := p.Status.ContainerStatuses[0]
	return cs.State.Running != nil, cs.State.Running != nil && cs.Ready, nil
}

// clusterStop unselects the node and waits until its agent's pod is gone.
func clusterStop(ctx context.Context, n skel.Node, wait time.Duration) error {
	c, err := clusterEnvOf(n)
	if err != nil {
		return err
	}
	if err := c.labelNode(ctx, false); err != nil && !apierrors.IsNotFound(err) {
		return skel.Fail("stop failed", "unlabel Node %s: %w", n.Name, err)
	}
	deadline := time.Now().Add(wait)
	for {
		pods, err := c.kube.CoreV1().Pods(c.namespace).List(ctx, metav1.ListOptions{LabelSelector: "app=" + kindName, FieldSelector: "spec.nodeName=" + c.Name})
		if err == nil && len(pods.Items) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return skel.Fail("agent did not exit", "refdp's pod on %s is still there %s after its node was unselected (last error: %v)", n.Name, wait, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// killScript SIGKILLs every refdp process of the pod (the pod shares one PID
// namespace, so the agent is not its init and the signal is not ignored), after
// removing the status file the agent can no longer correct. The agent is the
// container's main process: its container ends with it, and the runtime kills this
// script too, so exit status 137 is the expected outcome as well as 0.
const killScript = `rm -f ` + clusterStateDir + "/" + agent.StatusFile + `
for d in /proc/[0-9]*; do
  [ "$(cat $d/comm 2>/dev/null)" = refdp ] && kill -KILL "${d#/proc/}" 2>/dev/null
done
exit 0`

func clusterKill(ctx context.Context, n skel.Node) error {
	c, err := clusterEnvOf(n)
	if err != nil {
		return err
	}
	p, err := c.agentPod(ctx)
	if err != nil {
		return err
	}
	if p == nil || len(p.Status.ContainerStatuses) == 0 || p.Status.ContainerStatuses[0].State.Running == nil {
		return nil
	}
	before := p.Status.ContainerStatuses[0].ContainerID
	out, err := c.exec(ctx, p.Name, []string{"/bin/sh", "-c", killScript})
	var code utilexec.CodeExitError
	if err != nil && !(errors.As(err, &code) && code.Code == 137) {
		return skel.Fail("signal failed", "SIGKILL to refdp in pod %s/%s: %w: %s", c.namespace, p.Name, err, out)
	}
	// Gone once the kubelet says the container that ran is not running any more.
	deadline := time.Now().Add(10 * time.Second)
	for {
		got, err := c.kube.CoreV1().Pods(c.namespace).Get(ctx, p.Name, metav1.GetOptions{})
		if err != nil && apierrors.IsNotFound(err) {
			return nil
		}
		if err == nil && len(got.Status.ContainerStatuses) > 0 {
			cs := got.Status.ContainerStatuses[0]
			if cs.State.Running == nil || cs.ContainerID != before {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return skel.Fail("agent did not exit", "refdp in pod %s/%s still runs 10 s after SIGKILL (last error: %v)", c.namespace, p.Name, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// exec runs command in the agent's container and returns its output.
func (c clusterEnv) exec(ctx context.Context, pod string, command []string) ([]byte, error) {
	rc, err := clientcmd.BuildConfigFromFlags("", c.kubeconf)
	if err != nil {
		return nil, err
	}
	req := c.kube.CoreV1().RESTClient().Post().Resource("pods").Namespace(c.namespace).Name(pod).SubResource("exec").
		VersionedParams(&corev1.PodExecOptions{Container: kindName, Command: command, Stdout: true, Stderr: true}, scheme.ParameterCodec)
	ex, err := remotecommand.NewSPDYExecutor(rc, "POST", req.URL())
	if err != nil {
		return nil, err
	}
	var out bytes.Buffer
	err = ex.StreamWithContext(ctx, remotecommand.StreamOptions{Stdout: &out, Stderr: &out})
	return out.Bytes(), err
}

func clusterCollect(ctx context.Context, n skel.Node, dir string) ([]string, error) {
	c, err := clusterEnvOf(n)
	if err != nil {
		return nil, err
	}
	return agentLogs(ctx, c.kube, c.namespace, n.Name, dir), nil
}

// clusterCleanup stops the node's agent and removes what it left on the node with
// `refdp cleanup`, in a one-shot pod of its image on the node's network.
func clusterCleanup(ctx context.Context, n skel.Node) error {
	c, err := clusterEnvOf(n)
	if err != nil {
		return err
	}
	if err := clusterStop(ctx, n, 40*time.Second); err != nil {
		if kerr := clusterKill(ctx, n); kerr != nil {
			return errors.Join(err, kerr)
		}
		if err := clusterStop(ctx, n, 20*time.Second); err != nil {
			return err
		}
	}
	image, err := clusterImage()
	if err != nil {
		return err
	}
	name := "refdp-cleanup-" + strings.ToLower(strings.ReplaceAll(n.Name, ".", "-"))
	if len(name) > 63 {
		name = name[:63]
	}
	t := corev1.HostPathDirectory
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: c.namespace, Labels: map[string]string{runLabel: c.Run}},
		Spec: corev1.PodSpec{
			NodeName: n.Name, HostNetwork: true, RestartPolicy: corev1.RestartPolicyNever,
			Tolerations:                  []corev1.Toleration{{Operator: corev1.TolerationOpExists}},
			AutomountServiceAccountToken: ptr.To(false),
			Containers: []corev1.Container{{
				Name: "cleanup", Image: image, ImagePullPolicy: corev1.PullIfNotPresent,
				Command:         []string{kindAgentPath, "cleanup", "--bpffs", "/sys/fs/bpf"},
				SecurityContext: &corev1.SecurityContext{Privileged: ptr.To(true)},
				VolumeMounts: []corev1.VolumeMount{
					{Name: "bpffs", MountPath: "/sys/fs/bpf"},
					{Name: "xtables-lock", MountPath: "/run/xtables.lock"},
				},
			}},
			Volumes: []corev1.Volume{
				{Name: "bpffs", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/sys/fs/bpf", Type: &t}}},
				{Name: "xtables-lock", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/run/xtables.lock", Type: ptr.To(corev1.HostPathFileOrCreate)}}},
			},
		},
	}
	pods := c.kube.CoreV1().Pods(c.namespace)
	_ = pods.Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)})
	for i := 0; ; i++ {
		if _, err = pods.Create(ctx, p, metav1.CreateOptions{}); !apierrors.IsAlreadyExists(err) || i > 100 {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		return skel.Fail("cleanup failed", "pod %s/%s: %w", c.namespace, name, err)
	}
	defer pods.Delete(context.WithoutCancel(ctx), name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)})
	deadline := time.Now().Add(60 * time.Second)
	for {
		got, err := pods.Get(ctx, name, metav1.GetOptions{})
		if err == nil && got.Status.Phase == corev1.PodSucceeded {
			return nil
		}
		if err == nil && got.Status.Phase == corev1.PodFailed || time.Now().After(deadline) {
			logs, _ := pods.GetLogs(name, &corev1.PodLogOptions{}).DoRaw(ctx)
			return skel.Fail("cleanup failed", "refdp cleanup on %s: pod %s (last error %v): %s", n.Name, phaseOf(got), err, bytes.TrimSpace(logs))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func phaseOf(p *corev1.Pod) string {
	if p == nil {
		return "none"
	}
	return string(p.Status.Phase)
}

// agentLogs saves the logs of refdp's container on node (this one's and the one
// before a restart) into dir.
func agentLogs(ctx context.Context, kube kubernetes.Interface, namespace, node, dir string) []string {
	var files []string
	pods, err := kube.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{LabelSelector: "app=" + kindName, FieldSelector: "spec.nodeName=" + node})
	if err != nil {
		return nil
	}
	for _, p := range pods.Items {
		for _, prev := range []bool{false, true} {
			data, err := kube.CoreV1().Pods(namespace).GetLogs(p.Name, &corev1.PodLogOptions{Previous: prev}).DoRaw(ctx)
			if err != nil {
				continue
			}
			name := "refdp.log"
			if prev {
				name = "refdp.previous.log"
			}
			if os.WriteFile(filepath.Join(dir, name), data, 0o644) == nil {
				files = append(files, filepath.Join(dir, name))
			}
		}
	}
	return files
}
