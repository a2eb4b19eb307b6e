package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/dpconform/dpconform/driver/crds"
)

// What a Calico installation puts in the Kubernetes API before Felix can run with it
// as its datastore (KDD). Calico's manifests install the CRDs; calico-node's start-up
// (node/pkg/lifecycle/startup, libcalico-go's EnsureInitialized) creates the rest, and
// this driver does what it does:
//
//   - ClusterInformation "default" with datastoreReady: Felix waits for it;
//   - the tiers "default", "adminnetworkpolicy" and "baselineadminnetworkpolicy",
//     with the orders and default actions EnsureInitialized gives them;
//   - FelixConfiguration "default" with reportingInterval 0 and logSeverityScreen
//     Info, as ensureDefaultConfig writes it;
//   - the default IPv4 pool, as configureIPPools makes it from CALICO_IPV4POOL_CIDR
//     (here the smallest prefix that holds every Node's podCIDR) with the
//     manifests' settings (no IPIP, no VXLAN, NAT outgoing, block size 26);
//   - on the node's own Node object, the annotation projectcalico.org/IPv4Address
//     (the node's address and prefix), as configureIPsAndSubnets does: Calico's Node
//     resource, in KDD, is the Kubernetes Node with its annotations.

var (
	calicoGroup = "crd.projectcalico.org"
	calicoGV    = calicoGroup + "/v1"
)

func calicoGVR(resource string) schema.GroupVersionResource {
	return schema.GroupVersionResource{Group: calicoGroup, Version: "v1", Resource: resource}
}

// ipv4AddressAnnotation is where KDD keeps a Calico Node's BGP IPv4 address (the
// node's address, with its prefix length).
const ipv4AddressAnnotation = "projectcalico.org/IPv4Address"

// datastore sets up the Kubernetes API as Calico's datastore.
type datastore struct {
	kube    kubernetes.Interface
	dyn     dynamic.Interface
	crdDir  string
	version string
}

func newDatastore(kubeconfig, crdDir, version string) (*datastore, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("kubeconfig %s: %w", kubeconfig, err)
	}
	cfg.Timeout = 10 * time.Second
	// Unthrottled (client-go's default is 5 requests a second): a start makes dozens.
	cfg.QPS, cfg.Burst = 100, 200
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	return &datastore{kube: kube, dyn: dyn, crdDir: crdDir, version: version}, nil
}

// ensure makes the cluster's Calico resources and node's annotation exist, creating
// what is missing and leaving what exists: every node's start calls it, and the
// first one of a run does the work.
func (d *datastore) ensure(ctx context.Context, node string, nodeAddr netip.Prefix) error {
	if err := d.ensureCRDs(ctx); err != nil {
		return err
	}
	nodes, err := d.kube.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("list Nodes: %w", err)
	}
	pool, err := poolCIDR(nodes.Items)
	if err != nil {
		return err
	}
	for _, obj := range clusterResources(d.version, pool) {
		if err := d.create(ctx, obj); err != nil {
			return err
		}
	}
	return d.annotateNode(ctx, node, nodeAddr)
}

// ensureCRDs creates Calico's CRDs that do not exist and waits until the API server
// serves every one of them.
func (d *datastore) ensureCRDs(ctx context.Context) error {
	return crds.Ensure(ctx, d.dyn, d.crdDir)
}

