//! Probe tests. The ones named `host_*` assert what this machine's kernel really does
//! (shared/notes/MACHINE.md): they recognise the development host (kernel 6.18, hybrid cgroups
//! with cgroup2 at /sys/fs/cgroup/unified), the H100-style pure-v2 6.18 host, and the 7.3 guest
//! VM, and skip with a message elsewhere or when not root.

use super::*;

fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

/// Which measured machine this is, if any.
#[derive(Debug, PartialEq)]
enum Machine {
    /// Development host / CI: 6.18, hybrid cgroups, locked-down BPF, no sched_ext.
    DevHost,
    /// 6.18, pure cgroup v2 with controllers, locked-down BPF, no sched_ext (accelerator VM).
    PureV2Locked,
    /// The 7.3 guest VM with systemd, cgroup v2 controllers, BPF LSM and sched_ext.
    GuestVm,
    Unknown,
}

fn machine(r: &HostReport) -> Machine {
    let rel = r.kernel_release.as_str();
    match (rel, r.cgroup.layout, r.cgroup.mount.as_deref()) {
        (rel, CgroupLayout::Hybrid, Some(m))
            if rel.starts_with("6.18") && m == Path::new("/sys/fs/cgroup/unified") =>
        {
            Machine::DevHost
        }
        (rel, CgroupLayout::Unified, Some(m))
            if rel.starts_with("6.18") && m == Path::new("/sys/fs/cgroup") =>
        {
            Machine::PureV2Locked
        }
        (rel, CgroupLayout::Unified, _) if rel.starts_with("7.3") => Machine::GuestVm,
        _ => Machine::Unknown,
    }
}

fn report() -> HostReport {
    probe(&ProbeOptions::default())
}

fn assert_status(r: &HostReport, m: Feature, want: Status) {
    let c = r.check(m).expect("every mechanism has a row");
    assert_eq!(c.status, want, "{}", c.summary());
}

#[test]
fn every_mechanism_has_exactly_one_row_in_order() {
    let r = report();
    let got: Vec<Feature> = r.checks.iter().map(|c| c.mechanism).collect();
    assert_eq!(got, Feature::ALL.to_vec());
    for c in &r.checks {
        assert!(!c.detail.is_empty(), "{:?} has no detail", c.mechanism);
        assert!(
            !c.detail.contains("internal error"),
            "a probe group panicked: {}",
            c.summary()
        );
    }
}

#[test]
fn report_round_trips_through_json() {
    let r = report();
    let json = r.to_json();
    let back: HostReport = serde_json::from_str(&json).expect("json parses back");
    assert_eq!(back, r);
    assert!(json.contains("\"mechanism\": \"bpf_lsm\""), "{json}");
    assert!(json.contains("\"status\": \"available\""), "{json}");
}

#[test]
fn table_has_aligned_columns_and_every_row() {
    let r = report();
    let table = r.render_table();
    let header = table
        .lines()
        .find(|l| l.starts_with("MECHANISM"))
        .expect("header line");
    let status_col = header.find("STATUS").expect("STATUS column");
    let detail_col = header.find("DETAIL").expect("DETAIL column");
    for c in &r.checks {
        let line = table
            .lines()
            .find(|l| l.starts_with(&format!("{} ", c.mechanism.name())))
            .unwrap_or_else(|| panic!("no line for {}\n{table}", c.mechanism));
        assert_eq!(
            line[status_col..].split_whitespace().next(),
            Some(c.status.as_str())
        );
        assert_eq!(&line[detail_col..], c.detail, "{line}");
    }
    assert!(table.starts_with("Kernel:"), "{table}");
}

#[test]
fn fake_cgroup_root_reports_controllers_from_its_files() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path();
    std::fs::write(root.join("cgroup.controllers"), "cpu memory pids\n").expect("write");
    std::fs::write(root.join("cgroup.subtree_control"), "memory\n").expect("write");
    // A non-root cgroup (it has cgroup.type) with the freezer but without cgroup.kill.
    std::fs::write(root.join("cgroup.type"), "domain\n").expect("write");
    std::fs::write(root.join("cgroup.freeze"), "0\n").expect("write");
    let r = probe(&ProbeOptions {
        cgroup_root: Some(root.to_path_buf()),
    });
    assert_eq!(r.cgroup.root.as_deref(), Some(root));
    assert_eq!(r.cgroup.controllers, ["cpu", "memory", "pids"]);
    assert_eq!(r.cgroup.subtree_control, ["memory"]);
    assert_eq!(r.missing_budgets(), ["io", "cpuset"]);
    assert!(r.has(Feature::CpuController));
    assert!(
        r.check(Feature::CpuController)
            .expect("row")
            .detail
            .contains("agentosd enables it")
    );
    assert!(
        r.check(Feature::MemoryController)
            .expect("row")
            .detail
            .contains("enabled in cgroup.subtree_control")
    );
    assert_status(&r, Feature::CgroupFreeze, Status::Available);
    assert_status(&r, Feature::CgroupKill, Status::Unavailable);
    // A tmpfs directory is not a place for agents.
    assert_status(&r, Feature::CgroupRoot, Status::Unavailable);
    assert!(
        r.check(Feature::CgroupRoot)
            .expect("row")
            .detail
            .contains("not on a cgroup2 filesystem")
    );
    assert!(r.why_missing(Feature::IoController).is_some());
    assert_eq!(r.why_missing(Feature::CpuController), None);
}

