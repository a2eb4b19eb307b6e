// Package agent is the reference dataplane's per-node agent (refdp). It watches the API
// server and the node's addresses and programs the node. State that must outlive it
// (maps, program links) is pinned in the node's bpffs, so traffic keeps flowing while
// the agent is stopped, and a restarted agent adopts it.
//
// Its order of operations is its invariant; each step relies on those before it:
//
//  0. write refdp's iptables chains, with the workloads they accepted before (Run,
//     once): they mark what Linux conntrack knows of fallthrough packets VOUCHED, and
//     the programs drop a fallthrough packet without that mark, so the marking comes
//     first; the chains accept nothing the programs have not marked, and their
//     workload gates drop the traffic of every pod interface that is not a workload
//     whose programs and policy are attached (those of the previous run still are);
//  1. attach the host interface's programs, and this run's endpoint programs to
//     the endpoints the previous run attached, their state and policy as they are;
//     then, once no program of the previous run is left to write its conntrack
//     map, copy a previous map (another size or refdp version) into this run's,
//     converted, and drop it (Run, once; bpf's migrate.go says why this order
//     loses no flow);
//
// then each round, once the view is complete (datastore in sync: services, endpoint
// slices, all pods, namespaces, network policies and the node's own object; host IPs
// known):
//
//  2. compute the local endpoints and their policy, with the IP sets its rules name
//     (reference/policy);
//  3. write the IP sets: before any policy names them;
//  4. write the policy of the endpoints that exist, each in one update;
//  5. attach the endpoint programs of new local workloads, each with its policy in
//     the same update of its state: an endpoint is never live without its policy;
//  6. write refdp's iptables chains, again whenever the set of workload interfaces
//     changes: after the programs and policy, so that the gates open for a workload
//     only once its programs police it (Calico PR 12164: IP sets, then programs,
//     then iptables). Then detach the programs of workloads gone, whose interfaces
//     the chains now close, and delete the IP sets no policy names any more;
//  7. write service NAT state: after the chains, because a packet the datapath NATs
//     is accepted in FORWARD only by refdp's chains (kube-proxy's FORWARD accepts
//     what kube-proxy's own NAT marked, or established flows). Before this step the
//     datapath NATs nothing, and kube-proxy's rules still NAT new connections. Then
//     delete the conntrack entries of UDP flows DNATed to backends their frontends
//     no longer have: after the frontends point at their new backends, so that the
//     next datagram of such a flow picks one of those;
//  8. after the first complete round, once: remove kube-proxy's rules, if any. Only
//     now does the datapath NAT every service, and do refdp's chains accept what
//     kube-proxy's FORWARD accepted: flows that predate the datapath (fallthrough
//     packets the Linux stack's conntrack knows);
//  9. report ready.
//
// Steps 3 to 6 run in the order roundOrder returns, which faults of the self-test
// change. NetworkPolicies are compiled from the agent's own view of them (policyView),
// kept by the informer's events.
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
	"sync/atomic"
	"time"

	"github.com/vishvananda/netlink"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/dpconform/dpconform/bpf"
	"github.com/dpconform/dpconform/reference/faults"
	"github.com/dpconform/dpconform/reference/iptables"
	"github.com/dpconform/dpconform/reference/policy"
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
	// WorkloadInterfacePrefix is the name prefix of the host-side interfaces of pods,
	// and of no other interface of the node (default iptables.DefaultWorkloadPrefix,
	// "veth", the ptp CNI plugin's). Traffic from or to such an interface that is not
	// a programmed workload's is dropped.
	WorkloadInterfacePrefix string
	// ConntrackSize is the conntrack table's capacity (0: the datapath's default).
	ConntrackSize uint32
	// ConntrackFormat is the conntrack format, that is the version of refdp, the
	// agent runs (0: bpf.DefaultConntrackFormat, v2).
	ConntrackFormat bpf.ConntrackFormat
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
	cfg      Config
	log      *slog.Logger
	dp       *bpf.Datapath
	syncer   *services.Syncer
	compiler *policy.Compiler
	policy   *policy.Syncer
	status   *statusFile

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
	podLister   cacheLister // every pod of the cluster
	nsLister    cacheLister
	policies    *policyView
	nodeLister  cacheLister
	synced      []cache.InformerSynced

	attached map[int]endpoint // ifindex -> endpoint, programs and policy attached
	// iptablesFor is the set of workload ifindexes refdp's chains were last written
	// for (nil: not written yet).
	iptablesFor []int
	// servicesChanged is set by the first Service or EndpointSlice event after the
	// informers' initial list (the fault adopt-without-reconcile only: until then its
	// service applies delete nothing).
	servicesChanged atomic.Bool
	warnedAdopt     bool
	// staleUDP are the UDP backends removed from their frontends whose flows'
	// conntrack entries are still to be deleted.
	staleUDP []bpf.DNATFlows
	// leftTCP are the TCP backends removed from their frontends whose flows are
	// still to be flagged once their endpoints are not listed any more.
	leftTCP         []bpf.DNATFlows
	tookOver        bool // kube-proxy's rules removed (or found absent)
	ready           bool
	lastSyncError   string
	lastPolicyError string
}

