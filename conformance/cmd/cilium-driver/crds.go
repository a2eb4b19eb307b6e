package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/yaml"
)

var crdResource = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}

// registerCRDs creates Cilium's CustomResourceDefinitions from the YAML files in dir
// (the module's pkg/k8s/apis/cilium.io/client/crds, which `make cilium` copies) unless
// they exist, and waits until the API server serves each. In a Cilium installation
// the operator registers them; the agent only waits for them. With IPAM from the
// Node's podCIDR and identities in CRDs, nothing else of the operator is needed for a
// run (it would garbage-collect identities, which a run does not live long enough to
// need).
func registerCRDs(ctx context.Context, kubeconfig, dir string) error {
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil {
		return err
	}
	if len(files) == 0 {
		return fmt.Errorf("no CRDs in %s (run `make cilium`)", dir)
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return fmt.Errorf("kubeconfig %s: %w", kubeconfig, err)
	}
	client, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return err
	}
	crds := client.Resource(crdResource)
	var names []string
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			return err
		}
		js, err := yaml.YAMLToJSON(data)
		if err != nil {
			return fmt.Errorf("%s: %w", f, err)
		}
		obj := &unstructured.Unstructured{}
		if err := obj.UnmarshalJSON(js); err != nil {
			return fmt.Errorf("%s: %w", f, err)
		}
		if obj.GetKind() != "CustomResourceDefinition" {
			return fmt.Errorf("%s: a %s, not a CustomResourceDefinition", f, obj.GetKind())
		}
		names = append(names, obj.GetName())
		if _, err := crds.Create(ctx, obj, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("create CRD %s: %w", obj.GetName(), err)
		}
	}
	// Established: the API server serves the resource.
	for _, name := range names {
		for {
			obj, err := crds.Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return fmt.Errorf("CRD %s: %w", name, err)
			}
			if established(obj) {
				break
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("CRD %s not established: %w", name, ctx.Err())
			case <-time.After(50 * time.Millisecond):
			}
		}
	}
	return nil
}

// established reports whether a CRD's Established condition is True.
func established(crd *unstructured.Unstructured) bool {
	conds, _, _ := unstructured.NestedSlice(crd.Object, "status", "conditions")
	return slices.ContainsFunc(conds, func(c any) bool {
		m, ok := c.(map[string]any)
		return ok && m["type"] == "Established" && m["status"] == "True"
	})
}
