package bench

import (
	"cmp"
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"

	"github.com/dpconform/dpconform/driver"
	"github.com/dpconform/dpconform/fv/monotime"
	"github.com/dpconform/dpconform/fv/probe"
	"github.com/dpconform/dpconform/internal/buildbin"
	"github.com/dpconform/dpconform/internal/privileged"
	"github.com/dpconform/dpconform/topologies"
)

// The load a policy change is measured under: pods and policies already present.
const (
	loadPods     = 1000
	loadPolicies = 1000
	// policyCycles is how many times the deny policy is created and deleted.
	policyCycles = 20
	// obeyWithin is how long a change is watched before it counts as never obeyed;
	// a denial counts as obeyed once nothing has got through for denySettled.
	obeyWithin  = 30 * time.Second
	denySettled = time.Second
	benchPort   = 9000
	// connectEvery and connectTimeout are the client's: a new TCP connection (a new
	// flow, which policy judges afresh; a UDP datagram from a new socket would reuse
	// tuples that conntrack still admits) every millisecond.
	connectEvery   = time.Millisecond
	connectTimeout = 200 * time.Millisecond
)

// policyFigures are one implementation's latencies from a NetworkPolicy's create (a
// deny) and delete (the allow comes back) to the first datagram that obeys it.
type policyFigures struct {
	create, delete []time.Duration
	never          int // changes not obeyed within obeyWithin
}

// loadNamespace holds the load: pods that exist only as API objects, bound to a node
// that has no agent (their IPs are in no one's routes), and policies that select them.
// An implementation computes its IP sets and selectors over the whole cluster, so they
// are what it must work through on every change; no packet of theirs is sent.
const loadNamespace = "bench-load"

func addLoad(ctx context.Context, kube kubernetes.Interface) error {
	if _, err := kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{
		Name: loadNamespace, Labels: map[string]string{"ns": loadNamespace}}}, metav1.CreateOptions{}); err != nil {
		return err
	}
	errs := make(chan error, loadPods)
	sem := make(chan struct{}, 32)
	for i := range loadPods {
		sem <- struct{}{}
		go func() {
			defer func() { <-sem }()
			errs <- addLoadPod(ctx, kube, i)
		}()
	}
	for range loadPods {
		if err := <-errs; err != nil {
			return err
		}
	}
	for i := range loadPolicies {
		tcp := corev1.ProtocolTCP
		port := intstr.FromString("http")
		np := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: loadNamespace, Name: fmt.Sprintf("load-%d", i)},
			Spec: networkingv1.NetworkPolicySpec{
				PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": fmt.Sprintf("load-%d", i)}},
				Ingress: []networkingv1.NetworkPolicyIngressRule{{
					From:  []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"role": fmt.Sprintf("r%d", (i+1)%10)}}}},
					Ports: []networkingv1.NetworkPolicyPort{{Protocol: &tcp, Port: &port}},
				}},
			}}
		if _, err := kube.NetworkingV1().NetworkPolicies(loadNamespace).Create(ctx, np, metav1.CreateOptions{}); err != nil {
			return err
		}
	}
	return nil
}

func addLoadPod(ctx context.Context, kube kubernetes.Interface, i int) error {
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: loadNamespace, Name: fmt.Sprintf("load-%d", i),
			Labels: map[string]string{"app": fmt.Sprintf("load-%d", i), "role": fmt.Sprintf("r%d", i%10)}},
		Spec: corev1.PodSpec{NodeName: "node-virtual", Containers: []corev1.Container{{Name: "c", Image: "none",
			Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080, Protocol: corev1.ProtocolTCP}}}}},
	}
	created, err := kube.CoreV1().Pods(loadNamespace).Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		return err
	}
	ip := netip.AddrFrom4([4]byte{10, 250, byte(i / 250), byte(i%250 + 1)})
	patch := fmt.Sprintf(`{"metadata":{"uid":%q},"status":{"phase":"Running","podIP":%q,"podIPs":[{"ip":%q}]}}`, created.UID, ip, ip)
	_, err = kube.CoreV1().Pods(loadNamespace).Patch(ctx, created.Name, types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{}, "status")
	return err
}

