package kind

import (
	"bytes"
	"context"
	"crypto/rand"
	"debug/elf"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/kind/pkg/apis/config/v1alpha4"
	kindcluster "sigs.k8s.io/kind/pkg/cluster"
	"sigs.k8s.io/kind/pkg/cluster/nodes"
	"sigs.k8s.io/kind/pkg/cluster/nodeutils"
	kindlog "sigs.k8s.io/kind/pkg/log"
	"sigs.k8s.io/yaml"

	"github.com/dpconform/dpconform/driver/proc"
	"github.com/dpconform/dpconform/topologies"
	"github.com/dpconform/dpconform/topologies/kind/dockerd"
	"github.com/dpconform/dpconform/topologies/kind/nodeimage"
	"github.com/dpconform/dpconform/topologies/kubeobj"
)

// RunPrefix starts every kind run's ID (and so its cluster's, network's and
// containers' names): "dpk" and five hex digits.
const RunPrefix = "dpk"

// Label marks every Docker object a run creates (network, external client), with the
// run's ID as its value; kind labels its node containers with the cluster's name.
const Label = "org.dpconform.run"

// Options configure a kind cluster.
type Options struct {
	// Nodes is the number of nodes (default 2): one control plane, the rest workers.
	// Every node takes pods and the implementation.
	Nodes int
	// Image is the node image; empty means DPC_KIND_IMAGE, else the image `make
	// kind-image` builds (nodeimage.Tag). Where a registry is reachable, the official
	// kindest/node image of the same Kubernetes version serves as well.
	Image string
	// ProbeBinary is a statically linked executable that runs the suite's probes (the
	// dpconform binary, built with CGO_ENABLED=0). It is mounted into every node at
	// the path it has here, and is the one program of the image the pods and the
	// external client run, at that path too, so a command the suite starts with that
	// path runs on every host of the topology.
	ProbeBinary string
	// CNIConfig is the implementation's CNI network configuration list (info.cni),
	// installed on every node in /etc/cni/net.d; CNIDirs are directories of its own
	// plugins (info.cni_dir), copied to every node's /opt/cni/bin.
	CNIConfig []byte
	CNIDirs   []string
	// KubeProxy is kube-proxy's mode: "none" (default: the implementation replaces
	// it) or "iptables".
	KubeProxy string
	// Docker is the daemon to run the cluster on; nil starts the project's own
	// (dockerd.Start on DockerRoot) for the cluster's lifetime.
	Docker *dockerd.Daemon
	// RunRoot is where run directories live (default $TMPDIR/dpconform-kind).
	RunRoot string
	// Logf reports progress; nil discards it.
	Logf func(format string, args ...any)
}

// Cluster is a running kind cluster of one run. Topologies (Session) are views of it
// for one spec each: a spec's pods and objects go when its topology closes, and the
// cluster stays for the next.
type Cluster struct {
	runID      string
	dir        string
	logf       func(string, ...any)
	daemon     *dockerd.Daemon
	ownDaemon  bool
	provider   *kindcluster.Provider
	network    string
	subnet     netip.Prefix
	gateway    netip.Addr
	image      string
	probe      string
	probeImage string
	kubeconfig string
	restConfig *rest.Config
	kube       kubernetes.Interface
	cniConf    []byte
	nodes      []*node
	external   *external
	host       *hostState
	libModules bool // /lib/modules was made by kind's bind mount and is removed at Close

	mu      sync.Mutex
	session *Topology
	closed  bool
}

// DefaultNodes is how many nodes a cluster has unless Options say otherwise.
const DefaultNodes = 2

// Addresses inside the run's Docker network: docker allocates from its first half
// only (--ip-range), so node i's spare address, firstSpare+i, is never a container's.
const firstSpare = 200

