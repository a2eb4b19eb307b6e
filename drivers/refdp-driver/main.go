// Command refdp-driver is the reference dataplane's driver: it implements the driver
// contract (docs/driver.md) for refdp, one verb per call, JSON on stdout. It is
// written as a vendor's Go driver would be: its verbs on driver/skel, which parses
// the call, checks the node environment and writes the reply.
//
// Environment: DPC_NODE, DPC_NETNS, DPC_KUBECONFIG, DPC_STATE_DIR, DPC_TOPOLOGY as the
// contract says; DPC_BPFFS (the node's bpffs, default /sys/fs/bpf, where `events` finds
// the policy verdicts that refdp's programs report, agent running or not); REFDP_BINARY (the
// agent, default `refdp` next to this executable); DPC_REFDP_FAULTS (comma-separated
// faults to start the agent with, for the self-test).
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"syscall"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/dpconform/dpconform/bpf"
	"github.com/dpconform/dpconform/driver"
	"github.com/dpconform/dpconform/driver/daemon"
	"github.com/dpconform/dpconform/driver/skel"
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
	skel.Main("refdp-driver", skel.Funcs{
		Info:  info,
		Start: start,
		Status: func(ctx context.Context, n skel.Node) (driver.Status, error) {
			if onCluster(n) {
				running, ready, err := clusterStatus(ctx, n)
				return driver.Status{Running: running, Ready: ready}, err
			}
			if onKind(n) {
				running, ready := kindStatus(n)
				return driver.Status{Running: running, Ready: ready}, nil
			}
			return status(nodeEnv(n)), nil
		},
		Stop: func(ctx context.Context, n skel.Node) error {
			if onCluster(n) {
				return clusterStop(ctx, n, 45*time.Second)
			}
			if onKind(n) {
				return kindStop(ctx, n, 45*time.Second)
			}
			return nodeEnv(n).stopAgent(syscall.SIGTERM, 30*time.Second)
		},
		Kill: func(ctx context.Context, n skel.Node) error {
			if onCluster(n) {
				return clusterKill(ctx, n)
			}
			if onKind(n) {
				return kindKill(n)
			}
			return nodeEnv(n).stopAgent(syscall.SIGKILL, 10*time.Second)
		},
		Events: func(ctx context.Context, n skel.Node, cursor string) (driver.Events, error) {
			if onCluster(n) {
				return driver.Events{}, skel.Fail("unsupported topology", "DPC_TOPOLOGY=cluster: refdp's policy verdicts are in each node's bpffs, which this driver reads on netns and kind only")
			}
			if onKind(n) {
				k, err := kindNodeOf(ctx, n)
				if err != nil {
					return driver.Events{}, err
				}
				return eventsIn(k.env(), cursor)
			}
			return eventsIn(nodeEnv(n), cursor)
		},
		Collect: func(ctx context.Context, n skel.Node, dir string) ([]string, error) {
			if onCluster(n) {
				return clusterCollect(ctx, n, dir)
			}
			if onKind(n) {
				k, err := kindNodeOf(ctx, n)
				if err != nil {
					return nil, err
				}
				return kindCollect(ctx, k, dir), nil
			}
			return nodeEnv(n).collect(dir), nil
		},
		Cleanup: func(ctx context.Context, n skel.Node) error {
			if onCluster(n) {
				return clusterCleanup(ctx, n)
			}
			if onKind(n) {
				k, err := kindNodeOf(ctx, n)
				if err != nil {
					return err
				}
				return kindCleanup(ctx, k)
			}
			return nodeEnv(n).cleanup()
		},
	})
}

