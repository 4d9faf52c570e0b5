//! An agent's filesystem policy: its Landlock plan as path prefixes with their rights, and the
//! keys of the `fs_prefixes` LPM trie.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use aya::maps::lpm_trie::Key;

use super::{EXEC, PATH_KEY, READ, WRITE};
use crate::sandbox::landlock::Plan;

/// The data of `struct agentos_fs_key` after `prefixlen` (aya's [`Key`] adds the length).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawKeyData {
    pub cgroup_id: u64,
    pub path: [u8; PATH_KEY],
}

// SAFETY: a `#[repr(C)]` u64 followed by a byte array whose length keeps the size a multiple of
// 8 (256): no padding, no pointers, any bit pattern is valid.
unsafe impl aya::Pod for RawKeyData {}

/// An agent's filesystem policy: path prefixes (no trailing `/`, `/` itself for the root) and
/// the rights each grants, already including what every shorter prefix grants.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Policy {
    pub prefixes: BTreeMap<String, u8>,
    /// What the operator should know (cut prefixes, …).
    pub notes: Vec<String>,
    /// The pathname Unix socket fence (`lsm/unix_stream_connect`, `lsm/unix_may_send`);
    /// `None`: not applied to this agent (the programs did not load).
    pub unix: Option<super::UnixScope>,
}

/// Does `prefix` (normalised) contain `path` (normalised) on a component boundary?
fn under(path: &str, prefix: &str) -> bool {
    prefix == "/"
        || path == prefix
        || (path.starts_with(prefix) && path.as_bytes().get(prefix.len()) == Some(&b'/'))
}

/// The rights of `read_exec` and `read_write` paths. (Named, not written `READ | EXEC` in
/// place: on disjoint bits `|` and `^` are the same, a mutant no test could tell apart.)
const READ_EXEC: u8 = READ | EXEC;
const READ_WRITE: u8 = READ | WRITE;

/// The longest directory of `s` (normalised, `PATH_KEY` bytes or more) whose trie key (the path
/// and a `/`) fits in `PATH_KEY` bytes: `s` up to the last `/` among its first `PATH_KEY`
/// bytes, `/` if that is the first. A `/` is one ASCII byte, so the cut never falls inside a
/// character of a non-ASCII name.
fn widened(s: &str) -> &str {
    match s.as_bytes()[..PATH_KEY].iter().rposition(|&b| b == b'/') {
        Some(0) | None => "/",
        Some(i) => &s[..i],
    }
}

/// `/a/b/` → `/a/b`; `//` → `/`; relative paths are not scopes (`None`).
fn normalise(p: &Path) -> Option<String> {
    let s = p.to_str()?;
    if !s.starts_with('/') {
        return None;
    }
    let t = s.trim_end_matches('/');
    Some(if t.is_empty() { "/".into() } else { t.into() })
}

/// The rights of one access-bit set, for messages and records.
pub fn access_name(bits: u8) -> String {
    let mut v = Vec::new();
    if bits & READ != 0 {
        v.push("read");
    }
    if bits & WRITE != 0 {
        v.push("write");
    }
    if bits & EXEC != 0 {
        v.push("exec");
    }
    if v.is_empty() {
        "none".into()
    } else {
        v.join("+")
    }
}

impl Policy {
    /// The policy of a Landlock plan: `read` paths grant read, `read_exec` read+exec,
    /// `read_write` read+write, exactly the rights `sandbox::landlock::build` gives them. Each
    /// path is resolved with `canon` (symlinks: `/bin` → `/usr/bin`, as Landlock resolves the
    /// path when it adds the rule); one that does not resolve is kept as written.
    pub fn from_plan(plan: &Plan, canon: &dyn Fn(&Path) -> Option<PathBuf>) -> Policy {
        let mut p = Policy::default();
        let sets: [(&[PathBuf], u8); 3] = [
            (&plan.read, READ),
            (&plan.read_exec, READ_EXEC),
            (&plan.read_write, READ_WRITE),
        ];
        let mut own: BTreeMap<String, u8> = BTreeMap::new();
        for (paths, bits) in sets {
            for path in paths {
                let resolved = canon(path).unwrap_or_else(|| path.clone());
                let Some(mut s) = normalise(&resolved) else {
                    p.notes.push(format!(
                        "filesystem (BPF LSM): {} is not an absolute path; ignored",
                        path.display()
                    ));
                    continue;
                };
                if s.len() >= PATH_KEY {
                    // Widen to the longest directory that fits (Landlock keeps the exact scope).
                    let cut = widened(&s).to_string();
                    p.notes.push(format!(
                        "filesystem (BPF LSM): {} is longer than {} bytes; checked as {cut} (Landlock enforces the exact path)",
                        path.display(),
                        PATH_KEY - 1
                    ));
                    s = cut;
                }
                *own.entry(s).or_default() |= bits;
            }
        }
        // Each entry also carries what its granted ancestors grant: the longest match decides.
        for (path, bits) in &own {
            let all = own
                .iter()
                .filter(|(q, _)| under(path, q))
                .fold(*bits, |acc, (_, b)| acc | b);
            p.prefixes.insert(path.clone(), all);
        }
        p
    }

