// Package bench compares implementations side by side through their drivers, on the
// same topology, in one run: the figures are ratios measured together, not numbers
// to compare across machines.
package bench

import (
	"context"
	"fmt"
	"os"
	"sort"
	"testing"
	"time"

	"github.com/dpconform/dpconform/driver"
	"github.com/dpconform/dpconform/fv/harness"
	"github.com/dpconform/dpconform/fv/probe"
	"github.com/dpconform/dpconform/fv/timeline"
	"github.com/dpconform/dpconform/fv/workloads"
	"github.com/dpconform/dpconform/internal/buildbin"
	"github.com/dpconform/dpconform/internal/privileged"
	"github.com/dpconform/dpconform/topologies/netns"
)

func TestMain(m *testing.M) {
	probe.RunIfChild()
	os.Exit(m.Run())
}

// bringUp makes a fresh topology for drv's implementation and a World on it, with
// the implementation not yet started; done tears both down. Each measurement has a
// world of its own, gone before the next one starts.
func bringUp(ctx context.Context, b *testing.B, drv driver.Driver) (w *harness.World, done func()) {
	b.Helper()
	info, err := drv.Info(ctx)
	if err != nil {
		b.Fatal(err)
	}
	topo, err := netns.New(ctx, netns.Options{CNIConfig: info.CNI, CNIDirs: info.CNIDirs()})
	if err != nil {
		b.Fatal(err)
	}
	prog, err := probe.Self()
	if err != nil {
		topo.Close()
		b.Fatal(err)
	}
	w = harness.New(topo, drv, prog)
	return w, func() {
		if err := w.Cleanup(context.Background()); err != nil {
			b.Errorf("driver cleanup: %v", err)
		}
		if err := topo.Close(); err != nil {
			b.Errorf("topology close: %v", err)
		}
	}
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
	w, done := bringUp(ctx, b, drv)
	defer done()
	topo, prog := w.Topo, w.Probe
	if err := w.StartAll(ctx); err != nil {
		b.Fatal(err)
	}
	nodeA := topo.Nodes()[0]
	out := map[string]figures{}
	for i, n := range topo.Nodes() {
		name := "web-" + n.Name()
		pod, _, err := workloads.AddBackend(ctx, w, name, n.Name(), map[string]string{"app": name})
		if err != nil {
			b.Fatal(err)
		}
		svc, err := workloads.AddService(ctx, w, name, map[string]string{"app": name}, pod)
		if err != nil {
			b.Fatal(err)
		}
		target := svc.NodePortAddr(nodeA)
		// The implementation programs the Service asynchronously: measure once it is.
		if err := workloads.WaitFlowing(ctx, w, workloads.Flow{Name: name, From: topo.External(), Target: target, Backend: name}, workloads.DefaultWarm); err != nil {
			b.Fatal(err)
		}
		tl := timeline.New()
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
	bins, err := buildbin.Build(context.Background(), b.TempDir(), "reference/cmd/refdp", "drivers/refdp-driver", "drivers/kube-proxy-driver")
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
