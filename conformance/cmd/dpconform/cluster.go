package main

import (
	"context"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"strings"

	"github.com/dpconform/dpconform/driver"
	"github.com/dpconform/dpconform/topologies"
	"github.com/dpconform/dpconform/topologies/cluster"
)

// clusterOptions are the flags of `dpconform run --topology cluster`.
type clusterOptions struct {
	kubeconfig, selector, externalAddress, externalNode, image, path string
	spares                                                           multiFlag
	measureClocks                                                    bool
}

func (o *clusterOptions) flags(fs *flag.FlagSet) {
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "cluster: the kubeconfig of the existing cluster to run on")
	fs.StringVar(&o.selector, "node-selector", "", "cluster: label selector of the nodes under test (the first 2 Ready ones by name are used; default: every node)")
	fs.StringVar(&o.externalAddress, "external-address", "", "cluster: make this machine the external client, at this IPv4 address as the nodes reach it (the path from outside the cluster, routed)")
	fs.StringVar(&o.externalNode, "external-node", "", "cluster: the node (not under test) of the external client's host-network pod (default: the first Ready node the selector leaves out)")
	fs.StringVar(&o.image, "probe-image", "", "cluster: the image of the suite's pods, holding the dpconform binary (default: the image a kind run loads, dpconform.local/probe:<digest of this binary>)")
	fs.StringVar(&o.path, "probe-path", "", "cluster: the dpconform binary's path in --probe-image (default: this binary's path)")
	fs.BoolVar(&o.measureClocks, "measure-clocks", false, "cluster: measure every host's clock against this machine's and place its times on it, even where the nodes share this machine's clock (kind); nodes of other clocks are always measured")
	fs.Var(&o.spares, "spare-address", "cluster: NODE=IP, a free address on the network of the node's interface, for NODE-ADDRESS-CHANGE (repeatable; a comma-separated list works too)")
}

func (o *clusterOptions) options(self string, logf func(string, ...any)) (cluster.Options, error) {
	opts := cluster.Options{Kubeconfig: o.kubeconfig, NodeSelector: o.selector, ExternalAddress: o.externalAddress, ExternalNode: o.externalNode,
		ProbeImage: o.image, ProbePath: o.path, ProbeBinary: self, Logf: logf, SpareAddresses: map[string]netip.Addr{}, MeasureClocks: o.measureClocks}
	for _, v := range o.spares {
		for _, kv := range strings.Split(v, ",") {
			if kv == "" {
				continue
			}
			name, ip, ok := strings.Cut(kv, "=")
			addr, err := netip.ParseAddr(ip)
			if !ok || err != nil {
				return opts, fmt.Errorf("--spare-address %q: want NODE=IPv4", kv)
			}
			opts.SpareAddresses[name] = addr
		}
	}
	return opts, nil
}

// clusterTopologies opens the cluster once for the run and gives each spec a view.
type clusterTopologies struct {
	opts    clusterOptions
	self    string
	logf    func(string, ...any)
	cluster *cluster.Cluster
}

func (c *clusterTopologies) prepare(ctx context.Context) error {
	if c.cluster != nil {
		return nil
	}
	opts, err := c.opts.options(c.self, c.logf)
	if err != nil {
		return err
	}
	cl, err := cluster.Open(ctx, opts)
	if err != nil {
		return err
	}
	c.cluster = cl
	return nil
}

func (c *clusterTopologies) New(ctx context.Context, _ driver.Info) (topologies.Topology, error) {
	if err := c.prepare(ctx); err != nil {
		return nil, err
	}
	return c.cluster.Session(ctx)
}

func (c *clusterTopologies) Close() {
	if c.cluster != nil {
		if err := c.cluster.Close(); err != nil {
			fmt.Fprintln(os.Stderr, "dpconform: remove the run's objects from the cluster:", err)
		}
	}
}
