package main

import (
	"strings"
	"testing"

	"github.com/dpconform/dpconform/driver/skel"
)

// TestClusterDaemonSet: on a cluster the DaemonSet mounts nothing of the suite's
// machine, reaches the API server by its endpoint, selects the run's nodes, and lets
// kill reach the agent.
func TestClusterDaemonSet(t *testing.T) {
	c := clusterEnv{Node: skel.Node{Name: "n1", Run: "dpx12345", StateDir: "/tmp/dpconform-cluster/dpx12345/n1", Kubeconfig: "/home/v/kubeconfig"}, namespace: "dpconform-dpx12345"}
	ds := c.daemonSet("example.com/refdp:1", "10.0.0.1", "6443", []string{"skip-restore"})
	spec := ds.Spec.Template.Spec
	if ds.Namespace != "dpconform-dpx12345" {
		t.Errorf("namespace %s", ds.Namespace)
	}
	if spec.NodeSelector[clusterNodeLabel] != "dpx12345" || len(spec.NodeSelector) != 1 {
		t.Errorf("node selector %v", spec.NodeSelector)
	}
	if spec.ShareProcessNamespace == nil || !*spec.ShareProcessNamespace || spec.ServiceAccountName != kindName {
		t.Errorf("shareProcessNamespace %v, service account %q", spec.ShareProcessNamespace, spec.ServiceAccountName)
	}
	for _, v := range spec.Volumes {
		if v.HostPath != nil && (strings.HasPrefix(v.HostPath.Path, "/tmp") || strings.HasPrefix(v.HostPath.Path, "/home")) {
			t.Errorf("volume %s mounts %s of the suite's machine", v.Name, v.HostPath.Path)
		}
	}
	ctr := spec.Containers[0]
	cmd := strings.Join(ctr.Command, " ")
	if !strings.Contains(cmd, "--in-cluster") || strings.Contains(cmd, "--kubeconfig") || !strings.Contains(cmd, "--fault skip-restore") {
		t.Errorf("command %s", cmd)
	}
	env := map[string]string{}
	for _, e := range ctr.Env {
		env[e.Name] = e.Value
	}
	if env["KUBERNETES_SERVICE_HOST"] != "10.0.0.1" || env["KUBERNETES_SERVICE_PORT"] != "6443" {
		t.Errorf("API server %s:%s", env["KUBERNETES_SERVICE_HOST"], env["KUBERNETES_SERVICE_PORT"])
	}
	if ctr.ReadinessProbe == nil || ctr.ReadinessProbe.Exec == nil {
		t.Errorf("no readiness probe")
	}
}
