//! `agentctl audit verify|show` as library functions.

#![allow(clippy::unwrap_used)]

mod common;

use audit::cli::{self, ShowOptions};
use common::*;

fn run_verify(dir: &std::path::Path, log: &std::path::Path) -> (i32, String, String) {
    let keyf = dir.join("audit.key");
    std::fs::write(&keyf, key().to_bytes()).unwrap();
    std::fs::write(
        audit::key::public_path(&keyf),
        format!("{}\n", hex::encode(key().verifying_key().as_bytes())),
    )
    .unwrap();
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let code = cli::verify(log, &audit::key::public_path(&keyf), &mut out, &mut err);
    (
        code,
        String::from_utf8(out).unwrap(),
        String::from_utf8(err).unwrap(),
    )
}

#[test]
fn verify_exit_codes() {
    let dir = tempfile::tempdir().unwrap();
    let logdir = dir.path().join("log");
    let path = honest_log(&logdir, 12);
    let (code, out, err) = run_verify(dir.path(), &path);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("OK: 15 records"), "{out}");

    let mut l = lines(&path);
    l[4] = l[4].replace("acme", "acmx");
    write_lines(&path, &l);
    let (code, out, err) = run_verify(dir.path(), &path);
    assert_eq!(code, 1, "{out}{err}");
    assert!(err.contains("first bad record: seq 5"), "{err}");

    // A truncated log names the first record that is missing.
    let path = honest_log(&dir.path().join("log2"), 12);
    let mut l = lines(&path);
    l.truncate(8);
    write_lines(&path, &l);
    let (code, out, err) = run_verify(dir.path(), &path);
    assert_eq!(code, 1, "{out}{err}");
    assert!(err.contains("first bad record: seq 9"), "{err}");

    let (code, _, err) = run_verify(dir.path(), &dir.path().join("nope.log"));
    assert_eq!(code, 3, "{err}");
}

#[test]
fn show_filters_and_formats() {
    let dir = tempfile::tempdir().unwrap();
    let path = honest_log(dir.path(), 6);
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let opts = ShowOptions {
        agent: Some("a".into()),
        ..ShowOptions::default()
    };
    assert_eq!(cli::show(&path, &opts, &mut out, &mut err), 0);
    let out = String::from_utf8(out).unwrap();
    let rows: Vec<_> = out.lines().collect();
    assert_eq!(rows.len(), 2, "{out}"); // i = 0, 3
    assert!(
        rows[0].contains(" gate ") && rows[0].contains("acme/a allow"),
        "{out}"
    );

    let (mut out, mut err) = (Vec::new(), Vec::new());
    let opts = ShowOptions {
        json: true,
        since: Some("1h".into()),
        ..ShowOptions::default()
    };
    assert_eq!(cli::show(&path, &opts, &mut out, &mut err), 0);
    let out = String::from_utf8(out).unwrap();
    assert_eq!(out, std::fs::read_to_string(&path).unwrap());

    let opts = ShowOptions {
        since: Some("tomorrow-ish".into()),
        ..ShowOptions::default()
    };
    assert_eq!(cli::show(&path, &opts, &mut Vec::new(), &mut Vec::new()), 2);
}
