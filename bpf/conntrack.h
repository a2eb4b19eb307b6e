/* SPDX-License-Identifier: (MIT OR GPL-2.0-only) */
/*
 * Conntrack: one entry per direction of a flow (see struct ct_key), noting
 * when each was last seen and whether its flow is closing.
 */
#ifndef DPC_CONNTRACK_H
#define DPC_CONNTRACK_H

#include "pkt.h"

/* max_entries is set by the loader (Options.ConntrackSize), and so is the
 * pin name, which carries the format (datapath.h). */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, struct ct_key);
	__type(value, struct ct_value);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} dpc_conntrack SEC(".maps");

/*
 * The previous conntrack map, while its entries are migrated into this one
 * (a resize, or a change of format): slot 0 of the outer map of its format
 * holds it, and is empty otherwise. The loader puts it there before the
 * programs are attached, and the agent empties the slot once it has copied
 * every entry into dpc_conntrack, after the programs are attached. Until
 * then a lookup that misses dpc_conntrack takes the entry from the previous
 * map (ct_lookup): what the old programs wrote there up to the moment they
 * were replaced, on whatever hook, is found by the new ones. Not pinned: the
 * slots belong to the programs of one load.
 */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY_OF_MAPS);
	__uint(max_entries, 1);
	__type(key, __u32);
	__array(values, struct {
		__uint(type, BPF_MAP_TYPE_LRU_HASH);
		__uint(max_entries, 1);
		__type(key, struct ct_key);
		/* The bytes of struct ct_value_v1: the BTF of a struct
		 * this deep in a map definition would be a mere
		 * forward declaration, of no size. */
		__type(value, __u8[sizeof(struct ct_value_v1)]);
	});
} dpc_ct_prev_v1 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY_OF_MAPS);
	__uint(max_entries, 1);
	__type(key, __u32);
	__array(values, struct {
		__uint(type, BPF_MAP_TYPE_LRU_HASH);
		__uint(max_entries, 1);
		__type(key, struct ct_key);
		__type(value, __u8[sizeof(struct ct_value_v2)]);
	});
} dpc_ct_prev_v2 SEC(".maps");

/* ct_convert_v1 and ct_convert_v2 fill an entry of this object's format from
 * one of format 1 or 2, field by field; counters a format lacks start at 0.
 * bpf.ConvertConntrack is the same conversion, for the agent's copy. */
static __always_inline void ct_convert_v1(struct ct_value *v, const struct ct_value_v1 *o)
{
	v->created_ns = o->created_ns;
	v->last_seen_ns = o->last_seen_ns;
	v->flags = o->flags;
	v->service_id = o->service_id;
	v->nat_addr = o->nat_addr;
	v->nat_port = o->nat_port;
	v->snat_port = o->snat_port;
}

static __always_inline void ct_convert_v2(struct ct_value *v, const struct ct_value_v2 *o)
{
	v->created_ns = o->created_ns;
	v->last_seen_ns = o->last_seen_ns;
#if DPC_CT_FORMAT == 2
	v->packets = o->packets;
	v->bytes = o->bytes;
#endif
	v->flags = o->flags;
	v->service_id = o->service_id;
	v->nat_addr = o->nat_addr;
	v->nat_port = o->nat_port;
	v->snat_port = o->snat_port;
}

/* ct_adopt takes the entry of k, which dpc_conntrack lacks, from a previous
 * map being migrated, converted to this object's format, and returns it as
 * dpc_conntrack holds it now; NULL if no previous map has it. */
static __always_inline struct ct_value *ct_adopt(const struct ct_key *k)
{
	struct ct_value v = {};
	const struct ct_value_v1 *o1;
	const struct ct_value_v2 *o2;
	__u32 zero = 0;
	void *prev;

	prev = bpf_map_lookup_elem(&dpc_ct_prev_v1, &zero);
	if (prev && (o1 = bpf_map_lookup_elem(prev, k))) {
		ct_convert_v1(&v, o1);
	} else {
		prev = bpf_map_lookup_elem(&dpc_ct_prev_v2, &zero);
		if (!prev || !(o2 = bpf_map_lookup_elem(prev, k)))
			return NULL;
		ct_convert_v2(&v, o2);
	}
	/* Another CPU may have adopted it (or a new flow taken the tuple)
	 * meanwhile: what dpc_conntrack holds wins. */
	bpf_map_update_elem(&dpc_conntrack, k, &v, BPF_NOEXIST);
	return bpf_map_lookup_elem(&dpc_conntrack, k);
}

/* ct_to_v1 and ct_to_v2 write an entry of this object's format in format 1
 * or 2, for a previous map (ct_mirror). */
