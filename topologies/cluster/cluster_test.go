package cluster

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/dpconform/dpconform/fv/harness"
	"github.com/dpconform/dpconform/fv/probe"
	"github.com/dpconform/dpconform/topologies"
)

// The tests against a real cluster need one: DPC_CLUSTER_KUBECONFIG names its
// kubeconfig, and DPC_CLUSTER_DPCONFORM the dpconform binary whose image
// (dpconform.local/probe:<digest>) the nodes have, as a kind run loads it. `make
// kind-cluster-conformance` runs them on its kind cluster, after the Core run through
// the kind topology and before the one through this topology.
const (
	envKubeconfig = "DPC_CLUSTER_KUBECONFIG"
	envDpconform  = "DPC_CLUSTER_DPCONFORM"
	envChild      = "DPC_CLUSTER_TEST_CHILD"
)

// An address that only Open parses: these tests send nothing to the external client.
const testExternal = "192.0.2.1"

func TestMain(m *testing.M) {
	RunExecHelperIfChild()
	if os.Getenv(envChild) != "" {
		os.Exit(childRun())
	}
	os.Exit(m.Run())
}

func needCluster(t *testing.T) Options {
	t.Helper()
	kc, bin := os.Getenv(envKubeconfig), os.Getenv(envDpconform)
	if kc == "" || bin == "" {
		// Not a privilege a DPC_REQUIRE_PRIVILEGED run lacks: a cluster, which `make
		// kind-cluster-conformance` brings and then runs this test binary on.
		t.Skipf("SKIPPED LOUDLY: no cluster to test on: set %s (a kubeconfig) and %s (the dpconform binary whose probe image the nodes have); `make kind-cluster-conformance` does", envKubeconfig, envDpconform)
	}
	return Options{Kubeconfig: kc, ProbeBinary: bin, ExternalAddress: testExternal, Logf: t.Logf, MeasureClocks: true}
}

// childRun opens the cluster, says its run ID and waits to be killed: a run killed
// with everything it made still on the cluster.
func childRun() int {
	c, err := Open(context.Background(), Options{Kubeconfig: os.Getenv(envKubeconfig), ProbeBinary: os.Getenv(envDpconform), ExternalAddress: testExternal})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Println(c.RunID())
	time.Sleep(time.Hour)
	return 0
}

func runObjects(t *testing.T, kube kubernetes.Interface, runID string) []string {
	t.Helper()
	ctx := context.Background()
	sel := metav1.ListOptions{LabelSelector: RunLabel + "=" + runID}
	var out []string
	nss, err := kube.CoreV1().Namespaces().List(ctx, sel)
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range nss.Items {
		out = append(out, "namespace/"+o.Name)
	}
	pods, err := kube.CoreV1().Pods("").List(ctx, sel)
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range pods.Items {
		out = append(out, "pod/"+o.Namespace+"/"+o.Name)
	}
	svcs, err := kube.CoreV1().Services("").List(ctx, sel)
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range svcs.Items {
		out = append(out, "service/"+o.Namespace+"/"+o.Name)
	}
	sort.Strings(out)
	return out
}

