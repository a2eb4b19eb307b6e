package cluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"k8s.io/cri-streaming/pkg/streaming/remotecommand"
	utilexec "k8s.io/utils/exec"
)

// localExecutor runs a pod's command on this machine, as a kubelet's runtime runs it
// in the container. It does not kill the command when the client goes (a runtime
// need not): only the end of its stdin stops it.
type localExecutor struct{}

func (localExecutor) ExecInContainer(_ context.Context, _, _, _ string, cmd []string, in io.Reader, out, errw io.WriteCloser, _ bool, _ <-chan remotecommand.TerminalSize, _ time.Duration) error {
	c := exec.Command(cmd[0], cmd[1:]...)
	c.Stdin, c.Stdout, c.Stderr = in, out, errw
	err := c.Run()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return utilexec.ExitErrorWrapper{ExitError: ee}
	}
	return err
}

// fakeKubelet serves pods/exec as a kubelet's streaming server does (the protocol the
// API server speaks to it, SPDY), so the exec helper runs for real against it.
func fakeKubelet(t *testing.T) string {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !strings.HasSuffix(r.URL.Path, "/exec") {
			http.NotFound(w, r)
			return
		}
		q := r.URL.Query()
		remotecommand.ServeExec(w, r, localExecutor{}, "p", "", q.Get("container"), q["command"],
			&remotecommand.Options{Stdin: q.Get("stdin") == "true", Stdout: true, Stderr: true}, time.Minute, 30*time.Second,
			remotecommand.SupportedStreamingProtocols)
	}))
	t.Cleanup(srv.Close)
	kc := filepath.Join(t.TempDir(), "kubeconfig")
	data := fmt.Sprintf("apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: %s\nusers:\n- name: u\n  user: {}\ncontexts:\n- name: c\n  context: {cluster: c, user: u}\ncurrent-context: c\n", srv.URL)
	if err := os.WriteFile(kc, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
	return kc
}

// TestExecHelper: the helper carries stdout, stderr and the exit status of a pod's
// command, ends its stdin when the caller closes it, and, killed with SIGKILL, ends
// it too: a probe in a pod stops when the suite's handle on it dies.
func TestExecHelper(t *testing.T) {
	kc := fakeKubelet(t)
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	start := func(cmd *exec.Cmd, command ...string) {
		t.Helper()
		if err := startInPod(self, kc, "ns", "p", "workload", command, cmd); err != nil {
			t.Fatal(err)
		}
	}
	t.Run("output and status", func(t *testing.T) {
		cmd := exec.Command("unused")
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		start(cmd, "/bin/sh", "-c", "echo out; echo err >&2; exit 3")
		err := cmd.Wait()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 3 {
			t.Errorf("exit %v, want status 3", err)
		}
		if out.String() != "out\n" || !strings.Contains(errb.String(), "err\n") {
			t.Errorf("stdout %q, stderr %q", out.String(), errb.String())
		}
	})
	t.Run("stdin ends when closed", func(t *testing.T) {
		cmd := exec.Command("unused")
		cmd.Stdin = strings.NewReader("hello\n")
		var out bytes.Buffer
		cmd.Stdout = &out
		start(cmd, "cat")
		if err := cmd.Wait(); err != nil || out.String() != "hello\n" {
			t.Errorf("cat: %q, %v", out.String(), err)
		}
	})
	t.Run("stdin ends when the helper is killed", func(t *testing.T) {
		done := filepath.Join(t.TempDir(), "done")
		cmd := exec.Command("unused")
		w, err := cmd.StdinPipe()
		if err != nil {
			t.Fatal(err)
		}
		defer w.Close()
		var out bytes.Buffer
		cmd.Stdout = &out
		start(cmd, "/bin/sh", "-c", "echo up; cat >/dev/null; echo stdin-ended > "+done)
		deadline := time.Now().Add(10 * time.Second)
		for !strings.Contains(out.String(), "up") && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		cmd.Wait()
		for time.Now().Before(deadline) {
			if _, err := os.Stat(done); err == nil {
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
		t.Errorf("the command's stdin did not end within 10 s of the helper's SIGKILL")
	})
}
