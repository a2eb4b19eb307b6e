package cluster

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/dpconform/dpconform/driver/proc"
)

// NodeOp is `dpconform node-op`: what the topology does to a node's network, run in
// the node's helper pod (host network, host PID namespace, privileged), since the
// project's image holds the dpconform binary alone and no ip(8):
//
//	clock                  print CLOCK_MONOTONIC in nanoseconds
//	iface ADDR             print the name of the interface holding ADDR and its prefix length
//	mac IFACE              print IFACE's hardware address
//	addr-add IFACE PREFIX  add an address (ADDR/BITS) to IFACE
//	addr-del IFACE PREFIX  remove it
//	neigh-set IFACE ADDR MAC  make ADDR's neighbour entry permanent at MAC
//	neigh-del IFACE ADDR   remove ADDR's neighbour entry
//	vanish CONTAINER-ID    delete eth0 in the network namespace of that container's
//	                       processes (a lost sandbox: the veth pair goes, both ends)
func NodeOp(args []string, out io.Writer) error {
	if len(args) == 0 {
		return errors.New("node-op: want clock, iface, mac, addr-add, addr-del, neigh-set, neigh-del or vanish")
	}
	need := func(n int) error {
		if len(args) != n+1 {
			return fmt.Errorf("node-op %s: want %d arguments, got %d", args[0], n, len(args)-1)
		}
		return nil
	}
	switch args[0] {
	case "clock":
		if err := need(0); err != nil {
			return err
		}
		_, err := fmt.Fprintln(out, monoNow())
		return err
	case "iface":
		if err := need(1); err != nil {
			return err
		}
		ip, err := netip.ParseAddr(args[1])
		if err != nil {
			return err
		}
		addrs, err := netlink.AddrList(nil, netlink.FAMILY_V4)
		if err != nil {
			return err
		}
		for _, a := range addrs {
			if a.IP.Equal(ip.AsSlice()) {
				l, err := netlink.LinkByIndex(a.LinkIndex)
				if err != nil {
					return err
				}
				bits, _ := a.Mask.Size()
				_, err = fmt.Fprintf(out, "%s %d\n", l.Attrs().Name, bits)
				return err
			}
		}
		return fmt.Errorf("no interface of this node holds %s", ip)
	case "mac":
		if err := need(1); err != nil {
			return err
		}
		l, err := netlink.LinkByName(args[1])
		if err != nil {
			return fmt.Errorf("%s: %w", args[1], err)
		}
		_, err = fmt.Fprintln(out, l.Attrs().HardwareAddr)
		return err
	case "addr-add", "addr-del":
		if err := need(2); err != nil {
			return err
		}
		l, err := netlink.LinkByName(args[1])
		if err != nil {
			return fmt.Errorf("%s: %w", args[1], err)
		}
		a, err := netlink.ParseAddr(args[2])
		if err != nil {
			return err
		}
		if args[0] == "addr-add" {
			return netlink.AddrAdd(l, a)
		}
		return netlink.AddrDel(l, a)
	case "neigh-set", "neigh-del":
		n := 2
		if args[0] == "neigh-set" {
			n = 3
		}
		if err := need(n); err != nil {
			return err
		}
		l, err := netlink.LinkByName(args[1])
		if err != nil {
			return fmt.Errorf("%s: %w", args[1], err)
		}
		ip := net.ParseIP(args[2])
		if ip == nil {
			return fmt.Errorf("%q is not an IP address", args[2])
		}
		neigh := &netlink.Neigh{LinkIndex: l.Attrs().Index, Family: netlink.FAMILY_V4, IP: ip}
		if args[0] == "neigh-del" {
			return netlink.NeighDel(neigh)
		}
		if neigh.HardwareAddr, err = net.ParseMAC(args[3]); err != nil {
			return err
		}
		neigh.State = netlink.NUD_PERMANENT
		return netlink.NeighSet(neigh)
	case "vanish":
		if err := need(1); err != nil {
			return err
		}
		pid, err := containerProcess(args[1])
		if err != nil {
			return err
		}
		h, err := netns.GetFromPid(pid)
		if err != nil {
			return fmt.Errorf("network namespace of process %d: %w", pid, err)
		}
		defer h.Close()
		nh, err := netlink.NewHandleAt(h)
		if err != nil {
			return err
		}
		defer nh.Close()
		l, err := nh.LinkByName("eth0")
		if err != nil {
			return fmt.Errorf("eth0 of container %s: %w", args[1], err)
		}
		return nh.LinkDel(l)
	}
	return fmt.Errorf("node-op %q: want clock, iface, mac, addr-add, addr-del, neigh-set, neigh-del or vanish", args[0])
}

// monoNow is CLOCK_MONOTONIC in nanoseconds, the clock the probes timestamp by
// (fv/monotime, which topologies may not import).
func monoNow() int64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		panic(fmt.Sprintf("clock_gettime(CLOCK_MONOTONIC): %v", err))
	}
	return ts.Nano()
}

// containerProcess finds a process of the container with the given ID in the host's
// PID namespace, which the helper pod shares.
func containerProcess(id string) (int, error) {
	pid, err := proc.OfContainer(id, nil)
	if err != nil {
		return 0, fmt.Errorf("%w (is the helper pod in the host's PID namespace?)", err)
	}
	return pid, nil
}
