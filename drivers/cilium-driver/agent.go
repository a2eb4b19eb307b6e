package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"

	"github.com/dpconform/dpconform/driver/daemon"
	"github.com/dpconform/dpconform/driver/skel"
)

// Names of the agent's files in the node's state directory.
const (
	LogFile = "cilium-agent.log"
	PIDFile = "cilium-agent.pid"
	// LibDir is the agent's --lib-dir: its datapath's C sources (bpf/), into which it
	// writes the headers its feature probes generate. /var/lib/cilium, its default, is
	// the host's.
	LibDir = "lib"
)

// Where the agent lives inside a node. A node has its own /run (so /var/run) and its
// own bpffs on /sys/fs/bpf (docs/driver.md), so Cilium's defaults for these are the
// node's, as on a real node; they are passed explicitly all the same, so that the
// command line says what it uses.
const (
	runDir     = "/var/run/cilium"
	socketPath = runDir + "/cilium.sock"
	shellPath  = runDir + "/shell.sock"
	bpfRoot    = "/sys/fs/bpf"
)

// Cluster facts of the netns topology (topologies/netns) the agent is told.
const (
	clusterPodCIDR = "10.244.0.0/16"
	device         = "eth0"
)

// agent is the Cilium agent on one node. Its state lives in files under StateDir, so
// that separate driver calls manage the same process.
type agent struct {
	Install    string // what `make cilium` filled (Dir())
	Clang      string
	NetNS      string // the node's network namespace
	StateDir   string // the node's state directory (DPC_STATE_DIR)
	BPFFS      string // the node's bpffs, as the host sees it (DPC_BPFFS)
	Node       string // the node's name, its Node object
	Kubeconfig string
}

func newAgent(install, clang string, n skel.Node) *agent {
	return &agent{Install: install, Clang: clang, NetNS: n.NetNS, StateDir: n.StateDir, BPFFS: n.BPFFS, Node: n.Name, Kubeconfig: n.Kubeconfig}
}

func (a *agent) path(name string) string { return filepath.Join(a.StateDir, name) }

// Binary is the agent's executable.
func (a *agent) Binary() string { return filepath.Join(a.Install, "cilium-agent") }

// checkInstall checks that what `make cilium` installs is there.
func (a *agent) checkInstall() error {
	var errs []error
	for _, bin := range []string{a.Binary(), filepath.Join(a.Install, "cni", "cilium-cni"), a.Clang} {
		if err := executable(bin); err != nil {
			errs = append(errs, err)
		}
	}
	for _, dir := range []string{"bpf", "crds"} {
		if st, err := os.Stat(filepath.Join(a.Install, dir)); err != nil || !st.IsDir() {
			errs = append(errs, fmt.Errorf("%s: no %s directory", a.Install, dir))
		}
	}
	return errors.Join(errs...)
}

// identity are the arguments by which PID tells this node's agent from any other
// process: the run's kubeconfig and the node's library directory, together unique to
// a node of a run.
func (a *agent) identity() []string {
	return []string{"--k8s-kubeconfig-path=" + a.Kubeconfig, "--lib-dir=" + a.path(LibDir)}
}

// args is the agent's command line (docs/cilium.md explains each choice).
func (a *agent) args(cgroupRoot string) []string {
	return append(a.identity(),
		"--state-dir="+runDir,
		"--socket-path="+socketPath,
		"--bpf-root="+bpfRoot,
		"--cgroup-root="+cgroupRoot,
		// Services: the kube-proxy replacement on the node's one device, with
		// socket load-balancing (which the replacement turns on).
		"--kube-proxy-replacement=true",
		"--devices="+device,
		"--direct-routing-device="+device,
		// Pod networking as the topology routes it: native routing (each node has a
		// route to the others' pod CIDRs), pod IPs from the Node's podCIDR, IPv4 only,
		// no masquerading (the topology's pods are not masqueraded either).
		"--routing-mode=native",
		"--ipv4-native-routing-cidr="+clusterPodCIDR,
		"--ipam=kubernetes",
		"--k8s-require-ipv4-pod-cidr=true",
		"--enable-ipv4=true",
		"--enable-ipv6=false",
		"--enable-ipv4-masquerade=false",
		"--enable-bpf-masquerade=false",
		// What needs components this driver does not run: the L7 proxy (Envoy),
		// Hubble, the health endpoints (cilium-health), the operator's CNI file.
		"--enable-l7-proxy=false",
		"--enable-hubble=false",
		"--enable-health-checking=false",
		"--enable-endpoint-health-checking=false",
		"--cni-exclusive=false",
	)
}

