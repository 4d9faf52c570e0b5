// SPDX-License-Identifier: GPL-2.0-only
/*
 * agentos network enforcement: cgroup programs attached to the daemon's agents/ cgroup. Every
 * connect() and unconnected sendmsg() (UDP, TCP fast open) to an IPv4/IPv6 destination, every
 * bind() and every IPv4/IPv6 socket created by a process under agents/ is checked against its
 * agent's policy, looked up by cgroup id (bpf_get_current_cgroup_id):
 *
 *   cgroup/connect4, connect6, sendmsg4, sendmsg6: the destination must be granted (net.connect)
 *   cgroup/bind4, bind6: the local address must be granted (net.bind), TCP and UDP alike; an
 *     ephemeral bind (port 0) needs no grant for UDP (a client's autobind made explicit) and a
 *     grant of any port (`ADDR:*`) for TCP (else bind(0) + listen() would listen on a port
 *     nobody granted; listen() on an unbound socket is fs.bpf.c's lsm/socket_listen)
 *   cgroup_skb/ingress: a datagram reaches an agent's UDP socket only from a granted net.connect
 *     destination, or on a socket bound to a granted net.bind address, and a SYN an agent's TCP
 *     listener only on a granted net.bind address (else dropped)
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
 * The daemon pins the links and maps in bpffs (agentosd/src/enforce/net/pins.rs), so the programs stay
 * attached and keep their policies while agentosd is down or restarting.
 *
 * DNS belongs to the daemon (AGENTOS_NET_DNS, agents with net.connect grants): a connect/sendmsg to
 * port 53 of any address is redirected to the agent's stub in agentosd (127.0.0.1:dns_port;
 * from an IPv6 socket [::1]:dns_port where the stub serves it, else ::ffff:127.0.0.1), the original destination kept in the socket's storage
 * (`dns_orig`) so that cgroup/recvmsg4/6 give the stub's replies that source back. The stub
 * answers only names the contract grants and enters the addresses it returns into `net_names`
 * with their TTL: connect/sendmsg (and UDP ingress) to such an address on a granted port is
 * allowed until it expires (bpf_ktime_get_boot_ns), over TCP, and over UDP only where the grant
 * declared it (`udp://NAME:PORT`: QUIC is refused unless declared).
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
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, AGENTOS_MAX_NAMES);
	__type(key, struct agentos_name_key);
	__type(value, struct agentos_name_value);
} net_names SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_SK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct agentos_dns_orig);
} dns_orig SEC(".maps");

/* SNI/Host checks (checked grants `https://NAME`, `http://NAME`): where each redirected
 * connect was going, in its socket's storage and, once its local port is known, in `sni_conns`
 * for the daemon's proxy to read at accept; `sni_cfg[0]` is the proxy's port (0: not up, and
 * such connects are refused). */
struct {
	__uint(type, BPF_MAP_TYPE_SK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct agentos_sni_orig);
} sni_orig SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, AGENTOS_SNI_CONNS);
	__type(key, struct agentos_sni_key);
	__type(value, struct agentos_sni_orig);
} sni_conns SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} sni_cfg SEC(".maps");

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

/* `proto`: the socket's (IPPROTO_TCP, IPPROTO_UDP), or 0 when unknown (lsm/socket_connect,
 * which the cgroup hook with the protocol follows): a rule for one protocol only then matches. */