#[test]
fn missing_root_reports_every_controller_unavailable() {
    let r = probe(&ProbeOptions {
        cgroup_root: Some(PathBuf::from("/nonexistent/agentos-probe-test")),
    });
    assert_eq!(r.missing_budgets(), BUDGET_CONTROLLERS);
    assert_status(&r, Feature::CgroupRoot, Status::Unavailable);
    assert!(
        r.check(Feature::CgroupRoot)
            .expect("row")
            .detail
            .contains("ENOENT")
    );
}

#[test]
fn check_and_supervisor_mean_the_same_budget_controllers() {
    // One list: the probe's controller rows are exactly the supervisor's budget controllers.
    let rows: Vec<&str> = Feature::ALL.iter().filter_map(|m| m.controller()).collect();
    assert_eq!(rows, crate::cgroup::BUDGET_CONTROLLERS);
    assert_eq!(BUDGET_CONTROLLERS, crate::cgroup::BUDGET_CONTROLLERS);
    // And one rule: what `agentosd check` calls missing under a root whose cgroup.controllers
    // lists cpu, memory and pids is what the supervisor calls missing when its agents cgroup
    // has those three enabled.
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path();
    std::fs::write(root.join("cgroup.controllers"), "cpu memory pids\n").expect("write");
    std::fs::write(root.join("cgroup.subtree_control"), "cpu memory pids\n").expect("write");
    let r = probe(&ProbeOptions {
        cgroup_root: Some(root.to_path_buf()),
    });
    assert_eq!(
        r.missing_budgets(),
        crate::cgroup::missing_budgets(&r.cgroup.subtree_control)
    );
    assert_eq!(r.missing_budgets(), ["io", "cpuset"]);
    assert_eq!(
        crate::cgroup::missing_budgets::<&str>(&[]),
        crate::cgroup::BUDGET_CONTROLLERS
    );
}

#[test]
fn every_contract_mechanism_is_offered_by_exactly_one_row() {
    let mut rows = Vec::new();
    for m in contracts::Mechanism::ALL {
        let f = Feature::for_mechanism(m);
        assert_eq!(f.mechanism(), Some(m), "{f} offers {}", m.as_str());
        rows.push(f);
    }
    rows.sort();
    rows.dedup();
    assert_eq!(rows.len(), contracts::Mechanism::ALL.len());
    // The offer holds a mechanism exactly when its row is available.
    let mut r = probe(&ProbeOptions {
        cgroup_root: Some(PathBuf::from("/nonexistent/agentos-probe-test")),
    });
    for c in &mut r.checks {
        c.status = if matches!(c.mechanism, Feature::Landlock | Feature::BpfCgroupSockAddr) {
            Status::Available
        } else {
            Status::Unavailable
        };
    }
    let offered: Vec<_> = r.offer().mechanisms.into_iter().collect();
    assert_eq!(
        offered,
        [
            contracts::Mechanism::Landlock,
            contracts::Mechanism::CgroupBpf
        ]
    );
    assert_eq!(crate::audit_trail::host_offer(&r), r.offer());
}

#[test]
fn summary_names_mechanism_status_and_detail() {
    let c = Check::new(
        Feature::BpfLsm,
        Status::Unavailable,
        "BPF_PROG_LOAD BPF_PROG_TYPE_LSM: EPERM — kernel lockdown or lsm= lacks bpf",
    );
    assert_eq!(
        c.summary(),
        "bpf lsm: unavailable (BPF_PROG_LOAD BPF_PROG_TYPE_LSM: EPERM — kernel lockdown or lsm= lacks bpf)"
    );
    assert_eq!(Feature::for_controller("io"), Some(Feature::IoController));
    assert_eq!(Feature::for_controller("hugetlb"), None);
}

// ---------------------------------------------------------------------------------------------
// What the kernel really does on the measured machines.

