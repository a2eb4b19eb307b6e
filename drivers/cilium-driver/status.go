package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"time"
)

// Status is what the agent says about itself, on its own sockets in the node.
//
// Cilium's /healthz (what its DaemonSet's readiness probe asks) answers Ok once every
// status probe has run and the API server is reachable: it says nothing of the
// datapath. Ready is therefore four things the agent reports, all of which must hold:
//
//   - Healthz: its status is Ok (GET /v1/healthz on its API socket);
//   - the load-balancing control plane's table of frontends is initialized: the
//     reflectors of Services, EndpointSlices and Pods have put in everything the API
//     server had when they started (statedb's Initialized, asked on the agent's shell
//     socket: `db/initialized frontends`);
//   - every frontend is reconciled: its reconciliation status, which the BPF
//     reconciler sets once the frontend and its backends are in the service maps, is
//     Done, none Pending or Error (GET /statedb/dump/frontends);
//   - every endpoint is ready: the host endpoint (whose regeneration attaches bpf_host
//     to eth0) and every pod's, which after a restart are restored and regenerated
//     with the programs this process compiled (GET /v1/endpoint); those being deleted
//     are leaving and do not count.
type Status struct {
	PID                  int
	Healthz              string // the agent's own state: Ok, Warning, Failure
	FrontendsInitialized bool
	Frontends            int
	FrontendsNotDone     []string // "10.96.0.10:80/TCP Pending"
	Endpoints            int
	EndpointsNotReady    []string // "1234 regenerating"
	HostEndpoint         bool
	Detail               string // what could not be learned, or why not ready
}

// Ready reports whether the agent runs and has programmed the node in sync with the
// API (above).
func (s Status) Ready() bool {
	return s.PID != 0 && s.Healthz == "Ok" && s.FrontendsInitialized && s.Frontends > 0 &&
		len(s.FrontendsNotDone) == 0 && s.HostEndpoint && len(s.EndpointsNotReady) == 0 && s.Detail == ""
}

// String is the status in one line, for logs and diagnostics.
func (s Status) String() string {
	return fmt.Sprintf("pid %d, healthz %q, frontends initialized %v, %d frontends (not done: %v), %d endpoints (host %v, not ready: %v), ready %v; %s",
		s.PID, s.Healthz, s.FrontendsInitialized, s.Frontends, s.FrontendsNotDone, s.Endpoints, s.HostEndpoint, s.EndpointsNotReady, s.Ready(), s.Detail)
}

// Status asks the agent whether it is ready. What it could not learn is in Detail.
func (a *agent) Status(ctx context.Context) Status {
	st := Status{PID: a.PID()}
	if st.PID == 0 {
		st.Detail = "cilium-agent does not run"
		return st
	}
	ctx, cancel := context.WithTimeout(ctx, 2500*time.Millisecond)
	defer cancel()
	api := apiClient(socketPath)
	var health struct {
		Cilium *struct {
			State string `json:"state"`
			Msg   string `json:"msg"`
		} `json:"cilium"`
	}
	if err := getJSON(ctx, api, "/v1/healthz", &health); err != nil {
		st.Detail = "healthz: " + err.Error()
		return st
	}
	if health.Cilium == nil {
		st.Detail = "healthz: no state for cilium"
		return st
	}
	if st.Healthz = health.Cilium.State; st.Healthz != "Ok" {
		st.Detail = "healthz: " + health.Cilium.State + ": " + health.Cilium.Msg
		return st
	}
	var err error
	if st.FrontendsInitialized, err = tableInitialized(ctx, shellPath, "frontends"); err != nil {
		st.Detail = "shell: " + err.Error()
		return st
	}
	var dump struct {
		Frontends []frontend `json:"frontends"`
	}
	if err := getJSON(ctx, api, "/statedb/dump/frontends", &dump); err != nil {
		st.Detail = "frontends: " + err.Error()
		return st
	}
	st.Frontends = len(dump.Frontends)
	for _, fe := range dump.Frontends {
		if fe.Status.Kind != "Done" {
			st.FrontendsNotDone = append(st.FrontendsNotDone, fe.String())
		}
	}
	var eps []endpoint
	if err := getJSON(ctx, api, "/v1/endpoint", &eps); err != nil {
		st.Detail = "endpoints: " + err.Error()
		return st
	}
	for _, ep := range eps {
		state := ep.state()
		if state == "disconnecting" || state == "disconnected" {
			continue
		}
		st.Endpoints++
		if ep.isHost() {
			st.HostEndpoint = true
		}
		if state != "ready" {
			st.EndpointsNotReady = append(st.EndpointsNotReady, fmt.Sprintf("%d %s", ep.ID, state))
		}
	}
	return st
}

