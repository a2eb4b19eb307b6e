// Package vethpair builds the smallest topology the fv tests need to prove the
// instrument with real traffic: two network namespaces, a client and a server, joined
// by a veth pair, and a firewall in either one whose rule changes are timed at the
// moment the kernel commits them.
//
// Every name carries a random "dpcfv" prefix, and Close removes everything, so a
// failed test leaves nothing behind.
package vethpair

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/dpconform/dpconform/fv/probe"
)

// Prefix starts the name of every namespace and link this package creates.
const Prefix = "dpcfv"

// Side is one end of the pair.
type Side struct {
	// NS is the network namespace's name, bound at Path.
	NS, Path string
	// Link is the veth end inside the namespace, with address IP/24.
	Link, IP string
}

// Starter starts commands inside the side's namespace.
func (s Side) Starter() probe.NetNS { return probe.NetNS{Path: s.Path} }

// Pair is a client and a server namespace joined by a veth.
type Pair struct {
	Name           string
	Client, Server Side
}

// New creates a pair. On error, what was created is removed again.
func New(ctx context.Context) (_ *Pair, err error) {
	var b [3]byte
	if _, err := rand.Read(b[:]); err != nil {
		return nil, fmt.Errorf("random name: %w", err)
	}
	name := Prefix + hex.EncodeToString(b[:])
	p := &Pair{
		Name:   name,
		Client: Side{NS: name + "c", Link: name + "c", IP: "10.99.0.1"},
		Server: Side{NS: name + "s", Link: name + "s", IP: "10.99.0.2"},
	}
	p.Client.Path = filepath.Join("/var/run/netns", p.Client.NS)
	p.Server.Path = filepath.Join("/var/run/netns", p.Server.NS)
	defer func() {
		if err != nil {
			err = errors.Join(err, p.Close())
		}
	}()
	for _, s := range []Side{p.Client, p.Server} {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		if err := newNamed(s.NS); err != nil {
			return nil, fmt.Errorf("create netns %s: %w", s.NS, err)
		}
	}
	cns, err := netns.GetFromName(p.Client.NS)
	if err != nil {
		return nil, fmt.Errorf("open netns %s: %w", p.Client.NS, err)
	}
	defer cns.Close()
	sns, err := netns.GetFromName(p.Server.NS)
	if err != nil {
		return nil, fmt.Errorf("open netns %s: %w", p.Server.NS, err)
	}
	defer sns.Close()
	veth := &netlink.Veth{
		LinkAttrs:     netlink.LinkAttrs{Name: p.Client.Link, Namespace: netlink.NsFd(int(cns))},
		PeerName:      p.Server.Link,
		PeerNamespace: netlink.NsFd(int(sns)),
	}
	if err := netlink.LinkAdd(veth); err != nil {
		return nil, fmt.Errorf("add veth %s/%s: %w", p.Client.Link, p.Server.Link, err)
	}
	for _, x := range []struct {
		s Side
		h netns.NsHandle
	}{{p.Client, cns}, {p.Server, sns}} {
		if err := configure(x.h, x.s); err != nil {
			return nil, fmt.Errorf("configure %s: %w", x.s.NS, err)
		}
	}
	return p, nil
}

func configure(h netns.NsHandle, s Side) error {
	nl, err := netlink.NewHandleAt(h)
	if err != nil {
		return fmt.Errorf("netlink handle: %w", err)
	}
	defer nl.Close()
	lo, err := nl.LinkByName("lo")
	if err != nil {
		return fmt.Errorf("find lo: %w", err)
	}
	if err := nl.LinkSetUp(lo); err != nil {
		return fmt.Errorf("lo up: %w", err)
	}
	l, err := nl.LinkByName(s.Link)
	if err != nil {
		return fmt.Errorf("find %s: %w", s.Link, err)
	}
	addr := &netlink.Addr{IPNet: &net.IPNet{IP: net.ParseIP(s.IP), Mask: net.CIDRMask(24, 32)}}
	if err := nl.AddrAdd(l, addr); err != nil {
		return fmt.Errorf("address %s on %s: %w", s.IP, s.Link, err)
	}
	if err := nl.LinkSetUp(l); err != nil {
		return fmt.Errorf("%s up: %w", s.Link, err)
	}
	return nil
}

// SetUp sets the side's veth end up or down; down removes its routes, so sends fail
// at once with "network is unreachable" as in a pod that is not wired yet.
func (p *Pair) SetUp(s Side, up bool) error {
	h, err := netns.GetFromPath(s.Path)
	if err != nil {
		return fmt.Errorf("open netns %s: %w", s.NS, err)
	}
	defer h.Close()
	nl, err := netlink.NewHandleAt(h)
	if err != nil {
		return fmt.Errorf("netlink handle in %s: %w", s.NS, err)
	}
	defer nl.Close()
	l, err := nl.LinkByName(s.Link)
	if err != nil {
		return fmt.Errorf("find %s in %s: %w", s.Link, s.NS, err)
	}
	if up {
		err = nl.LinkSetUp(l)
	} else {
		err = nl.LinkSetDown(l)
	}
	if err != nil {
		return fmt.Errorf("set %s in %s up=%v: %w", s.Link, s.NS, up, err)
	}
	return nil
}

// newNamed creates a named network namespace from a thread of its own, so that the
// caller's thread never changes namespace. If the thread cannot return to its
// namespace it stays locked and the runtime discards it.
func newNamed(name string) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			runtime.UnlockOSThread()
			errc <- err
			return
		}
		defer orig.Close()
		h, err := netns.NewNamed(name)
		if err == nil {
			h.Close()
		}
		if serr := netns.Set(orig); serr != nil {
			errc <- errors.Join(err, fmt.Errorf("return to the original netns: %w", serr))
			return
		}
		runtime.UnlockOSThread()
		errc <- err
	}()
	return <-errc
}

// Close removes both namespaces (the veth goes with them) and any link of the pair
// left in the caller's namespace. It may be called more than once.
func (p *Pair) Close() error {
	var errs []error
	for _, l := range []string{p.Client.Link, p.Server.Link} {
		if link, err := netlink.LinkByName(l); err == nil {
			if err := netlink.LinkDel(link); err != nil {
				errs = append(errs, fmt.Errorf("delete link %s: %w", l, err))
			}
		}
	}
	for _, s := range []Side{p.Client, p.Server} {
		if _, err := os.Stat(s.Path); errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err := netns.DeleteNamed(s.NS); err != nil {
			errs = append(errs, fmt.Errorf("delete netns %s: %w", s.NS, err))
		}
	}
	return errors.Join(errs...)
}
