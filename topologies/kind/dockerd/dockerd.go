// Package dockerd runs the Docker engine that kind needs, started by the project only
// while a kind run or an image build needs it, in a network namespace of its own.
//
// dockerd changes the networking of the namespace it runs in: ip_forward, the FORWARD
// policy, NAT chains and bridges. In its own namespace none of that reaches the host,
// whose netns topologies other runs may be timing at the same moment. The host reaches
// the containers through one veth into that namespace and one route, to an address
// pool of the daemon's own that no route of the host overlaps; both go with the
// daemon. dockerd runs with iptables off: it writes no rule anywhere, and no traffic
// leaves the machine (there is no uplink in the namespace).
//
// The host this project runs on has no CAP_SYS_RESOURCE in its capability bounding
// set, which breaks every `docker run --privileged` (runc cannot apply the capability).
// The daemon's default runtime is therefore runc behind a wrapper (RuntimeWrapperMain,
// the running executable re-executed) that drops CAP_SYS_RESOURCE from a container's
// capability sets before runc sees them; elsewhere the wrapper changes nothing.
package dockerd

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Options configure Start.
type Options struct {
	// Root is the daemon's persistent directory: its data-root (images, build cache)
	// lives in Root/data. Images built there are the cache: a second run reuses them.
	Root string
	// Logf reports progress; nil discards it.
	Logf func(format string, args ...any)
	// Wait bounds the wait for another process of this machine that runs a daemon on
	// the same Root or slot (only one may); zero means as long as ctx allows.
	Wait time.Duration
}

// Daemon is a running dockerd.
type Daemon struct {
	root    string
	run     string // runtime state: socket, pidfile, exec-root, config
	link    string // host side of the veth into the namespace
	slot    int
	cmd     *exec.Cmd
	done    chan struct{}
	unlock  func()
	logf    func(string, ...any)
	stopped bool
}

// Addressing. Each daemon has a slot (1 to 15) derived from its Root, which picks the
// /30 of its veth (10.214.<slot>.0/30: the host .1, the namespace .2) and the /20 its
// networks are made from (10.216.<16*slot>.0/20, /24 each). Neither overlaps the netns
// topology's fabric (10.213.0.0/16); Start refuses a slot whose ranges any route of
// the host already covers.
const (
	linkBase = "10.214.0.0/16"
	poolBase = "10.216.0.0/16"
	maxSlot  = 15
)

// RunDirBase is where daemons keep their runtime state (socket, pid file, exec-root):
// RunDirBase/<slot>.
const RunDirBase = "/run/dpconform-docker"

// linkPrefix names the host side of the daemon's veth.
const linkPrefix = "dpcdocker"

// slotFor derives a daemon's slot from its root, so that the same root gets the same
// addresses across runs (docker keeps its networks' subnets in its data-root).
func slotFor(root string) int {
	h := sha256.Sum256([]byte(filepath.Clean(root)))
	return int(binary.BigEndian.Uint32(h[:4])%maxSlot) + 1
}

// Pool is the range the daemon's networks take their subnets from; the host routes it
// to the daemon's namespace.
func (d *Daemon) Pool() netip.Prefix { return poolFor(d.slot) }

// HostAddress is this machine's address on the daemon's veth: how the containers
// (and so a kind cluster's nodes) reach the host.
func (d *Daemon) HostAddress() netip.Addr {
	host, _ := linkAddrs(d.slot)
	return host
}

func poolFor(slot int) netip.Prefix {
	b := netip.MustParsePrefix(poolBase).Addr().As4()
	b[2] = byte(16 * slot)
	return netip.PrefixFrom(netip.AddrFrom4(b), 20)
}

func linkAddrs(slot int) (host, peer netip.Addr) {
	b := netip.MustParsePrefix(linkBase).Addr().As4()
	b[2] = byte(slot)
	b[3] = 1
	host = netip.AddrFrom4(b)
	b[3] = 2
	return host, netip.AddrFrom4(b)
}