// measurePolicy brings up a topology with drv's implementation, adds the load, and
// times a deny policy's create and delete, black-box: a client on node-a opens a new
// TCP connection every millisecond to a server on node-b.
func measurePolicy(b *testing.B, drv driver.Driver) policyFigures {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	w, done := bringUp(ctx, b, drv)
	defer done()
	topo := w.Topo
	kube := topo.Kube()
	if err := addLoad(ctx, kube); err != nil {
		b.Fatalf("add %d pods and %d policies: %v", loadPods, loadPolicies, err)
	}
	if err := w.StartAll(ctx); err != nil {
		b.Fatal(err)
	}
	nodes := topo.Nodes()
	server, err := topo.AddPod(ctx, topologies.PodSpec{Name: "server", Node: nodes[1].Name(), Labels: map[string]string{"app": "server"}})
	if err != nil {
		b.Fatal(err)
	}
	client, err := topo.AddPod(ctx, topologies.PodSpec{Name: "client", Node: nodes[0].Name()})
	if err != nil {
		b.Fatal(err)
	}
	if _, err := w.StartProbe(ctx, server, probe.Serve{Name: "server", TCP: []int{benchPort}}); err != nil {
		b.Fatal(err)
	}
	cli, err := w.StartProbe(ctx, client, probe.Connect{Name: "client", Target: fmt.Sprintf("%s:%d", server.IP(), benchPort),
		Interval: connectEvery, Timeout: connectTimeout})
	if err != nil {
		b.Fatal(err)
	}
	d := attempts{cli: cli}
	// Before any change, the flow must flow.
	if lat, ok, err := d.obey(ctx, monotime.Now(), true); err != nil || !ok || lat > obeyWithin {
		b.Fatalf("the client's connections do not reach the server before any policy (ok %v after %v): %v", ok, lat, err)
	}
	nps := kube.NetworkingV1().NetworkPolicies("default")
	deny := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: "deny-server"},
		Spec: networkingv1.NetworkPolicySpec{PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "server"}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}}}
	var f policyFigures
	for range policyCycles {
		t0 := monotime.Now()
		if _, err := nps.Create(ctx, deny, metav1.CreateOptions{}); err != nil {
			b.Fatal(err)
		}
		lat, ok, err := d.obey(ctx, t0, false)
		if err != nil {
			b.Fatal(err)
		}
		f.record(&f.create, lat, ok)
		t0 = monotime.Now()
		if err := nps.Delete(ctx, deny.Name, metav1.DeleteOptions{}); err != nil {
			b.Fatal(err)
		}
		lat, ok, err = d.obey(ctx, t0, true)
		if err != nil {
			b.Fatal(err)
		}
		f.record(&f.delete, lat, ok)
	}
	return f
}

func (f *policyFigures) record(into *[]time.Duration, lat time.Duration, ok bool) {
	if !ok {
		f.never++
		lat = obeyWithin
	}
	*into = append(*into, lat)
}

// attempts reads the client's connection attempts.
type attempts struct{ cli *probe.Process }

// obey watches from t0 until the change is obeyed, for obeyWithin at most, and returns
// how long after t0 the first connection attempt started that obeys it: with allowed,
// the first one answered; without, the first of a run of refused ones that has lasted
// denySettled (a denial holds only once nothing gets through any more).
func (d attempts) obey(ctx context.Context, t0 monotime.Time, allowed bool) (time.Duration, bool, error) {
	for {
		now := monotime.Now()
		// Attempts are reported when they end: judge those started a timeout ago.
		through := now.Add(-connectTimeout)
		if err := d.cli.WaitMark(ctx, now); err != nil {
			return 0, false, fmt.Errorf("client: %w", err)
		}
		if lat, ok := d.obeyed(t0, through, allowed); ok {
			return lat, true, nil
		}
		if now.Sub(t0) > obeyWithin {
			return 0, false, nil
		}
		if err := sleepUntil(ctx, now.Add(100*time.Millisecond)); err != nil {
			return 0, false, err
		}
	}
}