// NewCluster creates a kind cluster for a run. If ctx is cancelled or any step fails,
// everything made so far is removed before it returns.
func NewCluster(ctx context.Context, opts Options) (_ *Cluster, err error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("a kind topology needs root: it runs dockerd and enters the nodes' namespaces; run as root")
	}
	if opts.Nodes == 0 {
		opts.Nodes = DefaultNodes
	}
	if opts.Nodes < 1 || opts.Nodes > 8 {
		return nil, fmt.Errorf("Options.Nodes=%d: a kind topology has 1 to 8 nodes", opts.Nodes)
	}
	switch opts.KubeProxy {
	case "":
		opts.KubeProxy = "none"
	case "none", "iptables":
	default:
		return nil, fmt.Errorf("Options.KubeProxy=%q: want none or iptables", opts.KubeProxy)
	}
	if err := checkStatic(opts.ProbeBinary); err != nil {
		return nil, err
	}
	c := &Cluster{logf: opts.Logf, probe: opts.ProbeBinary, cniConf: opts.CNIConfig}
	if c.logf == nil {
		c.logf = func(string, ...any) {}
	}
	var id [3]byte
	if _, err := rand.Read(id[:]); err != nil {
		return nil, err
	}
	c.runID = RunPrefix + hex.EncodeToString(id[:])[:5]
	root := opts.RunRoot
	if root == "" {
		root = DefaultRunRoot()
	}
	c.dir = filepath.Join(root, c.runID)
	if err := os.MkdirAll(c.dir, 0o755); err != nil {
		return nil, fmt.Errorf("create run directory: %w", err)
	}
	if err := writeOwner(c.dir); err != nil {
		os.RemoveAll(c.dir)
		return nil, err
	}
	defer func() {
		if err != nil {
			c.logf("kind set-up failed, removing what was made: %v", err)
			if cerr := c.Close(); cerr != nil {
				err = errors.Join(err, fmt.Errorf("clean up after failed set-up: %w", cerr))
			}
		}
	}()
	c.host = snapshotHost()
	c.daemon = opts.Docker
	if c.daemon == nil {
		if c.daemon, err = dockerd.Start(ctx, dockerd.Options{Root: DockerRoot(), Logf: c.logf}); err != nil {
			return nil, err
		}
		c.ownDaemon = true
	}
	// kind's library runs the docker CLI with this process's environment.
	os.Setenv("DOCKER_HOST", c.daemon.Host())
	if err := reapRuns(ctx, c.daemon, root, c.logf); err != nil {
		return nil, err
	}
	c.image = opts.Image
	if c.image == "" {
		c.image = os.Getenv("DPC_KIND_IMAGE")
	}
	if c.image == "" {
		c.image = nodeimage.Tag()
	}
	if !nodeimage.Exists(ctx, c.daemon, c.image) {
		// The project's dockerd has no uplink: it pulls nothing.
		how := "build it with `make kind-image`"
		if c.image != nodeimage.Tag() {
			how = "load it there (DOCKER_HOST=" + c.daemon.Host() + " docker load)"
		}
		return nil, fmt.Errorf("node image %s is not in the project's Docker (%s): %s", c.image, DockerRoot(), how)
	}
	if err := c.createNetwork(ctx); err != nil {
		return nil, err
	}
	if c.probeImage, err = probeImage(ctx, c.daemon, c.probe); err != nil {
		return nil, err
	}
	if err := c.create(ctx, opts); err != nil {
		return nil, err
	}
	if err := c.connect(ctx); err != nil {
		return nil, err
	}
	if err := c.fabric(); err != nil {
		return nil, err
	}
	if err := c.mountBPFFS(ctx); err != nil {
		return nil, err
	}
	if err := c.installCNI(ctx, opts.CNIDirs); err != nil {
		return nil, err
	}
	if err := c.loadProbeImage(ctx); err != nil {
		return nil, err
	}
	if err := c.startExternal(ctx); err != nil {
		return nil, err
	}
	if err := c.waitNodesReady(ctx); err != nil {
		return nil, err
	}
	c.logf("kind cluster %s: ready (%d nodes)", c.runID, len(c.nodes))
	return c, nil
}

// DefaultRunRoot is where kind run directories are made: $TMPDIR/dpconform-kind.
func DefaultRunRoot() string { return filepath.Join(os.TempDir(), "dpconform-kind") }

// RunID is the cluster's run ID: its kind cluster's name and the prefix of its
// Docker objects.
func (c *Cluster) RunID() string { return c.runID }

// Daemon is the Docker daemon the cluster runs on.
func (c *Cluster) Daemon() *dockerd.Daemon { return c.daemon }

// Kubeconfig is a kubeconfig that works from the host, the nodes and their
// host-network pods (the file is at the same path in the nodes).
func (c *Cluster) Kubeconfig() string { return c.kubeconfig }

