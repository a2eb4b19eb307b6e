package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/dpconform/dpconform/driver"
	"github.com/dpconform/dpconform/driver/daemon"
)

// Names of Felix's files in the driver's directory in the node's state directory.
const (
	LogFile    = "felix.log"
	PIDFile    = "felix.pid"
	ConfigFile = "felix.cfg"
)

// configFile is calico-node's /etc/calico/felix.cfg (node/filesystem/etc/calico): no
// log file, no syslog, no metadata address. Felix reads it at start; the driver gives
// each node's Felix its own copy with --config-file, whose path is also how the
// driver tells this node's Felix from any other process.
const configFile = `[global]
MetadataAddr = None
LogFilePath = None
LogSeverityFile = None
LogSeveritySys = None
`

// healthAddr is Felix's health server, on the node's own loopback.
const healthAddr = "127.0.0.1:9099"

// dataInterface is the node's interface to the fabric, which Felix's BPF programs
// serve NodePorts on.
const dataInterface = "eth0"

// felix is Calico Felix on one node. Its state lives in files under Dir, so that
// separate driver calls manage the same process.
type felix struct {
	Build      *Build
	Node       string // the node's name, its Node object
	Kubeconfig string
	Dir        string // the driver's directory in the node's state directory
	NetNS      string // the node's network namespace (DPC_NETNS), the one the driver runs in
	BPFFS      string // the node's bpffs (DPC_BPFFS), which must be /sys/fs/bpf here
}

func (f *felix) path(name string) string { return filepath.Join(f.Dir, name) }

// env is Felix's configuration (FELIX_* variables, as calico-node's manifest sets them)
// for this node: calico-bpf.yaml's settings for the eBPF dataplane with the Kubernetes
// datastore, and what a netns node needs.
func (f *felix) env() []string {
	return []string{
		// calico-bpf.yaml: the eBPF dataplane, KDD, no IPv6, pods may reach their
		// host, health reporting on.
		"FELIX_BPFENABLED=true",
		"FELIX_DATASTORETYPE=kubernetes",
		"FELIX_DEFAULTENDPOINTTOHOSTACTION=ACCEPT",
		"FELIX_IPV6SUPPORT=false",
		"FELIX_HEALTHENABLED=true",
		// calico-node's felix/run exports NODENAME as FELIX_FELIXHOSTNAME.
		"NODENAME=" + f.Node,
		"FELIX_FELIXHOSTNAME=" + f.Node,
		// The API server, as the node's kubeconfig reaches it (calico-bpf.yaml points
		// KUBERNETES_SERVICE_HOST at it directly too: in eBPF mode Felix must not
		// depend on the Service it programs).
		"KUBECONFIG=" + f.Kubeconfig,
		// The node's fabric interface is eth0 (the default pattern would match it too,
		// and the topology's other interfaces are not data interfaces).
		"FELIX_BPFDATAIFACEPATTERN=^" + dataInterface + "$",
		// Pods get host-local addresses on the node's podCIDR (cni.go), not blocks of
		// calico-ipam: Felix takes workload routes from their IPs.
		"FELIX_ROUTESOURCE=WorkloadIPs",
		// Health on the node's loopback only.
		"FELIX_HEALTHHOST=127.0.0.1",
		// No report to usage.projectcalico.org: the run has no internet, and sends
		// nothing outside the machine.
		"FELIX_USAGEREPORTINGENABLED=false",
	}
}

// Start starts Felix in the node, in its own session, with stdout and stderr
// appended to LogFile, and returns its PID without waiting for it to be ready. If it
// already runs, Start returns its PID. Before the first start on a node it prepares
// what Felix expects of a node (mounts.go) and of the cluster (datastore.go).
func (f *felix) Start(ctx context.Context) (int, error) {
	if pid := f.PID(); pid != 0 {
		return pid, nil
	}
	// What Felix execs: without ipset it panics at its first sync.
	for _, tool := range []string{"iptables", "iptables-save", "iptables-restore", "ipset"} {
		if _, err := exec.LookPath(tool); err != nil {
			return 0, fmt.Errorf("Felix needs %s: %w (install the iptables and ipset packages, e.g. `make deps`)", tool, err)
		}
	}
	if err := os.MkdirAll(f.path("var-lib"), 0o755); err != nil {
		return 0, err
	}
	if err := inNode(f.BPFFS); err != nil {
		return 0, err
	}
	if err := ensureBinds(f.binds()); err != nil {
		return 0, err
	}
	addr, err := nodeAddress(dataInterface)
	if err != nil {
		return 0, err
	}
	ds, err := newDatastore(f.Kubeconfig, f.Build.CRDDir(), f.Build.Version)
	if err != nil {
		return 0, err
	}
	if err := ds.ensure(ctx, f.Node, addr); err != nil {
		return 0, fmt.Errorf("prepare the Kubernetes API as Calico's datastore: %w", err)
	}
	if err := os.WriteFile(f.path(ConfigFile), []byte(configFile), 0o644); err != nil {
		return 0, err
	}
	cmd := exec.Command(f.Build.Felix(), f.identity()...)
	cmd.Env = append(os.Environ(), f.env()...)
	return f.daemon().Start(cmd, nil)
}

