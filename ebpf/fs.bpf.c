// SPDX-License-Identifier: GPL-2.0-only
/*
 * agentos filesystem scopes as BPF LSM programs: defence in depth behind Landlock, where the
 * kernel allows BPF LSM (not on hosts with lockdown; the daemon reports that and relies on
 * Landlock). The scopes are the ones the sandbox gives Landlock (agentosd/src/sandbox: the
 * contract's fs.read / fs.write / fs.exec, the baseline system paths and the agent's home), one
 * set of prefixes per agent keyed by its cgroup id.
 *
 * lsm/file_open: an open for reading needs a read grant, for writing a write grant.
 * lsm/bprm_check_security: the file an execve runs (and each script interpreter) needs an exec
 * grant. lsm/mmap_file and lsm/file_mprotect (optional: the daemon runs without them, saying so,
 * where they do not load): mapping a file executable, or making a file mapping executable, needs
 * an exec grant too, so the dynamic loader run by hand (`ld.so $HOME/prog`), dlopen() of a
 * library the agent wrote, or a loader of its own cannot run code from a file outside the exec
 * grants (Landlock does not check mmap). Anonymous executable memory (JITs) stays allowed.
 * Refusals return -EACCES (what Landlock returns) and go to the ring buffer `fs_events`.
 *
 * Both programs are global: a process whose cgroup is not an agent's costs one hash lookup miss
 * (`fs_agents`) and is left alone. Files on kernel-internal mounts and pseudo filesystems
 * (pipes, sockets, anonymous inodes, nsfs, memfd reopened through /proc/self/fd) are not checked:
 * Landlock does not check them either (security/landlock/fs.c: is_nouser_or_private, internal
 * mounts), and the LSM must never refuse what Landlock allows.
 *
 * Kernel structures are read with CO-RE (field offsets relocated against the running kernel's
 * BTF by aya): only the fields used are declared below, no vmlinux.h.
 */
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>

#include "intf.h"

char LICENSE[] SEC("license") = "GPL";

#define EACCES 13
#define EPERM 1
#define PATH_BUF 4096
#define MNT_INTERNAL 0x4000
#define SB_NOUSER (1U << 31)
#define S_PRIVATE (1U << 9)
#define FMODE_READ 0x1
#define FMODE_WRITE 0x2
#define __FMODE_EXEC 0x20
#define PROT_EXEC 0x4
#define AF_INET 2
#define AF_INET6 10

struct super_block {
	unsigned long s_flags;
	unsigned int s_dev;
} __attribute__((preserve_access_index));

struct inode;

struct dentry {
	struct super_block *d_sb;
	struct dentry *d_parent;
	struct inode *d_inode;
} __attribute__((preserve_access_index));

struct vfsmount {
	int mnt_flags;
	struct dentry *mnt_root;
} __attribute__((preserve_access_index));

struct path {
	struct vfsmount *mnt;
	struct dentry *dentry;
} __attribute__((preserve_access_index));

struct inode {
	unsigned int i_flags;
	unsigned long i_ino;
} __attribute__((preserve_access_index));

struct file {
	union {
		const struct path f_path;
		struct path __f_path;
	};
	struct inode *f_inode;
	unsigned int f_flags;
	unsigned int f_mode;
} __attribute__((preserve_access_index));

struct linux_binprm {
	struct file *file;
} __attribute__((preserve_access_index));

struct sock_common {
	unsigned short skc_family;
	__u16 skc_num;
} __attribute__((preserve_access_index));

struct kernfs_node {
	__u64 id;
} __attribute__((preserve_access_index));

struct cgroup;

struct cgroup_subsys_state {
	struct cgroup *cgroup;
	struct cgroup_subsys_state *parent;
} __attribute__((preserve_access_index));

struct cgroup {
	struct cgroup_subsys_state self;
	struct kernfs_node *kn;
} __attribute__((preserve_access_index));

struct sock_cgroup_data {
	struct cgroup *cgroup;
} __attribute__((preserve_access_index));

struct sock {
	struct sock_common __sk_common;
	struct sock_cgroup_data sk_cgrp_data;
	__u16 sk_type;
} __attribute__((preserve_access_index));

