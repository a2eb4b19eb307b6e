// Package agent is the reference dataplane's per-node agent (refdp). It watches the API
// server and the node's addresses and programs the node. State that must outlive it
// (maps, program links) is pinned in the node's bpffs, so traffic keeps flowing while
// the agent is stopped, and a restarted agent adopts it.
//
// Its order of operations is its invariant; each step relies on those before it:
//
//  0. write refdp's iptables chains with no workload (Run, once): they mark what Linux
//     conntrack knows of fallthrough packets VOUCHED, and the programs drop a
//     fallthrough packet without that mark, so the marking comes first; the chains
//     accept nothing the programs have not marked;
//  1. attach the host interface's programs (Run, once);
//  2. attach the endpoint programs of local workloads (each round from here on, and
//     only once the view is complete: datastore in sync and host IPs known);
//  3. write refdp's iptables chains, again whenever the set of workload interfaces
//     changes: after the programs, so that the chains accept from and to a workload
//     only once its programs police it;
//  4. write service NAT state: after the chains, because a packet the datapath NATs
//     is accepted in FORWARD only by refdp's chains (kube-proxy's FORWARD accepts
//     what kube-proxy's own NAT marked, or established flows). Before this step the
//     datapath NATs nothing, and kube-proxy's rules still NAT new connections;
//  5. after the first complete round, once: remove kube-proxy's rules, if any. Only
//     now does the datapath NAT every service, and do refdp's chains accept what
//     kube-proxy's FORWARD accepted: flows that predate the datapath (fallthrough
//     packets the Linux stack's conntrack knows);
//  6. report ready.
package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/vishvananda/netlink"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/dpconform/dpconform/bpf"
	"github.com/dpconform/dpconform/reference/faults"
	"github.com/dpconform/dpconform/reference/iptables"
	"github.com/dpconform/dpconform/reference/services"
)

// Config configures an agent.
type Config struct {
	// Node is the name of this node's Node object.
	Node string
	// Kubeconfig is the path of a kubeconfig for the API server.
	Kubeconfig string
	// PinDir is where maps and links are pinned (a directory on a bpffs).
	PinDir string
	// StateDir holds the status file.
	StateDir string
	// HostInterface is the node's interface to the network (default "eth0").
	HostInterface string
	// ConntrackSize is the conntrack table's capacity (0: the datapath's default).
	ConntrackSize uint32
	// Faults are the defects to reintroduce (self-test only).
	Faults faults.Set
	// Log receives the agent's log (default: stderr).
	Log *slog.Logger
}

// hostIPDelay is how late host-IP discovery reports under the eager-service-sync
// fault: long enough to erase NodePort frontends for a measurable time, as in Calico
// issue 12192 (~0.5 s).
const hostIPDelay = 400 * time.Millisecond

// Agent is a running agent.
type Agent struct {
	cfg    Config
	log    *slog.Logger
	dp     *bpf.Datapath
	syncer *services.Syncer
	status *statusFile

	kick chan struct{}
	// applied is closed after the first service apply (the eager-service-sync fault
	// holds host-IP discovery back until then).
	applied     chan struct{}
	appliedOnce sync.Once

	mu      sync.Mutex
	hostIPs []netip.Addr
	hostIdx int
	hostsOK bool // host IPs known

	svcLister   cacheLister
	sliceLister cacheLister
	podLister   cacheLister
	nodeLister  cacheLister
	synced      []cache.InformerSynced

	attached map[string]endpoint // pod key -> endpoint
	// iptablesFor is the set of workload ifindexes refdp's chains were last written
	// for (nil: not written yet).
	iptablesFor   []int
	tookOver      bool // kube-proxy's rules removed (or found absent)
	ready         bool
	lastSyncError string
}

type endpoint struct {
	ifindex int
	ip      netip.Addr
}

type cacheLister interface{ List() []any }

type indexerLister struct{ cache.Indexer }

func (l indexerLister) List() []any { return l.Indexer.List() }

