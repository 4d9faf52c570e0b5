/* SPDX-License-Identifier: GPL-2.0 */
/*
 * scx_agentos: a sched_ext scheduler that knows agentos latency classes by cgroup.
 *
 * The loader (agentosd, or the scx_agentos binary) fills `agentos_classes`: cgroup id ->
 * AGENTOS_CLASS_SRT or AGENTOS_CLASS_DT. A task's class is the class of the nearest cgroup on
 * its path (its own cgroup, then its ancestors), so processes in child cgroups of an agent count
 * as the agent. Tasks under no listed cgroup are NORMAL; a NORMAL task with the SCHED_IDLE
 * policy counts as DT.
 *
 * Three dispatch queues, drained in this order by every CPU (a runnable SRT/NORMAL task whose
 * slice ended gets its CPU again rather than hand it to DT):
 *   SRT     FIFO, 2 ms slices;
 *   NORMAL  weighted virtual time (like scx_simple), 20 ms slices;
 *   DT      FIFO, 5 ms slices, only when SRT and NORMAL are empty.
 * Two bounds keep every runnable task inside the kernel's watchdog (30 s):
 *   - after AGENTOS_SRT_MAX_STREAK SRT slices in a row on a CPU, a waiting NORMAL task goes
 *     first;
 *   - when no DT task was dispatched for AGENTOS_DT_MAX_WAIT_NS, one goes first.
 * A waking SRT task preempts a CPU running a DT task (else a NORMAL one); a waking NORMAL task
 * preempts a CPU running a DT task.
 *
 * cpu.max: the kernel does not throttle sched_ext tasks, so this scheduler does. The nearest
 * cgroup on a task's path with a quota (from ops.cgroup_init / ops.cgroup_set_bandwidth) is
 * charged for the task's run time; a task whose cgroup used its quota in the current period
 * waits in the THROTTLED queue, and a 5 ms timer moves it back once the period renews. Slices
 * are capped to what is left of the quota, and ops.tick ends a slice that overruns it.
 *
 * If the scheduler exits or errors, the kernel moves every task back to the fair class; `exit`
 * records why for the loader.
 */
#include <scx/common.bpf.h>
#include "intf.h"

char _license[] SEC("license") = "GPL";

/*
 * scx's headers turn these constants into rodata that scx_utils fills from the running kernel's
 * BTF at load time. This loader does not: use the values of vmlinux.h (generated from the
 * 7.3.4 guest kernel; they are part of the sched_ext ABI).
 */
#undef SCX_DSQ_LOCAL
#undef SCX_SLICE_DFL
#undef SCX_KICK_PREEMPT
#undef SCX_KICK_IDLE
#undef SCX_ENQ_LAST
#undef SCX_TASK_QUEUED

#define SCHED_IDLE_POLICY 5
#define CLOCK_MONOTONIC 1
#define CLASS_NONE 255 /* cpu_ctx.cur_class of a CPU that runs nothing of ours */

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, AGENTOS_MAX_CGROUPS);
	__type(key, u64);
	__type(value, u32);
} agentos_classes SEC(".maps");

struct task_ctx {
	u32 class;
	u32 pad;
	u64 bw_cgid;	/* nearest cgroup with a cpu.max quota, 0 if none */
	u64 started_at; /* bpf_ktime_get_ns() when it last started running */
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, AGENTOS_MAX_CGROUPS);
	__type(key, u64);
	__type(value, struct agentos_bw);
} agentos_bw SEC(".maps");

struct bw_timer {
	struct bpf_timer timer;
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, u32);
	__type(value, struct bw_timer);
} bw_timers SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_TASK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct task_ctx);
} task_ctxs SEC(".maps");

struct cpu_ctx {
	u32 cur_class;	/* class of the task running here, CLASS_NONE when none */
	u32 srt_streak; /* SRT dispatches in a row while NORMAL tasks waited */
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, u32);
	__type(value, struct cpu_ctx);
} cpu_ctxs SEC(".maps");

/* Exit information for the loader (see user_exit_info_common.h). */
struct user_exit_info uei SEC(".data");

