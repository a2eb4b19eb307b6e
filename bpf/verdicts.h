/* SPDX-License-Identifier: (MIT OR GPL-2.0-only) */
/*
 * Policy verdicts (flow logs): a ring buffer of struct verdict_event (see
 * datapath.h) that user space drains, and a count of the verdicts that did
 * not fit. Both are pinned, so the programs keep reporting while no agent
 * runs, and a reader in another process finds them.
 */
#ifndef DPC_VERDICTS_H
#define DPC_VERDICTS_H

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#include "datapath.h"

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, DPC_VERDICTS_SIZE);
	/* A ring buffer has no value size: the type documents its records,
	 * and puts them in the object's BTF (the loader ignores it). */
	__type(value, struct verdict_event);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} dpc_verdicts SEC(".maps");

/* Per CPU, so that a burst of losses on several CPUs contends on nothing. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} dpc_verdicts_lost SEC(".maps");

/* report_verdict reports the verdict of policy direction dir of the endpoint
 * behind ifindex on the flow f, or counts it as lost if the ring buffer is
 * full. The time is taken once the record is reserved: a reader that has
 * drained the ring has seen every verdict stamped before it started. */
static __always_inline void report_verdict(const struct ct_key *f, __u32 ifindex, __u8 dir,
					   __u8 verdict, __u8 reason)
{
	struct verdict_event *e;
	__u64 *lost;
	__u32 zero = 0;

	e = bpf_ringbuf_reserve(&dpc_verdicts, sizeof(*e), 0);
	if (!e) {
		lost = bpf_map_lookup_elem(&dpc_verdicts_lost, &zero);
		if (lost)
			*lost += 1; /* per CPU: no other writer */
		return;
	}
	e->time_ns = bpf_ktime_get_ns();
	e->src = f->src;
	e->dst = f->dst;
	e->sport = f->sport;
	e->dport = f->dport;
	e->proto = f->proto;
	e->verdict = verdict;
	e->dir = dir;
	e->reason = reason;
	e->ifindex = ifindex;
	e->pad = 0; /* the reservation is not zeroed: leak nothing */
	bpf_ringbuf_submit(e, 0);
}

#endif /* DPC_VERDICTS_H */
