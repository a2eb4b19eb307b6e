package services

import (
	"fmt"
	"net/netip"
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/dpconform/dpconform/bpf"
	"github.com/dpconform/dpconform/internal/privileged"
)

// bigCluster is n ClusterIP+NodePort Services with per backends each.
func bigCluster(n, per int) ([]*corev1.Service, []*discoveryv1.EndpointSlice) {
	var svcs []*corev1.Service
	var slices []*discoveryv1.EndpointSlice
	for i := 0; i < n; i++ {
		name := fmt.Sprintf("svc-%d", i)
		ip := netip.AddrFrom4([4]byte{10, 96, byte(i >> 8), byte(i)}).String()
		svcs = append(svcs, &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name},
			Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeClusterIP, ClusterIP: ip, ClusterIPs: []string{ip},
				Ports: []corev1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP}}},
		})
		s := &discoveryv1.EndpointSlice{
			ObjectMeta:  metav1.ObjectMeta{Namespace: "default", Name: name + "-x", Labels: map[string]string{discoveryv1.LabelServiceName: name}},
			AddressType: discoveryv1.AddressTypeIPv4,
			Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("http"), Port: ptr.To[int32](8080), Protocol: ptr.To(corev1.ProtocolTCP)}},
		}
		for j := 0; j < per; j++ {
			a := netip.AddrFrom4([4]byte{10, 244, byte((i*per + j) >> 8), byte(i*per + j)}).String()
			s.Endpoints = append(s.Endpoints, discoveryv1.Endpoint{Addresses: []string{a}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}})
		}
		slices = append(slices, s)
	}
	return svcs, slices
}

// BenchmarkProgram10kServices measures, with the real datapath maps, programming
// 10,000 services x 5 backends from cold (target < 1 s) and a restarted agent adopting
// that state and reaching in-sync (target < 300 ms).
func BenchmarkProgram10kServices(b *testing.B) {
	privileged.Require(b)
	svcs, slices := bigCluster(10000, 5)
	var cold, restart, compute time.Duration
	for i := 0; i < b.N; i++ {
		dir, err := os.MkdirTemp("", "dpc-bench-bpffs-")
		if err != nil {
			b.Fatal(err)
		}
		if err := unix.Mount("bpf", dir, "bpf", 0, ""); err != nil {
			b.Fatal(err)
		}
		run := func() {
			defer os.Remove(dir)
			defer unix.Unmount(dir, unix.MNT_DETACH)
			pin := dir + "/refdp"
			os.MkdirAll(pin, 0o700)
			dp, err := bpf.Open(pin, bpf.Options{})
			if err != nil {
				b.Fatal(err)
			}
			start := time.Now()
			d := Compute(svcs, slices, nil)
			compute += time.Since(start)
			s, err := NewSyncer(dp.Frontends(), dp.Backends(), SyncerOptions{})
			if err != nil {
				b.Fatal(err)
			}
			if _, err := s.Apply(d, true); err != nil {
				b.Fatal(err)
			}
			cold += time.Since(start)
			dp.Close()

			// A restart: reopen the pinned maps, adopt, compute, apply (nothing to write).
			start = time.Now()
			dp, err = bpf.Open(pin, bpf.Options{})
			if err != nil {
				b.Fatal(err)
			}
			s, err = NewSyncer(dp.Frontends(), dp.Backends(), SyncerOptions{})
			if err != nil {
				b.Fatal(err)
			}
			st, err := s.Apply(Compute(svcs, slices, nil), true)
			if err != nil {
				b.Fatal(err)
			}
			restart += time.Since(start)
			if st.FrontendsWritten+st.BackendsWritten+st.FrontendsDeleted+st.BackendsDeleted != 0 {
				b.Fatalf("a restart with the same state rewrote entries: %s", st)
			}
			dp.Close()
			bpf.Remove(pin)
		}
		run()
	}
	b.ReportMetric(float64(cold.Milliseconds())/float64(b.N), "ms-cold")
	b.ReportMetric(float64(restart.Milliseconds())/float64(b.N), "ms-restart")
	b.ReportMetric(float64(compute.Milliseconds())/float64(b.N), "ms-compute")
	b.ReportMetric(0, "ns/op")
}
