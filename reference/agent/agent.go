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
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/vishvananda/netlink"
	corev1listers "k8s.io/client-go/listers/core/v1"
	discoveryv1listers "k8s.io/client-go/listers/discovery/v1"
	"k8s.io/client-go/tools/cache"

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
	// Kubeconfig is the path of a kubeconfig for the API server; empty: the in-cluster
	// configuration of a pod's service account.
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

	svcLister   corev1listers.ServiceLister
	sliceLister discoveryv1listers.EndpointSliceLister
	podLister   corev1listers.PodLister // every pod of the cluster
	nsLister    corev1listers.NamespaceLister
	policies    *policyView
	nodeLister  corev1listers.NodeLister // this node's own object only
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
	leftTCP []bpf.DNATFlows
	// leftFound is set once this run has found in conntrack the TCP flows to
	// backends their frontends no longer have (findLeftTCP).
	leftFound       bool
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
	if cfg.Node == "" || cfg.PinDir == "" || cfg.StateDir == "" {
		return errors.New("agent: Node, PinDir and StateDir are required")
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

	a.logFaults(cfg.Faults)
	var err error
	a.dp, err = bpf.Open(cfg.PinDir, bpf.Options{
		ConntrackSize:        cfg.ConntrackSize,
		ConntrackFormat:      cfg.ConntrackFormat,
		UnpinnedConntrack:    cfg.Faults.Has(faults.UnpinnedConntrack),
		NoConntrackMigration: cfg.Faults.Has(faults.NoCTMigration),
		SNATPortUnchecked:    cfg.Faults.Has(faults.SNATPortUnchecked),
		NoCTMirror:           cfg.Faults.Has(faults.NoCTMirror),
	})
	if err != nil {
		return err
	}
	// Close releases file descriptors only: pinned maps and links stay, and with them
	// the datapath.
	defer a.dp.Close()
	a.status.conntrack = a.dp.Conntrack().Name() + " (" + a.dp.ConntrackFormat().String() + ")"
	a.syncer, err = services.NewSyncer(a.dp.Frontends(), a.dp.Backends(), services.SyncerOptions{
		RebuildBackendsInPlace:  cfg.Faults.Has(faults.RebuildBackendsInPlace),
		FrontendsBeforeBackends: cfg.Faults.Has(faults.FrontendsBeforeBackends),
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
		a.ready = true
		if err := a.status.write(true, "ready (adopted, not yet applied)"); err != nil {
			return err
		}
	}
	if cfg.Faults.Has(faults.FlushNATOnStart) {
		a.log.Warn("fault: flushing NAT maps", "fault", faults.FlushNATOnStart)
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
		a.log.Warn("fault: removing kube-proxy's rules now", "fault", faults.CleanupBeforeAttach)
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

// logFaults logs each fault the agent runs with, once, at its start: what it breaks,
// and where it reorders the agent's steps, the order it runs them in. What a fault
// then does is logged where it does it.
func (a *Agent) logFaults(fs faults.Set) {
	for _, f := range fs.Names() {
		args := []any{"fault", f, "what", faults.Describe(f)}
		switch f {
		case faults.CTCopyBeforeAttach:
			args = append(args, "order", fmt.Sprint(startOrder(fs)))
		case faults.AttachBeforeIPSets, faults.RedirectBeforePolicy:
			args = append(args, "order", fmt.Sprint(roundOrder(fs)))
		}
		a.log.Warn("fault active", args...)
	}
}