static __always_inline int granted(const struct agentos_net_policy *pol, __u16 family,
				   const __u32 dst[4], __u16 port, __u32 kind, __u32 proto)
{
	__u32 all = kind == AGENTOS_NET_RULE_BIND ? AGENTOS_NET_ALLOW_ALL_BIND : AGENTOS_NET_ALLOW_ALL;
	if (pol->flags & all)
		return 1;
	for (int i = 0; i < AGENTOS_MAX_RULES; i++) {
		if (i >= pol->n_rules)
			break;
		const struct agentos_net_rule *r = &pol->rules[i];
		if (r->family != family || (r->kind & 0xff) != kind)
			continue;
		if (proto && (((r->kind & AGENTOS_NET_RULE_UDP) && proto != IPPROTO_UDP) ||
			      ((r->kind & AGENTOS_NET_RULE_TCP) && proto != IPPROTO_TCP)))
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

/* Whether the agent's stub answered `dst` for a name it may reach on `port` over `proto`
 * (IPPROTO_TCP, IPPROTO_UDP: a name grant is TCP unless it declares UDP; 0: either, for
 * lsm/socket_connect, which does not read the socket's protocol and runs before the cgroup
 * connect hook that does), and the answer's TTL still runs: 1, or 2 when only a checked grant
 * (`https://`, `http://`) allows it over TCP (the connect goes to the SNI/Host proxy). */
static __always_inline int learnt(__u64 cgid, __u16 family, const __u32 dst[4], __u16 port,
				  __u32 proto)
{
	struct agentos_name_key k = {};
	k.cgroup_id = cgid;
	k.family = family;
	k.addr[0] = dst[0];
	k.addr[1] = dst[1];
	k.addr[2] = dst[2];
	k.addr[3] = dst[3];
	const struct agentos_name_value *v = bpf_map_lookup_elem(&net_names, &k);
	if (!v || v->expires_ns <= bpf_ktime_get_boot_ns())
		return 0;
	__u32 any = 0, mask = 0;
	if (proto == IPPROTO_TCP) {
		any = AGENTOS_NAME_ANY_TCP;
		mask = v->tcp;
	} else if (proto == IPPROTO_UDP) {
		any = AGENTOS_NAME_ANY_UDP;
		mask = v->udp;
	} else if (proto == 0) {
		any = AGENTOS_NAME_ANY_TCP | AGENTOS_NAME_ANY_UDP;
		mask = v->tcp | v->udp;
	}
	if (v->flags & any)
		return 1;
	for (int i = 0; i < AGENTOS_NAME_PORTS; i++) {
		if (i >= v->n_ports)
			break;
		if (v->ports[i] == port && (mask & (1u << i)))
			return proto == IPPROTO_TCP &&
				       (v->flags & (1u << (AGENTOS_NAME_CHECKED_SHIFT + i)))
				   ? 2
				   : 1;
	}
	return 0;
}

#define LOOPBACK4 0x7f000001

/* A DNS query (port 53, UDP or TCP, any address) of an agent whose DNS is the daemon's: send it
 * to the stub instead and remember where it was going. */
static __always_inline int to_stub(struct bpf_sock_addr *ctx, __u16 hook_family,
				   const struct agentos_net_policy *pol)
{
	struct bpf_sock *sk = ctx->sk;
	if (!sk)
		return 0;
	struct agentos_dns_orig *o =
		bpf_sk_storage_get(&dns_orig, sk, 0, BPF_SK_STORAGE_GET_F_CREATE);
	if (!o)
		return 0;
	__u16 stub = pol->dns_port;
	if (hook_family == AF_INET) {
		o->addr[0] = ctx->user_ip4;
		o->addr[1] = 0;
		o->addr[2] = 0;
		o->addr[3] = 0;
		ctx->user_ip4 = bpf_htonl(LOOPBACK4);
	} else {
		o->addr[0] = ctx->user_ip6[0];
		o->addr[1] = ctx->user_ip6[1];
		o->addr[2] = ctx->user_ip6[2];
		o->addr[3] = ctx->user_ip6[3];
		/* [::1] where the stub serves it (IPV6_V6ONLY sockets reach it), else v4-mapped. */
		int v6 = (pol->flags & AGENTOS_NET_DNS6) != 0;
		ctx->user_ip6[0] = 0;
		ctx->user_ip6[1] = 0;
		ctx->user_ip6[2] = v6 ? 0 : bpf_htonl(0xffff);
		ctx->user_ip6[3] = v6 ? bpf_htonl(1) : bpf_htonl(LOOPBACK4);
	}
	o->port = (__u16)ctx->user_port;
	o->stub_port = stub;
	ctx->user_port = bpf_htons(stub);
	return 1;
}

/* A connect to an address only a checked grant allows: send it to the daemon's SNI/Host proxy
 * (127.0.0.1:port, ::ffff:127.0.0.1 from an IPv6 socket) and remember where it was going and
 * whose it is; the sockops program publishes that for the proxy once the local port is known. */
static __always_inline int to_proxy(struct bpf_sock_addr *ctx, __u16 hook_family, __u16 family,
				    const __u32 dst[4], __u16 port, __u64 cgid)
{
	__u32 zero = 0;
	__u32 *pp = bpf_map_lookup_elem(&sni_cfg, &zero);
	struct bpf_sock *sk = ctx->sk;
	if (!pp || !*pp || *pp > 0xffff || !sk)
		return 0;
	__u16 proxy = *pp;
	struct agentos_sni_orig *o =
		bpf_sk_storage_get(&sni_orig, sk, 0, BPF_SK_STORAGE_GET_F_CREATE);
	if (!o)
		return 0;
	o->cgroup_id = cgid;
	o->addr[0] = dst[0];
	o->addr[1] = dst[1];
	o->addr[2] = dst[2];
	o->addr[3] = dst[3];
	o->family = family;
	o->port = port;
	o->proxy_port = proxy;
	o->_pad = 0;
	if (hook_family == AF_INET) {
		ctx->user_ip4 = bpf_htonl(LOOPBACK4);
	} else {
		ctx->user_ip6[0] = 0;
		ctx->user_ip6[1] = 0;
		ctx->user_ip6[2] = bpf_htonl(0xffff);
		ctx->user_ip6[3] = bpf_htonl(LOOPBACK4);
	}
	ctx->user_port = bpf_htons(proxy);
	return 1;
}

static __always_inline void report(__u64 cgid, __u8 hook, __u8 reason, __u16 family,
				   const __u32 dst[4], __u16 port, __u32 protocol)
{
	struct agentos_net_event *e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);
	if (!e) {
		count(AGENTOS_STAT_EVENTS_DROPPED);
		return;
	}
	/* A packet arrives in whatever task (or softirq) the kernel is in: no pid of the agent's. */
	int in_task = hook != AGENTOS_HOOK_INGRESS;
	__u64 pid_tgid = in_task ? bpf_get_current_pid_tgid() : 0;
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
	if (in_task)
		bpf_get_current_comm(e->comm, sizeof(e->comm));
	else
		__builtin_memset(e->comm, 0, sizeof(e->comm));
	bpf_ringbuf_submit(e, 0);
}

static __always_inline int check(struct bpf_sock_addr *ctx, __u8 hook, __u16 family, __u32 kind)
{
	__u16 hook_family = family;
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
		/* An ephemeral UDP bind (port 0) is what the kernel's autobind does on sendto,
		 * which no hook sees: no port of the agent's choosing, and UDP clients (Rust's
		 * UdpSocket::bind("0.0.0.0:0"), Python's bind(("", 0))) need it. A TCP one is
		 * the first half of listening on a port nobody granted (bind(0) + listen()): it
		 * needs a bind grant for any port of that address (`ADDR:*`), like any bind. */
		if ((kind == AGENTOS_NET_RULE_BIND && port == 0 && ctx->type != SOCK_STREAM) ||
		    granted(pol, family, dst, port, kind, ctx->protocol)) {
			count(AGENTOS_STAT_ALLOWED);
			return 1;
		}
		if (kind == AGENTOS_NET_RULE_CONNECT && (pol->flags & AGENTOS_NET_DNS)) {
			if (port == 53 && pol->dns_port && to_stub(ctx, hook_family, pol)) {
				count(AGENTOS_STAT_ALLOWED);
				return 1;
			}
			int l = learnt(cgid, family, dst, port, ctx->protocol);
			if (l == 1 || (l == 2 && to_proxy(ctx, hook_family, family, dst, port, cgid))) {
				count(AGENTOS_STAT_ALLOWED);
				return 1;
			}
			if (l == 2) {
				reason = AGENTOS_REASON_NO_PROXY;
				goto deny;
			}
		}
		reason = AGENTOS_REASON_NOT_GRANTED;
	}
deny:
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

/* A reply on a socket whose query went to the stub: from the stub, it shows the address the query
 * was sent to (glibc's resolver drops answers from another source). */
static __always_inline void from_stub(struct bpf_sock_addr *ctx, __u16 hook_family)
{
	struct bpf_sock *sk = ctx->sk;
	if (!sk)
		return;
	struct agentos_dns_orig *o = bpf_sk_storage_get(&dns_orig, sk, 0, 0);
	if (!o || ctx->user_port != bpf_htons(o->stub_port))
		return;
	if (hook_family == AF_INET) {
		if (ctx->user_ip4 != bpf_htonl(LOOPBACK4))
			return;
		ctx->user_ip4 = o->addr[0];
	} else {
		int mapped = ctx->user_ip6[2] == bpf_htonl(0xffff) &&
			     ctx->user_ip6[3] == bpf_htonl(LOOPBACK4);
		int v6 = ctx->user_ip6[2] == 0 && ctx->user_ip6[3] == bpf_htonl(1);
		if (ctx->user_ip6[0] || ctx->user_ip6[1] || !(mapped || v6))
			return;
		ctx->user_ip6[0] = o->addr[0];
		ctx->user_ip6[1] = o->addr[1];
		ctx->user_ip6[2] = o->addr[2];
		ctx->user_ip6[3] = o->addr[3];
	}
	ctx->user_port = o->port;
}

/* The SNI/Host proxy's view of a redirected connect: the SYN is about to go, the local port is
 * known. Publish (local port, proxy port) -> where it was going, for the proxy's accept. */
SEC("sockops")
int agentos_sockops(struct bpf_sock_ops *skops)
{
	if (skops->op != BPF_SOCK_OPS_TCP_CONNECT_CB)
		return 1;
	struct bpf_sock *sk = skops->sk;
	if (!sk)
		return 1;
	struct agentos_sni_orig *o = bpf_sk_storage_get(&sni_orig, sk, 0, 0);
	if (!o)
		return 1;
	struct agentos_sni_key k = {};
	k.sport = (__u16)skops->local_port;
	k.dport = (__u16)bpf_ntohl(skops->remote_port);
	if (k.dport != o->proxy_port)
		return 1;
	struct agentos_sni_orig v = *o;
	bpf_map_update_elem(&sni_conns, &k, &v, BPF_ANY);
	return 1;
}

/* getpeername() of a socket the connect hook sent to the proxy: the address it connected to. */
static __always_inline void from_proxy(struct bpf_sock_addr *ctx, __u16 hook_family)
{
	struct bpf_sock *sk = ctx->sk;
	if (!sk)
		return;
	struct agentos_sni_orig *o = bpf_sk_storage_get(&sni_orig, sk, 0, 0);
	if (!o || ctx->user_port != bpf_htons(o->proxy_port))
		return;
	if (hook_family == AF_INET) {
		if (ctx->user_ip4 != bpf_htonl(LOOPBACK4) || o->family != AF_INET)
			return;
		ctx->user_ip4 = o->addr[0];
	} else {
		if (ctx->user_ip6[0] || ctx->user_ip6[1] || ctx->user_ip6[2] != bpf_htonl(0xffff) ||
		    ctx->user_ip6[3] != bpf_htonl(LOOPBACK4))
			return;
		if (o->family == AF_INET) {
			ctx->user_ip6[3] = o->addr[0];
		} else {
			ctx->user_ip6[0] = o->addr[0];
			ctx->user_ip6[1] = o->addr[1];
			ctx->user_ip6[2] = o->addr[2];
			ctx->user_ip6[3] = o->addr[3];
		}
	}
	ctx->user_port = bpf_htons(o->port);
}

SEC("cgroup/getpeername4")
int agentos_getpeername4(struct bpf_sock_addr *ctx)
{
	from_proxy(ctx, AF_INET);
	return 1;
}

SEC("cgroup/getpeername6")
int agentos_getpeername6(struct bpf_sock_addr *ctx)
{
	from_proxy(ctx, AF_INET6);
	return 1;
}

SEC("cgroup/recvmsg4")
int agentos_recvmsg4(struct bpf_sock_addr *ctx)
{
	from_stub(ctx, AF_INET);
	return 1;
}

SEC("cgroup/recvmsg6")
int agentos_recvmsg6(struct bpf_sock_addr *ctx)
{
	from_stub(ctx, AF_INET6);
	return 1;
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

/* Packets to an agent's sockets. A UDP socket receives from anyone who knows its port
 * (connect() and sendto() bind one implicitly), so an agent granted one destination could be sent
 * to by every host that reaches it. A datagram is delivered only when its sender (source address
 * and port) is a granted net.connect destination, or the socket's local address is a granted
 * net.bind one (a server receives from whoever may reach its port); otherwise it is dropped and
 * reported. A TCP listener hears SYNs only on a granted net.bind address: listen() on an unbound
 * socket makes the kernel pick a port after every bind hook (closed by lsm/socket_listen where
 * BPF LSM loads, and here on every host: nobody can connect to that port). Other TCP sockets
 * are left alone: a connection's peer was checked at connect(), or its listener here. The
 * cgroup is the socket's (the agent that made it), not the current task's. */
SEC("cgroup_skb/ingress")
int agentos_ingress(struct __sk_buff *skb)
{
	struct bpf_sock *sk = skb->sk;
	if (!sk)
		return 1;
	sk = bpf_sk_fullsock(sk);
	if (!sk)
		return 1; /* request and time-wait sockets: their listener saw the SYN */
	__u32 proto = sk->protocol;
	/* TCP: a connection's peer was checked at connect(); only a listener is filtered. */
	if (proto == IPPROTO_TCP && sk->state != BPF_TCP_LISTEN)
		return 1;
	if (proto != IPPROTO_TCP && proto != IPPROTO_UDP)
		return 1;
	/* The socket's local address, read here, each field on its own: the verifier allows no
	 * pointer arithmetic on a socket, which clang emits when it sinks these loads into the
	 * branches below (the empty asm makes the values live here). */
	__u32 lfam = sk->family, l4 = sk->src_ip4, lport = sk->src_port;
	__u32 l60 = sk->src_ip6[0], l61 = sk->src_ip6[1], l62 = sk->src_ip6[2], l63 = sk->src_ip6[3];
	asm volatile("" : "+r"(lfam), "+r"(l4), "+r"(lport), "+r"(l60), "+r"(l61), "+r"(l62),
		     "+r"(l63));
	__u64 cgid = bpf_skb_cgroup_id(skb);
	__u32 src[4] = {0, 0, 0, 0};
	__u16 family = 0, sport = 0;
	__u8 b[2] = {0, 0};
	__u8 reason = AGENTOS_REASON_NOT_GRANTED;
	/* The data starts at the network header. Anything but plain IPv4/IPv6 carrying UDP right
	 * after the header (IPv6 extension headers) is dropped: fail closed. */
	if (bpf_skb_load_bytes(skb, 0, b, 1))
		goto drop;
	if ((b[0] >> 4) == 4) {
		__u32 ihl = (b[0] & 0xf) * 4;
		if (ihl < 20 || bpf_skb_load_bytes(skb, 9, b, 1) || b[0] != proto ||
		    bpf_skb_load_bytes(skb, 12, &src[0], 4) ||
		    bpf_skb_load_bytes(skb, ihl & 0x3f, &sport, 2))
			goto drop;
		family = AF_INET;
	} else if ((b[0] >> 4) == 6) {
		if (bpf_skb_load_bytes(skb, 6, b, 1) || b[0] != proto ||
		    bpf_skb_load_bytes(skb, 8, src, 16) || bpf_skb_load_bytes(skb, 40, &sport, 2))
			goto drop;
		family = unmap(AF_INET6, src);
	} else {
		goto drop;
	}
	sport = bpf_ntohs(sport);
	const struct agentos_net_policy *pol = bpf_map_lookup_elem(&net_policy, &cgid);
	if (!pol) {
		reason = AGENTOS_REASON_NO_POLICY;
		goto drop;
	}
	if (proto == IPPROTO_UDP && granted(pol, family, src, sport, AGENTOS_NET_RULE_CONNECT, IPPROTO_UDP))
		return 1;
	/* The stub's replies, and datagrams from an address a granted name resolved to. */
	if (proto == IPPROTO_UDP && (pol->flags & AGENTOS_NET_DNS) &&
	    ((family == AF_INET && src[0] == bpf_htonl(LOOPBACK4) && pol->dns_port &&
	      sport == pol->dns_port) ||
	     (family == AF_INET6 && (pol->flags & AGENTOS_NET_DNS6) && !src[0] && !src[1] &&
	      !src[2] && src[3] == bpf_htonl(1) && pol->dns_port && sport == pol->dns_port) ||
	     learnt(cgid, family, src, sport, IPPROTO_UDP)))
		return 1;
	__u16 lfamily = lfam;
	__u32 local[4] = {l60, l61, l62, l63};
	if (lfamily == AF_INET) {
		local[0] = l4;
		local[1] = 0;
		local[2] = 0;
		local[3] = 0;
	}
	lfamily = unmap(lfamily, local);
	if (granted(pol, lfamily, local, (__u16)lport, AGENTOS_NET_RULE_BIND, proto))
		return 1;
drop:
	count(AGENTOS_STAT_DENIED);
	report(cgid, AGENTOS_HOOK_INGRESS, reason, family, src, sport, proto);
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
	/* Port 53 with the daemon's DNS: the cgroup connect hook sends it to the stub next. */
	if (granted(pol, family, dst, port, AGENTOS_NET_RULE_CONNECT, 0) ||
	    ((pol->flags & AGENTOS_NET_DNS) && (port == 53 || learnt(cgid, family, dst, port, 0)))) {
		count(AGENTOS_STAT_ALLOWED);
		return 0;
	}
	count(AGENTOS_STAT_DENIED);
	report(cgid, AGENTOS_HOOK_LSM_SOCKET_CONNECT, AGENTOS_REASON_NOT_GRANTED, family, dst, port, 0);
	return -1; /* -EPERM */
}
