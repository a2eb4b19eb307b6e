// Package services computes the reference dataplane's NAT state from Services and
// EndpointSlices and writes it to the datapath's frontend and backend maps.
package services

import (
	"net/netip"
	"sort"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/dpconform/dpconform/bpf"
)

// ServicePort is the desired state of one port of one Service: every frontend that
// reaches it and its ready backends, in a stable order.
type ServicePort struct {
	Frontends []bpf.FrontendKey
	Backends  []bpf.BackendValue
}

// Desired maps "namespace/name:port/proto" to a ServicePort.
type Desired map[string]ServicePort

// Compute derives the desired state. NodePort frontends are keyed by each of hostIPs:
// without host IPs there are none, which is why the syncer must not delete until
// hostIPs are known.
func Compute(svcs []*corev1.Service, slices []*discoveryv1.EndpointSlice, hostIPs []netip.Addr) Desired {
	return compute(svcs, slices, hostIPs, true)
}

// Listed is Compute with every endpoint the EndpointSlices list as a backend, ready
// or not: a terminating endpoint is still there, and may serve the flows it has.
func Listed(svcs []*corev1.Service, slices []*discoveryv1.EndpointSlice, hostIPs []netip.Addr) Desired {
	return compute(svcs, slices, hostIPs, false)
}

func compute(svcs []*corev1.Service, slices []*discoveryv1.EndpointSlice, hostIPs []netip.Addr, onlyReady bool) Desired {
	bySvc := map[string][]*discoveryv1.EndpointSlice{}
	for _, s := range slices {
		if s.AddressType != discoveryv1.AddressTypeIPv4 {
			continue
		}
		name := s.Labels[discoveryv1.LabelServiceName]
		if name == "" {
			continue
		}
		bySvc[s.Namespace+"/"+name] = append(bySvc[s.Namespace+"/"+name], s)
	}
	out := Desired{}
	for _, svc := range svcs {
		switch svc.Spec.Type {
		case corev1.ServiceTypeExternalName:
			continue
		}
		var clusterIPs []netip.Addr
		for _, s := range svc.Spec.ClusterIPs {
			if a, err := netip.ParseAddr(s); err == nil && a.Is4() {
				clusterIPs = append(clusterIPs, a)
			}
		}
		for _, p := range svc.Spec.Ports {
			proto, ok := protoOf(p.Protocol)
			if !ok {
				continue
			}
			var sp ServicePort
			for _, ip := range clusterIPs {
				sp.Frontends = append(sp.Frontends, bpf.FrontendKey{Addr: ip, Port: uint16(p.Port), Proto: proto})
			}
			if p.NodePort != 0 && svc.Spec.Type != corev1.ServiceTypeClusterIP {
				for _, ip := range hostIPs {
					sp.Frontends = append(sp.Frontends, bpf.FrontendKey{Addr: ip, Port: uint16(p.NodePort), Proto: proto})
				}
			}
			if len(sp.Frontends) == 0 {
				continue
			}
			sp.Backends = backendsFor(bySvc[svc.Namespace+"/"+svc.Name], p.Name, p.Protocol, onlyReady)
			out[svc.Namespace+"/"+svc.Name+":"+strconv.Itoa(int(p.Port))+"/"+string(p.Protocol)] = sp
		}
	}
	return out
}

func protoOf(p corev1.Protocol) (bpf.Proto, bool) {
	switch p {
	case corev1.ProtocolTCP, "":
		return bpf.TCP, true
	case corev1.ProtocolUDP:
		return bpf.UDP, true
	}
	return 0, false
}

// backendsFor lists the ready endpoints of a Service port, deduplicated and sorted.
func backendsFor(slices []*discoveryv1.EndpointSlice, portName string, proto corev1.Protocol, onlyReady bool) []bpf.BackendValue {
	seen := map[bpf.BackendValue]bool{}
	var out []bpf.BackendValue
	for _, s := range slices {
		var port int32
		found := false
		for _, sp := range s.Ports {
			name := ""
			if sp.Name != nil {
				name = *sp.Name
			}
			p := corev1.ProtocolTCP
			if sp.Protocol != nil {
				p = *sp.Protocol
			}
			if name == portName && p == proto && sp.Port != nil {
				port, found = *sp.Port, true
				break
			}
		}
		if !found {
			continue
		}
		for _, ep := range s.Endpoints {
			if onlyReady && ep.Conditions.Ready != nil && !*ep.Conditions.Ready {
				continue
			}
			for _, a := range ep.Addresses {
				ip, err := netip.ParseAddr(a)
				if err != nil || !ip.Is4() {
					continue
				}
				b := bpf.BackendValue{Addr: ip, Port: uint16(port)}
				if !seen[b] {
					seen[b] = true
					out = append(out, b)
				}
			}
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if c := out[i].Addr.Compare(out[j].Addr); c != 0 {
			return c < 0
		}
		return out[i].Port < out[j].Port
	})
	return out
}