struct socket {
	struct sock *sk;
} __attribute__((preserve_access_index));

struct vm_area_struct {
	struct file *vm_file;
} __attribute__((preserve_access_index));

/* Cgroup id of an agent -> 1: "this cgroup is an agent's, check it". */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, AGENTOS_MAX_AGENTS);
	__type(key, __u64);
	__type(value, __u32);
} fs_agents SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, AGENTOS_FS_MAX_PREFIXES);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct agentos_fs_key);
	__type(value, __u32);
} fs_prefixes SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, AGENTOS_EVENTS_BYTES);
} fs_events SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, AGENTOS_FS_STAT_MAX);
	__type(key, __u32);
	__type(value, __u64);
} fs_stats SEC(".maps");

/* Per-CPU scratch: the path (too big for the 512-byte stack) and the lookup key. */
struct scratch {
	char path[PATH_BUF];
	struct agentos_fs_key key;
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct scratch);
} fs_scratch SEC(".maps");

static __always_inline void count(__u32 slot)
{
	__u64 *v = bpf_map_lookup_elem(&fs_stats, &slot);
	if (v)
		__sync_fetch_and_add(v, 1);
}

/* Landlock's exemptions: kernel-internal mounts, pseudo filesystems no user can mount, private
 * inodes. */
static __always_inline int exempt(struct file *file)
{
	struct vfsmount *mnt = file->f_path.mnt;
	struct dentry *dentry = file->f_path.dentry;
	struct inode *inode = file->f_inode;
	if (mnt && (mnt->mnt_flags & MNT_INTERNAL))
		return 1;
	if (dentry && dentry->d_sb && (dentry->d_sb->s_flags & SB_NOUSER))
		return 1;
	if (inode && (inode->i_flags & S_PRIVATE))
		return 1;
	return 0;
}

static __always_inline int check(struct file *file, __u64 cgid, __u8 hook, __u8 want)
{
	__u32 zero = 0;
	struct scratch *s = bpf_map_lookup_elem(&fs_scratch, &zero);
	if (!s)
		return 0;
	if (exempt(file)) {
		count(AGENTOS_FS_STAT_UNCHECKED);
		return 0;
	}
	long n = bpf_d_path((struct path *)&file->f_path, s->path, PATH_BUF);
	if (n <= 1 || n > PATH_BUF || s->path[0] != '/') {
		/* No path in this namespace (e.g. "pipe:[..]"): nothing Landlock would check. */
		count(AGENTOS_FS_STAT_UNCHECKED);
		return 0;
	}
	__u32 len = (__u32)n - 1; /* without the NUL */
	s->key.cgroup_id = cgid;
	/* Bytes past prefixlen are ignored by the trie: copy a fixed size. */
	__builtin_memcpy(s->key.path, s->path, AGENTOS_FS_PATH_KEY);
	if (len < AGENTOS_FS_PATH_KEY) {
		s->key.path[len] = '/';
		s->key.prefixlen = 64 + 8 * (len + 1);
	} else {
		/* Cut: stored prefixes end in '/', so a match still ends on a real boundary. */
		s->key.prefixlen = 64 + 8 * AGENTOS_FS_PATH_KEY;
	}
	__u32 *granted = bpf_map_lookup_elem(&fs_prefixes, &s->key);
	__u8 have = granted ? (__u8)*granted : 0;
	if ((have & want) == want) {
		count(AGENTOS_FS_STAT_ALLOWED);
		return 0;
	}
	count(AGENTOS_FS_STAT_DENIED);
	struct agentos_fs_event *e = bpf_ringbuf_reserve(&fs_events, sizeof(*e), 0);
	if (!e) {
		count(AGENTOS_FS_STAT_EVENTS_DROPPED);
		return -EACCES;
	}
	__u64 pid_tgid = bpf_get_current_pid_tgid();
	e->cgroup_id = cgid;
	e->time_ns = bpf_ktime_get_ns();
	e->pid = pid_tgid >> 32;
	e->tid = (__u32)pid_tgid;
	e->f_flags = file->f_flags;
	e->hook = hook;
	e->want = want;
	e->granted = have;
	e->flags = (len >= AGENTOS_FS_EVENT_PATH ? AGENTOS_FS_EV_PATH_CUT : 0) |
		   (granted ? 0 : AGENTOS_FS_EV_NO_PREFIX);
	bpf_get_current_comm(e->comm, sizeof(e->comm));
	__builtin_memcpy(e->path, s->path, AGENTOS_FS_EVENT_PATH);
	e->path[AGENTOS_FS_EVENT_PATH - 1] = 0;
	bpf_ringbuf_submit(e, 0);
	return -EACCES;
}