static __always_inline void ct_to_v1(struct ct_value_v1 *o, const struct ct_value *v)
{
	o->created_ns = v->created_ns;
	o->last_seen_ns = v->last_seen_ns;
	o->flags = v->flags;
	o->service_id = v->service_id;
	o->nat_addr = v->nat_addr;
	o->nat_port = v->nat_port;
	o->snat_port = v->snat_port;
}

static __always_inline void ct_to_v2(struct ct_value_v2 *o, const struct ct_value *v)
{
	o->created_ns = v->created_ns;
	o->last_seen_ns = v->last_seen_ns;
#if DPC_CT_FORMAT == 2
	o->packets = v->packets;
	o->bytes = v->bytes;
#endif
	o->flags = v->flags;
	o->service_id = v->service_id;
	o->nat_addr = v->nat_addr;
	o->nat_port = v->nat_port;
	o->snat_port = v->snat_port;
}

/* A fault switch of the reference's self-test ("no-ct-mirror",
 * bpf.Options.NoCTMirror), set at load time; while it is 0 the verifier
 * prunes the fault's code. With it, ct_mirror writes nothing: a flow a new
 * program opens while an old program still runs on another hook is unknown
 * to that old program (a SYN-ACK leaves unNATed). */
volatile const __u32 dpc_fault_no_ct_mirror = 0;

/* ct_mirror writes the entry v of k, as a program of this load has just
 * created or changed it in dpc_conntrack, into the previous map too while
 * one is in its slot, in that map's format. The previous run's programs may
 * still run on the hooks not replaced yet, and look only there: a flow one
 * hook's new program opens (its NAT, its SNAT port, its admission by policy)
 * must be what the next hook's old program finds, or a SYN-ACK leaves
 * unNATed. Only creations and the changes another hook reads are mirrored;
 * when each packet was last seen, and whether the flow is closing, are not. */
static __always_inline void ct_mirror(const struct ct_key *k, const struct ct_value *v)
{
	struct ct_value_v1 o1 = {};
	struct ct_value_v2 o2 = {};
	__u32 zero = 0;
	void *prev;

	if (dpc_fault_no_ct_mirror)
		return;
	prev = bpf_map_lookup_elem(&dpc_ct_prev_v1, &zero);
	if (prev) {
		ct_to_v1(&o1, v);
		bpf_map_update_elem(prev, k, &o1, BPF_ANY);
	}
	prev = bpf_map_lookup_elem(&dpc_ct_prev_v2, &zero);
	if (prev) {
		ct_to_v2(&o2, v);
		bpf_map_update_elem(prev, k, &o2, BPF_ANY);
	}
}

/* ct_lookup returns the conntrack entry of k, from a previous map being
 * migrated if dpc_conntrack does not have it yet. Every lookup of the
 * datapath goes through it. */
static __always_inline struct ct_value *ct_lookup(const struct ct_key *k)
{
	struct ct_value *v = bpf_map_lookup_elem(&dpc_conntrack, k);

	return v ? v : ct_adopt(k);
}

/* ct_delete deletes the entry of k, from a previous map being migrated too,
 * so that it is not adopted again. */
static __always_inline void ct_delete(const struct ct_key *k)
{
	__u32 zero = 0;
	void *prev;

	bpf_map_delete_elem(&dpc_conntrack, k);
	prev = bpf_map_lookup_elem(&dpc_ct_prev_v1, &zero);
	if (prev)
		bpf_map_delete_elem(prev, k);
	prev = bpf_map_lookup_elem(&dpc_ct_prev_v2, &zero);
	if (prev)
		bpf_map_delete_elem(prev, k);
}

/*
 * The agent's copy of a previous map (Datapath.MigrateConntrack) runs in the
 * kernel, a chunk at a time: the agent reads up to DPC_CT_MIGRATE_CHUNK
 * entries of the previous map (a batch lookup), writes them into
 * dpc_ct_staging (mapped into its memory), and runs dpc_ct_migrate, which writes each into
 * dpc_conntrack, converted, only if dpc_conntrack lacks its tuple
 * (BPF_NOEXIST, which no batch update of user space can ask for): an entry
 * the programs adopted, mirrored or created since their load is newer than
 * the previous map's. A chunk, because a program runs with bottom halves
 * off: the whole copy of a million entries in one run (bpf_for_each_map_elem)
 * held a CPU for half a second, a probe starved for 570 ms and a stream
 * stalled 201 ms.
 */
#define DPC_CT_MIGRATE_CHUNK 16384

/* An entry of the previous map, as the agent stages it: the value in the
 * previous map's format, format 1's in the first 32 bytes. */
