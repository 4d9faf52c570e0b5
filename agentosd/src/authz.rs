//! Who may do what over D-Bus: per-verb actions checked in the daemon for every method call,
//! independent of the bus policy (docs/dbus.md, "Authorization").
//!
//! The caller is named by the bus (`org.freedesktop.DBus.GetConnectionCredentials`: uid, gids,
//! pid), never by anything the caller sends. The rules are pure data ([`Policy`]) so that the
//! decision ([`Policy::allows`]) is testable without a bus.

use std::fmt;

use serde_json::{Value, json};

/// The actions a D-Bus caller may hold (polkit action ids, `units/org.agentos1.policy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Action {
    /// Start, stop, kill, freeze, thaw, restart, remove agents.
    ManageAgents,
    /// Approve or deny tool calls held for consent.
    AnswerConsent,
    /// Read the audit trail.
    ReadAudit,
    /// List agents, read their status and logs, list held consent requests, host report.
    Read,
}

pub const ALL_ACTIONS: [Action; 4] = [
    Action::ManageAgents,
    Action::AnswerConsent,
    Action::ReadAudit,
    Action::Read,
];

impl Action {
    /// The polkit action id, also the name in `org.agentos1.Error.AccessDenied` messages.
    pub fn id(self) -> &'static str {
        match self {
            Action::ManageAgents => "org.agentos1.manage-agents",
            Action::AnswerConsent => "org.agentos1.answer-consent",
            Action::ReadAudit => "org.agentos1.read-audit",
            Action::Read => "org.agentos1.read",
        }
    }

    fn short(self) -> &'static str {
        &self.id()["org.agentos1.".len()..]
    }

    fn parse(s: &str) -> Option<Action> {
        let s = s.strip_prefix("org.agentos1.").unwrap_or(s);
        ALL_ACTIONS.into_iter().find(|a| a.short() == s)
    }
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.id())
    }
}

/// Who a rule is about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Principal {
    Uid(u32),
    Gid(u32),
    /// A group name resolved when the rules are resolved ([`Policy::resolve`]).
    Group(String),
    User(String),
}

/// `PRINCIPAL=ACTION[,ACTION…][@TENANT[,TENANT…]]`, e.g. `group:agentos=read,read-audit` or
/// `gid:4242=manage-agents,read@acme`. Without `@…` the rule holds for every tenant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    pub who: Principal,
    pub actions: Vec<Action>,
    pub tenants: Option<Vec<String>>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum AuthzError {
    #[error(
        "authorization rule {0:?}: expected PRINCIPAL=ACTIONS[@TENANTS] with PRINCIPAL one of uid:N, gid:N, user:NAME, group:NAME (e.g. group:agentos=read,read-audit)"
    )]
    Syntax(String),
    #[error(
        "authorization rule {rule:?}: unknown action {action:?} (known: manage-agents, answer-consent, read-audit, read, all)"
    )]
    UnknownAction { rule: String, action: String },
}

impl std::str::FromStr for Rule {
    type Err = AuthzError;

    fn from_str(s: &str) -> Result<Rule, AuthzError> {
        let syntax = || AuthzError::Syntax(s.to_string());
        let (who, rest) = s.split_once('=').ok_or_else(syntax)?;
        let (kind, id) = who.trim().split_once(':').ok_or_else(syntax)?;
        let num = |v: &str| v.trim().parse::<u32>().map_err(|_| syntax());
        let who = match kind.trim() {
            "uid" => Principal::Uid(num(id)?),
            "gid" => Principal::Gid(num(id)?),
            "user" if !id.trim().is_empty() => Principal::User(id.trim().to_string()),
            "group" if !id.trim().is_empty() => Principal::Group(id.trim().to_string()),
            _ => return Err(syntax()),
        };
        let (acts, tenants) = match rest.split_once('@') {
            Some((a, t)) => {
                let t: Vec<String> = t
                    .split(',')
                    .map(|x| x.trim().to_string())
                    .filter(|x| !x.is_empty())
                    .collect();
                if t.is_empty() {
                    return Err(syntax());
                }
                (a, Some(t))
            }
            None => (rest, None),
        };
        let mut actions = Vec::new();
        for a in acts.split(',').map(str::trim).filter(|a| !a.is_empty()) {
            if a == "all" {
                actions.extend(ALL_ACTIONS);
                continue;
            }
            actions.push(Action::parse(a).ok_or_else(|| AuthzError::UnknownAction {
                rule: s.to_string(),
                action: a.to_string(),
            })?);
        }
        if actions.is_empty() {
            return Err(syntax());
        }
        Ok(Rule {
            who,
            actions,
            tenants,
        })
    }
}

/// The default rule when the daemon is given none: operators (group `agentos`) may list and
/// read status, logs and audit; nothing else. Root may always do everything.
pub const DEFAULT_RULE: &str = "group:agentos=read,read-audit";