/* A refusal (`err`) without a path lookup to `fs_events`: for lsm/socket_bind `path` is '@' and
 * the abstract name's bytes (they may hold NULs: `f_flags` is their count), for
 * lsm/socket_listen `path` is empty and `f_flags` the socket's family, for lsm/file_mprotect
 * `path` is empty (the hook has none) and `f_flags` the file's open flags. */
/* A refusal of `hook` counted and its `fs_events` entry reserved with everything but the path
 * and `f_flags` filled in (the path zeroed), or NULL when the ring buffer is full (counted as
 * dropped; the refusal stands). The caller fills in the rest and submits. */
static __always_inline struct agentos_fs_event *refusal(__u64 cgid, __u8 hook)
{
	count(AGENTOS_FS_STAT_DENIED);
	struct agentos_fs_event *e = bpf_ringbuf_reserve(&fs_events, sizeof(*e), 0);
	if (!e) {
		count(AGENTOS_FS_STAT_EVENTS_DROPPED);
		return NULL;
	}
	__u64 pid_tgid = bpf_get_current_pid_tgid();
	e->cgroup_id = cgid;
	e->time_ns = bpf_ktime_get_ns();
	e->pid = pid_tgid >> 32;
	e->tid = (__u32)pid_tgid;
	e->hook = hook;
	e->want = 0;
	e->granted = 0;
	e->flags = AGENTOS_FS_EV_NO_PREFIX;
	bpf_get_current_comm(e->comm, sizeof(e->comm));
	__builtin_memset(e->path, 0, sizeof(e->path));
	return e;
}

static __always_inline int refuse(__u64 cgid, __u8 hook, int err, const char *address, int arg)
{
	struct agentos_fs_event *e = refusal(cgid, hook);
	if (!e)
		return err;
	e->f_flags = (__u32)arg;
	if (address) {
		/* sun_path[1..]: the name after the leading NUL, addrlen - 3 bytes. */
		__u32 n = arg > 3 ? (__u32)arg - 3 : 0;
		if (n > AGENTOS_FS_EVENT_PATH - 2) {
			n = AGENTOS_FS_EVENT_PATH - 2;
			e->flags |= AGENTOS_FS_EV_PATH_CUT;
		}
		e->path[0] = '@';
		e->f_flags = n;
		if (n && bpf_probe_read_kernel(&e->path[1], n & 0xff, address + 3))
			e->f_flags = 0;
	}
	bpf_ringbuf_submit(e, 0);
	return err;
}

SEC("lsm/file_open")
int BPF_PROG(agentos_lsm_file_open, struct file *file, int ret)
{
	if (ret)
		return ret;
	__u64 cgid = bpf_get_current_cgroup_id();
	if (!bpf_map_lookup_elem(&fs_agents, &cgid))
		return 0; /* not an agent */
	unsigned int mode = file->f_mode;
	__u8 want = 0;
	if (mode & FMODE_READ)
		want |= AGENTOS_FS_READ;
	if (mode & FMODE_WRITE)
		want |= AGENTOS_FS_WRITE;
	/* Exec (__FMODE_EXEC opens) is lsm/bprm_check_security's: here it needs read only. */
	if (!want)
		return 0;
	return check(file, cgid, AGENTOS_HOOK_LSM_FILE_OPEN, want);
}

