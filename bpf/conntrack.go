package bpf

import (
	"errors"
	"fmt"
	"net/netip"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/dpconform/dpconform/driver/proc"
)

// DNATFlows names the flows the programs DNATed from a frontend to one backend.
type DNATFlows struct {
	Frontend FrontendKey
	Backend  BackendValue
}

// String formats f as frontend->backend.
func (f DNATFlows) String() string { return f.Frontend.String() + "->" + f.Backend.String() }

// DeleteDNATFlows deletes the conntrack entries of every flow DNATed from one of
// flows' frontends to its backend: the original entry, the reply entry and, for a
// NodePort flow SNATed towards a remote backend, its SNAT reply entry. The next
// packet of such a flow is a new flow for the programs, and picks a backend of its
// frontend as the frontend map has it then: delete after switching the frontend.
//
// This is what a dataplane must do for UDP when a backend leaves a service (as
// kube-proxy deletes Linux conntrack entries): a UDP flow has no handshake that
// would pick a backend again, so a client that keeps its 5-tuple is sent to the
// backend in its entry for as long as the entry lives. It reads the whole table
// (in batches) once, and returns the number of entries it deleted. Entries a
// packet refreshes meanwhile are deleted all the same.
func (d *Datapath) DeleteDNATFlows(flows []DNATFlows) (int, error) {
	if len(flows) == 0 {
		return 0, nil
	}
	all, err := d.conntrack.All()
	if err != nil {
		return 0, fmt.Errorf("delete DNAT flows: %w", err)
	}
	n := 0
	var errs []error
	for _, k := range dnatFlowEntries(all, flows) {
		switch err := d.conntrack.m.Delete(k); {
		case err == nil:
			n++
		case errors.Is(err, ebpf.ErrKeyNotExist): // evicted meanwhile by the LRU
		default:
			errs = append(errs, fmt.Errorf("delete conntrack entry %s: %w", k, err))
		}
	}
	return n, errors.Join(errs...)
}

// dnatFlowEntries returns the keys of the entries of table that belong to flows
// DNATed from one of flows' frontends to its backend (see DeleteDNATFlows).
func dnatFlowEntries(table map[ConntrackKey]ConntrackValue, flows []DNATFlows) []ConntrackKey {
	stale := make(map[DNATFlows]bool, len(flows))
	for _, f := range flows {
		stale[f] = true
	}
	// A SNAT reply entry is keyed backend -> host IP:SNAT port, and names its
	// client: find it from the reply entry, which has the port.
	type snatOwner struct {
		backend, client netip.AddrPort
		port            uint16
		proto           Proto
	}
	snat := map[snatOwner]ConntrackKey{}
	for k, v := range table {
		if v.Flags&ConntrackSNATReply != 0 {
			snat[snatOwner{netip.AddrPortFrom(k.Src, k.SrcPort), netip.AddrPortFrom(v.NATAddr, v.NATPort), k.DstPort, k.Proto}] = k
		}
	}
	var out []ConntrackKey
	for k, v := range table {
		if f, ok := dnatFlowOf(k, v); !ok || !stale[f] {
			continue
		}
		out = append(out, k)
		if v.Flags&(ConntrackReply|ConntrackSNAT) == ConntrackReply|ConntrackSNAT {
			o := snatOwner{netip.AddrPortFrom(k.Src, k.SrcPort), netip.AddrPortFrom(k.Dst, k.DstPort), v.SNATPort, k.Proto}
			if sk, ok := snat[o]; ok {
				out = append(out, sk)
			}
		}
	}
	return out
}

// dnatFlowOf returns the frontend and backend of the DNAT flow that entry (k, v)
// belongs to: its original entry is keyed client -> frontend and names the
// backend, its reply entry is keyed backend -> client and names the frontend. ok
// is false for an entry of no DNAT flow, or a SNAT reply entry.
func dnatFlowOf(k ConntrackKey, v ConntrackValue) (f DNATFlows, ok bool) {
	if v.Flags&ConntrackDNAT == 0 || v.Flags&ConntrackSNATReply != 0 {
		return DNATFlows{}, false
	}
	if v.Flags&ConntrackReply != 0 {
		return DNATFlows{Frontend: FrontendKey{Addr: v.NATAddr, Port: v.NATPort, Proto: k.Proto}, Backend: BackendValue{Addr: k.Src, Port: k.SrcPort}}, true
	}
	return DNATFlows{Frontend: FrontendKey{Addr: k.Dst, Port: k.DstPort, Proto: k.Proto}, Backend: BackendValue{Addr: v.NATAddr, Port: v.NATPort}}, true
}

// liveTCPOriginal reports whether (k, v) is the original entry of a TCP flow that
// is not over at now (flowOver).
func liveTCPOriginal(k ConntrackKey, v ConntrackValue, now uint64) bool {
	return k.Proto == TCP && v.Flags&(ConntrackReply|ConntrackSNATReply) == 0 && !flowOver(v, now)
}