// PID returns the PID of this node's running agent, or 0. A zombie counts as exited,
// and a reused PID is not the agent.
func (a *agent) PID() int { return a.daemon().PID() }

// Start starts the agent in the node, in its own session, with stdout and stderr
// appended to LogFile, and returns its PID without waiting for it to be ready. If it
// already runs, Start returns its PID.
//
// Before the first start on a node it shields the host from the agent (inNode,
// guardHost), registers Cilium's CRDs (its operator would) and gives the node a
// library directory with the datapath's sources.
func (a *agent) Start(ctx context.Context) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	if pid := a.PID(); pid != 0 {
		return pid, nil
	}
	if err := inNode(a.BPFFS); err != nil {
		return 0, err
	}
	cgroupRoot, err := cgroup2Mount()
	if err != nil {
		return 0, err
	}
	if err := guardHost(); err != nil {
		return 0, err
	}
	if err := a.installLib(); err != nil {
		return 0, err
	}
	if err := registerCRDs(ctx, a.Kubeconfig, filepath.Join(a.Install, "crds")); err != nil {
		return 0, err
	}
	path, cache, err := a.clangPath()
	if err != nil {
		return 0, err
	}
	cmd := exec.Command(a.Binary(), append(a.args(cgroupRoot), extraArgs()...)...)
	cmd.Env = append(os.Environ(),
		// The node's name: the host's hostname is not it.
		"K8S_NODE_NAME="+a.Node,
		// The agent runs `clang` from PATH; v1.20 needs LLVM 18.1 or later.
		"PATH="+path,
		EnvClang+"="+a.Clang,
		EnvObjectCache+"="+cache,
	)
	// Its own process group: Kill takes its compiler with it, as a crashed
	// container's would go.
	return a.daemon().Start(cmd, nil)
}

// daemon is the node's cilium-agent process: its PID and log files, and the
// arguments that tell it from any other process.
func (a *agent) daemon() daemon.Daemon {
	return daemon.Daemon{Name: "cilium-agent", Dir: a.StateDir, PIDFile: PIDFile, LogFile: LogFile, Identity: a.identity()}
}

// clangPath is the agent's PATH and its compile cache ("off" when off): the
// directory of the clang it compiles with first, and before it, unless the cache is
// off, the wrapper that serves the compiles from the cache (clangcache.go): a link
// to this driver named clang.
func (a *agent) clangPath() (path, cache string, err error) {
	path = filepath.Dir(a.Clang) + ":" + os.Getenv("PATH")
	cache = objectCacheDir(a.StateDir)
	if cache == "" {
		return path, "off", nil
	}
	self, err := os.Executable()
	if err != nil {
		return "", "", fmt.Errorf("the compile cache's clang wrapper: %w", err)
	}
	dir := a.path(wrapperDir)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", "", fmt.Errorf("the compile cache's clang wrapper: %w", err)
	}
	link := filepath.Join(dir, clangName)
	if err := os.Remove(link); err != nil && !errors.Is(err, os.ErrNotExist) {
		return "", "", fmt.Errorf("the compile cache's clang wrapper: %w", err)
	}
	if err := os.Symlink(self, link); err != nil {
		return "", "", fmt.Errorf("the compile cache's clang wrapper: %w", err)
	}
	return dir + ":" + path, cache, nil
}

// installLib copies the datapath's sources into the node's library directory, as
// `make install-bpf` installs them into /var/lib/cilium/bpf, unless they are there.
// Each node has its own: the agent writes the headers of its feature probes into it.
func (a *agent) installLib() error {
	dst := filepath.Join(a.path(LibDir), "bpf")
	if _, err := os.Stat(dst); err == nil {
		return nil
	}
	tmp := dst + ".tmp"
	if err := os.RemoveAll(tmp); err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(tmp), 0o755); err != nil {
		return err
	}
	if err := os.CopyFS(tmp, os.DirFS(filepath.Join(a.Install, "bpf"))); err != nil {
		return fmt.Errorf("copy the datapath's sources into %s: %w", tmp, err)
	}
	return os.Rename(tmp, dst)
}

// Stop stops the agent gracefully (SIGTERM) and returns once it and the rest of its
// process group (proc.StopGroup) have exited. Cilium leaves its datapath in place
// when it stops: its programs keep serving until a successor replaces them or
// Cleanup removes them.
func (a *agent) Stop(ctx context.Context) error {
	return a.daemon().Stop(ctx, syscall.SIGTERM)
}

// Kill crashes the agent (SIGKILL to its process group: the agent and the clang it
// may be running, as a crashed container's processes die with it) and returns once
// none of them runs.
func (a *agent) Kill(ctx context.Context) error {
	return a.daemon().Kill(ctx)
}
