package kind_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dpconform/dpconform/internal/privileged"
	"github.com/dpconform/dpconform/topologies"
	"github.com/dpconform/dpconform/topologies/kind"
	"github.com/dpconform/dpconform/topologies/kind/dockerd"
)

// One cluster serves every test of the package, as one serves every spec of a run:
// its creation is most of the time these tests take. TestTeardown, last, closes it.
var (
	cluster *kind.Cluster
	topo    *kind.Topology
	roles   string // the static binary the pods run (testdata/roles)
	setup   error  // why there is no cluster
	before  map[string]string
)

func TestMain(m *testing.M) {
	dockerd.RuntimeWrapperMain()
	code := m.Run()
	if cluster != nil {
		cluster.Close()
	}
	if roles != "" {
		os.RemoveAll(filepath.Dir(roles))
	}
	os.Exit(code)
}

var once sync.Once

// bringUp makes the cluster the first time a test needs it: the package's unit
// tests need none.
func bringUp() {
	dir, err := os.MkdirTemp("", "dpconform-kind-test-")
	if err != nil {
		setup = err
		return
	}
	roles = filepath.Join(dir, "roles")
	build := exec.Command("go", "build", "-o", roles, "./testdata/roles")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		setup = fmt.Errorf("build testdata/roles: %v: %s", err, out)
		return
	}
	before = hostState()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	start := time.Now()
	cluster, setup = kind.NewCluster(ctx, kind.Options{ProbeBinary: roles, Logf: func(f string, a ...any) {
		fmt.Printf("%s "+f+"\n", append([]any{time.Since(start).Round(100 * time.Millisecond)}, a...)...)
	}})
	if setup == nil {
		if topo, setup = cluster.Session(ctx); setup != nil {
			cluster.Close()
			cluster = nil
		}
	}
}

// need skips or fails a test that needs the cluster: privileges first (privileged
// says which), then the node image, which CI builds (`make kind-image`) and a
// developer may not have.
func need(t *testing.T) {
	t.Helper()
	privileged.Require(t)
	once.Do(bringUp)
	if setup != nil {
		if strings.Contains(setup.Error(), "make kind-image") && !privileged.Required() {
			t.Skip("SKIPPED KIND TEST: " + setup.Error())
		}
		t.Fatal(setup)
	}
	if cluster == nil {
		t.Fatal("the cluster is gone (TestTeardown ran)")
	}
}

