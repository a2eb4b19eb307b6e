package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"syscall"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/remotecommand"
	utilexec "k8s.io/client-go/util/exec"
	"k8s.io/streaming/pkg/httpstream"
)

// envExec carries an execRequest to the helper process: the executable that started
// the topology, re-executed. Callers hold an *exec.Cmd (they signal it, wait for it,
// pipe its stdin and stdout), so a command in a pod must be a local process; the
// helper is that process, streaming its stdin, stdout and stderr to the command that
// the kubelet runs in the pod (the pods/exec subresource) and exiting with its status.
const envExec = "DPC_CLUSTER_EXEC"

type execRequest struct {
	Kubeconfig string   `json:"kubeconfig"`
	Namespace  string   `json:"namespace"`
	Pod        string   `json:"pod"`
	Container  string   `json:"container"`
	Command    []string `json:"command"`
}

// RunExecHelperIfChild runs the exec helper and exits if this process was started as
// one. The main of every executable that opens a cluster topology (dpconform, a test
// binary's TestMain) calls it first.
func RunExecHelperIfChild() {
	v := os.Getenv(envExec)
	if v == "" {
		return
	}
	var req execRequest
	if err := json.Unmarshal([]byte(v), &req); err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", envExec, err)
		os.Exit(126)
	}
	os.Exit(execInPod(req))
}

// execInPod streams to req's command until it exits (its status is returned) or this
// process is told to stop. When this process dies, even by SIGKILL, the stream closes
// and the command's stdin ends: a probe stops on that, as it does when the suite goes.
func execInPod(req execRequest) int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	rc, err := restConfig(req.Kubeconfig)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 126
	}
	kube, err := kubernetes.NewForConfig(rc)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 126
	}
	r := kube.CoreV1().RESTClient().Post().Resource("pods").Namespace(req.Namespace).Name(req.Pod).SubResource("exec").
		VersionedParams(&corev1.PodExecOptions{Container: req.Container, Command: req.Command, Stdin: true, Stdout: true, Stderr: true}, scheme.ParameterCodec)
	ws, err := remotecommand.NewWebSocketExecutor(rc, "GET", r.URL().String())
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 126
	}
	spdy, err := remotecommand.NewSPDYExecutor(rc, "POST", r.URL())
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 126
	}
	ex, err := remotecommand.NewFallbackExecutor(ws, spdy, func(err error) bool {
		return httpstream.IsUpgradeFailure(err) || httpstream.IsHTTPSProxyError(err)
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 126
	}
	err = ex.StreamWithContext(ctx, remotecommand.StreamOptions{Stdin: os.Stdin, Stdout: os.Stdout, Stderr: os.Stderr})
	var code utilexec.CodeExitError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &code):
		return code.Code
	default:
		fmt.Fprintf(os.Stderr, "exec in pod %s/%s: %v\n", req.Namespace, req.Pod, err)
		return 125
	}
}

func restConfig(kubeconfig string) (*rest.Config, error) {
	rc, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("kubeconfig %s: %w", kubeconfig, err)
	}
	// JSON: the namespace mapping (transport.go) reads and rewrites request bodies.
	rc.ContentType = "application/json"
	rc.AcceptContentTypes = "application/json"
	rc.QPS, rc.Burst = 50, 100
	return rc, nil
}

// startInPod rewrites cmd (not yet started) to run as the exec helper for command in
// a pod's container, and starts it.
func startInPod(self, kubeconfig, namespace, pod, container string, command []string, cmd *exec.Cmd) error {
	req, err := json.Marshal(execRequest{Kubeconfig: kubeconfig, Namespace: namespace, Pod: pod, Container: container, Command: command})
	if err != nil {
		return err
	}
	env := cmd.Env
	if env == nil {
		env = os.Environ()
	}
	cmd.Path, cmd.Args, cmd.Err = self, []string{self}, nil
	cmd.Env = append(env, envExec+"="+string(req))
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %v in pod %s/%s: %w", command, namespace, pod, err)
	}
	return nil
}
