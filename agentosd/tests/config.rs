//! The daemon's configuration file (`--config`, default /etc/agentos/agentosd.toml): the same
//! options as the flags, the command line winning, mistakes stopping the daemon with the file
//! and line, and a daemon started from a file using it.

#![allow(clippy::unwrap_used)]

mod common;

use std::process::Command;

use common::{Bus, Daemon, TestCgroup, contract};

fn agentosd(args: &[&str]) -> std::process::Output {
    Command::new(common::agentosd_bin())
        .args(args)
        .output()
        .unwrap()
}

fn text(o: &std::process::Output) -> (String, String) {
    (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

#[test]
fn the_file_sets_flags_and_the_command_line_wins() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("agentosd.toml");
    std::fs::write(
        &f,
        "# operators' settings\nstop-timeout = 4\nauthz = [\"group:ops=read@acme\", \"uid:1234=all\"]\nsched_ext = true\nlog-journal-max = 65536\n",
    )
    .unwrap();
    let cfg = f.to_str().unwrap();
    let o = agentosd(&["--config", cfg, "config"]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    for want in [
        "stop-timeout = 4 ",
        "authz = [\"group:ops=read@acme\", \"uid:1234=all\"]",
        "sched-ext = true",
        "log-journal-max = 65536",
        "consent-timeout = 120 ",
    ] {
        assert!(out.contains(want), "{want:?} missing:\n{out}");
    }
    assert!(
        out.lines()
            .any(|l| l.starts_with("stop-timeout = 4") && l.ends_with("# configured"))
    );
    assert!(
        out.lines()
            .any(|l| l.starts_with("consent-timeout") && l.ends_with("# default"))
    );
    // Flags replace the file's keys of the same name, lists included.
    let o = agentosd(&[
        "--config",
        cfg,
        "--stop-timeout=9",
        "--authz",
        "gid:5=read",
        "config",
    ]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    assert!(out.contains("stop-timeout = 9 "), "{out}");
    assert!(out.contains("authz = [\"gid:5=read\"]"), "{out}");
    assert!(out.contains("sched-ext = true"), "{out}");
    // `--config none` reads nothing.
    let (out, _) = text(&agentosd(&["--config", "none", "config"]));
    assert!(out.contains("stop-timeout = 10 "), "{out}");
}

#[test]
fn a_bad_file_stops_the_daemon_with_its_path_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("agentosd.toml");
    let p = f.display().to_string();
    let case = |body: &str| {
        std::fs::write(&f, body).unwrap();
        let o = agentosd(&["--config", &p, "config"]);
        assert_eq!(o.status.code(), Some(2), "{body:?} was accepted");
        text(&o).1
    };
    let e = case("stop-timeout = 3\n\nstop_timout = 3\n");
    assert!(
        e.contains(&format!(
            "{p}:3: unknown key \"stop_timout\" (did you mean \"stop-timeout\"?)"
        )),
        "{e}"
    );
    let e = case("stop-timeout = \"soon\"\n");
    assert!(e.contains(&p) && e.contains("invalid value 'soon'"), "{e}");
    let e = case("sched-ext = 1\n");
    assert!(
        e.contains(&format!("{p}:1: sched-ext: expected true or false")),
        "{e}"
    );
    let e = case("stop-timeout = = 3\n");
    assert!(e.contains(&format!("{p}: not valid TOML")), "{e}");
    // An explicit file that is missing is an error; the default one is only read if present.
    let o = agentosd(&["--config", "/nonexistent/agentosd.toml", "config"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        text(&o).1.contains("/nonexistent/agentosd.toml"),
        "{:?}",
        text(&o)
    );
}

/// A daemon started with a configuration file puts agents' logs where the file says.
#[test]
fn a_daemon_runs_with_its_configuration_file() {
    skip_unless_capable!();
    let bus = Bus::start();
    let cg = TestCgroup::new("config");
    let dir = tempfile::tempdir().unwrap();
    let logs = dir.path().join("custom-logs");
    let f = dir.path().join("agentosd.toml");
    std::fs::write(
        &f,
        format!(
            "log-dir = {:?}\nstop-timeout = 1\n",
            logs.display().to_string()
        ),
    )
    .unwrap();
    let d = Daemon::start_with(
        &bus,
        &cg.path,
        dir.path(),
        &["--config", f.to_str().unwrap()],
    );
    let c = contract(
        dir.path(),
        "configured",
        r#"{ command: /bin/sh, args: ["-c", "echo from-config; exec sleep 600"] }"#,
        "",
    );
    d.ctl_ok(&["start", c.to_str().unwrap()]);
    let st = d.wait_state("configured", "running", 10);
    assert_eq!(
        st["log_path"],
        logs.join("default/configured.log").display().to_string()
    );
    drop(d);
}