SEC("lsm/bprm_check_security")
int BPF_PROG(agentos_lsm_bprm_check, struct linux_binprm *bprm, int ret)
{
	if (ret)
		return ret;
	__u64 cgid = bpf_get_current_cgroup_id();
	if (!bpf_map_lookup_elem(&fs_agents, &cgid))
		return 0; /* not an agent */
	struct file *file = bprm->file;
	if (!file)
		return 0;
	return check(file, cgid, AGENTOS_HOOK_LSM_BPRM_CHECK, AGENTOS_FS_EXEC);
}

/* `prot` is what the kernel will apply (PROT_EXEC added for READ_IMPLIES_EXEC too); the file
 * may be NULL (anonymous memory: JITs, never checked). */
SEC("lsm/mmap_file")
int BPF_PROG(agentos_lsm_mmap_file, struct file *file, unsigned long reqprot, unsigned long prot,
	     unsigned long flags, int ret)
{
	if (ret)
		return ret;
	if (!file || !(prot & PROT_EXEC))
		return 0;
	__u64 cgid = bpf_get_current_cgroup_id();
	if (!bpf_map_lookup_elem(&fs_agents, &cgid))
		return 0; /* not an agent */
	return check(file, cgid, AGENTOS_HOOK_LSM_MMAP_FILE, AGENTOS_FS_EXEC);
}

/* mprotect() adding PROT_EXEC to a mapping of a file. The kernel gives no path here (bpf_d_path
 * is not allowed in this hook), so the grant cannot be looked up: refused for every file outside
 * the pseudo filesystems (memfd and other internal files stay allowed, as in check()). A file is
 * mapped executable at mmap(), where lsm/mmap_file checks its path: the dynamic loader does so;
 * only text relocations (DT_TEXTREL, rare, refused by SELinux's execmod too) are refused. */
SEC("lsm/file_mprotect")
int BPF_PROG(agentos_lsm_file_mprotect, struct vm_area_struct *vma, unsigned long reqprot,
	     unsigned long prot, int ret)
{
	if (ret)
		return ret;
	if (!(prot & PROT_EXEC))
		return 0;
	struct file *file = vma->vm_file;
	if (!file)
		return 0; /* anonymous memory */
	__u64 cgid = bpf_get_current_cgroup_id();
	if (!bpf_map_lookup_elem(&fs_agents, &cgid))
		return 0; /* not an agent */
	if (exempt(file)) {
		count(AGENTOS_FS_STAT_UNCHECKED);
		return 0;
	}
	return refuse(cgid, AGENTOS_HOOK_LSM_FILE_MPROTECT, -EACCES, NULL, (int)file->f_flags);
}

/* Abstract Unix socket names (sun_path[0] == 0) have no file and no permission bits, and are
 * per network namespace: an agent sharing the host's (one with network grants) could bind the
 * name of a host service before the service does and receive its clients (impersonation).
 * Refused for every agent; one without network grants is in a namespace of its own anyway.
 * Autobind (an address of the family alone) gets a fresh random name and stays allowed. Optional:
 * the daemon runs without it when it does not load (docs/security.md). */
SEC("lsm/socket_bind")
int BPF_PROG(agentos_lsm_socket_bind, struct socket *sock, struct sockaddr *address, int addrlen,
	     int ret)
{
	if (ret)
		return ret;
	__u64 cgid = bpf_get_current_cgroup_id();
	if (!bpf_map_lookup_elem(&fs_agents, &cgid))
		return 0; /* not an agent */
	if (addrlen <= 2)
		return 0;
	__u16 family = 0;
	char first = 1;
	if (bpf_probe_read_kernel(&family, sizeof(family), address))
		return 0;
	if (family != 1 /* AF_UNIX */)
		return 0;
	if (bpf_probe_read_kernel(&first, 1, (char *)address + 2))
		return 0;
	if (first != 0)
		return 0; /* a pathname socket: file permissions and Landlock decide */
	return refuse(cgid, AGENTOS_HOOK_LSM_SOCKET_BIND, -EPERM, (const char *)address, addrlen);
}

