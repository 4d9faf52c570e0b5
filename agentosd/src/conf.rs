//! The daemon's configuration file, `/etc/agentos/agentosd.toml`: the same options as its flags,
//! with the same names and defaults (`stop-timeout = 5`, `authz = ["group:ops=read"]`,
//! `sched-ext = true`). Each key becomes the flag of its name, and the command line wins: a flag
//! given there drops the file's key of that name (a list too, as systemd's command line replaces
//! a unit's setting). An unknown key, a value of the wrong kind or a file that does not parse
//! stops the daemon with the file, the line and what to do.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

/// Where the daemon looks when `--config` is not given (used only when it exists).
pub const DEFAULT_PATH: &str = "/etc/agentos/agentosd.toml";

/// What is wrong with a configuration file.
#[derive(Debug, thiserror::Error)]
pub enum ConfError {
    #[error("{path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: not valid TOML: {message}")]
    Syntax { path: PathBuf, message: String },
    #[error("{path}:{line}: {message}")]
    Key {
        path: PathBuf,
        line: usize,
        message: String,
    },
}

/// One option the file may set: the flag's long name, whether it takes a value, and whether it
/// may be given several times.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Known {
    pub long: String,
    pub takes_value: bool,
    pub repeats: bool,
}

/// The file's settings as flags (`--stop-timeout 5`), leaving out every option `given` on the
/// command line. `known`: the flags the file may set.
pub fn file_args(
    path: &Path,
    text: &str,
    known: &[Known],
    given: &[String],
) -> Result<Vec<OsString>, ConfError> {
    let table: toml::Table = text
        .parse()
        .map_err(|e: toml::de::Error| ConfError::Syntax {
            path: path.to_path_buf(),
            message: e.to_string().trim().replace('\n', " "),
        })?;
    let mut out = Vec::new();
    for (key, value) in &table {
        let err = |message: String| ConfError::Key {
            path: path.to_path_buf(),
            line: line_of(text, key),
            message,
        };
        let long = key.replace('_', "-");
        let Some(k) = known.iter().find(|k| k.long == long) else {
            return Err(err(unknown(key, known)));
        };
        if given.contains(&k.long) {
            continue;
        }
        let flag = format!("--{}", k.long);
        match value {
            toml::Value::Boolean(b) if !k.takes_value => {
                if *b {
                    out.push(flag.into());
                }
            }
            toml::Value::Array(items) if k.repeats => {
                for item in items {
                    out.push(flag.clone().into());
                    out.push(scalar(item).ok_or_else(|| {
                        err(format!("{key}: each item must be a string or a number"))
                    })?);
                }
            }
            v if k.takes_value => {
                let s = scalar(v).ok_or_else(|| {
                    err(format!(
                        "{key}: expected {}",
                        if k.repeats {
                            "a list, a string or a number"
                        } else {
                            "a string or a number"
                        }
                    ))
                })?;
                out.push(flag.into());
                out.push(s);
            }
            _ => return Err(err(format!("{key}: expected true or false"))),
        }
    }
    Ok(out)
}

fn scalar(v: &toml::Value) -> Option<OsString> {
    Some(match v {
        toml::Value::String(s) => s.into(),
        toml::Value::Integer(i) => i.to_string().into(),
        toml::Value::Float(f) => f.to_string().into(),
        _ => return None,
    })
}

fn unknown(key: &str, known: &[Known]) -> String {
    let near = known
        .iter()
        .map(|k| (distance(&key.replace('_', "-"), &k.long), &k.long))
        .min();
    match near {
        Some((d, name)) if d <= 3 => format!("unknown key {key:?} (did you mean {name:?}?)"),
        _ => format!(
            "unknown key {key:?}; the keys are the long flags of `agentosd --help` without \
             the dashes"
        ),
    }
}

/// The 1-based line a top-level key is set on (1 when not found).
fn line_of(text: &str, key: &str) -> usize {
    text.lines()
        .position(|l| {
            let t = l.trim_start();
            let t = t
                .strip_prefix(key)
                .or_else(|| t.strip_prefix(&format!("\"{key}\"")));
            t.is_some_and(|rest| rest.trim_start().starts_with('='))
        })
        .map_or(1, |i| i + 1)
}

