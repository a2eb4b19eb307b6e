package workloads_test

import (
	"context"
	"errors"
	"net"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/dpconform/dpconform/driver"
	"github.com/dpconform/dpconform/fv/harness"
	"github.com/dpconform/dpconform/fv/matchers"
	"github.com/dpconform/dpconform/fv/probe"
	"github.com/dpconform/dpconform/fv/timeline"
	"github.com/dpconform/dpconform/fv/workloads"
	"github.com/dpconform/dpconform/internal/privileged"
	"github.com/dpconform/dpconform/topologies/netns"
)

func TestMain(m *testing.M) {
	probe.RunIfChild()
	os.Exit(m.Run())
}

// noDataplane is an implementation that is not there: the fixtures' pod-to-pod paths
// need none (the topology routes pod CIDRs between nodes), Services do.
type noDataplane struct{ driver.Driver }

func (noDataplane) Cleanup(context.Context, driver.Node) error { return nil }

func TestFixturesOnABareTopology(t *testing.T) {
	privileged.Require(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	topo, err := netns.New(ctx, netns.Options{Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	defer topo.Close()
	prog, err := probe.Self()
	if err != nil {
		t.Fatal(err)
	}
	w := harness.New(topo, noDataplane{}, prog)
	defer w.Cleanup(context.Background())

	f, err := workloads.DeployNetpol(ctx, w)
	if err != nil {
		t.Fatal(err)
	}
	if len(f.Pods) != 9 {
		t.Fatalf("%d pods, want x, y, z times a, b, c", len(f.Pods))
	}
	from, _ := f.Pod("x", "a")
	to, _ := f.Pod("y", "b") // on the other node
	for _, port := range workloads.NetpolPorts {
		target := net.JoinHostPort(to.Pod.IP().String(), strconv.Itoa(int(port)))
		tl := timeline.New()
		p, err := probe.Start(ctx, from.Pod, prog, probe.Connect{Name: "tcp", Target: target, Count: 5, Interval: 5 * time.Millisecond}, probe.Options{OnEvent: tl.Add})
		if err != nil {
			t.Fatal(err)
		}
		<-p.Done()
		if ok, err := matchers.HaveNoFailedAttempts(matchers.Backends(to.ID())).Match(tl.Whole()); !ok || err != nil {
			t.Errorf("TCP %s from %s to %s: ok=%v err=%v", target, from.ID(), to.ID(), ok, err)
		}
		udp := probe.UDP{Name: "udp-" + strconv.Itoa(int(port)), To: []probe.Destination{{Label: "y/b", Addr: target}}, Count: 5, Interval: 5 * time.Millisecond}
		if _, err := w.StartProbe(ctx, from.Pod, udp); err != nil {
			t.Fatal(err)
		}
	}
	// The servers record what reached them: both UDP ports of y/b got datagrams.
	time.Sleep(300 * time.Millisecond)
	if err := w.StopProbes(ctx); err != nil {
		t.Fatal(err)
	}
	got := map[string]int{}
	for _, e := range w.Timeline().Whole().Events {
		if e.Kind == probe.KindRecv && e.Proto == "udp" && e.Backend == to.ID() {
			got[e.Target]++
		}
	}
	if got["y/b"] < 10 {
		t.Errorf("y/b received %d of 10 datagrams on ports 80 and 81", got["y/b"])
	}

	// Without a dataplane a ClusterIP never carries traffic: WaitFlowing says so, as
	// a flow not programmed, within its budget.
	svc, err := workloads.AddService(ctx, w, "nothing", map[string]string{workloads.PodLabel: "a"})
	if err != nil {
		t.Fatal(err)
	}
	warm := workloads.Warm{Streak: 5, Interval: 10 * time.Millisecond, Within: time.Second}
	start := time.Now()
	err = workloads.WaitFlowing(ctx, w, workloads.Flow{Name: "clusterip", From: from.Pod, Target: svc.ClusterIPAddr()}, warm)
	if !errors.Is(err, workloads.ErrNotFlowing) || time.Since(start) > 5*time.Second {
		t.Errorf("WaitFlowing without a dataplane = %v after %s, want ErrNotFlowing within its 1 s budget", err, time.Since(start))
	}

	// A backend serves UDP too, under its name: a direct UDP flow to it warms up; its
	// UDP Service, without a dataplane, does not.
	be, _, err := workloads.AddBackend(ctx, w, "udp-backend", topo.Nodes()[1].Name(), map[string]string{"app": "udp-backend"})
	if err != nil {
		t.Fatal(err)
	}
	if err := workloads.WaitUDPFlowing(ctx, w, workloads.Flow{Name: "direct-udp", From: from.Pod, Target: workloads.Direct(be), Backend: be.Name()}, warm); err != nil {
		t.Errorf("WaitUDPFlowing to a backend's own address: %v", err)
	}
	usvc, err := workloads.AddUDPService(ctx, w, "nothing-udp", map[string]string{"app": "udp-backend"}, be)
	if err != nil {
		t.Fatal(err)
	}
	start = time.Now()
	err = workloads.WaitUDPFlowing(ctx, w, workloads.Flow{Name: "clusterip-udp", From: from.Pod, Target: usvc.ClusterIPAddr(), Backend: be.Name()}, warm)
	if !errors.Is(err, workloads.ErrNotFlowing) || time.Since(start) > 5*time.Second {
		t.Errorf("WaitUDPFlowing without a dataplane = %v after %s, want ErrNotFlowing within its 1 s budget", err, time.Since(start))
	}
}