/* listen() on an IPv4/IPv6 socket that is not bound makes the kernel pick a port (autobind)
 * after every bind hook: the agent would listen on a port nobody granted. Refused for every
 * agent (EPERM): bind first, to a port net.bind grants (the cgroup bind hooks check it, and an
 * ephemeral TCP bind needs a grant of any port). Optional, like socket_bind. */
SEC("lsm/socket_listen")
int BPF_PROG(agentos_lsm_socket_listen, struct socket *sock, int backlog, int ret)
{
	if (ret)
		return ret;
	__u64 cgid = bpf_get_current_cgroup_id();
	if (!bpf_map_lookup_elem(&fs_agents, &cgid))
		return 0; /* not an agent */
	struct sock *sk = sock->sk;
	if (!sk)
		return 0;
	unsigned short family = sk->__sk_common.skc_family;
	if (family != AF_INET && family != AF_INET6)
		return 0; /* Unix sockets: a path or an abstract name, checked at bind */
	if (sk->__sk_common.skc_num != 0)
		return 0; /* bound: the cgroup bind hooks checked the port */
	return refuse(cgid, AGENTOS_HOOK_LSM_SOCKET_LISTEN, -EPERM, NULL, family);
}


/*
 * Pathname Unix sockets: Landlock ABI 9's LANDLOCK_ACCESS_FS_RESOLVE_UNIX as BPF LSM, for kernels
 * with BPF LSM and an older Landlock (and as defence in depth where both exist). A network
 * namespace does not hide these sockets (they are files) and file modes let every uid into the
 * D-Bus system bus or journald's /dev/log.
 *
 * lsm/unix_stream_connect runs for connect() on SOCK_STREAM and SOCK_SEQPACKET sockets, with the
 * listening socket found (whatever name led to it: a symbolic link, a hard link, /proc/self/fd/N
 * of an O_PATH fd); lsm/unix_may_send for connect() on a SOCK_DGRAM socket and for every datagram
 * sent (sendto/sendmsg with an address, or on a connected socket). Both see the peer socket: an
 * agent may reach it when
 *   - it is not a pathname socket (unbound: a socketpair's; abstract or autobound names are
 *     Landlock's scope (ABI 6) and lsm/socket_bind's), or
 *   - it was made in the agent's own cgroup subtree (its processes in main/, its tools beside
 *     them): the socket's cgroup (sk_cgrp_data, set when the socket is created), or
 *   - its file, as bound, lies beneath a directory granted to the agent (`fs_unix_dirs`: the
 *     daemon's socket directory RUN_DIR/agents/<tenant> and its write grants), by inode, walking
 *     the bound path's parents across mounts as Landlock walks a path.
 * Everything else is refused with EACCES (Landlock's errno) and an event in `fs_events`.
 * Processes outside agent cgroups cost one hash lookup miss (`fs_unix_agents`).
 */

#define UNIX_PATH_DEPTH 64
#define CGROUP_DEPTH 16

struct sockaddr_un {
	unsigned short sun_family;
	char sun_path[108];
} __attribute__((preserve_access_index));

struct unix_address {
	int len;
	struct sockaddr_un name[];
} __attribute__((preserve_access_index));

struct unix_sock {
	struct unix_address *addr;
	struct path path;
} __attribute__((preserve_access_index));

struct mount {
	struct mount *mnt_parent;
	struct dentry *mnt_mountpoint;
	struct vfsmount mnt;
} __attribute__((preserve_access_index));

/* The cgroup id of an agent's main leaf -> the id of its agent cgroup (main/ and tools/ below it):
 * "check this process's Unix socket peers". */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, AGENTOS_MAX_AGENTS);
	__type(key, __u64);
	__type(value, __u64);
} fs_unix_agents SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, AGENTOS_FS_MAX_UNIX_DIRS);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct agentos_unix_dir_key);
	__type(value, __u32);
} fs_unix_dirs SEC(".maps");

