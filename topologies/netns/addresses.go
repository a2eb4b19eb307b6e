package netns

import (
	"context"
	"fmt"
	"net/netip"

	"github.com/vishvananda/netlink"

	"github.com/dpconform/dpconform/topologies"
)

// SpareAddress implements topologies.Node: firstSpareHost plus the node's index on
// the fabric.
func (n *node) SpareAddress() netip.Addr {
	return n.t.fabricAddr(byte(firstSpareHost + n.index)).Addr()
}

// AddAddress implements topologies.Node: addr goes on eth0 with the fabric's prefix
// length, so that the kernel takes it as a secondary address of the fabric's subnet
// (no route changes, and the node's IP stays its primary, first in every listing).
func (n *node) AddAddress(_ context.Context, addr netip.Addr) error {
	t := n.t
	if err := t.claim(addr, n.name); err != nil {
		return err
	}
	if err := n.changeAddress(addr, true); err != nil {
		t.release(addr)
		return err
	}
	t.logf("run %s: added %s to %s's eth0", t.runID, addr, n.name)
	return nil
}

// RemoveAddress implements topologies.Node.
func (n *node) RemoveAddress(_ context.Context, addr netip.Addr) error {
	t := n.t
	t.mu.Lock()
	holder, ok := t.added[addr]
	t.mu.Unlock()
	if !ok || holder != n.name {
		return fmt.Errorf("remove %s from %s: AddAddress did not add it there", addr, n.name)
	}
	if err := n.changeAddress(addr, false); err != nil {
		return err
	}
	t.release(addr)
	t.logf("run %s: removed %s from %s's eth0", t.runID, addr, n.name)
	return nil
}

func (n *node) changeAddress(addr netip.Addr, add bool) error {
	h, err := n.handle()
	if err != nil {
		return err
	}
	defer h.Close()
	eth0, err := h.LinkByName(n.Interface())
	if err != nil {
		return fmt.Errorf("find %s on %s: %w", n.Interface(), n.name, err)
	}
	a := &netlink.Addr{IPNet: ipNet(netip.PrefixFrom(addr, n.t.fabric.Bits()))}
	if add {
		if err := h.AddrAdd(eth0, a); err != nil {
			return fmt.Errorf("add %s to %s's %s: %w", addr, n.name, n.Interface(), err)
		}
		return nil
	}
	if err := h.AddrDel(eth0, a); err != nil {
		return fmt.Errorf("remove %s from %s's %s: %w", addr, n.name, n.Interface(), err)
	}
	return nil
}

// claim records addr as added to node, if it is a free address of the fabric.
func (t *Topology) claim(addr netip.Addr, node string) error {
	if !addr.Is4() || !t.fabric.Contains(addr) || addr == t.fabric.Addr() || addr.As4()[3] == 255 {
		return fmt.Errorf("add %s to %s: not a host address of the fabric %s", addr, node, t.fabric)
	}
	if addr == t.fabricRootAddr() || addr == t.external.ip {
		return fmt.Errorf("add %s to %s: the address is taken (the API server's or the external client's)", addr, node)
	}
	for _, n := range t.nodes {
		if addr == n.ip {
			return fmt.Errorf("add %s to %s: it is %s's IP", addr, node, n.name)
		}
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if holder, ok := t.added[addr]; ok {
		return fmt.Errorf("add %s to %s: already added to %s", addr, node, holder)
	}
	t.added[addr] = node
	return nil
}

func (t *Topology) release(addr netip.Addr) {
	t.mu.Lock()
	delete(t.added, addr)
	t.mu.Unlock()
}

// fabricHost returns the host on the fabric that h is (the external client or a
// node of this topology), or nil.
func (t *Topology) fabricHost(h topologies.Host) *host {
	switch v := h.(type) {
	case *host:
		if v == t.external {
			return v
		}
	case *node:
		for _, n := range t.nodes {
			if n == v {
				return &n.host
			}
		}
	}
	return nil
}

// PinNeighbour implements topologies.Topology: a permanent entry (NUD_PERMANENT) in
// from's neighbour table, which neither ageing nor failed ARP probes remove.
func (t *Topology) PinNeighbour(_ context.Context, from topologies.Host, addr netip.Addr, to topologies.Node) error {
	src := t.fabricHost(from)
	if src == nil {
		return fmt.Errorf("pin the neighbour %s on %s: it is not a host on the fabric (the external client or a node)", addr, from.Name())
	}
	dst, ok := to.(*node)
	if !ok || t.fabricHost(dst) == nil {
		return fmt.Errorf("pin the neighbour %s on %s: %s is not a node of this topology", addr, from.Name(), to.Name())
	}
	dh, err := dst.handle()
	if err != nil {
		return err
	}
	defer dh.Close()
	dl, err := dh.LinkByName(dst.Interface())
	if err != nil {
		return fmt.Errorf("find %s on %s: %w", dst.Interface(), dst.name, err)
	}
	sh, err := src.handle()
	if err != nil {
		return err
	}
	defer sh.Close()
	sl, err := sh.LinkByName("eth0")
	if err != nil {
		return fmt.Errorf("find eth0 on %s: %w", src.name, err)
	}
	neigh := &netlink.Neigh{
		LinkIndex:    sl.Attrs().Index,
		Family:       netlink.FAMILY_V4,
		State:        netlink.NUD_PERMANENT,
		IP:           addr.AsSlice(),
		HardwareAddr: dl.Attrs().HardwareAddr,
	}
	if err := sh.NeighSet(neigh); err != nil {
		return fmt.Errorf("pin the neighbour %s at %s (%s's %s) on %s: %w", addr, dl.Attrs().HardwareAddr, dst.name, dst.Interface(), src.name, err)
	}
	return nil
}
