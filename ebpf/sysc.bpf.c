// SPDX-License-Identifier: GPL-2.0-only
/*
 * agentos per-agent syscall counts (opt-in: `agentosd --syscall-counts`). One program on the
 * global syscall-entry hook: every syscall of every process on the host runs it, so it does the
 * least it can: read the caller's cgroup id, look it up in `sysc_counts` (entries exist for
 * agents only), and add one to that CPU's counter when found. Nothing else: no syscall number,
 * no events. agentosd sums the per-CPU values for `agentctl status`.
 *
 * Two attachments of the same body, the daemon loads one:
 *   - tp_btf/sys_enter: a BTF-typed raw tracepoint (no tracefs, no perf buffer of arguments);
 *   - tracepoint/raw_syscalls/sys_enter: the classic tracepoint (needs tracefs; the kernel
 *     copies the arguments into a perf record before the program runs), kept for comparison
 *     (agentosd/examples/sysc_overhead.rs) and for kernels without BTF.
 */
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#include "intf.h"

char LICENSE[] SEC("license") = "GPL";

/* Agent cgroup id -> syscalls entered by its processes, per CPU. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_HASH);
	__uint(max_entries, AGENTOS_MAX_AGENTS);
	__type(key, __u64);
	__type(value, __u64);
} sysc_counts SEC(".maps");

static __always_inline int count(void)
{
	__u64 cgid = bpf_get_current_cgroup_id();
	__u64 *n = bpf_map_lookup_elem(&sysc_counts, &cgid);
	/* Per-CPU value and the program cannot be re-entered on this CPU: no atomic needed. */
	if (n)
		*n += 1;
	return 0;
}

SEC("tp_btf/sys_enter")
int agentos_sysc(void *ctx)
{
	return count();
}

SEC("tracepoint/raw_syscalls/sys_enter")
int agentos_sysc_tp(void *ctx)
{
	return count();
}