// frontend is what the readiness needs of a row of the agent's frontends table.
type frontend struct {
	Address json.RawMessage `json:"Address"`
	Type    string          `json:"Type"`
	Status  struct {
		Kind  string  `json:"kind"`
		Error *string `json:"error"`
	} `json:"Status"`
}

func (f frontend) String() string {
	s := fmt.Sprintf("%s %s %s", strings.Trim(string(f.Address), `"`), f.Type, f.Status.Kind)
	if f.Status.Error != nil {
		s += ": " + *f.Status.Error
	}
	return s
}

// endpoint is what the readiness needs of the agent's endpoint model.
type endpoint struct {
	ID     int64 `json:"id"`
	Status *struct {
		State    *string `json:"state"`
		Identity *struct {
			Labels []string `json:"labels"`
		} `json:"identity"`
	} `json:"status"`
}

func (e endpoint) state() string {
	if e.Status == nil || e.Status.State == nil {
		return "unknown"
	}
	return *e.Status.State
}

func (e endpoint) isHost() bool {
	return e.Status != nil && e.Status.Identity != nil && slices.Contains(e.Status.Identity.Labels, "reserved:host")
}

// apiClient is an HTTP client of the agent's API on its UNIX socket.
func apiClient(sock string) *http.Client {
	return &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", sock)
		},
		DisableKeepAlives: true,
	}}
}

// maxBody caps what is read of a reply.
const maxBody = 16 << 20

// getJSON GETs path from the agent's API and decodes the reply into v.
func getJSON(ctx context.Context, c *http.Client, path string, v any) error {
	body, err := get(ctx, c, path)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(body, v); err != nil {
		return fmt.Errorf("GET %s: %w", path, err)
	}
	return nil
}

func get(ctx context.Context, c *http.Client, path string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://cilium"+path, nil)
	if err != nil {
		return nil, err
	}
	resp, err := c.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxBody))
	if err != nil {
		return nil, fmt.Errorf("GET %s: %w", path, err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s: %s", path, resp.Status, strings.TrimSpace(string(body)))
	}
	return body, nil
}

// Markers of the agent's shell (github.com/cilium/hive/shell): a command's output ends
// with one of them.
const (
	shellEnd   = "<<end>>"
	shellError = "<<error>>"
)

// shell runs one command on the agent's shell socket and returns its output, or an
// error with the output of a command that failed.
func shell(ctx context.Context, sock, command string) (string, error) {
	conn, err := (&net.Dialer{}).DialContext(ctx, "unix", sock)
	if err != nil {
		return "", err
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	}
	if _, err := fmt.Fprintf(conn, "%s\n", command); err != nil {
		return "", err
	}
	var out strings.Builder
	r := bufio.NewReader(conn)
	for {
		line, err := r.ReadString('\n')
		if before, ok := strings.CutSuffix(strings.TrimRight(line, "\n"), shellError); ok {
			out.WriteString(before)
			return "", fmt.Errorf("%s: %s", command, strings.TrimSpace(out.String()))
		}
		if strings.TrimRight(line, "\n") == shellEnd {
			return out.String(), nil
		}
		out.WriteString(line)
		if err != nil {
			return "", fmt.Errorf("%s: %w after %q", command, err, out.String())
		}
	}
}

// tableInitialized asks the agent's shell whether a statedb table is initialized.
// The command waits up to its timeout; a short one makes the answer a look, not a
// wait.
func tableInitialized(ctx context.Context, sock, table string) (bool, error) {
	_, err := shell(ctx, sock, "db/initialized --timeout=10ms "+table)
	if err != nil && strings.Contains(err.Error(), "timed out") {
		return false, nil
	}
	return err == nil, err
}