// clusterResources are the cluster-wide resources calico-node's start-up creates, as
// crd.projectcalico.org/v1 objects (KDD stores Calico's v3 resources so, spec as is).
func clusterResources(version string, pool netip.Prefix) []*unstructured.Unstructured {
	obj := func(kind, name string, spec map[string]any) *unstructured.Unstructured {
		return &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": calicoGV, "kind": kind,
			"metadata": map[string]any{"name": name},
			"spec":     spec,
		}}
	}
	return []*unstructured.Unstructured{
		obj("ClusterInformation", "default", map[string]any{
			"calicoVersion": version, "clusterType": "k8s,bpf,kdd", "datastoreReady": true,
			"clusterGUID": guid(),
		}),
		obj("Tier", "default", map[string]any{"order": float64(1_000_000), "defaultAction": "Deny"}),
		obj("Tier", "adminnetworkpolicy", map[string]any{"order": float64(1_000), "defaultAction": "Pass"}),
		obj("Tier", "baselineadminnetworkpolicy", map[string]any{"order": float64(10_000_000), "defaultAction": "Pass"}),
		obj("FelixConfiguration", "default", map[string]any{"reportingInterval": "0s", "logSeverityScreen": "Info"}),
		obj("IPPool", "default-ipv4-ippool", map[string]any{
			"cidr": pool.String(), "ipipMode": "Never", "vxlanMode": "Never", "natOutgoing": true,
			"blockSize": int64(26), "nodeSelector": "all()", "allowedUses": []any{"Workload", "Tunnel"},
			"assignmentMode": "Automatic",
		}),
	}
}

// guid is a random cluster GUID, as calico-node makes one: 32 hex digits.
func guid() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b) // never fails (crypto/rand)
	return hex.EncodeToString(b)
}

// resourceOf is the plural resource name of the kinds clusterResources makes.
var resourceOf = map[string]string{
	"ClusterInformation": "clusterinformations",
	"Tier":               "tiers",
	"FelixConfiguration": "felixconfigurations",
	"IPPool":             "ippools",
}

// create creates obj unless it exists.
func (d *datastore) create(ctx context.Context, obj *unstructured.Unstructured) error {
	res := d.dyn.Resource(calicoGVR(resourceOf[obj.GetKind()]))
	if _, err := res.Get(ctx, obj.GetName(), metav1.GetOptions{}); err == nil {
		return nil
	}
	if _, err := res.Create(ctx, obj, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create %s %s: %w", obj.GetKind(), obj.GetName(), err)
	}
	return nil
}

// annotateNode sets the node's Calico IPv4 address, unless it is set already.
func (d *datastore) annotateNode(ctx context.Context, node string, addr netip.Prefix) error {
	n, err := d.kube.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("get Node %s: %w", node, err)
	}
	if n.Annotations[ipv4AddressAnnotation] == addr.String() {
		return nil
	}
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{ipv4AddressAnnotation: addr.String()}}})
	if _, err := d.kube.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("annotate Node %s: %w", node, err)
	}
	return nil
}

// poolCIDR is the smallest IPv4 prefix that holds every Node's podCIDR: the cluster's
// pod network, which a cluster's installer gives calico-node as CALICO_IPV4POOL_CIDR.
func poolCIDR(nodes []corev1.Node) (netip.Prefix, error) {
	var cidrs []netip.Prefix
	for _, n := range nodes {
		if n.Spec.PodCIDR == "" {
			return netip.Prefix{}, fmt.Errorf("no podCIDR on Node %s", n.Name)
		}
		p, err := netip.ParsePrefix(n.Spec.PodCIDR)
		if err != nil || !p.Addr().Is4() {
			return netip.Prefix{}, fmt.Errorf("podCIDR %q of Node %s is not an IPv4 prefix", n.Spec.PodCIDR, n.Name)
		}
		cidrs = append(cidrs, p.Masked())
	}
	if len(cidrs) == 0 {
		return netip.Prefix{}, errors.New("no Nodes")
	}
	bits := slices.MinFunc(cidrs, func(a, b netip.Prefix) int { return a.Bits() - b.Bits() }).Bits()
	for ; bits > 0; bits-- {
		p := netip.PrefixFrom(cidrs[0].Addr(), bits).Masked()
		if !slices.ContainsFunc(cidrs, func(c netip.Prefix) bool { return !p.Contains(c.Addr()) }) {
			return p, nil
		}
	}
	return netip.PrefixFrom(netip.IPv4Unspecified(), 0), nil
}
