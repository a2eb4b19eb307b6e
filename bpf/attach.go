package bpf

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// The clsact filters of the datapath: this priority and handle on each
// direction, named with this prefix.
const (
	ClsactPriority     = 0xdc0
	ClsactHandle       = 0xdc
	ClsactFilterPrefix = "dpc_"
)

// tcHook is a tc attach point of an interface. Not to be confused with a policy
// Direction: tc ingress of a workload's interface is the workload's egress.
type tcHook int

const (
	tcIngress tcHook = iota
	tcEgress
)

var tcHooks = []tcHook{tcIngress, tcEgress}

func (dir tcHook) String() string {
	if dir == tcIngress {
		return "ingress"
	}
	return "egress"
}

func (dir tcHook) tcxAttach() ebpf.AttachType {
	if dir == tcIngress {
		return ebpf.AttachTCXIngress
	}
	return ebpf.AttachTCXEgress
}

func (dir tcHook) clsactParent() uint32 {
	if dir == tcIngress {
		return netlink.HANDLE_MIN_INGRESS
	}
	return netlink.HANDLE_MIN_EGRESS
}

// LinkPinPath is where the tcx link of the interface with this index and
// direction ("ingress" or "egress") is pinned.
func LinkPinPath(pinDir string, ifindex int, dir string) string {
	return filepath.Join(pinDir, LinksDirName, fmt.Sprintf("if%d_%s", ifindex, dir))
}

func ifindexByName(name string) (int, error) {
	l, err := netlink.LinkByName(name)
	if err != nil {
		return 0, fmt.Errorf("interface %s: %w", name, err)
	}
	return l.Attrs().Index, nil
}

// AttachHost attaches the host interface programs to the interface with
// this index, on ingress and egress. If they are attached already (by this
// or an earlier run), their programs are replaced in place, atomically.
func (d *Datapath) AttachHost(ifindex int) error {
	return d.attachBoth(ifindex, d.objs.TcHostIngress, "dpc_host_ingress", d.objs.TcHostEgress, "dpc_host_egress")
}

// attachBoth attaches an interface's two programs, in hookOrder.
func (d *Datapath) attachBoth(ifindex int, ingress *ebpf.Program, ingressName string, egress *ebpf.Program, egressName string) error {
	for _, dir := range d.hookOrder(ifindex) {
		prog, name := ingress, ingressName
		if dir == tcEgress {
			prog, name = egress, egressName
		}
		if err := d.attach(ifindex, dir, prog, name); err != nil {
			return err
		}
	}
	return nil
}

// hookOrder is the order in which an interface's two programs are attached. Where
// none of the datapath's is attached yet, egress first: the reply of a flow the
// ingress program NATs leaves through the egress program, which reverses the NAT,
// and attached second it would let the replies of the flows of the moment in
// between leave with the backend's address, to be reset by their clients (a first
// start that takes an interface over from kube-proxy's rules would lose them).
// Where the programs are replaced, ingress first: a flow the new ingress program
// creates while a conntrack table is migrated is mirrored into the table the old
// egress program reads (ct_mirror), and an old ingress program's flow created
// after the migration's copy would be one the new egress program cannot find.
func (d *Datapath) hookOrder(ifindex int) []tcHook {
	if d.attached(ifindex, tcIngress) {
		return []tcHook{tcIngress, tcEgress}
	}
	return []tcHook{tcEgress, tcIngress}
}

// attached reports whether a program of the datapath is attached to the interface
// in direction dir: its pinned tcx link, or its clsact filter. An error reading
// either counts as attached (the order for a replacement).
func (d *Datapath) attached(ifindex int, dir tcHook) bool {
	if _, err := os.Stat(LinkPinPath(d.pinDir, ifindex, dir.String())); !errors.Is(err, os.ErrNotExist) {
		return true
	}
	l, err := netlink.LinkByIndex(ifindex)
	if err != nil {
		return true
	}
	filters, err := netlink.FilterList(l, dir.clsactParent())
	if err != nil {
		return !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT)
	}
	return slices.ContainsFunc(filters, ours)
}

