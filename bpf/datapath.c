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
 *
 * Each concept has its header: pkt.h (parsing and rewriting), conntrack.h,
 * nat.h (DNAT to service backends), snat.h (NodePort SNAT), policy.h
 * (network policy) and verdicts.h (the verdicts policy reports); this file
 * holds the programs, which tie them together.
 * bpf2go builds it into one object.
 */
#include <linux/bpf.h>
#include <linux/pkt_cls.h>
#include <linux/tcp.h>
#include <linux/errno.h>
#include <bpf/bpf_helpers.h>

#include "datapath.h"
#include "pkt.h"
#include "conntrack.h"
#include "nat.h"
#include "snat.h"
#include "policy.h"
#include "verdicts.h"

char __license[] SEC("license") = "Dual MIT/GPL";

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, DPC_ENDPOINTS_MAX);
	__type(key, __u32);
	__type(value, struct endpoint_value);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} dpc_endpoints SEC(".maps");

static __always_inline __u16 csum_fold(__s64 sum)
{
	sum = (sum & 0xffff) + (sum >> 16);
	sum = (sum & 0xffff) + (sum >> 16);
	return (__u16)~sum;
}

/* reset_gone answers p, a client's packet on a TCP flow whose backend has gone
 * (DPC_CT_BACKEND_GONE on its original entry ct), with a RST|ACK from the
 * frontend it sent to, back out of the interface it came in on, and forgets
 * the flow. The RST's sequence number is the one the client acknowledged, so
 * its stack takes it as in window. The packet is rewritten in place: MACs,
 * addresses and ports swapped, payload and TCP options trimmed, both
 * checksums computed afresh (whatever the skb's checksum state: a veth's
 * CHECKSUM_PARTIAL skb reaches the pod, which trusts it, with a complete
 * checksum in place). A RST from the client (or a packet with IP options) is
 * only dropped, the flow forgotten all the same. */
static __always_inline int reset_gone(struct __sk_buff *skb, const struct pkt *p,
				      const struct ct_value *ct)
{
	struct ethhdr in_eth, eth = {};
	struct iphdr in_ip, ip = {};
	struct tcphdr in_th, th = {};
	struct {
		__be32 src;
		__be32 dst;
		__u8 zero;
		__u8 proto;
		__be16 len;
	} pseudo = {};
	struct ct_key r = {};
	__u32 payload;
	__s64 sum;

	reply_key(&p->tuple, ct, &r);
	ct_delete(&p->tuple);
	ct_delete(&r);
	if (p->l4_off != IP_OFF + sizeof(struct iphdr) || (p->tcp_flags & TH_RST))
		return TC_ACT_SHOT;
	if (bpf_skb_load_bytes(skb, 0, &in_eth, sizeof(in_eth)) < 0 ||
	    bpf_skb_load_bytes(skb, IP_OFF, &in_ip, sizeof(in_ip)) < 0 ||
	    bpf_skb_load_bytes(skb, p->l4_off, &in_th, sizeof(in_th)) < 0)
		return TC_ACT_SHOT;
	payload = bpf_ntohs(in_ip.tot_len);
	if (payload < sizeof(in_ip) + in_th.doff * 4)
		return TC_ACT_SHOT;
	payload -= sizeof(in_ip) + in_th.doff * 4;

	__builtin_memcpy(eth.h_dest, in_eth.h_source, ETH_ALEN);
	__builtin_memcpy(eth.h_source, in_eth.h_dest, ETH_ALEN);
	eth.h_proto = in_eth.h_proto;

	ip.version = 4;
	ip.ihl = 5;
	ip.tot_len = bpf_htons(sizeof(ip) + sizeof(th));
	ip.frag_off = bpf_htons(0x4000); /* DF */
	ip.ttl = 64;
	ip.protocol = IPPROTO_TCP;
	ip.saddr = p->tuple.dst;
	ip.daddr = p->tuple.src;
	ip.check = csum_fold(bpf_csum_diff(NULL, 0, (__be32 *)&ip, sizeof(ip), 0));

	th.source = p->tuple.dport;
	th.dest = p->tuple.sport;
	if (in_th.ack)
		th.seq = in_th.ack_seq;
	th.ack_seq = bpf_htonl(bpf_ntohl(in_th.seq) + payload + in_th.syn + in_th.fin);
	th.doff = sizeof(th) / 4;
	th.rst = 1;
	th.ack = 1;
	pseudo.src = ip.saddr;
	pseudo.dst = ip.daddr;
	pseudo.proto = IPPROTO_TCP;
	pseudo.len = bpf_htons(sizeof(th));
	sum = bpf_csum_diff(NULL, 0, (__be32 *)&pseudo, sizeof(pseudo), 0);
	sum = bpf_csum_diff(NULL, 0, (__be32 *)&th, sizeof(th), sum);
	th.check = csum_fold(sum);

	if (bpf_skb_change_tail(skb, sizeof(eth) + sizeof(ip) + sizeof(th), 0) < 0)
		return TC_ACT_SHOT;
	if (bpf_skb_store_bytes(skb, 0, &eth, sizeof(eth), 0) < 0 ||
	    bpf_skb_store_bytes(skb, IP_OFF, &ip, sizeof(ip), 0) < 0 ||
	    bpf_skb_store_bytes(skb, IP_OFF + sizeof(ip), &th, sizeof(th), BPF_F_INVALIDATE_HASH) < 0)
		return TC_ACT_SHOT;
	set_mark(skb, 0);
	return bpf_redirect(skb->ifindex, 0);
}