struct ct_staged {
	struct ct_key key;
	__u8 value[sizeof(struct ct_value_v2)];
};

/* Mapped into the agent's memory, which writes a chunk there in one copy. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, DPC_CT_MIGRATE_CHUNK);
	__uint(map_flags, BPF_F_MMAPABLE);
	__type(key, __u32);
	__type(value, struct ct_staged);
} dpc_ct_staging SEC(".maps");

struct ct_migration {
	__u64 copied;  /* entries dpc_conntrack lacked, copied */
	__u64 present; /* entries dpc_conntrack had already */
	__u64 failed;  /* entries an update refused otherwise */
};

/* ct_copy is the context of a chunk's copy: the staged entries' format, and
 * the counts. */
struct ct_copy {
	__u32 format;
	struct ct_migration m;
};

static long ct_copy_one(__u32 i, struct ct_copy *c)
{
	struct ct_value v = {};
	struct ct_staged *s = bpf_map_lookup_elem(&dpc_ct_staging, &i);
	long err;

	if (!s)
		return 0;
	if (c->format == 1)
		ct_convert_v1(&v, (const struct ct_value_v1 *)s->value);
	else
		ct_convert_v2(&v, (const struct ct_value_v2 *)s->value);
	err = bpf_map_update_elem(&dpc_conntrack, &s->key, &v, BPF_NOEXIST);
	if (!err)
		c->m.copied++;
	else if (err == -EEXIST)
		c->m.present++;
	else
		c->m.failed++;
	return 0;
}

/* touch notes a packet on the conntrack entry it matched: when it was seen,
 * and whether it closes (TCP FIN or RST) or restarts (a bare SYN) the flow.
 * A restart ends what was said of the flow before it: that it was closing,
 * and that its backend had gone (the SYN picks a backend again; if it picks
 * the same one, back in its service, the entry stays as it is and must not
 * answer the new flow's handshake with a RST). Format 2 counts it too. */
