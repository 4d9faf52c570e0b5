//! What one tool process may touch: the manifest's `sandbox` needs intersected with the
//! caller's grants (contracts::tool::intersect_paths / intersect_net), compiled into a Landlock
//! plan. Paths are resolved on both sides before they are met, the same way the caller's own
//! sandbox resolves them (`sandbox::landlock::Opener`): the caller's scopes and anything under
//! its home follow no link at all, the host's paths (the baseline, the manifest's own bounds)
//! only links root alone could have made. So a link an agent planted inside its own scope
//! grants a tool nothing, and the tool's rules are opened the same way when it starts.

use std::path::{Path, PathBuf};

use contracts::tool::{ArgContext, Needs, expand_state, intersect_net, intersect_paths, minimal};

use super::Caller;
use crate::sandbox::landlock::{self, Opener, Plan};

/// The scopes one call runs with.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Effective {
    pub read: Vec<PathBuf>,
    pub write: Vec<PathBuf>,
    pub exec: Vec<PathBuf>,
    pub connect: Vec<String>,
    pub bind: Vec<String>,
}

/// Resolve each path with `opener`; a path that does not exist or does not resolve safely is
/// dropped: it grants nothing now (the caller's own sandbox refuses such a scope at start).
fn resolve_all(v: impl IntoIterator<Item = PathBuf>, opener: &Opener<'_>) -> Vec<PathBuf> {
    minimal(v.into_iter().filter_map(|p| opener.resolve(&p)).collect())
}

/// What the caller itself may touch, resolved: reads include its writes and its state
/// directory; executes include the system directories every agent may run.
pub struct CallerScopes {
    pub read: Vec<PathBuf>,
    pub write: Vec<PathBuf>,
    pub exec: Vec<PathBuf>,
}

impl CallerScopes {
    pub fn of(c: &Caller) -> CallerScopes {
        let g = &c.grants;
        let home = c.home.clone();
        // As the caller's own Landlock rules: its scopes without links, the baseline with
        // root's links.
        let opener = Opener::new(Vec::new());
        let read = resolve_all(
            g.fs_read
                .iter()
                .chain(&g.fs_write)
                .cloned()
                .chain(std::iter::once(home.clone())),
            &opener,
        );
        let write = resolve_all(
            g.fs_write.iter().cloned().chain(std::iter::once(home)),
            &opener,
        );
        let exec = resolve_all(
            g.fs_exec
                .iter()
                .cloned()
                .chain(landlock::BASE_READ_EXEC.iter().map(PathBuf::from)),
            &opener,
        );
        CallerScopes { read, write, exec }
    }
}

/// The manifest's needs ∩ the caller's scopes.
pub fn effective(needs: &Needs, caller: &Caller) -> Effective {
    let cs = CallerScopes::of(caller);
    // The manifest's bounds are the operator's host paths (root's links followed), except
    // those under the caller's home (`{state}`), which are the agent's: no link followed.
    let tool = |v: &[String]| {
        let paths: Vec<PathBuf> = v.iter().map(|s| expand_state(s, &caller.home)).collect();
        let opener = Opener {
            beneath: Vec::new(),
            system: paths
                .iter()
                .filter(|p| !p.starts_with(&caller.home))
                .cloned()
                .collect(),
            cache: None,
        };
        resolve_all(paths, &opener)
    };
    Effective {
        read: intersect_paths(&tool(&needs.fs_read), &cs.read),
        write: intersect_paths(&tool(&needs.fs_write), &cs.write),
        exec: intersect_paths(&tool(&needs.fs_exec), &cs.exec),
        connect: intersect_net(&needs.net_connect, &caller.grants.net_connect),
        bind: intersect_net(&needs.net_bind, &caller.grants.net_bind),
    }
}

/// The Landlock plan of a tool process: the agents' baseline (system libraries, /proc, a few
/// /etc files, /dev/null…), the tool's own code (`runtime` and the command), its private
/// scratch directory, and the effective scopes. Nothing of the caller's beyond that.
pub fn plan(
    eff: &Effective,
    runtime: &[PathBuf],
    command: &Path,
    scratch: &Path,
) -> Result<Plan, landlock::LandlockError> {
    let p = |v: &[&str]| v.iter().map(PathBuf::from).collect::<Vec<_>>();
    let mut plan = Plan {
        read: p(landlock::BASE_READ),
        read_exec: p(landlock::BASE_READ_EXEC),
        read_write: p(landlock::BASE_READ_WRITE_FILES),
        connect: landlock::ports(&eff.connect)?,
        bind: landlock::ports(&eff.bind)?,
        // A tool reaches no Unix socket of the host by path (its calls come over its pipes).
        unix: Vec::new(),
        unscoped: false,
    };
    plan.read.extend(eff.read.iter().cloned());
    plan.read_exec.extend(runtime.iter().cloned());
    plan.read_exec.push(command.to_path_buf());
    plan.read_exec.extend(eff.exec.iter().cloned());
    plan.read_write.push(scratch.to_path_buf());
    plan.read_write.extend(eff.write.iter().cloned());
    // Landlock opens each path when the ruleset is built (`opener`); what does not exist is
    // left out there.
    Ok(plan)
}

