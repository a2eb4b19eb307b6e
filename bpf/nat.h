/* SPDX-License-Identifier: (MIT OR GPL-2.0-only) */
/*
 * Service DNAT: frontends, their backends, and the conntrack entries of a
 * DNAT flow.
 */
#ifndef DPC_NAT_H
#define DPC_NAT_H

#include "conntrack.h"

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

/* track_nat records a DNAT flow in both directions (replacing older entries:
 * a new SYN for the tuple starts a new flow); see track_both for from_pod and
 * *sport. */
static __always_inline int track_nat(const struct ct_key *k, const struct backend_value *be,
				     __u32 service_id, __u32 flags, int from_pod, __u64 now,
				     __be16 *sport)
{
	struct ct_value v = {
		.created_ns = now,
		.last_seen_ns = now,
		.flags = flags | DPC_CT_DNAT,
		.service_id = service_id,
		.nat_addr = be->addr,
		.nat_port = be->port,
	};
	struct ct_value rv = v;
	struct ct_key r = {
		.src = be->addr,
		.dst = k->src,
		.sport = be->port,
		.dport = k->sport,
		.proto = k->proto,
	};

	rv.flags |= DPC_CT_REPLY;
	rv.nat_addr = k->dst;
	rv.nat_port = k->dport;
	return track_both(k, &v, &r, &rv, from_pod, now, sport);
}

#endif /* DPC_NAT_H */