// AttachHostByName is AttachHost for the interface with this name.
func (d *Datapath) AttachHostByName(ifname string) error {
	i, err := ifindexByName(ifname)
	if err != nil {
		return fmt.Errorf("attach host: %w", err)
	}
	return d.AttachHost(i)
}

// DetachHost detaches the host interface programs from the interface with
// this index. Detaching what is not attached is not an error.
func (d *Datapath) DetachHost(ifindex int) error {
	var errs []error
	for _, dir := range tcHooks {
		errs = append(errs, detachTCX(d.pinDir, ifindex, dir), detachClsact(ifindex, dir))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("detach host ifindex %d: %w", ifindex, err)
	}
	return nil
}

// AttachEndpoint records the endpoint state of a workload's host-side
// interface, then attaches the endpoint programs to it: ingress sees the
// traffic from the workload, egress the traffic to it. Attaching again
// updates the pod IP and flags and replaces the programs in place,
// atomically; the endpoint keeps its policy. A new endpoint has none (not
// isolated): use AttachEndpointWithPolicy for an endpoint that must never be
// live without its policy. flags must not hold the isolation flags, which
// belong to the policy.
func (d *Datapath) AttachEndpoint(ifindex int, podIP netip.Addr, flags EndpointFlags) error {
	return d.attachEndpoint(ifindex, podIP, flags, nil)
}

// AttachEndpointWithPolicy is AttachEndpoint with the endpoint's policy
// written in the same update of its state (as SetEndpointPolicy writes it),
// before the programs are attached: a new endpoint is never live without its
// policy. The IP sets the rules name must be written first.
func (d *Datapath) AttachEndpointWithPolicy(ifindex int, podIP netip.Addr, flags EndpointFlags, p EndpointPolicy) error {
	return d.attachEndpoint(ifindex, podIP, flags, &p)
}

func (d *Datapath) attachEndpoint(ifindex int, podIP netip.Addr, flags EndpointFlags, p *EndpointPolicy) error {
	if ifindex <= 0 {
		return fmt.Errorf("attach endpoint: bad ifindex %d", ifindex)
	}
	if err := d.putEndpoint(ifindex, podIP, flags, p); err != nil {
		return fmt.Errorf("attach endpoint %s: %w", podIP, err)
	}
	return d.attachBoth(ifindex, d.objs.TcEpIngress, "dpc_ep_ingress", d.objs.TcEpEgress, "dpc_ep_egress")
}

// AttachEndpointByName is AttachEndpoint for the interface with this name.
func (d *Datapath) AttachEndpointByName(ifname string, podIP netip.Addr, flags EndpointFlags) error {
	i, err := ifindexByName(ifname)
	if err != nil {
		return fmt.Errorf("attach endpoint: %w", err)
	}
	return d.AttachEndpoint(i, podIP, flags)
}

// DetachEndpoint detaches the endpoint programs from the interface with this
// index and then forgets its endpoint state and policy rules. The interface
// may be gone already. Detaching what is not attached is not an error.
func (d *Datapath) DetachEndpoint(ifindex int) error {
	var errs []error
	for _, dir := range tcHooks {
		errs = append(errs, detachTCX(d.pinDir, ifindex, dir), detachClsact(ifindex, dir))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("detach endpoint ifindex %d: %w", ifindex, err)
	}
	if err := d.forgetEndpoint(ifindex); err != nil {
		return fmt.Errorf("detach endpoint ifindex %d: %w", ifindex, err)
	}
	return nil
}

// DetachEndpointByName is DetachEndpoint for the interface with this name.
func (d *Datapath) DetachEndpointByName(ifname string) error {
	i, err := ifindexByName(ifname)
	if err != nil {
		return fmt.Errorf("detach endpoint: %w", err)
	}
	return d.DetachEndpoint(i)
}