/// The daemon's authorization rules. Root (uid 0) holds every action for every tenant; no rule
/// can take that away (root can stop the daemon anyway).
#[derive(Debug, Clone, Default)]
pub struct Policy {
    pub rules: Vec<Rule>,
}

/// What a check is about.
#[derive(Debug, Clone, Copy)]
pub enum Scope<'a> {
    /// One agent's tenant.
    Tenant(&'a str),
    /// The whole daemon: only an unscoped grant holds.
    Global,
    /// Listing: the caller holds the action for at least one tenant; the result is filtered
    /// with [`Policy::allows`] per row.
    AnyTenant,
}

impl Policy {
    /// Parse `--authz` rules; an empty list means [`DEFAULT_RULE`].
    pub fn from_rules(rules: &[String]) -> Result<Policy, AuthzError> {
        let rules = if rules.is_empty() {
            vec![DEFAULT_RULE.parse()?]
        } else {
            rules.iter().map(|r| r.parse()).collect::<Result<_, _>>()?
        };
        Ok(Policy { rules })
    }

    /// Replace user and group names by their ids (names that do not exist match nobody and are
    /// reported by the returned list).
    pub fn resolve(mut self) -> (Policy, Vec<String>) {
        let mut unknown = Vec::new();
        self.rules.retain_mut(|r| match &r.who {
            Principal::Group(n) => match nix::unistd::Group::from_name(n) {
                Ok(Some(g)) => {
                    r.who = Principal::Gid(g.gid.as_raw());
                    true
                }
                _ => {
                    unknown.push(format!("group {n}"));
                    false
                }
            },
            Principal::User(n) => match nix::unistd::User::from_name(n) {
                Ok(Some(u)) => {
                    r.who = Principal::Uid(u.uid.as_raw());
                    true
                }
                _ => {
                    unknown.push(format!("user {n}"));
                    false
                }
            },
            _ => true,
        });
        (self, unknown)
    }

    fn matches(who: &Principal, c: &Caller) -> bool {
        match who {
            Principal::Uid(u) => c.uid == *u,
            Principal::Gid(g) => c.gids.contains(g),
            // Unresolved names match nobody.
            Principal::Group(_) | Principal::User(_) => false,
        }
    }

    /// Whether `caller` holds `action` for `scope`.
    pub fn allows(&self, caller: &Caller, action: Action, scope: Scope<'_>) -> bool {
        if caller.uid == 0 {
            return true;
        }
        if is_agent(caller.uid) {
            return false;
        }
        self.rules.iter().any(|r| {
            Self::matches(&r.who, caller)
                && r.actions.contains(&action)
                && match (&r.tenants, scope) {
                    (None, _) => true,
                    (Some(_), Scope::AnyTenant) => true,
                    (Some(ts), Scope::Tenant(t)) => ts.iter().any(|x| x == t),
                    (Some(_), Scope::Global) => false,
                }
        })
    }
}

/// Whether `uid` is an agent's (`--agent-uids`): an agent holds no action on the daemon's API,
/// whatever a rule or polkit would say of its uid (an agent reaches the system bus wherever
/// the kernel lacks Landlock's `RESOLVE_UNIX`).
pub fn is_agent(uid: u32) -> bool {
    crate::sandbox::identity::range().contains(uid)
}

/// A D-Bus caller as the bus and the kernel describe it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Caller {
    pub uid: u32,
    /// Primary and supplementary groups (the bus reads them with SO_PEERGROUPS).
    pub gids: Vec<u32>,
    pub pid: Option<u32>,
    /// `/proc/PID/cmdline`, arguments joined by spaces, control characters escaped, at most
    /// 512 bytes. Informative only: the process may have changed it or exited.
    pub cmdline: Option<String>,
    /// The systemd unit from `/proc/PID/cgroup`, if the caller runs in one.
    pub unit: Option<String>,
    /// The caller's unique name on the bus (`:1.42`): polkit's subject.
    pub bus_name: Option<String>,
}

impl Caller {
    /// Fill in the command line and unit of `pid` from /proc.
    pub fn with_process(mut self, pid: Option<u32>) -> Caller {
        self.pid = pid;
        if let Some(p) = pid {
            self.cmdline = std::fs::read(format!("/proc/{p}/cmdline"))
                .ok()
                .map(|b| cmdline_text(&b));
            self.unit = std::fs::read_to_string(format!("/proc/{p}/cgroup"))
                .ok()
                .and_then(|s| unit_of(&s));
        }
        self
    }

    /// The `caller` object of audit records.
    pub fn to_json(&self) -> Value {
        let mut v = json!({"uid": self.uid, "gids": self.gids});
        if let Some(p) = self.pid {
            v["pid"] = json!(p);
        }
        if let Some(c) = &self.cmdline {
            v["cmdline"] = json!(c);
        }
        if let Some(u) = &self.unit {
            v["unit"] = json!(u);
        }
        v
    }
}

