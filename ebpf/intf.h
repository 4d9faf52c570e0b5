/* SPDX-License-Identifier: (GPL-2.0-only OR Apache-2.0) */
/*
 * Layouts shared by the BPF programs and agentosd (agentosd/src/enforce/net.rs mirrors them with
 * #[repr(C)] structs; a unit test checks the sizes). Change both together.
 */
#ifndef AGENTOS_INTF_H
#define AGENTOS_INTF_H

#include <linux/types.h>

/* Agents with a network policy at once (entries in the policy map). */
#define AGENTOS_MAX_AGENTS 4096
/* Destinations one agent may be granted (net.connect scopes after name resolution). */
#define AGENTOS_MAX_RULES 32
/* Ring buffer for denial events, bytes (a power of two, a multiple of the page size). */
#define AGENTOS_EVENTS_BYTES (256 * 1024)

/* One granted destination. An address matches when (dst & mask) == addr, word by word, with
 * addresses in network byte order as the kernel gives them (IPv4 in word 0, the rest zero).
 * port 0 = any port (host byte order otherwise). */
struct agentos_net_rule {
	__u32 addr[4];
	__u32 mask[4];
	__u16 family; /* AF_INET (2) or AF_INET6 (10) */
	__u16 port;
	__u32 _pad;
};

/* The value in the policy map, keyed by the agent's cgroup id (__u64). */
struct agentos_net_policy {
	__u32 n_rules; /* rules used, <= AGENTOS_MAX_RULES */
	__u32 flags;   /* AGENTOS_NET_* */
	struct agentos_net_rule rules[AGENTOS_MAX_RULES];
};

/* Allow every destination (a `*:*` grant); denials are still counted for other agents. */
#define AGENTOS_NET_ALLOW_ALL 1

/* Which program refused. */
enum agentos_hook {
	AGENTOS_HOOK_CONNECT4 = 0,
	AGENTOS_HOOK_CONNECT6 = 1,
	AGENTOS_HOOK_SENDMSG4 = 2,
	AGENTOS_HOOK_SENDMSG6 = 3,
	AGENTOS_HOOK_LSM_SOCKET_CONNECT = 4,
};

/* Why it refused. */
enum agentos_reason {
	AGENTOS_REASON_NOT_GRANTED = 0, /* the agent has a policy; this destination is not in it */
	AGENTOS_REASON_NO_POLICY = 1,   /* a process under agents/ whose cgroup has no policy entry */
};

/* One denial, to the ring buffer `events`. */
struct agentos_net_event {
	__u64 cgroup_id;
	__u64 time_ns; /* bpf_ktime_get_ns (CLOCK_MONOTONIC) */
	__u32 pid;     /* thread group id */
	__u32 tid;
	__u32 addr[4]; /* destination, network byte order */
	__u16 family;
	__u16 port; /* host byte order */
	__u32 protocol; /* IPPROTO_TCP / IPPROTO_UDP / 0 */
	__u8 hook;      /* enum agentos_hook */
	__u8 reason;    /* enum agentos_reason */
	__u8 _pad[6];
	char comm[16];
};

/* Slots of the `stats` array map (__u64 each). */
enum agentos_stat {
	AGENTOS_STAT_ALLOWED = 0,
	AGENTOS_STAT_DENIED = 1,
	AGENTOS_STAT_EVENTS_DROPPED = 2, /* ring buffer full: a denial not reported as an event */
	AGENTOS_STAT_MAX = 4,
};

#endif
