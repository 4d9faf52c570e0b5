//! Attribution: Landlock access records wait for their domain's creator, then every denial is
//! handed to the supervisor's [`Attribute`] (pure bookkeeping).

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use super::denial::{Denial, landlock_denial, seccomp_denial};
use super::record::{Event, LandlockAccess, LandlockDomain};

/// Who a denial belongs to, as the supervisor found it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attribution {
    pub tenant: String,
    pub name: String,
    /// How it was found: `cgroup` (the process's cgroup, read when the record arrived), `uid`
    /// (the agent's own uid, when the process was already gone).
    pub by: &'static str,
}

/// Finds the agent of a process; implemented by the supervisor (and by fakes in tests).
pub trait Attribute {
    fn attribute(&self, pid: Option<u32>, uid: Option<u32>) -> Option<Attribution>;
}

/// What the correlator hands on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Output {
    /// A denial of an agent (`Some`), or one no agent could be found for (`None`: a Landlock
    /// domain whose creator was never seen, e.g. logged before the daemon started).
    Denial(Denial, Option<Attribution>),
}

enum DomainOwner {
    Agent(Attribution, LandlockDomain),
    /// Created by a process that is not an agent: its denials are not ours.
    Foreign,
}

/// Turns records into denials: seccomp records are attributed at once; a Landlock access
/// record is attributed through its domain, whose `allocated` record (with the creator's pid
/// and uid) the kernel sends right after the domain's first access record, so an access record
/// of an unknown domain waits for it (at most [`Correlator::WAIT`]).
#[derive(Default)]
pub struct Correlator {
    domains: HashMap<u64, DomainOwner>,
    pending: VecDeque<(Instant, LandlockAccess)>,
    /// Records of processes that are not agents (not written).
    pub foreign: u64,
}

impl Correlator {
    pub const WAIT: Duration = Duration::from_secs(1);
    const MAX_PENDING: usize = 4096;
    const MAX_DOMAINS: usize = 65_536;

    pub fn feed(&mut self, ev: Event, now: Instant, who: &dyn Attribute) -> Vec<Output> {
        let mut out = Vec::new();
        match ev {
            Event::Seccomp(r) => match who.attribute(Some(r.pid), r.uid) {
                Some(a) => out.push(Output::Denial(seccomp_denial(&r), Some(a))),
                None => self.foreign += 1,
            },
            Event::LandlockAccess(a) => match self.domains.get(&a.domain) {
                Some(DomainOwner::Agent(who, creator)) => {
                    out.push(Output::Denial(
                        landlock_denial(&a, Some(creator)),
                        Some(who.clone()),
                    ));
                }
                Some(DomainOwner::Foreign) => self.foreign += 1,
                None => {
                    self.pending.push_back((now, a));
                    if self.pending.len() > Self::MAX_PENDING
                        && let Some((_, a)) = self.pending.pop_front()
                    {
                        out.push(Output::Denial(landlock_denial(&a, None), None));
                    }
                }
            },
            Event::LandlockDomain(d) if d.status == "deallocated" => {
                self.domains.remove(&d.domain);
            }
            Event::LandlockDomain(d) => {
                if self.domains.len() >= Self::MAX_DOMAINS {
                    self.domains.clear();
                }
                let owner = match who.attribute(d.pid, d.uid) {
                    Some(a) => DomainOwner::Agent(a, d.clone()),
                    None => DomainOwner::Foreign,
                };
                self.domains.insert(d.domain, owner);
                let waiting: Vec<_> = self
                    .pending
                    .iter()
                    .filter(|(_, a)| a.domain == d.domain)
                    .map(|(_, a)| a.clone())
                    .collect();
                self.pending.retain(|(_, a)| a.domain != d.domain);
                for a in waiting {
                    match self.domains.get(&a.domain) {
                        Some(DomainOwner::Agent(who, creator)) => out.push(Output::Denial(
                            landlock_denial(&a, Some(creator)),
                            Some(who.clone()),
                        )),
                        _ => self.foreign += 1,
                    }
                }
            }
        }
        out
    }

    /// Access records that waited too long for their domain: handed on unattributed.
    pub fn expire(&mut self, now: Instant) -> Vec<Output> {
        let mut out = Vec::new();
        while let Some((t, _)) = self.pending.front() {
            if now.duration_since(*t) < Self::WAIT {
                break;
            }
            if let Some((_, a)) = self.pending.pop_front() {
                out.push(Output::Denial(landlock_denial(&a, None), None));
            }
        }
        out
    }
}