// checkStatic refuses a probe binary that is missing or dynamically linked: the image
// the pods run holds it alone.
func checkStatic(path string) error {
	if path == "" {
		return errors.New("kind.Options.ProbeBinary is empty: name the static dpconform binary the probes run (make build makes one)")
	}
	if !filepath.IsAbs(path) {
		return fmt.Errorf("probe binary %q: want an absolute path", path)
	}
	f, err := elf.Open(path)
	if err != nil {
		return fmt.Errorf("probe binary %s: %w", path, err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return fmt.Errorf("probe binary %s is dynamically linked; the pods' image holds it alone: build it with CGO_ENABLED=0 (make build does)", path)
		}
	}
	return nil
}

// createNetwork creates the run's Docker network in the daemon's pool: a /24 whose
// first half docker allocates, the second half kept for the nodes' spare addresses.
func (c *Cluster) createNetwork(ctx context.Context) error {
	out, err := c.daemon.Docker(ctx, "network", "ls", "--format", "{{.ID}}")
	if err != nil {
		return err
	}
	used := map[netip.Prefix]bool{}
	for _, id := range strings.Fields(string(out)) {
		o, err := c.daemon.Docker(ctx, "network", "inspect", "--format", "{{range .IPAM.Config}}{{.Subnet}} {{end}}", id)
		if err != nil {
			continue
		}
		for _, s := range strings.Fields(string(o)) {
			if p, err := netip.ParsePrefix(s); err == nil {
				used[p.Masked()] = true
			}
		}
	}
	pool := c.daemon.Pool()
	base := pool.Addr().As4()
	for i := 0; i < 1<<(24-pool.Bits()); i++ {
		b := base
		b[2] += byte(i)
		p := netip.PrefixFrom(netip.AddrFrom4(b), 24)
		if used[p] {
			continue
		}
		c.subnet = p
		gw := b
		gw[3] = 1
		c.gateway = netip.AddrFrom4(gw)
		half := netip.PrefixFrom(netip.AddrFrom4(b), 25)
		c.network = c.runID
		c.logf("kind cluster %s: network %s (%s)", c.runID, c.network, p)
		_, err := c.daemon.Docker(ctx, "network", "create", "--driver", "bridge", "--subnet", p.String(), "--ip-range", half.String(),
			"--gateway", c.gateway.String(), "--label", Label+"="+c.runID, "-o", "com.docker.network.bridge.enable_ip_masquerade=false",
			"-o", "com.docker.network.driver.mtu=1500", c.network)
		if err != nil {
			return err
		}
		return c.spareUnreachable(true)
	}
	return fmt.Errorf("no free /24 left in %s for a kind network: remove old networks (`dpconform cleanup`)", pool)
}

// spareHalf is the half of the run's network Docker never allocates: the nodes'
// spare addresses.
func (c *Cluster) spareHalf() netip.Prefix {
	b := c.subnet.Addr().As4()
	b[3] = 128
	return netip.PrefixFrom(netip.AddrFrom4(b), 25)
}

// spareUnreachable adds (or removes) an unreachable route for the spare half at the
// gateway. A node forwards a packet for an address it does not hold by its default
// route, the gateway; with no host there, the gateway would drop it after failed
// ARP, seconds later. As on netns, where a node has no route for it, the sender hears
// at once that it is unreachable.
func (c *Cluster) spareUnreachable(add bool) error {
	h, err := netns.GetFromPath(c.daemon.NetNS())
	if err != nil {
		return err
	}
	defer h.Close()
	nh, err := netlink.NewHandleAt(h)
	if err != nil {
		return err
	}
	defer nh.Close()
	half := c.spareHalf()
	r := &netlink.Route{Dst: &net.IPNet{IP: half.Addr().AsSlice(), Mask: net.CIDRMask(25, 32)}, Type: unix.RTN_UNREACHABLE}
	if add {
		err = nh.RouteAdd(r)
	} else {
		err = nh.RouteDel(r)
	}
	if err != nil && !(errors.Is(err, unix.ESRCH) && !add) {
		return fmt.Errorf("unreachable route for %s at the gateway: %w", half, err)
	}
	return nil
}