/* Was `peer` made by a process in the cgroup `root` or below it? */
static __always_inline int made_in_subtree(struct sock *peer, __u64 root)
{
	struct cgroup *cg = BPF_CORE_READ(peer, sk_cgrp_data.cgroup);
	for (int i = 0; i < CGROUP_DEPTH; i++) {
		if (!cg)
			return 0;
		if (BPF_CORE_READ(cg, kn, id) == root)
			return 1;
		cg = BPF_CORE_READ(cg, self.parent, cgroup);
	}
	return 0;
}

/* Is the socket file `u` was bound to beneath one of the agent's granted directories? Walks the
 * bound path up to the root of the mount tree, as Landlock walks a path: at a mount's root it
 * continues at the mount point in the parent mount. */
static __always_inline int beneath_granted(struct unix_sock *u, __u64 cgid)
{
	struct agentos_unix_dir_key key = {.cgroup_id = cgid};
	struct dentry *d = BPF_CORE_READ(u, path.dentry);
	struct vfsmount *vm = BPF_CORE_READ(u, path.mnt);
	if (!d || !vm)
		return 0;
	struct mount *m = (struct mount *)((char *)vm - bpf_core_field_offset(struct mount, mnt));
	for (int i = 0; i < UNIX_PATH_DEPTH; i++) {
		key.ino = BPF_CORE_READ(d, d_inode, i_ino);
		key.dev = BPF_CORE_READ(d, d_sb, s_dev);
		if (bpf_map_lookup_elem(&fs_unix_dirs, &key))
			return 1;
		if (d == BPF_CORE_READ(m, mnt.mnt_root)) {
			struct mount *parent = BPF_CORE_READ(m, mnt_parent);
			if (!parent || parent == m)
				return 0; /* the root of the mount tree */
			d = BPF_CORE_READ(m, mnt_mountpoint);
			m = parent;
			continue;
		}
		struct dentry *up = BPF_CORE_READ(d, d_parent);
		if (!up || up == d)
			return 0;
		d = up;
	}
	return 0;
}

static __always_inline int unix_check(struct sock *peer, __u8 hook)
{
	__u64 cgid = bpf_get_current_cgroup_id();
	__u64 *root = bpf_map_lookup_elem(&fs_unix_agents, &cgid);
	if (!root || !peer)
		return 0; /* not an agent */
	struct unix_sock *u = (struct unix_sock *)peer;
	struct unix_address *addr = BPF_CORE_READ(u, addr);
	if (!addr)
		return 0; /* unbound (a socketpair's peer) */
	int len = BPF_CORE_READ(addr, len);
	/* name[0].sun_path: the offset of the flexible array `name` (relocated) and sun_path's
	 * within the UAPI sockaddr_un (2). aya rejects an index into a flexible array in an
	 * access string, so the address is computed. */
	const char *sun_path = (const char *)addr + bpf_core_field_offset(struct unix_address, name) + 2;
	char first = 0;
	if (len <= 2 || bpf_probe_read_kernel(&first, 1, sun_path) || first == 0)
		return 0; /* abstract or autobound: not a file */
	if (made_in_subtree(peer, *root) || beneath_granted(u, cgid)) {
		count(AGENTOS_FS_STAT_ALLOWED);
		return 0;
	}
	struct agentos_fs_event *e = refusal(cgid, hook);
	if (!e)
		return -EACCES;
	e->f_flags = BPF_CORE_READ(peer, sk_type);
	/* The name the peer was bound with (as given to bind(): relative names stay relative). */
	bpf_probe_read_kernel_str(e->path, 109, sun_path);
	bpf_ringbuf_submit(e, 0);
	return -EACCES;
}

SEC("lsm/unix_stream_connect")
int BPF_PROG(agentos_lsm_unix_stream_connect, struct sock *sock, struct sock *other,
	     struct sock *newsk, int ret)
{
	if (ret)
		return ret;
	return unix_check(other, AGENTOS_HOOK_LSM_UNIX_CONNECT);
}

SEC("lsm/unix_may_send")
int BPF_PROG(agentos_lsm_unix_may_send, struct socket *sock, struct socket *other, int ret)
{
	if (ret)
		return ret;
	if (!other)
		return 0;
	return unix_check(BPF_CORE_READ(other, sk), AGENTOS_HOOK_LSM_UNIX_SEND);
}
