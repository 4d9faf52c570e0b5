/* SPDX-License-Identifier: (GPL-2.0-only OR Apache-2.0) */
/*
 * Layouts shared by the BPF programs and agentosd (agentosd/src/enforce/net/ mirrors them with
 * #[repr(C)] structs; a unit test checks the sizes). Change both together, and bump MAPS_LAYOUT
 * in net/pins.rs when a map's key or value changes: the maps are pinned in bpffs and taken over by
 * the next daemon, which must not load programs of one layout onto maps of another.
 */
#ifndef AGENTOS_INTF_H
#define AGENTOS_INTF_H

#include <linux/types.h>

/* Agents with a network policy at once (entries in the policy map; also the agents the file
 * and syscall-count maps hold). 16 384: the 10 000 agents of `cargo xtask bench scale` with
 * room; the policy map preallocates ~1.3 KiB an entry (21 MiB of kernel memory, charged to the
 * daemon's cgroup). A start beyond it is refused (the map update fails). */
#define AGENTOS_MAX_AGENTS 16384
/* Destinations one agent may be granted (net.connect scopes after name resolution). */
#define AGENTOS_MAX_RULES 32
/* Ring buffer for denial events, bytes (a power of two, a multiple of the page size). */
#define AGENTOS_EVENTS_BYTES (256 * 1024)

/* One granted destination (kind CONNECT: connect, sendmsg) or local address (kind BIND). An
 * address matches when (addr & mask) == rule addr, word by word, with addresses in network byte
 * order as the kernel gives them (IPv4 in word 0, the rest zero; an IPv4-mapped IPv6 address
 * `::ffff:a.b.c.d` is checked as the IPv4 address a.b.c.d). port 0 = any port (host byte order
 * otherwise). */
struct agentos_net_rule {
	__u32 addr[4];
	__u32 mask[4];
	__u16 family; /* AF_INET (2) or AF_INET6 (10) */
	__u16 port;
	__u32 kind; /* AGENTOS_NET_RULE_* */
};

#define AGENTOS_NET_RULE_CONNECT 0 /* net.connect: connect(), sendto()/sendmsg() */
#define AGENTOS_NET_RULE_BIND 1    /* net.bind: bind() */
/* Or'ed into a rule's kind: that protocol only (`udp://ADDR:PORT`; a tool's name resolved at its
 * start, TCP unless `udp://`). A rule with neither allows TCP and UDP. */
#define AGENTOS_NET_RULE_UDP 0x100
#define AGENTOS_NET_RULE_TCP 0x200

/* The value in the policy map, keyed by the agent's cgroup id (__u64). */
struct agentos_net_policy {
	__u32 n_rules; /* rules used, <= AGENTOS_MAX_RULES */
	__u32 flags;   /* AGENTOS_NET_* */
	struct agentos_net_rule rules[AGENTOS_MAX_RULES];
	__u16 dns_port; /* AGENTOS_NET_DNS: the agent's DNS stub on 127.0.0.1 (host byte order) */
	__u16 _pad[3];
};

/* Allow every destination (a `*:*` net.connect grant); denials are still counted for other
 * agents. */
#define AGENTOS_NET_ALLOW_ALL 1
/* Allow every local address (a `*:*` net.bind grant). */
#define AGENTOS_NET_ALLOW_ALL_BIND 2
/* The agent may create IPv4/IPv6 sockets at all (it has a net.connect or net.bind grant); even
 * then only TCP and UDP ones (cgroup/sock_create). */
#define AGENTOS_NET_INET 4
/* DNS belongs to the daemon: every connect/sendmsg to port 53 (UDP or TCP, any address) goes to
 * the agent's stub at 127.0.0.1:dns_port instead, and destinations the stub resolved for the
 * agent's name grants (the `net_names` map) are allowed while their TTL runs. */
#define AGENTOS_NET_DNS 8
/* The stub serves [::1]:dns_port too: an IPv6 socket's queries go there (an IPV6_V6ONLY socket
 * cannot reach ::ffff:127.0.0.1); without it they go to ::ffff:127.0.0.1. */
#define AGENTOS_NET_DNS6 16

/* Addresses learnt from DNS answers, all agents together (the daemon caps each agent's share). */
#define AGENTOS_MAX_NAMES (64 * 1024)
/* Ports one learnt address may be reached on (the union of the name grants that resolved to it;
 * at most 8: the tcp/udp bit masks of the value are a byte each). */
#define AGENTOS_NAME_PORTS 8

