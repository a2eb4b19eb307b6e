package main

// DPC_TOPOLOGY=kind: refdp runs as a vendor's agent does on a cluster, as a DaemonSet
// (kube-system/refdp) from an image of its own, on the nodes labelled
// dpconform.io/refdp=on. The driver runs on the host, beside the node containers:
//
//   - start builds the image once (the refdp binary next to the driver, on
//     DPC_KIND_BASE_IMAGE, an image with iptables that the topology names: there is
//     no registry to pull a base from), loads it into the node's containerd, makes
//     sure the DaemonSet is there and labels the node; the DaemonSet controller and
//     the node's kubelet do the rest.
//   - stop removes the label: the kubelet stops the agent's pod (SIGTERM, as on
//     netns), and stop waits until the agent has exited.
//   - kill sends SIGKILL to the agent's process itself: a crash. The pod stays, so
//     its kubelet restarts the container, as it does after any crash; start then
//     finds the node selected already.
//   - status, events, collect and cleanup read the node from the host: the agent's
//     process in /proc, its status file in DPC_STATE_DIR (the same directory in the
//     node, mounted into the pod), the node's bpffs through its container's root
//     (/proc/<pid>/root/sys/fs/bpf), its rules in its network namespace.

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"syscall"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"

	"github.com/dpconform/dpconform/driver/proc"
	"github.com/dpconform/dpconform/driver/skel"
	"github.com/dpconform/dpconform/reference/agent"
	"github.com/dpconform/dpconform/reference/faults"
)

// On kind: where the DaemonSet lives, the label that selects a node, and where the
// agent is in its image.
const (
	kindNamespace = "kube-system"
	kindName      = "refdp"
	kindLabel     = "dpconform.io/refdp"
	kindAgentPath = "/usr/local/bin/refdp"
)

// kindNode is a node of a kind topology as the driver sees it from the host.
type kindNode struct {
	skel.Node
	pid int // the node container's init, as the host sees it
}

func (k kindNode) env() env {
	e := env{Node: k.Node, bpffs: filepath.Join(fmt.Sprintf("/proc/%d/root", k.pid), "sys/fs/bpf")}
	// inNode then enters the node's network namespace through its container's init.
	e.NetNS = fmt.Sprintf("/proc/%d/ns/net", k.pid)
	return e
}

func onKind(n skel.Node) bool { return n.Topology == "kind" }

func docker(ctx context.Context, stdin []byte, args ...string) ([]byte, error) {
	bin := "docker"
	if _, err := os.Stat("/usr/bin/docker"); err == nil {
		bin = "/usr/bin/docker"
	}
	cmd := exec.CommandContext(ctx, bin, args...)
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return out.Bytes(), fmt.Errorf("docker %s: %w: %s", strings.Join(args, " "), err, bytes.TrimSpace(errb.Bytes()))
	}
	return out.Bytes(), nil
}

func kindNodeOf(ctx context.Context, n skel.Node) (kindNode, error) {
	out, err := docker(ctx, nil, "inspect", "--format", "{{.State.Pid}}", n.Name)
	if err != nil {
		return kindNode{}, skel.Fail("no node container", "%w (is DOCKER_HOST the daemon of the kind cluster?)", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(out)))
	if err != nil || pid == 0 {
		return kindNode{}, skel.Fail("no node container", "container %s has no process (%q)", n.Name, out)
	}
	return kindNode{Node: n, pid: pid}, nil
}

func kubeFor(n skel.Node) (kubernetes.Interface, error) {
	rc, err := clientcmd.BuildConfigFromFlags("", n.Kubeconfig)
	if err != nil {
		return nil, err
	}
	rc.Timeout = 10 * time.Second
	return kubernetes.NewForConfig(rc)
}

// kindImage is the agent's image, named by its binary's digest.
func kindImage(bin string) (string, []byte, error) {
	data, err := os.ReadFile(bin)
	if err != nil {
		return "", nil, err
	}
	sum := sha256.Sum256(data)
	return "dpconform.local/refdp:" + hex.EncodeToString(sum[:])[:16], data, nil
}