// probeImage makes an image holding only the probe binary, at its path, and returns
// its name: a digest of the binary and its path, so a rebuilt or moved binary gets an
// image of its own.
func probeImage(ctx context.Context, d *dockerd.Daemon, bin string) (string, error) {
	name, err := kubeobj.ProbeImage(bin)
	if err != nil {
		return "", err
	}
	data, err := os.ReadFile(bin)
	if err != nil {
		return "", err
	}
	if nodeimage.Exists(ctx, d, name) {
		return name, nil
	}
	tarball, err := nodeimage.Tar([]nodeimage.File{{Data: data, Dst: strings.TrimPrefix(bin, "/"), Mode: 0o755}})
	if err != nil {
		return "", err
	}
	entry, _ := json.Marshal([]string{bin, "pause"})
	if _, err := d.DockerIn(ctx, tarball, "import", "--change", "ENTRYPOINT "+string(entry), "-", name); err != nil {
		return "", fmt.Errorf("probe image: %w", err)
	}
	return name, nil
}

// kubeadmPatches disable what no spec needs and this host cannot give.
func kubeadmPatches() []string {
	return []string{
		// No spec resolves a name; CoreDNS is not built offline.
		"kind: ClusterConfiguration\ndns:\n  disabled: true\n",
		// Every node takes pods, the control plane's too.
		"kind: InitConfiguration\nnodeRegistration:\n  taints: []\n",
		// Kubernetes 1.35+ refuses cgroup v1 unless told; this host's hierarchy is
		// v1 (hybrid) and fixed.
		"kind: KubeletConfiguration\nfailCgroupV1: false\n",
	}
}

func (c *Cluster) create(ctx context.Context, opts Options) error {
	mounts := []v1alpha4.Mount{
		{HostPath: c.dir, ContainerPath: c.dir},
		{HostPath: c.probe, ContainerPath: c.probe, Readonly: true},
	}
	cfg := &v1alpha4.Cluster{
		TypeMeta: v1alpha4.TypeMeta{Kind: "Cluster", APIVersion: "kind.x-k8s.io/v1alpha4"},
		Networking: v1alpha4.Networking{
			DisableDefaultCNI: true,
			KubeProxyMode:     v1alpha4.ProxyMode(opts.KubeProxy),
			PodSubnet:         "10.244.0.0/16",
			ServiceSubnet:     "10.96.0.0/16",
		},
		KubeadmConfigPatches: kubeadmPatches(),
	}
	if !hasCapSysResource() {
		// containerd in the node lowers oom_score_adj for sandboxes unless told not
		// to, which needs CAP_SYS_RESOURCE ("can't get final child's PID from pipe").
		cfg.ContainerdConfigPatches = []string{"[plugins.\"io.containerd.grpc.v1.cri\"]\n  restrict_oom_score_adj = true\n"}
	}
	for i := 0; i < opts.Nodes; i++ {
		role := v1alpha4.WorkerRole
		if i == 0 {
			role = v1alpha4.ControlPlaneRole
		}
		cfg.Nodes = append(cfg.Nodes, v1alpha4.Node{Role: role, Image: c.image, ExtraMounts: mounts})
	}
	raw, err := yaml.Marshal(cfg)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(c.dir, "kind-config.yaml"), raw, 0o644); err != nil {
		return err
	}
	if _, err := os.Stat("/lib/modules"); os.IsNotExist(err) {
		// kind bind-mounts the host's /lib/modules into its nodes, and docker makes
		// the directory when it is missing; it goes again at Close.
		c.libModules = true
	}
	c.provider = kindcluster.NewProvider(kindcluster.ProviderWithDocker(), kindcluster.ProviderWithLogger(kindLogger{c.logf}))
	os.Setenv("KIND_EXPERIMENTAL_DOCKER_NETWORK", c.network)
	defer os.Unsetenv("KIND_EXPERIMENTAL_DOCKER_NETWORK")
	start := time.Now()
	c.logf("kind cluster %s: creating %d nodes from %s", c.runID, opts.Nodes, c.image)
	// kind's Create takes no context; a cancelled run deletes the cluster after it.
	done := make(chan error, 1)
	go func() {
		done <- c.provider.Create(c.runID, kindcluster.CreateWithV1Alpha4Config(cfg),
			kindcluster.CreateWithKubeconfigPath(filepath.Join(c.dir, "kind.kubeconfig")),
			kindcluster.CreateWithDisplayUsage(false), kindcluster.CreateWithDisplaySalutation(false))
	}()
	select {
	case err = <-done:
	case <-ctx.Done():
		err = <-done
		if err == nil {
			err = ctx.Err()
		}
	}
	if err != nil {
		return fmt.Errorf("kind create cluster %s: %w", c.runID, err)
	}
	c.logf("kind cluster %s: created in %s", c.runID, time.Since(start).Round(100*time.Millisecond))
	return nil
}

