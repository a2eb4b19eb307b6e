/* SPDX-License-Identifier: (MIT OR GPL-2.0-only) */
/*
 * Shared types of the dpconform reference datapath.
 *
 * Everything in this header is mirrored by a Go type or constant in
 * bpf/types.go; TestLayoutMatchesBTF and TestConstantsMatchHeader keep the two in
 * step. All addresses and ports are in network byte order, every other field
 * (the port ranges of policy rules included) in host byte order. IPv4 only.
 */
#ifndef DPC_DATAPATH_H
#define DPC_DATAPATH_H

#include <linux/types.h>

/*
 * skb->mark bits, read by the node's iptables rules (FORWARD and INPUT).
 * Only the bits in DPC_MARK_MASK are ours; the rest of the mark is preserved.
 *
 * DPC_MARK_SEEN: the datapath tracked this packet in its conntrack (and
 *   NATed it if its flow needs NAT); accept it unconditionally.
 * DPC_MARK_FALLTHROUGH: a TCP packet in the middle of a flow (no SYN) that BPF
 *   conntrack does not know, e.g. a flow that predates the datapath. It is
 *   left untouched for the Linux stack, whose conntrack (and kube-proxy's
 *   NAT) may know it: accept it only with -m conntrack --ctstate
 *   ESTABLISHED,RELATED.
 * DPC_MARK_VOUCHED: added by iptables (FORWARD) to a fallthrough packet whose
 *   flow Linux conntrack knows (ESTABLISHED,RELATED). A fallthrough packet
 *   without it leaves by no interface the datapath manages: a mid-flow packet
 *   that neither conntrack knows is dropped, not leaked past policy.
 */
#define DPC_MARK_MASK        0x0f000000
#define DPC_MARK_SEEN        0x01000000
#define DPC_MARK_FALLTHROUGH 0x02000000
#define DPC_MARK_VOUCHED     0x04000000

/* Default and maximum sizes of the maps (conntrack is sized at load time). */
#define DPC_FRONTENDS_MAX 16384
#define DPC_BACKENDS_MAX  65536
#define DPC_ENDPOINTS_MAX 4096
#define DPC_IPSETS_MAX    65536
#define DPC_POLICY_MAX    65536

/* Source ports used for SNAT of NodePort traffic to remote backends: outside
 * Linux's default ip_local_port_range (32768-60999), so that they do not
 * collide with the node's own connections. */
#define DPC_SNAT_PORT_MIN 61000
#define DPC_SNAT_PORT_MAX 65535

/* A new NodePort SNAT flow tries DPC_SNAT_TRIES ports, starting at a hash of
 * its tuple. It takes the first free one; if none is free, the least recently
 * seen of the candidates whose SNAT reply entry is reusable; if none is
 * reusable, the packet is dropped (the client's SYN retransmission tries
 * again). A SNAT reply entry (of another flow) is reusable when:
 *   - it is DPC_CT_CLOSING and has been quiet for DPC_CT_CLOSE_QUIET_MS, so
 *     the old flow's last ACKs are gone; or
 *   - it has been idle for DPC_CT_TCP_IDLE_SEC (TCP) or DPC_CT_UDP_IDLE_SEC
 *     (UDP), whatever its state. */
#define DPC_SNAT_TRIES        32
#define DPC_CT_CLOSE_QUIET_MS 1000
#define DPC_CT_TCP_IDLE_SEC   120
#define DPC_CT_UDP_IDLE_SEC   30

/* dpc_frontends: a service frontend, (ClusterIP or node IP, port, proto). */
struct frontend_key {
	__be32 addr;
	__be16 port;
	__u8 proto; /* IPPROTO_TCP or IPPROTO_UDP */
	__u8 pad;
};

struct frontend_value {
	__u32 service_id;    /* key of the service's backends in dpc_backends */
	__u32 backend_count; /* backends have indexes 0 .. backend_count-1 */
	__u32 flags;         /* reserved, 0 */
};

/* dpc_backends: the index-th backend of a service. */
struct backend_key {
	__u32 service_id;
	__u32 index;
};

struct backend_value {
	__be32 addr;
	__be16 port;
	__u16 pad;
};

/* dpc_conntrack: one entry per direction of a flow, keyed by the tuple as it
 * is on the wire when the packet reaches the hook that looks it up. */
struct ct_key {
	__be32 src;
	__be32 dst;
	__be16 sport;
	__be16 dport;
	__u8 proto;
	__u8 pad[3];
};

/* The entry is keyed by the reply tuple of its flow (else: the original). */
#define DPC_CT_REPLY        (1U << 0)
/* The flow was DNATed to a backend. Original entry: nat_* is the backend.
 * Reply entry: nat_* is the frontend, restored as source at egress. */