func plainClient(t *testing.T, kubeconfig string) kubernetes.Interface {
	rc, err := restConfig(kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	kube, err := kubernetes.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	return kube
}

// TestOnCluster: the nodes are those the API lists; a spec's pods run where it says,
// "default" being the run's namespace; a spec's objects and namespaces go when its
// topology closes, the run's namespace stays; everything goes at the run's end.
func TestOnCluster(t *testing.T) {
	opts := needCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	plain := plainClient(t, opts.Kubeconfig)
	c, err := Open(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	runID := c.RunID()

	t.Run("discovery", func(t *testing.T) {
		all, err := plain.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		sort.Slice(all.Items, func(i, j int) bool { return all.Items[i].Name < all.Items[j].Name })
		var want []string
		for i := range all.Items {
			if n := &all.Items[i]; nodeReady(n) && !n.Spec.Unschedulable && len(want) < 2 {
				want = append(want, n.Name+"@"+internalIP(n).String())
			}
		}
		var got []string
		for _, n := range c.nodes {
			got = append(got, n.Name()+"@"+n.IP().String())
			if n.Interface() == "" {
				t.Errorf("node %s: no interface found", n.Name())
			}
		}
		if strings.Join(got, " ") != strings.Join(want, " ") {
			t.Errorf("nodes %v, want the first two Ready ones the API lists, %v", got, want)
		}
	})

	t.Run("spec objects go, the run's namespace stays", func(t *testing.T) {
		topo, err := c.Session(ctx)
		if err != nil {
			t.Fatal(err)
		}
		nodes := topo.Nodes()
		p, err := topo.AddPod(ctx, topologies.PodSpec{Name: "a", Node: nodes[1].Name(), Labels: map[string]string{"app": "a"}})
		if err != nil {
			t.Fatal(err)
		}
		if p.Namespace() != c.Namespace() {
			t.Errorf("pod a in %s, want the run's namespace %s", p.Namespace(), c.Namespace())
		}
		// The pod answers from its own address: a command runs in it.
		out, err := topologies.Output(ctx, p, opts.ProbeBinary, "node-op", "iface", p.IP().String())
		if err != nil || !strings.HasPrefix(string(out), "eth0 ") {
			t.Errorf("node-op iface %s in pod a: %q, %v; want eth0", p.IP(), out, err)
		}
		if _, err := topo.AddPod(ctx, topologies.PodSpec{Name: "b", Namespace: "order", Node: nodes[0].Name()}); err != nil {
			t.Fatal(err)
		}
		svc, err := topologies.CreateService(ctx, topo.Kube(), serviceFor("a"))
		if err != nil {
			t.Fatal(err)
		}
		if svc.Namespace != c.Namespace() || svc.Labels[RunLabel] != runID {
			t.Errorf("Service in %s labelled %v, want in %s labelled %s=%s", svc.Namespace, svc.Labels, c.Namespace(), RunLabel, runID)
		}
		before := runObjects(t, plain, runID)
		for _, w := range []string{"namespace/order", "pod/order/b", "pod/" + c.Namespace() + "/a", "service/" + c.Namespace() + "/a"} {
			if !contains(before, w) {
				t.Errorf("%s is not labelled with the run: %v", w, before)
			}
		}
		if err := topo.Close(); err != nil {
			t.Fatal(err)
		}
		after := runObjects(t, plain, runID)
		want := []string{"namespace/" + c.Namespace(), "pod/" + c.Namespace() + "/node-0", "pod/" + c.Namespace() + "/node-1"}
		if strings.Join(after, " ") != strings.Join(want, " ") {
			t.Errorf("after the spec: %v, want only the run's namespace and helpers %v", after, want)
		}
	})

	t.Run("hosts' clocks measured over the probes' control channel", func(t *testing.T) {
		// Open with MeasureClocks: kind's nodes share this machine's clock, so the
		// truth is an offset of zero, and each estimate's bound must cover it.
		topo, err := c.Session(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer topo.Close()
		if !topologies.HasOwnClocks(topo) {
			t.Fatal("MeasureClocks: the topology does not ask for its clocks to be measured")
		}
		w := harness.New(topo, nil, probe.Binary(opts.ProbeBinary))
		if err := w.MeasureClocks(ctx); err != nil {
			t.Fatal(err)
		}
		hcs, err := w.FinishClocks(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(hcs) != 3 {
			t.Fatalf("clocks of %d hosts, want the two nodes' and the external client's", len(hcs))
		}
		for _, hc := range hcs {
			t.Logf("%s: %s, least round trip %s of %d, drift %s, uncertainty %s", hc.Host, hc.First, hc.First.RTT, hc.First.Samples, hc.Drift(), hc.Uncertainty())
			if u := hc.Uncertainty(); hc.First.Offset < -u || hc.First.Offset > u {
				t.Errorf("%s shares this machine's clock, but was measured %s: the bound does not cover zero", hc.Host, hc.First)
			}
		}
	})

	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if left := runObjects(t, plain, runID); len(left) != 0 {
		t.Errorf("after the run: %v left", left)
	}
}

// TestKilledRunCleanup: a live run is spared by cleanup; once killed (SIGKILL: no
// Close), cleanup removes everything it made.
func TestKilledRunCleanup(t *testing.T) {
	opts := needCluster(t)
	plain := plainClient(t, opts.Kubeconfig)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	child := exec.CommandContext(ctx, exe)
	child.Env = append(os.Environ(), envChild+"=1")
	child.Stderr = os.Stderr
	out, err := child.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	defer child.Process.Kill()
	sc := bufio.NewScanner(out)
	if !sc.Scan() {
		child.Wait()
		t.Fatalf("the child run said nothing: %v", sc.Err())
	}
	runID := strings.TrimSpace(sc.Text())
	// Cleanup removes whatever it finds: run it once the test is done, whatever happens.
	defer Cleanup(context.Background(), CleanupOptions{Kubeconfig: opts.Kubeconfig, Runs: []string{runID}})
	if objs := runObjects(t, plain, runID); len(objs) == 0 {
		t.Fatalf("the child run %s made nothing", runID)
	}
	if err := Cleanup(ctx, CleanupOptions{Kubeconfig: opts.Kubeconfig, Logf: t.Logf}); err != nil {
		t.Fatal(err)
	}
	if objs := runObjects(t, plain, runID); !contains(objs, "namespace/"+NamespacePrefix+runID) {
		t.Fatalf("cleanup removed the live run %s: left %v", runID, objs)
	}
	if err := child.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	child.Wait()
	if err := Cleanup(ctx, CleanupOptions{Kubeconfig: opts.Kubeconfig, Logf: t.Logf}); err != nil {
		t.Fatal(err)
	}
	if objs := runObjects(t, plain, runID); len(objs) != 0 {
		t.Errorf("after cleanup of the killed run %s: %v left", runID, objs)
	}
	// Its run directory is this machine's and goes with `dpconform cleanup` of it.
	os.RemoveAll(filepath.Join(os.TempDir(), "dpconform-cluster", runID))
}

func contains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

func serviceFor(app string) *corev1.Service {
	return &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: app},
		Spec: corev1.ServiceSpec{Selector: map[string]string{"app": app}, Ports: []corev1.ServicePort{{Port: 80}}}}
}
