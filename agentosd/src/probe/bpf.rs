//! The BTF, tracefs and BPF rows: each program type agentos uses is loaded as a two-instruction
//! program and closed again, the ring buffer map is created and closed. Nothing is attached.

use std::path::Path;

use nix::errno::Errno;

use super::report::{Check, Feature, Status};
use super::{Ctx, btf, io_errno, sched::probe_sched_ext};
use crate::sys::bpf as sys;

/// Type ids found in vmlinux BTF, one per wanted name, or why there are none.
type BtfIds = Result<Vec<Option<u32>>, String>;

const VMLINUX: &str = "/sys/kernel/btf/vmlinux";

/// Produces the Btf, Tracefs, Bpf*, and SchedExt rows; returns whether vmlinux BTF exists.
pub(super) fn probe_bpf(ctx: &Ctx, rows: &mut Vec<Check>) -> bool {
    let wanted = [
        (btf::Kind::Func, "bpf_lsm_file_open"),
        (btf::Kind::Func, "vfs_read"),
        (btf::Kind::Typedef, "btf_trace_sys_enter"),
        (btf::Kind::Struct, "sched_ext_ops"),
    ];
    let (btf_present, ids) = btf_row(&wanted, rows);
    let id =
        |i: usize| -> Result<u32, String> {
            match &ids {
                Ok(v) => v.get(i).copied().flatten().ok_or_else(|| {
                    format!("no {} in {VMLINUX}", wanted.get(i).map_or("?", |w| w.1))
                }),
                Err(e) => Err(e.clone()),
            }
        };
    rows.push(probe_sched_ext(
        ids.as_ref()
            .ok()
            .map(|v| v.get(3).copied().flatten().is_some()),
    ));

    rows.push(tracefs_row());

    use sys::ProgSpec;
    let plain = |prog_type, expected_attach_type, ret| {
        Ok(ProgSpec {
            prog_type,
            expected_attach_type,
            attach_btf_id: 0,
            ret,
        })
    };
    let with_btf = |prog_type, expected_attach_type, idx: usize| {
        id(idx).map(|attach_btf_id| ProgSpec {
            prog_type,
            expected_attach_type,
            attach_btf_id,
            ret: 0,
        })
    };
    let progs: [(Feature, &str, Result<ProgSpec, String>); 7] = [
        (
            Feature::BpfTracepoint,
            "BPF_PROG_TYPE_TRACEPOINT",
            plain(sys::BPF_PROG_TYPE_TRACEPOINT, 0, 0),
        ),
        (
            Feature::BpfRawTracepoint,
            "BPF_PROG_TYPE_RAW_TRACEPOINT",
            plain(sys::BPF_PROG_TYPE_RAW_TRACEPOINT, 0, 0),
        ),
        (
            Feature::BpfTpBtf,
            "BPF_PROG_TYPE_TRACING/BPF_TRACE_RAW_TP (btf_trace_sys_enter)",
            with_btf(sys::BPF_PROG_TYPE_TRACING, sys::BPF_TRACE_RAW_TP, 2),
        ),
        (
            Feature::BpfCgroupSockAddr,
            "BPF_PROG_TYPE_CGROUP_SOCK_ADDR/BPF_CGROUP_INET4_CONNECT",
            plain(
                sys::BPF_PROG_TYPE_CGROUP_SOCK_ADDR,
                sys::BPF_CGROUP_INET4_CONNECT,
                1,
            ),
        ),
        (
            Feature::BpfCgroupSkb,
            "BPF_PROG_TYPE_CGROUP_SKB/BPF_CGROUP_INET_EGRESS",
            plain(
                sys::BPF_PROG_TYPE_CGROUP_SKB,
                sys::BPF_CGROUP_INET_EGRESS,
                1,
            ),
        ),
        (
            Feature::BpfLsm,
            "BPF_PROG_TYPE_LSM (bpf_lsm_file_open)",
            with_btf(sys::BPF_PROG_TYPE_LSM, sys::BPF_LSM_MAC, 0),
        ),
        (
            Feature::BpfFentry,
            "BPF_PROG_TYPE_TRACING/BPF_TRACE_FENTRY (vfs_read)",
            with_btf(sys::BPF_PROG_TYPE_TRACING, sys::BPF_TRACE_FENTRY, 1),
        ),
    ];
    for (m, what, spec) in progs {
        rows.push(match spec {
            Err(why) => Check::new(
                m,
                Status::Unavailable,
                format!("BPF_PROG_LOAD {what}: not tried: {why}"),
            ),
            Ok(spec) => match sys::bpf_prog_load_trivial(spec) {
                Ok(()) => Check::new(
                    m,
                    Status::Available,
                    format!("BPF_PROG_LOAD {what}: loaded a 2-instruction program"),
                ),
                Err(e) => bpf_error(
                    ctx,
                    m,
                    &format!("BPF_PROG_LOAD {what}"),
                    e.errno,
                    e.log.as_deref(),
                ),
            },
        });
    }
    rows.push(match sys::bpf_ringbuf_create() {
        Ok(()) => Check::new(
            Feature::BpfRingbuf,
            Status::Available,
            "BPF_MAP_CREATE BPF_MAP_TYPE_RINGBUF: created a one-page ring buffer",
        ),
        Err(e) => bpf_error(
            ctx,
            Feature::BpfRingbuf,
            "BPF_MAP_CREATE BPF_MAP_TYPE_RINGBUF",
            e,
            None,
        ),
    });
    btf_present
}

