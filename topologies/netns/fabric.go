package netns

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// node is a Kubernetes node: a network namespace with eth0 on the fabric, and a mount
// and cgroup namespace of its own (nodens.go).
type node struct {
	host
	index    int
	podCIDR  netip.Prefix
	stateDir string
	bpffs    string
	mntNS    string // the pinned mount namespace
	cgroupNS string // the pinned cgroup namespace; "" on a host without cgroup v2
	t        *Topology
}

func (n *node) PodCIDR() netip.Prefix { return n.podCIDR }
func (n *node) Interface() string     { return "eth0" }

// BPFFS is the node's private bpffs mount, where its dataplane pins maps and links.
func (n *node) BPFFS() string { return n.bpffs }

// StateDir is DPC_STATE_DIR for the node: private to it and the run, kept across
// agent restarts.
func (n *node) StateDir() string { return n.stateDir }

func (n *node) DriverEnv() []string {
	return []string{
		"DPC_NODE=" + n.name,
		"DPC_NETNS=" + n.NetNSPath(),
		"DPC_KUBECONFIG=" + n.t.Kubeconfig(),
		"DPC_STATE_DIR=" + n.stateDir,
		"DPC_BPFFS=" + n.bpffs,
		"DPC_TOPOLOGY=netns",
		EnvRun + "=" + n.t.runID,
	}
}

func nodeName(i int) string { return "node-" + string(rune('a'+i)) }

// fabricRootAddr is the root namespace's address on the fabric: the nodes' way to
// the API server, which listens on it unless the control plane is borrowed
// (Options.ControlPlanes).
func (t *Topology) fabricRootAddr() netip.Addr { return t.fabricAddr(rootHost).Addr() }

// routeToAPIServer routes every node to a borrowed control plane's API server, which
// listens in the root namespace on an address of its own, through the root
// namespace's address on the fabric.
func (t *Topology) routeToAPIServer(api netip.Addr) error {
	for _, n := range t.nodes {
		h, err := n.handle()
		if err != nil {
			return err
		}
		eth0, err := h.LinkByName("eth0")
		if err == nil {
			err = h.RouteAdd(&netlink.Route{LinkIndex: eth0.Attrs().Index, Dst: ipNet(netip.PrefixFrom(api, 32)), Gw: t.fabricRootAddr().AsSlice()})
		}
		h.Close()
		if err != nil {
			return fmt.Errorf("route to the API server %s on %s: %w", api, n.name, err)
		}
	}
	return nil
}

func (t *Topology) fabricAddr(last byte) netip.Prefix {
	a := t.fabric.Addr().As4()
	a[3] = last
	return netip.PrefixFrom(netip.AddrFrom4(a), t.fabric.Bits())
}

func (t *Topology) fabricNS() string   { return t.runID + "-fabric" }
func (t *Topology) rootLink() string   { return t.runID + "-h" }
func (t *Topology) externalNS() string { return t.runID + "-external" }

// createFabric creates the fabric namespace with its bridge and connects the root
// namespace to it, on a /24 that no other run and no route of this host uses.
func (t *Topology) createFabric() error {
	unlock, err := lockRunRoot(filepath.Dir(t.dir))
	if err != nil {
		return err
	}
	defer unlock()
	// Before the first namespace: one mounted on the plain directory would be hidden
	// by the bind mount that makes it shared, and could never be deleted.
	if err := ensureSharedNetnsDir(); err != nil {
		return err
	}
	if t.fabric, err = freeFabric(); err != nil {
		return err
	}
	fab, err := createNamedNS(t.fabricNS())
	if err != nil {
		return err
	}
	defer fab.Close()
	h, err := netlink.NewHandleAt(fab)
	if err != nil {
		return fmt.Errorf("netlink handle in %s: %w", t.fabricNS(), err)
	}
	defer h.Close()
	if err := linkUpWithAddr(h, "lo", netip.Prefix{}); err != nil {
		return err
	}
	br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: "br0"}}
	if err := h.LinkAdd(br); err != nil {
		return explainLinkErr("bridge", "br0", err)
	}
	if err := linkUpWithAddr(h, "br0", netip.Prefix{}); err != nil {
		return err
	}
	// The root end carries the API server's address.
	veth := &netlink.Veth{
		LinkAttrs:     netlink.LinkAttrs{Name: t.rootLink()},
		PeerName:      "root",
		PeerNamespace: netlink.NsFd(fab),
	}
	if err := netlink.LinkAdd(veth); err != nil {
		return explainLinkErr("veth", t.rootLink(), err)
	}
	root, err := netlink.NewHandle()
	if err != nil {
		return err
	}
	defer root.Close()
	if err := linkUpWithAddr(root, t.rootLink(), t.fabricAddr(rootHost)); err != nil {
		return err
	}
	return t.plugIntoBridge(h, "root")
}

