//go:build ignore

// SPDX-License-Identifier: (MIT OR GPL-2.0-only)
/*
 * The dpconform reference service datapath: tc programs for the host
 * interface and for each workload's host-side interface.
 *
 * The split that keeps every packet routable by the Linux stack:
 *   - destinations are rewritten at ingress, before routing (DNAT of new and
 *     known flows, and the reverse of SNAT on replies at the host interface);
 *   - sources are rewritten at egress, after routing (reverse DNAT of replies
 *     where they leave, SNAT of NodePort traffic that leaves the host
 *     interface again towards a remote backend).
 * So the stack never sees a packet arriving with one of the host's own
 * addresses as source (a martian).
 */
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/pkt_cls.h>
#include <stddef.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

#include "datapath.h"

char __license[] SEC("license") = "Dual MIT/GPL";

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, DPC_FRONTENDS_MAX);
	__type(key, struct frontend_key);
	__type(value, struct frontend_value);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} dpc_frontends SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, DPC_BACKENDS_MAX);
	__type(key, struct backend_key);
	__type(value, struct backend_value);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} dpc_backends SEC(".maps");

/* max_entries is set by the loader (Options.ConntrackSize). */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, struct ct_key);
	__type(value, struct ct_value);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} dpc_conntrack SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, DPC_ENDPOINTS_MAX);
	__type(key, __u32);
	__type(value, struct endpoint_value);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} dpc_endpoints SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, DPC_IPSETS_MAX);
	__uint(map_flags, BPF_F_NO_PREALLOC); /* an LPM trie requires it */
	__type(key, struct ipset_key);
	__type(value, struct ipset_value);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} dpc_ipsets SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, DPC_POLICY_MAX);
	__type(key, struct policy_key);
	__type(value, struct policy_rule);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} dpc_policy SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct config_value);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} dpc_config SEC(".maps");

#define IP_OFF       ETH_HLEN
#define IP_CSUM_OFF  (IP_OFF + offsetof(struct iphdr, check))
#define IP_SRC_OFF   (IP_OFF + offsetof(struct iphdr, saddr))
#define IP_DST_OFF   (IP_OFF + offsetof(struct iphdr, daddr))
#define TCP_CSUM     16
#define TCP_FLAGS    13
#define UDP_CSUM     6
#define TH_FIN       0x01
#define TH_SYN       0x02
#define TH_RST       0x04
#define TH_ACK       0x10
#define SNAT_PORTS   (DPC_SNAT_PORT_MAX - DPC_SNAT_PORT_MIN + 1)
#define NS_PER_MS    1000000ULL
#define NS_PER_SEC   1000000000ULL

struct pkt {
	struct ct_key tuple;
	__u32 l4_off;
	__u8 tcp_flags;
};

/* parse fills p from an IPv4 TCP or UDP packet; anything else (other L3 or
 * L4 protocols, IP fragments) is not the datapath's business. */
static __always_inline int parse(struct __sk_buff *skb, struct pkt *p)
{
	struct iphdr ip;
	__be16 ports[2];
	__u8 vihl;

	if (skb->protocol != bpf_htons(ETH_P_IP))
		return -1;
	if (bpf_skb_load_bytes(skb, IP_OFF, &ip, sizeof(ip)) < 0)
		return -1;
	vihl = *(__u8 *)&ip;
	if ((vihl >> 4) != 4 || (vihl & 0x0f) < 5)
		return -1;
	if (ip.frag_off & bpf_htons(0x3fff)) /* MF or a fragment offset */
		return -1;
	if (ip.protocol != IPPROTO_TCP && ip.protocol != IPPROTO_UDP)
		return -1;

	p->l4_off = IP_OFF + (vihl & 0x0f) * 4;
	if (bpf_skb_load_bytes(skb, p->l4_off, ports, sizeof(ports)) < 0)
		return -1;
	if (ip.protocol == IPPROTO_TCP &&
	    bpf_skb_load_bytes(skb, p->l4_off + TCP_FLAGS, &p->tcp_flags, 1) < 0)
		return -1;

	p->tuple.src = ip.saddr;
	p->tuple.dst = ip.daddr;
	p->tuple.sport = ports[0];
	p->tuple.dport = ports[1];
	p->tuple.proto = ip.protocol;
	return 0;
}

