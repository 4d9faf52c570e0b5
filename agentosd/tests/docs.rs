//! The docs keep up with the binaries: every `agentctl …` and `agentosd …` command line shown in a
//! code block of README.md and docs/*.md parses with the binary's own parser (so no flag or
//! command the docs show is unknown, misspelt or missing its value), every agentctl command is
//! in docs/cli.md, and every agentosd flag is in docs/daemon.md. No root needed.

#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};

use clap::{CommandFactory, Parser};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn doc_files() -> Vec<PathBuf> {
    let mut v = vec![root().join("README.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root().join("docs"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    v.extend(docs);
    v
}

/// Words of a shell command line: quotes and backslashes as sh reads them; `None` when it uses
/// what a test cannot stand in for (substitutions, variables, pipes' other sides are cut).
fn words(line: &str) -> Option<Vec<String>> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut any = false;
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\'' => {
                any = true;
                for d in chars.by_ref() {
                    if d == '\'' {
                        break;
                    }
                    cur.push(d);
                }
            }
            '"' => {
                any = true;
                while let Some(d) = chars.next() {
                    match d {
                        '"' => break,
                        '\\' => cur.extend(chars.next()),
                        '$' | '`' => return None,
                        d => cur.push(d),
                    }
                }
            }
            '\\' => {
                any = true;
                cur.extend(chars.next());
            }
            '$' | '`' | '<' | '>' => return None,
            '|' | ';' | '&' => break,
            '#' if !any && cur.is_empty() => break,
            c if c.is_whitespace() => {
                if any || !cur.is_empty() {
                    out.push(std::mem::take(&mut cur));
                    any = false;
                }
            }
            c => {
                any = true;
                cur.push(c);
            }
        }
    }
    if any || !cur.is_empty() {
        out.push(cur);
    }
    Some(out)
}

/// A placeholder (`AGENT…`, `[-n N]`, `FILE`, `a|b`) rather than a concrete command line.
fn is_synopsis(words: &[String]) -> bool {
    words.iter().any(|w| {
        w.contains('…')
            || w.starts_with('[')
            || w.contains('|')
            || (w.len() > 1
                && w.chars()
                    .all(|c| c.is_ascii_uppercase() || c == '_' || c == '-')
                && w.chars().any(|c| c.is_ascii_uppercase()))
    })
}

/// The command lines the docs show, in code blocks (continued lines joined) and in inline code
/// spans: (file, line number, words from the program on, whether it is a whole command line
/// (a code block's) rather than a mention in the text).
fn doc_commands(program: &str) -> Vec<(String, usize, Vec<String>, bool)> {
    let mut found = Vec::new();
    for f in doc_files() {
        let text = std::fs::read_to_string(&f).unwrap();
        let name = f.strip_prefix(root()).unwrap_or(&f).display().to_string();
        let mut in_code = false;
        let mut candidates: Vec<(usize, String, bool)> = Vec::new();
        let mut pending: Option<(usize, String)> = None;
        for (i, raw) in text.lines().enumerate() {
            if raw.trim_start().starts_with("```") {
                in_code = !in_code;
                continue;
            }
            if in_code {
                let (start, mut joined) = pending.take().unwrap_or((i + 1, String::new()));
                joined.push_str(raw.trim());
                match joined.strip_suffix('\\') {
                    Some(head) => pending = Some((start, format!("{head} "))),
                    None => candidates.push((start, joined, true)),
                }
            } else {
                // Inline code spans: `agentctl …`.
                for (k, span) in raw.split('`').enumerate() {
                    if k % 2 == 1 {
                        candidates.push((i + 1, span.to_string(), false));
                    }
                }
            }
        }
        for (line_no, line, whole) in candidates {
            let line = line.trim_start();
            let line = line
                .strip_prefix("$ ")
                .or_else(|| line.strip_prefix("# "))
                .unwrap_or(line);
            let line = line.strip_prefix("sudo ").unwrap_or(line);
            let Some(rest) = line.strip_prefix(program) else {
                continue;
            };
            if !rest.is_empty() && !rest.starts_with(' ') {
                continue;
            }
            let Some(w) = words(line) else { continue };
            if whole && is_synopsis(&w[1..]) {
                continue;
            }
            found.push((name.clone(), line_no, w, whole));
        }
    }
    found
}