// Run runs the agent until ctx ends, then leaves the datapath in place and returns.
func Run(ctx context.Context, cfg Config) error {
	if cfg.HostInterface == "" {
		cfg.HostInterface = "eth0"
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	if cfg.Node == "" || cfg.Kubeconfig == "" || cfg.PinDir == "" || cfg.StateDir == "" {
		return errors.New("agent: Node, Kubeconfig, PinDir and StateDir are required")
	}
	a := &Agent{cfg: cfg, log: cfg.Log, kick: make(chan struct{}, 1), applied: make(chan struct{}), attached: map[string]endpoint{}}
	a.status = &statusFile{path: filepath.Join(cfg.StateDir, StatusFile)}
	if err := a.status.write(false, "starting"); err != nil {
		return err
	}
	defer a.status.write(false, "stopped")
	if err := os.MkdirAll(cfg.PinDir, 0o700); err != nil {
		return fmt.Errorf("create pin directory: %w", err)
	}

	var err error
	a.dp, err = bpf.Open(cfg.PinDir, bpf.Options{ConntrackSize: cfg.ConntrackSize, UnpinnedConntrack: cfg.Faults.Has(faults.UnpinnedConntrack)})
	if err != nil {
		return err
	}
	// Close releases file descriptors only: pinned maps and links stay, and with them
	// the datapath.
	defer a.dp.Close()
	a.syncer, err = services.NewSyncer(a.dp.Frontends(), a.dp.Backends(), services.SyncerOptions{
		RebuildBackendsInPlace: cfg.Faults.Has(faults.RebuildBackendsInPlace),
	})
	if err != nil {
		return err
	}
	if cfg.Faults.Has(faults.FlushNATOnStart) {
		a.log.Warn("fault: flushing NAT maps on start", "fault", faults.FlushNATOnStart)
		if err := a.syncer.Flush(); err != nil {
			return err
		}
	}

	link, err := netlink.LinkByName(cfg.HostInterface)
	if err != nil {
		return fmt.Errorf("host interface %s: %w (set --host-interface)", cfg.HostInterface, err)
	}
	if cfg.Faults.Has(faults.DropClusterIPFrontendsOnStart) {
		if err := a.dropClusterIPFrontends(link); err != nil {
			return err
		}
	}
	if cfg.Faults.Has(faults.CleanupBeforeAttach) {
		// Out of order: until the programs are attached and the services written, a
		// new connection finds neither kube-proxy's NAT nor the datapath's.
		a.log.Warn("fault: removing kube-proxy's rules before attaching programs and writing services", "fault", faults.CleanupBeforeAttach)
		if err := a.takeOver(ctx); err != nil {
			a.log.Error("take over from kube-proxy", "err", err)
		}
	}
	a.hostIdx = link.Attrs().Index
	// NodePort traffic to a remote backend leaves by the interface it came in on; an
	// ICMP redirect would tell the client to bypass this node, and its NAT.
	if err := writeSysctl("net/ipv4/conf/all/send_redirects", "0"); err != nil {
		return err
	}
	if err := writeSysctl("net/ipv4/conf/"+cfg.HostInterface+"/send_redirects", "0"); err != nil {
		return err
	}
	// The chains first, with no workload yet (step 0): the programs drop a
	// fallthrough packet that iptables has not vouched for, so the rule that vouches
	// must exist before they are attached, or flows that predate the datapath would
	// stall until the first round writes it.
	if err := a.syncIPTables(ctx); err != nil {
		return err
	}
	if err := a.dp.AttachHost(a.hostIdx); err != nil {
		return fmt.Errorf("attach to %s: %w", cfg.HostInterface, err)
	}
	if n, err := a.dp.MigrateConntrack(); err != nil {
		return err
	} else if n > 0 {
		a.log.Info("migrated conntrack entries from the previous map", "entries", n)
	}

	kube, err := a.client()
	if err != nil {
		return err
	}
	go a.watchHostIPs(ctx, link)
	a.startInformers(ctx, kube)
	a.status.write(false, "waiting for the datastore and host IPs")
	return a.loop(ctx)
}

func (a *Agent) client() (kubernetes.Interface, error) {
	rc, err := clientcmd.BuildConfigFromFlags("", a.cfg.Kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("kubeconfig %s: %w", a.cfg.Kubeconfig, err)
	}
	rc.QPS, rc.Burst = 100, 200
	rc.UserAgent = "refdp/" + a.cfg.Node
	return kubernetes.NewForConfig(rc)
}

func (a *Agent) startInformers(ctx context.Context, kube kubernetes.Interface) {
	f := informers.NewSharedInformerFactory(kube, 0)
	local := informers.NewSharedInformerFactoryWithOptions(kube, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", a.cfg.Node).String()
	}))
	self := informers.NewSharedInformerFactoryWithOptions(kube, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.FieldSelector = fields.OneTermEqualSelector("metadata.name", a.cfg.Node).String()
	}))
	svc := f.Core().V1().Services().Informer()
	slices := f.Discovery().V1().EndpointSlices().Informer()
	pods := local.Core().V1().Pods().Informer()
	// The node's own object is its host metadata: the datastore is in sync only once
	// it is known (and it must exist: a node without one is not programmed).
	node := self.Core().V1().Nodes().Informer()
	h := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { a.poke() },
		UpdateFunc: func(any, any) { a.poke() },
		DeleteFunc: func(any) { a.poke() },
	}
	for _, inf := range []cache.SharedIndexInformer{svc, slices, pods, node} {
		inf.AddEventHandler(h)
		a.synced = append(a.synced, inf.HasSynced)
	}
	a.svcLister = indexerLister{svc.GetIndexer()}
	a.sliceLister = indexerLister{slices.GetIndexer()}
	a.podLister = indexerLister{pods.GetIndexer()}
	a.nodeLister = indexerLister{node.GetIndexer()}
	f.Start(ctx.Done())
	local.Start(ctx.Done())
	self.Start(ctx.Done())
}

