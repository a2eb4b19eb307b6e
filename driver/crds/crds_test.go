package crds_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/dpconform/dpconform/driver/crds"
	"github.com/dpconform/dpconform/internal/privileged"
	"github.com/dpconform/dpconform/topologies/netns"
)

var crdResource = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}

// crdYAML is a cluster-scoped CRD of the group example.dpconform.io.
func crdYAML(plural, kind string) string {
	return fmt.Sprintf(`apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: %[1]s.example.dpconform.io
spec:
  group: example.dpconform.io
  scope: Cluster
  names: {plural: %[1]s, singular: %[3]s, kind: %[2]s}
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}
`, plural, kind, strings.ToLower(kind))
}

// manifests writes files (name: content) into a new directory.
func manifests(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func TestEnsureRefusesBadManifests(t *testing.T) {
	empty := t.TempDir()
	service := manifests(t, map[string]string{"svc.yaml": "apiVersion: v1\nkind: Service\nmetadata: {name: x}\n"})
	broken := manifests(t, map[string]string{"broken.yaml": "kind: [\n"})
	for _, tt := range []struct {
		name, dir, want string
	}{
		{"no manifests", empty, "no CRDs (*.yaml) in " + empty},
		{"not a CRD", service, filepath.Join(service, "svc.yaml") + `: a "Service", not a CustomResourceDefinition`},
		{"not YAML", broken, filepath.Join(broken, "broken.yaml") + ": "},
	} {
		t.Run(tt.name, func(t *testing.T) {
			// The manifests are read before the API server is asked anything.
			err := crds.Ensure(context.Background(), nil, tt.dir)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Ensure(%s) = %v, want an error with %q", tt.dir, err, tt.want)
			}
		})
	}
}

func TestEnsure(t *testing.T) {
	privileged.Require(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	topo, err := netns.New(ctx, netns.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := topo.Close(); err != nil {
			t.Error(err)
		}
	}()
	client, err := dynamic.NewForConfig(topo.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	uids := func(names ...string) []string {
		t.Helper()
		var out []string
		for _, n := range names {
			crd, err := client.Resource(crdResource).Get(ctx, n+".example.dpconform.io", metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, string(crd.GetUID()))
		}
		return out
	}
	// Two nodes' starts, at once: one creates each CRD, the other finds it.
	concurrently := func(dir string) {
		t.Helper()
		var wg sync.WaitGroup
		errs := make([]error, 2)
		for i := range errs {
			wg.Go(func() { errs[i] = crds.Ensure(ctx, client, dir) })
		}
		wg.Wait()
		for _, err := range errs {
			if err != nil {
				t.Fatal(err)
			}
		}
	}

	dir := manifests(t, map[string]string{"widgets.yaml": crdYAML("widgets", "Widget"), "gadgets.yaml": crdYAML("gadgets", "Gadget")})
	concurrently(dir)
	// Established: the API server serves their objects.
	for _, plural := range []string{"widgets", "gadgets"} {
		r := schema.GroupVersionResource{Group: "example.dpconform.io", Version: "v1", Resource: plural}
		if _, err := client.Resource(r).List(ctx, metav1.ListOptions{}); err != nil {
			t.Errorf("list %s after Ensure: %v", plural, err)
		}
	}
	first := uids("widgets", "gadgets")
	concurrently(dir)
	if again := uids("widgets", "gadgets"); strings.Join(again, " ") != strings.Join(first, " ") {
		t.Errorf("CRDs made again: UIDs %v, then %v", first, again)
	}

	// A CRD the API server never serves: its kind is another CRD's of its group, so
	// its names are not accepted.
	clash := manifests(t, map[string]string{"sprockets.yaml": crdYAML("sprockets", "Widget")})
	short, cancelShort := context.WithTimeout(ctx, 3*time.Second)
	defer cancelShort()
	err = crds.Ensure(short, client, clash)
	want := "CRDs not established (the API server does not serve them): sprockets.example.dpconform.io"
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("Ensure of a CRD never served = %v, want an error with %q", err, want)
	}

	// The same through a throttled client, whose rate limiter fails a Get before
	// the deadline comes (its wait for a token would pass it): the wait, not the
	// Get, fails, and the error says so.
	throttledConfig := topo.RESTConfig()
	throttledConfig.QPS, throttledConfig.Burst = 1, 1
	throttled, err := dynamic.NewForConfig(throttledConfig)
	if err != nil {
		t.Fatal(err)
	}
	short, cancelShort = context.WithTimeout(ctx, 3*time.Second)
	defer cancelShort()
	err = crds.Ensure(short, throttled, clash)
	if err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "rate limiter") {
		t.Errorf("Ensure of a CRD never served, throttled = %v, want an error with %q naming the rate limiter", err, want)
	}
}