/// How a tool's plan is opened: its scratch directory beneath the fd the daemon made it with,
/// the baseline, its runtime and command as host paths, the effective scopes without links.
pub fn opener<'a>(
    scratch: &'a crate::safe_fs::Dir,
    runtime: &[PathBuf],
    command: &Path,
) -> Opener<'a> {
    let mut o = Opener::new(vec![scratch]);
    o.system.extend(runtime.iter().cloned());
    o.system.push(command.to_path_buf());
    o
}

/// Placeholder values for one call.
pub fn arg_context(
    eff: &Effective,
    caller: &Caller,
    scratch: &Path,
    scope: &[String],
) -> ArgContext {
    ArgContext {
        state: caller.home.clone(),
        agent: caller.agent.clone(),
        scratch: scratch.to_path_buf(),
        fs_read: minimal(eff.read.iter().chain(&eff.write).cloned().collect()),
        fs_write: eff.write.clone(),
        fs_exec: eff.exec.clone(),
        scope: scope.to_vec(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sandbox::Grants;

    fn caller(home: &Path, read: &[&Path], write: &[&Path]) -> Caller {
        Caller {
            agent: "t/a".into(),
            tenant: "t".into(),
            name: "a".into(),
            uid: 1,
            gid: 1,
            home: home.to_path_buf(),
            grants: Grants {
                fs_read: read.iter().map(|p| p.to_path_buf()).collect(),
                fs_write: write.iter().map(|p| p.to_path_buf()).collect(),
                net_connect: vec!["*:443".into()],
                ..Default::default()
            },
            tool_scopes: Default::default(),
        }
    }

    #[test]
    fn needs_meet_grants_after_resolving_links() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path().canonicalize().unwrap();
        for s in ["home", "docs/a", "secret", "out"] {
            std::fs::create_dir_all(root.join(s)).unwrap();
        }
        // A link inside the granted tree that points outside it.
        std::os::unix::fs::symlink(root.join("secret"), root.join("docs/link")).unwrap();
        let c = caller(
            &root.join("home"),
            &[&root.join("docs")],
            &[&root.join("out")],
        );
        let needs = Needs {
            fs_read: vec![
                root.display().to_string(),
                root.join("docs/link").display().to_string(),
            ],
            fs_write: vec!["{state}".into()],
            net_connect: vec!["api.example.com:443".into(), "db:5432".into()],
            ..Default::default()
        };
        let e = effective(&needs, &c);
        // Everything the caller can read under the tool's bound, and the link resolves to
        // `secret`, which the caller cannot read: it is not granted.
        assert_eq!(
            e.read,
            vec![root.join("docs"), root.join("home"), root.join("out")]
        );
        assert_eq!(e.write, vec![root.join("home")]);
        assert_eq!(e.connect, vec!["api.example.com:443".to_string()]);
        assert!(e.bind.is_empty());
        let p = plan(&e, &[], Path::new("/bin/sh"), &root.join("home")).unwrap();
        assert_eq!(p.connect, Some(vec![443]));
        assert_eq!(p.bind, Some(vec![]));
        assert!(!p.read.contains(&root.join("secret")));
    }

    #[test]
    fn a_granted_scope_turned_into_a_link_grants_the_tool_nothing() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path().canonicalize().unwrap();
        for s in ["home", "secret"] {
            std::fs::create_dir_all(root.join(s)).unwrap();
        }
        // The caller's own `{state}/sub` write scope is a link to `secret` now.
        let sub = root.join("home/sub");
        std::os::unix::fs::symlink(root.join("secret"), &sub).unwrap();
        let c = caller(&root.join("home"), &[], &[&sub]);
        let needs = Needs {
            fs_read: vec![
                "{state}/sub".into(),
                root.join("secret").display().to_string(),
            ],
            fs_write: vec!["{state}/sub".into(), root.display().to_string()],
            ..Default::default()
        };
        let e = effective(&needs, &c);
        assert!(
            e.read
                .iter()
                .chain(&e.write)
                .all(|p| !p.starts_with(root.join("secret"))),
            "{e:?}"
        );
        assert_eq!(e.write, vec![root.join("home")]);
    }
}
