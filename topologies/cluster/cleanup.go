package cluster

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/dpconform/dpconform/driver/proc"
	"github.com/dpconform/dpconform/topologies/kubeobj"
)

// ownerOf names a process for OwnerAnnotation: host, PID and start time, so that a
// reused PID is not taken for the run's process.
func ownerOf(pid int) (string, error) {
	host, err := os.Hostname()
	if err != nil {
		return "", err
	}
	start, err := proc.StartTime(pid)
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("%s/%d/%d", host, pid, start), nil
}

// ownerAlive reports whether the owner a run's namespace names still runs: only a
// process of this host can be checked; one of another host counts as alive.
func ownerAlive(owner string) bool {
	f := strings.Split(owner, "/")
	host, _ := os.Hostname()
	if len(f) != 3 || f[0] != host {
		return len(f) == 3
	}
	pid, err := strconv.Atoi(f[1])
	if err != nil || !proc.Alive(pid) {
		return false
	}
	start, err := proc.StartTime(pid)
	return err == nil && strconv.FormatUint(start, 10) == f[2]
}

// removeRun deletes everything labelled with runID: its namespaces (the run's and
// those specs made, with every object in them), the objects specs made in other
// namespaces, the cluster-scoped objects a driver labelled with the run
// (ClusterRoles, ClusterRoleBindings) and the node labels whose value is the run ID;
// and waits until the namespaces are gone.
func removeRun(ctx context.Context, kube kubernetes.Interface, runID string, logf func(string, ...any)) error {
	sel := metav1.ListOptions{LabelSelector: RunLabel + "=" + runID}
	var errs []error
	if err := removeSpecObjects(ctx, kube, runID, NamespacePrefix+runID); err != nil {
		errs = append(errs, err)
	}
	crbs, err := kube.RbacV1().ClusterRoleBindings().List(ctx, sel)
	if err != nil {
		errs = append(errs, err)
	} else {
		for _, o := range crbs.Items {
			if err := kube.RbacV1().ClusterRoleBindings().Delete(ctx, o.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
				errs = append(errs, err)
			}
		}
	}
	crs, err := kube.RbacV1().ClusterRoles().List(ctx, sel)
	if err != nil {
		errs = append(errs, err)
	} else {
		for _, o := range crs.Items {
			if err := kube.RbacV1().ClusterRoles().Delete(ctx, o.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
				errs = append(errs, err)
			}
		}
	}
	errs = append(errs, removeNodeLabels(ctx, kube, runID, logf))
	nss, err := kube.CoreV1().Namespaces().List(ctx, sel)
	if err != nil {
		return errors.Join(append(errs, err)...)
	}
	var names []string
	for _, ns := range nss.Items {
		if err := kube.CoreV1().Namespaces().Delete(ctx, ns.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, err)
		}
		names = append(names, ns.Name)
	}
	if logf != nil && len(names) > 0 {
		logf("cluster run %s: removing namespaces %v", runID, names)
	}
	errs = append(errs, kubeobj.WaitNamespacesGone(ctx, kube, names))
	return errors.Join(errs...)
}

// removeNodeLabels removes from every node the labels whose value is the run's ID: a
// driver selects the nodes its DaemonSet runs on with such a label (docs/driver.md),
// and a killed run leaves it.
func removeNodeLabels(ctx context.Context, kube kubernetes.Interface, runID string, logf func(string, ...any)) error {
	nodes, err := kube.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	var errs []error
	for _, n := range nodes.Items {
		var keys []string
		for k, v := range n.Labels {
			if v == runID {
				keys = append(keys, strconv.Quote(k)+":null")
			}
		}
		if len(keys) == 0 {
			continue
		}
		if logf != nil {
			logf("cluster run %s: removing its labels from node %s", runID, n.Name)
		}
		patch := `{"metadata":{"labels":{` + strings.Join(keys, ",") + `}}}`
		if _, err := kube.CoreV1().Nodes().Patch(ctx, n.Name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// CleanupOptions say which runs Cleanup removes.
type CleanupOptions struct {
	// Kubeconfig is the cluster's (required).
	Kubeconfig string
	// Runs are the run IDs to remove whatever their state; empty: every run whose
	// process, on this host, is gone (a run of another host is named to be removed).
	Runs []string
	// Logf reports what is removed; nil discards it.
	Logf func(format string, args ...any)
}

// Cleanup removes what killed runs left on a cluster, found by RunLabel.
func Cleanup(ctx context.Context, opts CleanupOptions) error {
	for _, id := range opts.Runs {
		if !runIDPattern.MatchString(id) {
			return fmt.Errorf("%q is not a cluster run ID (want %s and five hex digits, e.g. %s1a2b3)", id, RunPrefix, RunPrefix)
		}
	}
	rc, err := restConfig(opts.Kubeconfig)
	if err != nil {
		return err
	}
	kube, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return err
	}
	runs := opts.Runs
	if len(runs) == 0 {
		nss, err := kube.CoreV1().Namespaces().List(ctx, metav1.ListOptions{LabelSelector: RunLabel})
		if err != nil {
			return fmt.Errorf("list the runs' namespaces: %w", err)
		}
		seen := map[string]bool{}
		for _, ns := range nss.Items {
			id := ns.Labels[RunLabel]
			if ns.Name != NamespacePrefix+id || !runIDPattern.MatchString(id) || seen[id] {
				continue
			}
			if owner := ns.Annotations[OwnerAnnotation]; ownerAlive(owner) {
				if opts.Logf != nil {
					opts.Logf("cluster run %s: spared (its process %s may still run; name it with --run to remove it)", id, owner)
				}
				continue
			}
			seen[id] = true
			runs = append(runs, id)
		}
	}
	var errs []error
	for _, id := range runs {
		if opts.Logf != nil {
			opts.Logf("cluster run %s: removing what it left", id)
		}
		errs = append(errs, removeRun(ctx, kube, id, opts.Logf))
	}
	return errors.Join(errs...)
}
