package workloads

import (
	"context"
	"fmt"
	"slices"

	"github.com/dpconform/dpconform/fv/harness"
	"github.com/dpconform/dpconform/topologies"
)

// Core is the world of the Core specs: node-a (the node under transition) with a
// backend and a client pod, a backend on node-b, and a NodePort Service selecting
// each backend alone.
type Core struct {
	NodeA, NodeB  topologies.Node
	Client        topologies.Pod // on node-a
	Local, Remote topologies.Pod // backends on node-a and node-b
	SvcLocal      Service        // selects only Local
	SvcRemote     Service        // selects only Remote
}

// DeployCore builds the Core fixture on the first two nodes and returns once every
// one of its service flows (ServiceFlows) carries traffic.
func DeployCore(ctx context.Context, w *harness.World, warm Warm) (*Core, error) {
	nodes := w.Topo.Nodes()
	if len(nodes) < 2 {
		return nil, fmt.Errorf("the Core fixture needs 2 nodes, the topology has %d", len(nodes))
	}
	f := &Core{NodeA: nodes[0], NodeB: nodes[1]}
	var err error
	if f.Local, _, err = AddBackend(ctx, w, "web-local", f.NodeA.Name(), map[string]string{"app": "web-local"}); err != nil {
		return nil, err
	}
	if f.Remote, _, err = AddBackend(ctx, w, "web-remote", f.NodeB.Name(), map[string]string{"app": "web-remote"}); err != nil {
		return nil, err
	}
	if f.Client, err = w.Topo.AddPod(ctx, topologies.PodSpec{Name: "client", Node: f.NodeA.Name()}); err != nil {
		return nil, fmt.Errorf("add pod client: %w", err)
	}
	if f.SvcLocal, err = AddService(ctx, w, "web-local", map[string]string{"app": "web-local"}, f.Local); err != nil {
		return nil, err
	}
	if f.SvcRemote, err = AddService(ctx, w, "web-remote", map[string]string{"app": "web-remote"}, f.Remote); err != nil {
		return nil, err
	}
	if err := WaitAllFlowing(ctx, w, warm, f.ServiceFlows(w.Topo)...); err != nil {
		return nil, err
	}
	return f, nil
}

// The names of the fixture's flows (Flows): specs take flows by name, not by their
// place in a list.
const (
	FlowClusterIPLocal  = "clusterip-local"    // the client pod to the ClusterIP of the Service whose backend is on node-a
	FlowClusterIPRemote = "clusterip-remote"   // the client pod to the ClusterIP of the Service whose backend is on node-b
	FlowNodePortLocal   = "nodeport-local"     // the external client to node-a's NodePort, backend on node-a
	FlowNodePortRemote  = "nodeport-remote"    // the external client to node-a's NodePort, backend on node-b
	FlowPodSameNode     = "pod-pod-same-node"  // the client pod to the backend on its node, through no Service
	FlowPodCrossNode    = "pod-pod-cross-node" // the client pod to the backend across nodes, through no Service
)

// ServiceFlows are the fixture's four service paths: the client pod to each
// ClusterIP, and the external client to node-a's NodePort of each Service.
func (f *Core) ServiceFlows(topo topologies.Topology) []Flow {
	return []Flow{
		{FlowClusterIPLocal, f.Client, f.SvcLocal.ClusterIPAddr(), f.Local.Name()},
		{FlowClusterIPRemote, f.Client, f.SvcRemote.ClusterIPAddr(), f.Remote.Name()},
		{FlowNodePortLocal, topo.External(), f.SvcLocal.NodePortAddr(f.NodeA), f.Local.Name()},
		{FlowNodePortRemote, topo.External(), f.SvcRemote.NodePortAddr(f.NodeA), f.Remote.Name()},
	}
}

// DirectFlows are pod-to-pod paths from the client, through no Service: to the
// backend on its node and to the one across nodes.
func (f *Core) DirectFlows() []Flow {
	return []Flow{
		{FlowPodSameNode, f.Client, Direct(f.Local), f.Local.Name()},
		{FlowPodCrossNode, f.Client, Direct(f.Remote), f.Remote.Name()},
	}
}

// Flows returns the fixture's flows of those names, in that order. A name the
// fixture has no flow of is a spec's bug: Flows panics.
func (f *Core) Flows(topo topologies.Topology, names ...string) []Flow {
	all := append(f.ServiceFlows(topo), f.DirectFlows()...)
	out := make([]Flow, 0, len(names))
	for _, n := range names {
		i := slices.IndexFunc(all, func(fl Flow) bool { return fl.Name == n })
		if i < 0 {
			panic("workloads: the Core fixture has no flow " + n)
		}
		out = append(out, all[i])
	}
	return out
}
