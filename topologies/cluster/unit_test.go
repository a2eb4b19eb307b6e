package cluster

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/dpconform/dpconform/topologies"
)

type recorder struct {
	req  *http.Request
	body string
}

func (r *recorder) RoundTrip(req *http.Request) (*http.Response, error) {
	r.req = req
	if req.Body != nil {
		b, _ := io.ReadAll(req.Body)
		r.body = string(b)
	}
	return &http.Response{StatusCode: 200, Body: io.NopCloser(strings.NewReader("{}")), Request: req}, nil
}

func TestRunTransport(t *testing.T) {
	for _, tc := range []struct {
		name, method, path, body string
		wantPath, wantBody       string
	}{
		{name: "create in default moves and is labelled", method: "POST", path: "/api/v1/namespaces/default/services",
			body:     `{"metadata":{"name":"s","namespace":"default"}}`,
			wantPath: "/api/v1/namespaces/dpconform-dpx00001/services",
			wantBody: `{"metadata":{"labels":{"dpconform.io/run":"dpx00001"},"name":"s","namespace":"dpconform-dpx00001"}}`},
		{name: "create keeps labels", method: "POST", path: "/api/v1/namespaces/order/pods",
			body:     `{"metadata":{"name":"p","namespace":"order","labels":{"app":"a"}}}`,
			wantPath: "/api/v1/namespaces/order/pods",
			wantBody: `{"metadata":{"labels":{"app":"a","dpconform.io/run":"dpx00001"},"name":"p","namespace":"order"}}`},
		{name: "get in default moves", method: "GET", path: "/apis/discovery.k8s.io/v1/namespaces/default/endpointslices",
			wantPath: "/apis/discovery.k8s.io/v1/namespaces/dpconform-dpx00001/endpointslices"},
		{name: "the namespace itself stays", method: "GET", path: "/api/v1/namespaces/default",
			wantPath: "/api/v1/namespaces/default"},
		{name: "a namespace named like default stays", method: "GET", path: "/api/v1/namespaces/default-x/pods",
			wantPath: "/api/v1/namespaces/default-x/pods"},
		{name: "update moves but is not labelled", method: "PUT", path: "/api/v1/namespaces/default/services/s",
			body:     `{"metadata":{"name":"s","namespace":"default"}}`,
			wantPath: "/api/v1/namespaces/dpconform-dpx00001/services/s",
			wantBody: `{"metadata":{"name":"s","namespace":"dpconform-dpx00001"}}`},
		{name: "a body that is no object passes", method: "POST", path: "/api/v1/namespaces/default/pods/p/eviction",
			body: `[1,2]`, wantPath: "/api/v1/namespaces/dpconform-dpx00001/pods/p/eviction", wantBody: `[1,2]`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := &recorder{}
			rt := &runTransport{next: rec, namespace: "dpconform-dpx00001", label: "dpx00001"}
			req, err := http.NewRequest(tc.method, "https://api.example:6443"+tc.path, nil)
			if err != nil {
				t.Fatal(err)
			}
			if tc.body != "" {
				req.Body = io.NopCloser(strings.NewReader(tc.body))
				req.Header.Set("Content-Type", "application/json")
			}
			if _, err := rt.RoundTrip(req); err != nil {
				t.Fatal(err)
			}
			if rec.req.URL.Path != tc.wantPath {
				t.Errorf("path %s, want %s", rec.req.URL.Path, tc.wantPath)
			}
			if rec.body != tc.wantBody {
				t.Errorf("body %s, want %s", rec.body, tc.wantBody)
			}
		})
	}
}

func nodeObj(name string, ready, unschedulable bool, labels map[string]string, ip string) *corev1.Node {
	st := corev1.ConditionFalse
	if ready {
		st = corev1.ConditionTrue
	}
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}, Spec: corev1.NodeSpec{Unschedulable: unschedulable},
		Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: st}}}}
	if ip != "" {
		n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: ip}}
	}
	return n
}

