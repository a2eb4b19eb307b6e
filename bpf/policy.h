/* SPDX-License-Identifier: (MIT OR GPL-2.0-only) */
/*
 * Network policy: the IP sets and the rules of each endpoint (see datapath.h),
 * and the verdict on a new flow, which it reports (verdicts.h).
 */
#ifndef DPC_POLICY_H
#define DPC_POLICY_H

#include "conntrack.h"
#include "verdicts.h"

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

/* in_ipset: addr is a member of the IP set set_id. The longest prefix of the
 * set that holds addr decides: an except entry carves its prefix out. */
static __always_inline int in_ipset(__u32 set_id, __be32 addr)
{
	struct ipset_key k = {
		.prefixlen = 64,
		.set_id = bpf_htonl(set_id),
		.addr = addr,
	};
	struct ipset_value *v = bpf_map_lookup_elem(&dpc_ipsets, &k);

	return v && !(v->flags & DPC_IPSET_EXCEPT);
}

/* What the search for a matching rule looks at, and its outcome. */
struct policy_match {
	struct policy_key key; /* the endpoint, direction and live slot */
	__be32 peer;
	__u16 dport;           /* host order, as in struct policy_rule */
	__u8 proto;
	__u8 allowed;
};

/* rule_matches is the body of the search, run by bpf_loop for the index-th
 * rule; it stops the loop at the first rule that matches. */
static long rule_matches(__u64 index, void *ctx)
{
	struct policy_match *m = ctx;
	struct policy_rule *r;

	m->key.index = index;
	r = bpf_map_lookup_elem(&dpc_policy, &m->key);
	if (!r)
		return 0; /* a live rule is never missing, unless written around the slots */
	if (r->proto && r->proto != m->proto)
		return 0;
	if ((r->port_min || r->port_max) && (m->dport < r->port_min || m->dport > r->port_max))
		return 0;
	if (r->set_id && !in_ipset(r->set_id, m->peer))
		return 0;
	m->allowed = 1;
	return 1;
}

/* policy_judge judges a new flow f in direction dir of the endpoint ep
 * (behind interface ifindex): it denies (returns 1) if the direction is
 * isolated and none of its live rules matches the peer (the source for
 * ingress, the destination for egress), the destination port and the
 * protocol. f is the flow as policy sees it: for egress, after service DNAT.
 * An allow on an isolated direction is reported (see verdicts.h), and a deny
 * if report_deny (a caller that drops a packet for another reason reports
 * that instead), so call it once per packet that starts a flow: a flow's
 * allow is reported once, each packet denied is.
 *
 * The rules are searched with bpf_loop (Linux 5.17+) rather than a bounded
 * loop: the verifier checks its body once, whereas it would walk a bounded
 * loop iteration by iteration, DPC_POLICY_RULES_MAX times at each of the
 * places that ask for a verdict, in both endpoint programs. */
static __always_inline int policy_judge(const struct endpoint_value *ep, __u32 ifindex, __u8 dir,
					const struct ct_key *f, int report_deny)
{
	/* The writer flips the flags, the slot and the counts in one update of
	 * the endpoint: read them once, together. */
	struct endpoint_value e = *ep;
	struct policy_match m = {
		.key = {.ifindex = ifindex, .dir = dir, .slot = e.policy_slot},
		.peer = dir == DPC_DIR_INGRESS ? f->src : f->dst,
		.dport = bpf_ntohs(f->dport),
		.proto = f->proto,
	};
	__u32 n;

	if (dir == DPC_DIR_INGRESS) {
		if (!(e.flags & DPC_EP_INGRESS_ISOLATED))
			return 0;
		n = e.ingress_rules;
	} else {
		if (!(e.flags & DPC_EP_EGRESS_ISOLATED))
			return 0;
		n = e.egress_rules;
	}
	if (n > DPC_POLICY_RULES_MAX)
		n = DPC_POLICY_RULES_MAX;
	bpf_loop(n, rule_matches, &m, 0);
	if (m.allowed) {
		report_verdict(f, ifindex, dir, DPC_VERDICT_ALLOW, DPC_REASON_RULE_MATCHED);
		return 0;
	}
	if (report_deny)
		report_verdict(f, ifindex, dir, DPC_VERDICT_DENY,
			       n ? DPC_REASON_NO_MATCH : DPC_REASON_NO_RULES);
	return 1;
}