#define DPC_CT_DNAT         (1U << 1)
/* The flow entered the node on the host interface. */
#define DPC_CT_HOST_INGRESS (1U << 2)
/* Reply entry of a flow that leaves the host interface with its source
 * rewritten to (host IP, snat_port). */
#define DPC_CT_SNAT         (1U << 3)
/* The entry is keyed by the reply tuple after SNAT (backend -> host IP,
 * snat port); nat_* is the client, restored as destination at host ingress. */
#define DPC_CT_SNAT_REPLY   (1U << 4)
/* A TCP FIN or RST matched this entry (the flow is closing or closed); a
 * bare SYN that matches it clears the flag again (the tuple starts anew). */
#define DPC_CT_CLOSING      (1U << 5)
/* The destination endpoint's ingress policy admitted this flow (or it had
 * none), so later packets skip the rules: policy changes do not affect
 * admitted flows. Set on the entry the destination's tc egress finds (the
 * original entry; for a DNAT flow, the reply entry) and on the reply entry;
 * a bare SYN that restarts the tuple clears it. */
#define DPC_CT_INGRESS_OK   (1U << 6)
/* The flow's backend has left its service and is not listed any more (its pod
 * went): set by the agent on the original entry of a TCP DNAT flow. The
 * client's next packet on it (other than a SYN, which picks a backend again
 * and clears the flag) is answered with a RST from the frontend, and the
 * flow's entries go: a backend that vanished without closing its connections
 * would leave the client waiting in silence. */
#define DPC_CT_BACKEND_GONE (1U << 7)
/* The reply tuple of a TCP flow that predates the datapath, NATed by the stack
 * to a port of the SNAT range (kube-proxy's MASQUERADE, before a switch):
 * recorded when one of its packets falls through at host ingress, so that no
 * SNAT of ours takes that port towards the same backend and turns the flow's
 * replies to another client. Its packets go on falling through; once stale,
 * a SNAT may take the port. */
#define DPC_CT_FOREIGN      (1U << 8)
/* The flow's source port was moved where it entered from its workload: its
 * tuple on the wire, after DNAT, was a live flow's (a client may use one
 * source port towards two destinations, say a Service's frontend and one of
 * its backends, and DNAT makes the two one tuple; Linux NAT moves the second
 * flow's port too). Original entry: snat_port is the source port on the
 * wire. Reply entry, keyed by that port: snat_port is the client's own,
 * restored as destination where the reply leaves. The port is one of the
 * SNAT range (DPC_SNAT_PORT_MIN-MAX), which the workload's own connections
 * do not use, tried as a SNAT port is (DPC_SNAT_TRIES). */
#define DPC_CT_PORT_MOVED   (1U << 9)

/*
 * The value of a conntrack entry has two formats. An object is built for one
 * of them (DPC_CT_FORMAT, the refdp version it belongs to: refdp v1 writes
 * format 1, v2 format 2), and struct ct_value is that format. The conntrack
 * map's pin name carries its format (dpc_conntrack: 1, dpc_conntrack_v2: 2),
 * and each object reads the other format too, to adopt the entries of a
 * previous map while they are migrated (conntrack.h, ct_lookup).
 */
#ifndef DPC_CT_FORMAT
#define DPC_CT_FORMAT 2
#endif

/* Format 1 (refdp v1). */
struct ct_value_v1 {
	__u64 created_ns;   /* bpf_ktime_get_ns() when the entry was created */
	__u64 last_seen_ns; /* bpf_ktime_get_ns() of the last packet */
	__u32 flags;        /* DPC_CT_* */
	__u32 service_id;   /* for NAT flows, the frontend's service id */
	__be32 nat_addr;
	__be16 nat_port;
	__be16 snat_port;   /* with DPC_CT_SNAT or DPC_CT_PORT_MOVED */
};

/* Format 2 (refdp v2): format 1 with a count of the packets and bytes that
 * matched the entry since it was created (or converted from format 1), the
 * packet that created it not included. The counters come before the flags,
 * so every field after last_seen_ns has moved: a copy of the bytes of a
 * format 1 value would be wrong, it must be converted field by field. */
struct ct_value_v2 {
	__u64 created_ns;
	__u64 last_seen_ns;
	__u64 packets;
	__u64 bytes;
	__u32 flags;
	__u32 service_id;
	__be32 nat_addr;
	__be16 nat_port;
	__be16 snat_port;
};

#if DPC_CT_FORMAT == 1
#define ct_value ct_value_v1
#elif DPC_CT_FORMAT == 2
#define ct_value ct_value_v2
#else
#error "DPC_CT_FORMAT must be 1 or 2"
#endif