/// `/proc/PID/cmdline` bytes as one escaped line of at most 512 bytes.
pub fn cmdline_text(raw: &[u8]) -> String {
    let raw = raw.strip_suffix(b"\0").unwrap_or(raw);
    let joined: Vec<u8> = raw.iter().map(|&b| if b == 0 { b' ' } else { b }).collect();
    let mut s = escape_control(&String::from_utf8_lossy(&joined));
    if s.len() > 512 {
        let mut cut = 512;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
        s.push('…');
    }
    s
}

/// The innermost `.service`/`.scope` of a `/proc/PID/cgroup` text (`0::/…` line).
pub fn unit_of(cgroup: &str) -> Option<String> {
    let path = cgroup.lines().find_map(|l| l.strip_prefix("0::"))?;
    path.rsplit('/')
        .find(|c| c.ends_with(".service") || c.ends_with(".scope"))
        .map(escape_control)
}

pub use agentos_api::text::{escape_control, escape_lines};

#[cfg(test)]
mod tests {
    use super::*;

    fn caller(uid: u32, gids: &[u32]) -> Caller {
        Caller {
            uid,
            gids: gids.to_vec(),
            ..Caller::default()
        }
    }

    #[test]
    fn root_holds_everything() {
        let p = Policy { rules: vec![] };
        for a in ALL_ACTIONS {
            assert!(p.allows(&caller(0, &[0]), a, Scope::Global));
            assert!(p.allows(&caller(0, &[]), a, Scope::Tenant("x")));
        }
    }

    #[test]
    fn operators_default_read_only() {
        let p = Policy {
            rules: vec!["gid:500=read,read-audit".parse().unwrap()],
        };
        let op = caller(1000, &[1000, 500]);
        assert!(p.allows(&op, Action::Read, Scope::Tenant("acme")));
        assert!(p.allows(&op, Action::ReadAudit, Scope::Global));
        assert!(!p.allows(&op, Action::ManageAgents, Scope::Tenant("acme")));
        assert!(!p.allows(&op, Action::AnswerConsent, Scope::Tenant("acme")));
        let stranger = caller(1001, &[1001]);
        for a in ALL_ACTIONS {
            assert!(!p.allows(&stranger, a, Scope::AnyTenant));
        }
    }

    #[test]
    fn tenant_scoping() {
        let p = Policy {
            rules: vec!["gid:600=manage-agents,read@acme,beta".parse().unwrap()],
        };
        let op = caller(7, &[600]);
        assert!(p.allows(&op, Action::ManageAgents, Scope::Tenant("acme")));
        assert!(p.allows(&op, Action::ManageAgents, Scope::Tenant("beta")));
        assert!(!p.allows(&op, Action::ManageAgents, Scope::Tenant("other")));
        assert!(!p.allows(&op, Action::ManageAgents, Scope::Global));
        assert!(p.allows(&op, Action::Read, Scope::AnyTenant));
    }

    #[test]
    fn an_agents_uid_holds_nothing_whatever_the_rules_say() {
        let agent = crate::sandbox::identity::range().first + 6;
        let p = Policy {
            rules: vec![
                format!("uid:{agent}=all").parse().unwrap(),
                "uid:9=read".parse().unwrap(),
            ],
        };
        for a in ALL_ACTIONS {
            assert!(!p.allows(&caller(agent, &[]), a, Scope::AnyTenant), "{a}");
        }
        // The same kind of rule for a uid outside the range holds.
        assert!(p.allows(&caller(9, &[]), Action::Read, Scope::AnyTenant));
    }

    #[test]
    fn rule_syntax() {
        let r: Rule = "uid:12=all".parse().unwrap();
        assert_eq!(r.actions.len(), 4);
        assert_eq!(
            "group:ops=org.agentos1.answer-consent"
                .parse::<Rule>()
                .unwrap(),
            Rule {
                who: Principal::Group("ops".into()),
                actions: vec![Action::AnswerConsent],
                tenants: None
            }
        );
        assert!(matches!(
            "gid:1=fly".parse::<Rule>(),
            Err(AuthzError::UnknownAction { .. })
        ));
        for bad in [
            "gid=read",
            "gid:x=read",
            "pid:1=read",
            "gid:1=",
            "gid:1=read@",
        ] {
            assert!(bad.parse::<Rule>().is_err(), "{bad}");
        }
        assert_eq!(Policy::from_rules(&[]).unwrap().rules.len(), 1);
    }

    #[test]
    fn cmdline_and_unit() {
        assert_eq!(
            cmdline_text(b"agentctl\0stop\0a\x1b\0"),
            "agentctl stop a\\x1b"
        );
        assert_eq!(
            unit_of("0::/system.slice/foo.service\n").as_deref(),
            Some("foo.service")
        );
        assert_eq!(
            unit_of("0::/user.slice/user-1000.slice/session-3.scope\n").as_deref(),
            Some("session-3.scope")
        );
        assert_eq!(unit_of("0::/\n"), None);
    }
}