// info says what refdp offers on the topology of the run (DPC_TOPOLOGY, which the
// suite sets for info too). On a cluster (kind or an existing one) refdp runs as a
// DaemonSet of one image with its defaults: an upgrade there would be a change of the
// pod template, which this driver does not make, so no version, setting or Upgrade
// profile is offered there and the suite runs no spec that needs one. On an existing
// cluster the policy verdicts are in each node's bpffs, which the driver cannot read
// through the API, so it claims no verdicts there either.
func info(context.Context) (driver.Info, error) {
	i := driver.Info{
		Name:     "refdp",
		Version:  version,
		Profiles: []string{"Core", "ModeSwitch", "Policy", "Upgrade", "Observability"},
		Features: []string{"ClusterIP", "NodePort", "NodePortRemoteBackend", "TCP", "UDP", "NetworkPolicy", "PolicyVerdicts"},
		CNI:      json.RawMessage(cniConfig),
		// refdp has one mode, its default; a start may still name it.
		Modes: []string{"ebpf"},
		// Oldest first; the default is the last. They differ in the format of the
		// conntrack map (refdp run --version).
		Versions: versions(),
		Settings: []string{settingCTSize},
	}
	switch topology := os.Getenv("DPC_TOPOLOGY"); topology {
	case "kind", "cluster":
		i.Versions, i.Settings = nil, nil
		i.Profiles = slices.DeleteFunc(i.Profiles, func(p string) bool {
			return p == "Upgrade" || (topology == "cluster" && p == "Observability")
		})
		if topology == "cluster" {
			i.Features = slices.DeleteFunc(i.Features, func(f string) bool { return f == "PolicyVerdicts" })
		}
	}
	return i, nil
}

// settingCTSize is the setting `start --set ct-size=N`: the conntrack table's
// capacity in entries (refdp run --conntrack-size).
const settingCTSize = "ct-size"

func versions() []string {
	var out []string
	for _, f := range bpf.ConntrackFormats {
		out = append(out, f.String())
	}
	return out
}

// runArgs are the flags of `refdp run` that a start's options ask for.
func runArgs(opts driver.StartOptions) ([]string, error) {
	var argv []string
	if opts.Version != "" {
		if _, err := bpf.ParseConntrackFormat(opts.Version); err != nil {
			return nil, skel.Fail("not offered", "--version %s: %w", opts.Version, err)
		}
		argv = append(argv, "--version", opts.Version)
	}
	for k, v := range opts.Set {
		if k != settingCTSize {
			return nil, skel.Fail("not offered", "--set %s: refdp has the setting %s only", k, settingCTSize)
		}
		n, err := strconv.ParseUint(v, 10, 32)
		if err != nil || n == 0 || n > 1<<31 {
			return nil, skel.Fail("bad setting", "--set %s=%s: want a number of entries from 1 to %d", k, v, 1<<31)
		}
		argv = append(argv, "--conntrack-size", strconv.FormatUint(n, 10))
	}
	return argv, nil
}

// env is the node environment of one call, as skel checked it.
type env struct {
	skel.Node
	bpffs string // DPC_BPFFS, or the host's when the topology has none
}

func nodeEnv(n skel.Node) env {
	e := env{Node: n, bpffs: n.BPFFS}
	if e.bpffs == "" {
		e.bpffs = "/sys/fs/bpf"
	}
	return e
}

// inNode runs fn in the node's network namespace (or here, when DPC_NETNS is empty).
func (e env) inNode(fn func() error) error {
	if e.NetNS == "" {
		return fn()
	}
	return ns.WithNetNSPath(e.NetNS, func(ns.NetNS) error { return fn() })
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
		return "", skel.Fail("missing binary", "%s not found; build it (`make build`) or set REFDP_BINARY", p)
	}
	return p, nil
}

// agent is the node's refdp process: its PID and log files in the node's state
// directory, and the arguments that tell it from any other process.
func (e env) agent() daemon.Daemon {
	return daemon.Daemon{Name: "refdp", Dir: e.StateDir, PIDFile: "refdp.pid", LogFile: "refdp.log", Identity: []string{"run", "--state-dir", e.StateDir}}
}

// agentPID returns the PID of the running agent, or 0.
func (e env) agentPID() int { return e.agent().PID() }