/* The key of `net_names`: an address the agent's stub answered (IPv4 in word 0, network byte
 * order; a v4-mapped answer is stored as IPv4). */
struct agentos_name_key {
	__u64 cgroup_id;
	__u32 addr[4];
	__u32 family; /* AF_INET or AF_INET6 */
	__u32 _pad;
};

/* Any port over TCP (a name grant `NAME:*`). */
#define AGENTOS_NAME_ANY_TCP 1
/* Any port over UDP (a name grant `udp://NAME:*`). */
#define AGENTOS_NAME_ANY_UDP 2

struct agentos_name_value {
	__u64 expires_ns; /* bpf_ktime_get_boot_ns (CLOCK_BOOTTIME): allowed while now < this */
	__u32 flags;      /* AGENTOS_NAME_* */
	__u16 n_ports;    /* ports used, <= AGENTOS_NAME_PORTS */
	__u16 ports[AGENTOS_NAME_PORTS]; /* host byte order */
	__u8 tcp; /* bit i: ports[i] over TCP (every name grant) */
	__u8 udp; /* bit i: ports[i] over UDP (declared: `udp://NAME:PORT`; QUIC/HTTP3) */
};

/* Bits 8-15 of agentos_name_value.flags: bit 8+i = ports[i] over TCP is granted only by a
 * checked grant (`https://NAME`, `http://NAME`): a connect there goes to the daemon's SNI/Host
 * proxy instead (a plain grant of the same address and port clears the bit). */
#define AGENTOS_NAME_CHECKED_SHIFT 8

/* Socket storage of a connect redirected to the SNI/Host proxy, and the value of `sni_conns`:
 * where the agent was connecting (the address checked, v4-mapped as IPv4) and whose it is. */
struct agentos_sni_orig {
	__u64 cgroup_id;
	__u32 addr[4];    /* network byte order; IPv4 in word 0 */
	__u16 family;     /* AF_INET or AF_INET6 */
	__u16 port;       /* host byte order */
	__u16 proxy_port; /* host byte order: where it was sent */
	__u16 _pad;
};

/* The key of `sni_conns` (LRU): the redirected socket's local port and the proxy's port, host
 * byte order, written by the sockops program when the SYN is about to go (the local port is
 * known then), read and removed by the proxy when it accepts. */
struct agentos_sni_key {
	__u16 sport;
	__u16 dport;
};

/* Redirected connections waiting for the proxy's accept (all agents). */
#define AGENTOS_SNI_CONNS 16384

/* Socket storage of a DNS query redirected to the stub: where the agent sent it, so that
 * cgroup/recvmsg4/6 give the stub's replies that source back (resolvers check it). */
struct agentos_dns_orig {
	__u32 addr[4]; /* as the agent gave it: user_ip4 in word 0 (AF_INET) or user_ip6 */
	__u16 port;    /* network byte order, as user_port */
	__u16 stub_port; /* host byte order */
};

/* Which program refused. */
enum agentos_hook {
	AGENTOS_HOOK_CONNECT4 = 0,
	AGENTOS_HOOK_CONNECT6 = 1,
	AGENTOS_HOOK_SENDMSG4 = 2,
	AGENTOS_HOOK_SENDMSG6 = 3,
	AGENTOS_HOOK_LSM_SOCKET_CONNECT = 4,
	/* 5 and 6: the filesystem hooks below */
	AGENTOS_HOOK_BIND4 = 7,
	AGENTOS_HOOK_BIND6 = 8,
	AGENTOS_HOOK_SOCK_CREATE = 9,
	/* 10 and 11: the filesystem hooks below */
	AGENTOS_HOOK_INGRESS = 12, /* cgroup_skb/ingress: a datagram dropped, not a syscall refused */
	/* 13 and 14: the socket hooks of the filesystem program set below */
};