// ensureImage builds the agent's image unless the daemon has it: the base image with
// the refdp binary added.
func ensureImage(ctx context.Context, name string, agentBin []byte) error {
	if _, err := docker(ctx, nil, "image", "inspect", "--format", "{{.Id}}", name); err == nil {
		return nil
	}
	base := os.Getenv("DPC_KIND_BASE_IMAGE")
	if base == "" {
		return skel.Fail("no base image", "DPC_KIND_BASE_IMAGE is empty: refdp's image is built on an image with iptables that the kind topology names")
	}
	out, err := docker(ctx, nil, "create", "--network", "none", base, "/bin/true")
	if err != nil {
		return err
	}
	id := strings.TrimSpace(string(out))
	defer docker(context.WithoutCancel(ctx), nil, "rm", "-f", id)
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, d := range []string{"usr/", "usr/local/", "usr/local/bin/"} {
		tw.WriteHeader(&tar.Header{Name: d, Mode: 0o755, Typeflag: tar.TypeDir})
	}
	tw.WriteHeader(&tar.Header{Name: strings.TrimPrefix(kindAgentPath, "/"), Mode: 0o755, Size: int64(len(agentBin)), Typeflag: tar.TypeReg})
	tw.Write(agentBin)
	tw.Close()
	if _, err := docker(ctx, buf.Bytes(), "cp", "-", id+":/"); err != nil {
		return err
	}
	_, err = docker(ctx, nil, "commit", "--change", `ENTRYPOINT ["`+kindAgentPath+`"]`, "--change", "CMD []", id, name)
	return err
}

// ensureLoaded imports the image into the node's containerd unless it is there. It
// sends only the blobs the node lacks: refdp's image is the base image, whose layer
// every node has (the kind node image's component images are built on it), and one
// layer with refdp, so what travels into the node is that layer and the image's
// manifest and config, not the 300 MB of Debian under them. Where the slim import
// fails (a node that lacks a blob after all), the whole image is sent.
func ensureLoaded(ctx context.Context, node, name string) error {
	out, err := docker(ctx, nil, "exec", node, "ctr", "--namespace=k8s.io", "images", "ls", "-q")
	if err != nil {
		return err
	}
	for _, l := range strings.Fields(string(out)) {
		if l == name {
			return nil
		}
	}
	saved, err := docker(ctx, nil, "save", name)
	if err != nil {
		return err
	}
	importArgs := []string{"exec", "-i", node, "ctr", "--namespace=k8s.io", "images", "import", "--digests", "-"}
	if have, err := docker(ctx, nil, "exec", node, "ctr", "--namespace=k8s.io", "content", "ls", "-q"); err == nil {
		if slim, dropped, err := withoutBlobs(saved, strings.Fields(string(have))); err == nil && dropped > 0 {
			if _, err := docker(ctx, slim, importArgs...); err == nil {
				return nil
			}
		}
	}
	_, err = docker(ctx, saved, importArgs...)
	return err
}

// withoutBlobs returns the image archive (`docker save`'s OCI layout) without the
// blobs whose digests are in have, and how many it left out.
func withoutBlobs(archive []byte, have []string) ([]byte, int, error) {
	skip := map[string]bool{}
	for _, d := range have {
		if hex, ok := strings.CutPrefix(d, "sha256:"); ok {
			skip["blobs/sha256/"+hex] = true
		}
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	tr := tar.NewReader(bytes.NewReader(archive))
	dropped := 0
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, 0, err
		}
		if skip[strings.TrimPrefix(h.Name, "./")] {
			dropped++
			continue
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, 0, err
		}
		if _, err := io.Copy(tw, tr); err != nil {
			return nil, 0, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, 0, err
	}
	return buf.Bytes(), dropped, nil
}

// daemonSet is refdp's DaemonSet. Its pods run privileged on the node's network with
// the node's bpffs, the run's directory (kubeconfig, state directories: the same
// paths as on the host) and the xtables lock.
func daemonSet(n skel.Node, image string, fl []string) *appsv1.DaemonSet {
	labels := map[string]string{"app": kindName}
	cmd := []string{kindAgentPath, "run", "--node", "$(NODE_NAME)", "--kubeconfig", n.Kubeconfig,
		"--bpffs", "/sys/fs/bpf", "--state-dir", filepath.Join(filepath.Dir(n.StateDir), "$(NODE_NAME)")}
	for _, f := range fl {
		cmd = append(cmd, "--fault", f)
	}
	hostPath := func(name, path string, t corev1.HostPathType) corev1.Volume {
		return corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: path, Type: &t}}}
	}
	dirs := []string{filepath.Dir(n.StateDir), filepath.Dir(n.Kubeconfig)}
	vols := []corev1.Volume{
		hostPath("bpffs", "/sys/fs/bpf", corev1.HostPathDirectory),
		hostPath("xtables-lock", "/run/xtables.lock", corev1.HostPathFileOrCreate),
		hostPath("state", dirs[0], corev1.HostPathDirectory),
	}
	mounts := []corev1.VolumeMount{
		{Name: "bpffs", MountPath: "/sys/fs/bpf"},
		{Name: "xtables-lock", MountPath: "/run/xtables.lock"},
		{Name: "state", MountPath: dirs[0]},
	}
	if !strings.HasPrefix(dirs[1]+"/", dirs[0]+"/") {
		vols = append(vols, hostPath("kubeconfig", dirs[1], corev1.HostPathDirectory))
		mounts = append(mounts, corev1.VolumeMount{Name: "kubeconfig", MountPath: dirs[1], ReadOnly: true})
	}
	return &appsv1.DaemonSet{
		ObjectMeta: metav1.ObjectMeta{Name: kindName, Namespace: kindNamespace, Labels: labels},
		Spec: appsv1.DaemonSetSpec{
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					NodeSelector:                  map[string]string{kindLabel: "on"},
					HostNetwork:                   true,
					Tolerations:                   []corev1.Toleration{{Operator: corev1.TolerationOpExists}},
					TerminationGracePeriodSeconds: ptr.To[int64](30),
					Containers: []corev1.Container{{
						Name:            kindName,
						Image:           image,
						ImagePullPolicy: corev1.PullNever,
						Command:         cmd,
						Env: []corev1.EnvVar{
							{Name: "NODE_NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "spec.nodeName"}}},
							{Name: "DPC_RUN", Value: n.Run},
						},
						SecurityContext: &corev1.SecurityContext{Privileged: ptr.To(true)},
						VolumeMounts:    mounts,
					}},
					Volumes: vols,
				},
			},
		},
	}
}

