/* SPDX-License-Identifier: GPL-2.0 */
/*
 * scx_agentos: what the BPF scheduler and its Rust loader share. Keep in sync with
 * sched-ext/src/lib.rs (the `Class` enum and the constants there are tested against the values
 * the skeleton reports).
 */
#ifndef __SCX_AGENTOS_INTF_H
#define __SCX_AGENTOS_INTF_H

/* Value of the class map (key: cgroup id, u64 = kernfs id = the cgroup directory's inode). */
enum agentos_class {
	AGENTOS_CLASS_NORMAL	= 0, /* not in the map: treated fairly (vtime) */
	AGENTOS_CLASS_SRT	= 1, /* soft real-time agents: first, short slices */
	AGENTOS_CLASS_DT	= 2, /* delay-tolerant agents: only on otherwise idle time */
	AGENTOS_NR_CLASSES	= 3,
};

enum agentos_consts {
	AGENTOS_MAX_CGROUPS	= 16384, /* entries of the class map */
	AGENTOS_MAX_DEPTH	= 32,	 /* cgroup levels walked up from a task's cgroup */
	AGENTOS_MAX_CPUS	= 1024,	 /* CPUs scanned for a preemption victim */
	AGENTOS_SRT_MAX_STREAK	= 16,	 /* SRT slices in a row on a CPU while normal tasks wait */

	/* Dispatch queues (custom DSQ ids). */
	AGENTOS_DSQ_SRT		= 0,
	AGENTOS_DSQ_NORMAL	= 1,
	AGENTOS_DSQ_DT		= 2,
	AGENTOS_DSQ_THROTTLED	= 3, /* over their cgroup's cpu.max quota until the next period */
};

/* Slices (ns). Normal tasks get SCX_SLICE_DFL (20 ms). */
#define AGENTOS_SRT_SLICE_NS	(2ULL * 1000 * 1000)
#define AGENTOS_DT_SLICE_NS	(5ULL * 1000 * 1000)
/*
 * A DT task is dispatched ahead of the others when no DT task was dispatched for this long:
 * keeps every runnable DT task inside the kernel's 30 s watchdog while SRT and normal tasks
 * keep all CPUs busy (up to ~30 s / 50 ms = 600 runnable DT tasks).
 */
#define AGENTOS_DT_MAX_WAIT_NS	(50ULL * 1000 * 1000)

/*
 * cpu.max: sched_ext tasks are not throttled by the kernel's CFS bandwidth control, so the
 * scheduler enforces each cgroup's quota itself. A task over its quota waits in
 * AGENTOS_DSQ_THROTTLED; a timer moves it back once its cgroup's period has renewed.
 */
#define AGENTOS_BW_TIMER_NS	(5ULL * 1000 * 1000)
/* Shortest slice a bandwidth-limited task gets when little of its quota is left. */
#define AGENTOS_BW_MIN_SLICE_NS	(100ULL * 1000)
/* cpu.max quotas at or above this (µs) are "max" (the kernel passes RUNTIME_INF). */
#define AGENTOS_BW_UNLIMITED_US	(1ULL << 40)

/* Per-cgroup bandwidth state (map agentos_bw, key: cgroup id). */
struct agentos_bw {
	unsigned long long period_ns;
	unsigned long long quota_ns;
	unsigned long long period_start; /* bpf_ktime_get_ns() */
	unsigned long long used_ns;	  /* in the current period */
	unsigned long long nr_throttled; /* periods in which the quota ran out */
	unsigned long long last_throttled_period;
};

#endif /* __SCX_AGENTOS_INTF_H */