func (t *Topology) plugIntoBridge(h *netlink.Handle, name string) error {
	l, err := h.LinkByName(name)
	if err != nil {
		return fmt.Errorf("find %s in %s: %w", name, t.fabricNS(), err)
	}
	br, err := h.LinkByName("br0")
	if err != nil {
		return err
	}
	if err := h.LinkSetMaster(l, br); err != nil {
		return fmt.Errorf("attach %s to the fabric bridge: %w", name, err)
	}
	return h.LinkSetUp(l)
}

// freeFabric picks the lowest 10.213.N.0/24 that overlaps no route of the root namespace.
func freeFabric() (netip.Prefix, error) {
	routes, err := netlink.RouteList(nil, netlink.FAMILY_V4)
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("list routes: %w", err)
	}
	base := netip.MustParsePrefix(fabricBase).Addr().As4()
	for n := 1; n < 255; n++ {
		a := base
		a[2] = byte(n)
		p := netip.PrefixFrom(netip.AddrFrom4(a), 24)
		used := false
		for _, r := range routes {
			if r.Dst == nil {
				continue // the default route overlaps everything and does not count
			}
			rp, ok := netip.AddrFromSlice(r.Dst.IP)
			ones, _ := r.Dst.Mask.Size()
			if ones == 0 {
				continue
			}
			if ok && netip.PrefixFrom(rp.Unmap(), ones).Overlaps(p) {
				used = true
				break
			}
		}
		if !used {
			return p, nil
		}
	}
	return netip.Prefix{}, fmt.Errorf("no free /24 in %s for the fabric: too many runs or routes; run `dpconform cleanup`", fabricBase)
}

// createNodes creates the nodes' and the external client's namespaces on the fabric.
func (t *Topology) createNodes(ctx context.Context, count int) error {
	fh, err := handleFor(t.fabricNS())
	if err != nil {
		return err
	}
	defer fh.Close()
	if err := ensureSharedNetnsDir(); err != nil {
		return err
	}
	if err := t.prepareNSDir(); err != nil {
		return err
	}
	for i := 0; i < count; i++ {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("creating nodes: %w", err)
		}
		name := nodeName(i)
		n := &node{
			host:     host{name: name, netns: t.runID + "-" + name, ip: t.fabricAddr(byte(firstNodeHost + i)).Addr()},
			index:    i,
			podCIDR:  netip.MustParsePrefix(fmt.Sprintf(podCIDRFormat, i)),
			stateDir: filepath.Join(t.dir, "nodes", name, "state"),
			bpffs:    filepath.Join(t.dir, "nodes", name, "bpffs"),
			t:        t,
		}
		t.mu.Lock()
		t.nodes = append(t.nodes, n)
		t.mu.Unlock()
		t.logf("run %s: creating %s (%s, pods %s)", t.runID, name, n.ip, n.podCIDR)
		if err := t.attachHost(fh, &n.host, name); err != nil {
			return err
		}
		if err := writeSysctls(n.NetNSPath(), map[string]string{
			"net/ipv4/ip_forward":              "1",
			"net/ipv4/conf/all/rp_filter":      "0",
			"net/ipv4/conf/default/rp_filter":  "0",
			"net/ipv4/conf/eth0/rp_filter":     "0",
			"net/ipv4/conf/all/forwarding":     "1",
			"net/ipv4/conf/default/forwarding": "1",
		}); err != nil {
			return fmt.Errorf("configure %s: %w", name, err)
		}
		if err := os.MkdirAll(n.stateDir, 0o755); err != nil {
			return err
		}
		if err := mountBPFFS(n.bpffs); err != nil {
			return err
		}
		if err := t.createNodeNS(n); err != nil {
			return err
		}
		if t.skew != 0 {
			if err := t.createTimeNS(&n.host, clockOffset(t.skew, i)); err != nil {
				return err
			}
		}
	}
	// Host-gw routing: every node reaches the other nodes' pod CIDRs via their IPs.
	for _, n := range t.nodes {
		h, err := n.handle()
		if err != nil {
			return err
		}
		eth0, err := h.LinkByName("eth0")
		if err != nil {
			h.Close()
			return err
		}
		for _, peer := range t.nodes {
			if peer == n {
				continue
			}
			r := &netlink.Route{LinkIndex: eth0.Attrs().Index, Dst: ipNet(peer.podCIDR), Gw: peer.ip.AsSlice()}
			if err := h.RouteAdd(r); err != nil {
				h.Close()
				return fmt.Errorf("route %s via %s on %s: %w", peer.podCIDR, peer.ip, n.name, err)
			}
		}
		h.Close()
	}
	t.external = &host{name: "external", netns: t.externalNS(), ip: t.fabricAddr(externalHost).Addr()}
	if t.skew != 0 {
		if err := t.createTimeNS(t.external, clockOffset(t.skew, -1)); err != nil {
			return err
		}
	}
	t.logf("run %s: creating the external client (%s)", t.runID, t.external.ip)
	return t.attachHost(fh, t.external, "external")
}