func (a *Agent) poke() {
	select {
	case a.kick <- struct{}{}:
	default:
	}
}

// watchHostIPs tracks the IPv4 addresses of the host interface.
func (a *Agent) watchHostIPs(ctx context.Context, link netlink.Link) {
	updates := make(chan netlink.AddrUpdate, 64)
	done := make(chan struct{})
	defer close(done)
	if err := netlink.AddrSubscribeWithOptions(updates, done, netlink.AddrSubscribeOptions{}); err != nil {
		a.log.Error("cannot watch host addresses; using the current ones only", "err", err)
	}
	if a.cfg.Faults.Has(faults.EagerServiceSync) {
		// As in Calico 12192: discovery reports only after the syncer has applied its
		// first (incomplete) state, and then a few hundred ms late.
		a.log.Warn("fault: host-IP discovery reports after the first apply, and late", "fault", faults.EagerServiceSync, "delay", hostIPDelay)
		select {
		case <-a.applied:
		case <-ctx.Done():
			return
		}
		select {
		case <-time.After(hostIPDelay):
		case <-ctx.Done():
			return
		}
	}
	refresh := func() {
		addrs, err := netlink.AddrList(link, netlink.FAMILY_V4)
		if err != nil {
			a.log.Error("list host addresses", "err", err)
			return
		}
		var ips []netip.Addr
		for _, ad := range addrs {
			if ip, ok := netip.AddrFromSlice(ad.IP); ok {
				ips = append(ips, ip.Unmap())
			}
		}
		a.mu.Lock()
		changed := !a.hostsOK || fmt.Sprint(ips) != fmt.Sprint(a.hostIPs)
		a.hostIPs, a.hostsOK = ips, true
		a.mu.Unlock()
		if !changed {
			return
		}
		a.log.Info("host IPs", "interface", a.cfg.HostInterface, "ips", ips)
		// NodePort SNAT for remote backends uses the host's first address.
		if len(ips) > 0 {
			if err := a.dp.SetConfig(ips[0], a.hostIdx); err != nil {
				a.log.Error("write datapath config", "err", err)
			}
		}
		a.poke()
	}
	refresh()
	for {
		select {
		case <-ctx.Done():
			return
		case u, ok := <-updates:
			if !ok {
				return
			}
			if u.LinkIndex == a.hostIdx {
				refresh()
			}
		}
	}
}

func (a *Agent) loop(ctx context.Context) error {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			a.log.Info("stopping; the datapath stays in place")
			return nil
		case <-a.kick:
		case <-tick.C:
		}
		if err := a.sync(ctx); err != nil {
			if err.Error() != a.lastSyncError {
				a.log.Error("sync", "err", err)
			}
			a.lastSyncError = err.Error()
		} else {
			a.lastSyncError = ""
		}
	}
}

// informersSynced reports whether the datastore view is complete: every informer has
// synced and the node's own Node object is there.
func (a *Agent) informersSynced() bool {
	for _, s := range a.synced {
		if !s() {
			return false
		}
	}
	return len(a.nodeLister.List()) > 0
}

