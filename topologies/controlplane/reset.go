package controlplane

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/pager"
)

// A control plane can serve one run after another: Baseline records what it holds
// once it has started, and Reset brings it back to that, so that a run finds what a
// fresh control plane would hold. Starting etcd, kube-apiserver and
// kube-controller-manager is ~3 s of every run's bring-up; a reset is a tenth of it.
//
// Reset deletes every object the baseline does not hold, whoever made it (the suite,
// the implementation, its CRDs and their objects), and refuses, with ErrDirty, when an
// object of the baseline itself was changed or cannot be brought back: a control plane
// it refuses must be stopped, never reused.

// ErrDirty means a reset could not bring the control plane back to its baseline.
var ErrDirty = errors.New("the control plane cannot be brought back to its state at start")

// baselineObject is an object of the baseline: its resourceVersion says whether a run
// changed it.
type baselineObject struct {
	resource        schema.GroupVersionResource
	namespace, name string
	resourceVersion string
}

// changing are the resources whose baseline objects change on their own on an idle
// control plane (lease renewals, events), so a change of theirs does not make it
// dirty. New objects of theirs are deleted like any other.
var changing = []schema.GroupResource{
	{Group: "coordination.k8s.io", Resource: "leases"},
	{Group: "", Resource: "events"},
	{Group: "events.k8s.io", Resource: "events"},
}

// Baseline records every object the control plane holds now, for Reset, once it
// holds everything it writes of its own accord: every post-start hook has run (Start
// does not wait for the last one, the built-in PriorityClasses, which a reset could
// not delete), the system namespaces are there, and so are the `kubernetes` Service
// and its endpoints, which the API server's controllers write after it is ready.
func (cp *ControlPlane) Baseline(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, cp.cfg.ReadyTimeout)
	defer cancel()
	var last error
	for {
		if last = cp.settled(ctx); last == nil {
			break
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("record the control plane's baseline: it did not settle (last: %v): %w", last, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
	objs, err := cp.listAll(ctx)
	if err != nil {
		return fmt.Errorf("record the control plane's baseline: %w", err)
	}
	cp.baseline = map[types.UID]baselineObject{}
	for _, o := range objs {
		cp.baseline[o.UID] = baselineObject{resource: o.resource, namespace: o.Namespace, name: o.Name, resourceVersion: o.ResourceVersion}
	}
	return nil
}

// settled returns nil once the control plane holds what it writes of its own accord.
func (cp *ControlPlane) settled(ctx context.Context) error {
	body, err := cp.kube.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
	if err != nil || string(body) != "ok" {
		return fmt.Errorf("kube-apiserver not fully ready: %v", err)
	}
	for _, ns := range []string{"default", "kube-system", "kube-public", "kube-node-lease"} {
		if _, err := cp.kube.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{}); err != nil {
			return err
		}
	}
	if _, err := cp.kube.CoreV1().Services("default").Get(ctx, "kubernetes", metav1.GetOptions{}); err != nil {
		return err
	}
	if _, err := cp.kube.CoreV1().Endpoints("default").Get(ctx, "kubernetes", metav1.GetOptions{}); err != nil {
		return err
	}
	if _, err := cp.kube.DiscoveryV1().EndpointSlices("default").Get(ctx, "kubernetes", metav1.GetOptions{}); err != nil {
		return err
	}
	return nil
}

// listed is an object as a metadata list returns it, with its resource.
type listed struct {
	metav1.PartialObjectMetadata
	resource   schema.GroupVersionResource
	namespaced bool
}

// listAll lists every object of every resource that can be listed and deleted.
func (cp *ControlPlane) listAll(ctx context.Context) ([]listed, error) {
	// Listing every resource lists deprecated ones too (v1 Endpoints): their
	// warnings would go to the run's log once per reset, for nothing a person can do.
	cfg := rest.CopyConfig(cp.restConfig)
	cfg.WarningHandler = rest.NoWarnings{}
	disc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return nil, err
	}
	meta, err := metadata.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	// A group whose discovery fails (an aggregated API whose server is gone) is
	// skipped by ServerPreferredResources with a partial error; nothing here serves
	// one, and a run that registered one loses it with its objects.
	lists, err := disc.ServerPreferredResources()
	if err != nil && !discovery.IsGroupDiscoveryFailedError(err) {
		return nil, fmt.Errorf("discover resources: %w", err)
	}
	var out []listed
	for _, l := range lists {
		gv, err := schema.ParseGroupVersion(l.GroupVersion)
		if err != nil {
			return nil, err
		}
		for _, r := range l.APIResources {
			if strings.Contains(r.Name, "/") || !slices.Contains(r.Verbs, "list") || !slices.Contains(r.Verbs, "delete") {
				continue
			}
			gvr := gv.WithResource(r.Name)
			// In pages: a list with a limit is served from etcd while the API
			// server's cache of the resource is not ready, where one without is
			// refused (429, Retry-After: 1 s, which the client waits out; KEP 4568).
			// The cache of a resource that a run's CRD added is not ready until its
			// first list, and an implementation registers dozens (Cilium v1.20: 22):
			// listed whole, they were 10 s of every reset.
			p := pager.New(func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
				return meta.Resource(gvr).List(ctx, opts)
			})
			err := p.EachListItem(ctx, metav1.ListOptions{}, func(obj runtime.Object) error {
				it, ok := obj.(*metav1.PartialObjectMetadata)
				if !ok {
					return fmt.Errorf("a %T in the list of %s", obj, gvr)
				}
				out = append(out, listed{PartialObjectMetadata: *it, resource: gvr, namespaced: r.Namespaced})
				return nil
			})
			if apierrors.IsNotFound(err) || apierrors.IsMethodNotSupported(err) {
				continue // a CRD deleted since discovery
			}
			if err != nil {
				return nil, fmt.Errorf("list %s: %w", gvr, err)
			}
		}
	}
	return out, nil
}

