//! What one tool process may touch: the manifest's `sandbox` needs intersected with the
//! caller's grants (contracts::tool::intersect_paths / intersect_net), compiled into a Landlock
//! plan. Paths are resolved (symlinks followed) on both sides before they are met, so a
//! symlink an agent planted inside its own scope cannot point a tool outside it.

use std::path::{Path, PathBuf};

use contracts::tool::{ArgContext, Needs, expand_state, intersect_net, intersect_paths, minimal};

use super::Caller;
use crate::sandbox::landlock::{self, Plan};

/// The scopes one call runs with.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Effective {
    pub read: Vec<PathBuf>,
    pub write: Vec<PathBuf>,
    pub exec: Vec<PathBuf>,
    pub connect: Vec<String>,
    pub bind: Vec<String>,
}

/// Resolve a path (following symlinks); a path that does not exist is dropped: it grants
/// nothing now, and Landlock could not add a rule for it anyway.
fn resolve(p: &Path) -> Option<PathBuf> {
    std::fs::canonicalize(p).ok()
}

fn resolve_all(v: impl IntoIterator<Item = PathBuf>) -> Vec<PathBuf> {
    minimal(v.into_iter().filter_map(|p| resolve(&p)).collect())
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
        let read = resolve_all(
            g.fs_read
                .iter()
                .chain(&g.fs_write)
                .cloned()
                .chain(std::iter::once(home.clone())),
        );
        let write = resolve_all(g.fs_write.iter().cloned().chain(std::iter::once(home)));
        let exec = resolve_all(
            g.fs_exec
                .iter()
                .cloned()
                .chain(landlock::BASE_READ_EXEC.iter().map(PathBuf::from)),
        );
        CallerScopes { read, write, exec }
    }
}

/// The manifest's needs ∩ the caller's scopes.
pub fn effective(needs: &Needs, caller: &Caller) -> Effective {
    let cs = CallerScopes::of(caller);
    let tool = |v: &[String]| resolve_all(v.iter().map(|s| expand_state(s, &caller.home)));
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
        unscoped: false,
    };
    plan.read.extend(eff.read.iter().cloned());
    plan.read_exec.extend(runtime.iter().cloned());
    plan.read_exec.push(command.to_path_buf());
    plan.read_exec.extend(eff.exec.iter().cloned());
    plan.read_write.push(scratch.to_path_buf());
    plan.read_write.extend(eff.write.iter().cloned());
    // Landlock opens each path when the ruleset is built; leave out what does not exist.
    for v in [&mut plan.read, &mut plan.read_exec, &mut plan.read_write] {
        v.retain(|p| p.exists());
    }
    Ok(plan)
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
}