// start starts refdp on the node, or returns the PID of the one already running, in
// the version and with the conntrack size opts ask for (skel checked that info
// offers them). Its one mode is the default, so a mode changes nothing.
func start(ctx context.Context, n skel.Node, opts driver.StartOptions) (int, error) {
	// skel refused what info does not offer on this topology: on kind and on a
	// cluster, any version or setting.
	if onCluster(n) {
		return clusterStart(ctx, n)
	}
	if onKind(n) {
		return kindStart(ctx, n)
	}
	e := nodeEnv(n)
	if pid := e.agentPID(); pid != 0 {
		return pid, nil
	}
	variant, err := runArgs(opts)
	if err != nil {
		return 0, err
	}
	bin, err := agentBinary()
	if err != nil {
		return 0, err
	}
	fl, err := faults.Parse([]string{os.Getenv("DPC_REFDP_FAULTS")})
	if err != nil {
		return 0, skel.Fail("bad environment", "DPC_REFDP_FAULTS: %w", err)
	}
	argv := []string{"run", "--node", e.Name, "--kubeconfig", e.Kubeconfig, "--bpffs", e.bpffs, "--state-dir", e.StateDir}
	argv = append(argv, variant...)
	for _, f := range fl.Names() {
		argv = append(argv, "--fault", f)
	}
	// A stale status file must not make the new agent look ready.
	os.Remove(filepath.Join(e.StateDir, agent.StatusFile))
	pid, err := e.agent().Start(exec.Command(bin, argv...), func(c *exec.Cmd) error { return e.inNode(c.Start) })
	if err != nil {
		return 0, skel.Fail("start failed", "%w", err)
	}
	return pid, nil
}

func status(e env) driver.Status {
	pid := e.agentPID()
	var ready bool
	var since int64
	if pid != 0 {
		if st, err := agent.ReadStatus(e.StateDir); err == nil && st.PID == pid {
			ready, since = st.Ready, st.ReadySinceNS
		}
	}
	return driver.Status{Running: pid != 0, Ready: ready, ReadySinceNS: since}
}

func (e env) stopAgent(sig syscall.Signal, wait time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	if err := e.agent().Signal(ctx, sig); err != nil {
		return skel.Fail("agent did not exit", "%w", err)
	}
	return nil
}

// collect saves what it can into dir (skel created it): a diagnostic that fails is
// saved as its output, not a failure of the verb.
func (e env) collect(dir string) []string {
	d := &skel.Diagnostics{Dir: dir}
	d.Copy("refdp.log", e.agent().LogPath())
	// Ready or not, the conntrack map in use, and what the start migrated.
	d.Copy(agent.StatusFile, filepath.Join(e.StateDir, agent.StatusFile))
	bin, _ := agentBinary()
	for _, c := range []struct {
		name string
		argv []string
	}{
		{"maps.json", []string{bin, "dump", "--bpffs", e.bpffs}},
		{"iptables.txt", []string{"iptables-save", "-c"}}, // with counters: which rule dropped what
		{"addresses.txt", []string{"ip", "addr"}},
		{"routes.txt", []string{"ip", "route"}},
		{"tc.txt", []string{"bpftool", "net"}},
	} {
		var out []byte
		e.inNode(func() error {
			out, _ = exec.Command(c.argv[0], c.argv[1:]...).CombinedOutput()
			return nil
		})
		d.Write(c.name, out, nil)
	}
	files, _ := d.Files() // a file it could not write is one less to read
	return files
}

func (e env) cleanup() error {
	if err := e.stopAgent(syscall.SIGKILL, 10*time.Second); err != nil {
		return err
	}
	bin, err := agentBinary()
	if err != nil {
		return err
	}
	var out []byte
	err = e.inNode(func() error {
		var err error
		out, err = exec.Command(bin, "cleanup", "--bpffs", e.bpffs).CombinedOutput()
		return err
	})
	if err != nil {
		return skel.Fail("cleanup failed", "refdp cleanup: %w: %s", err, bytes.TrimSpace(out))
	}
	a := e.agent()
	for _, f := range []string{a.Path(a.PIDFile), filepath.Join(e.StateDir, agent.StatusFile)} {
		os.Remove(f)
	}
	return nil
}