// Host is the daemon's endpoint, for DOCKER_HOST.
func (d *Daemon) Host() string { return "unix://" + d.socket() }

func (d *Daemon) socket() string { return filepath.Join(d.run, "docker.sock") }

// Env is the environment a docker client (the CLI, kind) needs to reach the daemon.
func (d *Daemon) Env() []string { return []string{"DOCKER_HOST=" + d.Host()} }

// NetNS is the path of the daemon's network namespace: dockerd's own. It is not bound
// to a name under /run/netns, so it lives exactly as long as the daemon, its
// containerd and shims do: a killed daemon leaves no namespace to remove.
func (d *Daemon) NetNS() string { return fmt.Sprintf("/proc/%d/ns/net", d.cmd.Process.Pid) }

// CLI is the docker client the project runs: Debian's, which matches Debian's dockerd,
// when it is installed, else the first on PATH.
func CLI() string {
	if _, err := os.Stat("/usr/bin/docker"); err == nil {
		return "/usr/bin/docker"
	}
	return "docker"
}

// Docker runs the docker CLI against the daemon and returns its stdout; the error
// carries stderr.
func (d *Daemon) Docker(ctx context.Context, args ...string) ([]byte, error) {
	return d.DockerIn(ctx, nil, args...)
}

// DockerIn is Docker with stdin.
func (d *Daemon) DockerIn(ctx context.Context, stdin []byte, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, CLI(), args...)
	cmd.Env = append(os.Environ(), d.Env()...)
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.Bytes(), fmt.Errorf("docker %s: %w: %s", strings.Join(args, " "), err, bytes.TrimSpace(stderr.Bytes()))
	}
	return stdout.Bytes(), nil
}

// Command returns a docker CLI command against the daemon, for callers that stream.
func (d *Daemon) Command(ctx context.Context, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, CLI(), args...)
	cmd.Env = append(os.Environ(), d.Env()...)
	return cmd
}

// Start starts dockerd for opts.Root in a network namespace of its own and waits until
// it answers. Only one process of the machine runs a daemon of a given slot at a
// time: Start waits for the lock (opts.Wait, ctx). What a daemon that was killed left
// (its namespace, link, processes) is removed first.
func Start(ctx context.Context, opts Options) (_ *Daemon, err error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("the kind topology runs its own dockerd, which needs root; run as root")
	}
	for _, bin := range []string{"dockerd", "containerd", "runc"} {
		if _, err := exec.LookPath(bin); err != nil {
			return nil, fmt.Errorf("%s not found: install Debian's docker.io (`make deps-kind`): %w", bin, err)
		}
	}
	if opts.Root == "" {
		return nil, errors.New("dockerd.Options.Root is empty: name the daemon's directory (the kind cache)")
	}
	root, err := filepath.Abs(opts.Root)
	if err != nil {
		return nil, err
	}
	d := &Daemon{root: root, slot: slotFor(root), logf: opts.Logf, done: make(chan struct{})}
	if d.logf == nil {
		d.logf = func(string, ...any) {}
	}
	d.run = filepath.Join(RunDirBase, fmt.Sprint(d.slot))
	d.link = fmt.Sprintf("%s%d", linkPrefix, d.slot)
	if err := os.MkdirAll(filepath.Join(root, "data"), 0o711); err != nil {
		return nil, err
	}
	// One daemon per slot: two roots of the same slot would share a runtime
	// directory, a link name and a pool.
	if err := os.MkdirAll(RunDirBase, 0o755); err != nil {
		return nil, err
	}
	if d.unlock, err = lock(ctx, d.run+".lock", opts.Wait, d.logf); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			d.Stop()
		}
	}()
	// A daemon of this root that was killed leaves its namespace and processes; the
	// lock says none runs now.
	if err := d.reap(); err != nil {
		return nil, err
	}
	if err := d.checkRoutes(); err != nil {
		return nil, err
	}
	if err := weighCgroupParent(d.cgroupParent()); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(d.run, 0o700); err != nil {
		return nil, err
	}
	cfg, err := d.writeConfig()
	if err != nil {
		return nil, err
	}
	logPath := filepath.Join(root, "dockerd.log")
	log, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		return nil, err
	}
	defer log.Close()
	d.cmd = exec.Command("dockerd", "--config-file", cfg)
	d.cmd.Dir = d.run
	d.cmd.Stdout, d.cmd.Stderr = log, log
	// A network namespace of its own, made by the clone; dockerd stops its containers
	// when its owner dies, and a later Start of the same root removes what is left.
	d.cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNET, Pdeathsig: syscall.SIGTERM, Setpgid: true}
	d.logf("starting dockerd in a network namespace of its own (data %s, log %s)", filepath.Join(root, "data"), logPath)
	if err := d.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start dockerd: %w", err)
	}
	go func() { d.cmd.Wait(); close(d.done) }()
	// dockerd needs no network to start; the link is up before it answers.
	if err := d.network(); err != nil {
		return nil, err
	}
	if err := d.waitReady(ctx, logPath); err != nil {
		return nil, err
	}
	return d, nil
}

