// Package crds registers an implementation's CustomResourceDefinitions from a
// directory of manifests, as its operator or its Helm chart does before its agents
// start, for a driver whose agent waits for CRDs that nothing else in a run makes
// (Cilium's, Calico's). Each run starts from a control plane without them.
package crds

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"sigs.k8s.io/yaml"
)

// resource is the resource of CustomResourceDefinitions.
var resource = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}

// Ensure creates the CRDs of dir's *.yaml files (one CRD a file) that the API server
// does not have, and returns once it serves every one of them (its Established
// condition is True), or an error naming those it does not serve when ctx ends.
// Every node's start may call it, at once or one after another: the first to find a
// CRD missing creates it, and the others wait for it. A request the API server
// refuses for now (transient) or that does not reach it is tried again until ctx
// ends; any other refusal ends Ensure at once, naming the request.
//
// Where every CRD exists and is served it costs one list. The client should not be
// throttled by client-go's default rate limit (5 requests a second after a burst of
// 10: rest.Config's QPS and Burst), under which asking for each CRD in turn took
// Cilium's driver 6.8 s a node.
func Ensure(ctx context.Context, client dynamic.Interface, dir string) error {
	want, err := read(dir)
	if err != nil {
		return err
	}
	crds := client.Resource(resource)
	var list *unstructured.UnstructuredList
	if err := poll(ctx, func(ctx context.Context) (done bool, err error) {
		list, err = crds.List(ctx, metav1.ListOptions{})
		return err == nil, err
	}); err != nil {
		return fmt.Errorf("list the API server's CRDs: %w", err)
	}
	have := make(map[string]*unstructured.Unstructured, len(list.Items))
	for i := range list.Items {
		have[list.Items[i].GetName()] = &list.Items[i]
	}
	var pending []string
	for _, crd := range want {
		got, ok := have[crd.GetName()]
		if !ok {
			if err := poll(ctx, func(ctx context.Context) (done bool, err error) {
				got, err = crds.Create(ctx, crd, metav1.CreateOptions{})
				if apierrors.IsAlreadyExists(err) {
					// Another node's start made it since the list.
					got, err = nil, nil
				}
				return err == nil, err
			}); err != nil {
				return fmt.Errorf("create CRD %s: %w", crd.GetName(), err)
			}
		}
		if got == nil || !established(got) {
			pending = append(pending, crd.GetName())
		}
	}
	err = poll(ctx, func(ctx context.Context) (bool, error) {
		var still []string
		for _, name := range pending {
			got, err := crds.Get(ctx, name, metav1.GetOptions{})
			switch {
			case err == nil && established(got):
			case err == nil || apierrors.IsNotFound(err):
				still = append(still, name)
			default:
				return false, fmt.Errorf("CRD %s: %w", name, err)
			}
		}
		pending = still
		return len(pending) == 0, nil
	})
	if err != nil && ctx.Err() != nil {
		return fmt.Errorf("CRDs not established (the API server does not serve them): %s: %w", strings.Join(pending, ", "), err)
	}
	return err
}

// pollInterval is the time between two tries of a request the API server did not
// answer, or refused for now.
const pollInterval = 50 * time.Millisecond

// poll runs cond at once, then every pollInterval, until it is done or returns an
// error that waiting will not change: the API server's answer, unless it is
// transient. Any other error (a transient answer; the transport's; the client's
// rate limiter's, which fails a request whose wait for a token would pass ctx's
// deadline before the deadline comes) is waited out until ctx ends, and the error
// then names the last of them.
func poll(ctx context.Context, cond wait.ConditionWithContextFunc) error {
	var last error
	err := wait.PollUntilContextCancel(ctx, pollInterval, true, func(ctx context.Context) (bool, error) {
		done, err := cond(ctx)
		if err != nil && (!isAPIStatus(err) || transient(err)) {
			last = err
			return false, nil
		}
		return done, err
	})
	if err != nil && ctx.Err() != nil && last != nil {
		err = fmt.Errorf("%w (last error: %v)", err, last)
	}
	return err
}

// isAPIStatus reports whether err is the API server's answer (a Status), not the
// client's or the transport's failure to get one.
func isAPIStatus(err error) bool {
	var status apierrors.APIStatus
	return errors.As(err, &status)
}

// transient reports whether err is the API server's answer that it cannot serve
// the request now, but may soon: too many requests (its priority and fairness, or
// max-inflight, shed it), its own timeout, or unavailable (a server starting, or
// behind an aggregator that is). client-go retries some of these itself, a few
// times, only where the server says when (Retry-After).
func transient(err error) bool {
	return apierrors.IsTooManyRequests(err) || apierrors.IsServerTimeout(err) ||
		apierrors.IsServiceUnavailable(err) || apierrors.IsTimeout(err)
}

// read returns the CRDs of dir's *.yaml files, in the files' order: one
// CustomResourceDefinition a file.
func read(dir string) ([]*unstructured.Unstructured, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil {
		return nil, err
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("no CRDs (*.yaml) in %s", dir)
	}
	var out []*unstructured.Unstructured
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		js, err := yaml.YAMLToJSON(data)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", f, err)
		}
		obj := &unstructured.Unstructured{}
		if err := obj.UnmarshalJSON(js); err != nil {
			return nil, fmt.Errorf("%s: %w", f, err)
		}
		if obj.GetKind() != "CustomResourceDefinition" {
			return nil, fmt.Errorf("%s: a %q, not a CustomResourceDefinition", f, obj.GetKind())
		}
		out = append(out, obj)
	}
	return out, nil
}

// established reports whether the API server serves a CRD's resources: its
// Established condition is True.
func established(crd *unstructured.Unstructured) bool {
	conds, _, _ := unstructured.NestedSlice(crd.Object, "status", "conditions")
	return slices.ContainsFunc(conds, func(c any) bool {
		m, ok := c.(map[string]any)
		return ok && m["type"] == "Established" && m["status"] == "True"
	})
}