/* wire_sport gives p the source port its flow has on the wire: that of ct, the
 * flow's original entry where the flow is known and was moved off its client's
 * port (DPC_CT_PORT_MOVED), else sport (track_both's for a new flow, the
 * client's own otherwise). It returns -1 if the rewrite fails. */
static __always_inline int wire_sport(struct __sk_buff *skb, struct pkt *p,
				      const struct ct_value *ct, __be16 sport)
{
	if (ct && (ct->flags & DPC_CT_PORT_MOVED))
		sport = ct->snat_port;
	return rewrite(skb, p, 0, p->tuple.src, sport);
}

/* from_iface handles a packet entering the node: on the host interface
 * (ep == NULL) or from the workload ep, whose egress policy judges the new
 * flows it opens. */
static __always_inline int from_iface(struct __sk_buff *skb, const struct endpoint_value *ep)
{
	struct frontend_key fk = {};
	struct frontend_value *fe;
	struct backend_key bk = {};
	struct backend_value *be;
	struct ct_value *ct;
	struct pkt p = {};
	int host = !ep;
	__u32 flags = host ? DPC_CT_HOST_INGRESS : 0;
	__be16 sport; /* the source port on the wire (DPC_CT_PORT_MOVED) */
	__u64 now;

	if (parse(skb, &p) < 0)
		return TC_ACT_OK;

	sport = p.tuple.sport;
	now = bpf_ktime_get_ns();
	ct = ct_lookup(&p.tuple);
	if (ct) {
		touch(ct, &p, now);
		if (ct->flags & DPC_CT_FOREIGN) {
			set_mark(skb, DPC_MARK_FALLTHROUGH);
			return TC_ACT_OK;
		}
		if (ct->flags & DPC_CT_SNAT_REPLY) {
			/* A reply to our SNAT: back to the client. Its source
			 * (the backend) is restored at host egress. */
			if (host && rewrite(skb, &p, 1, ct->nat_addr, ct->nat_port) < 0)
				return TC_ACT_SHOT;
			set_mark(skb, DPC_MARK_SEEN);
			return TC_ACT_OK;
		}
		if (ct->flags & DPC_CT_REPLY) {
			/* A workload whose ingress is isolated answers only
			 * the flows its policy admits. */
			if (ep && (ep->flags & DPC_EP_INGRESS_ISOLATED) &&
			    !(ct->flags & DPC_CT_INGRESS_OK) &&
			    !reply_admit(ep, skb->ifindex, &p, ct))
				return TC_ACT_SHOT;
			/* Reverse DNAT happens where the reply leaves. */
			set_mark(skb, DPC_MARK_SEEN);
			return TC_ACT_OK;
		}
		if (!is_syn(&p)) {
			/* Only a pod's flows: a RST out of the host
			 * interface would need a route back. */
			if (ep && (ct->flags & DPC_CT_BACKEND_GONE) &&
			    p.tuple.proto == IPPROTO_TCP)
				return reset_gone(skb, &p, ct);
			if ((ct->flags & DPC_CT_DNAT) &&
			    rewrite(skb, &p, 1, ct->nat_addr, ct->nat_port) < 0)
				return TC_ACT_SHOT;
			if (wire_sport(skb, &p, ct, sport) < 0)
				return TC_ACT_SHOT;
			set_mark(skb, DPC_MARK_SEEN);
			return TC_ACT_OK;
		}
		/* A SYN on a known tuple: re-check the service below, so a
		 * reused tuple does not stick to a backend that has gone. If
		 * the backend stays, so do the entries (and the SNAT port,
		 * which snat checks is still the flow's own). Policy judges
		 * the new flow afresh, at both ends. */
		ingress_restart(&p.tuple, ct);
	}

	fk.addr = p.tuple.dst;
	fk.port = p.tuple.dport;
	fk.proto = p.tuple.proto;
	fe = bpf_map_lookup_elem(&dpc_frontends, &fk);
	if (!fe) {
		if (!ct && is_tcp_midflow(&p)) {
			if (host)
				track_foreign(&p.tuple, now);
			set_mark(skb, DPC_MARK_FALLTHROUGH);
			return TC_ACT_OK;
		}
		/* A new flow without NAT, or a SYN that restarts one. */
		if (ep && policy_denies(ep, skb->ifindex, DPC_DIR_EGRESS, &p.tuple))
			return TC_ACT_SHOT;
		if (!ct && track_plain(&p.tuple, flags, !host, now, &sport) < 0)
			return TC_ACT_SHOT;
		if (wire_sport(skb, &p, ct, sport) < 0)
			return TC_ACT_SHOT;
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
	/* Policy sees the backend, not the frontend. */
	if (ep) {
		struct ct_key judged = p.tuple;

		judged.dst = be->addr;
		judged.dport = be->port;
		if (policy_denies(ep, skb->ifindex, DPC_DIR_EGRESS, &judged))
			return TC_ACT_SHOT;
	}
	if (!(ct && (ct->flags & DPC_CT_DNAT) && ct->nat_addr == be->addr &&
	      ct->nat_port == be->port)) {
		/* A new flow, or one whose backend went: new entries. */
		if (track_nat(&p.tuple, be, fe->service_id, flags, !host, now, &sport) < 0)
			return TC_ACT_SHOT;
		ct = NULL;
	}
	if (rewrite(skb, &p, 1, be->addr, be->port) < 0)
		return TC_ACT_SHOT;
	if (wire_sport(skb, &p, ct, sport) < 0)
		return TC_ACT_SHOT;
	set_mark(skb, DPC_MARK_SEEN);
	return TC_ACT_OK;
}
/* to_iface handles a packet leaving the node: on the host interface
 * (ep == NULL) or to the workload ep, whose ingress policy judges the flows
 * that reach it. */
static __always_inline int to_iface(struct __sk_buff *skb, const struct endpoint_value *ep)
{
	struct ct_key r = {};
	struct ct_value *ct;
	struct pkt p = {};
	int host = !ep;
	__u64 now;

	if (parse(skb, &p) < 0)
		return TC_ACT_OK;

	now = bpf_ktime_get_ns();
	ct = ct_lookup(&p.tuple);
	if (ct) {
		if (ep && !(ct->flags & DPC_CT_REPLY) &&
		    !ingress_admit(ep, skb->ifindex, &p, &p.tuple, ct))
			return TC_ACT_SHOT;
		touch(ct, &p, now);
		if ((ct->flags & (DPC_CT_REPLY | DPC_CT_DNAT)) == (DPC_CT_REPLY | DPC_CT_DNAT) &&
		    rewrite(skb, &p, 0, ct->nat_addr, ct->nat_port) < 0)
			return TC_ACT_SHOT;
		if ((ct->flags & (DPC_CT_REPLY | DPC_CT_PORT_MOVED)) ==
			    (DPC_CT_REPLY | DPC_CT_PORT_MOVED) &&
		    rewrite(skb, &p, 1, p.tuple.dst, ct->snat_port) < 0)
			return TC_ACT_SHOT;
		set_mark(skb, DPC_MARK_SEEN);
		return TC_ACT_OK;
	}

	/* The original direction of a DNAT flow is known by its reply entry. */
	reverse(&p.tuple, &r);
	ct = ct_lookup(&r);
	if (!ct || !(ct->flags & DPC_CT_REPLY)) {
		/* A fallthrough packet leaves only if Linux conntrack vouched for
		 * its flow in iptables: neither conntrack knows it otherwise. */
		if ((skb->mark & DPC_MARK_MASK) == DPC_MARK_FALLTHROUGH)
			return TC_ACT_SHOT;
		return TC_ACT_OK; /* not tracked here, e.g. from the host itself */
	}
	if (ep && !ingress_admit(ep, skb->ifindex, &p, &r, ct))
		return TC_ACT_SHOT;
	touch(ct, &p, now);
	if (host && (ct->flags & (DPC_CT_DNAT | DPC_CT_HOST_INGRESS)) ==
			    (DPC_CT_DNAT | DPC_CT_HOST_INGRESS) &&
	    snat(skb, &p, &r, ct, now) < 0)
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
	return from_iface(skb, NULL);
}

SEC("tc")
int tc_host_egress(struct __sk_buff *skb)
{
	return to_iface(skb, NULL);
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
	return from_iface(skb, ep);
}

/* tc egress of a workload's host-side interface: traffic to the workload. */
SEC("tc")
int tc_ep_egress(struct __sk_buff *skb)
{
	struct endpoint_value *ep = endpoint(skb);

	if (!ep)
		return TC_ACT_OK;
	return to_iface(skb, ep);
}

/* The counts of the last run of dpc_ct_migrate, for the agent to read. */
struct ct_migration dpc_ct_migration;

/* dpc_ct_migrate is not attached anywhere: the agent runs it (BPF_PROG_RUN,
 * on a dummy packet) to copy the skb->mark entries it staged in
 * dpc_ct_staging, of format skb->priority (1 or 2), into dpc_conntrack,
 * converted, keeping what dpc_conntrack has already (conntrack.h). Call it
 * once the programs of this load are attached to every hook. */
SEC("tc")
int dpc_ct_migrate(struct __sk_buff *skb)
{
	struct ct_copy c = { .format = skb->priority };
	__u32 n = skb->mark;

	if (n > DPC_CT_MIGRATE_CHUNK || (c.format != 1 && c.format != 2))
		return TC_ACT_SHOT;
	bpf_loop(n, ct_copy_one, &c, 0);
	dpc_ct_migration = c.m;
	return TC_ACT_OK;
}
