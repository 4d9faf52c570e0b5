//! `agentctl check`: what this host can enforce. The daemon's start-up probe over D-Bus
//! (`Check`); without a reachable daemon, a local probe by `agentosd check`. The report's type,
//! its probe and its table belong to agentosd (the probe needs the kernel), so agentctl prints
//! the daemon's JSON as it came and has `agentosd check --report -` draw the table.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::client::{CliError, Client};
use crate::exit;

/// `agentctl check [--json]`.
pub async fn check(
    target: Option<&crate::client::BusTarget>,
    timeout: Option<Duration>,
    json: bool,
) -> i32 {
    let remote = match Client::connect(target, timeout).await {
        Ok(c) => c.call::<_, String>("Check", &()).await,
        Err(e) => Err(e),
    };
    let remote = remote.and_then(|j| match serde_json::from_str::<serde_json::Value>(&j) {
        Ok(_) => Ok(j),
        Err(e) => Err(CliError::new(exit::FAILED, format!("bad report: {e}"))),
    });
    match remote {
        // The daemon's JSON is `agentosd check --json` of its start-up probe.
        Ok(report) if json => {
            println!("{}", report.trim_end());
            exit::OK
        }
        Ok(report) => run_agentosd(&["check", "--report", "-"], Some(&report)),
        // `-H`: this host's probe would describe the wrong machine.
        Err(e) if target.is_some_and(|t| t.is_remote()) => {
            eprintln!("agentctl: {}", e.message);
            e.code
        }
        Err(e) => {
            eprintln!(
                "agentctl: {} — probing this host locally instead",
                e.message
            );
            let args: &[&str] = if json {
                &["check", "--json"]
            } else {
                &["check"]
            };
            run_agentosd(args, None)
        }
    }
}

/// Run agentosd with `args` (and `input` on its stdin); its output is ours, so is its exit code.
fn run_agentosd(args: &[&str], input: Option<&str>) -> i32 {
    let bin = match agentosd_path() {
        Ok(b) => b,
        Err(e) => {
            eprintln!("agentctl: {e}");
            return exit::FAILED;
        }
    };
    let mut cmd = Command::new(&bin);
    cmd.args(args);
    if input.is_some() {
        cmd.stdin(Stdio::piped());
    }
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("agentctl: cannot run {}: {e}", bin.display());
            return exit::FAILED;
        }
    };
    if let (Some(text), Some(mut stdin)) = (input, child.stdin.take())
        && let Err(e) = stdin.write_all(text.as_bytes())
    {
        eprintln!(
            "agentctl: writing the report to {} failed: {e}",
            bin.display()
        );
    }
    // stdin is closed here: agentosd reads to its end.
    match child.wait() {
        Ok(st) => st.code().unwrap_or(exit::FAILED),
        Err(e) => {
            eprintln!("agentctl: waiting for {} failed: {e}", bin.display());
            exit::FAILED
        }
    }
}

/// The `agentosd` next to this agentctl (an install, or a cargo target directory), else the
/// first one on `PATH`.
pub fn agentosd_path() -> Result<PathBuf, String> {
    let here = std::env::current_exe()
        .ok()
        .and_then(|p| p.parent().map(Path::to_path_buf));
    let path = std::env::var_os("PATH").unwrap_or_default();
    let dirs = here.iter().cloned().chain(std::env::split_paths(&path));
    find_in(dirs, "agentosd").ok_or_else(|| {
        format!(
            "agentosd not found next to agentctl ({}) or on PATH: the host probe needs it; \
             install agentosd (cargo xtask install) or put it on PATH",
            here.as_deref()
                .map_or_else(|| "?".to_string(), |d| d.display().to_string())
        )
    })
}

/// The first executable file `name` in `dirs`.
fn find_in(dirs: impl IntoIterator<Item = PathBuf>, name: &str) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    dirs.into_iter().map(|d| d.join(name)).find(|p| {
        std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_only_executable_files() {
        let dir = std::env::temp_dir().join(format!("agentctl-find-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("a")).expect("scratch dir");
        std::fs::create_dir_all(dir.join("b/agentosd")).expect("scratch dir");
        std::fs::create_dir_all(dir.join("c")).expect("scratch dir");
        std::fs::write(dir.join("a/agentosd"), "not executable").expect("file");
        std::fs::write(dir.join("c/agentosd"), "#!/bin/sh\n").expect("file");
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(
            dir.join("c/agentosd"),
            std::fs::Permissions::from_mode(0o755),
        )
        .expect("chmod");
        let dirs = ["a", "b", "c"].map(|d| dir.join(d));
        assert_eq!(
            find_in(dirs.clone(), "agentosd"),
            Some(dir.join("c/agentosd"))
        );
        assert_eq!(find_in(dirs[..2].to_vec(), "agentosd"), None);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
