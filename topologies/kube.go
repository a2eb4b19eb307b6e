package topologies

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// CreateService creates svc (namespace "default" when empty) and returns it as stored,
// with its ClusterIP and node ports allocated.
func CreateService(ctx context.Context, kube kubernetes.Interface, svc *corev1.Service) (*corev1.Service, error) {
	if svc.Namespace == "" {
		svc = svc.DeepCopy()
		svc.Namespace = "default"
	}
	out, err := kube.CoreV1().Services(svc.Namespace).Create(ctx, svc, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("create Service %s/%s: %w", svc.Namespace, svc.Name, err)
	}
	return out, nil
}

// ReadyEndpoints returns the sorted addresses of ready endpoints in the
// EndpointSlices of a Service.
func ReadyEndpoints(ctx context.Context, kube kubernetes.Interface, namespace, service string) ([]netip.Addr, error) {
	return endpointAddrs(ctx, kube, namespace, service, true)
}

// ListedEndpoints returns the sorted addresses of every endpoint in the
// EndpointSlices of a Service, ready or not: a terminating endpoint is still
// listed, and a dataplane may keep serving the flows it has (kube-proxy keeps
// those of a terminating endpoint that is still serving).
func ListedEndpoints(ctx context.Context, kube kubernetes.Interface, namespace, service string) ([]netip.Addr, error) {
	return endpointAddrs(ctx, kube, namespace, service, false)
}

func endpointAddrs(ctx context.Context, kube kubernetes.Interface, namespace, service string, onlyReady bool) ([]netip.Addr, error) {
	slices, err := kube.DiscoveryV1().EndpointSlices(namespace).List(ctx, metav1.ListOptions{
		LabelSelector: discoveryv1.LabelServiceName + "=" + service,
	})
	if err != nil {
		return nil, fmt.Errorf("list EndpointSlices of %s/%s: %w", namespace, service, err)
	}
	var out []netip.Addr
	for _, s := range slices.Items {
		for _, ep := range s.Endpoints {
			if onlyReady && ep.Conditions.Ready != nil && !*ep.Conditions.Ready {
				continue
			}
			for _, a := range ep.Addresses {
				if ip, err := netip.ParseAddr(a); err == nil {
					out = append(out, ip)
				}
			}
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Less(out[j]) })
	return out, nil
}

// WaitForEndpoints waits until the EndpointSlices of a Service list exactly the given
// pods as ready endpoints (the endpointslice controller has caught up), or ctx ends.
func WaitForEndpoints(ctx context.Context, kube kubernetes.Interface, namespace, service string, pods ...Pod) error {
	return waitForEndpoints(ctx, kube, namespace, service, "ready", ReadyEndpoints, pods)
}

// WaitForListedEndpoints waits until the EndpointSlices of a Service list exactly the
// given pods, and no other endpoint, ready or not (a removed pod's endpoint may be
// listed as terminating before it goes), or ctx ends.
func WaitForListedEndpoints(ctx context.Context, kube kubernetes.Interface, namespace, service string, pods ...Pod) error {
	return waitForEndpoints(ctx, kube, namespace, service, "", ListedEndpoints, pods)
}

// WaitForEndpointAddrs is WaitForEndpoints (listed false) or WaitForListedEndpoints
// (listed true) for the pods of these addresses.
func WaitForEndpointAddrs(ctx context.Context, kube kubernetes.Interface, namespace, service string, listed bool, want ...netip.Addr) error {
	if listed {
		return waitForAddrs(ctx, kube, namespace, service, "", ListedEndpoints, want)
	}
	return waitForAddrs(ctx, kube, namespace, service, "ready", ReadyEndpoints, want)
}

func waitForEndpoints(ctx context.Context, kube kubernetes.Interface, namespace, service, what string,
	list func(context.Context, kubernetes.Interface, string, string) ([]netip.Addr, error), pods []Pod) error {
	want := make([]netip.Addr, len(pods))
	for i, p := range pods {
		want[i] = p.IP()
	}
	return waitForAddrs(ctx, kube, namespace, service, what, list, want)
}

func waitForAddrs(ctx context.Context, kube kubernetes.Interface, namespace, service, what string,
	list func(context.Context, kubernetes.Interface, string, string) ([]netip.Addr, error), want []netip.Addr) error {
	want = slices.Clone(want)
	sort.Slice(want, func(i, j int) bool { return want[i].Less(want[j]) })
	if namespace == "" {
		namespace = "default"
	}
	var got []netip.Addr
	var err error
	for {
		got, err = list(ctx, kube, namespace, service)
		if err == nil && slices.Equal(got, want) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("EndpointSlices of %s/%s list %s, want %s (last error: %v): %w",
				namespace, service, strings.TrimSpace(what+" "+addrs(got)), addrs(want), err, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func addrs(a []netip.Addr) string {
	s := make([]string, len(a))
	for i, x := range a {
		s[i] = x.String()
	}
	return "[" + strings.Join(s, " ") + "]"
}
