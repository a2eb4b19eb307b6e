/* SPDX-License-Identifier: (MIT OR GPL-2.0-only) */
/*
 * Conntrack: one entry per direction of a flow (see struct ct_key), noting
 * when each was last seen and whether its flow is closing.
 */
#ifndef DPC_CONNTRACK_H
#define DPC_CONNTRACK_H

#include "pkt.h"

/* max_entries is set by the loader (Options.ConntrackSize). */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, struct ct_key);
	__type(value, struct ct_value);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} dpc_conntrack SEC(".maps");

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

#endif /* DPC_CONNTRACK_H */