static __always_inline int is_syn(const struct pkt *p)
{
	return p->tuple.proto == IPPROTO_TCP &&
	       (p->tcp_flags & (TH_SYN | TH_ACK)) == TH_SYN;
}

/* Anything but a bare SYN starts no TCP flow, a SYN-ACK included: it answers
 * a SYN we did not see (e.g. sent by the host itself). */
static __always_inline int is_tcp_midflow(const struct pkt *p)
{
	return p->tuple.proto == IPPROTO_TCP && !is_syn(p);
}

/* touch notes a packet on the conntrack entry it matched: when it was seen,
 * and whether it closes (TCP FIN or RST) or restarts (a bare SYN) the flow. */
static __always_inline void touch(struct ct_value *ct, const struct pkt *p, __u64 now)
{
	ct->last_seen_ns = now;
	if (p->tuple.proto != IPPROTO_TCP)
		return;
	if (p->tcp_flags & (TH_FIN | TH_RST)) {
		if (!(ct->flags & DPC_CT_CLOSING))
			ct->flags |= DPC_CT_CLOSING;
	} else if (is_syn(p) && (ct->flags & DPC_CT_CLOSING)) {
		ct->flags &= ~DPC_CT_CLOSING;
	}
}

static __always_inline void set_mark(struct __sk_buff *skb, __u32 mark)
{
	skb->mark = (skb->mark & ~DPC_MARK_MASK) | mark;
}

/* rewrite replaces the destination (dst != 0) or source address and port of
 * the packet, fixing the IPv4 header checksum and the TCP/UDP checksum
 * (pseudo header included). A UDP checksum of 0 (none) stays 0. */
static __always_inline int rewrite(struct __sk_buff *skb, struct pkt *p, int dst,
				   __be32 addr, __be16 port)
{
	__be32 old_addr = dst ? p->tuple.dst : p->tuple.src;
	__be16 old_port = dst ? p->tuple.dport : p->tuple.sport;
	__u32 csum_off = p->l4_off;
	__u64 l4flags = 0;

	if (p->tuple.proto == IPPROTO_TCP) {
		csum_off += TCP_CSUM;
	} else {
		csum_off += UDP_CSUM;
		l4flags = BPF_F_MARK_MANGLED_0;
	}

	if (old_addr != addr) {
		if (bpf_l4_csum_replace(skb, csum_off, old_addr, addr,
					l4flags | BPF_F_PSEUDO_HDR | sizeof(addr)) < 0)
			return -1;
		if (bpf_l3_csum_replace(skb, IP_CSUM_OFF, old_addr, addr, sizeof(addr)) < 0)
			return -1;
		if (bpf_skb_store_bytes(skb, dst ? IP_DST_OFF : IP_SRC_OFF, &addr,
					sizeof(addr), 0) < 0)
			return -1;
	}
	if (old_port != port) {
		if (bpf_l4_csum_replace(skb, csum_off, old_port, port,
					l4flags | sizeof(port)) < 0)
			return -1;
		if (bpf_skb_store_bytes(skb, p->l4_off + (dst ? 2 : 0), &port,
					sizeof(port), 0) < 0)
			return -1;
	}

	if (dst) {
		p->tuple.dst = addr;
		p->tuple.dport = port;
	} else {
		p->tuple.src = addr;
		p->tuple.sport = port;
	}
	return 0;
}

static __always_inline __u32 mix32(__u32 h)
{
	h ^= h >> 16;
	h *= 0x85ebca6b;
	h ^= h >> 13;
	h *= 0xc2b2ae35;
	h ^= h >> 16;
	return h;
}

