/* SPDX-License-Identifier: (MIT OR GPL-2.0-only) */
/*
 * NodePort SNAT: the source (host IP, port) of NodePort traffic that leaves
 * the host interface again towards a remote backend.
 */
#ifndef DPC_SNAT_H
#define DPC_SNAT_H

#include "conntrack.h"

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct config_value);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} dpc_config SEC(".maps");

/* A fault switch of the reference's self-test ("snat-port-unchecked",
 * bpf.Options.SNATPortUnchecked), set at load time; while it is 0 the
 * verifier prunes the fault's code. With it, a new flow that finds none of
 * its candidates free takes over the first one without checking that the
 * flow holding it is over: under port pressure it steals live flows' ports. */
volatile const __u32 dpc_fault_snat_port_unchecked = 0;

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
	return (o->flags & (DPC_CT_SNAT_REPLY | DPC_CT_FOREIGN)) && entry_stale(o, proto, now);
}

/* track_foreign records k, the tuple of a packet at host ingress that falls
 * through (a flow the datapath does not know), as DPC_CT_FOREIGN if it goes to
 * a port of the SNAT range: the stack NATed its flow there, and a SNAT of ours
 * must not take the port while it lives. */
static __always_inline void track_foreign(const struct ct_key *k, __u64 now)
{
	struct ct_value v = {
		.created_ns = now,
		.last_seen_ns = now,
		.flags = DPC_CT_FOREIGN,
	};
	__u16 port = bpf_ntohs(k->dport);

	if (port < DPC_SNAT_PORT_MIN || port > DPC_SNAT_PORT_MAX)
		return;
	if (bpf_map_update_elem(&dpc_conntrack, k, &v, BPF_NOEXIST) == 0)
		ct_mirror(k, &v);
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
		o = ct_lookup(sk);
		if (!o) {
			if (bpf_map_update_elem(&dpc_conntrack, sk, sv, BPF_NOEXIST) == 0) {
				ct_mirror(sk, sv);
				return cand; /* free: the first choice */
			}
			o = bpf_map_lookup_elem(&dpc_conntrack, sk); /* just taken */
			if (!o)
				continue;
		}
		if (snat_owned(o, sv)) {
			/* This flow's own, e.g. after a new SYN on its tuple. */
			touch(o, p, now);
			return cand;
		}
		if (dpc_fault_snat_port_unchecked) {
			if (!victim)
				victim = cand; /* the fault: live or not */
			continue;
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
	o = ct_lookup(sk);
	if (o && !dpc_fault_snat_port_unchecked && !snat_reusable(o, p->tuple.proto, now))
		return 0;
	if (bpf_map_update_elem(&dpc_conntrack, sk, sv, BPF_ANY) < 0)
		return 0;
	ct_mirror(sk, sv);
	return victim;
}

/* snat gives a NodePort flow that leaves the host interface towards a remote
 * backend the host IP as source, with a port from the SNAT range, so that
 * the backend's replies come back through this node. rev is the flow's reply
 * entry (keyed rk); the flow's SNAT reply entry (keyed by the backend -> host
 * IP:port tuple) is refreshed by the client's packets here, and by the
 * backend's at host ingress. */
static __always_inline int snat(struct __sk_buff *skb, struct pkt *p, const struct ct_key *rk,
				struct ct_value *rev, __u64 now)
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
		o = ct_lookup(&sk);
		if (o && snat_owned(o, &sv)) {
			touch(o, p, now); /* the client's FIN or RST closes it too */
			return rewrite(skb, p, 0, cfg->host_ip, port);
		}
		/* Evicted by the LRU: take the port again if it is still free. */
		if (!o && bpf_map_update_elem(&dpc_conntrack, &sk, &sv, BPF_NOEXIST) == 0) {
			ct_mirror(&sk, &sv);
			return rewrite(skb, p, 0, cfg->host_ip, port);
		}
		/* The port went to another flow (this one was closing or idle).
		 * A late packet of this flow must not reach the backend on the
		 * other flow's tuple: drop it. A new SYN on this tuple starts a
		 * new flow, which picks a port afresh. */
		if (!is_syn(p))
			return -1;
		rev->flags &= ~DPC_CT_SNAT;
	}

	port = snat_pick(p, &sk, &sv, now);
	if (!port) {
		ct_mirror(rk, rev);
		return -1;
	}
	rev->snat_port = port;
	rev->flags |= DPC_CT_SNAT;
	ct_mirror(rk, rev);
	return rewrite(skb, p, 0, cfg->host_ip, port);
}

#endif /* DPC_SNAT_H */