/// The Btf row; returns whether vmlinux BTF exists and the type ids of `wanted` in it (or why
/// they cannot be known).
fn btf_row(wanted: &[(btf::Kind, &str)], rows: &mut Vec<Check>) -> (bool, BtfIds) {
    match std::fs::read(VMLINUX) {
        Ok(data) => match btf::find_type_ids(&data, wanted) {
            Ok(ids) => {
                rows.push(Check::new(
                    Feature::Btf,
                    Status::Available,
                    format!("{VMLINUX} ({} KiB)", data.len() / 1024),
                ));
                (true, Ok(ids))
            }
            Err(e) => {
                rows.push(Check::new(
                    Feature::Btf,
                    Status::Error,
                    format!("{VMLINUX}: {e}"),
                ));
                (true, Err(format!("{VMLINUX} unreadable: {e}")))
            }
        },
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            rows.push(Check::new(
                Feature::Btf,
                Status::Unavailable,
                format!("no {VMLINUX} — kernel built without CONFIG_DEBUG_INFO_BTF (CO-RE and LSM/fentry hooks need it)"),
            ));
            (false, Err(format!("no {VMLINUX}")))
        }
        Err(e) => {
            let msg = format!("cannot read {VMLINUX}: {}", io_errno(&e));
            rows.push(Check::new(Feature::Btf, Status::Error, msg.clone()));
            (true, Err(msg))
        }
    }
}

/// The Tracefs row: tracepoint programs are attached by name through tracefs.
fn tracefs_row() -> Check {
    if Path::new("/sys/kernel/tracing/events").is_dir() {
        Check::new(Feature::Tracefs, Status::Available, "/sys/kernel/tracing")
    } else if Path::new("/sys/kernel/debug/tracing/events").is_dir() {
        Check::new(
            Feature::Tracefs,
            Status::Available,
            "/sys/kernel/debug/tracing",
        )
    } else if Path::new("/sys/kernel/tracing").is_dir() {
        Check::new(
            Feature::Tracefs,
            Status::Unavailable,
            "not mounted (mount -t tracefs tracefs /sys/kernel/tracing); tracepoint programs load but cannot be attached by name",
        )
    } else {
        Check::new(
            Feature::Tracefs,
            Status::Unavailable,
            "no /sys/kernel/tracing — kernel built without CONFIG_TRACING",
        )
    }
}

fn bpf_error(ctx: &Ctx, m: Feature, what: &str, errno: Errno, log: Option<&str>) -> Check {
    let log = log.map(|l| format!("; verifier: {l}")).unwrap_or_default();
    let (status, why) = match errno {
        Errno::EPERM | Errno::EACCES if !ctx.privileged => (
            Status::Error,
            "this process lacks CAP_BPF/CAP_SYS_ADMIN; run the check as root".to_string(),
        ),
        Errno::EPERM if m == Feature::BpfLsm => (
            Status::Unavailable,
            match &ctx.lsm {
                Some(l) if !l.iter().any(|x| x == "bpf") => {
                    format!(
                        "lsm= lacks bpf (active: {}); add bpf to lsm= on the kernel command line",
                        l.join(",")
                    )
                }
                _ => "kernel lockdown or lsm= lacks bpf".to_string(),
            },
        ),
        Errno::EPERM => (
            Status::Unavailable,
            match &ctx.lockdown {
                Some(l) => format!("refused by the kernel (lockdown: {l})"),
                None => "refused by the kernel (lockdown or a security policy)".to_string(),
            },
        ),
        Errno::ENOSYS => (
            Status::Unavailable,
            "kernel built without CONFIG_BPF_SYSCALL".to_string(),
        ),
        // 524 is the kernel-internal ENOTSUPP, which BPF lets escape to user space.
        e if matches!(e, Errno::EINVAL | Errno::E2BIG | Errno::EOPNOTSUPP) || e as i32 == 524 => (
            Status::Unavailable,
            "the kernel does not support this program or map type".to_string(),
        ),
        _ => (Status::Error, "unexpected error".to_string()),
    };
    Check::new(m, status, format!("{what}: {errno:?} — {why}{log}"))
}