// lock takes an exclusive flock on path, waiting up to wait (0: as long as ctx).
func lock(ctx context.Context, path string, wait time.Duration, logf func(string, ...any)) (func(), error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, err
	}
	if wait > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, wait)
		defer cancel()
	}
	said := false
	for {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			return func() { unix.Flock(int(f.Fd()), unix.LOCK_UN); f.Close() }, nil
		}
		if !errors.Is(err, unix.EWOULDBLOCK) {
			f.Close()
			return nil, fmt.Errorf("lock %s: %w", path, err)
		}
		if !said {
			logf("another process runs a dockerd of this slot; waiting for it (lock %s)", path)
			said = true
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, fmt.Errorf("%w: another process of this machine runs a dockerd of this slot (lock %s held): %w", ErrBusy, path, ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// checkRoutes refuses a slot whose link or pool any route of the host covers.
func (d *Daemon) checkRoutes() error {
	routes, err := netlink.RouteList(nil, netlink.FAMILY_V4)
	if err != nil {
		return fmt.Errorf("list the host's routes: %w", err)
	}
	host, _ := linkAddrs(d.slot)
	mine := []netip.Prefix{netip.PrefixFrom(host, 30).Masked(), d.Pool()}
	for _, r := range routes {
		if r.Dst == nil {
			continue
		}
		p, ok := prefixOf(r.Dst)
		if !ok || p.Bits() == 0 {
			// The default route covers everything and takes nothing: a more
			// specific route wins.
			continue
		}
		for _, m := range mine {
			if p.Overlaps(m) {
				return fmt.Errorf("the host routes %s (%s), which overlaps %s, the range of the dockerd of %s: remove that route or use another cache directory (DPC_CACHE_DIR)", p, r, m, d.root)
			}
		}
	}
	return nil
}

func prefixOf(n *net.IPNet) (netip.Prefix, bool) {
	a, ok := netip.AddrFromSlice(n.IP)
	if !ok {
		return netip.Prefix{}, false
	}
	ones, _ := n.Mask.Size()
	return netip.PrefixFrom(a.Unmap(), ones).Masked(), true
}

// network creates the daemon's namespace, the veth from the host into it with its
// addresses, forwarding inside it, and the host's route to the pool.
func (d *Daemon) network() error {
	h, err := netns.GetFromPath(d.NetNS())
	if err != nil {
		return fmt.Errorf("dockerd's network namespace: %w", err)
	}
	defer h.Close()
	hostIP, peerIP := linkAddrs(d.slot)
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: d.link}, PeerName: "eth0", PeerNamespace: netlink.NsFd(int(h))}
	if err := netlink.LinkAdd(veth); err != nil {
		return fmt.Errorf("create veth %s into %s: %w", d.link, d.NetNS(), err)
	}
	l, err := netlink.LinkByName(d.link)
	if err != nil {
		return err
	}
	if err := netlink.AddrAdd(l, &netlink.Addr{IPNet: ipNet(netip.PrefixFrom(hostIP, 30))}); err != nil {
		return fmt.Errorf("address %s on %s: %w", hostIP, d.link, err)
	}
	if err := netlink.LinkSetUp(l); err != nil {
		return err
	}
	nh, err := netlink.NewHandleAt(h)
	if err != nil {
		return err
	}
	defer nh.Close()
	for _, name := range []string{"lo", "eth0"} {
		pl, err := nh.LinkByName(name)
		if err != nil {
			return fmt.Errorf("%s in %s: %w", name, d.NetNS(), err)
		}
		if name == "eth0" {
			if err := nh.AddrAdd(pl, &netlink.Addr{IPNet: ipNet(netip.PrefixFrom(peerIP, 30))}); err != nil {
				return err
			}
		}
		if err := nh.LinkSetUp(pl); err != nil {
			return err
		}
	}
	if err := ns.WithNetNSPath(d.NetNS(), func(ns.NetNS) error {
		return os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1"), 0o644)
	}); err != nil {
		return fmt.Errorf("ip_forward in %s: %w", d.NetNS(), err)
	}
	route := &netlink.Route{LinkIndex: l.Attrs().Index, Dst: ipNet(d.Pool()), Gw: peerIP.AsSlice()}
	if err := netlink.RouteAdd(route); err != nil {
		return fmt.Errorf("route %s via %s on the host: %w", d.Pool(), peerIP, err)
	}
	return nil
}

func ipNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

// daemonConfig is dockerd's daemon.json.
type daemonConfig struct {
	DataRoot       string             `json:"data-root"`
	ExecRoot       string             `json:"exec-root"`
	Pidfile        string             `json:"pidfile"`
	Hosts          []string           `json:"hosts"`
	Bridge         string             `json:"bridge"`
	IPTables       bool               `json:"iptables"`
	IPMasq         bool               `json:"ip-masq"`
	IP6Tables      bool               `json:"ip6tables,omitempty"`
	CgroupParent   string             `json:"cgroup-parent"`
	DefaultRuntime string             `json:"default-runtime"`
	Runtimes       map[string]runtime `json:"runtimes"`
	AddressPools   []addressPool      `json:"default-address-pools"`
	StorageDriver  string             `json:"storage-driver"`
	LogDriver      string             `json:"log-driver"`
	Containerd     string             `json:"containerd-namespace,omitempty"`
}

type runtime struct {
	Path        string   `json:"path"`
	RuntimeArgs []string `json:"runtimeArgs,omitempty"`
}

type addressPool struct {
	Base string `json:"base"`
	Size int    `json:"size"`
}

// ErrBusy: another process runs the daemon of the same root (a live kind run).
var ErrBusy = errors.New("dockerd busy")

// RuntimeName is the name of the wrapped runc in dockerd's configuration.
const RuntimeName = "dpc-runc"

