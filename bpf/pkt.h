/* SPDX-License-Identifier: (MIT OR GPL-2.0-only) */
/*
 * Packets as the datapath sees them: parsing IPv4 TCP and UDP, marking, and
 * rewriting addresses and ports with their checksums.
 */
#ifndef DPC_PKT_H
#define DPC_PKT_H

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <stddef.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

#include "datapath.h"

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
#define NS_PER_MS    1000000ULL
#define NS_PER_SEC   1000000000ULL

struct pkt {
	struct ct_key tuple;
	__u32 l4_off;
	__u32 len; /* skb->len: what format 2's byte counters add */
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
	p->len = skb->len;
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


#endif /* DPC_PKT_H */