func (d *Datapath) attach(ifindex int, dir tcHook, prog *ebpf.Program, name string) error {
	var err error
	if d.mode == AttachTCX {
		err = attachTCX(d.pinDir, ifindex, dir, prog)
	} else {
		err = attachClsact(d.pinDir, ifindex, dir, prog, name)
	}
	if err != nil {
		return fmt.Errorf("attach %s to ifindex %d (%s): %w", name, ifindex, d.mode, err)
	}
	return nil
}

// attachTCX updates the pinned tcx link of the interface and direction in
// place, or creates and pins one; then it removes a clsact filter that an
// earlier run may have left (tcx runs first, so there is no gap and no double
// processing meanwhile).
func attachTCX(pinDir string, ifindex int, dir tcHook, prog *ebpf.Program) error {
	pin := LinkPinPath(pinDir, ifindex, dir.String())
	l, err := link.LoadPinnedLink(pin, nil)
	switch {
	case err == nil:
		info, ierr := l.Info()
		if ierr == nil && info.TCX() != nil && int(info.TCX().Ifindex) == ifindex &&
			ebpf.AttachType(info.TCX().AttachType) == dir.tcxAttach() {
			err := l.Update(prog)
			l.Close()
			if err != nil {
				return fmt.Errorf("update pinned tcx link %s: %w", pin, err)
			}
			return detachClsact(ifindex, dir)
		}
		// A link whose interface has gone (or not a tcx link): stale.
		err = l.Unpin()
		l.Close()
		if err != nil {
			return fmt.Errorf("unpin stale link %s: %w", pin, err)
		}
	case errors.Is(err, os.ErrNotExist):
	default:
		return fmt.Errorf("load pinned link %s: %w", pin, err)
	}

	if err := os.MkdirAll(filepath.Dir(pin), 0o700); err != nil {
		return fmt.Errorf("create links directory: %w", err)
	}
	l, err = link.AttachTCX(link.TCXOptions{Interface: ifindex, Program: prog, Attach: dir.tcxAttach()})
	if err != nil {
		return fmt.Errorf("tcx %s: %w", dir, err)
	}
	defer l.Close()
	if err := l.Pin(pin); err != nil {
		return fmt.Errorf("pin tcx link %s: %w", pin, err)
	}
	return detachClsact(ifindex, dir)
}

// detachTCX detaches and unpins the tcx link of the interface and direction,
// if there is one.
func detachTCX(pinDir string, ifindex int, dir tcHook) error {
	return unpinLink(LinkPinPath(pinDir, ifindex, dir.String()))
}

func unpinLink(pin string) error {
	l, err := link.LoadPinnedLink(pin, nil)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		// Not a link we can load: drop the pin all the same.
		if rerr := os.Remove(pin); rerr != nil && !errors.Is(rerr, os.ErrNotExist) {
			return fmt.Errorf("remove pin %s: %w", pin, errors.Join(err, rerr))
		}
		return nil
	}
	defer l.Close()
	// Detach even if someone else holds a file descriptor of the link.
	if err := l.Detach(); err != nil && !errors.Is(err, link.ErrNotSupported) {
		info, ierr := l.Info()
		defunct := ierr == nil && info.TCX() != nil && info.TCX().Ifindex == 0
		if !defunct && !errors.Is(err, unix.ENOLINK) && !errors.Is(err, unix.EINVAL) {
			return fmt.Errorf("detach link %s: %w", pin, err)
		}
	}
	if err := l.Unpin(); err != nil {
		return fmt.Errorf("unpin link %s: %w", pin, err)
	}
	return nil
}