    /// What a path is granted (the program's lookup, mirrored): the rights of the longest
    /// prefix containing it, 0 when none does. `path` is absolute and resolved, as `d_path`
    /// gives it.
    pub fn granted(&self, path: &str) -> u8 {
        let path = if path.len() > PATH_KEY {
            // The program looks up the first PATH_KEY bytes (without a trailing '/'). A prefix
            // whose key fits ends, with its `/`, on a character boundary within them: the
            // boundary at or below PATH_KEY loses no match.
            &path[..path.floor_char_boundary(PATH_KEY)]
        } else {
            path
        };
        self.prefixes
            .iter()
            .filter(|(p, _)| under(path, p))
            .max_by_key(|(p, _)| p.len())
            .map_or(0, |(_, b)| *b)
    }

    /// The trie keys of this policy for cgroup `cgroup_id`.
    pub fn keys(&self, cgroup_id: u64) -> Vec<(Key<RawKeyData>, u32)> {
        self.prefixes
            .iter()
            .map(|(p, bits)| (key_for(cgroup_id, p), u32::from(*bits)))
            .collect()
    }

    /// One line for `agentctl status`.
    pub fn describe(&self) -> String {
        let mut by: BTreeMap<u8, Vec<&str>> = BTreeMap::new();
        for (p, b) in &self.prefixes {
            by.entry(*b).or_default().push(p);
        }
        by.iter()
            .map(|(b, ps)| format!("{} {}", access_name(*b), ps.join(" ")))
            .collect::<Vec<_>>()
            .join("; ")
    }
}