// daemon is the node's Felix process: its PID and log files, and the arguments that
// tell it from any other process.
func (f *felix) daemon() daemon.Daemon {
	return daemon.Daemon{Name: "Felix", Dir: f.Dir, PIDFile: PIDFile, LogFile: LogFile, Identity: f.identity()}
}

// identity is Felix's command line, by which PID tells this node's Felix from any
// other process: its config file is in this node's state directory.
func (f *felix) identity() []string { return []string{"--config-file=" + f.path(ConfigFile)} }

// PID returns the PID of this node's running Felix, or 0. A zombie counts as exited,
// and a reused PID is not Felix.
func (f *felix) PID() int { return f.daemon().PID() }

// Status says whether Felix runs and whether it reports itself ready: its readiness
// endpoint answers 200 once every component of Felix reports ready, the dataplane
// among them after its first complete apply in sync with the datastore.
func (f *felix) Status(ctx context.Context) driver.Status {
	st, _ := f.status(ctx)
	return st
}

// status is Status with why Felix is not ready, for the diagnostics.
func (f *felix) status(ctx context.Context) (driver.Status, string) {
	if f.PID() == 0 {
		return driver.Status{}, "Felix does not run"
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	code, body, err := httpGet(ctx, "/readiness")
	switch {
	case err != nil:
		return driver.Status{Running: true}, "readiness: " + err.Error()
	case code != http.StatusOK:
		return driver.Status{Running: true}, fmt.Sprintf("readiness answered %d: %s", code, strings.TrimSpace(string(body)))
	}
	return driver.Status{Running: true, Ready: true}, ""
}

// httpGet asks Felix's health server. The driver runs inside the node, so its
// loopback is the node's.
func httpGet(ctx context.Context, path string) (int, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+healthAddr+path, nil)
	if err != nil {
		return 0, nil, err
	}
	resp, err := (&http.Client{Transport: &http.Transport{Proxy: nil, DisableKeepAlives: true}}).Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	return resp.StatusCode, body, err
}

// Stop stops Felix gracefully (SIGTERM) and returns once it and the rest of its
// process group (proc.StopGroup) have exited. Felix leaves its BPF programs and maps
// in place, so that the node keeps forwarding until its successor takes them over.
func (f *felix) Stop(ctx context.Context) error {
	return f.daemon().Stop(ctx, syscall.SIGTERM)
}

// Kill crashes Felix (SIGKILL to its process group: it leads its own session) and
// returns once it and its children have exited, as in a crashed container.
func (f *felix) Kill(ctx context.Context) error {
	return f.daemon().Kill(ctx)
}

// nodeAddress is the node's IPv4 address on iface, with its prefix length: what
// calico-node autodetects and records as the node's Calico address.
func nodeAddress(iface string) (netip.Prefix, error) {
	l, err := netlink.LinkByName(iface)
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("the node's %s: %w", iface, err)
	}
	addrs, err := netlink.AddrList(l, netlink.FAMILY_V4)
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("addresses of %s: %w", iface, err)
	}
	for _, a := range addrs {
		if a.IP.IsGlobalUnicast() {
			ip, _ := netip.AddrFromSlice(a.IP.To4())
			ones, _ := a.Mask.Size()
			return netip.PrefixFrom(ip, ones), nil
		}
	}
	return netip.Prefix{}, fmt.Errorf("%s has no IPv4 address", iface)
}

// inNode checks that the driver runs inside the node: its /sys/fs/bpf is the node's
// bpffs. The driver binds directories over paths Felix hard-codes; done outside the
// node, that would change the host.
func inNode(bpffs string) error {
	if bpffs == "" {
		return errors.New("DPC_BPFFS is not set: the driver needs the node's bpffs (a netns topology sets it)")
	}
	var here, node syscall.Stat_t
	if err := syscall.Stat("/sys/fs/bpf", &here); err != nil {
		return fmt.Errorf("/sys/fs/bpf: %w", err)
	}
	if err := syscall.Stat(bpffs, &node); err != nil {
		return fmt.Errorf("DPC_BPFFS=%s: %w", bpffs, err)
	}
	if here.Dev != node.Dev {
		return fmt.Errorf("/sys/fs/bpf is not the node's bpffs (DPC_BPFFS=%s): the driver must run inside the node, as the suite runs it (docs/driver.md, Where a call runs)", bpffs)
	}
	return nil
}
