// Package innetns does what a driver or fixture does inside a node's network namespace,
// named by its path (DPC_NETNS): run a function on a thread in it, run a command in it,
// and ask an HTTP server that listens only there.
package innetns

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os/exec"

	"github.com/containernetworking/plugins/pkg/ns"
)

// Do runs fn on a thread in the network namespace at path. What fn starts on other
// goroutines runs outside it; a child process forked by fn inherits it.
func Do(path string, fn func() error) error {
	return ns.WithNetNSPath(path, func(ns.NetNS) error { return fn() })
}

// Output runs name with args, and stdin if not nil, inside the network namespace at
// path and returns what it wrote to stdout. A tool not on PATH is exec.ErrNotFound;
// any other error is the command's own (an *exec.ExitError for a failed run), with
// what it wrote to stderr, for the caller to wrap with as much of the output as it
// wants. stderr is kept apart because a line a tool writes there while part of its
// buffered stdout is still to come lands, in one pipe, inside that output.
func Output(ctx context.Context, path string, stdin []byte, name string, args ...string) ([]byte, error) {
	if _, err := exec.LookPath(name); err != nil {
		return nil, err
	}
	var stdout, stderr bytes.Buffer
	err := Do(path, func() error {
		cmd := exec.CommandContext(ctx, name, args...)
		if stdin != nil {
			cmd.Stdin = bytes.NewReader(stdin)
		}
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		if said := bytes.TrimSpace(stderr.Bytes()); err != nil && len(said) > 0 {
			err = fmt.Errorf("%w: %s", err, said)
		}
		return err
	})
	return stdout.Bytes(), err
}

// maxBody caps what HTTPGet reads of a reply.
const maxBody = 4 << 20

// HTTPGet fetches http://addr+urlPath from inside the network namespace at path and
// returns the status code and up to 4 MiB of the body. The socket is made on a thread
// in that namespace; an http.Client would dial from goroutines of its own, on threads
// in this process's namespace.
func HTTPGet(ctx context.Context, path, addr, urlPath string) (int, []byte, error) {
	var conn net.Conn
	err := Do(path, func() error {
		var err error
		conn, err = (&net.Dialer{}).DialContext(ctx, "tcp", addr)
		return err
	})
	if err != nil {
		return 0, nil, err
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+urlPath, nil)
	if err != nil {
		return 0, nil, err
	}
	req.Close = true
	if err := req.Write(conn); err != nil {
		return 0, nil, fmt.Errorf("GET %s: %w", urlPath, err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), req)
	if err != nil {
		return 0, nil, fmt.Errorf("GET %s: %w", urlPath, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxBody))
	if err != nil {
		return resp.StatusCode, nil, fmt.Errorf("GET %s: read body: %w", urlPath, err)
	}
	return resp.StatusCode, body, nil
}