// MarkDNATFlowsGone flags the original conntrack entry of every TCP flow DNATed
// from one of flows' frontends to its backend with ConntrackBackendGone: the
// backend has gone (its pod is not listed any more), and may have gone without
// closing its connections (a lost node or sandbox), so nothing would tell their
// clients. The programs answer a pod's next packet on such a flow with a RST from
// the frontend and delete its entries; a SYN on its tuple picks a backend again.
// UDP flows are not flagged (DeleteDNATFlows is theirs).
//
// Flows that are over are left alone: closed and quiet for ConntrackCloseQuiet,
// or idle for ConntrackTCPIdleTimeout, as the programs judge a tuple free for a
// new flow. A busy client leaves thousands of them in the table, and flagging
// each costs two system calls.
//
// It reads the whole table (in batches) once, and each entry again just before
// flagging it: what a packet wrote since (its last-seen time, a FIN) is kept, and
// an entry a SYN has given another backend since (the client reused the tuple for
// a new flow) is left alone. Only a SYN between that second read and the write is
// lost: the write brings the old flow back over the new one, whose next packet is
// then reset. It returns the number of entries flagged.
func (d *Datapath) MarkDNATFlowsGone(flows []DNATFlows) (int, error) {
	if len(flows) == 0 {
		return 0, nil
	}
	all, err := d.conntrack.All()
	if err != nil {
		return 0, fmt.Errorf("mark DNAT flows gone: %w", err)
	}
	now, err := KernelNow()
	if err != nil {
		return 0, fmt.Errorf("mark DNAT flows gone: %w", err)
	}
	return d.markDNATFlowsGone(all, flows, now)
}

// markDNATFlowsGone is MarkDNATFlowsGone on all, a snapshot of the table that may
// be older than the entries it names, taken at now (CLOCK_MONOTONIC ns).
func (d *Datapath) markDNATFlowsGone(all map[ConntrackKey]ConntrackValue, flows []DNATFlows, now uint64) (int, error) {
	n := 0
	var errs []error
	for _, k := range dnatFlowEntries(all, flows) {
		if !liveTCPOriginal(k, all[k], now) {
			continue
		}
		var v ConntrackValue
		if err := d.conntrack.m.Lookup(k, &v); err != nil {
			if !errors.Is(err, ebpf.ErrKeyNotExist) { // else evicted meanwhile by the LRU
				errs = append(errs, fmt.Errorf("look up conntrack entry %s: %w", k, err))
			}
			continue
		}
		if v.Flags&ConntrackDNAT == 0 || v.NATAddr != all[k].NATAddr || v.NATPort != all[k].NATPort {
			continue // a new flow on the tuple, to a backend of the frontend now
		}
		v.Flags |= ConntrackBackendGone
		switch err := d.conntrack.m.Update(k, d.conntrack.value(v), ebpf.UpdateExist); {
		case err == nil:
			n++
		case errors.Is(err, ebpf.ErrKeyNotExist):
		default:
			errs = append(errs, fmt.Errorf("flag conntrack entry %s: %w", k, err))
		}
	}
	return n, errors.Join(errs...)
}

// TCPDNATFlows returns, once each, the frontend and backend of the TCP flows the
// programs DNATed that are not over (flowOver): the flows an agent that starts must
// still end if their backend is gone, though the run that removed the backend from
// its frontend is not there to remember it. It reads the whole table (in batches)
// once.
func (d *Datapath) TCPDNATFlows() ([]DNATFlows, error) {
	all, err := d.conntrack.All()
	if err != nil {
		return nil, fmt.Errorf("read the DNATed TCP flows: %w", err)
	}
	now, err := KernelNow()
	if err != nil {
		return nil, fmt.Errorf("read the DNATed TCP flows: %w", err)
	}
	return tcpDNATFlows(all, now), nil
}

// tcpDNATFlows is TCPDNATFlows on table, a snapshot taken at now.
func tcpDNATFlows(table map[ConntrackKey]ConntrackValue, now uint64) []DNATFlows {
	seen := map[DNATFlows]bool{}
	var out []DNATFlows
	for k, v := range table {
		f, ok := dnatFlowOf(k, v)
		if !ok || !liveTCPOriginal(k, v, now) {
			continue
		}
		if !seen[f] {
			seen[f] = true
			out = append(out, f)
		}
	}
	return out
}

// flowOver reports whether the TCP flow of entry v is over at now, as entry_stale
// (conntrack.h) judges it: closing (a FIN or RST seen) and quiet since for
// ConntrackCloseQuiet, or idle for ConntrackTCPIdleTimeout.
func flowOver(v ConntrackValue, now uint64) bool {
	idle := time.Duration(int64(now - v.LastSeenNs)) // signed: a packet may be newer than now
	return v.Flags&ConntrackClosing != 0 && idle > ConntrackCloseQuiet || idle > ConntrackTCPIdleTimeout
}

// KernelNow is the kernel's CLOCK_MONOTONIC in nanoseconds, the clock the datapath
// stamps conntrack entries and verdicts with (bpf_ktime_get_ns). A process in a time
// namespace reads its namespace's offset on top of it; that is taken off again, so
// that an entry's age is right wherever the agent runs.
func KernelNow() (uint64, error) {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		return 0, fmt.Errorf("read the monotonic clock: %w", err)
	}
	off, err := proc.MonotonicOffset()
	if err != nil {
		return 0, fmt.Errorf("read this process's time namespace: %w", err)
	}
	return uint64(ts.Nano() - int64(off)), nil
}