// Reset deletes every object that is not in the baseline and waits until they are
// gone. It fails with ErrDirty if an object of the baseline was changed or deleted,
// or what a run made does not go within the deadline.
func (cp *ControlPlane) Reset(ctx context.Context) error {
	if cp.baseline == nil {
		return fmt.Errorf("%w: no baseline was recorded", ErrDirty)
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	meta, err := metadata.NewForConfig(cp.restConfig)
	if err != nil {
		return err
	}
	for attempt := 0; ; attempt++ {
		objs, err := cp.listAll(ctx)
		if err != nil {
			return fmt.Errorf("%w: %w", ErrDirty, err)
		}
		extra, err := cp.compare(objs)
		if err != nil {
			return err
		}
		if len(extra) == 0 {
			return nil
		}
		if ctx.Err() != nil {
			return fmt.Errorf("%w: %d objects a run made are still there after %s, e.g. %s", ErrDirty, len(extra), 30*time.Second, describe(extra[0]))
		}
		// Namespaced objects go first, then cluster-scoped ones, namespaces last:
		// a namespace whose objects are gone can be finalized at once.
		slices.SortStableFunc(extra, func(a, b listed) int { return deleteRank(a) - deleteRank(b) })
		for _, o := range extra {
			if err := cp.remove(ctx, meta, o, attempt > 0); err != nil {
				return fmt.Errorf("%w: delete %s: %w", ErrDirty, describe(o), err)
			}
		}
		if attempt > 0 {
			select {
			case <-ctx.Done():
			case <-time.After(50 * time.Millisecond):
			}
		}
	}
}

// compare returns the objects that are not in the baseline, and ErrDirty if a
// baseline object (of a resource that does not change on its own) was changed or is
// gone.
func (cp *ControlPlane) compare(objs []listed) ([]listed, error) {
	seen := make(map[types.UID]bool, len(cp.baseline))
	var extra []listed
	var changed []string
	for _, o := range objs {
		b, ok := cp.baseline[o.UID]
		if !ok {
			extra = append(extra, o)
			continue
		}
		seen[o.UID] = true
		if o.ResourceVersion != b.resourceVersion && !slices.Contains(changing, o.resource.GroupResource()) {
			changed = append(changed, describe(o)+" changed")
		}
	}
	for uid, b := range cp.baseline {
		if !seen[uid] && !slices.Contains(changing, b.resource.GroupResource()) {
			changed = append(changed, fmt.Sprintf("%s %s deleted", b.resource.Resource, path(b.namespace, b.name)))
		}
	}
	if len(changed) > 0 {
		slices.Sort(changed)
		return nil, fmt.Errorf("%w: %s", ErrDirty, strings.Join(changed, "; "))
	}
	return extra, nil
}

func deleteRank(o listed) int {
	switch {
	case o.resource.GroupResource() == schema.GroupResource{Resource: "namespaces"}:
		return 3
	case o.resource.GroupResource() == schema.GroupResource{Group: "apiextensions.k8s.io", Resource: "customresourcedefinitions"}:
		return 2
	case !o.namespaced:
		return 1
	}
	return 0
}

// remove deletes one object at once (no grace period: no kubelet waits on a pod
// here). An object that a finalizer holds is let go on a later pass (force), as its
// controller would, but for a CRD, whose finalizer the API server itself runs to
// delete its objects, and a namespace, which is finalized once it is empty.
func (cp *ControlPlane) remove(ctx context.Context, meta metadata.Interface, o listed, force bool) error {
	ri := meta.Resource(o.resource).Namespace(o.Namespace)
	gr := o.resource.GroupResource()
	switch {
	case o.DeletionTimestamp == nil:
		err := ri.Delete(ctx, o.Name, metav1.DeleteOptions{GracePeriodSeconds: new(int64), Preconditions: &metav1.Preconditions{UID: &o.UID}})
		if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			return err
		}
	case gr == schema.GroupResource{Resource: "namespaces"}:
		// The namespace controller does not run here: finalize it (its objects
		// went in the passes before).
		ns, err := cp.kube.CoreV1().Namespaces().Get(ctx, o.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		if err != nil {
			return err
		}
		ns.Spec.Finalizers = nil
		if _, err := cp.kube.CoreV1().Namespaces().Finalize(ctx, ns, metav1.UpdateOptions{}); err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			return err
		}
	case force && len(o.Finalizers) > 0 && gr != schema.GroupResource{Group: "apiextensions.k8s.io", Resource: "customresourcedefinitions"}:
		patch := []byte(fmt.Sprintf(`{"metadata":{"finalizers":null,"resourceVersion":%q}}`, o.ResourceVersion))
		_, err := ri.Patch(ctx, o.Name, types.MergePatchType, patch, metav1.PatchOptions{})
		if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			return err
		}
	}
	return nil
}

func describe(o listed) string {
	return fmt.Sprintf("%s %s", o.resource.GroupResource(), path(o.Namespace, o.Name))
}

func path(namespace, name string) string {
	if namespace == "" {
		return name
	}
	return namespace + "/" + name
}