/* flow_hash picks a backend for a new flow and the first SNAT port to try. */
static __always_inline __u32 flow_hash(const struct ct_key *k)
{
	__u32 h = mix32(k->src ^ 0x9e3779b9);

	h = mix32(h ^ k->dst);
	h = mix32(h ^ (((__u32)k->sport << 16) | k->dport));
	return mix32(h ^ k->proto);
}

static __always_inline void reverse(const struct ct_key *k, struct ct_key *r)
{
	r->src = k->dst;
	r->dst = k->src;
	r->sport = k->dport;
	r->dport = k->sport;
	r->proto = k->proto;
}

/* entry_stale: the conntrack entry o belongs to a flow that is over: it saw a
 * FIN or RST and has been quiet since, or it has been idle past its protocol's
 * timeout. A new flow may take its tuple over. */
static __always_inline int entry_stale(const struct ct_value *o, __u8 proto, __u64 now)
{
	/* Signed: another CPU may have seen a packet after our now. */
	__s64 idle = (__s64)(now - o->last_seen_ns);

	if ((o->flags & DPC_CT_CLOSING) && idle > (__s64)(DPC_CT_CLOSE_QUIET_MS * NS_PER_MS))
		return 1;
	if (proto == IPPROTO_TCP)
		return idle > (__s64)(DPC_CT_TCP_IDLE_SEC * NS_PER_SEC);
	return idle > (__s64)(DPC_CT_UDP_IDLE_SEC * NS_PER_SEC);
}

/* put_plain records v under k unless k belongs to a live flow: a tuple may be the
 * reply of a NAT flow still in use (that one wins), or of one that is closing or
 * over (a client reuses source ports at once: the old entry must not hijack the
 * new flow's replies, so the new flow takes the tuple over, as Linux conntrack
 * gives way to a new SYN on a tuple in TIME_WAIT). */
static __always_inline void put_plain(const struct ct_key *k, const struct ct_value *v, __u64 now)
{
	struct ct_value *o = bpf_map_lookup_elem(&dpc_conntrack, k);

	if (o && !(o->flags & DPC_CT_CLOSING) && !entry_stale(o, k->proto, now))
		return;
	bpf_map_update_elem(&dpc_conntrack, k, v, BPF_ANY);
}

/* track_plain records a flow that needs no NAT, in both directions. */
static __always_inline void track_plain(const struct ct_key *k, __u32 flags, __u64 now)
{
	struct ct_value v = {
		.created_ns = now,
		.last_seen_ns = now,
		.flags = flags,
	};
	struct ct_key r = {};

	put_plain(k, &v, now);
	reverse(k, &r);
	v.flags |= DPC_CT_REPLY;
	put_plain(&r, &v, now);
}

/* track_nat records a DNAT flow in both directions (replacing older entries:
 * a new SYN for the tuple starts a new flow). */
static __always_inline int track_nat(const struct ct_key *k, const struct backend_value *be,
				     __u32 service_id, __u32 flags, __u64 now)
{
	struct ct_value v = {
		.created_ns = now,
		.last_seen_ns = now,
		.flags = flags | DPC_CT_DNAT,
		.service_id = service_id,
		.nat_addr = be->addr,
		.nat_port = be->port,
	};
	struct ct_key r = {
		.src = be->addr,
		.dst = k->src,
		.sport = be->port,
		.dport = k->sport,
		.proto = k->proto,
	};

	if (bpf_map_update_elem(&dpc_conntrack, k, &v, BPF_ANY) < 0)
		return -1;
	v.flags |= DPC_CT_REPLY;
	v.nat_addr = k->dst;
	v.nat_port = k->dport;
	return bpf_map_update_elem(&dpc_conntrack, &r, &v, BPF_ANY);
}

/* from_iface handles a packet entering the node: on the host interface
 * (host != 0) or from a workload. */
