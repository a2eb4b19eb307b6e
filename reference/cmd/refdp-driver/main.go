// Command refdp-driver is the reference dataplane's driver: it implements the driver
// contract (docs/driver.md) for refdp, one verb per call, JSON on stdout.
//
// Environment: DPC_NODE, DPC_NETNS, DPC_KUBECONFIG, DPC_STATE_DIR, DPC_TOPOLOGY as the
// contract says; DPC_BPFFS (the node's bpffs, default /sys/fs/bpf); REFDP_BINARY (the
// agent, default `refdp` next to this executable); DPC_REFDP_FAULTS (comma-separated
// faults to start the agent with, for the self-test).
package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/dpconform/dpconform/internal/driverreply"
	"github.com/dpconform/dpconform/internal/proc"
	"github.com/dpconform/dpconform/reference/agent"
	"github.com/dpconform/dpconform/reference/faults"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

// cniConfig is refdp's pod network: the standard ptp and host-local plugins. The
// topology expands ${POD_CIDR} and ${CNI_DATA_DIR} per node.
const cniConfig = `{
  "cniVersion": "1.0.0",
  "name": "refdp",
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

func main() {
	if len(os.Args) < 2 {
		driverreply.Exit("refdp-driver", nil, driverreply.Fail("usage", "refdp-driver info|start|status|stop|kill|events|collect|cleanup"))
	}
	verb, args := os.Args[1], os.Args[2:]
	var out any
	var err error
	switch verb {
	case "info":
		out = map[string]any{
			"name":     "refdp",
			"version":  version,
			"profiles": []string{"Core"},
			"features": []string{"ClusterIP", "NodePort", "NodePortRemoteBackend", "TCP", "UDP"},
			"cni":      json.RawMessage(cniConfig),
		}
	case "start":
		out, err = start(args)
	case "status":
		out, err = status()
	case "stop":
		out, err = stopAgent(syscall.SIGTERM, 30*time.Second)
	case "kill":
		out, err = stopAgent(syscall.SIGKILL, 10*time.Second)
	case "events":
		err = driverreply.Fail("unsupported", "refdp does not report policy verdicts (it does not claim the Observability profile)")
	case "collect":
		out, err = collect(args)
	case "cleanup":
		out, err = cleanup()
	default:
		err = driverreply.Fail("unknown verb", "%q; verbs: info start status stop kill events collect cleanup", verb)
	}
	driverreply.Exit("refdp-driver", out, err)
}

// env is the node environment of one call.
type env struct {
	node, netns, kubeconfig, stateDir, bpffs string
}

func nodeEnv() (env, error) {
	e := env{
		node:       os.Getenv("DPC_NODE"),
		netns:      os.Getenv("DPC_NETNS"),
		kubeconfig: os.Getenv("DPC_KUBECONFIG"),
		stateDir:   os.Getenv("DPC_STATE_DIR"),
		bpffs:      os.Getenv("DPC_BPFFS"),
	}
	if e.bpffs == "" {
		e.bpffs = "/sys/fs/bpf"
	}
	var missing []string
	for k, v := range map[string]string{"DPC_NODE": e.node, "DPC_KUBECONFIG": e.kubeconfig, "DPC_STATE_DIR": e.stateDir} {
		if v == "" {
			missing = append(missing, k)
		}
	}
	if len(missing) > 0 {
		return e, driverreply.Fail("bad environment", "%s not set; the suite sets them per node (see docs/driver.md)", strings.Join(missing, ", "))
	}
	if st, err := os.Stat(e.stateDir); err != nil || !st.IsDir() {
		return e, driverreply.Fail("bad environment", "DPC_STATE_DIR=%s is not a directory", e.stateDir)
	}
	if e.netns != "" {
		if _, err := os.Stat(e.netns); err != nil {
			return e, driverreply.Fail("bad environment", "DPC_NETNS=%s: %v", e.netns, err)
		}
	}
	return e, nil
}

func (e env) pidFile() string { return filepath.Join(e.stateDir, "refdp.pid") }
func (e env) logFile() string { return filepath.Join(e.stateDir, "refdp.log") }

// inNode runs fn in the node's network namespace (or here, when DPC_NETNS is empty).
func (e env) inNode(fn func() error) error {
	if e.netns == "" {
		return fn()
	}
	return ns.WithNetNSPath(e.netns, func(ns.NetNS) error { return fn() })
}

func agentBinary() (string, error) {
	if p := os.Getenv("REFDP_BINARY"); p != "" {
		return p, nil
	}
	self, err := os.Executable()
	if err != nil {
		return "", err
	}
	p := filepath.Join(filepath.Dir(self), "refdp")
	if _, err := os.Stat(p); err != nil {
		return "", driverreply.Fail("missing binary", "%s not found; build it (`make build`) or set REFDP_BINARY", p)
	}
	return p, nil
}

// agentPID returns the PID of the running agent, or 0.
func (e env) agentPID() int {
	data, err := os.ReadFile(e.pidFile())
	if err != nil {
		return 0
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil || !proc.Alive(pid) {
		return 0
	}
	// A reused PID is not our agent.
	cmd, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if !bytes.Contains(cmd, []byte("refdp\x00run")) {
		return 0
	}
	return pid
}

func start(args []string) (any, error) {
	fs := flag.NewFlagSet("start", flag.ContinueOnError)
	mode := fs.String("mode", "", "refdp has one mode; any other is refused")
	if err := fs.Parse(args); err != nil {
		return nil, driverreply.Fail("bad arguments", "%v", err)
	}
	if *mode != "" && *mode != "ebpf" {
		return nil, driverreply.Fail("bad arguments", "unknown mode %q; refdp has one mode, ebpf", *mode)
	}
	e, err := nodeEnv()
	if err != nil {
		return nil, err
	}
	if pid := e.agentPID(); pid != 0 {
		return map[string]int{"pid": pid}, nil
	}
	bin, err := agentBinary()
	if err != nil {
		return nil, err
	}
	fl, err := faults.Parse([]string{os.Getenv("DPC_REFDP_FAULTS")})
	if err != nil {
		return nil, driverreply.Fail("bad environment", "DPC_REFDP_FAULTS: %v", err)
	}
	argv := []string{"run", "--node", e.node, "--kubeconfig", e.kubeconfig, "--bpffs", e.bpffs, "--state-dir", e.stateDir}
	for _, f := range fl.Names() {
		argv = append(argv, "--fault", f)
	}
	log, err := os.OpenFile(e.logFile(), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	defer log.Close()
	fmt.Fprintf(log, "---- refdp-driver start %s: %s %s\n", time.Now().Format(time.RFC3339Nano), bin, strings.Join(argv, " "))
	// A stale status file must not make the new agent look ready.
	os.Remove(filepath.Join(e.stateDir, agent.StatusFile))
	cmd := exec.Command(bin, argv...)
	cmd.Stdout, cmd.Stderr = log, log
	// Its own session: the agent outlives this call and the suite's signals.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := e.inNode(cmd.Start); err != nil {
		return nil, driverreply.Fail("start failed", "%s: %v", bin, err)
	}
	pid := cmd.Process.Pid
	if err := os.WriteFile(e.pidFile(), []byte(strconv.Itoa(pid)), 0o644); err != nil {
		return nil, err
	}
	cmd.Process.Release()
	return map[string]int{"pid": pid}, nil
}

func status() (any, error) {
	e, err := nodeEnv()
	if err != nil {
		return nil, err
	}
	pid := e.agentPID()
	ready := false
	if pid != 0 {
		if st, err := agent.ReadStatus(e.stateDir); err == nil && st.PID == pid {
			ready = st.Ready
		}
	}
	return map[string]bool{"running": pid != 0, "ready": ready}, nil
}

func stopAgent(sig syscall.Signal, wait time.Duration) (any, error) {
	e, err := nodeEnv()
	if err != nil {
		return nil, err
	}
	pid := e.agentPID()
	if pid == 0 {
		return struct{}{}, nil
	}
	if err := syscall.Kill(pid, sig); err != nil && !errors.Is(err, syscall.ESRCH) {
		return nil, driverreply.Fail("signal failed", "%s to refdp (pid %d): %v", sig, pid, err)
	}
	deadline := time.Now().Add(wait)
	for proc.Alive(pid) {
		if time.Now().After(deadline) {
			return nil, driverreply.Fail("agent did not exit", "refdp (pid %d) still runs %s after %s; see %s", pid, wait, sig, e.logFile())
		}
		time.Sleep(5 * time.Millisecond)
	}
	return struct{}{}, nil
}

func collect(args []string) (any, error) {
	fs := flag.NewFlagSet("collect", flag.ContinueOnError)
	dir := fs.String("dir", "", "directory to write diagnostics into")
	if err := fs.Parse(args); err != nil || *dir == "" {
		return nil, driverreply.Fail("bad arguments", "collect needs --dir DIR")
	}
	e, err := nodeEnv()
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(*dir, 0o755); err != nil {
		return nil, err
	}
	var files []string
	save := func(name string, data []byte) {
		p := filepath.Join(*dir, name)
		if os.WriteFile(p, data, 0o644) == nil {
			files = append(files, p)
		}
	}
	if data, err := os.ReadFile(e.logFile()); err == nil {
		save("refdp.log", data)
	}
	bin, _ := agentBinary()
	for _, c := range []struct {
		name string
		argv []string
	}{
		{"maps.json", []string{bin, "dump", "--bpffs", e.bpffs}},
		{"iptables.txt", []string{"iptables-save"}},
		{"addresses.txt", []string{"ip", "addr"}},
		{"routes.txt", []string{"ip", "route"}},
		{"tc.txt", []string{"bpftool", "net"}},
	} {
		var out []byte
		e.inNode(func() error {
			out, _ = exec.Command(c.argv[0], c.argv[1:]...).CombinedOutput()
			return nil
		})
		save(c.name, out)
	}
	return map[string][]string{"files": files}, nil
}

func cleanup() (any, error) {
	e, err := nodeEnv()
	if err != nil {
		return nil, err
	}
	if _, err := stopAgent(syscall.SIGKILL, 10*time.Second); err != nil {
		return nil, err
	}
	bin, err := agentBinary()
	if err != nil {
		return nil, err
	}
	var out []byte
	err = e.inNode(func() error {
		var err error
		out, err = exec.Command(bin, "cleanup", "--bpffs", e.bpffs).CombinedOutput()
		return err
	})
	if err != nil {
		return nil, driverreply.Fail("cleanup failed", "refdp cleanup: %v: %s", err, bytes.TrimSpace(out))
	}
	for _, f := range []string{e.pidFile(), filepath.Join(e.stateDir, agent.StatusFile)} {
		os.Remove(f)
	}
	return struct{}{}, nil
}