/* dpc_endpoints: keyed by the ifindex of a workload's host-side interface. */
#define DPC_EP_ANTISPOOF        (1U << 0) /* drop IPv4 from the workload not sourced from pod_ip */
#define DPC_EP_INGRESS_ISOLATED (1U << 1) /* some policy selects it for ingress: deny unless a rule allows */
#define DPC_EP_EGRESS_ISOLATED  (1U << 2) /* some policy selects it for egress: deny unless a rule allows */

/* pod_ip and flags come first and keep their place: a loader that adopts an
 * older, smaller endpoint map reads them from its entries. */
struct endpoint_value {
	__be32 pod_ip;
	__u32 flags;         /* DPC_EP_* */
	__u8 policy_slot;    /* which slot of dpc_policy is live */
	__u8 pad;
	__u16 ingress_rules; /* rules 0 .. ingress_rules-1 of the live slot */
	__u16 egress_rules;
	__u16 pad2;
};

/*
 * Network policy. An isolated direction of an endpoint passes a new flow only
 * if one of its rules matches the peer (and port and protocol); replies of an
 * admitted flow always pass. The rules of an endpoint live in two slots of
 * dpc_policy: the writer fills the slot that is not live, then flips
 * policy_slot and the counts in one update of the endpoint, so a program sees
 * either the old rules or the new ones, never a mix. Rules beyond the count
 * are stale and ignored.
 */

/* dpc_ipsets: BPF_MAP_TYPE_LPM_TRIE. The key's prefixlen covers the whole set
 * id (32 bits) plus the address prefix: 32 + plen. */
struct ipset_key {
	__u32 prefixlen;
	__be32 set_id; /* network order, so the trie's bytewise match covers it whole */
	__be32 addr;
};

/* This prefix is carved out of its set (ipBlock except): the longest prefix
 * wins, so an address under it is not a member. */
#define DPC_IPSET_EXCEPT (1U << 0)

struct ipset_value {
	__u32 flags; /* DPC_IPSET_* */
};

/* dpc_policy: the index-th rule of an endpoint for one direction, in one of
 * two slots. */
#define DPC_DIR_INGRESS 0 /* traffic to the workload */
#define DPC_DIR_EGRESS  1 /* traffic from the workload */
#define DPC_POLICY_RULES_MAX 256 /* per endpoint, direction and slot */

struct policy_key {
	__u32 ifindex;
	__u8 dir;   /* DPC_DIR_* */
	__u8 slot;  /* 0 or 1 */
	__u16 index;
};

/* A peer matches a rule when it is in the rule's set (or the rule has none),
 * and so do the protocol and the destination port. */
struct policy_rule {
	__u32 set_id;   /* peer IP set; 0: any peer */
	__u16 port_min; /* host order, inclusive; port_min == port_max == 0: any port */
	__u16 port_max;
	__u8 proto;     /* IPPROTO_TCP, IPPROTO_UDP, IPPROTO_SCTP; 0: any protocol */
	__u8 pad[3];
};

/*
 * Policy verdicts (flow logs), in the ring buffer dpc_verdicts: every packet
 * that policy drops, and one allow per new flow that an isolated direction of
 * an endpoint admits. Traffic of a direction that is not isolated is not
 * reported. When the ring buffer is full, the verdict is counted in
 * dpc_verdicts_lost (a per-CPU __u64 at index 0) instead.
 */
#define DPC_VERDICTS_SIZE (1U << 20) /* bytes; a power of two, a multiple of the page size */

#define DPC_VERDICT_DENY  0
#define DPC_VERDICT_ALLOW 1

/* Why: */
#define DPC_REASON_NO_RULES     0 /* deny: the direction is isolated and has no rules */
#define DPC_REASON_NO_MATCH     1 /* deny: none of the direction's rules matched */
#define DPC_REASON_NOT_ADMITTED 2 /* deny: the endpoint's reply on a flow its ingress policy did not admit */
#define DPC_REASON_RULE_MATCHED 3 /* allow: a rule matched */

/* The tuple is the flow as policy judged it: for egress, after service DNAT
 * (the backend as destination); for DPC_REASON_NOT_ADMITTED, the reply. */
struct verdict_event {
	__u64 time_ns; /* bpf_ktime_get_ns(): CLOCK_MONOTONIC */
	__be32 src;
	__be32 dst;
	__be16 sport;
	__be16 dport;
	__u8 proto;
	__u8 verdict; /* DPC_VERDICT_* */
	__u8 dir;     /* DPC_DIR_*: the endpoint's policy direction that judged it */
	__u8 reason;  /* DPC_REASON_* */
	__u32 ifindex; /* the endpoint's host-side interface */
	__u32 pad;
};

/* dpc_config: a single entry at index 0. */
struct config_value {
	__be32 host_ip;       /* the node's IP on the host interface: NodePort SNAT source */
	__u32 host_ifindex;   /* the host interface */
	__u32 flags;          /* reserved, 0 */
	__u32 pad;
};

#endif /* DPC_DATAPATH_H */