static __always_inline int from_iface(struct __sk_buff *skb, int host)
{
	struct frontend_key fk = {};
	struct frontend_value *fe;
	struct backend_key bk = {};
	struct backend_value *be;
	struct ct_value *ct;
	struct pkt p = {};
	__u32 flags = host ? DPC_CT_HOST_INGRESS : 0;
	__u64 now;

	if (parse(skb, &p) < 0)
		return TC_ACT_OK;

	now = bpf_ktime_get_ns();
	ct = bpf_map_lookup_elem(&dpc_conntrack, &p.tuple);
	if (ct) {
		touch(ct, &p, now);
		if (ct->flags & DPC_CT_SNAT_REPLY) {
			/* A reply to our SNAT: back to the client. Its source
			 * (the backend) is restored at host egress. */
			if (host && rewrite(skb, &p, 1, ct->nat_addr, ct->nat_port) < 0)
				return TC_ACT_SHOT;
			set_mark(skb, DPC_MARK_SEEN);
			return TC_ACT_OK;
		}
		if (ct->flags & DPC_CT_REPLY) {
			/* Reverse DNAT happens where the reply leaves. */
			set_mark(skb, DPC_MARK_SEEN);
			return TC_ACT_OK;
		}
		if (!is_syn(&p)) {
			if ((ct->flags & DPC_CT_DNAT) &&
			    rewrite(skb, &p, 1, ct->nat_addr, ct->nat_port) < 0)
				return TC_ACT_SHOT;
			set_mark(skb, DPC_MARK_SEEN);
			return TC_ACT_OK;
		}
		/* A SYN on a known tuple: re-check the service below, so a
		 * reused tuple does not stick to a backend that has gone. If
		 * the backend stays, so do the entries (and the SNAT port,
		 * which snat checks is still the flow's own). */
	}

	fk.addr = p.tuple.dst;
	fk.port = p.tuple.dport;
	fk.proto = p.tuple.proto;
	fe = bpf_map_lookup_elem(&dpc_frontends, &fk);
	if (!fe) {
		if (!ct) {
			if (is_tcp_midflow(&p)) {
				set_mark(skb, DPC_MARK_FALLTHROUGH);
				return TC_ACT_OK;
			}
			track_plain(&p.tuple, flags, now);
		}
		set_mark(skb, DPC_MARK_SEEN);
		return TC_ACT_OK;
	}

	if (!ct && is_tcp_midflow(&p)) {
		/* Mid-flow to a service: a flow that predates us, NATed by
		 * the stack (kube-proxy) if by anyone. */
		set_mark(skb, DPC_MARK_FALLTHROUGH);
		return TC_ACT_OK;
	}
	if (fe->backend_count == 0)
		return TC_ACT_SHOT;
	bk.service_id = fe->service_id;
	bk.index = flow_hash(&p.tuple) % fe->backend_count;
	be = bpf_map_lookup_elem(&dpc_backends, &bk);
	if (!be)
		return TC_ACT_SHOT;
	if (!(ct && (ct->flags & DPC_CT_DNAT) && ct->nat_addr == be->addr &&
	      ct->nat_port == be->port)) {
		if (track_nat(&p.tuple, be, fe->service_id, flags, now) < 0)
			return TC_ACT_SHOT;
	}
	if (rewrite(skb, &p, 1, be->addr, be->port) < 0)
		return TC_ACT_SHOT;
	set_mark(skb, DPC_MARK_SEEN);
	return TC_ACT_OK;
}

/* snat_owned: the SNAT reply entry o belongs to the flow of client
 * (sv->nat_addr, sv->nat_port). */
static __always_inline int snat_owned(const struct ct_value *o, const struct ct_value *sv)
{
	return (o->flags & DPC_CT_SNAT_REPLY) && o->nat_addr == sv->nat_addr &&
	       o->nat_port == sv->nat_port;
}

/* snat_reusable: the SNAT reply entry o, of another flow, may be taken over
 * by a new flow (see DPC_SNAT_TRIES). Entries that are not SNAT reply
 * entries (e.g. the node's own connections) are never taken over. */
static __always_inline int snat_reusable(const struct ct_value *o, __u8 proto, __u64 now)
{
	return (o->flags & DPC_CT_SNAT_REPLY) && entry_stale(o, proto, now);
}