/// A mention in the text (`agentctl logs -f`, `agentctl status --json`): its commands exist and
/// each flag is one of the command's (arguments are not required to be complete).
fn check_mention(top: &clap::Command, w: &[String]) -> Result<(), String> {
    let mut cmd = top;
    let mut globals: Vec<&clap::Arg> = top.get_arguments().filter(|a| a.is_global_set()).collect();
    let mut rest = &w[1..];
    while let Some(first) = rest.first() {
        match cmd.find_subcommand(first) {
            Some(sub) => {
                cmd = sub;
                globals.extend(sub.get_arguments().filter(|a| a.is_global_set()));
                rest = &rest[1..];
            }
            None => break,
        }
    }
    for word in rest {
        let flag = word.split('=').next().unwrap_or(word);
        let known = |a: &&clap::Arg| {
            flag.strip_prefix("--")
                .is_some_and(|l| a.get_long() == Some(l))
                || (flag.len() == 2
                    && flag.starts_with('-')
                    && a.get_short() == flag.chars().nth(1))
        };
        if flag.starts_with('-')
            && flag != "-"
            && flag != "--"
            && flag.parse::<f64>().is_err()
            && !matches!(flag, "--help" | "-h" | "--version" | "-V")
            && !cmd.get_arguments().any(|a| known(&a))
            && !globals.iter().any(known)
        {
            return Err(format!("no flag {flag} for `{}`", cmd.get_name()));
        }
    }
    Ok(())
}

fn check_docs(
    program: &str,
    min_lines: usize,
    top: clap::Command,
    parse: impl Fn(&[String]) -> Result<(), String>,
) {
    let cmds = doc_commands(program);
    assert!(
        cmds.iter().filter(|c| c.3).count() >= min_lines,
        "only {} {program} command lines found in code blocks",
        cmds.iter().filter(|c| c.3).count()
    );
    let mut bad = Vec::new();
    for (file, line, w, whole) in &cmds {
        let r = if *whole {
            parse(w)
        } else {
            check_mention(&top, w)
        };
        if let Err(e) = r {
            bad.push(format!("{file}:{line}: `{}`: {e}", w.join(" ")));
        }
    }
    assert!(
        bad.is_empty(),
        "{program} command lines or flags the docs show that {program} refuses:\n{}",
        bad.join("\n")
    );
}

fn first_line(e: clap::Error) -> String {
    e.to_string().lines().next().unwrap_or_default().to_string()
}

#[test]
fn every_agentctl_command_line_in_the_docs_parses() {
    check_docs("agentctl", 5, agentctl::cli::Cli::command(), |w| {
        agentctl::cli::Cli::try_parse_from(w)
            .map(drop)
            .map_err(first_line)
    });
}

#[test]
fn every_agentosd_command_line_in_the_docs_parses() {
    check_docs("agentosd", 2, agentosd::cli::Cli::command(), |w| {
        agentosd::cli::Cli::try_parse_from(w)
            .map(drop)
            .map_err(first_line)
    });
}

#[test]
fn every_agentctl_command_and_agentosd_flag_is_documented() {
    let cli = std::fs::read_to_string(root().join("docs/cli.md")).unwrap();
    let missing: Vec<String> = agentctl::cli::Cli::command()
        .get_subcommands()
        .filter(|c| !c.is_hide_set())
        .map(|c| c.get_name().to_string())
        .filter(|n| n != "help" && !cli.contains(&format!("`{n}")))
        .collect();
    assert!(
        missing.is_empty(),
        "agentctl commands missing from docs/cli.md: {missing:?}"
    );
    let daemon = std::fs::read_to_string(root().join("docs/daemon.md")).unwrap();
    let missing: Vec<String> = agentosd::cli::known_flags()
        .into_iter()
        .map(|k| format!("--{}", k.long))
        .filter(|f| !daemon.contains(&format!("`{f}")))
        .collect();
    assert!(
        missing.is_empty(),
        "agentosd flags missing from docs/daemon.md: {missing:?}"
    );
}

#[test]
fn the_shell_reader_reads_like_sh() {
    assert_eq!(
        words(r#"agentctl logs ticker --since "5 min ago" -o json # comment"#).unwrap(),
        [
            "agentctl",
            "logs",
            "ticker",
            "--since",
            "5 min ago",
            "-o",
            "json"
        ]
    );
    assert_eq!(words("agentctl list | head").unwrap(), ["agentctl", "list"]);
    assert!(words("agentctl start $F").is_none());
    assert!(is_synopsis(&["logs".into(), "AGENT".into()]));
    assert!(!is_synopsis(&[
        "logs".into(),
        "ticker".into(),
        "-n".into(),
        "5".into()
    ]));
    // The checks refuse what does not exist and accept what does.
    let w = |s: &str| words(s).unwrap();
    let top = agentctl::cli::Cli::command();
    assert!(check_mention(&top, &w("agentctl logs -f --since")).is_ok());
    assert!(check_mention(&top, &w("agentctl status --bus-address")).is_ok());
    assert!(check_mention(&top, &w("agentctl logs --follw")).is_err());
    assert!(agentctl::cli::Cli::try_parse_from(w("agentctl logs ticker --sincee 5m")).is_err());
    assert!(agentctl::cli::Cli::try_parse_from(w("agentctl logs ticker --since -5m")).is_ok());
    let n = doc_commands("agentctl").iter().filter(|c| c.3).count();
    assert!(n >= 5, "{n} agentctl command lines in code blocks");
}