/* Global virtual time of the NORMAL queue. */
static u64 vtime_now;
/* When a DT task was last dispatched (scx_bpf_now()). */
static u64 dt_last_dispatch;

/* Counters read by the loader (`scx_agentos --stats`, tests). */
u64 nr_enqueued[AGENTOS_NR_CLASSES];
u64 nr_dispatched[AGENTOS_NR_CLASSES];
u64 nr_direct;	    /* inserted straight into an idle CPU's local queue */
u64 nr_preempt;	    /* CPUs kicked to make room for a higher class */
u64 nr_dt_rescued;  /* DT dispatched ahead because it waited AGENTOS_DT_MAX_WAIT_NS */
u64 nr_srt_yield;   /* NORMAL dispatched ahead because of AGENTOS_SRT_MAX_STREAK */
u64 nr_throttled;   /* tasks held back because their cgroup used its cpu.max quota */

static __always_inline bool vtime_before(u64 a, u64 b)
{
	return (s64)(a - b) < 0;
}

static __always_inline void count(u64 *counter)
{
	__sync_fetch_and_add(counter, 1);
}

static __always_inline u64 slice_of(u32 class)
{
	switch (class) {
	case AGENTOS_CLASS_SRT:
		return AGENTOS_SRT_SLICE_NS;
	case AGENTOS_CLASS_DT:
		return AGENTOS_DT_SLICE_NS;
	default:
		return SCX_SLICE_DFL;
	}
}

/*
 * The class of the nearest listed cgroup on @p's path; NORMAL (or DT for SCHED_IDLE) if none.
 * Also finds the nearest cgroup with a cpu.max quota (@bw_cgid, 0 if none).
 */
static u32 classify(struct task_struct *p, u64 *bw_cgid)
{
	struct cgroup *cgrp, *anc;
	u32 class = AGENTOS_CLASS_NORMAL;
	bool have_class = false;
	u32 *found;
	int level, i;

	*bw_cgid = 0;
	cgrp = scx_bpf_task_cgroup(p);
	if (cgrp) {
		level = cgrp->level;
		bpf_for(i, 0, AGENTOS_MAX_DEPTH) {
			u64 id;

			if (level - i < 1)
				break;
			anc = bpf_cgroup_ancestor(cgrp, level - i);
			if (!anc)
				break;
			id = anc->kn->id;
			bpf_cgroup_release(anc);
			if (!have_class) {
				found = bpf_map_lookup_elem(&agentos_classes, &id);
				if (found) {
					class = *found;
					have_class = true;
				}
			}
			if (!*bw_cgid && bpf_map_lookup_elem(&agentos_bw, &id))
				*bw_cgid = id;
			if (have_class && *bw_cgid)
				break;
		}
		bpf_cgroup_release(cgrp);
	}
	if (class >= AGENTOS_NR_CLASSES)
		class = AGENTOS_CLASS_NORMAL;
	if (class == AGENTOS_CLASS_NORMAL && p->policy == SCHED_IDLE_POLICY)
		class = AGENTOS_CLASS_DT;
	return class;
}

/* Classify @p and remember the class (and bandwidth cgroup) for later callbacks. */
static u32 classify_and_store(struct task_struct *p, u64 *bw_cgid)
{
	struct task_ctx *tctx;
	u32 class = classify(p, bw_cgid);

	tctx = bpf_task_storage_get(&task_ctxs, p, 0, BPF_LOCAL_STORAGE_GET_F_CREATE);
	if (tctx) {
		tctx->class = class;
		tctx->bw_cgid = *bw_cgid;
	}
	return class;
}

static struct task_ctx *task_ctx_of(struct task_struct *p)
{
	return bpf_task_storage_get(&task_ctxs, p, 0, 0);
}

static struct agentos_bw *bw_of(u64 cgid)
{
	if (!cgid)
		return NULL;
	return bpf_map_lookup_elem(&agentos_bw, &cgid);
}

/* Start a new period when the current one is over. Races between CPUs only blur the edge. */
static void bw_refresh(struct agentos_bw *bw, u64 now)
{
	u64 start = bw->period_start;

	if (!bw->period_ns || now - start < bw->period_ns)
		return;
	bw->period_start = now - (now - start) % bw->period_ns;
	bw->used_ns = 0;
}

