package topologies

import (
	"context"
	"net/netip"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/utils/ptr"
)

type fakePod struct {
	name string
	ip   netip.Addr
}

func (p fakePod) Name() string            { return p.name }
func (p fakePod) IP() netip.Addr          { return p.ip }
func (fakePod) Start(*exec.Cmd) error     { return nil }
func (fakePod) Namespace() string         { return "default" }
func (fakePod) NodeName() string          { return "node-a" }
func (fakePod) Labels() map[string]string { return nil }

func endpointSlice(eps ...discoveryv1.Endpoint) *discoveryv1.EndpointSlice {
	return &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: "default", Name: "udp-x", Labels: map[string]string{discoveryv1.LabelServiceName: "udp"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   eps,
	}
}

func endpoint(ip string, ready, terminating bool) discoveryv1.Endpoint {
	return discoveryv1.Endpoint{Addresses: []string{ip},
		Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(ready), Serving: ptr.To(true), Terminating: ptr.To(terminating)}}
}

// A removed pod's endpoint may be listed as terminating (not ready, still serving)
// before it goes: ready endpoints leave it out, listed ones do not.
func TestListedEndpointsKeepTerminatingOnes(t *testing.T) {
	ctx := context.Background()
	newPod := fakePod{"udp-new", netip.MustParseAddr("10.244.0.3")}
	kube := fake.NewClientset(endpointSlice(endpoint("10.244.1.2", false, true), endpoint("10.244.0.3", true, false)))

	ready, err := ReadyEndpoints(ctx, kube, "default", "udp")
	if err != nil || !slices.Equal(ready, []netip.Addr{newPod.ip}) {
		t.Errorf("ReadyEndpoints = %v, %v; want only %s", ready, err, newPod.ip)
	}
	listed, err := ListedEndpoints(ctx, kube, "default", "udp")
	if want := []netip.Addr{newPod.ip, netip.MustParseAddr("10.244.1.2")}; err != nil || !slices.Equal(listed, want) {
		t.Errorf("ListedEndpoints = %v, %v; want %v", listed, err, want)
	}
	if err := WaitForEndpoints(ctx, kube, "default", "udp", newPod); err != nil {
		t.Errorf("WaitForEndpoints: %v", err)
	}

	short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	err = WaitForListedEndpoints(short, kube, "default", "udp", newPod)
	if err == nil || !strings.Contains(err.Error(), "list [10.244.0.3 10.244.1.2], want [10.244.0.3]") {
		t.Errorf("WaitForListedEndpoints with the terminating endpoint listed = %v", err)
	}

	// The endpoint goes.
	go func() {
		time.Sleep(100 * time.Millisecond)
		_, _ = kube.DiscoveryV1().EndpointSlices("default").Update(ctx, endpointSlice(endpoint("10.244.0.3", true, false)), metav1.UpdateOptions{})
	}()
	wctx, wcancel := context.WithTimeout(ctx, 5*time.Second)
	defer wcancel()
	if err := WaitForListedEndpoints(wctx, kube, "default", "udp", newPod); err != nil {
		t.Errorf("WaitForListedEndpoints once it is gone: %v", err)
	}
}
