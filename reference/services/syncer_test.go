package services

import (
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/dpconform/dpconform/bpf"
)

// recorder is a map backend that logs every operation in order.
type recorder[K comparable, V any] struct {
	name string
	m    map[K]V
	log  *[]string
}

func (r *recorder[K, V]) Put(k K, v V) error {
	r.m[k] = v
	*r.log = append(*r.log, fmt.Sprintf("put %s %v", r.name, k))
	return nil
}
func (r *recorder[K, V]) Delete(k K) error {
	delete(r.m, k)
	*r.log = append(*r.log, fmt.Sprintf("delete %s %v", r.name, k))
	return nil
}
func (r *recorder[K, V]) All() (map[K]V, error) { return maps.Clone(r.m), nil }

type world struct {
	fe  *recorder[bpf.FrontendKey, bpf.FrontendValue]
	be  *recorder[bpf.BackendKey, bpf.BackendValue]
	log []string
}

func newWorld() *world {
	w := &world{}
	w.fe = &recorder[bpf.FrontendKey, bpf.FrontendValue]{name: "fe", m: map[bpf.FrontendKey]bpf.FrontendValue{}, log: &w.log}
	w.be = &recorder[bpf.BackendKey, bpf.BackendValue]{name: "be", m: map[bpf.BackendKey]bpf.BackendValue{}, log: &w.log}
	return w
}

var (
	hostIP    = netip.MustParseAddr("10.213.1.10")
	clusterIP = netip.MustParseAddr("10.96.0.10")
	podA      = netip.MustParseAddr("10.244.0.5")
	podB      = netip.MustParseAddr("10.244.1.7")
)

func nodePortSvc() *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web"},
		Spec: corev1.ServiceSpec{
			Type: corev1.ServiceTypeNodePort, ClusterIP: clusterIP.String(), ClusterIPs: []string{clusterIP.String()},
			Ports: []corev1.ServicePort{{Name: "http", Port: 80, NodePort: 30080, Protocol: corev1.ProtocolTCP}},
		},
	}
}

func slice(ips ...netip.Addr) *discoveryv1.EndpointSlice {
	s := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: "default", Name: "web-x", Labels: map[string]string{discoveryv1.LabelServiceName: "web"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("http"), Port: ptr.To[int32](8080), Protocol: ptr.To(corev1.ProtocolTCP)}},
	}
	for _, ip := range ips {
		s.Endpoints = append(s.Endpoints, discoveryv1.Endpoint{Addresses: []string{ip.String()}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}})
	}
	return s
}

func TestComputeNodePortNeedsHostIPs(t *testing.T) {
	d := Compute([]*corev1.Service{nodePortSvc()}, []*discoveryv1.EndpointSlice{slice(podB, podA)}, []netip.Addr{hostIP})
	sp := d["default/web:80/TCP"]
	want := []bpf.FrontendKey{{Addr: clusterIP, Port: 80, Proto: bpf.TCP}, {Addr: hostIP, Port: 30080, Proto: bpf.TCP}}
	if fmt.Sprint(sp.Frontends) != fmt.Sprint(want) {
		t.Errorf("frontends %v, want %v", sp.Frontends, want)
	}
	if fmt.Sprint(sp.Backends) != "[10.244.0.5:8080 10.244.1.7:8080]" {
		t.Errorf("backends %v, want both pods, sorted, on the target port", sp.Backends)
	}
	d = Compute([]*corev1.Service{nodePortSvc()}, []*discoveryv1.EndpointSlice{slice(podA)}, nil)
	if n := len(d["default/web:80/TCP"].Frontends); n != 1 {
		t.Errorf("without host IPs there must be only the ClusterIP frontend, got %d", n)
	}
}

// The regression of Calico issue 12192: a restarted agent that does not yet know its
// host IPs must not delete the NodePort frontend the previous run left.
func TestIncompleteApplyDeletesNothing(t *testing.T) {
	w := newWorld()
	full := Compute([]*corev1.Service{nodePortSvc()}, []*discoveryv1.EndpointSlice{slice(podA)}, []netip.Addr{hostIP})
	s, _ := NewSyncer(w.fe, w.be, SyncerOptions{})
	if _, err := s.Apply(full, true); err != nil {
		t.Fatal(err)
	}
	nodePort := bpf.FrontendKey{Addr: hostIP, Port: 30080, Proto: bpf.TCP}

	// A new run adopts the pinned state, then sees the datastore before its host IPs.
	s, _ = NewSyncer(w.fe, w.be, SyncerOptions{})
	partial := Compute([]*corev1.Service{nodePortSvc()}, []*discoveryv1.EndpointSlice{slice(podA)}, nil)
	w.log = nil
	st, err := s.Apply(partial, false)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := w.fe.m[nodePort]; !ok {
		t.Fatalf("incomplete apply deleted the NodePort frontend (%s; ops %v)", st, w.log)
	}
	if len(w.log) != 0 {
		t.Errorf("adopted state that did not change was rewritten: %v", w.log)
	}
	// With the full view, what is desired stays and nothing else is touched.
	if _, err := s.Apply(full, true); err != nil {
		t.Fatal(err)
	}
	if _, ok := w.fe.m[nodePort]; !ok || len(w.log) != 0 {
		t.Fatalf("complete apply: frontend present %v, ops %v", ok, w.log)
	}
	// And a Service that is gone is deleted once the view is complete.
	if _, err := s.Apply(Desired{}, true); err != nil {
		t.Fatal(err)
	}
	if len(w.fe.m) != 0 || len(w.be.m) != 0 {
		t.Fatalf("left %v %v", w.fe.m, w.be.m)
	}
}