/// Levenshtein distance (short keys only).
fn distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1];
        for (j, cb) in b.iter().enumerate() {
            let sub = prev[j] + usize::from(ca != *cb);
            cur.push(sub.min(prev[j + 1] + 1).min(cur[j] + 1));
        }
        prev = cur;
    }
    prev[b.len()]
}

/// Which file to read: `--config PATH` (or `--config=PATH`) from `args`, which must exist, else
/// [`DEFAULT_PATH`] when it exists; `--config none` reads none.
pub fn chosen(args: &[OsString]) -> Option<(PathBuf, bool)> {
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let a = a.to_string_lossy();
        let v = if a == "--config" {
            it.next().map(|v| v.to_string_lossy().into_owned())
        } else {
            a.strip_prefix("--config=").map(str::to_string)
        };
        if let Some(v) = v {
            return (v != "none").then(|| (PathBuf::from(v), true));
        }
    }
    let p = PathBuf::from(DEFAULT_PATH);
    p.exists().then_some((p, false))
}

/// Read `path` and turn it into flags (see [`file_args`]).
pub fn load(path: &Path, known: &[Known], given: &[String]) -> Result<Vec<OsString>, ConfError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    file_args(path, &text, known, given)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn known() -> Vec<Known> {
        let k = |long: &str, takes_value, repeats| Known {
            long: long.into(),
            takes_value,
            repeats,
        };
        vec![
            k("stop-timeout", true, false),
            k("authz", true, true),
            k("sched-ext", false, false),
            k("log-dir", true, false),
        ]
    }

    fn args(v: &[OsString]) -> Vec<String> {
        v.iter().map(|s| s.to_string_lossy().into_owned()).collect()
    }

    #[test]
    fn keys_become_flags_and_the_command_line_wins() {
        let text = "stop-timeout = 2.5\nauthz = [\"group:ops=read\", \"uid:7=all\"]\nsched_ext = true\nlog-dir = \"/l\"\n";
        let p = Path::new("/etc/agentos/agentosd.toml");
        let got = file_args(p, text, &known(), &[]).unwrap();
        assert_eq!(
            args(&got),
            // In the order of the keys' names (a TOML table has no order).
            [
                "--authz",
                "group:ops=read",
                "--authz",
                "uid:7=all",
                "--log-dir",
                "/l",
                "--sched-ext",
                "--stop-timeout",
                "2.5",
            ]
        );
        let got = file_args(p, text, &known(), &["authz".into(), "log-dir".into()]).unwrap();
        assert_eq!(
            args(&got),
            ["--sched-ext", "--stop-timeout", "2.5"],
            "a flag on the command line replaces the file's key, lists too"
        );
        let off = file_args(p, "sched-ext = false\n", &known(), &[]).unwrap();
        assert!(off.is_empty());
    }

    #[test]
    fn mistakes_name_the_file_and_line() {
        let p = Path::new("/etc/agentos/agentosd.toml");
        let e = file_args(p, "# x\n\nstop-timout = 3\n", &known(), &[]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "/etc/agentos/agentosd.toml:3: unknown key \"stop-timout\" (did you mean \"stop-timeout\"?)"
        );
        let e = file_args(p, "sched-ext = \"yes\"\n", &known(), &[]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "/etc/agentos/agentosd.toml:1: sched-ext: expected true or false"
        );
        let e = file_args(p, "a\nstop-timeout = [1]\n", &known(), &[]).unwrap_err();
        assert!(e.to_string().contains("not valid TOML"), "{e}");
        let e = file_args(p, "stop-timeout = [1]\n", &known(), &[]).unwrap_err();
        assert!(
            e.to_string()
                .ends_with(":1: stop-timeout: expected a string or a number"),
            "{e}"
        );
        let e = file_args(p, "frobnicate = 1\n", &known(), &[]).unwrap_err();
        assert!(e.to_string().contains("keys are the long flags"), "{e}");
    }

    #[test]
    fn which_file() {
        let a = |v: &[&str]| v.iter().map(OsString::from).collect::<Vec<_>>();
        assert_eq!(
            chosen(&a(&["agentosd", "--config", "/x.toml"])),
            Some((PathBuf::from("/x.toml"), true))
        );
        assert_eq!(
            chosen(&a(&["agentosd", "--config=/y.toml", "run"])),
            Some((PathBuf::from("/y.toml"), true))
        );
        assert_eq!(chosen(&a(&["agentosd", "--config", "none"])), None);
    }
}
