//! The scheduling rows: `SCHED_DEADLINE` set for real on a throw-away thread, and sched_ext's
//! state in sysfs.

use nix::errno::Errno;

use super::report::{Check, Feature, Status};
use super::{Ctx, io_errno, read_trimmed};
use crate::sys::sched as sys;

pub(super) fn probe_sched_deadline(ctx: &Ctx) -> Check {
    let m = Feature::SchedDeadline;
    // The same sysctls, read the same way, as the daemon's admission (`sched::admission_config`).
    let bandwidth = match (
        sys::sysctl("sched_rt_runtime_us"),
        sys::sysctl("sched_rt_period_us"),
    ) {
        (Some(-1), _) => "admission limit: none (sched_rt_runtime_us = -1)".to_string(),
        (Some(r), Some(p)) if p > 0 => format!(
            "admission limit {}% of each CPU (sched_rt_runtime_us {r} / sched_rt_period_us {p})",
            r * 100 / p
        ),
        _ => "admission limit unknown (cannot read sched_rt_runtime_us)".to_string(),
    };
    // 1 ms every 100 ms: 1% of a CPU, for the microseconds the probe thread lives.
    let attempt = std::thread::Builder::new()
        .name("probe-deadline".into())
        .spawn(|| {
            let res = sys::set_self(sys::SCHED_DEADLINE, 1_000_000, 100_000_000, 100_000_000);
            if res.is_ok() {
                // Give the bandwidth back before exiting.
                let _ = sys::set_self(sys::SCHED_OTHER, 0, 0, 0);
            }
            res
        });
    let res = match attempt {
        Ok(h) => match h.join() {
            Ok(r) => r,
            Err(_) => return Check::new(m, Status::Error, "probe thread panicked"),
        },
        Err(e) => {
            return Check::new(
                m,
                Status::Error,
                format!("cannot start probe thread: {}", io_errno(&e)),
            );
        }
    };
    match res {
        Ok(()) => Check::new(
            m,
            Status::Available,
            format!("sched_setattr(SCHED_DEADLINE 1ms/100ms) on a probe thread; {bandwidth}"),
        ),
        Err(Errno::EPERM) if !ctx.sys_nice => Check::new(
            m,
            Status::Error,
            "sched_setattr(SCHED_DEADLINE): EPERM — this process lacks CAP_SYS_NICE; run the check as root",
        ),
        Err(Errno::EPERM) => Check::new(
            m,
            Status::Unavailable,
            format!(
                "sched_setattr(SCHED_DEADLINE): EPERM — needs CAP_SYS_NICE, and the thread's CPU affinity must span its root domain (a restricted cpuset refuses it); {bandwidth}"
            ),
        ),
        Err(Errno::EBUSY) => Check::new(
            m,
            Status::Unavailable,
            format!(
                "sched_setattr(SCHED_DEADLINE): EBUSY — admission control refused even 1%; {bandwidth}"
            ),
        ),
        Err(e @ (Errno::EINVAL | Errno::ENOSYS)) => Check::new(
            m,
            Status::Unavailable,
            format!("sched_setattr(SCHED_DEADLINE): {e:?} — kernel without SCHED_DEADLINE"),
        ),
        Err(e) => Check::new(
            m,
            Status::Error,
            format!("sched_setattr(SCHED_DEADLINE): {e:?}; {bandwidth}"),
        ),
    }
}

/// Whether the kernel takes a slice request for a `SCHED_OTHER` thread: asked for 100 µs on a
/// throw-away thread at its own nice value and read back with `sched_getattr`.
pub(super) fn probe_sched_slice() -> Check {
    let m = Feature::SchedSlice;
    let ask = crate::agent_work::PROBE_SLICE_US * 1000;
    let attempt = std::thread::Builder::new()
        .name("probe-slice".into())
        .spawn(move || -> std::io::Result<Option<u64>> {
            let nice = crate::agent_work::thread_nice()?;
            crate::agent_work::set_thread_priority(nice, ask)
        });
    let res = match attempt.map(|h| h.join()) {
        Ok(Ok(r)) => r,
        Ok(Err(_)) => return Check::new(m, Status::Error, "probe thread panicked"),
        Err(e) => {
            return Check::new(
                m,
                Status::Error,
                format!("cannot start probe thread: {}", io_errno(&e)),
            );
        }
    };
    match res {
        Ok(Some(got)) if got == ask => Check::new(
            m,
            Status::Available,
            format!(
                "sched_setattr(SCHED_OTHER, sched_runtime {ask} ns) on a probe thread, read back \
                 {got} ns: --agent-work-slice-us takes effect"
            ),
        ),
        Ok(Some(got)) => Check::new(
            m,
            Status::Unavailable,
            format!(
                "sched_setattr(SCHED_OTHER, sched_runtime {ask} ns) accepted, sched_getattr reads \
                 {got} ns back: this kernel (before Linux 6.12) does not take slice requests: \
                 --agent-work-slice-us has no effect"
            ),
        ),
        Ok(None) => Check::new(m, Status::Error, "no slice was asked"),
        Err(e) => Check::new(
            m,
            Status::Unavailable,
            format!(
                "sched_setattr(SCHED_OTHER, sched_runtime {ask} ns): {} — --agent-work-slice-us \
                 has no effect",
                io_errno(&e)
            ),
        ),
    }
}

pub(super) fn probe_sched_ext(has_ops_btf: Option<bool>) -> Check {
    let m = Feature::SchedExt;
    match read_trimmed("/sys/kernel/sched_ext/state") {
        Ok(state) => {
            let ops = read_trimmed("/sys/kernel/sched_ext/root/ops")
                .ok()
                .filter(|s| !s.is_empty());
            let detail = match (state.as_str(), ops) {
                ("disabled", _) => "/sys/kernel/sched_ext/state: disabled (no BPF scheduler loaded; scx_agentos can load: agentosd --sched-ext)".to_string(),
                ("enabled", Some(ops)) if scx_agentos::is_agentos_ops(&ops) => format!("/sys/kernel/sched_ext/state: enabled, scx_agentos loaded (root/ops {ops}): SRT first, DT on idle time"),
                (s, Some(ops)) => format!("/sys/kernel/sched_ext/state: {s}, scheduler {ops} loaded (another scheduler blocks scx_agentos until it exits)"),
                (s, None) => format!("/sys/kernel/sched_ext/state: {s}"),
            };
            Check::new(m, Status::Available, detail)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Check::new(
            m,
            Status::Unavailable,
            format!(
                "no /sys/kernel/sched_ext — kernel built without CONFIG_SCHED_CLASS_EXT{} (SRT falls back to cpu.weight)",
                match has_ops_btf {
                    Some(false) => "; vmlinux BTF has no sched_ext_ops",
                    _ => "",
                }
            ),
        ),
        Err(e) => Check::new(
            m,
            Status::Error,
            format!("cannot read /sys/kernel/sched_ext/state: {}", io_errno(&e)),
        ),
    }
}