func hasCapSysResource() bool {
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return false
	}
	for _, l := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(l, "CapBnd:"); ok {
			var bits uint64
			fmt.Sscanf(strings.TrimSpace(v), "%x", &bits)
			const capSysResource = 24
			return bits&(1<<capSysResource) != 0
		}
	}
	return false
}

// connect writes the cluster's kubeconfig with the control plane's address on the
// run's network (the host routes to it; kind's own port mapping lives in the daemon's
// namespace) and learns the nodes.
func (c *Cluster) connect(ctx context.Context) error {
	kc, err := c.provider.KubeConfig(c.runID, true)
	if err != nil {
		return err
	}
	all, err := c.provider.ListNodes(c.runID)
	if err != nil {
		return err
	}
	cp, err := nodeutils.BootstrapControlPlaneNode(all)
	if err != nil {
		return err
	}
	cpIP, err := c.containerIP(ctx, cp.String())
	if err != nil {
		return err
	}
	kc = strings.ReplaceAll(kc, "https://"+cp.String()+":6443", "https://"+cpIP.String()+":6443")
	c.kubeconfig = filepath.Join(c.dir, "kubeconfig")
	if err := os.WriteFile(c.kubeconfig, []byte(kc), 0o600); err != nil {
		return err
	}
	if c.restConfig, err = clientcmd.BuildConfigFromFlags("", c.kubeconfig); err != nil {
		return err
	}
	c.restConfig.QPS, c.restConfig.Burst = 200, 400
	if c.kube, err = kubernetes.NewForConfig(c.restConfig); err != nil {
		return err
	}
	// Nodes in kind's order: the control plane first, then the workers by name.
	ordered := []nodes.Node{cp}
	workers, _ := nodeutils.SelectNodesByRole(all, "worker")
	ordered = append(ordered, workers...)
	for i, n := range ordered {
		nd, err := c.newNode(ctx, i, n)
		if err != nil {
			return err
		}
		c.nodes = append(c.nodes, nd)
	}
	return nil
}

func (c *Cluster) containerIP(ctx context.Context, name string) (netip.Addr, error) {
	out, err := c.daemon.Docker(ctx, "inspect", "--format", "{{range .NetworkSettings.Networks}}{{.IPAddress}} {{end}}", name)
	if err != nil {
		return netip.Addr{}, err
	}
	f := strings.Fields(string(out))
	if len(f) != 1 {
		return netip.Addr{}, fmt.Errorf("container %s has addresses %q, want one", name, f)
	}
	return netip.ParseAddr(f[0])
}

func (c *Cluster) containerPID(ctx context.Context, name string) (int, error) {
	out, err := c.daemon.Docker(ctx, "inspect", "--format", "{{.State.Pid}}", name)
	if err != nil {
		return 0, err
	}
	var pid int
	if _, err := fmt.Sscan(string(out), &pid); err != nil || pid == 0 {
		return 0, fmt.Errorf("container %s has no process (%q)", name, out)
	}
	return pid, nil
}

