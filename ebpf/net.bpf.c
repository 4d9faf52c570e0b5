// SPDX-License-Identifier: GPL-2.0-only
/*
 * agentos network enforcement: cgroup programs attached to the daemon's agents/ cgroup. Every
 * connect() and unconnected sendmsg() (UDP, TCP fast open) to an IPv4/IPv6 destination, every
 * bind() and every IPv4/IPv6 socket created by a process under agents/ is checked against its
 * agent's policy, looked up by cgroup id (bpf_get_current_cgroup_id):
 *
 *   cgroup/connect4, connect6, sendmsg4, sendmsg6: the destination must be granted (net.connect)
 *   cgroup/bind4, bind6: the local address must be granted (net.bind), TCP and UDP alike
 *   cgroup/sock_create: an agent without any network grant creates no IPv4/IPv6 socket; one with
 *     a grant only TCP (SOCK_STREAM/IPPROTO_TCP) and UDP (SOCK_DGRAM/IPPROTO_UDP) ones, so no
 *     raw, MPTCP, SCTP, UDP-Lite or ICMP echo socket. The second layer after seccomp's socket
 *     rules (agentosd/src/sandbox/seccomp.rs).
 *
 * An IPv4-mapped IPv6 address (::ffff:a.b.c.d) is checked as the IPv4 address it reaches. A
 * refusal gives the caller EPERM and is reported to the ring buffer `events`, which agentosd
 * appends to the audit trail as a kernel denial. A process under agents/ whose cgroup has no
 * policy entry is refused too (fail closed): the daemon fills an entry for every agent before its
 * first process exists.
 *
 * The daemon pins the links and maps in bpffs (agentosd/src/enforce/net.rs), so the programs stay
 * attached and keep their policies while agentosd is down or restarting.
 *
 * lsm/socket_connect enforces the same connect policy as defence in depth where the kernel allows
 * BPF LSM programs (not on hosts with lockdown; the daemon reports that). It is global, so it acts
 * only on cgroups that have a policy entry (agents) and leaves every other process alone.
 */
#include <linux/bpf.h>
#include <linux/in.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_tracing.h>

#include "intf.h"

char LICENSE[] SEC("license") = "GPL";

#define AF_INET 2
#define AF_INET6 10
#define SOCK_STREAM 1
#define SOCK_DGRAM 2

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, AGENTOS_MAX_AGENTS);
	__type(key, __u64);
	__type(value, struct agentos_net_policy);
} net_policy SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, AGENTOS_EVENTS_BYTES);
} events SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, AGENTOS_STAT_MAX);
	__type(key, __u32);
	__type(value, __u64);
} stats SEC(".maps");

static __always_inline void count(__u32 slot)
{
	__u64 *v = bpf_map_lookup_elem(&stats, &slot);
	if (v)
		__sync_fetch_and_add(v, 1);
}

/* An IPv4-mapped IPv6 address (::ffff:a.b.c.d) reaches IPv4 a.b.c.d: check it as that. */
static __always_inline __u16 unmap(__u16 family, __u32 dst[4])
{
	if (family == AF_INET6 && dst[0] == 0 && dst[1] == 0 && dst[2] == bpf_htonl(0xffff)) {
		dst[0] = dst[3];
		dst[2] = 0;
		dst[3] = 0;
		return AF_INET;
	}
	return family;
}

static __always_inline int granted(const struct agentos_net_policy *pol, __u16 family,
				   const __u32 dst[4], __u16 port, __u32 kind)
{
	__u32 all = kind == AGENTOS_NET_RULE_BIND ? AGENTOS_NET_ALLOW_ALL_BIND : AGENTOS_NET_ALLOW_ALL;
	if (pol->flags & all)
		return 1;
	for (int i = 0; i < AGENTOS_MAX_RULES; i++) {
		if (i >= pol->n_rules)
			break;
		const struct agentos_net_rule *r = &pol->rules[i];
		if (r->family != family || r->kind != kind)
			continue;
		if (r->port && r->port != port)
			continue;
		if ((dst[0] & r->mask[0]) != r->addr[0] || (dst[1] & r->mask[1]) != r->addr[1] ||
		    (dst[2] & r->mask[2]) != r->addr[2] || (dst[3] & r->mask[3]) != r->addr[3])
			continue;
		return 1;
	}
	return 0;
}