func TestDiscover(t *testing.T) {
	worker := map[string]string{"role": "worker"}
	nodes := []*corev1.Node{
		nodeObj("a", true, false, worker, "10.0.0.1"),
		nodeObj("b", false, false, worker, "10.0.0.2"), // not Ready
		nodeObj("c", true, true, worker, "10.0.0.3"),   // cordoned
		nodeObj("d", true, false, worker, "10.0.0.4"),
		nodeObj("e", true, false, nil, "10.0.0.5"),
		nodeObj("f", true, false, worker, ""), // no InternalIP
		nodeObj("g", true, false, worker, "10.0.0.7"),
	}
	for _, tc := range []struct {
		name              string
		opts              Options
		wantUnder, wantEx string
		wantErr           string
	}{
		{name: "every node: the first two usable, the next is external", opts: Options{Nodes: 2}, wantUnder: "a, d", wantEx: "e"},
		{name: "selector leaves e for the external client", opts: Options{Nodes: 2, NodeSelector: "role=worker"}, wantUnder: "a, d", wantEx: "e"},
		{name: "three nodes under test", opts: Options{Nodes: 3, NodeSelector: "role=worker"}, wantUnder: "a, d, g", wantEx: "e"},
		{name: "external node named", opts: Options{Nodes: 2, ExternalNode: "g"}, wantUnder: "a, d", wantEx: "g"},
		{name: "external node taken from the selection", opts: Options{Nodes: 2, NodeSelector: "role=worker", ExternalNode: "a"}, wantUnder: "d, g", wantEx: "a"},
		{name: "too few", opts: Options{Nodes: 4, NodeSelector: "role=worker"}, wantErr: "matches 3 Ready"},
		{name: "bad selector", opts: Options{Nodes: 2, NodeSelector: "=="}, wantErr: "node selector"},
		{name: "external node unusable", opts: Options{Nodes: 2, ExternalNode: "b"}, wantErr: "--external-node b"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			kube := fake.NewClientset()
			for _, n := range nodes {
				if _, err := kube.CoreV1().Nodes().Create(context.Background(), n, metav1.CreateOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			under, ext, err := discover(context.Background(), kube, tc.opts)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := nodeNames(under); got != tc.wantUnder {
				t.Errorf("under test %s, want %s", got, tc.wantUnder)
			}
			got := ""
			if ext != nil {
				got = ext.Name
			}
			if got != tc.wantEx {
				t.Errorf("external node %q, want %q", got, tc.wantEx)
			}
		})
	}
}

// TestRemoveRun: a run's namespaces and cluster-scoped objects go; another run's and
// the cluster's own stay.
func TestRemoveRun(t *testing.T) {
	ctx := context.Background()
	l := func(id string) map[string]string { return map[string]string{RunLabel: id} }
	kube := fake.NewClientset(
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "dpconform-dpx00001", Labels: l("dpx00001")}},
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "order", Labels: l("dpx00001")}},
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "dpconform-dpx00002", Labels: l("dpx00002")}},
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "kube-system"}},
		&corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "s", Namespace: "elsewhere", Labels: l("dpx00001")}},
		&corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "theirs", Namespace: "elsewhere"}},
		&rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "refdp-dpx00001", Labels: l("dpx00001")}},
		&rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "refdp-dpx00001", Labels: l("dpx00001")}},
		&rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "admin"}},
		&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", Labels: map[string]string{"dpconform.io/refdp-run": "dpx00001", "zone": "a", "other": "dpx00002"}}},
	)
	if err := removeRun(ctx, kube, "dpx00001", t.Logf); err != nil {
		t.Fatal(err)
	}
	nss, _ := kube.CoreV1().Namespaces().List(ctx, metav1.ListOptions{})
	var left []string
	for _, ns := range nss.Items {
		left = append(left, ns.Name)
	}
	if strings.Join(left, ",") != "dpconform-dpx00002,kube-system" {
		t.Errorf("namespaces left: %v, want dpconform-dpx00002 and kube-system", left)
	}
	svcs, _ := kube.CoreV1().Services("elsewhere").List(ctx, metav1.ListOptions{})
	if len(svcs.Items) != 1 || svcs.Items[0].Name != "theirs" {
		t.Errorf("services left: %v, want only theirs", svcs.Items)
	}
	n1, _ := kube.CoreV1().Nodes().Get(ctx, "n1", metav1.GetOptions{})
	if len(n1.Labels) != 2 || n1.Labels["zone"] != "a" || n1.Labels["other"] != "dpx00002" {
		t.Errorf("node labels left %v, want zone=a and other=dpx00002", n1.Labels)
	}
	crs, _ := kube.RbacV1().ClusterRoles().List(ctx, metav1.ListOptions{})
	crbs, _ := kube.RbacV1().ClusterRoleBindings().List(ctx, metav1.ListOptions{})
	if len(crs.Items) != 1 || crs.Items[0].Name != "admin" || len(crbs.Items) != 0 {
		t.Errorf("cluster roles left %v, bindings %v; want admin alone", crs.Items, crbs.Items)
	}
}

func TestOwnerAlive(t *testing.T) {
	me, err := ownerOf(1)
	if err != nil {
		t.Skipf("no start time of PID 1: %v", err)
	}
	for _, tc := range []struct {
		owner string
		want  bool
	}{
		{me, true},
		{strings.Replace(me, "/1/", "/999999999/", 1), false}, // no such process
		{me + "0", false},        // PID 1, another start
		{"other-host/1/1", true}, // not checkable here: spared
		{"garbage", false},
	} {
		if got := ownerAlive(tc.owner); got != tc.want {
			t.Errorf("ownerAlive(%q) = %v, want %v", tc.owner, got, tc.want)
		}
	}
}

// TestPodsRequestCPU: the run's pods, where its probes run, are not BestEffort (the
// least CPU weight a node gives: their streams waited out the node's busy moments),
// and have no CPU limit to throttle them.
func TestPodsRequestCPU(t *testing.T) {
	c := &Cluster{image: "img", probePath: "/dpconform"}
	p := c.podObject(topologies.PodSpec{Name: "web", Node: "n1"}, "ns")
	res := p.Spec.Containers[0].Resources
	if got := res.Requests[corev1.ResourceCPU]; got.Cmp(ProbeCPU) != 0 || got.IsZero() {
		t.Errorf("the pod requests CPU %v, want %v", got.String(), ProbeCPU.String())
	}
	if len(res.Limits) != 0 {
		t.Errorf("the pod has limits %v, want none", res.Limits)
	}
	if got := p.Spec.Containers[0].Command; len(got) != 2 || got[0] != "/dpconform" || got[1] != "pause" {
		t.Errorf("the pod runs %v, want the probe binary's pause", got)
	}
}