/* policy_denies is policy_judge reporting its deny. */
static __always_inline int policy_denies(const struct endpoint_value *ep, __u32 ifindex, __u8 dir,
					 const struct ct_key *f)
{
	return policy_judge(ep, ifindex, dir, f, 1);
}

/* admit_mark notes on ct (keyed k) that its flow's destination admitted it
 * (DPC_CT_INGRESS_OK), and, where twin (a flow without NAT, whose entries are
 * each other's reverse), on the flow's other entry: the reply entry of an
 * original one, or the original of a reply entry. */
static __always_inline void admit_mark(const struct ct_key *k, struct ct_value *ct, int twin)
{
	struct ct_value *o;
	struct ct_key r = {};

	ct->flags |= DPC_CT_INGRESS_OK;
	ct_mirror(k, ct);
	if (!twin)
		return;
	reverse(k, &r);
	o = ct_lookup(&r);
	if (o && (o->flags & DPC_CT_REPLY) != (ct->flags & DPC_CT_REPLY)) {
		o->flags |= DPC_CT_INGRESS_OK;
		ct_mirror(&r, o);
	}
}

/* ingress_admit judges a packet in the original direction of its flow where
 * it reaches the endpoint ep: ct is the flow's entry found there (keyed k),
 * the original entry or, for a DNAT flow, the reply entry. A flow admitted
 * once is not judged again, whatever the policy becomes (as an ESTABLISHED
 * accept in iptables): ct and the flow's reply entry note it with
 * DPC_CT_INGRESS_OK, which the server's replies need if its ingress is
 * isolated. A flow to an endpoint that is not isolated is admitted too, so
 * that isolating it later cuts no flow. It returns 0 if the packet must be
 * dropped. */
static __always_inline int ingress_admit(const struct endpoint_value *ep, __u32 ifindex,
					 const struct pkt *p, const struct ct_key *k,
					 struct ct_value *ct)
{
	if (ct->flags & DPC_CT_INGRESS_OK)
		return 1;
	if (policy_denies(ep, ifindex, DPC_DIR_INGRESS, &p->tuple))
		return 0;
	/* An original entry is a flow without NAT: the replies match its
	 * reply entry. */
	admit_mark(k, ct, !(ct->flags & DPC_CT_REPLY));
	return 1;
}

/* reply_admit: ct, keyed by the tuple of p, is the reply entry of a flow to
 * the endpoint ep, whose ingress is isolated, and ep answers the flow though
 * its ingress never judged it: the flow's first packets reached ep before its
 * programs were attached (a pod that predates the datapath, as after a switch
 * from kube-proxy: its interface is not gated until the first round attaches
 * its programs). Its ingress policy judges the flow now, as its first packet
 * would have been judged: admitted, it goes on as any admitted flow; else ep's
 * reply is dropped, and reported as a reply on a flow not admitted. It
 * returns 0 if the packet must be dropped. */
static __always_inline int reply_admit(const struct endpoint_value *ep, __u32 ifindex,
				       const struct pkt *p, struct ct_value *ct)
{
	struct ct_key o = {};

	reverse(&p->tuple, &o);
	if (policy_judge(ep, ifindex, DPC_DIR_INGRESS, &o, 0)) {
		report_verdict(&p->tuple, ifindex, DPC_DIR_INGRESS, DPC_VERDICT_DENY,
			       DPC_REASON_NOT_ADMITTED);
		return 0;
	}
	/* No NAT: ep's tc egress finds the flow by its original entry. */
	admit_mark(&p->tuple, ct, !(ct->flags & DPC_CT_DNAT));
	return 1;
}

/* ingress_restart: a bare SYN restarts the flow of the original entry ct
 * (keyed k), and its destination judges the new flow afresh. */
static __always_inline void ingress_restart(const struct ct_key *k, struct ct_value *ct)
{
	struct ct_value *rev;
	struct ct_key r = {};

	ct->flags &= ~DPC_CT_INGRESS_OK;
	reply_key(k, ct, &r);
	ct_mirror(k, ct);
	rev = ct_lookup(&r);
	if (rev && (rev->flags & DPC_CT_REPLY) && (rev->flags & DPC_CT_INGRESS_OK)) {
		rev->flags &= ~DPC_CT_INGRESS_OK;
		ct_mirror(&r, rev);
	}
}

#endif /* DPC_POLICY_H */