static __always_inline void report(__u64 cgid, __u8 hook, __u8 reason, __u16 family,
				   const __u32 dst[4], __u16 port, __u32 protocol)
{
	struct agentos_net_event *e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);
	if (!e) {
		count(AGENTOS_STAT_EVENTS_DROPPED);
		return;
	}
	__u64 pid_tgid = bpf_get_current_pid_tgid();
	e->cgroup_id = cgid;
	e->time_ns = bpf_ktime_get_ns();
	e->pid = pid_tgid >> 32;
	e->tid = (__u32)pid_tgid;
	e->addr[0] = dst[0];
	e->addr[1] = dst[1];
	e->addr[2] = dst[2];
	e->addr[3] = dst[3];
	e->family = family;
	e->port = port;
	e->protocol = protocol;
	e->hook = hook;
	e->reason = reason;
	__builtin_memset(e->_pad, 0, sizeof(e->_pad));
	bpf_get_current_comm(e->comm, sizeof(e->comm));
	bpf_ringbuf_submit(e, 0);
}

static __always_inline int check(struct bpf_sock_addr *ctx, __u8 hook, __u16 family, __u32 kind)
{
	__u32 dst[4] = {0, 0, 0, 0};
	if (family == AF_INET) {
		dst[0] = ctx->user_ip4;
	} else {
		dst[0] = ctx->user_ip6[0];
		dst[1] = ctx->user_ip6[1];
		dst[2] = ctx->user_ip6[2];
		dst[3] = ctx->user_ip6[3];
	}
	family = unmap(family, dst);
	__u16 port = bpf_ntohs((__u16)ctx->user_port);
	__u64 cgid = bpf_get_current_cgroup_id();
	const struct agentos_net_policy *pol = bpf_map_lookup_elem(&net_policy, &cgid);
	__u8 reason = AGENTOS_REASON_NO_POLICY;
	if (pol) {
		/* An ephemeral bind (port 0) is what the kernel's autobind does on sendto/connect,
		 * which no hook sees: no port of the agent's choosing, and UDP clients (Rust's
		 * UdpSocket::bind("0.0.0.0:0"), Python's bind(("", 0))) need it. listen() still
		 * needs net.bind (seccomp). */
		if ((kind == AGENTOS_NET_RULE_BIND && port == 0) ||
		    granted(pol, family, dst, port, kind)) {
			count(AGENTOS_STAT_ALLOWED);
			return 1;
		}
		reason = AGENTOS_REASON_NOT_GRANTED;
	}
	count(AGENTOS_STAT_DENIED);
	report(cgid, hook, reason, family, dst, port, ctx->protocol);
	return 0;
}

SEC("cgroup/connect4")
int agentos_connect4(struct bpf_sock_addr *ctx)
{
	return check(ctx, AGENTOS_HOOK_CONNECT4, AF_INET, AGENTOS_NET_RULE_CONNECT);
}

SEC("cgroup/connect6")
int agentos_connect6(struct bpf_sock_addr *ctx)
{
	return check(ctx, AGENTOS_HOOK_CONNECT6, AF_INET6, AGENTOS_NET_RULE_CONNECT);
}

SEC("cgroup/sendmsg4")
int agentos_sendmsg4(struct bpf_sock_addr *ctx)
{
	return check(ctx, AGENTOS_HOOK_SENDMSG4, AF_INET, AGENTOS_NET_RULE_CONNECT);
}

SEC("cgroup/sendmsg6")
int agentos_sendmsg6(struct bpf_sock_addr *ctx)
{
	return check(ctx, AGENTOS_HOOK_SENDMSG6, AF_INET6, AGENTOS_NET_RULE_CONNECT);
}

