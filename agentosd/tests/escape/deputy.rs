//! The daemon as a confused deputy on files (issue 12, class 1): links, renames and hardlinks
//! an agent plants in what it can write, then a restart, re-adoption or cleanup by the root
//! daemon. Every route aims at a decoy directory the suite makes (root's, 0755, with a file and
//! a subdirectory), never at a real system path: after each route the decoy must still be
//! root's with its old modes and entries, and the agent must not be able to write into it.
//!
//! Each agent runs one `deputy-*` probe several times (its own run counter in `$HOME`): the
//! first run plants, the runs after a restart check. Each check is counted by the suite.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::probe::{c, check, errno};
use crate::{Caps, Ctx, common};

/// Every deputy check's name starts with one of these (the suite's NAME filter).
const ROUTES: &[&str] = &[
    "deputy-tmp-restart",
    "deputy-tmp-readopt",
    "deputy-state-scope",
    "deputy-intermediate-link",
    "deputy-hardlink",
    "deputy-rename-race",
    "deputy-absolute-link",
    "deputy-control",
    "deputy-mutation",
];

/// Owner, group and mode of the decoy and everything in it.
fn snapshot(decoy: &Path) -> Vec<(PathBuf, u32, u32, u32)> {
    let mut out = Vec::new();
    let mut todo = vec![decoy.to_path_buf()];
    while let Some(p) = todo.pop() {
        let Ok(m) = std::fs::symlink_metadata(&p) else {
            continue;
        };
        out.push((p.clone(), m.uid(), m.gid(), m.mode()));
        if m.is_dir()
            && let Ok(rd) = std::fs::read_dir(&p)
        {
            todo.extend(rd.flatten().map(|e| e.path()));
        }
    }
    out.sort();
    out
}

struct Checks {
    n: usize,
    failures: Vec<String>,
}

impl Checks {
    fn check(&mut self, name: &str, pass: bool, detail: &str) {
        self.n += 1;
        let line = format!("{name:<44} {detail}");
        println!("{} {line}", if pass { "ok  " } else { "FAIL" });
        if !pass {
            self.failures.push(line);
        }
    }
}