/// The trie key of one normalised prefix: the path with a trailing `/` (`/` for the root).
pub fn key_for(cgroup_id: u64, prefix: &str) -> Key<RawKeyData> {
    let mut path = [0u8; PATH_KEY];
    let with_slash = if prefix == "/" {
        "/".to_string()
    } else {
        format!("{prefix}/")
    };
    let n = with_slash.len().min(PATH_KEY);
    path[..n].copy_from_slice(&with_slash.as_bytes()[..n]);
    Key::new((64 + 8 * n) as u32, RawKeyData { cgroup_id, path })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn plan(read: &[&str], exec: &[&str], write: &[&str]) -> Plan {
        let v = |s: &[&str]| s.iter().map(PathBuf::from).collect();
        Plan {
            read: v(read),
            read_exec: v(exec),
            read_write: v(write),
            ..Plan::default()
        }
    }

    fn no_links(p: &Path) -> Option<PathBuf> {
        match p.to_str() {
            Some("/bin") => Some("/usr/bin".into()),
            Some("/lib64") => Some("/usr/lib64".into()),
            _ => None,
        }
    }

    #[test]
    fn prefixes_match_on_component_boundaries() {
        let p = Policy::from_plan(&plan(&["/srv/docs/", "/etc/passwd"], &[], &[]), &no_links);
        assert_eq!(p.granted("/srv/docs"), READ);
        assert_eq!(p.granted("/srv/docs/a/b.txt"), READ);
        assert_eq!(p.granted("/srv/docs2"), 0);
        assert_eq!(p.granted("/srv/docs2/x"), 0);
        assert_eq!(p.granted("/srv"), 0);
        assert_eq!(p.granted("/etc/passwd"), READ);
        assert_eq!(p.granted("/etc/passwd-"), 0);
        assert_eq!(p.granted("/etc/shadow"), 0);
        let root = Policy::from_plan(&plan(&["/"], &[], &[]), &no_links);
        assert_eq!(root.granted("/anything/at/all"), READ);
        assert_eq!(root.granted("/"), READ);
    }

    #[test]
    fn longest_match_carries_the_ancestors_rights() {
        // /usr read+exec, /usr/share/doc read-only by the contract, home read+write.
        let p = Policy::from_plan(
            &plan(
                &["/usr/share/doc"],
                &["/usr", "/bin"],
                &["/var/lib/agentos/h"],
            ),
            &no_links,
        );
        assert_eq!(p.granted("/usr/share/doc/x"), READ | EXEC);
        // /bin resolves to /usr/bin, which is under /usr.
        assert!(!p.prefixes.contains_key("/bin"));
        assert_eq!(p.granted("/usr/bin/true"), READ | EXEC);
        assert_eq!(p.granted("/var/lib/agentos/h/tmp/f"), READ | WRITE);
        assert_eq!(p.granted("/var/lib/agentos"), 0);
        let d = p.describe();
        assert!(d.contains("read+exec /usr /usr/bin /usr/share/doc"), "{d}");
    }

    #[test]
    fn the_baseline_plan_becomes_prefixes() {
        let g = crate::sandbox::Grants {
            fs_read: vec!["/srv/vmt".into()],
            fs_exec: vec!["/opt/tools".into()],
            ..Default::default()
        };
        let home = Path::new("/var/lib/agentos/agents/t/a");
        let p = Policy::from_plan(&g.plan(home).unwrap(), &no_links);
        assert_eq!(p.granted("/srv/vmt/f"), READ);
        assert_eq!(p.granted("/opt/tools/run"), READ | EXEC);
        assert_eq!(p.granted("/var/lib/agentos/agents/t/a/out"), READ | WRITE);
        assert_eq!(p.granted("/dev/null"), READ | WRITE);
        assert_eq!(p.granted("/proc/self/status"), READ);
        assert_eq!(p.granted("/etc/shadow"), 0);
        assert_eq!(
            p.granted("/usr/lib/x86_64-linux-gnu/libc.so.6"),
            READ | EXEC
        );
    }

    #[test]
    fn long_prefixes_are_widened_with_a_note() {
        let long = format!("/data/{}/leaf", "x".repeat(300));
        let p = Policy::from_plan(&plan(&[&long], &[], &[]), &no_links);
        assert_eq!(p.notes.len(), 1, "{:?}", p.notes);
        assert_eq!(p.granted(&format!("{long}/f")), READ);
        assert_eq!(p.granted("/data/y"), READ);
        assert_eq!(p.granted("/other"), 0);
    }

    /// The widened prefix is the longest directory whose key fits, whatever the bytes around
    /// the cut: a `/` at the last byte that fits, one just past it, a character of two or three
    /// bytes across the limit (a cut inside it would panic the daemon), no `/` at all after the
    /// first.
    #[test]
    fn long_prefixes_widen_to_the_longest_directory_that_fits() {
        let k = PATH_KEY;
        // `/` + name: the first component fills `len` bytes (including its `/`).
        let dir = |len: usize| format!("/{}", "d".repeat(len - 1));
        let cases: Vec<(String, String)> = vec![
            // A `/` at byte k-1: the directory before it has k-1 bytes, its key ("…/") k.
            (format!("{}/tail", dir(k - 1)), dir(k - 1)),
            // A `/` at byte k: its directory's key would take k+1 bytes; the one before fits.
            (format!("{}/{}/tail", dir(10), "e".repeat(k - 11)), dir(10)),
            // Two-byte characters across the limit, at either parity.
            (format!("{}/{}", dir(20), "é".repeat(200)), dir(20)),
            (format!("{}/x{}", dir(20), "é".repeat(200)), dir(20)),
            // A three-byte character across the limit (bytes k-2 to k).
            (format!("{}/{}€€€", dir(30), "f".repeat(k - 33)), dir(30)),
            // One component longer than the key: the root.
            (format!("/{}", "g".repeat(k + 5)), "/".to_string()),
        ];
        for (long, want) in cases {
            assert!(long.len() >= k);
            let p = Policy::from_plan(&plan(&[&long], &[], &[]), &no_links);
            let got: Vec<&String> = p.prefixes.keys().collect();
            assert_eq!(got, vec![&want], "{long}");
            assert!(want.len() < k, "{want}: its key must fit");
            assert_eq!(p.notes.len(), 1);
            assert!(
                p.notes[0].contains(&format!("checked as {want} ")),
                "{:?}",
                p.notes
            );
            // What the program would grant under it (mirrored), cut at any byte.
            assert_eq!(p.granted(&format!("{long}/f")), READ, "{long}");
            for (key, _) in p.keys(1) {
                let bytes = if want == "/" { 1 } else { want.len() + 1 };
                assert_eq!(key.prefix_len() as usize, 64 + 8 * bytes);
            }
        }
    }

    #[test]
    fn exec_and_write_paths_get_read_too() {
        let p = Policy::from_plan(&plan(&["/r"], &["/x"], &["/w"]), &no_links);
        assert_eq!(p.granted("/r/f"), READ);
        assert_eq!(p.granted("/x/f"), READ | EXEC);
        assert_eq!(p.granted("/w/f"), READ | WRITE);
    }

    #[test]
    fn keys_end_in_a_slash() {
        let p = Policy::from_plan(&plan(&["/srv/docs", "/"], &[], &[]), &no_links);
        let keys = p.keys(7);
        assert_eq!(keys.len(), 2);
        let (root, _) = keys.iter().find(|(k, _)| k.data().path[1] == 0).unwrap();
        assert_eq!(root.prefix_len(), 64 + 8);
        let (docs, v) = keys.iter().find(|(k, _)| k.data().path[1] == b's').unwrap();
        assert_eq!(&docs.data().path[..10], b"/srv/docs/");
        assert_eq!(docs.prefix_len(), 64 + 8 * 10);
        assert_eq!(docs.data().cgroup_id, 7);
        assert_eq!(*v, u32::from(READ));
    }
}