// sync applies one round, steps 2 to 6 of the order in the package comment: endpoint
// programs, refdp's iptables chains, services, the take-over from kube-proxy (once),
// ready. A step that fails ends the round, so that no step runs before those it
// relies on have succeeded.
func (a *Agent) sync(ctx context.Context) error {
	inSync := a.informersSynced()
	a.mu.Lock()
	hostIPs, hostsOK := a.hostIPs, a.hostsOK
	a.mu.Unlock()
	// Nothing is written before the view is complete: datastore in sync AND host IPs
	// known. The fault applies (and deletes) as soon as the datastore is in sync.
	complete := inSync && hostsOK
	if a.cfg.Faults.Has(faults.EagerServiceSync) {
		complete = inSync
	}
	if !complete {
		return nil
	}
	if err := a.syncEndpoints(); err != nil {
		return err
	}
	if err := a.syncIPTables(ctx); err != nil {
		return err
	}
	var svcs []*corev1.Service
	for _, o := range a.svcLister.List() {
		svcs = append(svcs, o.(*corev1.Service))
	}
	var epSlices []*discoveryv1.EndpointSlice
	for _, o := range a.sliceLister.List() {
		epSlices = append(epSlices, o.(*discoveryv1.EndpointSlice))
	}
	st, err := a.syncer.Apply(services.Compute(svcs, epSlices, hostIPs), true)
	if err != nil {
		return err
	}
	a.appliedOnce.Do(func() { close(a.applied) })
	if st.FrontendsWritten+st.FrontendsDeleted+st.BackendsWritten+st.BackendsDeleted > 0 {
		a.log.Info("services applied", "changes", st.String(), "hostIPsKnown", hostsOK)
	}
	if len(st.Rebuilt) > 0 {
		// The fault treats a backend change as delete and re-create, and deleting a
		// service forgets its flows.
		n, err := a.purgeConntrack(st.Rebuilt)
		a.log.Warn("fault: service rebuilt in place, its conntrack entries purged", "fault", faults.RebuildBackendsInPlace, "services", st.Rebuilt, "entries", n, "err", err)
	}
	if !a.tookOver {
		if err := a.takeOver(ctx); err != nil {
			return err
		}
	}
	if !a.ready {
		a.ready = true
		a.log.Info("ready")
		return a.status.write(true, "programmed and in sync")
	}
	return nil
}

// syncEndpoints attaches the endpoint programs to each local pod's host-side
// interface, found by the route to the pod's IP, and detaches those of pods gone.
func (a *Agent) syncEndpoints() error {
	want := map[string]endpoint{}
	for _, o := range a.podLister.List() {
		p := o.(*corev1.Pod)
		if p.Status.PodIP == "" || p.Spec.HostNetwork || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue
		}
		ip, err := netip.ParseAddr(p.Status.PodIP)
		if err != nil || !ip.Is4() {
			continue
		}
		routes, err := netlink.RouteGet(ip.AsSlice())
		if err != nil || len(routes) == 0 || routes[0].LinkIndex == a.hostIdx || routes[0].LinkIndex == 0 {
			continue // not wired on this node (yet)
		}
		want[p.Namespace+"/"+p.Name] = endpoint{ifindex: routes[0].LinkIndex, ip: ip}
	}
	var errs []error
	for key, ep := range want {
		if cur, ok := a.attached[key]; ok && cur == ep {
			continue
		}
		if err := a.dp.AttachEndpoint(ep.ifindex, ep.ip, bpf.EndpointFlags(0)); err != nil {
			errs = append(errs, fmt.Errorf("pod %s: %w", key, err))
			continue
		}
		a.log.Info("attached endpoint", "pod", key, "ifindex", ep.ifindex, "ip", ep.ip)
		a.attached[key] = ep
	}
	for key, ep := range a.attached {
		if _, ok := want[key]; ok {
			continue
		}
		if err := a.dp.DetachEndpoint(ep.ifindex); err != nil {
			errs = append(errs, fmt.Errorf("pod %s: %w", key, err))
			continue
		}
		delete(a.attached, key)
	}
	return errors.Join(errs...)
}

