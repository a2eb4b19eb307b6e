package innetns_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/dpconform/dpconform/driver/innetns"
)

// ownNetNS is this process's network namespace: entering it changes nothing, but it
// still takes setns, hence CAP_SYS_ADMIN.
const ownNetNS = "/proc/self/ns/net"

func needSetns(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("entering a network namespace (setns) needs root")
	}
}

func TestOutputRefusals(t *testing.T) {
	ctx := context.Background()
	if out, err := innetns.Output(ctx, ownNetNS, nil, "no-such-tool-dpc"); !errors.Is(err, exec.ErrNotFound) || out != nil {
		t.Errorf("a missing tool: %q, %v; want exec.ErrNotFound", out, err)
	}
	var notRun *exec.Error
	if _, err := innetns.Output(ctx, "/nonexistent/netns", nil, "true"); err == nil || errors.As(err, &notRun) {
		t.Errorf("a namespace that is gone: %v; want an error of the namespace, not of the tool", err)
	}
}

func TestOutput(t *testing.T) {
	needSetns(t)
	ctx := context.Background()
	// stderr written while stdout is half done stays out of stdout.
	out, err := innetns.Output(ctx, ownNetNS, []byte("in\n"), "sh", "-c", "printf 'entry dpor'; echo err >&2; printf 't=80\n'; cat")
	if err != nil || string(out) != "entry dport=80\nin\n" {
		t.Errorf("got %q, %v; want stdout alone, stdin echoed", out, err)
	}
	out, err = innetns.Output(ctx, ownNetNS, nil, "sh", "-c", "echo partial; echo why >&2; exit 3")
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 3 || string(out) != "partial\n" || !strings.Contains(err.Error(), "why") {
		t.Errorf("got %q, %v; want stdout, the exit status 3 and stderr in the error", out, err)
	}
}

func TestHTTPGet(t *testing.T) {
	needSetns(t)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusTeapot)
		fmt.Fprint(w, r.URL.Path)
	}))
	defer srv.Close()
	addr := strings.TrimPrefix(srv.URL, "http://")
	code, body, err := innetns.HTTPGet(context.Background(), ownNetNS, addr, "/healthz")
	if err != nil || code != http.StatusTeapot || string(body) != "/healthz" {
		t.Errorf("got %d %q, %v; want 418 \"/healthz\"", code, body, err)
	}
	srv.Close()
	if _, _, err := innetns.HTTPGet(context.Background(), ownNetNS, addr, "/healthz"); err == nil {
		t.Error("a server that is gone answered")
	}
}