// endpoint is a local workload's endpoint.
type endpoint struct {
	pod string // "namespace/name"
	ip  netip.Addr
}

type cacheLister interface{ List() []any }

type indexerLister struct{ cache.Indexer }

func (l indexerLister) List() []any { return l.Indexer.List() }

// Run runs the agent until ctx ends, then leaves the datapath in place and returns.
func Run(ctx context.Context, cfg Config) error {
	if cfg.HostInterface == "" {
		cfg.HostInterface = "eth0"
	}
	if cfg.WorkloadInterfacePrefix == "" {
		cfg.WorkloadInterfacePrefix = iptables.DefaultWorkloadPrefix
	}
	if strings.HasPrefix(cfg.HostInterface, cfg.WorkloadInterfacePrefix) {
		return fmt.Errorf("agent: the host interface %s has the workload interface prefix %q: its traffic would be dropped", cfg.HostInterface, cfg.WorkloadInterfacePrefix)
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	if cfg.Node == "" || cfg.Kubeconfig == "" || cfg.PinDir == "" || cfg.StateDir == "" {
		return errors.New("agent: Node, Kubeconfig, PinDir and StateDir are required")
	}
	a := &Agent{cfg: cfg, log: cfg.Log, kick: make(chan struct{}, 1), applied: make(chan struct{}), attached: map[int]endpoint{},
		policies: newPolicyView(cfg.Faults.Has(faults.DeleteThenAddPolicy))}
	a.status = &statusFile{path: filepath.Join(cfg.StateDir, StatusFile)}
	if err := a.status.write(false, "starting"); err != nil {
		return err
	}
	defer a.status.write(false, "stopped")
	if err := os.MkdirAll(cfg.PinDir, 0o700); err != nil {
		return fmt.Errorf("create pin directory: %w", err)
	}

	var err error
	if cfg.Faults.Has(faults.NoCTMigration) {
		a.log.Warn("fault: a previous conntrack map is dropped, not migrated", "fault", faults.NoCTMigration)
	}
	a.dp, err = bpf.Open(cfg.PinDir, bpf.Options{
		ConntrackSize:        cfg.ConntrackSize,
		ConntrackFormat:      cfg.ConntrackFormat,
		UnpinnedConntrack:    cfg.Faults.Has(faults.UnpinnedConntrack),
		NoConntrackMigration: cfg.Faults.Has(faults.NoCTMigration),
		SNATPortUnchecked:    cfg.Faults.Has(faults.SNATPortUnchecked),
	})
	if err != nil {
		return err
	}
	// Close releases file descriptors only: pinned maps and links stay, and with them
	// the datapath.
	defer a.dp.Close()
	a.status.conntrack = a.dp.Conntrack().Name() + " (" + a.dp.ConntrackFormat().String() + ")"
	if cfg.Faults.Has(faults.CTCopyBeforeAttach) {
		a.log.Warn("fault: the previous conntrack map is copied before the programs are attached", "fault", faults.CTCopyBeforeAttach, "order", fmt.Sprint(startOrder(cfg.Faults)))
	}
	if cfg.Faults.Has(faults.SNATPortUnchecked) {
		a.log.Warn("fault: the datapath's SNAT port pick is defective", "fault", faults.SNATPortUnchecked, "what", faults.Describe(faults.SNATPortUnchecked))
	}
	a.syncer, err = services.NewSyncer(a.dp.Frontends(), a.dp.Backends(), services.SyncerOptions{
		RebuildBackendsInPlace: cfg.Faults.Has(faults.RebuildBackendsInPlace),
	})
	if err != nil {
		return err
	}
	a.policy, err = policy.NewSyncer(a.dp.IPSets(), a.dp)
	if err != nil {
		return err
	}
	a.compiler = policy.NewCompiler(policy.Options{
		IgnoreIPBlockExcept:  cfg.Faults.Has(faults.IgnoreIPBlockExcept),
		NamedPortsUnresolved: cfg.Faults.Has(faults.NamedPortsUnresolved),
		EgressIgnoresPorts:   cfg.Faults.Has(faults.EgressIgnoresPorts),
	})
	// The sets a previous run left keep their IDs: nothing is rewritten for them.
	a.compiler.Adopt(a.policy.Sets())
	if cfg.Faults.Has(faults.ReadyBeforeFirstApply) {
		// The pinned datapath is adopted and keeps forwarding: taken for programmed,
		// as if what the pins hold were what the API holds, until the first round.
		a.log.Warn("fault: ready once the pinned datapath is adopted, before the first complete round", "fault", faults.ReadyBeforeFirstApply)
		a.ready = true
		if err := a.status.write(true, "ready (adopted, not yet applied)"); err != nil {
			return err
		}
	}
	for _, f := range []string{faults.IgnoreIPBlockExcept, faults.NamedPortsUnresolved, faults.EgressIgnoresPorts} {
		if cfg.Faults.Has(f) {
			a.log.Warn("fault: the policy compiler is defective", "fault", f, "what", faults.Describe(f))
		}
	}
	for _, f := range []string{faults.AttachBeforeIPSets, faults.RedirectBeforePolicy} {
		if cfg.Faults.Has(f) {
			a.log.Warn("fault: a round runs its steps out of order", "fault", f, "what", faults.Describe(f), "order", fmt.Sprint(roundOrder(cfg.Faults)))
		}
	}
	if cfg.Faults.Has(faults.DeleteThenAddPolicy) {
		a.log.Warn("fault: a NetworkPolicy update is applied as a delete, then an add a round later", "fault", faults.DeleteThenAddPolicy)
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
	for _, st := range startOrder(cfg.Faults) {
		var err error
		switch st {
		case startChains:
			err = a.writeStartChains(ctx)
		case startAttach:
			err = a.attachAll()
		case startMigrate:
			err = a.migrateConntrack()
		}
		if err != nil {
			return err
		}
	}

	kube, err := a.client()
	if err != nil {
		return err
	}
	go a.watchHostIPs(ctx, link)
	if err := a.startInformers(ctx, kube); err != nil {
		return err
	}
	go a.pokeWhenSynced(ctx)
	if !a.ready {
		a.status.write(false, "waiting for the datastore and host IPs")
	}
	return a.loop(ctx)
}

// startStep is one of the steps the agent runs once, at start, before its rounds
// (steps 0 and 1 of the package comment).
type startStep int

const (
	startChains  startStep = iota // 0: refdp's chains, with the previous run's workloads
	startAttach                   // 1: the host programs, then this run's on the previous run's endpoints
	startMigrate                  // 1: the previous conntrack map copied into this run's, and dropped
)

var startStepNames = [...]string{"write-chains", "attach", "migrate-conntrack"}

func (s startStep) String() string { return startStepNames[s] }

// startOrder returns the order of the start steps: the package comment's, or with
// the migration first (ct-copy-before-attach), where the previous run's programs
// still run on every hook and go on writing the previous map until the attach: what
// they write after the copy is lost.
func startOrder(f faults.Set) []startStep {
	if f.Has(faults.CTCopyBeforeAttach) {
		return []startStep{startMigrate, startChains, startAttach}
	}
	return []startStep{startChains, startAttach, startMigrate}
}

// writeStartChains writes refdp's chains at start (step 0). They come before the
// programs: the programs drop a fallthrough packet that iptables has not vouched
// for, so the rule that vouches must exist before they are attached, or flows that
// predate the datapath would stall until the first round writes it. The gates keep
// open the workloads a previous run programmed: their programs and policy are still
// attached, and a restart must not cut them. On a node refdp never programmed, the
// pods predate it and ran unfiltered: the gates come with the first round, which
// attaches their programs first.
func (a *Agent) writeStartChains(ctx context.Context) error {
	installed, err := iptables.Installed(ctx)
	if err != nil {
		return err
	}
	prev, err := iptables.Workloads(ctx)
	if err != nil {
		return err
	}
	return a.writeIPTables(ctx, existingLinks(prev), !installed)
}

// attachAll attaches this run's programs to every hook (step 1): the host
// interface, then the endpoints the previous run attached, their state and policy
// as they are, so that no program of the previous run is left to write a
// previous conntrack map before it is migrated.
func (a *Agent) attachAll() error {
	if err := a.dp.AttachHost(a.hostIdx); err != nil {
		return fmt.Errorf("attach to %s: %w", a.cfg.HostInterface, err)
	}
	if a.cfg.Faults.Has(faults.OpenWhileRestarting) {
		if err := a.reattachFromScratch(); err != nil {
			return err
		}
	}
	n, err := a.dp.ReattachEndpoints()
	if err != nil {
		return err
	}
	a.log.Info("attached this run's programs to the endpoints of the previous run", "endpoints", n)
	return nil
}

// migrateConntrack copies the previous conntrack maps, if any, into the datapath's
// and records what it did in the status file.
func (a *Agent) migrateConntrack() error {
	mig, err := a.dp.MigrateConntrack()
	if err != nil {
		return err
	}
	if len(mig.From) == 0 {
		return nil
	}
	a.log.Info("migrated conntrack", "from", mig.From, "to", a.status.conntrack,
		"copied", mig.Copied, "present", mig.Present, "duration", mig.Duration)
	a.status.migration = &Migration{From: mig.From, Copied: mig.Copied, Present: mig.Present,
		DurationMs: float64(mig.Duration.Microseconds()) / 1000}
	return nil
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

func (a *Agent) startInformers(ctx context.Context, kube kubernetes.Interface) error {
	f := informers.NewSharedInformerFactory(kube, 0)
	self := informers.NewSharedInformerFactoryWithOptions(kube, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.FieldSelector = fields.OneTermEqualSelector("metadata.name", a.cfg.Node).String()
	}))
	svc := f.Core().V1().Services().Informer()
	slices := f.Discovery().V1().EndpointSlices().Informer()
	// Every pod: policies select their peers cluster-wide. The local ones, those
	// with this node's spec.nodeName, are the endpoints.
	pods := f.Core().V1().Pods().Informer()
	namespaces := f.Core().V1().Namespaces().Informer()
	policies := f.Networking().V1().NetworkPolicies().Informer()
	// The node's own object is its host metadata: the datastore is in sync only once
	// it is known (and it must exist: a node without one is not programmed).
	node := self.Core().V1().Nodes().Informer()
	h := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { a.poke() },
		UpdateFunc: func(any, any) { a.poke() },
		DeleteFunc: func(any) { a.poke() },
	}
	for _, inf := range []cache.SharedIndexInformer{svc, slices, pods, namespaces, node} {
		inf.AddEventHandler(h)
		a.synced = append(a.synced, inf.HasSynced)
	}
	if a.cfg.Faults.Has(faults.AdoptWithoutReconcile) {
		// Deletions follow events: only a change after the initial list lets the
		// service applies delete what the API no longer holds.
		changed := cache.ResourceEventHandlerDetailedFuncs{
			AddFunc: func(_ any, initial bool) {
				if !initial {
					a.servicesChanged.Store(true)
				}
			},
			UpdateFunc: func(any, any) { a.servicesChanged.Store(true) },
			DeleteFunc: func(any) { a.servicesChanged.Store(true) },
		}
		for _, inf := range []cache.SharedIndexInformer{svc, slices} {
			if _, err := inf.AddEventHandler(changed); err != nil {
				return fmt.Errorf("watch services: %w", err)
			}
		}
	}
	// Policies are read from the agent's own view, which their events keep: the view
	// is in sync once the handler has had the informer's initial list.
	reg, err := policies.AddEventHandler(a.policies.handler(a.poke))
	if err != nil {
		return fmt.Errorf("watch network policies: %w", err)
	}
	a.synced = append(a.synced, reg.HasSynced)
	a.svcLister = indexerLister{svc.GetIndexer()}
	a.sliceLister = indexerLister{slices.GetIndexer()}
	a.podLister = indexerLister{pods.GetIndexer()}
	a.nsLister = indexerLister{namespaces.GetIndexer()}
	a.nodeLister = indexerLister{node.GetIndexer()}
	f.Start(ctx.Done())
	self.Start(ctx.Done())
	return nil
}