// run starts role in h and returns its stdout lines; the process is killed at the
// end of the test.
func run(t *testing.T, h topologies.Host, args ...string) (<-chan string, *exec.Cmd) {
	t.Helper()
	cmd := exec.Command(roles, args...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := h.Start(cmd); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	ch := make(chan string, 100)
	go func() {
		s := bufio.NewScanner(out)
		for s.Scan() {
			ch <- s.Text()
		}
		close(ch)
	}()
	return ch, cmd
}

func expectLine(t *testing.T, ch <-chan string, want string, within time.Duration) {
	t.Helper()
	select {
	case l, ok := <-ch:
		if !ok || l != want {
			t.Fatalf("got %q (open %v), want %q", l, ok, want)
		}
	case <-time.After(within):
		t.Fatalf("no %q within %s", want, within)
	}
}

func serve(t *testing.T, h topologies.Host, name string) {
	t.Helper()
	ch, _ := run(t, h, "echo", ":8080", name)
	expectLine(t, ch, "listening", 10*time.Second)
}

func dial(ctx context.Context, from topologies.Host, ip string) (string, error) {
	out, err := topologies.Output(ctx, from, roles, "dial", net.JoinHostPort(ip, "8080"))
	return string(out), err
}

func addPod(t *testing.T, ctx context.Context, name, node string) topologies.Pod {
	t.Helper()
	p, err := topo.AddPod(ctx, topologies.PodSpec{Name: name, Node: node, Labels: map[string]string{"app": "web"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { topo.RemovePod(context.Background(), p) })
	return p
}

func TestBringUp(t *testing.T) {
	need(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if got := len(topo.Nodes()); got != 2 {
		t.Fatalf("%d nodes, want 2", got)
	}
	objs, err := topo.Kube().CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cidrs := map[string]bool{}
	for _, o := range objs.Items {
		n := topo.Node(o.Name)
		if n == nil {
			t.Fatalf("Node %s is not a node of the topology", o.Name)
		}
		if o.Spec.PodCIDR != n.PodCIDR().String() || cidrs[o.Spec.PodCIDR] {
			t.Errorf("Node %s: pod CIDR %s, topology %s (seen before: %v)", o.Name, o.Spec.PodCIDR, n.PodCIDR(), cidrs[o.Spec.PodCIDR])
		}
		cidrs[o.Spec.PodCIDR] = true
		if !slices.Contains(o.Status.Addresses, corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: n.IP().String()}) {
			t.Errorf("Node %s: addresses %v, want InternalIP %s", o.Name, o.Status.Addresses, n.IP())
		}
		env := strings.Join(n.DriverEnv(), " ")
		for _, want := range []string{"DPC_TOPOLOGY=kind", "DPC_NODE=" + o.Name, "DPC_KUBECONFIG=" + topo.Kubeconfig(), "DPC_NETNS= "} {
			if !strings.Contains(env+" ", want) {
				t.Errorf("driver environment of %s lacks %q: %s", o.Name, want, env)
			}
		}
	}
	// The kubeconfig is at the same path inside the nodes, and works there.
	out, err := topologies.Output(ctx, topo.Nodes()[1], "kubectl", "--kubeconfig", topo.Kubeconfig(), "get", "nodes", "-o", "name")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Count(string(out), "node/") != 2 {
		t.Errorf("kubectl in a node lists %q, want 2 nodes", out)
	}
	// No DNS: kubeadm's addon is off (nothing resolves names, and CoreDNS is not built).
	if _, err := topo.Kube().AppsV1().Deployments("kube-system").Get(ctx, "coredns", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("coredns Deployment: %v, want none", err)
	}
}

func TestPodsAcrossNodes(t *testing.T) {
	need(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	a, b := topo.Nodes()[0].Name(), topo.Nodes()[1].Name()
	p0, p1, p2 := addPod(t, ctx, "web-0", a), addPod(t, ctx, "web-1", a), addPod(t, ctx, "web-2", b)
	for _, p := range []topologies.Pod{p0, p1, p2} {
		if !topo.Node(p.NodeName()).PodCIDR().Contains(p.IP()) {
			t.Errorf("pod %s has %s, outside its node's pod CIDR %s", p.Name(), p.IP(), topo.Node(p.NodeName()).PodCIDR())
		}
	}
	serve(t, p1, "web-1")
	serve(t, p2, "web-2")
	serve(t, topo.Nodes()[1], "node-b")
	for _, c := range []struct {
		name     string
		from     topologies.Host
		to, want string
	}{
		{"same node", p0, p1.IP().String(), "web-1"},
		{"across nodes", p0, p2.IP().String(), "web-2"},
		{"across nodes, the other way", p2, p1.IP().String(), "web-1"},
		{"external to node", topo.External(), topo.Nodes()[1].IP().String(), "node-b"},
	} {
		got, err := dial(ctx, c.from, c.to)
		if err != nil || got != c.want {
			t.Errorf("%s: got %q, %v; want %q", c.name, got, err, c.want)
		}
	}
	if _, err := dial(ctx, topo.External(), p1.IP().String()); err == nil {
		t.Error("the external client reached a pod: it must have no route to pods; only the dataplane's NodePorts reach them")
	}
	svc, err := topologies.CreateService(ctx, topo.Kube(), &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec: corev1.ServiceSpec{Selector: map[string]string{"app": "web"}, Type: corev1.ServiceTypeNodePort,
			Ports: []corev1.ServicePort{{Port: 80, Protocol: corev1.ProtocolTCP}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if svc.Spec.Ports[0].NodePort == 0 {
		t.Error("no node port allocated")
	}
	if err := topologies.WaitForEndpoints(ctx, topo.Kube(), "default", "web", p0, p1, p2); err != nil {
		t.Fatal(err)
	}
}

// How a removed pod's connections end is what SVC-ENDPOINT-VANISH judges a dataplane
// by: RemovePod closes them (FIN), VanishPod leaves them silent.
func TestRemoveAndVanish(t *testing.T) {
	need(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	a, b := topo.Nodes()[0].Name(), topo.Nodes()[1].Name()
	client := addPod(t, ctx, "client", a)
	for _, vanish := range []bool{false, true} {
		p, err := topo.AddPod(ctx, topologies.PodSpec{Name: fmt.Sprintf("held-%v", vanish), Node: b})
		if err != nil {
			t.Fatal(err)
		}
		held, _ := run(t, p, "hold", ":8080")
		expectLine(t, held, "listening", 10*time.Second)
		ended, _ := run(t, client, "watch", net.JoinHostPort(p.IP().String(), "8080"))
		expectLine(t, ended, "connected", 10*time.Second)
		expectLine(t, held, "accepted", 10*time.Second)
		if !vanish {
			if err := topo.RemovePod(ctx, p); err != nil {
				t.Fatal(err)
			}
			expectLine(t, ended, "fin", 5*time.Second)
			continue
		}
		if err := topo.VanishPod(ctx, p); err != nil {
			t.Fatal(err)
		}
		select {
		case l := <-ended:
			t.Errorf("the client heard %q from a pod that vanished", l)
		case <-time.After(time.Second):
		}
		if _, err := topo.Kube().CoreV1().Pods("default").Get(ctx, p.Name(), metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Errorf("the vanished pod's object is left: %v", err)
		}
	}
}

func TestSpareAddressAndPinnedNeighbour(t *testing.T) {
	need(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	n := topo.Nodes()[0]
	spare := n.SpareAddress()
	serve(t, n, "node-a")
	if err := topo.PinNeighbour(ctx, topo.External(), spare, n); err != nil {
		t.Fatal(err)
	}
	if err := n.AddAddress(ctx, spare); err != nil {
		t.Fatal(err)
	}
	if got, err := dial(ctx, topo.External(), spare.String()); err != nil || got != "node-a" {
		t.Errorf("external to the spare address: %q, %v", got, err)
	}
	if err := n.RemoveAddress(ctx, spare); err != nil {
		t.Fatal(err)
	}
	if _, err := dial(ctx, topo.External(), spare.String()); err == nil {
		t.Error("the spare address still answers after RemoveAddress")
	}
}

func TestOnWiredIsNotServed(t *testing.T) {
	need(t)
	_, err := topo.AddPod(context.Background(), topologies.PodSpec{Name: "early", Node: topo.Nodes()[0].Name(),
		OnWired: func(context.Context, topologies.Pod) error { return nil }})
	if !errors.Is(err, topologies.ErrUnsupported) {
		t.Fatalf("AddPod with OnWired: %v, want ErrUnsupported", err)
	}
}

// TestTeardown, last, closes the cluster and checks that it left nothing: no
// container, network or run directory, no daemon, the host's networking and the
// settings kubelets write as they were.
func TestTeardown(t *testing.T) {
	need(t)
	id, dir := cluster.RunID(), filepath.Join(kind.DefaultRunRoot(), cluster.RunID())
	if err := topo.Close(); err != nil {
		t.Fatal(err)
	}
	// The next spec's view starts clean.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	next, err := cluster.Session(ctx)
	if err != nil {
		t.Fatal(err)
	}
	pods, _ := next.Kube().CoreV1().Pods("default").List(ctx, metav1.ListOptions{})
	svcs, _ := next.Kube().CoreV1().Services("default").List(ctx, metav1.ListOptions{})
	if len(pods.Items) != 0 || len(svcs.Items) != 1 {
		t.Errorf("a new session finds %d pods and %d Services in default, want 0 and the API server's", len(pods.Items), len(svcs.Items))
	}
	if err := next.Close(); err != nil {
		t.Fatal(err)
	}
	if err := cluster.Close(); err != nil {
		t.Fatal(err)
	}
	cluster = nil
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("run directory %s is left: %v", dir, err)
	}
	if out, _ := exec.Command("pgrep", "-f", dockerd.RunDirBase).CombinedOutput(); len(strings.TrimSpace(string(out))) > 0 {
		t.Errorf("processes of the daemon are left: %s", out)
	}
	if m, _ := filepath.Glob("/sys/fs/cgroup/*/dpconform-docker-*/*"); len(m) > 0 {
		t.Errorf("cgroups of the daemon's containers are left: %v", m)
	}
	after := hostState()
	for k, v := range before {
		if after[k] != v {
			t.Errorf("host %s differs after the run %s:\n--- before\n%s\n+++ after\n%s", k, id, v, after[k])
		}
	}
	if _, err := os.Stat("/lib/modules"); err == nil && before["lib-modules"] == "absent" {
		t.Error("/lib/modules, made by kind's bind mount, is left")
	}
}

// hostState is what a kind run could change on the host and must not leave changed.
func hostState() map[string]string {
	out := map[string]string{}
	for name, argv := range map[string][]string{
		"links":                {"ip", "-o", "link", "show"},
		"routes":               {"ip", "route", "show"},
		"iptables":             {"iptables-save"},
		"nftables":             {"nft", "list", "ruleset"},
		"ip_forward":           {"sysctl", "-n", "net.ipv4.ip_forward"},
		"vm.overcommit_memory": {"sysctl", "-n", "vm.overcommit_memory"},
		"kernel.panic":         {"sysctl", "-n", "kernel.panic"},
		"kernel.panic_on_oops": {"sysctl", "-n", "kernel.panic_on_oops"},
	} {
		o, _ := exec.Command(argv[0], argv[1:]...).CombinedOutput()
		var keep []string
		for _, l := range strings.Split(string(o), "\n") {
			// Counters, comments and other runs' links (netns suites on the same
			// host) are not this run's.
			if strings.HasPrefix(l, "#") || strings.HasPrefix(l, ":") || strings.Contains(l, "dpc") && !strings.Contains(l, "dpcdocker") {
				continue
			}
			keep = append(keep, l)
		}
		out[name] = strings.Join(keep, "\n")
	}
	out["lib-modules"] = "present"
	if _, err := os.Stat("/lib/modules"); err != nil {
		out["lib-modules"] = "absent"
	}
	return out
}