// ensureDaemonSet creates the DaemonSet, or updates it when its pod template differs
// (another image, other faults).
func ensureDaemonSet(ctx context.Context, kube kubernetes.Interface, want *appsv1.DaemonSet) error {
	dss := kube.AppsV1().DaemonSets(kindNamespace)
	got, err := dss.Get(ctx, kindName, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		_, err = dss.Create(ctx, want, metav1.CreateOptions{})
		return err
	}
	if err != nil {
		return err
	}
	c, w := got.Spec.Template.Spec.Containers[0], want.Spec.Template.Spec.Containers[0]
	if c.Image == w.Image && reflect.DeepEqual(c.Command, w.Command) {
		return nil
	}
	got.Spec.Template = want.Spec.Template
	_, err = dss.Update(ctx, got, metav1.UpdateOptions{})
	return err
}

func labelNode(ctx context.Context, kube kubernetes.Interface, node string, on bool) error {
	patch := `{"metadata":{"labels":{"` + kindLabel + `":null}}}`
	if on {
		patch = `{"metadata":{"labels":{"` + kindLabel + `":"on"}}}`
	}
	_, err := kube.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, []byte(patch), metav1.PatchOptions{})
	return err
}

func kindStart(ctx context.Context, n skel.Node) (int, error) {
	if err := checkKindStateDir(n); err != nil {
		return 0, err
	}
	kube, err := kubeFor(n)
	if err != nil {
		return 0, err
	}
	bin, err := agentBinary()
	if err != nil {
		return 0, err
	}
	image, data, err := kindImage(bin)
	if err != nil {
		return 0, err
	}
	fl, err := faults.Parse([]string{os.Getenv("DPC_REFDP_FAULTS")})
	if err != nil {
		return 0, skel.Fail("bad environment", "DPC_REFDP_FAULTS: %w", err)
	}
	if err := ensureImage(ctx, image, data); err != nil {
		return 0, skel.Fail("start failed", "image %s: %w", image, err)
	}
	if err := ensureLoaded(ctx, n.Name, image); err != nil {
		return 0, skel.Fail("start failed", "load %s into %s: %w", image, n.Name, err)
	}
	if err := ensureDaemonSet(ctx, kube, daemonSet(n, image, fl.Names())); err != nil {
		return 0, skel.Fail("start failed", "DaemonSet %s/%s: %w", kindNamespace, kindName, err)
	}
	if pid := kindAgentPID(n.Name); pid != 0 {
		return pid, nil
	}
	// A stale status file must not make the new agent look ready.
	os.Remove(filepath.Join(n.StateDir, agent.StatusFile))
	if err := labelNode(ctx, kube, n.Name, true); err != nil {
		return 0, skel.Fail("start failed", "label Node %s: %w", n.Name, err)
	}
	return 0, nil
}

// checkKindStateDir refuses a state directory the DaemonSet cannot name: its pods
// find their node's as <dir>/$(NODE_NAME), one template for every node.
func checkKindStateDir(n skel.Node) error {
	if filepath.Base(n.StateDir) != n.Name {
		return skel.Fail("unsupported state directory", "DPC_STATE_DIR=%s: on kind, refdp's DaemonSet finds each node's state directory as <dir>/<node name>, and this one does not end in %s", n.StateDir, n.Name)
	}
	return nil
}

