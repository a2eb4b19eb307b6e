package netns

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/dpconform/dpconform/topologies/controlplane"
)

// ControlPlanes is a pool of control planes that topologies borrow one at a time
// (Options.ControlPlanes) instead of starting their own. Starting etcd,
// kube-apiserver and kube-controller-manager is ~3 s of a topology's ~3.3 s
// bring-up; a borrowed one is reset to the state it started in when its topology
// closes (controlplane.Reset: every object the run made is deleted, and one whose
// baseline a run changed is stopped, never lent again), so a run finds what a fresh
// control plane would hold.
//
// A pooled control plane is a run of its own for cleanup: its ID names its
// directory under the run root and its link in the root namespace, its processes
// carry DPC_RUN=<its ID>, and `dpconform cleanup` reaps it once its owner is gone.
// Its API server listens on an address of its own (the .1 of a fabric /24 it
// reserves, on a veth pair in the root namespace), which every borrowing topology's
// nodes reach through the root namespace, their gateway on the fabric.
type ControlPlanes struct {
	logf    func(string, ...any)
	runRoot string

	mu      sync.Mutex
	idle    []*pooledCP
	lent    map[*pooledCP]bool
	started []string
	closed  bool
}

// pooledCP is one control plane of a pool.
type pooledCP struct {
	id   string
	dir  string
	addr netip.Prefix // the API server's address, on the link id-h
	cp   *controlplane.ControlPlane
}

// NewControlPlanes returns an empty pool; control planes start as topologies ask for
// them. runRoot "" means DefaultRunRoot(); logf may be nil. Close stops them.
func NewControlPlanes(runRoot string, logf func(string, ...any)) *ControlPlanes {
	if runRoot == "" {
		runRoot = DefaultRunRoot()
	}
	if logf == nil {
		logf = func(string, ...any) {}
	}
	return &ControlPlanes{logf: logf, runRoot: runRoot, lent: map[*pooledCP]bool{}}
}

// get lends an idle control plane, or starts one.
func (p *ControlPlanes) get(ctx context.Context, bins controlplane.Binaries) (*pooledCP, error) {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil, errors.New("the pool of control planes is closed")
	}
	if n := len(p.idle); n > 0 {
		c := p.idle[n-1]
		p.idle = p.idle[:n-1]
		p.lent[c] = true
		p.mu.Unlock()
		return c, nil
	}
	p.mu.Unlock()
	c, err := p.start(ctx, bins)
	if err != nil {
		return nil, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil, errors.Join(errors.New("the pool of control planes is closed"), c.stop())
	}
	p.lent[c] = true
	return c, nil
}

// put takes a control plane back: reset, it waits for the next topology; one that
// cannot be reset, or returned to a closed pool, is stopped.
func (p *ControlPlanes) put(ctx context.Context, c *pooledCP) error {
	start := time.Now()
	err := c.cp.Reset(ctx)
	p.mu.Lock()
	delete(p.lent, c)
	if err == nil && !p.closed {
		p.idle = append(p.idle, c)
		p.mu.Unlock()
		p.logf("control plane %s: reset in %s", c.id, time.Since(start).Round(time.Millisecond))
		return nil
	}
	p.mu.Unlock()
	if err != nil {
		p.logf("control plane %s: not lent again: %v", c.id, err)
	}
	if serr := c.stop(); serr != nil {
		return fmt.Errorf("stop control plane %s: %w", c.id, serr)
	}
	return nil
}

// Close stops the idle control planes; those still lent stop when they come back.
func (p *ControlPlanes) Close() error {
	p.mu.Lock()
	p.closed = true
	idle := p.idle
	p.idle = nil
	p.mu.Unlock()
	var errs []error
	for _, c := range idle {
		errs = append(errs, c.stop())
	}
	return errors.Join(errs...)
}

// start makes a control plane for the pool: its directory, its address, its
// processes, and the baseline that its resets go back to.
func (p *ControlPlanes) start(ctx context.Context, bins controlplane.Binaries) (_ *pooledCP, err error) {
	c := &pooledCP{}
	if c.id, c.dir, err = newRun(p.runRoot); err != nil {
		return nil, err
	}
	p.mu.Lock()
	p.started = append(p.started, c.id)
	p.mu.Unlock()
	defer func() {
		if err != nil {
			err = errors.Join(err, c.stop())
		}
	}()
	if err := c.createLink(); err != nil {
		return nil, err
	}
	p.logf("control plane %s: starting etcd and kube-apiserver on %s", c.id, c.addr.Addr())
	c.cp, err = controlplane.Start(ctx, controlplane.Config{
		Binaries:    bins,
		Dir:         filepath.Join(c.dir, "control-plane"),
		BindIP:      c.addr.Addr(),
		ServiceCIDR: netip.MustParsePrefix(serviceCIDR),
		Env:         []string{EnvRun + "=" + c.id},
	})
	if err != nil {
		return nil, err
	}
	if err := c.cp.Baseline(ctx); err != nil {
		return nil, err
	}
	return c, nil
}

// createLink reserves a fabric /24 for the API server's address, as a run's fabric
// does, on a veth pair of the root namespace (id-h, holding the address, and its peer
// id-p): a link is what cleanup finds by the ID, and its route is what the choice of
// a free /24 sees.
func (c *pooledCP) createLink() error {
	unlock, err := lockRunRoot(filepath.Dir(c.dir))
	if err != nil {
		return err
	}
	defer unlock()
	prefix, err := freeFabric()
	if err != nil {
		return err
	}
	a := prefix.Addr().As4()
	a[3] = rootHost
	c.addr = netip.PrefixFrom(netip.AddrFrom4(a), prefix.Bits())
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: c.id + "-h"}, PeerName: c.id + "-p"}
	if err := netlink.LinkAdd(veth); err != nil {
		return explainLinkErr("veth", veth.Name, err)
	}
	root, err := netlink.NewHandle()
	if err != nil {
		return err
	}
	defer root.Close()
	if err := linkUpWithAddr(root, c.id+"-p", netip.Prefix{}); err != nil {
		return err
	}
	return linkUpWithAddr(root, c.id+"-h", c.addr)
}

// stop stops the control plane and removes what it made.
func (c *pooledCP) stop() error {
	var errs []error
	if c.cp != nil {
		errs = append(errs, c.cp.Stop())
	}
	errs = append(errs, removeRun(c.id, c.dir))
	return errors.Join(errs...)
}

// Started returns the IDs of every control plane the pool started, for a reader of
// logs and for `dpconform cleanup` by ID.
func (p *ControlPlanes) Started() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.started)
}