/* bind() of TCP and UDP sockets (Landlock sees TCP only). Port 0 (an ephemeral port) is
 * allowed like the implicit bind of connect()/sendto(), which does not come here. */
SEC("cgroup/bind4")
int agentos_bind4(struct bpf_sock_addr *ctx)
{
	return check(ctx, AGENTOS_HOOK_BIND4, AF_INET, AGENTOS_NET_RULE_BIND);
}

SEC("cgroup/bind6")
int agentos_bind6(struct bpf_sock_addr *ctx)
{
	return check(ctx, AGENTOS_HOOK_BIND6, AF_INET6, AGENTOS_NET_RULE_BIND);
}

/* Every IPv4/IPv6 socket an agent creates (inet_create/inet6_create call this with the
 * protocol resolved: SOCK_STREAM with protocol 0 arrives as IPPROTO_TCP). */
SEC("cgroup/sock_create")
int agentos_sock_create(struct bpf_sock *ctx)
{
	__u32 type = ctx->type, protocol = ctx->protocol;
	__u64 cgid = bpf_get_current_cgroup_id();
	const struct agentos_net_policy *pol = bpf_map_lookup_elem(&net_policy, &cgid);
	__u8 reason = AGENTOS_REASON_NO_POLICY;
	if (pol) {
		int tcp_udp = (type == SOCK_STREAM && protocol == IPPROTO_TCP) ||
			      (type == SOCK_DGRAM && protocol == IPPROTO_UDP);
		if ((pol->flags & AGENTOS_NET_INET) && tcp_udp)
			return 1;
		reason = (pol->flags & AGENTOS_NET_INET) ? AGENTOS_REASON_SOCKET_TYPE
							  : AGENTOS_REASON_NOT_GRANTED;
	}
	__u32 none[4] = {0, 0, 0, 0};
	count(AGENTOS_STAT_DENIED);
	report(cgid, AGENTOS_HOOK_SOCK_CREATE, reason, ctx->family, none, 0,
	       (type << 16) | (protocol & 0xffff));
	return 0;
}

/* The start of struct sockaddr_in / sockaddr_in6 as the kernel copied it from the caller. */
struct agentos_sockaddr {
	__u16 family;
	__u16 port; /* network byte order */
	__u32 addr4_or_flowinfo;
	__u32 addr6[4];
};

SEC("lsm/socket_connect")
int BPF_PROG(agentos_lsm_connect, void *sock, void *address, int addrlen, int ret)
{
	if (ret)
		return ret;
	__u64 cgid = bpf_get_current_cgroup_id();
	const struct agentos_net_policy *pol = bpf_map_lookup_elem(&net_policy, &cgid);
	if (!pol)
		return 0; /* not an agent */
	struct agentos_sockaddr sa = {};
	if (addrlen < 8 || bpf_probe_read_kernel(&sa, addrlen < (int)sizeof(sa) ? 8 : sizeof(sa), address))
		return 0;
	__u32 dst[4] = {0, 0, 0, 0};
	if (sa.family == AF_INET) {
		dst[0] = sa.addr4_or_flowinfo;
	} else if (sa.family == AF_INET6 && addrlen >= (int)sizeof(sa)) {
		dst[0] = sa.addr6[0];
		dst[1] = sa.addr6[1];
		dst[2] = sa.addr6[2];
		dst[3] = sa.addr6[3];
	} else {
		return 0; /* AF_UNIX and the rest: Landlock and seccomp's business */
	}
	__u16 port = bpf_ntohs(sa.port);
	__u16 family = unmap(sa.family, dst);
	if (granted(pol, family, dst, port, AGENTOS_NET_RULE_CONNECT)) {
		count(AGENTOS_STAT_ALLOWED);
		return 0;
	}
	count(AGENTOS_STAT_DENIED);
	report(cgid, AGENTOS_HOOK_LSM_SOCKET_CONNECT, AGENTOS_REASON_NOT_GRANTED, family, dst, port, 0);
	return -1; /* -EPERM */
}