func TestBackendChangeIsMakeBeforeBreak(t *testing.T) {
	w := newWorld()
	s, _ := NewSyncer(w.fe, w.be, SyncerOptions{})
	svcs := []*corev1.Service{nodePortSvc()}
	s.Apply(Compute(svcs, []*discoveryv1.EndpointSlice{slice(podA)}, []netip.Addr{hostIP}), true)
	oldID := w.fe.m[bpf.FrontendKey{Addr: clusterIP, Port: 80, Proto: bpf.TCP}].ServiceID

	w.log = nil
	s.Apply(Compute(svcs, []*discoveryv1.EndpointSlice{slice(podA, podB)}, []netip.Addr{hostIP}), true)
	fe := w.fe.m[bpf.FrontendKey{Addr: clusterIP, Port: 80, Proto: bpf.TCP}]
	if fe.ServiceID == oldID || fe.BackendCount != 2 {
		t.Fatalf("frontend %+v: want a fresh service ID with 2 backends", fe)
	}
	ops := strings.Join(w.log, "\n")
	firstFE := strings.Index(ops, "put fe")
	lastBEPut := strings.LastIndex(ops, "put be")
	firstDel := strings.Index(ops, "delete")
	if firstFE < lastBEPut || firstDel < firstFE {
		t.Fatalf("want backends written, then frontends switched, then the old set deleted:\n%s", ops)
	}
	for k := range w.be.m {
		if k.ServiceID == oldID {
			t.Errorf("old backend %v left behind", k)
		}
	}
}

func TestRebuildInPlaceFault(t *testing.T) {
	w := newWorld()
	s, _ := NewSyncer(w.fe, w.be, SyncerOptions{RebuildBackendsInPlace: true})
	svcs := []*corev1.Service{nodePortSvc()}
	s.Apply(Compute(svcs, []*discoveryv1.EndpointSlice{slice(podA)}, []netip.Addr{hostIP}), true)
	oldID := w.fe.m[bpf.FrontendKey{Addr: clusterIP, Port: 80, Proto: bpf.TCP}].ServiceID
	w.log = nil
	s.Apply(Compute(svcs, []*discoveryv1.EndpointSlice{slice(podB)}, []netip.Addr{hostIP}), true)
	if id := w.fe.m[bpf.FrontendKey{Addr: clusterIP, Port: 80, Proto: bpf.TCP}].ServiceID; id != oldID {
		t.Fatalf("the fault keeps the service ID, got %d want %d", id, oldID)
	}
	if !strings.HasPrefix(w.log[0], "delete be") {
		t.Fatalf("the fault empties the backend slots first: %v", w.log)
	}
}

func TestFrontendsBeforeBackendsFault(t *testing.T) {
	w := newWorld()
	s, _ := NewSyncer(w.fe, w.be, SyncerOptions{FrontendsBeforeBackends: true})
	svcs := []*corev1.Service{nodePortSvc()}
	s.Apply(Compute(svcs, []*discoveryv1.EndpointSlice{slice(podA)}, []netip.Addr{hostIP}), true)
	w.log = nil
	s.Apply(Compute(svcs, []*discoveryv1.EndpointSlice{slice(podA, podB)}, []netip.Addr{hostIP}), true)
	ops := strings.Join(w.log, "\n")
	if lastFE, firstBE := strings.LastIndex(ops, "put fe"), strings.Index(ops, "put be"); firstBE < lastFE {
		t.Fatalf("the fault switches the frontends before it writes the backends:\n%s", ops)
	}
	if fe := w.fe.m[bpf.FrontendKey{Addr: clusterIP, Port: 80, Proto: bpf.TCP}]; fe.BackendCount != 2 {
		t.Fatalf("frontend %+v: want 2 backends once the Apply is done", fe)
	}
}

func udpSvc() *corev1.Service {
	s := nodePortSvc()
	s.Spec.Ports[0].Name, s.Spec.Ports[0].Protocol = "dns", corev1.ProtocolUDP
	return s
}

func udpSlice(ips ...netip.Addr) *discoveryv1.EndpointSlice {
	s := slice(ips...)
	s.Ports[0].Name, s.Ports[0].Protocol = ptr.To("dns"), ptr.To(corev1.ProtocolUDP)
	return s
}

