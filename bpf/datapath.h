/* SPDX-License-Identifier: (MIT OR GPL-2.0-only) */
/*
 * Shared types of the dpconform reference datapath.
 *
 * Everything in this header is mirrored by a Go type or constant in
 * bpf/types.go; TestLayoutMatchesBTF and TestMarksMatchHeader keep the two in
 * step. All addresses and ports are in network byte order, every other field
 * in host byte order. IPv4 only.
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

struct ct_value {
	__u64 created_ns;   /* bpf_ktime_get_ns() when the entry was created */
	__u64 last_seen_ns; /* bpf_ktime_get_ns() of the last packet */
	__u32 flags;        /* DPC_CT_* */
	__u32 service_id;   /* for NAT flows, the frontend's service id */
	__be32 nat_addr;
	__be16 nat_port;
	__be16 snat_port;   /* with DPC_CT_SNAT */
};

/* dpc_endpoints: keyed by the ifindex of a workload's host-side interface. */
#define DPC_EP_ANTISPOOF (1U << 0) /* drop IPv4 from the workload not sourced from pod_ip */

struct endpoint_value {
	__be32 pod_ip;
	__u32 flags; /* DPC_EP_* */
};

/* dpc_config: a single entry at index 0. */
struct config_value {
	__be32 host_ip;       /* the node's IP on the host interface: NodePort SNAT source */
	__u32 host_ifindex;   /* the host interface */
	__u32 flags;          /* reserved, 0 */
	__u32 pad;
};

#endif /* DPC_DATAPATH_H */
