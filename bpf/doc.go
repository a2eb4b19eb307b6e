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
// as it is on the wire where it is looked up (see ConntrackFlags); a SNATed
// NodePort flow has a third, its SNAT reply entry (backend -> host IP:SNAT
// port). New flows are created at ingress hooks only, by a TCP SYN or any UDP
// packet. A TCP packet in the middle of a flow that conntrack does not know is
// passed on unchanged with MarkFallthrough, for the Linux stack (and
// kube-proxy's conntrack) to handle; iptables adds MarkVouched when Linux
// conntrack knows its flow, and the egress programs drop a fallthrough packet
// without it. Every packet the datapath tracks or NATs carries MarkSeen.
//
// Every packet refreshes LastSeenNs of the entry it matches (and, in format
// 2, counts itself in its Packets and Bytes); a TCP FIN or RST
// also marks it ConntrackClosing, and a bare SYN (the tuple starting anew)
// clears that again. A client's packet that leaves SNATed refreshes (and
// closes) the flow's SNAT reply entry too, so both directions keep it alive.
// Entries are not expired: the LRU evicts them, and a new SYN on a known
// tuple re-selects its backend (keeping the entries, and the SNAT port if it
// is still the flow's own, when the backend stays). A UDP flow has no SYN: its
// packets go to the backend in its entry for as long as the entry lives, so
// when a backend leaves its service the agent deletes the entries of the UDP
// flows DNATed to it (Datapath.DeleteDNATFlows), and their next packet picks a
// backend of the frontend as it is then. A TCP flow whose backend's endpoint is
// gone (not merely terminating) is flagged ConntrackBackendGone on its original
// entry (Datapath.MarkDNATFlowsGone): a backend that vanished without closing its
// connections would leave them silent, so the client pod's next packet on it is
// answered with a RST from the frontend, sent back out of its interface, and the
// flow's entries are deleted.
//
// A new flow without NAT takes over a tuple whose entry belongs to a flow that is
// closing (FIN or RST seen) or idle past its timeout: clients reuse source ports,
// and the reply entry of an old ClusterIP flow to the same pod must not rewrite
// the new direct flow's replies. An entry of a live flow is never taken over.
//
// NodePort SNAT reuses ports: a new flow takes the first free port of its
// SNATPortTries candidates, else takes over the least recently seen candidate
// whose SNAT reply entry belongs to a flow that closed and has been quiet for
// ConntrackCloseQuiet, or that has been idle for ConntrackTCPIdleTimeout or
// ConntrackUDPIdleTimeout; else the packet is dropped, and the client's SYN
// retransmission tries again. The old flow's other entries still name the
// port: a packet of the old client that reaches host egress when the port's
// SNAT reply entry belongs to another client is dropped rather than put on
// the new flow's tuple, and a new SYN on the old client's tuple picks a port
// afresh. A late packet of the old flow from the backend cannot be told
// apart: it reaches the new flow's client, whose TCP discards it as out of
// window (the quiet time makes it rare). If the LRU evicted a live flow's
// SNAT reply entry, its next packet takes the port again, if still free.
//
// The backend may still hold the reused tuple (host IP:port <-> backend) in
// TIME_WAIT, if it closed first. Linux accepts a new SYN into TIME_WAIT when
// its TCP timestamp is newer than the old connection's (without timestamps:
// when its sequence number is past the old connection's); clients that are
// Linux hosts derive their timestamp offset from the address pair only, so
// this holds when the old and new flows come from the same client host, the
// common case (and the one of a conformance suite). A flow from another
// client host may lose that comparison: the backend answers its SYN with the
// old connection's ACK, the client resets it, and its SYN retransmission,
// a second later, gets through (unless the backend sets
// net.ipv4.tcp_rfc1337, which ignores that reset: then it waits out
// TIME_WAIT).
//
// # Network policy
//
// An endpoint isolated for ingress or egress (EndpointIngressIsolated,
// EndpointEgressIsolated) passes a new flow in that direction only if one of
// its rules (PolicyRule) matches: the peer is in the rule's IP set (an LPM
// trie of set ID and prefix, where the longest prefix decides, so an Except
// prefix carves addresses out of an ipBlock), and the protocol and the
// destination port are the rule's. Egress is judged at the workload's tc
// ingress, against the backend after DNAT, before any conntrack entry is
// made; a denied packet is dropped. Ingress is judged at its tc egress,
// against the source; the admission is noted on the flow's entries
// (ConntrackIngressOK), flows to endpoints that are not isolated included, so
// a flow once admitted is never judged again: policy changes apply to new
// flows only, as ESTABLISHED accepts do in iptables. Replies of admitted
// flows pass; an ingress-isolated workload cannot answer a flow it did not
// admit. A bare SYN that restarts a tuple is a new flow, judged afresh.
//
// An endpoint's rules sit in one of two slots of the policy map, the live
// one named by its EndpointValue with the rule counts. SetEndpointPolicy
// writes the other slot, then flips slot, counts and flags in one update of
// the endpoint, so the programs see the old policy or the new one, never a
// mix; AttachEndpointWithPolicy does the same for an endpoint's first write.
// The programs search at most MaxPolicyRules rules per direction, with
// bpf_loop (Linux 5.17+).
//
// # Policy verdicts
//
// The endpoint programs report policy's verdicts (flow logs) into a ring
// buffer, pinned with the maps (VerdictsMapName, VerdictRingSize bytes):
// a deny for every packet that policy drops, and one allow per new flow that
// an isolated direction admits, at its admission (later packets of admitted
// flows are not judged, so not reported). Flows of a direction that is not
// isolated are not reported. Each Verdict names the flow as policy judged it
// (for egress, the backend after DNAT), the direction, the reason and the
// time (CLOCK_MONOTONIC). A verdict that finds the ring buffer full is
// counted in a per-CPU counter instead (VerdictsLostMapName). VerdictReader
// drains the pinned ring buffer from any process, agent or not; the read
// position is the ring buffer's own, so successive readers each get what is
// new.
//
// # Limits
//
// Not handled (yet): traffic that the node itself originates towards a
// ClusterIP or NodePort (no socket-level hook), a workload reaching itself
// through a service (hairpin), ICMP errors about NATed flows (not reverse
// NATed), full TCP state tracking (only FIN and RST are noted; entries of
// closed connections stay until the LRU evicts them or SNAT reuses them).
// SNAT port reuse is decided per entry, without a lock: two new flows that
// take over the same entry at the same instant on two CPUs may both send
// their SYN from its port; both recover with their SYN retransmission a
// second later (the one that lost the entry then picks another port). A
// half-closed TCP connection (one FIN) that is silent for
// ConntrackCloseQuiet, or any connection silent for ConntrackTCPIdleTimeout,
// may lose its SNAT port to a new flow when the ports run out: its next
// packets are dropped. Policy sees only what the programs parse: ICMP, SCTP,
// IP fragments and IPv6 pass unpoliced, and so does traffic to a workload
// that no program tracked (from the node itself, or in flows that predate
// the datapath). Only little-endian targets are generated.
//
// # State that outlives the agent
//
// Maps are pinned by name in a pin directory on a bpffs and adopted by the
// next Open (an endpoint map of the layout before network policy is
// replaced, its pod IPs and flags carried over); tcx links are pinned in its links subdirectory; clsact filters
// hold their programs by themselves. Close releases file descriptors only,
// so programs keep running while no agent does. Attaching again replaces the
// program of the existing link or filter in place. Remove undoes it all.
//
// # Conntrack formats and migration
//
// The datapath is built twice from one source, once per conntrack format
// (ConntrackFormat, Options.ConntrackFormat): refdp v1's values are struct
// ct_value_v1 (32 bytes), v2's struct ct_value_v2 (48 bytes), which adds a
// count of the packets and bytes that matched each entry, before the flags.
// The conntrack map's pin name carries its format: ConntrackMapName for v1
// (as before formats had names), ConntrackMapName + "_v2" for v2. A
// ConntrackValue decodes from either format and is written in its map's.
//
// Open adopts the pinned map of its format if it has Options.ConntrackSize;
// otherwise it pins a new one, and every other conntrack map pinned (the one
// of another size, set aside as <name>_old, or the other format's) is a
// previous map: the newest of each format goes into a slot of the programs
// (dpc_ct_prev_v1, dpc_ct_prev_v2, arrays of one map), where every lookup
// that misses the new map finds it, and adopts the entry, converted; and
// what the programs create or change that another hook reads (NAT, SNAT
// port, admission) they write there too, in its format, for the old
// programs still attached on other hooks. Once the new programs run on
// every hook (AttachHost, ReattachEndpoints),
// MigrateConntrack copies what the new map still lacks, in the kernel, a
// chunk at a time (a batch read of the previous map staged in
// dpc_ct_staging, then dpc_ct_migrate writes each entry with BPF_NOEXIST, so
// what the programs adopted, mirrored or created since wins), then empties
// the slots and unpins the previous maps. migrate.go says why this order loses no flow, and what
// copying before the attach loses.
//
// # Generated code
//
// The C sources are datapath.c (the programs), a header per concept that
// it includes (pkt.h, conntrack.h, nat.h, snat.h, policy.h, verdicts.h) and datapath.h
// (the shared types, mirrored by types.go and ctformat.go). bpf2go builds
// them into one object per conntrack format (datapathv1_bpfel.o,
// datapathv2_bpfel.o); the objects and bindings are committed, so building
// needs no clang. To regenerate them (clang and
// llvm-strip, libbpf-dev and the kernel headers installed), from the
// repository root:
//
//	go generate ./bpf/...
//
// TestGeneratedObjectsUpToDate checks that the committed files match what
// the sources generate, when clang is present.
package bpf