// syncIPTables (re)writes refdp's iptables chains when they were not written yet or
// the set of workload interfaces changed since.
func (a *Agent) syncIPTables(ctx context.Context) error {
	ifindexes := make([]int, 0, len(a.attached))
	for _, ep := range a.attached {
		ifindexes = append(ifindexes, ep.ifindex)
	}
	slices.Sort(ifindexes)
	if a.iptablesFor != nil && slices.Equal(ifindexes, a.iptablesFor) {
		return nil
	}
	var names []string
	for _, idx := range ifindexes {
		l, err := netlink.LinkByIndex(idx)
		if err != nil {
			// Gone with its pod: the next round detaches it, and the set changes.
			continue
		}
		names = append(names, l.Attrs().Name)
	}
	cfg := iptables.Config{
		Marks:                      iptables.Marks{Seen: bpf.MarkSeen, Fallthrough: bpf.MarkFallthrough, Vouched: bpf.MarkVouched, Mask: bpf.MarkMask},
		Workloads:                  names,
		NoForwardFallthroughAccept: a.cfg.Faults.Has(faults.NoForwardFallthroughAccept),
	}
	if cfg.NoForwardFallthroughAccept && a.iptablesFor == nil {
		a.log.Warn("fault: FORWARD has no accept for fallthrough packets", "fault", faults.NoForwardFallthroughAccept)
	}
	if err := iptables.Ensure(ctx, cfg); err != nil {
		return err
	}
	a.log.Info("iptables written", "workloadInterfaces", names)
	a.iptablesFor = ifindexes
	return nil
}

// takeOver removes kube-proxy's rules from the node (see iptables.RemoveKubeProxy).
// Linux conntrack stays: flows that predate the datapath keep their NAT there.
func (a *Agent) takeOver(ctx context.Context) error {
	if a.cfg.Faults.Has(faults.NoKubeProxyCleanup) {
		a.log.Warn("fault: leaving kube-proxy's rules in place", "fault", faults.NoKubeProxyCleanup)
		a.tookOver = true
		return nil
	}
	removed, err := iptables.RemoveKubeProxy(ctx)
	if len(removed) > 0 {
		a.log.Info("removed kube-proxy's rules", "count", len(removed), "removed", removed)
	}
	if err != nil {
		return fmt.Errorf("take over from kube-proxy: %w", err)
	}
	if a.cfg.Faults.Has(faults.FlushConntrackOnTakeover) && len(removed) > 0 {
		out, err := exec.CommandContext(ctx, "conntrack", "-F").CombinedOutput()
		a.log.Warn("fault: flushed the Linux conntrack table", "fault", faults.FlushConntrackOnTakeover, "out", strings.TrimSpace(string(out)), "err", err)
	}
	a.tookOver = true
	return nil
}

// dropClusterIPFrontends is the fault drop-clusterip-frontends-on-start: it keeps the
// frontends on the host interface's addresses (NodePorts) and deletes every other.
func (a *Agent) dropClusterIPFrontends(link netlink.Link) error {
	addrs, err := netlink.AddrList(link, netlink.FAMILY_V4)
	if err != nil {
		return fmt.Errorf("addresses of %s: %w", link.Attrs().Name, err)
	}
	var host []netip.Addr
	for _, a := range addrs {
		if ip, ok := netip.AddrFromSlice(a.IP.To4()); ok {
			host = append(host, ip)
		}
	}
	n, err := a.syncer.DropFrontends(func(k bpf.FrontendKey) bool { return !slices.Contains(host, k.Addr) })
	a.log.Warn("fault: deleted the frontends not on a host IP (ClusterIPs) at start", "fault", faults.DropClusterIPFrontendsOnStart, "deleted", n, "err", err)
	return err
}

// purgeConntrack deletes the conntrack entries of flows of the given services.
func (a *Agent) purgeConntrack(ids []uint32) (int, error) {
	stale := map[uint32]bool{}
	for _, id := range ids {
		stale[id] = true
	}
	var keys []bpf.ConntrackKey
	err := a.dp.Conntrack().Iterate(func(k bpf.ConntrackKey, v bpf.ConntrackValue) bool {
		if stale[v.ServiceID] {
			keys = append(keys, k)
		}
		return true
	})
	for _, k := range keys {
		if derr := a.dp.Conntrack().Delete(k); derr != nil && err == nil {
			err = derr
		}
	}
	return len(keys), err
}
