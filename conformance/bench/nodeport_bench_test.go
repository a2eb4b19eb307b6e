// Package bench compares implementations side by side through their drivers, on the
// same topology, in one run: the figures are ratios measured together, not numbers
// to compare across machines.
package bench

import (
	"context"
	"fmt"
	"net"
	"os"
	"sort"
	"strconv"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/dpconform/dpconform/fv/driver"
	"github.com/dpconform/dpconform/fv/harness"
	"github.com/dpconform/dpconform/fv/probe"
	"github.com/dpconform/dpconform/fv/timeline"
	"github.com/dpconform/dpconform/internal/buildbin"
	"github.com/dpconform/dpconform/internal/privileged"
	"github.com/dpconform/dpconform/topologies"
	"github.com/dpconform/dpconform/topologies/netns"
)

func TestMain(m *testing.M) {
	probe.RunIfChild()
	os.Exit(m.Run())
}

// figures are what one implementation measured for one backend placement.
type figures struct {
	perSecond     float64
	p50, p99, max time.Duration
	failed        int
}

// measureNodePort brings up a topology with drv's implementation and measures new TCP
// connections from the external client to node-a's NodePort for d, backend on node
// (a or b).
func measureNodePort(b *testing.B, drv driver.Driver, d, interval time.Duration) map[string]figures {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	info, err := drv.Info(ctx)
	if err != nil {
		b.Fatal(err)
	}
	topo, err := netns.New(ctx, netns.Options{CNIConfig: info.CNI})
	if err != nil {
		b.Fatal(err)
	}
	defer topo.Close()
	prog, err := probe.Self()
	if err != nil {
		b.Fatal(err)
	}
	w := harness.New(topo, drv, prog)
	defer w.Cleanup(context.Background())
	if err := w.StartAll(ctx); err != nil {
		b.Fatal(err)
	}
	nodeA := topo.Nodes()[0]
	out := map[string]figures{}
	for i, n := range topo.Nodes() {
		name := "web-" + n.Name()
		pod, err := topo.AddPod(ctx, topologies.PodSpec{Name: name, Node: n.Name(), Labels: map[string]string{"app": name}})
		if err != nil {
			b.Fatal(err)
		}
		if _, err := w.StartProbe(ctx, pod, probe.Serve{Name: name, TCP: []int{8080}}); err != nil {
			b.Fatal(err)
		}
		svc, err := topologies.CreateService(ctx, topo.Kube(), &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeNodePort, Selector: map[string]string{"app": name},
				Ports: []corev1.ServicePort{{Port: 80, TargetPort: intstr.FromInt32(8080), Protocol: corev1.ProtocolTCP}}},
		})
		if err != nil {
			b.Fatal(err)
		}
		if err := topologies.WaitForEndpoints(ctx, topo.Kube(), "default", name, pod); err != nil {
			b.Fatal(err)
		}
		// The implementation programs the Service asynchronously: give it a moment.
		time.Sleep(500 * time.Millisecond)
		tl := timeline.New()
		target := net.JoinHostPort(nodeA.IP().String(), strconv.Itoa(int(svc.Spec.Ports[0].NodePort)))
		p, err := probe.Start(ctx, topo.External(), prog, probe.Connect{Name: "bench", Target: target, Interval: interval, Count: int(d / interval)}, probe.Options{OnEvent: tl.Add})
		if err != nil {
			b.Fatal(err)
		}
		<-p.Done()
		var lat []time.Duration
		var first, last time.Time
		f := figures{}
		for _, e := range tl.Whole().Events {
			if e.Kind != probe.KindAttempt {
				continue
			}
			if e.Outcome != probe.OK {
				f.failed++
				continue
			}
			lat = append(lat, e.Latency)
			t := e.Time.Wall()
			if first.IsZero() || t.Before(first) {
				first = t
			}
			if t.After(last) {
				last = t
			}
		}
		if len(lat) < 2 {
			b.Fatalf("%s: only %d successful connections", name, len(lat))
		}
		sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
		f.perSecond = float64(len(lat)) / last.Sub(first).Seconds()
		f.p50, f.p99, f.max = lat[len(lat)/2], lat[len(lat)*99/100], lat[len(lat)-1]
		placement := "local"
		if i > 0 {
			placement = "remote"
		}
		out[placement] = f
	}
	return out
}

// BenchmarkNodePortRefdpVsKubeProxy measures new NodePort connections per second and
// their latency through the reference dataplane and through real kube-proxy (iptables
// mode), one after the other on identical topologies, and prints the ratios.
func BenchmarkNodePortRefdpVsKubeProxy(b *testing.B) {
	privileged.Require(b)
	bins, err := buildbin.Build(context.Background(), b.TempDir(), "reference/cmd/refdp", "reference/cmd/refdp-driver", "conformance/cmd/kube-proxy-driver")
	if err != nil {
		b.Fatal(err)
	}
	const d, interval = 3 * time.Second, 200 * time.Microsecond
	impls := []struct{ name, driver string }{
		{"refdp", bins["refdp-driver"]},
		{"kube-proxy-iptables", bins["kube-proxy-driver"]},
	}
	results := map[string]map[string]figures{}
	for i := 0; i < b.N; i++ {
		for _, impl := range impls {
			drv, err := driver.NewExec(impl.driver, driver.DefaultTimeouts, "DPC_KUBE_PROXY_MODE=iptables")
			if err != nil {
				b.Fatal(err)
			}
			results[impl.name] = measureNodePort(b, drv, d, interval)
		}
	}
	for _, placement := range []string{"local", "remote"} {
		r, k := results["refdp"][placement], results["kube-proxy-iptables"][placement]
		fmt.Printf("NodePort, %s backend: refdp %.0f conn/s p50 %v p99 %v (failed %d) | kube-proxy %.0f conn/s p50 %v p99 %v (failed %d) | refdp/kube-proxy: rate x%.2f, p99 x%.2f\n",
			placement, r.perSecond, r.p50, r.p99, r.failed, k.perSecond, k.p50, k.p99, k.failed,
			r.perSecond/k.perSecond, float64(r.p99)/float64(k.p99))
		b.ReportMetric(r.perSecond/k.perSecond, placement+"-rate-ratio")
		b.ReportMetric(float64(r.p99)/float64(k.p99), placement+"-p99-ratio")
	}
	b.ReportMetric(0, "ns/op")
}