/* Whether @bw's quota for the current period is used up (counts a throttled period once). */
static bool bw_exhausted(struct agentos_bw *bw, u64 now)
{
	bw_refresh(bw, now);
	if (bw->used_ns < bw->quota_ns)
		return false;
	if (bw->last_throttled_period != bw->period_start) {
		bw->last_throttled_period = bw->period_start;
		__sync_fetch_and_add(&bw->nr_throttled, 1);
	}
	return true;
}

static bool throttled(u64 bw_cgid)
{
	struct agentos_bw *bw = bw_of(bw_cgid);

	return bw && bw_exhausted(bw, bpf_ktime_get_ns());
}

/* Record (or forget) the cpu.max of cgroup @id. */
static void bw_set(u64 id, u64 period_us, u64 quota_us)
{
	struct agentos_bw fresh = {}, *bw;

	if (!period_us || !quota_us || quota_us >= AGENTOS_BW_UNLIMITED_US) {
		bpf_map_delete_elem(&agentos_bw, &id);
		return;
	}
	bw = bpf_map_lookup_elem(&agentos_bw, &id);
	if (bw) {
		bw->period_ns = period_us * 1000;
		bw->quota_ns = quota_us * 1000;
		return;
	}
	fresh.period_ns = period_us * 1000;
	fresh.quota_ns = quota_us * 1000;
	fresh.period_start = bpf_ktime_get_ns();
	bpf_map_update_elem(&agentos_bw, &id, &fresh, BPF_ANY);
}

static struct cpu_ctx *this_cpu_ctx(void)
{
	u32 zero = 0;

	return bpf_map_lookup_elem(&cpu_ctxs, &zero);
}

/*
 * Make room for a waking task of @class when no CPU is idle: kick a CPU that runs a DT task
 * (SRT and NORMAL wakers), else one that runs a NORMAL task (SRT wakers only).
 */
static void preempt_for(struct task_struct *p, u32 class)
{
	s32 dt_victim = -1, normal_victim = -1;
	u32 nr_cpus, zero = 0;
	int i;

	if (class == AGENTOS_CLASS_DT)
		return;
	nr_cpus = scx_bpf_nr_cpu_ids();
	bpf_for(i, 0, AGENTOS_MAX_CPUS) {
		struct cpu_ctx *c;

		if (i >= nr_cpus)
			break;
		if (!bpf_cpumask_test_cpu(i, p->cpus_ptr))
			continue;
		c = bpf_map_lookup_percpu_elem(&cpu_ctxs, &zero, i);
		if (!c)
			continue;
		if (c->cur_class == AGENTOS_CLASS_DT) {
			dt_victim = i;
			break;
		}
		if (c->cur_class == AGENTOS_CLASS_NORMAL && normal_victim < 0)
			normal_victim = i;
	}
	if (dt_victim < 0 && class == AGENTOS_CLASS_SRT)
		dt_victim = normal_victim;
	if (dt_victim >= 0) {
		scx_bpf_kick_cpu(dt_victim, SCX_KICK_PREEMPT);
		count(&nr_preempt);
	}
}

s32 BPF_STRUCT_OPS(agentos_select_cpu, struct task_struct *p, s32 prev_cpu, u64 wake_flags)
{
	bool is_idle = false;
	u64 bw_cgid;
	u32 class = classify_and_store(p, &bw_cgid);
	s32 cpu;

	cpu = scx_bpf_select_cpu_dfl(p, prev_cpu, wake_flags, &is_idle);
	/* A throttled task must go through enqueue (the THROTTLED queue). */
	if (is_idle && !throttled(bw_cgid)) {
		scx_bpf_dsq_insert(p, SCX_DSQ_LOCAL, slice_of(class), 0);
		count(&nr_direct);
	}
	return cpu;
}