/* Why it refused. */
enum agentos_reason {
	AGENTOS_REASON_NOT_GRANTED = 0, /* the agent has a policy; this destination is not in it */
	AGENTOS_REASON_NO_POLICY = 1,   /* a process under agents/ whose cgroup has no policy entry */
	AGENTOS_REASON_SOCKET_TYPE = 2, /* sock_create: not TCP or UDP (raw, MPTCP, SCTP, ICMP…) */
	AGENTOS_REASON_NO_PROXY = 3,    /* a checked grant's address, and the SNI/Host proxy is not up */
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
	__u32 protocol; /* IPPROTO_TCP / IPPROTO_UDP / 0; sock_create: (type << 16) | protocol */
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

/*
 * Filesystem scopes for the BPF LSM programs in fs.bpf.c (lsm/file_open,
 * lsm/bprm_check_security). Mirrored by agentosd/src/enforce/fs/.
 */

/* Bytes of path a prefix key holds after the cgroup id (LPM trie data is at most 256 bytes). */
#define AGENTOS_FS_PATH_KEY 248
/* Bytes of path an event carries (longer paths are cut; `flags` says so). */
#define AGENTOS_FS_EVENT_PATH 256
/* Prefix entries for all agents together (LPM trie, allocated on insert). */
#define AGENTOS_FS_MAX_PREFIXES (256 * 1024)

/* Access bits: in a prefix entry (what is granted) and in an event (what was asked). */
#define AGENTOS_FS_READ 1
#define AGENTOS_FS_WRITE 2
#define AGENTOS_FS_EXEC 4

/* The key of the `fs_prefixes` LPM trie: the agent's cgroup id (all 64 bits always match) then a
 * granted path with a trailing '/' ("/srv/docs/"; "/" for the root), so that a match ends on a
 * component boundary: a lookup of "/srv/docs2/x/" does not match "/srv/docs/". prefixlen is in
 * bits and counts the cgroup id. The value is a __u32 of AGENTOS_FS_* bits: the union of what the
 * entry and every shorter granted prefix of it grant (the daemon computes it), so the longest
 * match alone decides. */
struct agentos_fs_key {
	__u32 prefixlen;
	__u64 cgroup_id;
	__u8 path[AGENTOS_FS_PATH_KEY];
} __attribute__((packed));

/* Which program refused (after the network hooks' numbers). */
#define AGENTOS_HOOK_LSM_FILE_OPEN 5
#define AGENTOS_HOOK_LSM_BPRM_CHECK 6
#define AGENTOS_HOOK_LSM_MMAP_FILE 10
#define AGENTOS_HOOK_LSM_FILE_MPROTECT 11
/* Socket refusals (EPERM) the filesystem program set reports in the same ring buffer. */
#define AGENTOS_HOOK_LSM_SOCKET_BIND 13
#define AGENTOS_HOOK_LSM_SOCKET_LISTEN 14
/* Pathname Unix socket refusals (EACCES): `path` is the peer's bound name, `f_flags` its bytes. */
#define AGENTOS_HOOK_LSM_UNIX_CONNECT 15
#define AGENTOS_HOOK_LSM_UNIX_SEND 16

/* Directories beneath which an agent may connect or send to pathname Unix sockets (Landlock
 * ABI 9's RESOLVE_UNIX rules as BPF LSM, for kernels without it): the daemon's socket directory
 * for its tenant and its write grants, by inode. The map `fs_unix_dirs` holds one key per
 * (agent, directory), value 1. `dev` is the kernel's internal dev_t of the super block
 * (MAJOR << 20 | MINOR). */
struct agentos_unix_dir_key {
	__u64 cgroup_id;
	__u64 ino;
	__u32 dev;
	__u32 pad;
};
#define AGENTOS_FS_MAX_UNIX_DIRS (64 * 1024)

/* Event flags. */
#define AGENTOS_FS_EV_PATH_CUT 1   /* the path was longer than AGENTOS_FS_EVENT_PATH - 1 */
#define AGENTOS_FS_EV_NO_PREFIX 2 /* no granted prefix matched at all */

/* One filesystem denial, to the ring buffer `fs_events`. */
struct agentos_fs_event {
	__u64 cgroup_id;
	__u64 time_ns;
	__u32 pid;
	__u32 tid;
	__u32 f_flags;  /* the open flags (O_*); socket hooks: see refuse_sock in fs.bpf.c */
	__u8 hook;      /* AGENTOS_HOOK_LSM_FILE_OPEN / _BPRM_CHECK / _MMAP_FILE / _FILE_MPROTECT */
	__u8 want;      /* AGENTOS_FS_* asked for */
	__u8 granted;   /* AGENTOS_FS_* the longest matching prefix grants */
	__u8 flags;     /* AGENTOS_FS_EV_* */
	char comm[16];
	char path[AGENTOS_FS_EVENT_PATH];
};

/* Slots of the `fs_stats` array map (__u64 each). */
enum agentos_fs_stat {
	AGENTOS_FS_STAT_ALLOWED = 0,
	AGENTOS_FS_STAT_DENIED = 1,
	AGENTOS_FS_STAT_EVENTS_DROPPED = 2,
	AGENTOS_FS_STAT_UNCHECKED = 3, /* agent opens skipped: internal mounts, no path */
	AGENTOS_FS_STAT_MAX = 4,
};

#endif