// newNode learns node i: its container, its Node object's address and pod CIDR (which
// the controller manager assigns once the node registers), and makes its state
// directory.
func (c *Cluster) newNode(ctx context.Context, i int, kn nodes.Node) (*node, error) {
	n := &node{c: c, name: kn.String(), index: i}
	var err error
	if n.pid, err = c.containerPID(ctx, n.name); err != nil {
		return nil, err
	}
	if n.ip, err = c.containerIP(ctx, n.name); err != nil {
		return nil, err
	}
	spare := c.subnet.Addr().As4()
	spare[3] = byte(firstSpare + i)
	n.spare = netip.AddrFrom4(spare)
	n.stateDir = filepath.Join(c.dir, "nodes", n.name)
	if err := os.MkdirAll(n.stateDir, 0o755); err != nil {
		return nil, err
	}
	wctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	for {
		obj, err := c.kube.CoreV1().Nodes().Get(wctx, n.name, metav1.GetOptions{})
		if err == nil && obj.Spec.PodCIDR != "" {
			if n.podCIDR, err = netip.ParsePrefix(obj.Spec.PodCIDR); err != nil {
				return nil, fmt.Errorf("Node %s: pod CIDR %q: %w", n.name, obj.Spec.PodCIDR, err)
			}
			return n, nil
		}
		select {
		case <-wctx.Done():
			return nil, fmt.Errorf("Node %s has no pod CIDR (last error: %v): %w", n.name, err, wctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// bpffsMagic is statfs's f_type of a bpffs.
const bpffsMagic = 0xcafe4a11

// mountBPFFS mounts a bpffs at /sys/fs/bpf in every node, as systemd does at a host's
// boot (in a container it does not): each node has its own, as on netns, and an
// agent's pins outlive its pod on its node.
func (c *Cluster) mountBPFFS(ctx context.Context) error {
	for _, n := range c.nodes {
		var st unix.Statfs_t
		if err := unix.Statfs(fmt.Sprintf("/proc/%d/root/sys/fs/bpf", n.pid), &st); err == nil && st.Type == bpffsMagic {
			continue
		}
		cmd := exec.CommandContext(ctx, "mount", "-t", "bpf", "bpffs", "/sys/fs/bpf")
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := enter(n, cmd); err != nil {
			return err
		}
		if err := cmd.Wait(); err != nil {
			return fmt.Errorf("mount a bpffs at /sys/fs/bpf in %s: %w: %s", n.name, err, bytes.TrimSpace(out.Bytes()))
		}
	}
	return nil
}

// fabric gives the nodes the routing of the netns topology's fabric: forwarding on,
// reverse-path filtering off (kind's image turns it on), and a host-gw route to every
// other node's pod CIDR. kind's own CNI (kindnet) would add those routes; it is off,
// and the implementation's CNI (refdp's is ptp) need not route between nodes.
func (c *Cluster) fabric() error {
	for _, n := range c.nodes {
		err := ns.WithNetNSPath(fmt.Sprintf("/proc/%d/ns/net", n.pid), func(ns.NetNS) error {
			for k, v := range map[string]string{
				"net/ipv4/ip_forward":             "1",
				"net/ipv4/conf/all/rp_filter":     "0",
				"net/ipv4/conf/default/rp_filter": "0",
				"net/ipv4/conf/eth0/rp_filter":    "0",
			} {
				if err := os.WriteFile("/proc/sys/"+k, []byte(v), 0o644); err != nil {
					return fmt.Errorf("sysctl %s=%s: %w", k, v, err)
				}
			}
			eth0, err := netlink.LinkByName("eth0")
			if err != nil {
				return err
			}
			for _, peer := range c.nodes {
				if peer == n {
					continue
				}
				r := &netlink.Route{LinkIndex: eth0.Attrs().Index, Dst: &net.IPNet{IP: peer.podCIDR.Addr().AsSlice(), Mask: net.CIDRMask(peer.podCIDR.Bits(), 32)}, Gw: peer.ip.AsSlice()}
				if err := netlink.RouteReplace(r); err != nil {
					return fmt.Errorf("route %s via %s: %w", peer.podCIDR, peer.ip, err)
				}
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("node %s: %w", n.name, err)
		}
	}
	return nil
}

// cniDataDir is where, inside each node, the CNI plugins keep their state
// (${CNI_DATA_DIR}).
const cniDataDir = "/var/lib/cni/dpconform"

// installCNI writes the implementation's network configuration, expanded for each
// node, to the node's /etc/cni/net.d, and copies its own plugins to /opt/cni/bin:
// containerd in the node then wires every pod with it, as it would a vendor's CNI.
func (c *Cluster) installCNI(ctx context.Context, dirs []string) error {
	conf := c.cniConf
	if len(conf) == 0 {
		conf = []byte(DefaultCNIConfig)
	}
	var name struct {
		Name string `json:"name"`
	}
	if err := json.Unmarshal(conf, &name); err != nil || name.Name == "" {
		return fmt.Errorf("the implementation's CNI configuration (info.cni) is not a network configuration list with a name: %v", err)
	}
	for _, n := range c.nodes {
		root := fmt.Sprintf("/proc/%d/root", n.pid)
		for _, d := range dirs {
			entries, err := os.ReadDir(d)
			if err != nil {
				return fmt.Errorf("CNI plugin directory %s (info.cni_dir): %w", d, err)
			}
			for _, e := range entries {
				data, err := os.ReadFile(filepath.Join(d, e.Name()))
				if err != nil {
					return err
				}
				if err := os.WriteFile(filepath.Join(root, "opt/cni/bin", e.Name()), data, 0o755); err != nil {
					return fmt.Errorf("copy CNI plugin %s to %s: %w", e.Name(), n.name, err)
				}
			}
		}
		expanded, err := expandCNIConfig(conf, map[string]string{
			"POD_CIDR": n.podCIDR.String(), "NODE_NAME": n.name, "NODE_IP": n.ip.String(),
			"CNI_DATA_DIR": cniDataDir, "KUBECONFIG": c.kubeconfig, "STATE_DIR": n.stateDir,
		})
		if err != nil {
			return err
		}
		dst := filepath.Join(root, "etc/cni/net.d", "10-"+name.Name+".conflist")
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(dst, expanded, 0o644); err != nil {
			return fmt.Errorf("install the CNI configuration on %s: %w", n.name, err)
		}
	}
	return nil
}

// DefaultCNIConfig is the pod network when the implementation brings none: the
// standard ptp and host-local plugins, as on the netns topology.
const DefaultCNIConfig = `{
  "cniVersion": "1.0.0",
  "name": "dpconform",
  "plugins": [
    {
      "type": "ptp",
      "ipMasq": false,
      "ipam": {"type": "host-local", "ranges": [[{"subnet": "${POD_CIDR}"}]], "routes": [{"dst": "0.0.0.0/0"}], "dataDir": "${CNI_DATA_DIR}/ipam"}
    }
  ]
}`

// expandCNIConfig replaces the ${VAR}s of docs/driver.md; any other is an error.
func expandCNIConfig(conf []byte, vars map[string]string) ([]byte, error) {
	var bad []string
	out := os.Expand(string(conf), func(k string) string {
		v, ok := vars[k]
		if !ok {
			bad = append(bad, "${"+k+"}")
			return ""
		}
		return v
	})
	if len(bad) > 0 {
		return nil, fmt.Errorf("the implementation's CNI configuration uses %s; the topology expands only ${POD_CIDR}, ${NODE_NAME}, ${NODE_IP}, ${CNI_DATA_DIR}, ${KUBECONFIG} and ${STATE_DIR}", strings.Join(bad, ", "))
	}
	return []byte(out), nil
}

// loadProbeImage imports the probe image into every node's containerd.
func (c *Cluster) loadProbeImage(ctx context.Context) error {
	for _, n := range c.nodes {
		save := c.daemon.Command(ctx, "save", c.probeImage)
		var out bytes.Buffer
		save.Stdout = &out
		var serr bytes.Buffer
		save.Stderr = &serr
		if err := save.Run(); err != nil {
			return fmt.Errorf("docker save %s: %w: %s", c.probeImage, err, serr.Bytes())
		}
		if err := nodeutils.LoadImageArchive(kindNode(c, n.name), &out); err != nil {
			return fmt.Errorf("load %s into %s: %w", c.probeImage, n.name, err)
		}
	}
	return nil
}

// kindNode returns the kind library's handle of a node container.
func kindNode(c *Cluster, name string) nodes.Node {
	all, _ := c.provider.ListNodes(c.runID)
	for _, n := range all {
		if n.String() == name {
			return n
		}
	}
	return nil
}

// startExternal runs the external client: a container of the probe image on the
// run's network, outside the cluster.
func (c *Cluster) startExternal(ctx context.Context) error {
	name := c.runID + "-external"
	if _, err := c.daemon.Docker(ctx, "run", "-d", "--name", name, "--hostname", "external", "--network", c.network,
		"--label", Label+"="+c.runID, "--cap-add", "NET_ADMIN", "--cap-add", "NET_RAW", c.probeImage); err != nil {
		return err
	}
	e := &external{c: c, name: name}
	var err error
	if e.ip, err = c.containerIP(ctx, name); err != nil {
		return err
	}
	if e.pid, err = c.containerPID(ctx, name); err != nil {
		return err
	}
	c.external = e
	return nil
}

// waitNodesReady waits until every Node is Ready: its kubelet runs and its runtime
// found the CNI configuration.
func (c *Cluster) waitNodesReady(ctx context.Context) error {
	wctx, cancel := context.WithTimeout(ctx, 120*time.Second)
	defer cancel()
	for _, n := range c.nodes {
		for {
			obj, err := c.kube.CoreV1().Nodes().Get(wctx, n.name, metav1.GetOptions{})
			if err == nil && nodeReady(obj) {
				break
			}
			select {
			case <-wctx.Done():
				return fmt.Errorf("Node %s is not Ready (last error: %v): %w", n.name, err, wctx.Err())
			case <-time.After(250 * time.Millisecond):
			}
		}
	}
	return nil
}

func nodeReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// Close deletes the cluster, its network and external client, restores the host-wide
// settings the kubelets changed, stops the daemon if the cluster started it, and
// removes the run directory. It is safe to call more than once.
func (c *Cluster) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	s := c.session
	c.mu.Unlock()
	var errs []error
	if s != nil {
		errs = append(errs, s.Close())
	}
	if c.daemon != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		errs = append(errs, removeRun(ctx, c.daemon, c.runID, c.logf))
		cancel()
		if c.subnet.IsValid() {
			errs = append(errs, c.spareUnreachable(false))
		}
	}
	if c.host != nil {
		errs = append(errs, c.host.restore(c.logf))
	}
	if c.libModules {
		// Only if empty: what else may have been put there is not the run's.
		if err := os.Remove("/lib/modules"); err != nil && !os.IsNotExist(err) {
			errs = append(errs, fmt.Errorf("remove /lib/modules, which kind's bind mount made: %w", err))
		}
	}
	if c.ownDaemon && c.daemon != nil {
		errs = append(errs, c.daemon.Stop())
	}
	if err := os.RemoveAll(c.dir); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// kindLogger adapts Logf to kind's logger, for its progress lines.
type kindLogger struct{ logf func(string, ...any) }

func (l kindLogger) Warn(m string)                         { l.logf("kind: %s", m) }
func (l kindLogger) Warnf(f string, a ...any)              { l.logf("kind: "+f, a...) }
func (l kindLogger) Error(m string)                        { l.logf("kind: %s", m) }
func (l kindLogger) Errorf(f string, a ...any)             { l.logf("kind: "+f, a...) }
func (l kindLogger) V(lv kindlog.Level) kindlog.InfoLogger { return kindInfo{l.logf, lv <= 0} }

type kindInfo struct {
	logf func(string, ...any)
	on   bool
}

func (i kindInfo) Info(m string) {
	if i.on {
		i.logf("kind: %s", strings.TrimSpace(m))
	}
}
func (i kindInfo) Infof(f string, a ...any) {
	if i.on {
		i.logf("kind: "+strings.TrimSpace(f), a...)
	}
}
func (i kindInfo) Enabled() bool { return i.on }

// owner records the process that made a run, to tell a killed run from a live one.
type owner struct {
	PID       int    `json:"pid"`
	StartTime uint64 `json:"startTime"`
}

func writeOwner(dir string) error {
	st, err := proc.StartTime(os.Getpid())
	if err != nil {
		return err
	}
	data, _ := json.Marshal(owner{PID: os.Getpid(), StartTime: st})
	return os.WriteFile(filepath.Join(dir, "owner.json"), data, 0o644)
}

func ownerAlive(dir string) bool {
	data, err := os.ReadFile(filepath.Join(dir, "owner.json"))
	if err != nil {
		return false
	}
	var o owner
	if json.Unmarshal(data, &o) != nil {
		return false
	}
	st, err := proc.StartTime(o.PID)
	return err == nil && st == o.StartTime
}

// Nodes are the cluster's nodes, in the order a topology gives them.
func (c *Cluster) Nodes() []topologies.Node {
	out := make([]topologies.Node, len(c.nodes))
	for i, n := range c.nodes {
		out[i] = n
	}
	return out
}