void BPF_STRUCT_OPS(agentos_enqueue, struct task_struct *p, u64 enq_flags)
{
	u64 bw_cgid;
	u32 class = classify_and_store(p, &bw_cgid);
	s32 idle;

	count(&nr_enqueued[class % AGENTOS_NR_CLASSES]);
	if (throttled(bw_cgid)) {
		scx_bpf_dsq_insert(p, AGENTOS_DSQ_THROTTLED, slice_of(class), enq_flags);
		count(&nr_throttled);
		return;
	}
	/*
	 * SCX_OPS_ENQ_LAST: the task's slice ran out and nothing else wants this CPU. Without the
	 * flag the kernel would refill the slice itself, bypassing the quota check above.
	 */
	if (enq_flags & SCX_ENQ_LAST) {
		scx_bpf_dsq_insert(p, SCX_DSQ_LOCAL, slice_of(class), enq_flags);
		return;
	}
	if (class == AGENTOS_CLASS_SRT) {
		scx_bpf_dsq_insert(p, AGENTOS_DSQ_SRT, AGENTOS_SRT_SLICE_NS, enq_flags);
	} else if (class == AGENTOS_CLASS_DT) {
		scx_bpf_dsq_insert(p, AGENTOS_DSQ_DT, AGENTOS_DT_SLICE_NS, enq_flags);
	} else {
		u64 vtime = p->scx.dsq_vtime;

		/* A task that slept long gets at most one slice of credit. */
		if (vtime_before(vtime, vtime_now - SCX_SLICE_DFL))
			vtime = vtime_now - SCX_SLICE_DFL;
		scx_bpf_dsq_insert_vtime(p, AGENTOS_DSQ_NORMAL, SCX_SLICE_DFL, vtime, enq_flags);
	}
	/* Wake an idle CPU for the shared queue, or make room on a busy one. */
	idle = scx_bpf_pick_idle_cpu(p->cpus_ptr, 0);
	if (idle >= 0)
		scx_bpf_kick_cpu(idle, SCX_KICK_IDLE);
	else
		preempt_for(p, class);
}

static bool dispatch_from(u64 dsq, u32 class)
{
	if (!scx_bpf_dsq_move_to_local(dsq, 0))
		return false;
	count(&nr_dispatched[class]);
	return true;
}

void BPF_STRUCT_OPS(agentos_dispatch, s32 cpu, struct task_struct *prev)
{
	struct cpu_ctx *c = this_cpu_ctx();
	u64 now = scx_bpf_now();

	if (!c)
		return;
	/* Starvation bound for DT. */
	if (scx_bpf_dsq_nr_queued(AGENTOS_DSQ_DT) > 0 &&
	    now - dt_last_dispatch > AGENTOS_DT_MAX_WAIT_NS &&
	    dispatch_from(AGENTOS_DSQ_DT, AGENTOS_CLASS_DT)) {
		dt_last_dispatch = now;
		count(&nr_dt_rescued);
		return;
	}
	/* SRT first, unless it has had the CPU for a while and NORMAL tasks wait. */
	if (c->srt_streak >= AGENTOS_SRT_MAX_STREAK &&
	    scx_bpf_dsq_nr_queued(AGENTOS_DSQ_NORMAL) > 0 &&
	    dispatch_from(AGENTOS_DSQ_NORMAL, AGENTOS_CLASS_NORMAL)) {
		c->srt_streak = 0;
		count(&nr_srt_yield);
		return;
	}
	if (dispatch_from(AGENTOS_DSQ_SRT, AGENTOS_CLASS_SRT)) {
		c->srt_streak++;
		return;
	}
	/*
	 * @prev is in no queue while this runs: a CPU-bound SRT task does not hold its CPU against
	 * queued NORMAL tasks here (doing so starved a kernel thread into an RCU stall in the VM).
	 */
	c->srt_streak = 0;
	if (dispatch_from(AGENTOS_DSQ_NORMAL, AGENTOS_CLASS_NORMAL))
		return;
	/*
	 * Only DT is queued. A still-runnable SRT/NORMAL @prev (in no queue while this runs) keeps
	 * the CPU: dispatch nothing and the kernel hands @prev back to enqueue() with SCX_ENQ_LAST,
	 * which puts it on this CPU again. DT still gets its turn through the bound above.
	 */
	if (prev && (prev->scx.flags & SCX_TASK_QUEUED)) {
		struct task_ctx *pctx = task_ctx_of(prev);

		if (pctx && pctx->class != AGENTOS_CLASS_DT && !throttled(pctx->bw_cgid))
			return;
	}
	if (dispatch_from(AGENTOS_DSQ_DT, AGENTOS_CLASS_DT))
		dt_last_dispatch = now;
}