// kindAgentPID finds the agent of node on this host: refdp's container runs
// `refdp run --node NAME`, and kind's node names are unique on a host.
func kindAgentPID(node string) int {
	want := []byte(kindAgentPath + "\x00run\x00--node\x00" + node + "\x00")
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		// Read directly: proc.Cmdline waits out an empty command line, which every
		// kernel thread has.
		cmdline, _ := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if bytes.HasPrefix(cmdline, want) && proc.Alive(pid) {
			return pid
		}
	}
	return 0
}

// innermostPID is pid as its own PID namespace (the container's) numbers it, which
// is what the agent writes in its status file.
func innermostPID(pid int) int {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(l, "NSpid:"); ok {
			f := strings.Fields(v)
			if len(f) > 0 {
				n, _ := strconv.Atoi(f[len(f)-1])
				return n
			}
		}
	}
	return 0
}

// kindStatus: the agent is its container's PID 1, so every incarnation writes the
// same PID into its status file; a file is the running agent's only if it was
// written after that process started.
func kindStatus(n skel.Node) (bool, bool) {
	pid := kindAgentPID(n.Name)
	if pid == 0 {
		return false, false
	}
	st, err := agent.ReadStatus(n.StateDir)
	if err != nil || !st.Ready || st.PID != innermostPID(pid) {
		return true, false
	}
	started, err := startedAt(pid)
	return true, err == nil && !st.Updated.Before(started)
}

// startedAt is when pid started, from the boot time (whole seconds, so up to a second
// early) and its start in clock ticks (USER_HZ, 100 on Linux). A stale status file is
// older than that by more: kill removes it, and a restart takes its kubelet a second.
func startedAt(pid int) (time.Time, error) {
	ticks, err := proc.StartTime(pid)
	if err != nil {
		return time.Time{}, err
	}
	data, err := os.ReadFile("/proc/stat")
	if err != nil {
		return time.Time{}, err
	}
	for _, l := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(l, "btime "); ok {
			boot, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			if err != nil {
				return time.Time{}, err
			}
			// Truncated to the tick: a status written in the agent's first tick counts.
			return time.Unix(boot, 0).Add(time.Duration(ticks) * 10 * time.Millisecond), nil
		}
	}
	return time.Time{}, errors.New("no btime in /proc/stat")
}

// kindStop unselects the node and waits until its agent has exited.
func kindStop(ctx context.Context, n skel.Node, wait time.Duration) error {
	kube, err := kubeFor(n)
	if err != nil {
		return err
	}
	if err := labelNode(ctx, kube, n.Name, false); err != nil {
		return skel.Fail("stop failed", "unlabel Node %s: %w", n.Name, err)
	}
	deadline := time.Now().Add(wait)
	for kindAgentPID(n.Name) != 0 {
		if time.Now().After(deadline) {
			return skel.Fail("agent did not exit", "refdp on %s still runs %s after its node was unselected; see `kubectl -n %s logs ds/%s`", n.Name, wait, kindNamespace, kindName)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return nil
}

// kindKill sends SIGKILL to the node's agent and waits until it is gone.
func kindKill(n skel.Node) error {
	pid := kindAgentPID(n.Name)
	if pid == 0 {
		return nil
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
		return skel.Fail("signal failed", "SIGKILL to refdp (pid %d): %w", pid, err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for proc.Alive(pid) {
		if time.Now().After(deadline) {
			return skel.Fail("agent did not exit", "refdp (pid %d) still runs 10 s after SIGKILL", pid)
		}
		time.Sleep(5 * time.Millisecond)
	}
	// Its kubelet restarts it in a second or so; what it said of itself is void.
	os.Remove(filepath.Join(n.StateDir, agent.StatusFile))
	return nil
}

// kindCollect adds the agent's container logs (this one's and the one before a
// restart) to what collect saves from the node.
func kindCollect(ctx context.Context, k kindNode, dir string) []string {
	files := k.env().collect(dir)
	kube, err := kubeFor(k.Node)
	if err != nil {
		return files
	}
	return append(files, agentLogs(ctx, kube, kindNamespace, k.Name, dir)...)
}

// kindCleanup stops the node's agent (gracefully, else with SIGKILL) and removes
// what it left on the node, as `refdp cleanup` does on netns.
func kindCleanup(ctx context.Context, k kindNode) error {
	if err := kindStop(ctx, k.Node, 40*time.Second); err != nil {
		if kerr := kindKill(k.Node); kerr != nil {
			return errors.Join(err, kerr)
		}
	}
	return k.env().cleanup()
}