// A UDP flow keeps the backend its conntrack entry names: the syncer reports each
// backend a UDP frontend loses (the backend removed, or the frontend gone), so that
// the agent deletes those flows' entries, once, and nothing when a backend stays, is
// only added, or serves TCP. A restarted agent reports what changed while it was down.
func TestStaleUDPBackends(t *testing.T) {
	host := []netip.Addr{hostIP}
	stale := func(fes []bpf.FrontendKey, b netip.Addr) []bpf.DNATFlows {
		var out []bpf.DNATFlows
		for _, f := range fes {
			out = append(out, bpf.DNATFlows{Frontend: f, Backend: bpf.BackendValue{Addr: b, Port: 8080}})
		}
		return out
	}
	udpFEs := []bpf.FrontendKey{{Addr: hostIP, Port: 30080, Proto: bpf.UDP}, {Addr: clusterIP, Port: 80, Proto: bpf.UDP}} // sorted
	tcpSvc := nodePortSvc()
	tcpSvc.Name = "web-tcp"
	tcpSlice := slice(podA)
	tcpSlice.Labels[discoveryv1.LabelServiceName] = "web-tcp"
	tcpSlice.Name = "web-tcp-x"
	tcpSlice2 := slice()
	tcpSlice2.Labels[discoveryv1.LabelServiceName] = "web-tcp"
	tcpSlice2.Name = "web-tcp-x"
	tcpSvc.Spec.ClusterIP, tcpSvc.Spec.ClusterIPs = "10.96.0.11", []string{"10.96.0.11"}
	tcpSvc.Spec.Ports[0].NodePort = 30081

	w := newWorld()
	s, _ := NewSyncer(w.fe, w.be, SyncerOptions{})
	for _, step := range []struct {
		name     string
		svcs     []*corev1.Service
		slices   []*discoveryv1.EndpointSlice
		complete bool
		want     []bpf.DNATFlows
	}{
		{"first apply", []*corev1.Service{udpSvc(), tcpSvc}, []*discoveryv1.EndpointSlice{udpSlice(podA), tcpSlice}, true, nil},
		{"a backend added", []*corev1.Service{udpSvc(), tcpSvc}, []*discoveryv1.EndpointSlice{udpSlice(podA, podB), tcpSlice}, true, nil},
		{"the first backend removed", []*corev1.Service{udpSvc(), tcpSvc}, []*discoveryv1.EndpointSlice{udpSlice(podB), tcpSlice}, true, stale(udpFEs, podA)},
		{"nothing changed", []*corev1.Service{udpSvc(), tcpSvc}, []*discoveryv1.EndpointSlice{udpSlice(podB), tcpSlice}, true, nil},
		{"a TCP backend removed", []*corev1.Service{udpSvc(), tcpSvc}, []*discoveryv1.EndpointSlice{udpSlice(podB), tcpSlice2}, true, nil},
		// Without the whole view the TCP Service is kept; the UDP one is written.
		{"the last backend removed, the view incomplete", []*corev1.Service{udpSvc()}, []*discoveryv1.EndpointSlice{udpSlice()}, false, stale(udpFEs, podB)},
		{"and complete", []*corev1.Service{udpSvc()}, []*discoveryv1.EndpointSlice{udpSlice()}, true, nil},
		{"a backend again", []*corev1.Service{udpSvc()}, []*discoveryv1.EndpointSlice{udpSlice(podA)}, true, nil},
		{"the Service deleted", nil, nil, true, stale(udpFEs, podA)},
	} {
		st, err := s.Apply(Compute(step.svcs, step.slices, host), step.complete)
		if err != nil {
			t.Fatalf("%s: %v", step.name, err)
		}
		if !slices.Equal(st.StaleUDP, step.want) {
			t.Errorf("%s: stale UDP backends %v, want %v", step.name, st.StaleUDP, step.want)
		}
		// TCP backends are reported the same way (the agent flags their flows once
		// the endpoint is not listed any more): only the TCP Service's removal.
		wantTCP := 0
		if step.name == "a TCP backend removed" {
			wantTCP = 2 // its ClusterIP and its NodePort
		}
		if len(st.StaleTCP) != wantTCP || slices.ContainsFunc(st.StaleTCP, func(f bpf.DNATFlows) bool {
			return f.Backend.Addr != podA || f.Frontend.Proto != bpf.TCP
		}) {
			t.Errorf("%s: stale TCP backends %v, want %d of %s", step.name, st.StaleTCP, wantTCP, podA)
		}
	}

	// A backend removed while the agent was down: the next run adopts the maps and
	// reports it at its first complete apply.
	if _, err := s.Apply(Compute([]*corev1.Service{udpSvc()}, []*discoveryv1.EndpointSlice{udpSlice(podA, podB)}, host), true); err != nil {
		t.Fatal(err)
	}
	s, _ = NewSyncer(w.fe, w.be, SyncerOptions{})
	st, err := s.Apply(Compute([]*corev1.Service{udpSvc()}, []*discoveryv1.EndpointSlice{udpSlice(podB)}, host), true)
	if err != nil {
		t.Fatal(err)
	}
	if want := stale(udpFEs, podA); !slices.Equal(st.StaleUDP, want) {
		t.Errorf("after a restart: stale UDP backends %v, want %v", st.StaleUDP, want)
	}
}