static __always_inline void touch(struct ct_value *ct, const struct pkt *p, __u64 now)
{
	ct->last_seen_ns = now;
#if DPC_CT_FORMAT == 2
	__sync_fetch_and_add(&ct->packets, 1);
	__sync_fetch_and_add(&ct->bytes, p->len);
#endif
	if (p->tuple.proto != IPPROTO_TCP)
		return;
	if (p->tcp_flags & (TH_FIN | TH_RST)) {
		if (!(ct->flags & DPC_CT_CLOSING))
			ct->flags |= DPC_CT_CLOSING;
	} else if (is_syn(p) && (ct->flags & (DPC_CT_CLOSING | DPC_CT_BACKEND_GONE))) {
		ct->flags &= ~(DPC_CT_CLOSING | DPC_CT_BACKEND_GONE);
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

/* reply_key: the key of the reply entry of the flow whose original entry ct
 * is keyed k: from its backend if DNATed, to its source port on the wire. */
static __always_inline void reply_key(const struct ct_key *k, const struct ct_value *ct,
				      struct ct_key *r)
{
	reverse(k, r);
	if (ct->flags & DPC_CT_DNAT) {
		r->src = ct->nat_addr;
		r->sport = ct->nat_port;
	}
	if (ct->flags & DPC_CT_PORT_MOVED)
		r->dport = ct->snat_port;
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

/* entry_live: o, an entry found (or NULL), belongs to a flow that lives: one
 * that is neither closing nor over. */
static __always_inline int entry_live(const struct ct_value *o, __u8 proto, __u64 now)
{
	return o && !(o->flags & DPC_CT_CLOSING) && !entry_stale(o, proto, now);
}

/* put_plain records v under k unless o, the entry found under k (or NULL),
 * belongs to a live flow: a tuple may be the reply of a NAT flow still in use
 * (that one wins), or of one that is closing or over (a client reuses source
 * ports at once: the old entry must not hijack the new flow's replies, so the
 * new flow takes the tuple over, as Linux conntrack gives way to a new SYN on
 * a tuple in TIME_WAIT). */
static __always_inline void put_plain(const struct ct_key *k, const struct ct_value *o,
				      const struct ct_value *v, __u64 now)
{
	if (entry_live(o, k->proto, now))
		return;
	if (bpf_map_update_elem(&dpc_conntrack, k, v, BPF_ANY) == 0)
		ct_mirror(k, v);
}

/* Candidate ports of a moved flow (DPC_CT_PORT_MOVED) and of a NodePort SNAT. */
#define SNAT_PORTS (DPC_SNAT_PORT_MAX - DPC_SNAT_PORT_MIN + 1)

/* reply_held: r, the reply tuple of a new flow from a workload, is held by
 * another flow that lives, o the entry found under it (or NULL; as put_plain
 * judges it: a closing flow gives way): writing the new flow's reply entry rv
 * over it would turn that flow's replies into the new one's. An entry of the
 * same flow (its client restarts it) is not another's. */
static __always_inline int reply_held(const struct ct_key *r, const struct ct_value *o,
				      const struct ct_value *rv, __u64 now)
{
	if (!entry_live(o, r->proto, now))
		return 0;
	return !((o->flags & DPC_CT_REPLY) && !(o->flags & DPC_CT_PORT_MOVED) &&
		 (o->flags & DPC_CT_DNAT) == (rv->flags & DPC_CT_DNAT) &&
		 o->nat_addr == rv->nat_addr && o->nat_port == rv->nat_port);
}

/* move_port finds another source port for the flow keyed k, whose reply tuple
 * r is held (reply_held), and records rv, the flow's reply entry, under it (in
 * r's dport): the first candidate, from a hash of k, that is free or whose
 * entry is stale. It returns the port, or 0 if every candidate is taken. */
static __always_inline __be16 move_port(const struct ct_key *k, struct ct_key *r,
					const struct ct_value *rv, __u64 now)
{
	__u32 h = flow_hash(k);
	struct ct_value *o;
	__be16 cand;
	int i;

	for (i = 0; i < DPC_SNAT_TRIES; i++) {
		cand = bpf_htons(DPC_SNAT_PORT_MIN + (h + i) % SNAT_PORTS);
		r->dport = cand;
		o = ct_lookup(r);
		if (o && !entry_stale(o, r->proto, now))
			continue;
		if (bpf_map_update_elem(&dpc_conntrack, r, rv, o ? BPF_ANY : BPF_NOEXIST) == 0) {
			ct_mirror(r, rv);
			return cand;
		}
	}
	return 0;
}

/* track_both records rv, the reply entry of a new flow keyed k (r: its
 * reply tuple), and v, its original entry. A flow from a workload whose reply
 * tuple another live flow holds gets another source port (DPC_CT_PORT_MOVED),
 * set in *sport; else *sport is k's. It returns -1 if no entry could be
 * written or no port was free. */
static __always_inline int track_both(const struct ct_key *k, struct ct_value *v,
				      struct ct_key *r, struct ct_value *rv, int from_pod,
				      __u64 now, __be16 *sport)
{
	struct ct_value *o = NULL; /* the entry under r, where it is needed */

	*sport = k->sport;
	if (from_pod || !(rv->flags & DPC_CT_DNAT))
		o = ct_lookup(r);
	if (from_pod && reply_held(r, o, rv, now)) {
		rv->flags |= DPC_CT_PORT_MOVED;
		rv->snat_port = k->sport;
		*sport = move_port(k, r, rv, now);
		if (!*sport)
			return -1;
		v->flags |= DPC_CT_PORT_MOVED;
		v->snat_port = *sport;
	} else if (rv->flags & DPC_CT_DNAT) {
		/* A new SYN for the tuple starts a new flow: older entries go. */
		if (bpf_map_update_elem(&dpc_conntrack, r, rv, BPF_ANY) < 0)
			return -1;
		ct_mirror(r, rv);
	} else {
		put_plain(r, o, rv, now);
	}
	if (!(v->flags & DPC_CT_DNAT)) {
		/* Only track_plain gets here, for a tuple its caller found no
		 * entry under: an entry there now is another CPU's, written
		 * since, of a flow that lives. BPF_NOEXIST keeps it, as
		 * put_plain would, without looking the tuple up again. */
		if (bpf_map_update_elem(&dpc_conntrack, k, v, BPF_NOEXIST) == 0)
			ct_mirror(k, v);
		return 0;
	}
	if (bpf_map_update_elem(&dpc_conntrack, k, v, BPF_ANY) < 0)
		return -1;
	ct_mirror(k, v);
	return 0;
}

/* track_plain records a flow that needs no NAT, keyed k, under which its
 * caller found no entry, in both directions (see track_both for from_pod and
 * *sport). */
static __always_inline int track_plain(const struct ct_key *k, __u32 flags, int from_pod,
				       __u64 now, __be16 *sport)
{
	struct ct_value v = {
		.created_ns = now,
		.last_seen_ns = now,
		.flags = flags,
	};
	struct ct_value rv = v;
	struct ct_key r = {};

	reverse(k, &r);
	rv.flags |= DPC_CT_REPLY;
	return track_both(k, &v, &r, &rv, from_pod, now, sport);
}

#endif /* DPC_CONNTRACK_H */