func (d *Daemon) writeConfig() (string, error) {
	self, err := os.Executable()
	if err != nil {
		return "", fmt.Errorf("find the running executable (dockerd's runtime wrapper): %w", err)
	}
	// dockerd runs its runtime's path alone too (`<path> --version`), so the path
	// is a script that always passes the flag RuntimeWrapperMain looks for.
	wrapper := filepath.Join(d.run, "runc")
	script := fmt.Sprintf("#!/bin/sh\nexec %s %s \"$@\"\n", shellQuote(self), wrapperFlag)
	if err := os.WriteFile(wrapper, []byte(script), 0o755); err != nil {
		return "", err
	}
	cfg := daemonConfig{
		DataRoot: filepath.Join(d.root, "data"),
		ExecRoot: filepath.Join(d.run, "exec"),
		Pidfile:  filepath.Join(d.run, "dockerd.pid"),
		Hosts:    []string{d.Host()},
		// No default bridge: every container the project runs names its network.
		Bridge:         "none",
		IPTables:       false,
		IPMasq:         false,
		CgroupParent:   d.cgroupParent(),
		DefaultRuntime: RuntimeName,
		Runtimes:       map[string]runtime{RuntimeName: {Path: wrapper}},
		AddressPools:   []addressPool{{Base: d.Pool().String(), Size: 24}},
		StorageDriver:  "overlay2",
		LogDriver:      "json-file",
	}
	data, err := json.MarshalIndent(cfg, "", "  ")
	if err != nil {
		return "", err
	}
	p := filepath.Join(d.run, "daemon.json")
	return p, os.WriteFile(p, data, 0o644)
}

func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

func (d *Daemon) waitReady(ctx context.Context, logPath string) error {
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	for {
		select {
		case <-d.done:
			return fmt.Errorf("dockerd exited at start: %v; %s", d.cmd.ProcessState, tail(logPath, 15))
		default:
		}
		if _, err := d.Docker(ctx, "version", "--format", "{{.Server.Version}}"); err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("dockerd did not answer on %s: %w; %s", d.socket(), ctx.Err(), tail(logPath, 15))
		case <-time.After(250 * time.Millisecond):
		case <-d.done:
		}
	}
}

func tail(path string, n int) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return "(no log: " + err.Error() + ")"
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return path + ":\n  " + strings.Join(lines, "\n  ")
}

// Stop stops dockerd (SIGTERM, then SIGKILL after 30 s), kills what it left running
// (containerd and its shims), and removes its namespace, link, route and runtime
// directory. It is safe to call more than once.
func (d *Daemon) Stop() error {
	if d.stopped {
		return nil
	}
	d.stopped = true
	var errs []error
	if d.cmd != nil && d.cmd.Process != nil {
		_ = d.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-d.done:
		case <-time.After(30 * time.Second):
			_ = syscall.Kill(-d.cmd.Process.Pid, syscall.SIGKILL)
			<-d.done
		}
	}
	if err := d.reap(); err != nil {
		errs = append(errs, err)
	}
	if d.unlock != nil {
		d.unlock()
	}
	return errors.Join(errs...)
}

// cgroupParent is where the daemon's containers get their cgroups, in every hierarchy.
func (d *Daemon) cgroupParent() string { return fmt.Sprintf("dpconform-docker-%d", d.slot) }

// reap removes what a daemon of this slot left: processes that carry its runtime
// directory in their command line (dockerd, containerd, shims), the processes of its
// containers (by their cgroups) and those cgroups, mounts under its directories, and
// its host link. Its namespace goes with the last of those processes.
func (d *Daemon) reap() error {
	var errs []error
	if err := killUnder(d.run); err != nil {
		errs = append(errs, err)
	}
	if err := killCgroups(d.cgroupParent()); err != nil {
		errs = append(errs, err)
	}
	for _, dir := range []string{d.run, filepath.Join(d.root, "data")} {
		if err := unmountUnder(dir); err != nil {
			errs = append(errs, err)
		}
	}
	if err := os.RemoveAll(d.run); err != nil {
		errs = append(errs, err)
	}
	// The link is a veth into the daemon's namespace: the kernel deletes it when the
	// last of the processes killed above exits, which may be between the lookup and
	// the delete.
	if l, err := netlink.LinkByName(d.link); err == nil {
		if err := netlink.LinkDel(l); err != nil && !errors.Is(err, unix.ENODEV) {
			errs = append(errs, fmt.Errorf("delete link %s: %w", d.link, err))
		}
	}
	return errors.Join(errs...)
}