// An API server that sheds a request (too many requests, its own timeout,
// unavailable) will answer it soon: Ensure waits on, whether it was the list, the
// create or a get. A refusal that waiting does not change (forbidden) ends it at
// once, naming the request.
func TestEnsureWaitsOutTransientRefusals(t *testing.T) {
	dir := manifests(t, map[string]string{"widgets.yaml": crdYAML("widgets", "Widget")})
	name := "widgets.example.dpconform.io"
	gr := crdResource.GroupResource()
	shed := []error{
		apierrors.NewTooManyRequests("the server is busy", 1),
		apierrors.NewServerTimeout(gr, "get", 1),
		apierrors.NewServiceUnavailable("starting"),
		apierrors.NewTimeoutError("request did not complete", 1),
	}
	forbidden := []error{apierrors.NewForbidden(gr, name, errors.New("no RBAC"))}
	for _, tt := range []struct {
		verb    string
		refuse  []error // the answers to the verb's first requests, in turn; then the fake's own
		wantErr string
	}{
		{"list", shed, ""},
		{"create", shed, ""},
		{"get", shed, ""},
		{"list", forbidden, "list the API server's CRDs: "},
		{"create", forbidden, "create CRD " + name + ": "},
		{"get", forbidden, "CRD " + name + ": "},
	} {
		what := "shed, then served"
		if tt.wantErr != "" {
			what = "forbidden"
		}
		t.Run(tt.verb+" "+what, func(t *testing.T) {
			client := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
				map[schema.GroupVersionResource]string{crdResource: "CustomResourceDefinitionList"})
			calls := 0
			refusal := func() error {
				if calls++; calls <= len(tt.refuse) {
					return tt.refuse[calls-1]
				}
				return nil
			}
			if tt.verb != "get" {
				client.PrependReactor(tt.verb, "customresourcedefinitions", func(k8stesting.Action) (bool, runtime.Object, error) {
					err := refusal()
					return err != nil, nil, err // the fake's tracker answers the rest
				})
			}
			// The fake's tracker has no controller to establish a CRD: a get answers
			// it established.
			client.PrependReactor("get", "customresourcedefinitions", func(k8stesting.Action) (bool, runtime.Object, error) {
				if tt.verb == "get" {
					if err := refusal(); err != nil {
						return true, nil, err
					}
				}
				crd := &unstructured.Unstructured{Object: map[string]any{
					"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
					"metadata": map[string]any{"name": name},
					"status":   map[string]any{"conditions": []any{map[string]any{"type": "Established", "status": "True"}}},
				}}
				return true, crd, nil
			})
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			err := crds.Ensure(ctx, client, dir)
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("Ensure: %v", err)
				}
				if calls != len(tt.refuse)+1 {
					t.Errorf("Ensure made %d %ss, want %d: one a refusal, then the one served", calls, tt.verb, len(tt.refuse)+1)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("Ensure: %v, want an error containing %q", err, tt.wantErr)
			}
			if calls != 1 {
				t.Errorf("Ensure made %d %ss after a refusal that waiting does not change, want 1", calls, tt.verb)
			}
		})
	}
}
