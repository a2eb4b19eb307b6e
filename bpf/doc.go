// Package bpf is the eBPF service datapath of the reference dataplane: tc
// programs for a node's host interface and for each workload's host-side
// interface, the maps they share, and the Go API that loads, attaches and
// programs them. It imports nothing of the project.
//
// # Hooks and NAT
//
// The host programs run on the host interface (tc ingress and egress), the
// endpoint programs on each workload's host-side veth (tc ingress: traffic
// from the workload; tc egress: traffic to it). IPv4 TCP and UDP are
// handled; anything else (ARP, ICMP, IPv6, IP fragments) passes untouched.
//
// Destinations are rewritten at ingress, before the stack routes a packet;
// sources at egress, after it has. The stack thus never sees a packet that
// arrives with one of the host's own addresses as source (a martian):
//
//   - ClusterIP, from a workload: DNAT to a backend at the workload's
//     ingress (backend chosen by a hash of the 5-tuple, remembered in
//     conntrack); the reply gets the frontend back as source where it leaves:
//     at the client workload's egress.
//   - NodePort, from outside, to (host IP, node port): DNAT at host ingress.
//     A local backend's reply gets its source restored at host egress. A
//     remote backend's traffic leaves the host interface again and is SNATed
//     there to (host IP, port in SNATPortMin..SNATPortMax); the backend's
//     reply gets the client back as destination at host ingress, and the
//     frontend back as source at host egress.
//   - Everything else is tracked but not rewritten.
//
// # Conntrack and marks
//
// Each flow has two conntrack entries, one per direction, keyed by the tuple
// as it is on the wire where it is looked up (see ConntrackFlags). New flows
// are created at ingress hooks only, by a TCP SYN or any UDP packet. A TCP
// packet in the middle of a flow that conntrack does not know is passed on
// unchanged with MarkFallthrough, for the Linux stack (and kube-proxy's
// conntrack) to handle; every packet the datapath tracks or NATs carries
// MarkSeen. There are no timeouts: entries are evicted by the LRU.
//
// # Limits
//
// Not handled (yet): traffic that the node itself originates towards a
// ClusterIP or NodePort (no socket-level hook), a workload reaching itself
// through a service (hairpin), ICMP errors about NATed flows (not reverse
// NATed), TCP state (entries of closed connections stay until the LRU evicts
// them; a new SYN on a known tuple re-selects its backend). NodePort SNAT
// tries 8 ports per new flow and drops the packet if all are taken. Only
// little-endian targets are generated.
//
// # State that outlives the agent
//
// Maps are pinned by name in a pin directory on a bpffs and adopted by the
// next Open; tcx links are pinned in its links subdirectory; clsact filters
// hold their programs by themselves. Close releases file descriptors only,
// so programs keep running while no agent does. Attaching again replaces the
// program of the existing link or filter in place. Remove undoes it all.
//
// # Generated code
//
// The C sources are datapath.c and datapath.h (the shared types, mirrored by
// types.go). The bpf2go object and bindings are committed, so building needs
// no clang. To regenerate them (clang and llvm-strip, libbpf-dev and the
// kernel headers installed), from the repository root:
//
//	go generate ./bpf/...
//
// TestGeneratedObjectsUpToDate checks that the committed files match what
// the sources generate, when clang is present.
package bpf