// attachClsact creates or atomically replaces the datapath's bpf filter on
// the clsact qdisc of the interface, then detaches a tcx link that an earlier
// run may have left.
func attachClsact(pinDir string, ifindex int, dir tcHook, prog *ebpf.Program, name string) error {
	qdisc := &netlink.Clsact{QdiscAttrs: netlink.QdiscAttrs{
		LinkIndex: ifindex,
		Handle:    netlink.MakeHandle(0xffff, 0),
		Parent:    netlink.HANDLE_CLSACT,
	}}
	if err := netlink.QdiscAdd(qdisc); err != nil && !errors.Is(err, unix.EEXIST) {
		if errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("kernel lacks the clsact qdisc (sch_ingress): %w", err)
		}
		return fmt.Errorf("add clsact qdisc: %w", err)
	}
	filter := &netlink.BpfFilter{
		FilterAttrs: netlink.FilterAttrs{
			LinkIndex: ifindex,
			Parent:    dir.clsactParent(),
			Handle:    ClsactHandle,
			Protocol:  unix.ETH_P_ALL,
			Priority:  ClsactPriority,
		},
		Fd:           prog.FD(),
		Name:         name,
		DirectAction: true,
	}
	if err := netlink.FilterReplace(filter); err != nil {
		return fmt.Errorf("replace clsact %s filter: %w", dir, err)
	}
	return detachTCX(pinDir, ifindex, dir)
}

// ours reports whether f is a filter of the datapath.
func ours(f netlink.Filter) bool {
	bf, ok := f.(*netlink.BpfFilter)
	return ok && bf.Priority == ClsactPriority && bf.Handle == ClsactHandle &&
		strings.HasPrefix(bf.Name, ClsactFilterPrefix)
}

// detachClsact deletes the datapath's clsact filter of the interface and
// direction, if there is one. The qdisc stays: others may use it.
func detachClsact(ifindex int, dir tcHook) error {
	l, err := netlink.LinkByIndex(ifindex)
	if err != nil {
		var notFound netlink.LinkNotFoundError
		if errors.As(err, &notFound) || errors.Is(err, unix.ENODEV) {
			return nil
		}
		return fmt.Errorf("interface %d: %w", ifindex, err)
	}
	return detachClsactLink(l, dir)
}

func detachClsactLink(l netlink.Link, dir tcHook) error {
	qdiscs, err := netlink.QdiscList(l)
	if err != nil {
		return fmt.Errorf("list qdiscs of %s: %w", l.Attrs().Name, err)
	}
	hasClsact := false
	for _, q := range qdiscs {
		if q.Type() == "clsact" {
			hasClsact = true
		}
	}
	if !hasClsact {
		return nil
	}
	filters, err := netlink.FilterList(l, dir.clsactParent())
	if err != nil {
		return fmt.Errorf("list %s filters of %s: %w", dir, l.Attrs().Name, err)
	}
	for _, f := range filters {
		if !ours(f) {
			continue
		}
		if err := netlink.FilterDel(f); err != nil && !errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("delete %s filter of %s: %w", dir, l.Attrs().Name, err)
		}
	}
	return nil
}

// Remove detaches every program of the datapath in the current network
// namespace (pinned tcx links and clsact filters) and unpins its maps from
// pinDir: what an agent's cleanup does. Programs and maps are freed once no
// one else holds them. Removing what is not there is not an error.
func Remove(pinDir string) error {
	var errs []error
	linksDir := filepath.Join(pinDir, LinksDirName)
	entries, err := os.ReadDir(linksDir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, fmt.Errorf("list pinned links: %w", err))
	}
	for _, e := range entries {
		errs = append(errs, unpinLink(filepath.Join(linksDir, e.Name())))
	}
	if err := os.Remove(linksDir); err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, fmt.Errorf("remove links directory: %w", err))
	}

	links, err := netlink.LinkList()
	if err != nil {
		errs = append(errs, fmt.Errorf("list interfaces: %w", err))
	}
	for _, l := range links {
		for _, dir := range tcHooks {
			errs = append(errs, detachClsactLink(l, dir))
		}
	}

	names := pinNames()
	// Previous conntrack maps an interrupted migration left, whatever their
	// names (bpf.MigrateConntrack).
	pinned, err := os.ReadDir(pinDir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, fmt.Errorf("list pins: %w", err))
	}
	for _, e := range pinned {
		if strings.HasPrefix(e.Name(), ConntrackMapName) && !slices.Contains(names, e.Name()) {
			names = append(names, e.Name())
		}
	}
	for _, name := range names {
		if err := os.Remove(filepath.Join(pinDir, name)); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("unpin map %s: %w", name, err))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("remove datapath from %s: %w", pinDir, err)
	}
	return nil
}