void BPF_STRUCT_OPS(agentos_running, struct task_struct *p)
{
	struct cpu_ctx *c = this_cpu_ctx();
	struct task_ctx *tctx = task_ctx_of(p);
	u32 class = tctx ? tctx->class : AGENTOS_CLASS_NORMAL;
	struct agentos_bw *bw;
	u64 now = bpf_ktime_get_ns(), left;

	if (c)
		c->cur_class = class;
	if (class == AGENTOS_CLASS_NORMAL && vtime_before(vtime_now, p->scx.dsq_vtime))
		vtime_now = p->scx.dsq_vtime;
	if (!tctx)
		return;
	tctx->started_at = now;
	/* No slice longer than what is left of the cgroup's quota. */
	if ((bw = bw_of(tctx->bw_cgid))) {
		bw_refresh(bw, now);
		left = bw->used_ns < bw->quota_ns ? bw->quota_ns - bw->used_ns : 0;
		if (left < AGENTOS_BW_MIN_SLICE_NS)
			left = AGENTOS_BW_MIN_SLICE_NS;
		if (left < p->scx.slice)
			scx_bpf_task_set_slice(p, left);
	}
}

void BPF_STRUCT_OPS(agentos_stopping, struct task_struct *p, bool runnable)
{
	struct cpu_ctx *c = this_cpu_ctx();
	struct task_ctx *tctx = task_ctx_of(p);
	struct agentos_bw *bw;
	u64 ran;

	if (c)
		c->cur_class = CLASS_NONE;
	if (!tctx || !tctx->started_at)
		return;
	ran = bpf_ktime_get_ns() - tctx->started_at;
	tctx->started_at = 0;
	if ((bw = bw_of(tctx->bw_cgid)))
		__sync_fetch_and_add(&bw->used_ns, ran);
	if (tctx->class != AGENTOS_CLASS_NORMAL)
		return;
	/* Charge the time used, inversely to the weight (nice). */
	scx_bpf_task_set_dsq_vtime(p, p->scx.dsq_vtime + ran * 100 / p->scx.weight);
}

/* End the slice of a task whose cgroup has used its quota meanwhile. */
void BPF_STRUCT_OPS(agentos_tick, struct task_struct *p)
{
	struct task_ctx *tctx = task_ctx_of(p);
	struct agentos_bw *bw;

	if (!tctx || !tctx->started_at || !(bw = bw_of(tctx->bw_cgid)))
		return;
	if (bw->used_ns + (bpf_ktime_get_ns() - tctx->started_at) >= bw->quota_ns)
		scx_bpf_task_set_slice(p, 0);
}

/* Every AGENTOS_BW_TIMER_NS: move throttled tasks whose cgroup's period renewed back. */
static int bw_timerfn(void *map, int *key, struct bpf_timer *timer)
{
	struct task_struct *p;
	bool moved = false;
	u32 nr_cpus;
	int i;

	if (scx_bpf_dsq_nr_queued(AGENTOS_DSQ_THROTTLED) > 0) {
		bpf_for_each(scx_dsq, p, AGENTOS_DSQ_THROTTLED, 0) {
			struct task_ctx *tctx = bpf_task_storage_get(&task_ctxs, p, 0, 0);
			u32 class = AGENTOS_CLASS_NORMAL;

			if (tctx) {
				if (throttled(tctx->bw_cgid))
					continue;
				class = tctx->class;
			}
			if (class == AGENTOS_CLASS_SRT) {
				scx_bpf_dsq_move(BPF_FOR_EACH_ITER, p, AGENTOS_DSQ_SRT, 0);
			} else if (class == AGENTOS_CLASS_DT) {
				scx_bpf_dsq_move(BPF_FOR_EACH_ITER, p, AGENTOS_DSQ_DT, 0);
			} else {
				scx_bpf_dsq_move_set_vtime(BPF_FOR_EACH_ITER, vtime_now);
				scx_bpf_dsq_move_vtime(BPF_FOR_EACH_ITER, p, AGENTOS_DSQ_NORMAL, 0);
			}
			moved = true;
		}
	}
	if (moved) {
		nr_cpus = scx_bpf_nr_cpu_ids();
		bpf_for(i, 0, AGENTOS_MAX_CPUS) {
			if (i >= nr_cpus)
				break;
			scx_bpf_kick_cpu(i, SCX_KICK_IDLE);
		}
	}
	bpf_timer_start(timer, AGENTOS_BW_TIMER_NS, 0);
	return 0;
}