// attachHost creates h's namespace with eth0 on the fabric bridge at h.ip.
func (t *Topology) attachHost(fh *netlink.Handle, h *host, port string) error {
	nsh, err := createNamedNS(h.netns)
	if err != nil {
		return err
	}
	defer nsh.Close()
	veth := &netlink.Veth{
		LinkAttrs:     netlink.LinkAttrs{Name: port},
		PeerName:      "eth0",
		PeerNamespace: netlink.NsFd(nsh),
	}
	if err := fh.LinkAdd(veth); err != nil {
		return explainLinkErr("veth", port, err)
	}
	if err := t.plugIntoBridge(fh, port); err != nil {
		return err
	}
	hh, err := netlink.NewHandleAt(nsh)
	if err != nil {
		return err
	}
	defer hh.Close()
	if err := linkUpWithAddr(hh, "lo", netip.Prefix{}); err != nil {
		return err
	}
	return linkUpWithAddr(hh, "eth0", netip.PrefixFrom(h.ip, t.fabric.Bits()))
}

// mountBPFFS mounts a bpffs instance of the node's own, so that pins of one node (or
// run) never meet another's, whether or not /sys/fs/bpf is mounted on this host.
func mountBPFFS(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	if err := unix.Mount("bpf", dir, "bpf", 0, "mode=0700"); err != nil {
		if errors.Is(err, unix.ENODEV) {
			return fmt.Errorf("mount bpffs at %s: this kernel has no bpf filesystem (CONFIG_BPF_SYSCALL): %w", dir, err)
		}
		return fmt.Errorf("mount bpffs at %s: %w", dir, err)
	}
	return nil
}

func openNS(name string) (netns.NsHandle, error) {
	h, err := netns.GetFromName(name)
	if err != nil {
		return netns.None(), fmt.Errorf("open network namespace %s: %w", name, err)
	}
	return h, nil
}

// registerNodes creates the Node objects with their InternalIP and podCIDR, Ready.
func (t *Topology) registerNodes(ctx context.Context) error {
	kube := t.Kube()
	for _, n := range t.nodes {
		obj := &corev1.Node{
			ObjectMeta: metav1.ObjectMeta{
				Name:   n.name,
				Labels: map[string]string{"kubernetes.io/hostname": n.name, "kubernetes.io/os": "linux"},
			},
			Spec: corev1.NodeSpec{PodCIDR: n.podCIDR.String(), PodCIDRs: []string{n.podCIDR.String()}},
		}
		created, err := kube.CoreV1().Nodes().Create(ctx, obj, metav1.CreateOptions{})
		if err != nil {
			return fmt.Errorf("create Node %s: %w", n.name, err)
		}
		now := metav1.Now()
		created.Status = corev1.NodeStatus{
			Addresses: []corev1.NodeAddress{
				{Type: corev1.NodeInternalIP, Address: n.ip.String()},
				{Type: corev1.NodeHostName, Address: n.name},
			},
			Conditions: []corev1.NodeCondition{{
				Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "DpconformTopology",
				LastHeartbeatTime: now, LastTransitionTime: now,
			}},
		}
		if _, err := kube.CoreV1().Nodes().UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("write status of Node %s: %w", n.name, err)
		}
	}
	return nil
}

func ensureNamespace(ctx context.Context, t *Topology, name string) error {
	_, err := t.Kube().CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create Namespace %s: %w", name, err)
	}
	return nil
}