#[test]
fn host_unprivileged_checks_match_measured_facts() {
    // These need no privileges: Landlock, seccomp, io_uring, pidfd, BTF, sched_ext.
    let r = report();
    let m = machine(&r);
    if m == Machine::Unknown {
        eprintln!(
            "skipped: not a measured machine (kernel {}, {:?}); see MACHINE.md",
            r.kernel_release, r.cgroup.layout
        );
        return;
    }
    assert_status(&r, Feature::Landlock, Status::Available);
    assert!(
        r.landlock_abi.is_some_and(|v| v >= 7),
        "landlock ABI {:?}",
        r.landlock_abi
    );
    assert_status(&r, Feature::Seccomp, Status::Available);
    assert_status(&r, Feature::SeccompUserNotif, Status::Available);
    assert_status(&r, Feature::IoUring, Status::Available);
    assert_status(&r, Feature::PathWatch, Status::Available);
    assert_status(&r, Feature::Pidfd, Status::Available);
    assert_status(&r, Feature::Btf, Status::Available);
    assert!(r.btf);
    assert_status(&r, Feature::CgroupV2, Status::Available);
    if m == Machine::GuestVm {
        assert_status(&r, Feature::SchedExt, Status::Available);
    } else {
        assert_status(&r, Feature::SchedExt, Status::Unavailable);
        let d = &r.check(Feature::SchedExt).expect("row").detail;
        assert!(d.contains("CONFIG_SCHED_CLASS_EXT"), "{d}");
    }
}

#[test]
fn host_privileged_checks_match_measured_facts() {
    if !is_root() {
        eprintln!("skipped: needs root (BPF loads, SCHED_DEADLINE, cgroup mkdir)");
        return;
    }
    let r = report();
    let m = machine(&r);
    if m == Machine::Unknown {
        eprintln!(
            "skipped: not a measured machine (kernel {}, {:?}); see MACHINE.md",
            r.kernel_release, r.cgroup.layout
        );
        return;
    }
    eprintln!("{}", r.render_table());
    assert!(r.privileged);
    for mech in [
        Feature::CgroupRoot,
        Feature::CgroupFreeze,
        Feature::CgroupKill,
        Feature::Pressure,
        Feature::Clone3IntoCgroup,
        Feature::SchedDeadline,
        // Both measured machines (the host's 6.18, the VM's 7.x) take slice requests.
        Feature::SchedSlice,
        Feature::BpfTracepoint,
        Feature::BpfRawTracepoint,
        Feature::BpfTpBtf,
        Feature::BpfCgroupSockAddr,
        Feature::BpfCgroupSkb,
        Feature::BpfRingbuf,
    ] {
        assert_status(&r, mech, Status::Available);
    }
    assert!(
        r.check(Feature::Clone3IntoCgroup)
            .expect("row")
            .detail
            .contains("started a child"),
        "clone3 was not tried for real"
    );
    match m {
        Machine::DevHost => {
            // Hybrid: every budget controller is bound to cgroup v1.
            assert_eq!(
                r.missing_budgets(),
                ["cpu", "memory", "pids", "io", "cpuset"]
            );
            let d = &r.check(Feature::CpuController).expect("row").detail;
            assert!(
                d.contains("bound to cgroup v1 at /sys/fs/cgroup/cpu"),
                "{d}"
            );
            assert!(!r.cgroup.controllers.iter().any(|c| c == "cpu"));
        }
        Machine::PureV2Locked | Machine::GuestVm => {
            assert!(r.missing_budgets().is_empty(), "{:?}", r.missing_budgets());
        }
        Machine::Unknown => {}
    }
    match m {
        Machine::DevHost | Machine::PureV2Locked => {
            for mech in [Feature::BpfLsm, Feature::BpfFentry] {
                assert_status(&r, mech, Status::Unavailable);
                let d = &r.check(mech).expect("row").detail;
                assert!(d.contains(": EPERM — "), "{d}");
            }
            let lsm = r.why_missing(Feature::BpfLsm).expect("lsm is missing");
            assert!(
                lsm.starts_with("bpf lsm: unavailable (BPF_PROG_LOAD BPF_PROG_TYPE_LSM"),
                "{lsm}"
            );
        }
        Machine::GuestVm => {
            assert_status(&r, Feature::BpfLsm, Status::Available);
            assert_status(&r, Feature::BpfFentry, Status::Available);
        }
        Machine::Unknown => {}
    }
}

#[test]
fn host_scratch_cgroups_are_removed() {
    if !is_root() {
        eprintln!("skipped: needs root");
        return;
    }
    let r = report();
    let Some(root) = r.cgroup.root.clone() else {
        eprintln!("skipped: no cgroup2 mount");
        return;
    };
    let prefix = format!("agentos-probe.{}.", std::process::id());
    // Other tests in this process may be probing right now; wait for theirs to go away too.
    for _ in 0..200 {
        let left: Vec<_> = std::fs::read_dir(&root)
            .expect("read cgroup root")
            .filter_map(Result::ok)
            .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
            .collect();
        if left.is_empty() {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    panic!("scratch cgroups left under {}", root.display());
}