s32 BPF_STRUCT_OPS(agentos_cgroup_init, struct cgroup *cgrp, struct scx_cgroup_init_args *args)
{
	bw_set(cgrp->kn->id, args->bw_period_us, args->bw_quota_us);
	return 0;
}

void BPF_STRUCT_OPS(agentos_cgroup_set_bandwidth, struct cgroup *cgrp, u64 period_us,
		    u64 quota_us, u64 burst_us)
{
	bw_set(cgrp->kn->id, period_us, quota_us);
}

void BPF_STRUCT_OPS(agentos_cgroup_exit, struct cgroup *cgrp)
{
	u64 id = cgrp->kn->id;

	bpf_map_delete_elem(&agentos_bw, &id);
}

void BPF_STRUCT_OPS(agentos_enable, struct task_struct *p)
{
	scx_bpf_task_set_dsq_vtime(p, vtime_now);
}

s32 BPF_STRUCT_OPS_SLEEPABLE(agentos_init)
{
	s32 ret;

	ret = scx_bpf_create_dsq(AGENTOS_DSQ_SRT, -1);
	if (ret)
		return ret;
	ret = scx_bpf_create_dsq(AGENTOS_DSQ_NORMAL, -1);
	if (ret)
		return ret;
	ret = scx_bpf_create_dsq(AGENTOS_DSQ_DT, -1);
	if (ret)
		return ret;
	ret = scx_bpf_create_dsq(AGENTOS_DSQ_THROTTLED, -1);
	if (ret)
		return ret;

	struct bw_timer *t;
	u32 zero = 0;

	t = bpf_map_lookup_elem(&bw_timers, &zero);
	if (!t)
		return -ESRCH;
	bpf_timer_init(&t->timer, &bw_timers, CLOCK_MONOTONIC);
	bpf_timer_set_callback(&t->timer, bw_timerfn);
	return bpf_timer_start(&t->timer, AGENTOS_BW_TIMER_NS, 0);
}

void BPF_STRUCT_OPS(agentos_exit, struct scx_exit_info *ei)
{
	bpf_probe_read_kernel_str(uei.reason, sizeof(uei.reason), ei->reason);
	bpf_probe_read_kernel_str(uei.msg, sizeof(uei.msg), ei->msg);
	uei.exit_code = ei->exit_code;
	uei.exit_cpu = -1;
	/* Publish kind last: the loader polls it. */
	__sync_val_compare_and_swap(&uei.kind, uei.kind, ei->kind);
}

SCX_OPS_DEFINE(agentos_ops,
	       .select_cpu	= (void *)agentos_select_cpu,
	       .enqueue		= (void *)agentos_enqueue,
	       .dispatch	= (void *)agentos_dispatch,
	       .running		= (void *)agentos_running,
	       .stopping	= (void *)agentos_stopping,
	       .tick		= (void *)agentos_tick,
	       .cgroup_init	= (void *)agentos_cgroup_init,
	       .cgroup_exit	= (void *)agentos_cgroup_exit,
	       .cgroup_set_bandwidth = (void *)agentos_cgroup_set_bandwidth,
	       .enable		= (void *)agentos_enable,
	       .init		= (void *)agentos_init,
	       .exit		= (void *)agentos_exit,
	       .flags		= SCX_OPS_ENQ_LAST,
	       .name		= "agentos");
