/* SPDX-License-Identifier: (MIT OR GPL-2.0-only) */
/*
 * Network policy: the IP sets and the rules of each endpoint (see datapath.h),
 * and the verdict on a new flow.
 */
#ifndef DPC_POLICY_H
#define DPC_POLICY_H

#include "conntrack.h"

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

#endif /* DPC_POLICY_H */