/// The probe's result lines in the agent's log so far.
fn results(log: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.starts_with("{\"attempt\""))
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// Start agent `escape/NAME` again once its previous run has ended: the probe prints its result
/// just before it exits, so a start right after the line could find it still running.
fn restart(d: &crate::common::Daemon, name: &str) -> std::process::Output {
    let id = format!("escape/{name}");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
    while ["running", "starting"].contains(&d.status_json(&id)["state"].as_str().unwrap_or(""))
        && std::time::Instant::now() < deadline
    {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    d.ctl(&["start", name])
}

/// Wait for result line number `n` (1-based).
fn nth_result(log: &Path, n: usize, secs: u64) -> Option<serde_json::Value> {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while Instant::now() < deadline {
        if let Some(v) = results(log).into_iter().nth(n - 1) {
            return Some(v);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}

fn describe(v: &Option<serde_json::Value>) -> String {
    match v {
        None => "no result line".into(),
        Some(v) if v["ok"] == true => format!("success ({})", v["detail"].as_str().unwrap_or("")),
        Some(v) => v["errno"].as_str().unwrap_or("?").to_string(),
    }
}

fn errno_is(v: &Option<serde_json::Value>, e: &str) -> bool {
    v.as_ref()
        .is_some_and(|v| v["ok"] == false && v["errno"] == e)
}

fn ok(v: &Option<serde_json::Value>) -> bool {
    v.as_ref().is_some_and(|v| v["ok"] == true)
}

/// The agent's uid, from the daemon's table.
fn agent_uid(state: &Path, name: &str) -> Option<u32> {
    let t: std::collections::BTreeMap<String, u32> =
        serde_json::from_slice(&std::fs::read(state.join("uids.json")).ok()?).ok()?;
    t.get(&format!("escape/{name}")).copied()
}

fn home(ctx: &Ctx, name: &str) -> PathBuf {
    ctx.state.join("home/escape").join(name)
}

fn stderr(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stderr).trim().to_string()
}

/// Run the deputy attempts (they need daemon and agent restarts, so they are not plain
/// attempts); returns how many ran and the failures.
pub fn run(ctx: &Ctx, d: &mut common::Daemon, filter: Option<&str>) -> (usize, Vec<String>) {
    let wanted = |r: &str| filter.is_none_or(|f| r.contains(f));
    if !ROUTES.iter().any(|r| wanted(r)) {
        return (0, Vec::new());
    }
    // The decoy: root's, 0755, with a file (0644) and a subdirectory `b` (0755).
    let decoy = ctx.dir.join("deputy-decoy");
    std::fs::create_dir_all(decoy.join("b")).unwrap();
    std::fs::write(decoy.join("file"), b"decoy\n").unwrap();
    {
        use std::os::unix::fs::PermissionsExt;
        let set = |p: &Path, m: u32| {
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).unwrap()
        };
        set(&decoy, 0o755);
        set(&decoy.join("b"), 0o755);
        set(&decoy.join("file"), 0o644);
    }
    let before = snapshot(&decoy);
    let decoy_s = decoy.display().to_string();
    let mut k = Checks {
        n: 0,
        failures: Vec::new(),
    };
    let intact = |k: &mut Checks, route: &str| {
        let now = snapshot(&decoy);
        k.check(
            &format!("{route}: decoy untouched"),
            now == before,
            &if now == before {
                "root's, modes and entries as before".to_string()
            } else {
                format!("decoy changed: {now:?} (was {before:?})")
            },
        );
    };
    // Only the probe's own executable and `extra` (one fs.write entry).
    let exec_caps = |extra: &str| {
        Caps::Custom(format!(
            "  - fs.exec: [{:?}]\n{extra}",
            ctx.exe.display().to_string()
        ))
    };

    // (a) $HOME/tmp replaced by a link to the decoy, then `agentctl start` again.
    if wanted("deputy-tmp-restart") {
        let name = "dep-tmp";
        let f = ctx.contract(
            name,
            "deputy-tmp",
            std::slice::from_ref(&decoy_s),
            &Caps::Standard,
        );
        let log = ctx.log(name);
        let out = d.ctl(&["start", f.to_str().unwrap()]);
        let planted = nth_result(&log, 1, 15);
        k.check(
            "deputy-tmp-restart: plant $HOME/tmp -> decoy",
            out.status.success() && ok(&planted),
            &describe(&planted),
        );
        let out = restart(d, name);
        let after = nth_result(&log, 2, 15);
        k.check(
            "deputy-tmp-restart: restarted, decoy not writable",
            out.status.success() && errno_is(&after, "EACCES"),
            &format!("start: {} / {}", out.status, describe(&after)),
        );
        let tmp = home(ctx, name).join("tmp");
        let m = std::fs::symlink_metadata(&tmp);
        let uid = agent_uid(&ctx.state, name);
        k.check(
            "deputy-tmp-restart: fresh tmp is the agent's",
            m.as_ref()
                .is_ok_and(|m| m.is_dir() && Some(m.uid()) == uid && m.mode() & 0o7777 == 0o700),
            &format!("{m:?}"),
        );
        intact(&mut k, "deputy-tmp-restart");
        let _ = d.ctl(&["stop", &format!("escape/{name}")]);
    }

    // (a') the same with the daemon killed (-9) and restarted while the agent runs: it is
    // re-adopted (its socket made again), then restarted by agentctl.
    if wanted("deputy-tmp-readopt") {
        let name = "dep-readopt";
        let f = ctx.contract(
            name,
            "deputy-tmp",
            &[decoy_s.clone(), "hold".into()],
            &Caps::Standard,
        );
        let log = ctx.log(name);
        let out = d.ctl(&["start", f.to_str().unwrap()]);
        let planted = nth_result(&log, 1, 15);
        d.kill9();
        d.spawn();
        let st = d.ctl(&["status", &format!("escape/{name}")]);
        let readopted = String::from_utf8_lossy(&st.stdout).contains("re-adopted");
        k.check(
            "deputy-tmp-readopt: planted, daemon -9, re-adopted",
            out.status.success() && ok(&planted) && readopted,
            &format!("{} / status: {}", describe(&planted), st.status),
        );
        intact(&mut k, "deputy-tmp-readopt (after re-adoption)");
        let out = d.ctl(&["restart", &format!("escape/{name}")]);
        let after = nth_result(&log, 2, 15);
        k.check(
            "deputy-tmp-readopt: restarted, decoy not writable",
            out.status.success() && errno_is(&after, "EACCES"),
            &format!(
                "restart: {} {} / {}",
                out.status,
                stderr(&out),
                describe(&after)
            ),
        );
        intact(&mut k, "deputy-tmp-readopt");
        let _ = d.ctl(&["stop", &format!("escape/{name}")]);
    }

    // (b) a `{state}/sub` write scope the agent turned into a link to the decoy: the next
    // start is refused, naming the scope (never a rule on the decoy).
    if wanted("deputy-state-scope") {
        let name = "dep-scope";
        let f = ctx.contract(
            name,
            "deputy-scope",
            &[decoy_s.clone(), "sub".into()],
            &exec_caps("  - fs.write: [\"{state}/sub\"]\n"),
        );
        let log = ctx.log(name);
        let out = d.ctl(&["start", f.to_str().unwrap()]);
        let planted = nth_result(&log, 1, 15);
        k.check(
            "deputy-state-scope: plant {state}/sub -> decoy",
            out.status.success() && ok(&planted),
            &describe(&planted),
        );
        let out = restart(d, name);
        let msg = stderr(&out);
        let sub = home(ctx, name).join("sub").display().to_string();
        k.check(
            "deputy-state-scope: restart refused, scope named",
            !out.status.success() && msg.contains(&sub) && msg.contains("symbolic link"),
            &msg,
        );
        k.check(
            "deputy-state-scope: agent never ran again",
            results(&log).len() == 1,
            &format!("{} result lines", results(&log).len()),
        );
        intact(&mut k, "deputy-state-scope");
        let _ = d.ctl(&["stop", &format!("escape/{name}")]);
    }

    // (c) a link in an intermediate component: `{state}/a/b` with `a` -> decoy (which has `b`).
    if wanted("deputy-intermediate-link") {
        let name = "dep-mid";
        let f = ctx.contract(
            name,
            "deputy-scope",
            &[decoy_s.clone(), "a".into()],
            &exec_caps("  - fs.write: [\"{state}/a/b\"]\n"),
        );
        let log = ctx.log(name);
        let out = d.ctl(&["start", f.to_str().unwrap()]);
        let planted = nth_result(&log, 1, 15);
        k.check(
            "deputy-intermediate-link: plant {state}/a -> decoy",
            out.status.success() && ok(&planted),
            &describe(&planted),
        );
        let out = restart(d, name);
        let msg = stderr(&out);
        let a = home(ctx, name).join("a").display().to_string();
        k.check(
            "deputy-intermediate-link: restart refused",
            !out.status.success() && msg.contains(&a) && msg.contains("symbolic link"),
            &msg,
        );
        intact(&mut k, "deputy-intermediate-link");
        let _ = d.ctl(&["stop", &format!("escape/{name}")]);
    }

    // (d) a hardlink of a file the agent may not write, into its home: refused by the kernel
    // (protected_hardlinks: EPERM; else Landlock's refer check: EXDEV). Then a restart.
    if wanted("deputy-hardlink") {
        let name = "dep-hardlink";
        let f = ctx.contract(
            name,
            "deputy-hardlink",
            &[decoy.join("file").display().to_string()],
            &Caps::Standard,
        );
        let log = ctx.log(name);
        let protected = std::fs::read_to_string("/proc/sys/fs/protected_hardlinks")
            .is_ok_and(|s| s.trim() == "1");
        let want = if protected { "EPERM" } else { "EXDEV" };
        let _ = d.ctl(&["start", f.to_str().unwrap()]);
        let r = nth_result(&log, 1, 15);
        k.check(
            &format!("deputy-hardlink: link decoy file into $HOME ({want})"),
            errno_is(&r, want),
            &describe(&r),
        );
        let out = restart(d, name);
        let _ = nth_result(&log, 2, 15);
        k.check(
            "deputy-hardlink: restart works",
            out.status.success(),
            &stderr(&out),
        );
        intact(&mut k, "deputy-hardlink");
        let _ = d.ctl(&["stop", &format!("escape/{name}")]);
    }

    // (d') a rename race: a process of the agent's uid (outside its sandbox, like a leftover
    // tool) swaps $HOME/tmp with a link to the decoy in a loop (renameat2 RENAME_EXCHANGE)
    // while the agent is started again and again. Each start works or fails with a message;
    // the decoy stays intact.
    if wanted("deputy-rename-race") {
        let name = "dep-race";
        let f = ctx.contract(name, "deputy-noop", &[], &Caps::Standard);
        let log = ctx.log(name);
        let first = d.ctl(&["start", f.to_str().unwrap()]);
        let _ = nth_result(&log, 1, 15);
        let uid = agent_uid(&ctx.state, name);
        let h = home(ctx, name);
        let racer = uid.map(|uid| {
            use std::os::unix::process::CommandExt;
            std::process::Command::new(&ctx.exe)
                .args([
                    "probe",
                    "deputy-race",
                    &h.display().to_string(),
                    &decoy_s,
                    "6000",
                ])
                .uid(uid)
                .gid(uid)
                .stdout(std::process::Stdio::piped())
                .spawn()
                .expect("racer")
        });
        let (mut started, mut refused) = (0, 0);
        let mut reasons = std::collections::BTreeSet::new();
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_secs(5) && started + refused < 12 {
            let out = d.ctl(&["start", name]);
            if out.status.success() {
                started += 1;
            } else {
                refused += 1;
                reasons.insert(stderr(&out).chars().take(160).collect::<String>());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let swaps = racer
            .map(|r| {
                let o = r.wait_with_output().unwrap();
                String::from_utf8_lossy(&o.stdout).trim().to_string()
            })
            .unwrap_or_default();
        k.check(
            "deputy-rename-race: starts during the race",
            first.status.success() && started + refused > 0 && swaps.contains("swaps"),
            &format!("{started} started, {refused} refused {reasons:?}; racer: {swaps}"),
        );
        intact(&mut k, "deputy-rename-race");
        let _ = d.ctl(&["stop", &format!("escape/{name}")]);
    }

    // (e) an absolute scope with a link in it: refused at start, naming the scope.
    if wanted("deputy-absolute-link") {
        let abs = ctx.dir.join("deputy-abs");
        std::fs::create_dir_all(&abs).unwrap();
        let link = abs.join("link");
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(&decoy, &link).unwrap();
        for (route, scope) in [("final", link.clone()), ("intermediate", link.join("b"))] {
            let name = format!("dep-abs-{route}");
            let f = ctx.contract(
                &name,
                "deputy-noop",
                &[],
                &exec_caps(&format!(
                    "  - fs.write: [{:?}]\n",
                    scope.display().to_string()
                )),
            );
            let out = d.ctl(&["start", f.to_str().unwrap()]);
            let msg = stderr(&out);
            k.check(
                &format!("deputy-absolute-link: {route} component refused"),
                !out.status.success()
                    && msg.contains(&scope.display().to_string())
                    && msg.contains(&format!("{} is a symbolic link", link.display())),
                &msg,
            );
            let _ = d.ctl(&["stop", &format!("escape/{name}")]);
        }
        intact(&mut k, "deputy-absolute-link");
    }

    // (f) controls: a real `{state}/sub` scope is writable, across a restart too, and so is
    // the fresh $HOME/tmp.
    if wanted("deputy-control") {
        let name = "dep-control";
        let f = ctx.contract(
            name,
            "deputy-control",
            &[],
            &exec_caps("  - fs.write: [\"{state}/sub\"]\n"),
        );
        let log = ctx.log(name);
        let out = d.ctl(&["start", f.to_str().unwrap()]);
        let r1 = nth_result(&log, 1, 15);
        k.check(
            "deputy-control: write {state}/sub",
            out.status.success() && ok(&r1),
            &describe(&r1),
        );
        let out = restart(d, name);
        let r2 = nth_result(&log, 2, 15);
        k.check(
            "deputy-control: after restart, {state}/sub and tmp",
            out.status.success() && ok(&r2),
            &format!("{} {}", stderr(&out), describe(&r2)),
        );
        let _ = d.ctl(&["stop", &format!("escape/{name}")]);
    }
    // Mutation check: the same planted layouts handed to the old path-following code must be
    // noticed by these checks (the decoy changes, a rule opens the decoy), and to the daemon's
    // code they must not.
    if wanted("deputy-mutation") {
        mutation(ctx, &mut k);
    }
    (k.n, k.failures)
}

fn mutation(ctx: &Ctx, k: &mut Checks) {
    use std::os::unix::fs::PermissionsExt;
    let state = ctx.dir.join("deputy-mutation-state");
    let decoy = ctx.dir.join("deputy-mutation-decoy");
    std::fs::create_dir_all(&decoy).unwrap();
    std::fs::set_permissions(&decoy, std::fs::Permissions::from_mode(0o755)).unwrap();
    let before = snapshot(&decoy);
    let nobody = 65534;
    // A home as make_home leaves it, then `tmp` -> decoy planted.
    let plant = || {
        let home = agentosd::sandbox::identity::make_home(&state, "mut", "a", nobody)
            .unwrap()
            .path()
            .to_path_buf();
        let tmp = home.join("tmp");
        std::fs::remove_dir(&tmp).unwrap();
        std::os::unix::fs::symlink(&decoy, &tmp).unwrap();
        home
    };
    // The old make_home: chown and chmod by path.
    let home = plant();
    let tmp = home.join("tmp");
    let _ = std::os::unix::fs::chown(&tmp, Some(nobody), Some(nobody));
    let _ = std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o700));
    let old_changed = snapshot(&decoy) != before;
    // Restore the decoy, plant again, and run the daemon's make_home.
    std::os::unix::fs::chown(&decoy, Some(0), Some(0)).unwrap();
    std::fs::set_permissions(&decoy, std::fs::Permissions::from_mode(0o755)).unwrap();
    let _ = std::fs::remove_file(&tmp);
    let home = plant();
    let new = agentosd::sandbox::identity::make_home(&state, "mut", "a", nobody);
    let new_intact = snapshot(&decoy) == before;
    k.check(
        "deputy-mutation: tmp link, chown by path",
        old_changed && new.is_ok() && new_intact,
        &format!(
            "old code {} / make_home {}",
            if old_changed {
                "changed the decoy (detected)"
            } else {
                "left it (NOT DETECTED)"
            },
            if new_intact {
                "left it intact"
            } else {
                "CHANGED it"
            }
        ),
    );
    // `{state}/sub` -> decoy: the landlock crate's path_beneath_rules opens the decoy; the
    // daemon's opener refuses the scope.
    let sub = home.join("sub");
    std::os::unix::fs::symlink(&decoy, &sub).unwrap();
    let followed = landlock::PathFd::new(&sub).is_ok();
    let dir = agentosd::safe_fs::Dir::open_root(&state)
        .and_then(|r| r.open_dir(Path::new("home/mut/a")))
        .unwrap();
    let refused = agentosd::sandbox::landlock::Opener::new(vec![&dir])
        .open(&sub)
        .is_err();
    k.check(
        "deputy-mutation: {state}/sub link, rule from path",
        followed && refused,
        &format!(
            "path_beneath_rules {} / Opener {}",
            if followed {
                "opens the decoy (detected)"
            } else {
                "does not (NOT DETECTED)"
            },
            if refused {
                "refuses the scope"
            } else {
                "OPENS IT"
            }
        ),
    );
}

/// This run's number for the agent (1 on its first start), kept in `$HOME/.deputy-runs`.
fn next_run(home: &str) -> u32 {
    let p = format!("{home}/.deputy-runs");
    let n = std::fs::read_to_string(&p)
        .ok()
        .and_then(|s| s.trim().parse::<u32>().ok())
        .unwrap_or(0)
        + 1;
    let _ = std::fs::write(&p, n.to_string());
    n
}

fn create(path: &str) -> Result<String, i32> {
    let p = c(path);
    // SAFETY: open(2)/close(2) with a NUL-terminated path we own.
    let fd = unsafe {
        libc::open(
            p.as_ptr(),
            libc::O_WRONLY | libc::O_CREAT | libc::O_CLOEXEC,
            0o644,
        )
    };
    if fd < 0 {
        return Err(errno());
    }
    // SAFETY: closing the fd opened above.
    unsafe { libc::close(fd) };
    Ok(format!("wrote {path}"))
}

/// Replace `$HOME/<rel>` by a link to `target`.
fn plant(home: &str, rel: &str, target: &str) -> Result<String, i32> {
    let p = format!("{home}/{rel}");
    let _ = std::fs::remove_dir_all(&p);
    let _ = std::fs::remove_file(&p);
    std::os::unix::fs::symlink(target, &p)
        .map(|_| format!("{p} -> {target}"))
        .map_err(|e| e.raw_os_error().unwrap_or(0))
}

/// Run attempt `name` inside the agent; `None` when this module does not know it.
pub fn probe(name: &str, args: &[String]) -> Option<Result<String, i32>> {
    let arg = |i: usize| args.get(i).map(String::as_str).unwrap_or("");
    let home = std::env::var("HOME").unwrap_or_default();
    Some(match name {
        // args: DECOY [hold]. Run 1 plants $HOME/tmp -> DECOY (and with `hold` stays up for a
        // daemon restart); later runs check tmp is a fresh directory and write into DECOY.
        "deputy-tmp" => {
            if next_run(&home) == 1 {
                let r = plant(&home, "tmp", arg(1));
                if arg(2) == "hold" {
                    println!(
                        "{}",
                        serde_json::json!({"attempt": name, "ok": r.is_ok(), "errno": null, "detail": "planted, holding"})
                    );
                    std::thread::sleep(Duration::from_secs(3600));
                }
                r
            } else {
                let tmp = std::env::var("TMPDIR").unwrap_or_default();
                match create(&format!("{tmp}/fresh")) {
                    Err(e) => Err(e),
                    Ok(_) => create(&format!("{}/agent-wrote", arg(1))),
                }
            }
        }
        // args: DECOY REL. Run 1 plants $HOME/REL -> DECOY; a later run (there should be
        // none: the start is refused) writes into the scope.
        "deputy-scope" => {
            if next_run(&home) == 1 {
                plant(&home, arg(2), arg(1))
            } else {
                create(&format!("{home}/sub/agent-wrote"))
                    .and_then(|_| create(&format!("{home}/a/b/agent-wrote")))
            }
        }
        "deputy-hardlink" => {
            if next_run(&home) == 1 {
                let (from, to) = (c(arg(1)), c(&format!("{home}/hardlink")));
                // SAFETY: link(2) with NUL-terminated paths we own.
                check(unsafe { libc::link(from.as_ptr(), to.as_ptr()) } as i64)
            } else {
                Ok("restarted".into())
            }
        }
        "deputy-control" => {
            if next_run(&home) == 1 {
                std::fs::create_dir_all(format!("{home}/sub"))
                    .map_err(|e| e.raw_os_error().unwrap_or(0))
                    .and_then(|_| create(&format!("{home}/sub/f")))
            } else {
                let tmp = std::env::var("TMPDIR").unwrap_or_default();
                create(&format!("{home}/sub/g")).and_then(|_| create(&format!("{tmp}/g")))
            }
        }
        "deputy-noop" => Ok("started".into()),
        // Not in an agent: run by the suite as the agent's uid. args: HOME DECOY MILLIS.
        // Swap HOME/tmp and a link to DECOY for MILLIS ms; prints the number of swaps.
        "deputy-race" => {
            let (h, decoy) = (arg(1), arg(2));
            let ms: u64 = arg(3).parse().unwrap_or(1000);
            let lnk = format!("{h}/lnk");
            let _ = std::fs::remove_file(&lnk);
            let _ = std::os::unix::fs::symlink(decoy, &lnk);
            let (a, b) = (c(&format!("{h}/tmp")), c(&lnk));
            let t0 = Instant::now();
            let mut swaps = 0u64;
            while t0.elapsed() < Duration::from_millis(ms) {
                // After the daemon replaced a planted `tmp`, `lnk` holds the old directory:
                // make it a link to the decoy again.
                if !std::fs::symlink_metadata(&lnk).is_ok_and(|m| m.file_type().is_symlink()) {
                    let _ = std::fs::remove_dir_all(&lnk);
                    let _ = std::fs::remove_file(&lnk);
                    let _ = std::os::unix::fs::symlink(decoy, &lnk);
                }
                // SAFETY: renameat2(2) with NUL-terminated paths we own.
                let r = unsafe {
                    libc::renameat2(
                        libc::AT_FDCWD,
                        a.as_ptr(),
                        libc::AT_FDCWD,
                        b.as_ptr(),
                        libc::RENAME_EXCHANGE,
                    )
                };
                if r == 0 {
                    swaps += 1;
                } else {
                    std::thread::yield_now();
                }
            }
            println!("{swaps} swaps");
            std::process::exit(0)
        }
        _ => return None,
    })
}