/* snat_pick finds a SNAT port for a flow (sk: its SNAT reply tuple, port
 * still unset; sv: its SNAT reply entry) and records the entry. It returns
 * the port, or 0 if every candidate is taken. */
static __always_inline __be16 snat_pick(const struct pkt *p, struct ct_key *sk,
					const struct ct_value *sv, __u64 now)
{
	struct ct_value *o;
	__be16 victim = 0, cand;
	__u64 victim_seen = 0;
	__u32 h = flow_hash(&p->tuple);
	int i;

	for (i = 0; i < DPC_SNAT_TRIES; i++) {
		cand = bpf_htons(DPC_SNAT_PORT_MIN + (h + i) % SNAT_PORTS);
		sk->dport = cand;
		o = bpf_map_lookup_elem(&dpc_conntrack, sk);
		if (!o) {
			if (bpf_map_update_elem(&dpc_conntrack, sk, sv, BPF_NOEXIST) == 0)
				return cand; /* free: the first choice */
			o = bpf_map_lookup_elem(&dpc_conntrack, sk); /* just taken */
			if (!o)
				continue;
		}
		if (snat_owned(o, sv)) {
			/* This flow's own, e.g. after a new SYN on its tuple. */
			touch(o, p, now);
			return cand;
		}
		if (snat_reusable(o, p->tuple.proto, now) &&
		    (!victim || o->last_seen_ns < victim_seen)) {
			victim = cand;
			victim_seen = o->last_seen_ns;
		}
	}
	if (!victim)
		return 0;

	/* No free port: take over the least recently seen reusable entry,
	 * unless a packet of its flow came meanwhile. */
	sk->dport = victim;
	o = bpf_map_lookup_elem(&dpc_conntrack, sk);
	if (o && !snat_reusable(o, p->tuple.proto, now))
		return 0;
	if (bpf_map_update_elem(&dpc_conntrack, sk, sv, BPF_ANY) < 0)
		return 0;
	return victim;
}

/* snat gives a NodePort flow that leaves the host interface towards a remote
 * backend the host IP as source, with a port from the SNAT range, so that
 * the backend's replies come back through this node. rev is the flow's reply
 * entry; the flow's SNAT reply entry (keyed by the backend -> host IP:port
 * tuple) is refreshed by the client's packets here, and by the backend's at
 * host ingress. */
static __always_inline int snat(struct __sk_buff *skb, struct pkt *p, struct ct_value *rev,
				__u64 now)
{
	__u32 zero = 0;
	struct config_value *cfg = bpf_map_lookup_elem(&dpc_config, &zero);
	struct ct_value sv = {
		.created_ns = now,
		.last_seen_ns = now,
		.flags = DPC_CT_SNAT_REPLY,
		.service_id = rev->service_id,
		.nat_addr = p->tuple.src,
		.nat_port = p->tuple.sport,
	};
	struct ct_key sk = {};
	struct ct_value *o;
	__be16 port;

	if (!cfg || !cfg->host_ip)
		return 0; /* no host IP known: leave the source alone */

	sk.src = p->tuple.dst;
	sk.dst = cfg->host_ip;
	sk.sport = p->tuple.dport;
	sk.proto = p->tuple.proto;

	if (rev->flags & DPC_CT_SNAT) {
		port = rev->snat_port;
		sk.dport = port;
		o = bpf_map_lookup_elem(&dpc_conntrack, &sk);
		if (o && snat_owned(o, &sv)) {
			touch(o, p, now); /* the client's FIN or RST closes it too */
			return rewrite(skb, p, 0, cfg->host_ip, port);
		}
		/* Evicted by the LRU: take the port again if it is still free. */
		if (!o && bpf_map_update_elem(&dpc_conntrack, &sk, &sv, BPF_NOEXIST) == 0)
			return rewrite(skb, p, 0, cfg->host_ip, port);
		/* The port went to another flow (this one was closing or idle).
		 * A late packet of this flow must not reach the backend on the
		 * other flow's tuple: drop it. A new SYN on this tuple starts a
		 * new flow, which picks a port afresh. */
		if (!is_syn(p))
			return -1;
		rev->flags &= ~DPC_CT_SNAT;
	}

	port = snat_pick(p, &sk, &sv, now);
	if (!port)
		return -1;
	rev->snat_port = port;
	rev->flags |= DPC_CT_SNAT;
	return rewrite(skb, p, 0, cfg->host_ip, port);
}