// obeyed judges the attempts started from t0 through the given time.
func (d attempts) obeyed(t0, through monotime.Time, allowed bool) (time.Duration, bool) {
	var tried []probe.Event
	for _, e := range d.cli.Events() {
		if e.Kind == probe.KindAttempt && e.Time >= t0 && e.Time <= through {
			tried = append(tried, e)
		}
	}
	slices.SortFunc(tried, func(a, b probe.Event) int { return cmp.Compare(a.Time, b.Time) })
	ok := func(e probe.Event) bool { return e.Outcome == probe.OK }
	if allowed {
		if i := slices.IndexFunc(tried, ok); i >= 0 {
			return tried[i].Time.Sub(t0), true
		}
		return 0, false
	}
	i := len(tried)
	for i > 0 && !ok(tried[i-1]) {
		i--
	}
	if i == len(tried) || through.Sub(tried[i].Time) < denySettled {
		return 0, false
	}
	return tried[i].Time.Sub(t0), true
}

func sleepUntil(ctx context.Context, t monotime.Time) error {
	d := t.Sub(monotime.Now())
	if d <= 0 {
		return nil
	}
	select {
	case <-time.After(d):
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func percentile(ds []time.Duration, p int) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[min(len(s)-1, len(s)*p/100)]
}

// BenchmarkPolicyProgramming measures, black-box, how long a NetworkPolicy's create and
// delete take to be obeyed by new flows, with 1,000 pods and 1,000 policies already
// present, through the reference dataplane and through a real policy implementation
// (kube-router's network policy controller) one after the other on identical
// topologies, and prints them side by side. The reference's target: p99 under 100 ms.
func BenchmarkPolicyProgramming(b *testing.B) {
	privileged.Require(b)
	bins, err := buildbin.Build(context.Background(), b.TempDir(), "reference/cmd/refdp", "drivers/refdp-driver", "drivers/kube-router-driver")
	if err != nil {
		b.Fatal(err)
	}
	impls := []struct{ name, driver string }{
		{"refdp", bins["refdp-driver"]},
		{"kube-router", bins["kube-router-driver"]},
	}
	results := map[string]policyFigures{}
	for i := 0; i < b.N; i++ {
		for _, impl := range impls {
			drv, err := driver.NewExec(impl.driver, driver.DefaultTimeouts)
			if err != nil {
				b.Fatal(err)
			}
			results[impl.name] = measurePolicy(b, drv)
		}
	}
	var line []string
	for _, impl := range impls {
		f := results[impl.name]
		line = append(line, fmt.Sprintf("%s: create p50 %v p99 %v, delete p50 %v p99 %v, never obeyed %d of %d",
			impl.name, percentile(f.create, 50), percentile(f.create, 99), percentile(f.delete, 50), percentile(f.delete, 99), f.never, 2*len(f.create)))
	}
	r, k := results["refdp"], results["kube-router"]
	fmt.Printf("NetworkPolicy programming, %d pods and %d policies present: %s | kube-router/refdp p99: create x%.1f, delete x%.1f\n",
		loadPods, loadPolicies, strings.Join(line, " | "),
		float64(percentile(k.create, 99))/float64(max(percentile(r.create, 99), time.Millisecond)),
		float64(percentile(k.delete, 99))/float64(max(percentile(r.delete, 99), time.Millisecond)))
	b.ReportMetric(float64(percentile(r.create, 99).Milliseconds()), "refdp-create-p99-ms")
	b.ReportMetric(float64(percentile(r.delete, 99).Milliseconds()), "refdp-delete-p99-ms")
	b.ReportMetric(float64(percentile(k.create, 99).Milliseconds()), "kube-router-create-p99-ms")
	b.ReportMetric(float64(percentile(k.delete, 99).Milliseconds()), "kube-router-delete-p99-ms")
	b.ReportMetric(0, "ns/op")
}