func (a *Agent) poke() {
	select {
	case a.kick <- struct{}{}:
	default:
	}
}

// watchHostIPs tracks the IPv4 addresses of the host interface.
func (a *Agent) watchHostIPs(ctx context.Context, link netlink.Link) {
	// Subscribe before the first listing, so that no change falls between the two.
	updates := make(chan netlink.AddrUpdate, 64)
	done := make(chan struct{})
	defer close(done)
	readOnce := a.cfg.Faults.Has(faults.HostIPsReadOnce)
	if readOnce {
		a.log.Warn("fault: host IPs are read once, at start, and never watched", "fault", faults.HostIPsReadOnce)
	} else if err := netlink.AddrSubscribeWithOptions(updates, done, netlink.AddrSubscribeOptions{}); err != nil {
		a.log.Error("cannot watch host addresses; using the current ones only", "err", err)
	}
	ignoreRemovals := a.cfg.Faults.Has(faults.HostIPRemovalsIgnored)
	if ignoreRemovals {
		a.log.Warn("fault: removed host addresses are ignored", "fault", faults.HostIPRemovalsIgnored)
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
	if readOnce {
		return
	}
	for {
		select {
		case <-ctx.Done():
			return
		case u, ok := <-updates:
			if !ok {
				return
			}
			if u.LinkIndex != a.hostIdx || (ignoreRemovals && !u.NewAddr) {
				continue
			}
			refresh()
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
		if readded := a.policies.roundDone(); len(readded) > 0 {
			// The add half of updates split by the fault: a round of its own.
			a.log.Warn("fault: updated NetworkPolicies were deleted for a round, now added again", "fault", faults.DeleteThenAddPolicy, "policies", readded)
			a.poke()
		}
	}
}

// syncedPoll is how often pokeWhenSynced looks whether the view is complete.
const syncedPoll = 5 * time.Millisecond

// pokeWhenSynced starts a round as soon as the view is complete. Events poke the loop,
// but the last informer or handler to sync may do so with none left to deliver (the
// handler of an empty list of NetworkPolicies syncs without an event): without this
// the first round, and ready, would wait for the loop's next tick, up to a second.
func (a *Agent) pokeWhenSynced(ctx context.Context) {
	err := wait.PollUntilContextCancel(ctx, syncedPoll, true, func(context.Context) (bool, error) {
		return a.informersSynced(), nil
	})
	if err == nil {
		a.poke()
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

// sync applies one round, steps 2 to 9 of the order in the package comment. A step
// that fails ends the round, so that no step runs before those it relies on have
// succeeded.
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
	want := a.localEndpoints()
	desired := a.computePolicy(want)
	for _, s := range roundOrder(a.cfg.Faults) {
		var err error
		switch s {
		case stepWriteIPSets:
			err = a.writeIPSets(desired)
		case stepWritePolicies:
			err = a.writeEndpointPolicies(want, desired)
		case stepAttachNew:
			err = a.attachNewEndpoints(want, desired, true)
		case stepAttachNewUnpoliced:
			err = a.attachNewEndpoints(want, desired, false)
		case stepWriteIPTables:
			err = a.syncIPTables(ctx, want)
		case stepDetachGone:
			err = a.detachGoneEndpoints(want)
		case stepDeleteSets:
			err = a.deleteUnreferencedSets(desired)
		}
		if err != nil {
			return err
		}
	}
	if err := a.syncServices(hostIPs, hostsOK); err != nil {
		return err
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

// step is one of the steps 3 to 6 of a round (see the package comment).
type step int

const (
	stepWriteIPSets        step = iota // 3
	stepWritePolicies                  // 4: of the endpoints attached already
	stepAttachNew                      // 5: new endpoints, each with its policy
	stepAttachNewUnpoliced             // 5 without the policy (redirect-before-policy)
	stepWriteIPTables                  // 6
	stepDetachGone                     // 6
	stepDeleteSets                     // 6
)

var stepNames = [...]string{"write-ipsets", "write-policies", "attach-new", "attach-new-unpoliced", "write-iptables", "detach-gone", "delete-sets"}

func (s step) String() string { return stepNames[s] }

// roundOrder returns the order in which a round runs steps 3 to 6: the package
// comment's, or the one a fault puts in its place.
func roundOrder(f faults.Set) []step {
	attach := stepAttachNew
	if f.Has(faults.RedirectBeforePolicy) {
		attach = stepAttachNewUnpoliced
	}
	var order []step
	if f.Has(faults.AttachBeforeIPSets) {
		// Calico before PR 12164: the new endpoint is live (programs, then iptables)
		// before the sets that hold its IP are written, and its peers switch to
		// those sets only after that.
		order = []step{attach, stepWriteIPTables, stepWriteIPSets, stepWritePolicies}
	} else {
		order = []step{stepWriteIPSets, stepWritePolicies, attach, stepWriteIPTables}
	}
	if attach == stepAttachNewUnpoliced {
		// The policy of the endpoints attached without it, once their gates are open.
		order = append(order, stepWritePolicies)
	}
	return append(order, stepDetachGone, stepDeleteSets)
}

// reattachFromScratch is the fault open-while-restarting: every endpoint found in the
// pinned map is attached again as if new, its state rewritten from pod IP and flags
// alone, without its policy, before the view is complete. The first complete round
// attaches each again with its policy.
func (a *Agent) reattachFromScratch() error {
	type pinned struct {
		ifindex int
		v       bpf.EndpointValue
	}
	var eps []pinned
	if err := a.dp.Endpoints().Iterate(func(k uint32, v bpf.EndpointValue) bool {
		eps = append(eps, pinned{int(k), v})
		return true
	}); err != nil {
		return fmt.Errorf("list pinned endpoints: %w", err)
	}
	n := 0
	for _, ep := range eps {
		if _, err := netlink.LinkByIndex(ep.ifindex); err != nil {
			continue // gone with its pod
		}
		if err := a.dp.SetEndpointPolicy(ep.ifindex, bpf.EndpointPolicy{}); err != nil {
			return fmt.Errorf("reset endpoint ifindex %d: %w", ep.ifindex, err)
		}
		flags := ep.v.Flags &^ (bpf.EndpointIngressIsolated | bpf.EndpointEgressIsolated)
		if err := a.dp.AttachEndpoint(ep.ifindex, ep.v.PodIP, flags); err != nil {
			return fmt.Errorf("re-attach endpoint ifindex %d: %w", ep.ifindex, err)
		}
		n++
	}
	a.log.Warn("fault: re-attached the pinned endpoints from scratch, without their policy, until the first complete round", "fault", faults.OpenWhileRestarting, "endpoints", n)
	return nil
}

// localEndpoints returns the endpoints of this node's pods by the ifindex of their
// host-side interface, found by the route to the pod's IP.
func (a *Agent) localEndpoints() map[int]endpoint {
	want := map[int]endpoint{}
	for _, o := range a.podLister.List() {
		p := o.(*corev1.Pod)
		if p.Spec.NodeName != a.cfg.Node || p.Status.PodIP == "" || p.Spec.HostNetwork || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
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
		ep := endpoint{pod: p.Namespace + "/" + p.Name, ip: ip}
		// Two pods on one interface: a deleted pod's object outlives its sandbox.
		// Either way the same one, whichever order the cache lists them in.
		if cur, ok := want[routes[0].LinkIndex]; ok && cur.pod < ep.pod {
			continue
		}
		want[routes[0].LinkIndex] = ep
	}
	return want
}

// computePolicy compiles the cluster's policies for the endpoints (step 2). What the
// compiler could not compile as written fails closed and is logged, once.
func (a *Agent) computePolicy(want map[int]endpoint) policy.Desired {
	in := policy.Input{Endpoints: make(map[string]int, len(want))}
	for ifindex, ep := range want {
		in.Endpoints[ep.pod] = ifindex
	}
	in.Policies = a.policies.snapshot()
	for _, o := range a.podLister.List() {
		in.Pods = append(in.Pods, o.(*corev1.Pod))
	}
	for _, o := range a.nsLister.List() {
		in.Namespaces = append(in.Namespaces, o.(*corev1.Namespace))
	}
	d, err := a.compiler.Compile(in)
	msg := ""
	if err != nil {
		msg = err.Error()
	}
	if msg != a.lastPolicyError {
		if err != nil {
			a.log.Error("network policy: failing closed where it cannot be compiled", "err", err)
		} else {
			a.log.Info("network policy compiles cleanly again")
		}
		a.lastPolicyError = msg
	}
	return d
}

// writeIPSets writes the IP sets the policies name (step 3).
func (a *Agent) writeIPSets(d policy.Desired) error {
	written, deleted, err := a.policy.WriteIPSets(d)
	if written+deleted > 0 {
		a.log.Info("IP sets written", "sets", len(d.Sets), "entriesWritten", written, "entriesDeleted", deleted)
	}
	if err != nil {
		return fmt.Errorf("write IP sets: %w", err)
	}
	return nil
}

// writeEndpointPolicies writes the policy of each endpoint that is attached already
// and stays, where it changed (step 4).
func (a *Agent) writeEndpointPolicies(want map[int]endpoint, d policy.Desired) error {
	var errs []error
	for ifindex, ep := range want {
		if cur, ok := a.attached[ifindex]; !ok || cur != ep {
			continue // new: attached with its policy in the next step
		}
		changed, err := a.policy.WriteEndpointPolicy(ifindex, d.Endpoints[ifindex])
		if err != nil {
			errs = append(errs, fmt.Errorf("pod %s: %w", ep.pod, err))
			continue
		}
		if changed {
			p := d.Endpoints[ifindex]
			a.log.Info("endpoint policy written", "pod", ep.pod, "ifindex", ifindex,
				"ingressIsolated", p.IngressIsolated, "egressIsolated", p.EgressIsolated, "rules", len(p.Ingress)+len(p.Egress))
		}
	}
	return errors.Join(errs...)
}

// attachNewEndpoints attaches the endpoint programs of each new endpoint together with
// its policy (step 5). Without withPolicy (the redirect-before-policy fault) a new
// endpoint is attached as it is, with no policy if it had none, and its policy is left
// to the next writeEndpointPolicies.
func (a *Agent) attachNewEndpoints(want map[int]endpoint, d policy.Desired, withPolicy bool) error {
	var errs []error
	for ifindex, ep := range want {
		if cur, ok := a.attached[ifindex]; ok && cur == ep {
			continue
		}
		p := d.Endpoints[ifindex]
		if !withPolicy {
			if err := a.dp.AttachEndpoint(ifindex, ep.ip, bpf.EndpointFlags(0)); err != nil {
				errs = append(errs, fmt.Errorf("pod %s: %w", ep.pod, err))
				continue
			}
			a.policy.Forget(ifindex) // written by writeEndpointPolicies, later
			a.log.Warn("fault: attached endpoint without its policy", "fault", faults.RedirectBeforePolicy, "pod", ep.pod, "ifindex", ifindex, "ip", ep.ip)
			a.attached[ifindex] = ep
			continue
		}
		if err := a.dp.AttachEndpointWithPolicy(ifindex, ep.ip, bpf.EndpointFlags(0), p); err != nil {
			errs = append(errs, fmt.Errorf("pod %s: %w", ep.pod, err))
			continue
		}
		a.policy.Written(ifindex, p)
		a.log.Info("attached endpoint", "pod", ep.pod, "ifindex", ifindex, "ip", ep.ip,
			"ingressIsolated", p.IngressIsolated, "egressIsolated", p.EgressIsolated, "rules", len(p.Ingress)+len(p.Egress))
		if a.cfg.Faults.Has(faults.AttachBeforeIPSets) {
			a.log.Warn("fault: endpoint attached before the IP sets that hold its IP", "fault", faults.AttachBeforeIPSets, "pod", ep.pod)
		}
		a.attached[ifindex] = ep
	}
	return errors.Join(errs...)
}

// detachGoneEndpoints detaches the programs of endpoints whose pods are gone (step 6,
// after the chains no longer accept their interfaces).
func (a *Agent) detachGoneEndpoints(want map[int]endpoint) error {
	var errs []error
	for ifindex, ep := range a.attached {
		if _, ok := want[ifindex]; ok {
			continue
		}
		if err := a.dp.DetachEndpoint(ifindex); err != nil {
			errs = append(errs, fmt.Errorf("pod %s: %w", ep.pod, err))
			continue
		}
		a.policy.Forget(ifindex)
		a.log.Info("detached endpoint", "pod", ep.pod, "ifindex", ifindex)
		delete(a.attached, ifindex)
	}
	return errors.Join(errs...)
}

// deleteUnreferencedSets deletes the IP sets no policy names any more (step 6).
func (a *Agent) deleteUnreferencedSets(d policy.Desired) error {
	n, err := a.policy.DeleteUnreferencedSets(d)
	if n > 0 {
		a.log.Info("IP sets deleted", "entries", n)
	}
	if err != nil {
		return fmt.Errorf("delete IP sets: %w", err)
	}
	return nil
}

// syncServices writes service NAT state (step 7).
func (a *Agent) syncServices(hostIPs []netip.Addr, hostsOK bool) error {
	var svcs []*corev1.Service
	for _, o := range a.svcLister.List() {
		svcs = append(svcs, o.(*corev1.Service))
	}
	var epSlices []*discoveryv1.EndpointSlice
	for _, o := range a.sliceLister.List() {
		epSlices = append(epSlices, o.(*discoveryv1.EndpointSlice))
	}
	complete := true
	if a.cfg.Faults.Has(faults.AdoptWithoutReconcile) && !a.servicesChanged.Load() {
		complete = false
		if !a.warnedAdopt {
			a.warnedAdopt = true
			a.log.Warn("fault: service applies write additions only until a Service or EndpointSlice changes", "fault", faults.AdoptWithoutReconcile)
		}
	}
	desired := services.Compute(svcs, epSlices, hostIPs)
	if a.cfg.Faults.Has(faults.ServeNotReadyEndpoints) {
		desired = services.Listed(svcs, epSlices, hostIPs)
	}
	st, err := a.syncer.Apply(desired, complete)
	a.leftTCP = append(a.leftTCP, st.StaleTCP...)
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
	a.staleUDP = append(a.staleUDP, st.StaleUDP...)
	var tcpErr error
	if complete {
		tcpErr = a.endGoneTCP(func() services.Desired { return services.Listed(svcs, epSlices, hostIPs) })
	}
	return errors.Join(a.forgetStaleUDP(), tcpErr)
}

// endGoneTCP flags the conntrack entries of TCP flows DNATed to backends their
// frontends no longer have and whose endpoints are not listed any more (step 7,
// after the frontends point at their new backends): their next packet from a pod is
// answered with a RST. A backend still listed is terminating and may serve its flows
// to their end, so they wait for its endpoint to go; one back in its frontend's
// backends serves them again. A pod that closed its connections as it stopped has
// ended these flows already; one that vanished without a FIN (a lost sandbox or
// node) has not, and its clients would wait in silence. Only a complete view of the
// EndpointSlices (listed computes it, only when needed) may say an endpoint is gone.
// What could not be flagged is tried again next round.
func (a *Agent) endGoneTCP(listed func() services.Desired) error {
	if len(a.leftTCP) == 0 {
		return nil
	}
	gone, draining := goneTCP(a.leftTCP, a.syncer.TCPBackends(), listed())
	a.leftTCP = draining
	if len(gone) == 0 {
		return nil
	}
	if a.cfg.Faults.Has(faults.KeepFlowsToGoneBackends) {
		a.log.Warn("fault: TCP flows to gone backends are not flagged", "fault", faults.KeepFlowsToGoneBackends, "backends", fmt.Sprint(gone))
		return nil
	}
	n, err := a.dp.MarkDNATFlowsGone(gone)
	if err != nil {
		a.leftTCP = append(a.leftTCP, gone...)
		return fmt.Errorf("flag the conntrack entries of TCP flows to gone backends %v: %w", gone, err)
	}
	a.log.Info("flagged the conntrack entries of TCP flows to gone backends, to be reset", "backends", fmt.Sprint(gone), "entries", n)
	return nil
}

// forgetStaleUDP deletes the conntrack entries of UDP flows DNATed to backends their
// frontends no longer have (step 7, once the frontends point at their new backends):
// a UDP client that keeps its 5-tuple has no handshake that would pick a backend
// again, so its flow would go to the removed backend for as long as the entry lives.
// TCP flows are not deleted: the removed backend's RST or FIN ends them (endGoneTCP
// makes sure of it), and a new SYN on their tuple picks a backend again. This is
// kube-proxy's conntrack cleanup.
// What could not be deleted is tried again next round.
func (a *Agent) forgetStaleUDP() error {
	stale := a.staleUDP
	if len(stale) == 0 {
		return nil
	}
	if a.cfg.Faults.Has(faults.KeepUDPConntrackOnBackendRemoval) {
		a.log.Warn("fault: UDP flows to removed backends keep their conntrack entries", "fault", faults.KeepUDPConntrackOnBackendRemoval, "backends", fmt.Sprint(stale))
		a.staleUDP = nil
		return nil
	}
	n, err := a.dp.DeleteDNATFlows(stale)
	if err != nil {
		return fmt.Errorf("delete the conntrack entries of UDP flows to removed backends %v: %w", stale, err)
	}
	a.log.Info("deleted the conntrack entries of UDP flows to removed backends", "backends", fmt.Sprint(stale), "entries", n)
	a.staleUDP = nil
	return nil
}

// goneTCP sorts the TCP backends removed from their frontends (left, duplicates
// allowed) into those whose endpoints are gone (not listed) and those still draining
// (listed, terminating); one back in its frontend's backends (inMaps) is neither.
func goneTCP(left []bpf.DNATFlows, inMaps map[bpf.FrontendKey][]bpf.BackendValue, listed services.Desired) (gone, draining []bpf.DNATFlows) {
	isListed := map[bpf.DNATFlows]bool{}
	for _, sp := range listed {
		for _, f := range sp.Frontends {
			for _, b := range sp.Backends {
				isListed[bpf.DNATFlows{Frontend: f, Backend: b}] = true
			}
		}
	}
	seen := map[bpf.DNATFlows]bool{}
	for _, f := range left {
		switch {
		case seen[f]:
		case slices.Contains(inMaps[f.Frontend], f.Backend):
		case isListed[f]:
			draining = append(draining, f)
		default:
			gone = append(gone, f)
		}
		seen[f] = true
	}
	return gone, draining
}

// syncIPTables (re)writes refdp's iptables chains when they were not written yet or
// the set of workload interfaces changed since (step 6). The workloads are those
// attached that stay: an endpoint about to be detached is closed first.
func (a *Agent) syncIPTables(ctx context.Context, want map[int]endpoint) error {
	ifindexes := make([]int, 0, len(a.attached))
	for ifindex := range a.attached {
		if _, ok := want[ifindex]; ok {
			ifindexes = append(ifindexes, ifindex)
		}
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
	if err := a.writeIPTables(ctx, names, false); err != nil {
		return err
	}
	a.iptablesFor = ifindexes
	return nil
}

// writeIPTables writes refdp's chains for these workload interfaces (ungated: see
// iptables.Config.Ungated).
func (a *Agent) writeIPTables(ctx context.Context, workloads []string, ungated bool) error {
	cfg := iptables.Config{
		Marks:                      iptables.Marks{Seen: bpf.MarkSeen, Fallthrough: bpf.MarkFallthrough, Vouched: bpf.MarkVouched, Mask: bpf.MarkMask},
		WorkloadPrefix:             a.cfg.WorkloadInterfacePrefix,
		Workloads:                  workloads,
		NoForwardFallthroughAccept: a.cfg.Faults.Has(faults.NoForwardFallthroughAccept),
		Ungated:                    ungated,
	}
	if cfg.NoForwardFallthroughAccept && a.iptablesFor == nil {
		a.log.Warn("fault: FORWARD has no accept for fallthrough packets", "fault", faults.NoForwardFallthroughAccept)
	}
	if err := iptables.Ensure(ctx, cfg); err != nil {
		return err
	}
	a.log.Info("iptables written", "workloadInterfaces", workloads)
	return nil
}

// existingLinks returns the interfaces of names that exist.
func existingLinks(names []string) []string {
	var out []string
	for _, n := range names {
		if _, err := netlink.LinkByName(n); err == nil {
			out = append(out, n)
		}
	}
	return out
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