/* to_iface handles a packet leaving the node: on the host interface
 * (host != 0) or to a workload. */
static __always_inline int to_iface(struct __sk_buff *skb, int host)
{
	struct ct_key r = {};
	struct ct_value *ct;
	struct pkt p = {};
	__u64 now;

	if (parse(skb, &p) < 0)
		return TC_ACT_OK;

	now = bpf_ktime_get_ns();
	ct = bpf_map_lookup_elem(&dpc_conntrack, &p.tuple);
	if (ct) {
		touch(ct, &p, now);
		if ((ct->flags & (DPC_CT_REPLY | DPC_CT_DNAT)) == (DPC_CT_REPLY | DPC_CT_DNAT) &&
		    rewrite(skb, &p, 0, ct->nat_addr, ct->nat_port) < 0)
			return TC_ACT_SHOT;
		set_mark(skb, DPC_MARK_SEEN);
		return TC_ACT_OK;
	}

	/* The original direction of a DNAT flow is known by its reply entry. */
	reverse(&p.tuple, &r);
	ct = bpf_map_lookup_elem(&dpc_conntrack, &r);
	if (!ct || !(ct->flags & DPC_CT_REPLY)) {
		/* A fallthrough packet leaves only if Linux conntrack vouched for
		 * its flow in iptables: neither conntrack knows it otherwise. */
		if ((skb->mark & DPC_MARK_MASK) == DPC_MARK_FALLTHROUGH)
			return TC_ACT_SHOT;
		return TC_ACT_OK; /* not tracked here, e.g. from the host itself */
	}
	touch(ct, &p, now);
	if (host && (ct->flags & (DPC_CT_DNAT | DPC_CT_HOST_INGRESS)) ==
			    (DPC_CT_DNAT | DPC_CT_HOST_INGRESS) &&
	    snat(skb, &p, ct, now) < 0)
		return TC_ACT_SHOT;
	set_mark(skb, DPC_MARK_SEEN);
	return TC_ACT_OK;
}

/* endpoint returns the state of the workload behind this interface, or NULL
 * for an interface the datapath does not manage (left alone). */
static __always_inline struct endpoint_value *endpoint(struct __sk_buff *skb)
{
	__u32 ifindex = skb->ifindex;

	return bpf_map_lookup_elem(&dpc_endpoints, &ifindex);
}

SEC("tc")
int tc_host_ingress(struct __sk_buff *skb)
{
	return from_iface(skb, 1);
}

SEC("tc")
int tc_host_egress(struct __sk_buff *skb)
{
	return to_iface(skb, 1);
}

/* tc ingress of a workload's host-side interface: traffic from the workload. */
SEC("tc")
int tc_ep_ingress(struct __sk_buff *skb)
{
	struct endpoint_value *ep = endpoint(skb);
	struct iphdr ip;

	if (!ep)
		return TC_ACT_OK;
	if ((ep->flags & DPC_EP_ANTISPOOF) && skb->protocol == bpf_htons(ETH_P_IP)) {
		if (bpf_skb_load_bytes(skb, IP_OFF, &ip, sizeof(ip)) < 0 || ip.saddr != ep->pod_ip)
			return TC_ACT_SHOT;
	}
	return from_iface(skb, 0);
}

/* tc egress of a workload's host-side interface: traffic to the workload. */
SEC("tc")
int tc_ep_egress(struct __sk_buff *skb)
{
	if (!endpoint(skb))
		return TC_ACT_OK;
	return to_iface(skb, 0);
}
