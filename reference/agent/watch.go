package agent

import (
	"context"
	"fmt"
	"net/netip"
	"time"

	"github.com/vishvananda/netlink"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/dpconform/dpconform/reference/faults"
)

func (a *Agent) client() (kubernetes.Interface, error) {
	// No kubeconfig: a pod's service account (DPC_TOPOLOGY=cluster runs refdp as a
	// DaemonSet with one).
	rc, err := rest.InClusterConfig()
	if a.cfg.Kubeconfig != "" {
		rc, err = clientcmd.BuildConfigFromFlags("", a.cfg.Kubeconfig)
	}
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
	a.svcLister = f.Core().V1().Services().Lister()
	a.sliceLister = f.Discovery().V1().EndpointSlices().Lister()
	a.podLister = f.Core().V1().Pods().Lister()
	a.nsLister = f.Core().V1().Namespaces().Lister()
	a.nodeLister = self.Core().V1().Nodes().Lister()
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

// hostIPDelay is how late host-IP discovery reports under the eager-service-sync
// fault: long enough to erase NodePort frontends for a measurable time, as in Calico
// issue 12192 (~0.5 s).
const hostIPDelay = 400 * time.Millisecond
